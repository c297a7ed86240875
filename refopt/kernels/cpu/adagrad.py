"""Adagrad on the CPU: :func:`refopt.reference.adagrad_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.adagrad` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import adagrad as _ref

__all__ = ["adagrad_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def adagrad_update(param, grad, accumulator, *, learning_rate, epsilon, convention=None,
                   lr_decay=0.0, step=1):
    """As :func:`refopt.reference.adagrad_update`, bit-identical in float32 and float64."""
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adagrad_update(param, grad, accumulator, learning_rate=learning_rate,
                                   epsilon=epsilon, convention=convention, lr_decay=lr_decay,
                                   step=step)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.adagrad import pure_update

    return pure_update(apply, param, grad, accumulator, learning_rate=learning_rate,
                       epsilon=epsilon, convention=convention, lr_decay=lr_decay, step=step)
