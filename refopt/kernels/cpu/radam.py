"""RAdam on the CPU: :func:`refopt.reference.radam_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.radam` (the same rule ``backend="cpu"`` optimizers run); the
arguments are checked by the reference's own checks, so the errors are the same. float16 is
computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import radam as _ref

__all__ = ["radam_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def radam_update(param, grad, m, v, *, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 step=1, convention=None, epsilon_root=0.0, threshold=5.0):
    """As :func:`refopt.reference.radam_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, convention=convention, epsilon_root=epsilon_root,
              threshold=threshold)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.radam_update(param, grad, m, v, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.radam import pure_update

    return pure_update(apply, param, grad, m, v, **kw)
