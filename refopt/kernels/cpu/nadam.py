"""Nadam on the CPU: :func:`refopt.reference.nadam_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.nadam` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 and the sparse forms (but Keras 3's densified step) are computed by the reference
(Numba has no float16 arithmetic on the CPU; the sparse updates are whole-table NumPy).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import nadam as _ref

__all__ = ["nadam_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def nadam_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                 convention=None, momentum_decay=None, product_dtype=None, eps_root=None):
    """As :func:`refopt.reference.nadam_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, convention=convention, momentum_decay=momentum_decay,
              product_dtype=product_dtype, eps_root=eps_root)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.nadam_update(param, grad, m, v, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.nadam import pure_update

    return pure_update(apply, param, grad, m, v, **kw)
