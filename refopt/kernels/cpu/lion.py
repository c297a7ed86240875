"""Lion on the CPU: :func:`refopt.reference.lion_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.lion` (the same rule ``backend="cpu"`` optimizers run); the
arguments are checked by the reference's own checks, so the errors are the same. float16,
and tf_keras' sparse branch, are computed by the reference.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import lion as _ref

__all__ = ["lion_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def lion_update(param, grad, m, *, learning_rate, beta_1=0.9, beta_2=0.99, convention=None,
                weight_decay=None):
    """As :func:`refopt.reference.lion_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
              convention=convention, weight_decay=weight_decay)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.lion_update(param, grad, m, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.lion import pure_update

    return pure_update(apply, param, grad, m, **kw)
