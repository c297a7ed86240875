"""Rprop on the CPU: :func:`refopt.reference.rprop_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.rprop` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import rprop as _ref

__all__ = ["rprop_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def rprop_update(param, grad, prev, step_size, *, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0),
                 convention=None):
    """As :func:`refopt.reference.rprop_update`, bit-identical in float32 and float64."""
    kw = dict(etas=etas, step_sizes=step_sizes, convention=convention)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.rprop_update(param, grad, prev, step_size, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.rprop import pure_update

    return pure_update(apply, param, grad, prev, step_size, **kw)
