"""The hand-written Numba helpers of the CPU backend (private).

Every update is built from a rule by :mod:`refopt.kernels.cpu.drivers`; what remains here is
what a rule does not define:

- the addresses and work items of the generated drivers: :func:`_ptr` (an int64 address as a
  typed pointer, turned into an array with ``numba.carray``), :func:`_chunks` (fixed work
  items of ``CHUNK`` elements over every tensor), :func:`_prefetch_row`;
- the sums of a sparse gradient's duplicate rows (:func:`_segment_sums`, after the
  pipeline's clip of :mod:`refopt.rules.steps`), the first step of the drivers' ``rows``
  and ``table`` kernels;
- :func:`_vector_root`: a call of MKL's vector square root by address (the rules' split
  root, :class:`refopt.rules.Root`);
- :func:`read_int64_at`: raw memory reads (the CPU executor reads the data pointers of live
  ndarray objects with it).

As every kernel of this backend: ``error_model='numpy'``, ``fastmath`` off (LLVM neither
contracts ``a * b + c`` nor reorders), ``cache=True`` and no signatures (nothing compiles at
import). The sums of squares of norm clipping are reductions
(:mod:`refopt.rules.reduce`), built by the drivers (:func:`refopt.kernels.cpu.drivers.reduce`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
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


@intrinsic
def _vector_root(typingctx, addr, src, dst, mode):
    """Call the C function at the integer address ``addr`` as MKL's ``vmsSqrt``/``vmdSqrt``:
    ``f(n, src, dst, mode)`` with ``n = src.size`` (int64) and the contiguous 1-D arrays'
    data pointers: ``dst = sqrt(src)`` as that library computes it. The address is an
    argument (found at run time by :mod:`refopt._mkl`), so the kernels calling it cache."""
    if not (isinstance(addr, types.Integer) and isinstance(mode, types.Integer)
            and all(isinstance(a, types.Array) and a.ndim == 1 and a.layout == "C"
                    and a.dtype == src.dtype for a in (src, dst))):
        return None
    sig = types.void(addr, src, dst, mode)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        i8p = ir.IntType(8).as_pointer()
        a_src = context.make_array(signature.args[1])(context, builder, args[1])
        a_dst = context.make_array(signature.args[2])(context, builder, args[2])
        n = builder.extract_value(a_src.shape, 0)
        fnty = ir.FunctionType(ir.VoidType(), [i64, i8p, i8p, i64])
        fn = builder.inttoptr(context.cast(builder, args[0], signature.args[0], types.int64),
                              fnty.as_pointer())
        builder.call(fn, [builder.sext(n, i64) if n.type != i64 else n,
                          builder.bitcast(a_src.data, i8p), builder.bitcast(a_dst.data, i8p),
                          context.cast(builder, args[3], signature.args[3], types.int64)])
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
def _tuple8(a):
    # the first 8 entries of an array as a tuple (scalars in registers, never reloaded from
    # memory a loop writes); shared by every generated driver module, so compiled once per
    # dtype rather than once per module
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@jit
def _tuple16(a):
    # the first 16 entries of an array as a tuple (see _tuple8)
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
            a[13], a[14], a[15])


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
    _chunks, _prefetch_row, _run_starts, _segment_sums, read_int64_at,
)
