"""Decoupled weight decay on the CPU (Numba kernel).

Same function, same signature and bit-identical results as
:mod:`refopt.reference.weight_decay` (``tf_keras/optimizers/optimizer.py``,
``_apply_weight_decay``).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.kernels.cpu import _kernels as K
from refopt.kernels.cpu._common import (
    FALLBACK_DTYPES,
    as_float_array,
    check_scalar,
    lr_cast,
    tf_cast,
)

__all__ = ["apply_weight_decay"]


def apply_weight_decay(param, *, learning_rate, weight_decay):
    r"""Shrink a variable towards zero, :math:`w - (w\lambda)\eta`, with the CPU kernel.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    learning_rate, weight_decay : float

    Returns
    -------
    ndarray
        A new C-contiguous array, bit-identical to
        :func:`refopt.reference.apply_weight_decay`.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.apply_weight_decay`.
    """
    param = as_float_array("param", param)
    check_scalar("learning_rate", learning_rate)
    check_scalar("weight_decay", weight_decay)
    dtype = param.dtype
    if dtype in FALLBACK_DTYPES:
        return _ref.apply_weight_decay(param, learning_rate=learning_rate,
                                       weight_decay=weight_decay)
    out = np.empty(param.shape, dtype)
    K.decay_k(np.ascontiguousarray(param).reshape(-1), out.reshape(-1),
              tf_cast(dtype, weight_decay), lr_cast(dtype, learning_rate))
    return out
