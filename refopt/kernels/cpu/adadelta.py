"""Adadelta on the CPU: :func:`refopt.reference.adadelta_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.adadelta` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import adadelta as _ref

__all__ = ["adadelta_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def adadelta_update(param, grad, accumulated_grad, accumulated_delta, *, learning_rate, rho,
                    epsilon, convention=None):
    """As :func:`refopt.reference.adadelta_update`, bit-identical in float32 and float64
    (but for the sign of a NaN, see :mod:`refopt.rules.adadelta`)."""
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adadelta_update(param, grad, accumulated_grad, accumulated_delta,
                                    learning_rate=learning_rate, rho=rho, epsilon=epsilon,
                                    convention=convention)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.adadelta import pure_update

    return pure_update(apply, param, grad, accumulated_grad, accumulated_delta,
                       learning_rate=learning_rate, rho=rho, epsilon=epsilon,
                       convention=convention)
