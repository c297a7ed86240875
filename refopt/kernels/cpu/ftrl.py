"""FTRL on the CPU: :func:`refopt.reference.ftrl_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.ftrl` (the same rule ``backend="cpu"`` optimizers run), every
form and power: where the framework calls ``pow`` the rule calls the C library's, as the
reference does (:func:`refopt.rules.ops.cpow`); the arguments are checked by the reference's
own checks, so the errors are the same. float16 and Keras 3's unsummed duplicates
(``keras3_sparse_square``) are computed by the reference (Numba has no float16 arithmetic on
the CPU), and so is every ``pow`` form where :data:`refopt.rules.ops.CPU_POW` is False.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import ftrl as _ref

__all__ = ["ftrl_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def ftrl_update(param, grad, accumulator, linear, *, learning_rate, learning_rate_power=-0.5,
                l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                l2_shrinkage_regularization_strength=0.0, beta=0.0, convention=None):
    """As :func:`refopt.reference.ftrl_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, learning_rate_power=learning_rate_power,
              l1_regularization_strength=l1_regularization_strength,
              l2_regularization_strength=l2_regularization_strength,
              l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
              beta=beta, convention=convention)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.ftrl_update(param, grad, accumulator, linear, **kw)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.ftrl import pure_update

    return pure_update(apply, param, grad, accumulator, linear, allow_pow=True, **kw)
