"""Lamb on the CPU: :func:`refopt.reference.lamb_update`, computed in phases by rule kernels.

The element phases are :mod:`refopt.rules.lamb` (the direction with the moments, then the
step with the trust ratio), run by the rule driver's kernels
(:func:`refopt.kernels.cpu.drivers.apply`); the per-tensor norms between them are summed on
the host in the framework's order by the reference's own functions. The arguments are
checked by the reference's checks, so the errors are the same. float16 is computed by the
reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import lamb as _ref

__all__ = ["lamb_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def lamb_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None):
    """As :func:`refopt.reference.lamb_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, convention=convention, eps_root=eps_root, weight_decay=weight_decay)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.lamb_update(param, grad, m, v, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.lamb import pure_update

    return pure_update(apply, param, grad, m, v, **kw)
