"""Adamax on the CPU: :func:`refopt.reference.adamax_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.adamax` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU), and so
are tf_keras' non-lazy sparse update and Keras 3's raw slices (no rule).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import adamax as _ref

__all__ = ["adamax_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def adamax_update(param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step=1,
                  convention=None):
    """As :func:`refopt.reference.adamax_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, convention=convention)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adamax_update(param, grad, m, u, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.adamax import pure_update

    return pure_update(apply, param, grad, m, u, **kw)
