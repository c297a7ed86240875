"""Exponential moving average of the weights on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.ema`
(``tf_keras/optimizers/optimizer.py``, ``_update_model_variables_moving_average``). The
update is :func:`refopt.rules.steps.ema` (the step the optimizers' fused kernels run), as the
rule :data:`refopt.rules.steps.EMA`.
"""

from __future__ import annotations

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
        :func:`refopt.reference.ema_update` (tested).

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.ema_update`.
    """
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.steps import pure_ema

    return pure_ema(apply, average, param, ema_momentum=ema_momentum)
