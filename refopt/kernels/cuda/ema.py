"""Exponential moving average of the weights on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.ema`
(``tf_keras/optimizers/optimizer.py``, ``_update_model_variables_moving_average``).
"""

from __future__ import annotations

from refopt import reference as _ref
from refopt.kernels.cuda._common import (
    as_float_array,
    check_like,
    check_scalar,
    to_dev,
    to_host,
)
from refopt.kernels.cuda._launch import ema_dense

__all__ = ["ema_update"]


def ema_update(average, param, *, ema_momentum):
    r"""One EMA step :math:`a \leftarrow \mu a + (1-\mu) w` with the CUDA kernel.

    Parameters
    ----------
    average : ndarray of float16, float32 or float64, any shape
    param : ndarray like ``average``
    ema_momentum : float

    Returns
    -------
    ndarray
        The new average, a new host array; under the simulator bit-identical to
        :func:`refopt.reference.ema_update` (tested). Empty arrays are computed by the
        reference.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.ema_update`.
    """
    average = as_float_array("average", average)
    param = check_like(average, "param", param)
    check_scalar("ema_momentum", ema_momentum)
    if average.size == 0:
        return _ref.ema_update(average, param, ema_momentum=ema_momentum)
    A = to_dev(average)
    ema_dense(A, to_dev(param), ema_momentum=ema_momentum)
    return to_host(A)
