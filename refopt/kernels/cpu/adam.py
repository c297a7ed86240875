"""Adam and AMSGrad, dense and non-lazy sparse, on the CPU: the fused Numba kernel.

Same function, same signature and bit-identical results as :mod:`refopt.reference.adam`
(``tf_keras/optimizers/adam.py``); the scalars come from :func:`refopt.reference.adam_scalars`.
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
    check_grad,
    check_like,
    flags,
    launch,
    rows2d,
    scalars,
    stable_order,
    table,
)
from refopt.reference.adam import AdamResult, adam_scalars

__all__ = ["AdamResult", "adam_update", "adam_scalars"]


def adam_update(param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    r"""One Adam (or AMSGrad) step with the CPU kernels; returns new arrays.

    Parameters, returns, errors and numerics are those of
    :func:`refopt.reference.adam_update`, which this function reproduces bit for bit for
    float32 and float64 (float16 is computed by the reference itself).

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
    m, v : ndarray like ``param``
    vhat : ndarray like ``param`` or None
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        The 1-based time step.

    Returns
    -------
    AdamResult
        ``(param, m, v, vhat)``, new C-contiguous arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.adam_update`.

    Notes
    -----
    Dense: copies of ``param``, ``m``, ``v`` (``vhat``) are updated in place by one pass of
    the fused kernel (``_kernels.adam_multi``, the one the optimizers use), per element
    ``m + (g - m)(1-b1)``, ``v + (g*g - v)(1-b2)``, ``max(vhat, v)``,
    ``w - (m alpha)/(sqrt(v) + eps)``. Sparse: duplicate rows summed by ``_kernels.dedup_rows``
    (stable sort, one owner per row, from zero in order of appearance), then
    ``_kernels.adam_sparse_rows``.
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    s = adam_scalars(param.dtype, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, step=step)
    if param.dtype in FALLBACK_DTYPES:
        return _ref.adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                                beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    dtype = param.dtype
    sc = scalars(dtype, alpha=s.alpha, c1=s.one_minus_beta_1, c2=s.one_minus_beta_2,
                 eps=s.epsilon)
    fl = flags(ams=vhat is not None)
    P, M, V = c_copy(param), c_copy(m), c_copy(v)
    VH = None if vhat is None else c_copy(vhat)
    if isinstance(grad, IndexedSlices):
        rows, sums = sparse_sum(grad)
        P2, M2, V2 = rows2d(P), rows2d(M), rows2d(V)
        K.adam_sparse_rows(P2, M2, V2, M2 if VH is None else rows2d(VH), rows, sums, fl, sc)
    else:
        G = np.ascontiguousarray(grad)
        addr, cnt = table(P, G)
        empty = np.zeros(0, dtype)
        launch(K.adam_multi, (addr[:1], addr[1:], np.zeros(1, np.int64), cnt[:1],
                              np.zeros(1, np.uint8), np.ones(1, dtype), M.reshape(-1),
                              V.reshape(-1), empty if VH is None else VH.reshape(-1), empty,
                              fl, sc), P.size)
    return AdamResult(P, M, V, VH)


def sparse_sum(grad, fl=None, sc=None, d=None):
    """Unique rows (ascending) and summed, optionally clipped, rows of an IndexedSlices.

    The sums are those of :meth:`IndexedSlices.deduplicate` (from zero, in order of
    appearance), as ``(rows int64 (U,), sums (U, row_size))``; ``fl``/``sc``/``d`` select
    a clipping of the raw rows first (default none).
    """
    dtype = grad.dtype
    vals = rows2d(grad.values)
    order, srows = stable_order(grad.indices)
    fl = flags() if fl is None else fl
    sc = scalars(dtype) if sc is None else sc
    d = dtype.type(1) if d is None else d
    return K.dedup_rows(order, srows, vals, fl, sc, d, dtype.type(0))
