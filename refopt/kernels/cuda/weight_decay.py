"""Decoupled weight decay on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.weight_decay`
(``tf_keras/optimizers/optimizer.py``, ``_apply_weight_decay``). The update is
:func:`refopt.rules.steps.decay` (the step the optimizers' fused kernels run), as the rule
:data:`refopt.rules.steps.DECAY`.
"""

from __future__ import annotations

__all__ = ["apply_weight_decay"]


def apply_weight_decay(param, *, learning_rate, weight_decay):
    r"""Shrink a variable towards zero, :math:`w - (w\lambda)\eta`, with the CUDA kernel.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    learning_rate, weight_decay : float

    Returns
    -------
    ndarray
        A new host array; under the simulator bit-identical to
        :func:`refopt.reference.apply_weight_decay` (tested).

    Raises
    ------
    TypeError
        As :func:`refopt.reference.apply_weight_decay`.
    """
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.steps import pure_weight_decay

    return pure_weight_decay(apply, param, learning_rate=learning_rate,
                             weight_decay=weight_decay)
