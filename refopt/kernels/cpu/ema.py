"""Exponential moving average of the weights on the CPU: the EMA step's rule.

Same function, same signature and bit-identical results as :mod:`refopt.reference.ema`
(``tf_keras/optimizers/optimizer.py``, ``_update_model_variables_moving_average``). The
update is :func:`refopt.rules.steps.ema` (the step the optimizers' fused kernels run), as
the rule :data:`refopt.rules.steps.EMA`.
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref

__all__ = ["ema_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


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
    if not (isinstance(average, np.ndarray) and average.dtype in _FAST):
        return _ref.ema_update(average, param, ema_momentum=ema_momentum)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.steps import pure_ema

    return pure_ema(apply, average, param, ema_momentum=ema_momentum)
