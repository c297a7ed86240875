"""PyTorch's ``SGD(momentum>0)`` on sparse COO gradients, with its sparse momentum buffer.

Follows ``torch/optim/sgd.py`` (``_single_tensor_sgd``, the default CPU path) and ATen's
sparse CPU kernels (``aten/src/ATen/native/sparse/SparseTensorMath.cpp``: ``clone``,
``mul_out_sparse_zerodim``, ``add_out_sparse_contiguous``, ``add_out_dense_sparse_cpu``), as
measured on torch 2.13 (golden cases ``torch/sgd_sparse_momentum_*``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import check_flag, check_real, scalar

__all__ = [
    "SGDSparseMomentumResult",
    "SparseMomentumBuffer",
    "sgd_sparse_torch_momentum_update",
    "sparse_buffer_to_dense",
    "torch_sparse_add",
]


class SparseMomentumBuffer(NamedTuple):
    """torch's uncoalesced sparse momentum buffer: ``indices`` (int64, shape ``(n,)``, in
    torch's entry order, repeats allowed) and ``values`` (shape ``(n,) + row_shape``)."""

    indices: np.ndarray
    values: np.ndarray


class SGDSparseMomentumResult(NamedTuple):
    """New arrays after one step: the variable ``param`` and the sparse ``buffer``."""

    param: np.ndarray
    buffer: SparseMomentumBuffer


def torch_sparse_add(t, s, alpha):
    r"""``t.add(s, alpha=alpha)`` of two uncoalesced sparse COO tensors, as torch's CPU kernel.

    Parameters
    ----------
    t, s : SparseMomentumBuffer
        Same dtype and row shape.
    alpha : float
        Converted to the dtype with one rounding (ATen's ``value.to<scalar_t>()``).

    Returns
    -------
    SparseMomentumBuffer
        New arrays. Either operand empty: ``t`` copied (``s`` empty), or ``round(alpha s)``
        (``t`` empty). Otherwise ATen's ``add_out_sparse_contiguous``: one merge pass over
        the two entry lists as they are (not sorted, not coalesced): at each step the heads
        ``t[i]``, ``s[j]`` are compared; the smaller index is emitted alone, equal indices
        are emitted once as their sum. Values: an entry of ``t`` is ``t + 0`` (BLAS
        ``axpy`` into a zeroed row: ``-0`` becomes ``+0``), of ``s`` alone
        ``fma(alpha, s, +0)``, of both ``fma(alpha, s, t + 0)`` (MKL's ``axpy``: one
        rounding, measured on rows of 1 to 37 elements, float32 and float64).
    """
    from refopt.reference.variants import fma

    dtype = t.values.dtype
    a = scalar(dtype, float(alpha))
    nt, ns = t.indices.shape[0], s.indices.shape[0]
    if ns == 0:
        return SparseMomentumBuffer(t.indices.copy(), t.values.copy())
    if nt == 0:
        with np.errstate(all="ignore"):
            return SparseMomentumBuffer(s.indices.copy(), np.asarray(s.values * a, dtype))
    ti, si = t.indices.tolist(), s.indices.tolist()
    take_t, take_s = [], []  # per output entry: the position in t / s, or -1
    i = j = 0
    while i < nt or j < ns:
        if i >= nt:
            cmp = -1
        elif j >= ns:
            cmp = 1
        else:
            cmp = 1 if ti[i] < si[j] else (-1 if ti[i] > si[j] else 0)
        take_t.append(i if cmp >= 0 else -1)
        take_s.append(j if cmp <= 0 else -1)
        i += cmp >= 0
        j += cmp <= 0
    take_t, take_s = np.asarray(take_t, np.int64), np.asarray(take_s, np.int64)
    has_t, has_s = take_t >= 0, take_s >= 0
    idx = np.where(has_t, t.indices[np.maximum(take_t, 0)], s.indices[np.maximum(take_s, 0)])
    zero = dtype.type(0)
    with np.errstate(all="ignore"):
        vals = np.zeros((idx.shape[0],) + t.values.shape[1:], dtype)
        vals[has_t] = t.values[take_t[has_t]] + zero
        vals[has_s] = fma(a, s.values[take_s[has_s]], vals[has_s])
    return SparseMomentumBuffer(np.asarray(idx, np.int64), np.asarray(vals, dtype))


def sparse_buffer_to_dense(buffer, shape):
    """torch's ``buf.to_dense()``: zeros plus every entry in turn (exact additions in order;
    a ``-0`` entry leaves ``+0``). Returns a new ndarray of ``shape``."""
    from refopt.reference.sgd import _occurrence_levels

    out = np.zeros(shape, buffer.values.dtype)
    if buffer.indices.shape[0]:
        with np.errstate(all="ignore"):
            for sel in _occurrence_levels(buffer.indices):
                rows = buffer.indices[sel]
                out[rows] = out[rows] + buffer.values[sel]
    return out


def _check_buffer(param, buffer):
    if buffer is None:
        return None
    if not isinstance(buffer, SparseMomentumBuffer):
        raise TypeError("`buffer` must be a SparseMomentumBuffer or None. Received: "
                        f"{type(buffer).__name__}")
    idx = np.asarray(buffer.indices)
    vals = np.asarray(buffer.values)
    if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError("`buffer.indices` must be a 1-D integer array. Received: shape "
                         f"{idx.shape}, dtype {idx.dtype}")
    if vals.dtype != param.dtype or vals.shape != (idx.shape[0],) + param.shape[1:]:
        raise ValueError(
            f"`buffer.values` must be {param.dtype} of shape {(idx.shape[0],) + param.shape[1:]}"
            f". Received: {vals.dtype} of shape {vals.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= param.shape[0]):
        raise ValueError(f"`buffer.indices` must lie in [0, {param.shape[0]}). Received: "
                         f"min {idx.min()}, max {idx.max()}")
    return SparseMomentumBuffer(idx.astype(np.int64), vals)


def sgd_sparse_torch_momentum_update(param, grad, buffer, *, learning_rate, momentum,
                                     dampening=0.0, nesterov=False):
    r"""One step of ``torch.optim.SGD(momentum>0)`` on a sparse COO gradient; new arrays.

    Parameters
    ----------
    param : ndarray of float32 or float64 (float16 computed alike, not recorded), shape
        ``(rows, ...)``
        The variable :math:`w`; not modified.
    grad : IndexedSlices
        ``dense_shape == param.shape``, the dtype of ``param``; an uncoalesced COO gradient
        (``nn.Embedding(sparse=True)``): repeated indices allowed, kept in order.
    buffer : SparseMomentumBuffer or None
        torch's ``momentum_buffer`` after the variable's previous step, or None on its first
        step (torch's ``buf is None``).
    learning_rate, momentum, dampening : float
        :math:`\eta`, :math:`\mu` (> 0), :math:`d`.
    nesterov : bool

    Returns
    -------
    SGDSparseMomentumResult
        ``(param, buffer)``: the new variable and the new (uncoalesced) buffer.

    Raises
    ------
    TypeError
        ``grad`` not an IndexedSlices; ``param`` not a float ndarray; dtypes differ;
        ``buffer`` of another type.
    ValueError
        ``param`` without a dimension, ``grad.dense_shape != param.shape``, a buffer of the
        wrong shape, dtype or indices, a non-finite ``learning_rate``, ``momentum`` not in
        (0, 1], ``nesterov`` not a bool.

    Notes
    -----
    torch keeps the momentum buffer as a sparse COO tensor that is never coalesced; with
    :math:`\oplus_\alpha` the merge of :func:`torch_sparse_add`:

    .. math::

        b &\leftarrow g \quad\text{(first step: a copy, duplicates and order kept)} \\
        b &\leftarrow (\mu b) \oplus_{1-d} g \quad\text{(each value times } \mu
              \text{, rounded; then the merge)} \\
        u &\leftarrow b \quad\text{or, Nesterov,}\quad u \leftarrow g \oplus_{\mu} b \\
        w_{r_k} &\leftarrow \mathrm{fma}(-\eta, u_k, w_{r_k})
              \quad\text{for each entry } k \text{ of } u \text{ in turn}

    (the last line is :func:`refopt.reference.sgd_sparse_torch_update`: a 1-D variable takes
    two roundings). The buffer grows by the entries of every step whose index lists do not
    line up (the merge combines only equal heads), as torch's does. Scalars are converted to
    the dtype once (``mu``, ``1 - d`` computed in Python, ``-lr``). Rows absent from the
    buffer do not move. The dense formula (:func:`refopt.reference.variants.sgd_variant`)
    sums the duplicates and decays every row's buffer: the same values up to rounding.
    """
    from refopt.reference.sgd import _check_sparse_torch, sgd_sparse_torch_update

    param = _check_sparse_torch(param, grad, learning_rate)
    check_real("momentum", momentum)
    if not 0 < float(momentum) <= 1:
        raise ValueError(f"`momentum` must be in (0, 1]. Received: momentum={momentum!r}")
    check_real("dampening", dampening)
    nesterov = check_flag("nesterov", nesterov)
    buffer = _check_buffer(param, buffer)
    dtype = param.dtype
    idx = np.asarray(grad.indices, np.int64).reshape(-1)
    g = SparseMomentumBuffer(idx, np.asarray(grad.values, dtype).reshape(
        (idx.size,) + param.shape[1:]))  # (not -1: rows of zero width)
    with np.errstate(all="ignore"):
        if buffer is None:
            buf = SparseMomentumBuffer(g.indices.copy(), g.values.copy())
        else:
            mu_b = SparseMomentumBuffer(buffer.indices, buffer.values * scalar(dtype, momentum))
            buf = torch_sparse_add(mu_b, g, 1.0 - float(dampening))
        u = torch_sparse_add(g, buf, momentum) if nesterov else buf
    step = IndexedSlices(u.values, u.indices, param.shape)
    new_param = sgd_sparse_torch_update(param, step, learning_rate=learning_rate)
    return SGDSparseMomentumResult(new_param, buf)
