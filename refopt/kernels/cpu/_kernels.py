"""The hand-written Numba helpers of the CPU backend (private).

Every update is built from a rule by :mod:`refopt.kernels.cpu.drivers`; what remains here is
what a rule does not define:

- the addresses and work items of the generated drivers: :func:`_ptr` (an int64 address as a
  typed pointer, turned into an array with ``numba.carray``), :func:`_chunks` (fixed work
  items of ``CHUNK`` elements over every tensor), :func:`_prefetch_row`;
- the sums of a sparse gradient's duplicate rows (:func:`_segment_sums`, after the
  pipeline's clip of :mod:`refopt.rules.steps`), the first step of the drivers' ``rows``
  and ``table`` kernels;
- the sums of squares of norm clipping in NumPy's pairwise order (:func:`sumsq_multi`, used
  by :func:`refopt.kernels.cpu.clipping.sums_of_squares`: the executor's and the pure
  functions' norms);
- :func:`read_int64_at`: raw memory reads (the CPU executor reads the data pointers of live
  ndarray objects with it).

As every kernel of this backend: ``error_model='numpy'``, ``fastmath`` off (LLVM neither
contracts ``a * b + c`` nor reorders), ``cache=True`` and no signatures (nothing compiles at
import). Reductions run serially per tensor, so results do not depend on
``NUMBA_NUM_THREADS``.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from refopt.rules.steps import clip as _clip

_OPTS = dict(cache=True, error_model="numpy", fastmath=False, nogil=True)
jit = njit(**_OPTS)

#: Elements per parallel work item (a multiple of every SIMD width).
CHUNK = 1 << 16

@intrinsic
def _ptr(typingctx, addr, like):
    """A pointer to ``like``'s dtype at the integer address ``addr`` (no copy, no check)."""
    if not isinstance(addr, types.Integer) or not isinstance(like, types.Array):
        return None
    sig = types.CPointer(like.dtype)(addr, like)

    def codegen(context, builder, signature, args):
        llty = context.get_value_type(like.dtype)
        return builder.inttoptr(args[0], llty.as_pointer())

    return sig, codegen


@intrinsic
def _prefetch(typingctx, arr, index):
    """Hint the CPU to fetch the cache line of ``arr[index]`` (1-D) for writing; no effect on
    results. Used ahead of the random rows of the lazy update, whose latency dominates."""
    if not isinstance(arr, types.Array) or not isinstance(index, types.Integer):
        return None
    sig = types.void(arr, index)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]],
                                       wraparound=False, boundscheck=False)
        i8p = builder.bitcast(ptr, ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        name = "llvm.prefetch.p0" if str(i8p.type) == "ptr" else "llvm.prefetch.p0i8"
        fnty = ir.FunctionType(ir.VoidType(), [i8p.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        # rw = 1 (write), locality = 3 (keep in all levels), cache type = 1 (data)
        builder.call(fn, [i8p, ir.Constant(i32, 1), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


#: How many unique rows ahead the lazy update prefetches.
PREFETCH_ROWS = 4


@jit
def _prefetch_row(T, r):
    """Prefetch every 64-byte line of row ``r`` of the 2-D table ``T``."""
    row = T[r]
    step = max(1, 64 // row.itemsize)
    for j in range(0, row.shape[0], step):
        _prefetch(row, j)


@jit
def _chunks(cnt):
    """Work items ``(tensor, start)`` of at most CHUNK elements covering every tensor."""
    n = 0
    for t in range(cnt.shape[0]):
        n += (cnt[t] + CHUNK - 1) // CHUNK
    ct = np.empty(n, np.int64)
    cs = np.empty(n, np.int64)
    k = 0
    for t in range(cnt.shape[0]):
        s = 0
        while s < cnt[t]:
            ct[k] = t
            cs[k] = s
            k += 1
            s += CHUNK
    return ct, cs


# --------------------------------------------------------------------------- reductions
@jit
def _sq(x, half, hv):
    """``x * x``, times ``hv`` when ``half`` (``l2_loss``'s ``x * x * 0.5``)."""
    return x * x * hv if half else x * x


@jit
def _leaf_sumsq(X, lo, n, zero, half, hv):
    """NumPy's pairwise_sum on at most 128 terms (see :func:`_pairwise_sumsq`)."""
    if n < 8:
        res = zero
        for i in range(lo, lo + n):
            res = res + _sq(X[i], half, hv)
        return res
    r0 = _sq(X[lo], half, hv)
    r1 = _sq(X[lo + 1], half, hv)
    r2 = _sq(X[lo + 2], half, hv)
    r3 = _sq(X[lo + 3], half, hv)
    r4 = _sq(X[lo + 4], half, hv)
    r5 = _sq(X[lo + 5], half, hv)
    r6 = _sq(X[lo + 6], half, hv)
    r7 = _sq(X[lo + 7], half, hv)
    i = 8
    stop = n - n % 8
    while i < stop:
        b = lo + i
        r0 = r0 + _sq(X[b], half, hv)
        r1 = r1 + _sq(X[b + 1], half, hv)
        r2 = r2 + _sq(X[b + 2], half, hv)
        r3 = r3 + _sq(X[b + 3], half, hv)
        r4 = r4 + _sq(X[b + 4], half, hv)
        r5 = r5 + _sq(X[b + 5], half, hv)
        r6 = r6 + _sq(X[b + 6], half, hv)
        r7 = r7 + _sq(X[b + 7], half, hv)
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res = res + _sq(X[lo + i], half, hv)
        i += 1
    return res


@jit
def _pairwise_sumsq(X, n, zero, half, hv):
    """``sum(x * x)`` (times ``hv`` per term when ``half``) of ``X[:n]`` in NumPy's order.

    NumPy's float add reduction (``pairwise_sum`` in ``numpy/_core/src/umath``): fewer than 8
    terms are added left to right from zero; up to 128 terms go into 8 interleaved partial
    sums combined as ``((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))`` plus the remainder left to
    right; longer runs split at ``n/2`` rounded down to a multiple of 8 and add the two
    halves' sums. The recursion is walked with an explicit stack (Numba's cache does not
    handle recursive functions): frames ``(lo, n, phase)``, partial sums on a second stack.
    """
    if n <= 128:
        return _leaf_sumsq(X, 0, n, zero, half, hv)
    f_lo = np.empty(128, np.int64)
    f_n = np.empty(128, np.int64)
    f_phase = np.empty(128, np.int64)
    acc = np.empty(128, X.dtype)
    sp = 1
    f_lo[0] = 0
    f_n[0] = n
    f_phase[0] = 0
    ap = 0
    while sp > 0:
        lo = f_lo[sp - 1]
        m = f_n[sp - 1]
        if m <= 128:
            sp -= 1
            acc[ap] = _leaf_sumsq(X, lo, m, zero, half, hv)
            ap += 1
            continue
        m2 = m // 2
        m2 -= m2 % 8
        phase = f_phase[sp - 1]
        if phase == 0:
            f_phase[sp - 1] = 1
            f_lo[sp] = lo
            f_n[sp] = m2
            f_phase[sp] = 0
            sp += 1
        elif phase == 1:
            f_phase[sp - 1] = 2
            f_lo[sp] = lo + m2
            f_n[sp] = m - m2
            f_phase[sp] = 0
            sp += 1
        else:
            sp -= 1
            acc[ap - 2] = acc[ap - 2] + acc[ap - 1]
            ap -= 1
    return acc[0]


@jit
def sumsq_multi(gaddr, cnt, out, zero, half, hv):
    """``out[t] = 0 + sum(g_t * g_t [* hv])`` per tensor, as ``np.sum(..., dtype)`` computes it.

    ``out`` (dtype (T,)) also fixes the dtype of the tensors. One tensor per work item; each
    sum is serial, so the result does not depend on the thread count.
    """
    for t in prange(cnt.shape[0]):
        X = carray(_ptr(gaddr[t], out), (cnt[t],))
        out[t] = zero + _pairwise_sumsq(X, cnt[t], zero, half, hv)


# --------------------------------------------------------------------------- sparse rows
@jit
def _run_starts(srows):
    """Start of each run of equal values in the sorted rows ``srows`` (plus the end)."""
    n = srows.shape[0]
    starts = np.empty(n + 1, np.int64)
    u = 0
    for k in range(n):
        if k == 0 or srows[k] != srows[k - 1]:
            starts[u] = k
            u += 1
    starts[u] = n
    return starts[: u + 1]


@jit
def _segment_sums(order, srows, vals, mode, c, d, s):
    """Unique rows (ascending) and the sums of their clipped gradient rows, in input order.

    Each input position is given the slot of its unique row (from the runs of the stable
    sort), then the gradient rows are streamed once in input order and added into their
    slot: ``sums[u] = +0 + clip(vals[i1]) + clip(vals[i2]) + ...`` for the positions
    ``i1 < i2 < ...`` of row ``u`` (clip: :func:`refopt.rules.steps.clip` with mode ``mode``),
    exactly :meth:`IndexedSlices.deduplicate`'s sums. The reads of ``vals`` are sequential
    and the sums (one row per unique index) stay in cache.
    """
    starts = _run_starts(srows)
    u = starts.shape[0] - 1
    n = order.shape[0]
    rows = np.empty(u, np.int64)
    slot = np.empty(n, np.int64)
    for k in range(u):
        rows[k] = srows[starts[k]]
        for q in range(starts[k], starts[k + 1]):
            slot[order[q]] = k
    sums = np.zeros((u, vals.shape[1]), vals.dtype)  # from +0, whatever the scalars
    for i in range(n):
        out = sums[slot[i]]
        row = vals[i]
        for j in range(out.shape[0]):
            out[j] = out[j] + _clip(row[j], mode, c, d, s)
    return rows, sums


@jit
def read_int64_at(addresses):
    """``out[k] = *(int64 *)addresses[k]``: reads raw memory (used on live ndarray objects)."""
    out = np.empty_like(addresses)
    for k in range(addresses.shape[0]):
        out[k] = carray(_ptr(addresses[k], addresses), (1,))[0]
    return out


#: Every dispatcher of this module (the import test checks none has compiled anything).
DISPATCHERS = (
    _chunks, _prefetch_row, _sq, _leaf_sumsq, _pairwise_sumsq, sumsq_multi, _run_starts,
    _segment_sums, read_int64_at,
)
