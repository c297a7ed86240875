"""ASGD on the CPU: :func:`refopt.reference.asgd_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.asgd` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import asgd as _ref

__all__ = ["asgd_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def asgd_update(param, grad, ax, *, learning_rate, lambd, alpha, t0, step, eta=None,
                mu=None, convention=None):
    """As :func:`refopt.reference.asgd_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, lambd=lambd, alpha=alpha, t0=t0, step=step,
              eta=eta, mu=mu, convention=convention)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.asgd_update(param, grad, ax, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.asgd import pure_update

    return pure_update(apply, param, grad, ax, **kw)
