"""Order-defined sums of the phased updates (Lamb, Adafactor), compiled.

Each function here computes, operation for operation and in the same order, one of the
reference's readable sums (:mod:`refopt.reference.adafactor`: :func:`eigen_sum`,
:func:`eigen_sum_rows`, ``_seq_sum``, :func:`xla_sum_squares`; :mod:`refopt.reference.
reductions`: :func:`torch_sum_squares`, :func:`torch_vector_norm`), with an element map
applied on the fly (``x``, ``x*x``, ``x*x + e`` rounded twice, ``fma(x, x, e)``) so that no
full-size temporary is made. float32 arithmetic stays float32 (Numba types ``f4 op f4`` as
``f4``; nothing is contracted: ``fastmath=False``); the float32 FMA is the reference's (the
float64 sum of the exact product, rounded once to float32), the float64 one
:func:`refopt.rules.ops.fma` (Dekker and Knuth, as :func:`refopt.reference.variants.fma`).
The reference stays the ground truth: ``tests/test_lamb_adafactor_fast.py`` compares every
function with it bit for bit on random and edge inputs.

The sums are serial (each result's additions in the defined order); independent results
(rows, columns) run in parallel, which does not change any of them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange
from numba.extending import register_jitable

from refopt.rules.ops import fma

__all__ = [
    "M_FMA",
    "M_ID",
    "M_SQ",
    "M_SQ_ADD",
    "eigen_rows_map",
    "eigen_sum_map",
    "eigen_sum_squares",
    "seq_axis_map",
    "torch_rows_norm",
    "torch_sum_squares",
    "torch_vector_norm",
    "torch_vector_norm2",
    "xla_sum_squares",
    "xla_sum_squares2",
]

_OPTS = dict(cache=True, error_model="numpy", fastmath=False, nogil=True)

#: The element maps: ``x``, ``x*x``, ``x*x + e`` (two roundings), ``fma(x, x, e)``.
M_ID, M_SQ, M_SQ_ADD, M_FMA = 0, 1, 2, 3

#: Eigen's and PyTorch's packets: 32 bytes.
_PACKET = 32


@register_jitable
def _map(x, mode, e):
    if mode == 0:
        return x
    if mode == 1:
        return x * x
    if mode == 2:
        return x * x + e
    return fma(x, x, e)


@njit(**_OPTS)
def _eigen_row(x, lo, n, lanes, mode, e, zero, acc):
    # eigen_sum_rows of one row x[lo:lo+n]: the tail from +0 in order; the packets added lane
    # by lane (NumPy's add.reduce over the packets' axis: the first packet is the initial
    # value, the others added in order), the lanes folded in halves, then tail + lanes.
    whole = (n // lanes) * lanes
    tail = zero
    for j in range(whole, n):
        tail = tail + _map(x[lo + j], mode, e)
    if whole == 0:
        return tail
    for k in range(lanes):
        acc[k] = _map(x[lo + k], mode, e)
    for b in range(lanes, whole, lanes):
        for k in range(lanes):
            acc[k] = acc[k] + _map(x[lo + b + k], mode, e)
    h = lanes
    while h > 1:
        h //= 2
        for k in range(h):
            acc[k] = acc[k] + acc[k + h]
    return tail + acc[0]


@njit(**_OPTS)
def _eigen_rows_serial(x, rows, n, lanes, mode, e, zero, out):
    acc = np.empty(lanes, x.dtype)
    for r in range(rows):
        out[r] = _eigen_row(x, r * n, n, lanes, mode, e, zero, acc)


@njit(parallel=True, **_OPTS)
def _eigen_rows_par(x, rows, n, lanes, mode, e, zero, out):
    for r in prange(rows):
        acc = np.empty(lanes, x.dtype)
        out[r] = _eigen_row(x, r * n, n, lanes, mode, e, zero, acc)


def _flat(x):
    return np.ascontiguousarray(x).reshape(-1)


def _lanes(dt):
    return _PACKET // dt.itemsize


def eigen_rows_map(x, mode=M_ID, e=0):
    """``eigen_sum_rows(map(x))``: each row (last axis) summed in Eigen's order, shape
    ``x.shape[:-1]``."""
    x = np.ascontiguousarray(x)
    dt = x.dtype
    n = x.shape[-1]
    out = np.empty(x.shape[:-1], dt)
    rows = out.size
    if rows == 0:
        return out
    f = _eigen_rows_par if rows > 1 and x.size >= (1 << 17) else _eigen_rows_serial
    with np.errstate(all="ignore"):
        f(x.reshape(-1), rows, n, _lanes(dt), mode, dt.type(e), dt.type(0), out.reshape(-1))
    return out


def eigen_sum_map(x, mode=M_ID, e=0):
    """``eigen_sum(map(x))`` of the whole array (C order), a scalar of its dtype."""
    return eigen_rows_map(_flat(x).reshape(1, -1), mode, e)[0]


@njit(**_OPTS)
def _seq_add(O, X, mode, e):
    # O += map(X), slices indexed from 0 (a loop that vectorises), one mode per loop
    if mode == 0:
        for j in range(O.shape[0]):
            O[j] = O[j] + _map(X[j], 0, e)
    elif mode == 1:
        for j in range(O.shape[0]):
            O[j] = O[j] + _map(X[j], 1, e)
    elif mode == 2:
        for j in range(O.shape[0]):
            O[j] = O[j] + _map(X[j], 2, e)
    else:
        for j in range(O.shape[0]):
            O[j] = O[j] + _map(X[j], 3, e)


@njit(**_OPTS)
def _seq_block(x, a, K, B, b0, b1, mode, e, out):
    base = a * K * B
    if B == 1:  # a contiguous line: one running sum
        acc = out[a]
        for k in range(K):
            acc = acc + _map(x[base + k], mode, e)
        out[a] = acc
        return
    O = out[a * B + b0:a * B + b1]
    for k in range(K):
        row = base + k * B
        _seq_add(O, x[row + b0:row + b1], mode, e)


_BLOCK = 512


@njit(**_OPTS)
def _seq_serial(x, A, K, B, mode, e, out):
    for a in range(A):
        _seq_block(x, a, K, B, 0, B, mode, e, out)


@njit(parallel=True, **_OPTS)
def _seq_par(x, A, K, B, mode, e, out):
    nb = (B + _BLOCK - 1) // _BLOCK
    for t in prange(A * nb):
        a = t // nb
        b0 = (t % nb) * _BLOCK
        _seq_block(x, a, K, B, b0, min(B, b0 + _BLOCK), mode, e, out)


def seq_axis_map(x, axis, mode=M_ID, e=0):
    """``_seq_sum(map(x), axis)``: the sum along ``axis`` in index order from ``+0``, that
    axis removed."""
    x = np.ascontiguousarray(x)
    dt = x.dtype
    axis = axis % x.ndim
    A = int(np.prod(x.shape[:axis], dtype=np.int64))
    K = x.shape[axis]
    B = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    out = np.zeros(x.shape[:axis] + x.shape[axis + 1:], dt)
    if out.size == 0:
        return out
    f = _seq_par if x.size >= (1 << 17) else _seq_serial
    with np.errstate(all="ignore"):
        f(x.reshape(-1), A, K, B, mode, dt.type(e), out.reshape(-1))
    return out


@njit(**_OPTS)
def _xla_f32(x):
    acc = np.float32(0.0)
    for i in range(x.size):
        a = np.float64(x[i])
        acc = np.float32(a * a + np.float64(acc))
    return acc


@njit(**_OPTS)
def _xla_f64(x):
    acc = np.float64(0.0)
    for i in range(x.size):
        acc = fma(x[i], x[i], acc)
    return acc


def xla_sum_squares(x):
    """:func:`refopt.reference.adafactor.xla_sum_squares` (float32 and float64)."""
    flat = _flat(x)
    with np.errstate(all="ignore"):
        if flat.dtype == np.float32:
            return np.float32(_xla_f32(flat))
        if flat.dtype == np.float64:
            return np.float64(_xla_f64(flat))
    from refopt.reference.adafactor import xla_sum_squares as ref

    return ref(x)


@njit(**_OPTS)
def _torch_ssq(x, lo, n, lanes, unfused4, zero, acc):
    # torch_sum_squares of x[lo:lo+n]: lane accumulators from +0, the lanes added in order,
    # the tail: its first `unfused4` squares rounded then added (a tail of >= 4), then FMAs
    m = n - n % lanes
    for k in range(lanes):
        acc[k] = zero
    for b in range(0, m, lanes):
        for k in range(lanes):
            v = x[lo + b + k]
            acc[k] = acc[k] + v * v
    s = acc[0]
    for k in range(1, lanes):
        s = s + acc[k]
    unfused = unfused4 if n - m >= 4 else 0
    for k in range(n - m):
        v = x[lo + m + k]
        if k < unfused:
            s = s + v * v
        else:
            s = fma(v, v, s)
    return s


@njit(**_OPTS)
def _torch_rows_serial(x, rows, n, lanes, unfused4, zero, out):
    acc = np.empty(lanes, x.dtype)
    for r in range(rows):
        if n == 1:
            out[r] = abs(x[r])
        elif n > 1:
            out[r] = np.sqrt(_torch_ssq(x, r * n, n, lanes, unfused4, zero, acc))


@njit(parallel=True, **_OPTS)
def _torch_rows_par(x, rows, n, lanes, unfused4, zero, out):
    for r in prange(rows):
        acc = np.empty(lanes, x.dtype)
        if n == 1:
            out[r] = abs(x[r])
        elif n > 1:
            out[r] = np.sqrt(_torch_ssq(x, r * n, n, lanes, unfused4, zero, acc))


@njit(**_OPTS)
def _torch_ssq_all(x, lanes, unfused4, zero):
    acc = np.empty(lanes, x.dtype)
    return _torch_ssq(x, 0, x.size, lanes, unfused4, zero, acc)


# Whole-array torch_sum_squares with the lanes in registers (8 float32 or 4 float64 named
# accumulators: the same additions as _torch_ssq's, which keeps them in memory)
@njit(**_OPTS)
def _torch_tail(x, m, n, unfused4, s):
    unfused = unfused4 if n - m >= 4 else 0
    for k in range(n - m):
        v = x[m + k]
        if k < unfused:
            s = s + v * v
        else:
            s = fma(v, v, s)
    return s


@njit(**_OPTS)
def _torch_sq8(x, unfused4, zero):
    n = x.size
    m = n - n % 8
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = zero
    for b in range(0, m, 8):
        a0 = a0 + x[b] * x[b]
        a1 = a1 + x[b + 1] * x[b + 1]
        a2 = a2 + x[b + 2] * x[b + 2]
        a3 = a3 + x[b + 3] * x[b + 3]
        a4 = a4 + x[b + 4] * x[b + 4]
        a5 = a5 + x[b + 5] * x[b + 5]
        a6 = a6 + x[b + 6] * x[b + 6]
        a7 = a7 + x[b + 7] * x[b + 7]
    s = ((((((a0 + a1) + a2) + a3) + a4) + a5) + a6) + a7
    return _torch_tail(x, m, n, unfused4, s)


@njit(**_OPTS)
def _torch_sq4(x, unfused4, zero):
    n = x.size
    m = n - n % 4
    a0 = a1 = a2 = a3 = zero
    for b in range(0, m, 4):
        a0 = a0 + x[b] * x[b]
        a1 = a1 + x[b + 1] * x[b + 1]
        a2 = a2 + x[b + 2] * x[b + 2]
        a3 = a3 + x[b + 3] * x[b + 3]
    s = ((a0 + a1) + a2) + a3
    return _torch_tail(x, m, n, unfused4, s)


def _torch_whole(flat):
    # torch_sum_squares of a contiguous float32/float64 1-d array, lanes in registers
    dt = flat.dtype
    f = _torch_sq8 if _lanes(dt) == 8 else _torch_sq4
    return dt.type(f(flat, _unfused(dt), dt.type(0)))


@njit(parallel=True, **_OPTS)
def _torch_sq_two(x, y, lanes, unfused4, zero, out):
    for k in prange(2):
        z = x if k == 0 else y
        if lanes == 8:
            out[k] = _torch_sq8(z, unfused4, zero)
        else:
            out[k] = _torch_sq4(z, unfused4, zero)


def torch_vector_norm2(x, y):
    """``(torch_vector_norm(x), torch_vector_norm(y))``; two large arrays of one dtype
    (float32 or float64) are summed at once on two threads, each serially in PyTorch's
    order."""
    fx, fy = _flat(x), _flat(y)
    dt = fx.dtype
    if not (dt in (np.float32, np.float64) and fy.dtype == dt and fx.size > 1
            and fy.size > 1 and fx.size + fy.size >= (1 << 18)):
        return torch_vector_norm(x), torch_vector_norm(y)
    out = np.empty(2, dt)
    with np.errstate(all="ignore"):
        _torch_sq_two(fx, fy, _lanes(dt), _unfused(dt), dt.type(0), out)
        return np.sqrt(out[0]), np.sqrt(out[1])


def _unfused(dt):
    from refopt.reference.reductions import TORCH_TAIL_UNFUSED

    return TORCH_TAIL_UNFUSED[dt.itemsize]


def torch_sum_squares(x):
    """:func:`refopt.reference.reductions.torch_sum_squares` (float32 and float64)."""
    flat = _flat(x)
    dt = flat.dtype
    with np.errstate(all="ignore"):
        if _lanes(dt) in (4, 8):
            return _torch_whole(flat)
        return dt.type(_torch_ssq_all(flat, _lanes(dt), _unfused(dt), dt.type(0)))


def torch_rows_norm(x):
    """``torch_vector_norm`` of each row (last axis) of ``x``, shape ``x.shape[:-1]``
    (:func:`refopt.reference.adafactor._torch_norm_axis` without the kept axis)."""
    x = np.ascontiguousarray(x)
    dt = x.dtype
    n = x.shape[-1]
    out = np.zeros(x.shape[:-1], dt)
    rows = out.size
    if rows == 0:
        return out
    f = _torch_rows_par if rows > 1 and x.size >= (1 << 17) else _torch_rows_serial
    with np.errstate(all="ignore"):
        f(x.reshape(-1), rows, n, _lanes(dt), _unfused(dt), dt.type(0), out.reshape(-1))
    return out


def torch_vector_norm(x):
    """:func:`refopt.reference.reductions.torch_vector_norm` (float32 and float64)."""
    flat = _flat(x)
    if flat.dtype not in (np.float32, np.float64):
        from refopt.reference.reductions import torch_vector_norm as ref

        return ref(x)
    if flat.size > 1:  # (one element: |x|, as torch_rows_norm)
        with np.errstate(all="ignore"):
            return np.sqrt(_torch_whole(flat))
    return torch_rows_norm(flat.reshape(1, -1))[0]


# Whole-array eigen_sum(x*x) with the lanes in registers (8 float32 or 4 float64 named
# accumulators: the same additions as _eigen_row's, which keeps them in memory).
@njit(**_OPTS)
def _eigen_sq8(x, zero):
    n = x.size
    whole = (n // 8) * 8
    tail = zero
    for j in range(whole, n):
        tail = tail + x[j] * x[j]
    if whole == 0:
        return tail
    a0, a1, a2, a3 = x[0] * x[0], x[1] * x[1], x[2] * x[2], x[3] * x[3]
    a4, a5, a6, a7 = x[4] * x[4], x[5] * x[5], x[6] * x[6], x[7] * x[7]
    for b in range(8, whole, 8):
        a0 = a0 + x[b] * x[b]
        a1 = a1 + x[b + 1] * x[b + 1]
        a2 = a2 + x[b + 2] * x[b + 2]
        a3 = a3 + x[b + 3] * x[b + 3]
        a4 = a4 + x[b + 4] * x[b + 4]
        a5 = a5 + x[b + 5] * x[b + 5]
        a6 = a6 + x[b + 6] * x[b + 6]
        a7 = a7 + x[b + 7] * x[b + 7]
    a0, a1, a2, a3 = a0 + a4, a1 + a5, a2 + a6, a3 + a7
    a0, a1 = a0 + a2, a1 + a3
    return tail + (a0 + a1)


@njit(**_OPTS)
def _eigen_sq4(x, zero):
    n = x.size
    whole = (n // 4) * 4
    tail = zero
    for j in range(whole, n):
        tail = tail + x[j] * x[j]
    if whole == 0:
        return tail
    a0, a1, a2, a3 = x[0] * x[0], x[1] * x[1], x[2] * x[2], x[3] * x[3]
    for b in range(4, whole, 4):
        a0 = a0 + x[b] * x[b]
        a1 = a1 + x[b + 1] * x[b + 1]
        a2 = a2 + x[b + 2] * x[b + 2]
        a3 = a3 + x[b + 3] * x[b + 3]
    a0, a1 = a0 + a2, a1 + a3
    return tail + (a0 + a1)


def eigen_sum_squares(x):
    """``eigen_sum(x * x)`` of the whole array (C order)."""
    flat = _flat(x)
    dt = flat.dtype
    with np.errstate(all="ignore"):
        if dt == np.float32:
            return dt.type(_eigen_sq8(flat, dt.type(0)))
        if dt == np.float64:
            return dt.type(_eigen_sq4(flat, dt.type(0)))
    return eigen_sum_map(x, M_SQ)


@njit(**_OPTS)
def _xla2(x, y, zero):
    ax = zero
    ay = zero
    for i in range(x.size):
        ax = fma(x[i], x[i], ax)
        ay = fma(y[i], y[i], ay)
    return ax, ay


def xla_sum_squares2(x, y):
    """``(xla_sum_squares(x), xla_sum_squares(y))`` of two arrays of one size and dtype, in
    one pass (two independent chains of FMAs, each in order)."""
    fx, fy = _flat(x), _flat(y)
    dt = fx.dtype
    if dt not in (np.float32, np.float64) or fy.dtype != dt or fy.size != fx.size:
        return xla_sum_squares(x), xla_sum_squares(y)
    with np.errstate(all="ignore"):
        a, b = _xla2(fx, fy, dt.type(0))
    return dt.type(a), dt.type(b)


class _Sums:
    """The sums :func:`refopt.rules.lamb.pure_update` and :func:`refopt.rules.adafactor.
    pure_update` take (their ``sums`` argument), compiled: the same bits as the reference's
    functions those modules use by default (``refopt.rules.adafactor.HOST_SUMS``)."""

    eigen_sum_squares = staticmethod(eigen_sum_squares)

    xla_sum_squares = staticmethod(xla_sum_squares)
    xla_sum_squares2 = staticmethod(xla_sum_squares2)
    torch_vector_norm = staticmethod(torch_vector_norm)
    torch_vector_norm2 = staticmethod(torch_vector_norm2)

    @staticmethod
    def eigen_rows_sq_add(g, e):
        """``eigen_sum_rows(g * g + e)``."""
        return eigen_rows_map(g, M_SQ_ADD, e)

    @staticmethod
    def seq_sum_sq_add(g, e, axis):
        """``_seq_sum(g * g + e, axis)``."""
        return seq_axis_map(g, axis, M_SQ_ADD, e)

    @staticmethod
    def seq_sum_fma(g, e, axis):
        """``_seq_sum(fma(g, g, e), axis)``."""
        return seq_axis_map(g, axis, M_FMA, e)

    @staticmethod
    def seq_sum_sq(g, axis):
        """``_seq_sum(g * g, axis)``."""
        return seq_axis_map(g, axis, M_SQ)

    torch_rows_norm = staticmethod(torch_rows_norm)


#: The compiled sums (float32 and float64 arrays).
SUMS = _Sums()
