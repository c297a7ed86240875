"""SGD with momentum and Nesterov momentum on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``); host arrays in, new host arrays out.
"""

from __future__ import annotations

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cuda._common import (
    as_float_array,
    check_flag,
    check_grad,
    check_like,
    check_scalar,
    to_dev,
    to_host,
)
from refopt.kernels.cuda._launch import sgd_dense, sgd_sparse
from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_update"]


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum with the CUDA kernel; new host arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
    m : ndarray like ``param``
    learning_rate, momentum : float
    nesterov : bool

    Returns
    -------
    SGDResult
        ``(param, m)``, new host arrays; under the simulator bit-identical to
        :func:`refopt.reference.sgd_update` (tested).

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.sgd_update`, before anything is copied.

    Notes
    -----
    Dense gradients run ``_kernels.sgd_multi`` (one tensor), ``IndexedSlices`` gradients
    tf-keras' sparse update of the whole table (``_kernels.sgd_sparse_table``). Empty
    arrays are computed by the reference on the host.
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_scalar("learning_rate", learning_rate)
    check_scalar("momentum", momentum)
    nesterov = check_flag("nesterov", nesterov)
    hp = dict(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov)
    if param.size == 0:
        return _ref.sgd_update(param, grad, m, **hp)
    P, M = to_dev(param), to_dev(m)
    if isinstance(grad, IndexedSlices):
        sgd_sparse(P, M, grad.values, grad.indices, **hp)
    else:
        sgd_dense(P, to_dev(grad), M, **hp)
    return SGDResult(to_host(P), to_host(M))
