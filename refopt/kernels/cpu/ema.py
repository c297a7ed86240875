"""Exponential moving average of the weights on the CPU (Numba kernel).

Same function, same signature and bit-identical results as :mod:`refopt.reference.ema`
(``tf_keras/optimizers/optimizer.py``, ``_update_model_variables_moving_average``).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.kernels.cpu import _kernels as K
from refopt.kernels.cpu._common import (
    FALLBACK_DTYPES,
    as_float_array,
    check_like,
    check_scalar,
    launch,
    scalar,
)

__all__ = ["ema_update"]


def ema_update(average, param, *, ema_momentum):
    r"""One EMA step :math:`a \leftarrow \mu a + (1-\mu) w` with the CPU kernel; a new array.

    Parameters
    ----------
    average : ndarray of float16, float32 or float64, any shape
    param : ndarray like ``average``
    ema_momentum : float

    Returns
    -------
    ndarray
        The new average (C-contiguous), bit-identical to :func:`refopt.reference.ema_update`.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.ema_update`.
    """
    average = as_float_array("average", average)
    param = check_like(average, "param", param)
    check_scalar("ema_momentum", ema_momentum)
    dtype = average.dtype
    if dtype in FALLBACK_DTYPES:
        return _ref.ema_update(average, param, ema_momentum=ema_momentum)
    out = np.empty(average.shape, dtype)
    launch(K.ema_k, (np.ascontiguousarray(average).reshape(-1),
                     np.ascontiguousarray(param).reshape(-1), out.reshape(-1),
                     scalar(dtype, ema_momentum), scalar(dtype, 1 - ema_momentum), False),
           out.size)
    return out
