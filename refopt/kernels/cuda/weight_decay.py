"""Decoupled weight decay on the GPU: the reference's function over the decay kernel.

Same function, same signature, same errors as :mod:`refopt.reference.weight_decay`
(``tf_keras/optimizers/optimizer.py``, ``_apply_weight_decay``).
"""

from __future__ import annotations

from refopt import reference as _ref
from refopt.kernels.cuda._common import (
    as_float_array,
    check_scalar,
    cuda,
    to_dev,
    to_host,
)
from refopt.kernels.cuda._launch import decay_dense

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
        :func:`refopt.reference.apply_weight_decay` (tested). Empty arrays are computed by the
        reference.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.apply_weight_decay`.
    """
    param = as_float_array("param", param)
    check_scalar("learning_rate", learning_rate)
    check_scalar("weight_decay", weight_decay)
    if param.size == 0:
        return _ref.apply_weight_decay(param, learning_rate=learning_rate,
                                       weight_decay=weight_decay)
    out = cuda.device_array(param.shape, param.dtype)
    decay_dense(out, to_dev(param), learning_rate=learning_rate, weight_decay=weight_decay)
    return to_host(out)
