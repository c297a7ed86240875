"""Exponential moving average of the weights, as the tf-keras 2.11+ base optimizer keeps it.

Follows ``tf_keras/optimizers/optimizer.py`` (``_update_model_variables_moving_average``).
"""

from __future__ import annotations

import numpy as np

from refopt.reference._common import as_float_array, check_like, check_real, scalar

__all__ = ["ema_update"]


def ema_update(average, param, *, ema_momentum):
    r"""One EMA step: :math:`a \leftarrow \mu a + (1-\mu) w`; returns a new array.

    Parameters
    ----------
    average : ndarray of float16, float32 or float64, any shape
        The running average :math:`a`.
    param : ndarray like ``average``
        The variable :math:`w` *after* this step's update.
    ema_momentum : float
        :math:`\mu` in [0, 1]. ``0`` copies the weights; ``1`` freezes the average.

    Returns
    -------
    ndarray
        The new average, of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        If an array is not a float16/32/64 ndarray, the two do not match, or
        ``ema_momentum`` is not a real number in [0, 1] (the optimizers' ``ema_momentum``
        check, with the same messages).

    Notes
    -----
    Computed as ``dtype(mu) * a + dtype(1 - mu) * w`` (``1 - mu`` taken in float64, then
    rounded once), as tf-keras' ``ema_momentum * average + (1 - ema_momentum) * var``.
    Convention difference: tf-keras initialises the average with a *copy* of the variable and
    always uses ``mu``; Keras 3 initialises it with zeros and uses ``mu = 0`` on the first
    step; PyTorch's ``AveragedModel`` and optax's ``ema`` (with debiasing) differ again.
    """
    average = as_float_array("average", average)
    param = check_like(average, "param", param)
    check_real("ema_momentum", ema_momentum, low=0, high=1)  # the classes' range
    dtype = average.dtype
    mu = scalar(dtype, ema_momentum)
    one_minus_mu = scalar(dtype, 1 - ema_momentum)
    with np.errstate(all="ignore"):
        return np.asarray(mu * average + one_minus_mu * param)
