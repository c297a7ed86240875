"""SGD with momentum and Nesterov momentum on the CPU: the fused Numba kernel.

Same function, same signature and bit-identical results as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cpu import _kernels as K
from refopt.kernels.cpu._common import (
    FALLBACK_DTYPES,
    as_float_array,
    c_copy,
    check_flag,
    check_grad,
    check_like,
    check_scalar,
    flags,
    launch,
    lr_cast,
    rows2d,
    scalars,
    table,
    tf_cast,
)
from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_update"]


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum, with the CPU kernels; new arrays.

    Parameters, returns, errors and numerics are those of :func:`refopt.reference.sgd_update`,
    reproduced bit for bit for float32 and float64 (float16 is computed by the reference).

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
        ``(param, m)``, new C-contiguous arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.sgd_update`.

    Notes
    -----
    Dense: ``m <- (-g) lr + m mu``; ``w <- w + m`` or ``w + ((-g) lr + m mu)`` in one pass
    (``_kernels.sgd_multi``). Sparse: rows summed by ``_kernels.dedup_rows``, then
    ``_kernels.sgd_sparse_rows``.
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_scalar("learning_rate", learning_rate)
    check_scalar("momentum", momentum)
    nesterov = check_flag("nesterov", nesterov)
    dtype = param.dtype
    if dtype in FALLBACK_DTYPES:
        return _ref.sgd_update(param, grad, m, learning_rate=learning_rate, momentum=momentum,
                               nesterov=nesterov)
    sc = scalars(dtype, lr=lr_cast(dtype, learning_rate), alpha=tf_cast(dtype, momentum))
    fl = flags(ams=nesterov)
    P, M = c_copy(param), c_copy(m)
    if isinstance(grad, IndexedSlices):
        from refopt.kernels.cpu.adam import sparse_sum

        rows, sums = sparse_sum(grad)
        K.sgd_sparse_rows(rows2d(P), rows2d(M), rows, sums, fl, sc)
    else:
        G = np.ascontiguousarray(grad)
        addr, cnt = table(P, G)
        launch(K.sgd_multi, (addr[:1], addr[1:], np.zeros(1, np.int64), cnt[:1],
                             np.zeros(1, np.uint8), np.ones(1, dtype), M.reshape(-1),
                             np.zeros(0, dtype), fl, sc), P.size)
    return SGDResult(P, M)
