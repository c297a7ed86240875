"""The Numba kernels of the CPU backend (private; the public functions wrap them).

Rules every kernel here follows (see ``shared/semantics/performance.md``):

- ``error_model='numpy'`` (a division by zero gives inf/NaN as in NumPy, and the loops
  vectorise), ``fastmath`` off: LLVM neither contracts ``a * b + c`` into an FMA nor reorders
  anything, so each element goes through exactly the operations of the reference, in its
  order, each rounded to the array dtype.
- ``cache=True``, no signatures: nothing compiles at import; the first call of a dtype
  compiles (or loads from the cache) that specialisation.
- Every hyperparameter arrives as an argument, already rounded to the array dtype in Python
  by the reference's own helpers (globals are frozen at compile time). They travel in two
  small arrays, ``fl`` (int64 flags) and ``sc`` (scalars of the array dtype), laid out as the
  ``F_*`` and ``S_*`` indices below say.
- The kernels of the optimizers' hot paths (``adam_multi``, ``sgd_multi``,
  ``lazy_adam_rows``, ``ema_k``) are ``parallel=True`` over fixed chunks of ``CHUNK``
  elements (or over unique rows); an element's result does not depend on which thread or
  which vector lane computed it (no FMA, no reassociation), so results do not depend on
  ``NUMBA_NUM_THREADS``. The others are serial (they serve the pure functions and rarer
  paths, and compile twice as fast). Reductions (sums of squares) run serially per tensor
  in NumPy's pairwise order.
- Multi-tensor kernels receive a table of data addresses (int64) and element counts and turn
  each address into a typed array with :func:`_ptr` and ``numba.carray``: one call updates
  every tensor of a dtype group, whatever the number of tensors.
- Sparse rows: a stable sort of the row indices (done by NumPy before the call, see
  ``_common.stable_order``), the gradient rows summed from zero in order of appearance
  (the sums of ``IndexedSlices.deduplicate``), then one owner (one ``prange`` iteration)
  per unique row: no two iterations write the same memory.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

_OPTS = dict(cache=True, error_model="numpy", fastmath=False, nogil=True)
jit = njit(**_OPTS)
pjit = njit(parallel=True, **_OPTS)

#: Elements per parallel work item (a multiple of every SIMD width).
CHUNK = 1 << 16

# Layout of the int64 flag array ``fl``.
F_AMS = 0  # Adam: AMSGrad; SGD: Nesterov
F_CLIP = 1  # 0 none, 1 clip_by_value, 2 clip_by_norm (per-tensor denominator), 3 global scale
F_EMA = 2  # keep the EMA of the weights
F_OVERWRITE = 3  # overwrite the weights with their average in this step
N_FLAGS = 4

# Layout of the scalar array ``sc`` (every entry in the array dtype).
S_LR = 0  # learning rate, lr_cast
S_WD = 1  # weight decay, tf_cast
S_ALPHA = 2  # Adam: lr sqrt(1 - b2^t) / (1 - b1^t); SGD: momentum (tf_cast)
S_C1 = 3  # Adam: 1 - beta_1
S_C2 = 4  # Adam: 1 - beta_2
S_EPS = 5  # Adam: epsilon
S_CLIP = 6  # clip value or clip norm c
S_GSCALE = 7  # global-norm scale
S_MU = 8  # EMA momentum
S_OMU = 9  # 1 - EMA momentum
N_SCALARS = 10


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
def _maximum(a, b):
    """``np.maximum`` of two scalars: NaN if either is NaN (the first NaN), else the larger.

    Of two equal values (``+0.0`` and ``-0.0``) NumPy returns the second: so does this.
    """
    return a if (a > b or a != a) else b


@jit
def _minimum(a, b):
    """``np.minimum`` of two scalars: NaN if either is NaN (the first NaN), else the smaller.

    Of two equal values (``+0.0`` and ``-0.0``) NumPy returns the second: so does this.
    """
    return a if (a < b or a != a) else b


@jit
def _clip(g, mode, c, d, s):
    """The clipped gradient element: by value, by norm ``(g c) / d``, or times the global scale."""
    if mode == 1:
        return _maximum(_minimum(g, c), -c)
    if mode == 2:
        return (g * c) / d
    if mode == 3:
        return g * s
    return g


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


# --------------------------------------------------------------------------- Adam
@jit
def _adam_span(P, G, M, V, VH, A, fl, sc, d, decay):
    """One fused pass of clip, weight decay, Adam (AMSGrad), EMA over 1-D arrays of one length.

    ``VH`` (AMSGrad) and ``A`` (EMA) are read only when their flag is set.
    """
    ams = fl[F_AMS] != 0
    mode = fl[F_CLIP]
    ema = fl[F_EMA] != 0
    ow = fl[F_OVERWRITE] != 0
    lr = sc[S_LR]
    wd = sc[S_WD]
    alpha = sc[S_ALPHA]
    c1 = sc[S_C1]
    c2 = sc[S_C2]
    eps = sc[S_EPS]
    c = sc[S_CLIP]
    s = sc[S_GSCALE]
    mu = sc[S_MU]
    omu = sc[S_OMU]
    n = P.shape[0]
    if not ams and not ema:  # the common case, as its own loop
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = M[i]
            v = V[i]
            m = m + (g - m) * c1
            v = v + (g * g - v) * c2
            M[i] = m
            V[i] = v
            P[i] = p - (m * alpha) / (np.sqrt(v) + eps)
    elif not ema:
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = M[i]
            v = V[i]
            m = m + (g - m) * c1
            v = v + (g * g - v) * c2
            M[i] = m
            V[i] = v
            vh = _maximum(VH[i], v)
            VH[i] = vh
            P[i] = p - (m * alpha) / (np.sqrt(vh) + eps)
    elif not ams:
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = M[i]
            v = V[i]
            m = m + (g - m) * c1
            v = v + (g * g - v) * c2
            M[i] = m
            V[i] = v
            p = p - (m * alpha) / (np.sqrt(v) + eps)
            a = mu * A[i] + omu * p
            A[i] = a
            P[i] = a if ow else p
    else:
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = M[i]
            v = V[i]
            m = m + (g - m) * c1
            v = v + (g * g - v) * c2
            M[i] = m
            V[i] = v
            vh = _maximum(VH[i], v)
            VH[i] = vh
            p = p - (m * alpha) / (np.sqrt(vh) + eps)
            a = mu * A[i] + omu * p
            A[i] = a
            P[i] = a if ow else p


@pjit
def adam_multi(paddr, gaddr, off, cnt, decay, cden, M, V, VH, A, fl, sc):
    """Fused Adam step, in place, over every tensor of one dtype group in one call.

    Parameters
    ----------
    paddr, gaddr : int64 (T,)
        Data addresses of the T variables and of their C-contiguous gradients.
    off, cnt : int64 (T,)
        Offset and element count of each tensor inside the flat state buffers.
    decay : uint8 (T,)
        1 where the tensor gets weight decay.
    cden : dtype (T,)
        Per-tensor clip_by_norm denominators ``max(norm, c)`` (mode 2 only).
    M, V, VH, A : dtype 1-D
        Flat state buffers (m, v, vhat, EMA average); VH/A may be empty when unused.
    fl, sc : flags and scalars (module docstring).
    """
    ct, cs = _chunks(cnt)
    ams = fl[F_AMS] != 0
    ema = fl[F_EMA] != 0
    for q in prange(ct.shape[0]):
        t = ct[q]
        s = cs[q]
        e = min(s + CHUNK, cnt[t])
        o = off[t]
        P = carray(_ptr(paddr[t], M), (cnt[t],))
        G = carray(_ptr(gaddr[t], M), (cnt[t],))
        VHs = VH[o + s:o + e] if ams else VH[0:0]
        As = A[o + s:o + e] if ema else A[0:0]
        _adam_span(P[s:e], G[s:e], M[o + s:o + e], V[o + s:o + e], VHs, As, fl, sc,
                   cden[t], decay[t] != 0)


# --------------------------------------------------------------------------- SGD
@jit
def _sgd_span(P, G, M, A, fl, sc, d, decay):
    """One fused pass of clip, weight decay, SGD (momentum, Nesterov), EMA over 1-D arrays."""
    nesterov = fl[F_AMS] != 0
    mode = fl[F_CLIP]
    ema = fl[F_EMA] != 0
    ow = fl[F_OVERWRITE] != 0
    lr = sc[S_LR]
    wd = sc[S_WD]
    mom = sc[S_ALPHA]
    c = sc[S_CLIP]
    s = sc[S_GSCALE]
    mu = sc[S_MU]
    omu = sc[S_OMU]
    n = P.shape[0]
    if not ema:
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = (-g) * lr + M[i] * mom
            M[i] = m
            P[i] = p + ((-g) * lr + m * mom) if nesterov else p + m
    else:
        for i in range(n):
            g = _clip(G[i], mode, c, d, s)
            p = P[i]
            if decay:
                p = p - p * wd * lr
            m = (-g) * lr + M[i] * mom
            M[i] = m
            p = p + ((-g) * lr + m * mom) if nesterov else p + m
            a = mu * A[i] + omu * p
            A[i] = a
            P[i] = a if ow else p


@pjit
def sgd_multi(paddr, gaddr, off, cnt, decay, cden, M, A, fl, sc):
    """Fused SGD step, in place, over every tensor of one dtype group (as :func:`adam_multi`)."""
    ct, cs = _chunks(cnt)
    ema = fl[F_EMA] != 0
    for q in prange(ct.shape[0]):
        t = ct[q]
        s = cs[q]
        e = min(s + CHUNK, cnt[t])
        o = off[t]
        P = carray(_ptr(paddr[t], M), (cnt[t],))
        G = carray(_ptr(gaddr[t], M), (cnt[t],))
        As = A[o + s:o + e] if ema else A[0:0]
        _sgd_span(P[s:e], G[s:e], M[o + s:o + e], As, fl, sc, cden[t], decay[t] != 0)


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


# --------------------------------------------------------------------------- elementwise
@jit
def clip_value_k(X, out, c):
    """``out = maximum(minimum(X, c), -c)`` (1-D)."""
    for i in prange(X.shape[0]):
        out[i] = _maximum(_minimum(X[i], c), -c)


@jit
def clip_norm_k(X, out, c, d):
    """``out = (X * c) / d`` (1-D)."""
    for i in prange(X.shape[0]):
        out[i] = (X[i] * c) / d


@jit
def scale_k(X, out, s):
    """``out = X * s`` (1-D)."""
    for i in prange(X.shape[0]):
        out[i] = X[i] * s


@pjit
def ema_k(A, P, out, mu, omu, overwrite_p):
    """``out = mu * A + omu * P`` (1-D); with ``overwrite_p`` also ``P[:] = out``."""
    for i in prange(A.shape[0]):
        a = mu * A[i] + omu * P[i]
        out[i] = a
        if overwrite_p:
            P[i] = a


@jit
def decay_k(P, out, wd, lr):
    """``out = P - P * wd * lr`` (1-D)."""
    for i in prange(P.shape[0]):
        p = P[i]
        out[i] = p - p * wd * lr


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
def _segment_sums(order, srows, vals, mode, c, d, s, zero):
    """Unique rows (ascending) and the sums of their clipped gradient rows, in input order.

    Each input position is given the slot of its unique row (from the runs of the stable
    sort), then the gradient rows are streamed once in input order and added into their
    slot: ``sums[u] = 0 + clip(vals[i1]) + clip(vals[i2]) + ...`` for the positions
    ``i1 < i2 < ...`` of row ``u``, exactly :meth:`IndexedSlices.deduplicate`'s sums. The
    reads of ``vals`` are sequential and the sums (one row per unique index) stay in cache.
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
    sums = np.empty((u, vals.shape[1]), vals.dtype)
    for k in range(u):
        for j in range(sums.shape[1]):
            sums[k, j] = zero
    for i in range(n):
        out = sums[slot[i]]
        row = vals[i]
        for j in range(out.shape[0]):
            out[j] = out[j] + _clip(row[j], mode, c, d, s)
    return rows, sums


@jit
def dedup_rows(order, srows, vals, fl, sc, d, zero):
    """Unique rows (ascending) and their clipped gradient rows summed in order of appearance.

    Parameters
    ----------
    order, srows : int64 (n,)
        A stable sort of the row indices: ``srows = idx[order]`` ascending, positions of equal
        rows in increasing order (``refopt.kernels.cpu._common.stable_order``).
    vals : dtype (n, D) C-contiguous
        The gradient rows, in the original order.
    fl, sc : only the clip flag and clip scalars are read; ``d`` is the clip_by_norm
        denominator of the raw rows.
    """
    return _segment_sums(order, srows, vals, fl[F_CLIP], sc[S_CLIP], d, sc[S_GSCALE], zero)


@pjit
def lazy_adam_rows(P, M, V, VH, order, srows, vals, fl, sc, d, decay, zero):
    """Lazy Adam, in place, on the rows ``srows`` of the (R, D) tables ``P, M, V (, VH)``.

    ``order``/``srows`` are a stable sort of the indices (as :func:`dedup_rows`). The
    duplicate rows are summed first (:func:`_segment_sums`); then each unique row is owned by
    one parallel iteration, which runs the fused Adam pass (weight decay when ``decay``) on
    that row: no two iterations write the same memory. Cost: proportional to the indices and
    the rows touched; the tables are not copied. EMA is not applied here (it covers every
    row: see :func:`ema_k`). Without AMSGrad pass any (R, D) table as ``VH`` (it is not
    touched).
    """
    rows, sums = _segment_sums(order, srows, vals, fl[F_CLIP], sc[S_CLIP], d, sc[S_GSCALE],
                               zero)
    row_fl = np.zeros(N_FLAGS, np.int64)
    row_fl[F_AMS] = fl[F_AMS]
    ams = fl[F_AMS] != 0
    u = rows.shape[0]
    for k in prange(u):
        ahead = k + PREFETCH_ROWS
        if ahead < u:  # the rows are random: start fetching a few ahead
            _prefetch_row(P, rows[ahead])
            _prefetch_row(M, rows[ahead])
            _prefetch_row(V, rows[ahead])
            if ams:
                _prefetch_row(VH, rows[ahead])
        r = rows[k]
        _adam_span(P[r], sums[k], M[r], V[r], VH[r], VH[r], row_fl, sc, d, decay)


@jit
def adam_sparse_rows(P, M, V, VH, rows, sums, fl, sc):
    """tf-keras' non-lazy sparse Adam, in place on (R, D) tables (``rows`` unique).

    ``m <- m + (-m)(1-b1)`` for every row, then ``m[rows] += sums (1-b1)``; the same for
    ``v`` with ``sums^2``; then the AMSGrad maximum and the dense weight update. Without
    AMSGrad pass any (R, D) table as ``VH`` (it is not touched).
    """
    ams = fl[F_AMS] != 0
    alpha = sc[S_ALPHA]
    c1 = sc[S_C1]
    c2 = sc[S_C2]
    eps = sc[S_EPS]
    Mf = M.reshape(-1)
    Vf = V.reshape(-1)
    for i in prange(Mf.shape[0]):
        m = Mf[i]
        Mf[i] = m + (-m) * c1
        v = Vf[i]
        Vf[i] = v + (-v) * c2
    for k in prange(rows.shape[0]):
        r = rows[k]
        Mr = M[r]
        Vr = V[r]
        g = sums[k]
        for j in range(g.shape[0]):
            Mr[j] = Mr[j] + g[j] * c1
            Vr[j] = Vr[j] + (g[j] * g[j]) * c2
    Pf = P.reshape(-1)
    VHf = VH.reshape(-1)
    for i in prange(Pf.shape[0]):
        den = Vf[i]
        if ams:
            den = _maximum(VHf[i], den)
            VHf[i] = den
        Pf[i] = Pf[i] - (Mf[i] * alpha) / (np.sqrt(den) + eps)


@jit
def sgd_sparse_rows(P, M, rows, sums, fl, sc):
    """tf-keras' sparse SGD, in place on (R, D) tables (``rows`` unique).

    ``add = (-g) lr``; ``m <- m mu``, ``m[rows] += add``; then ``w <- w + m``, or Nesterov
    ``w[rows] += add`` followed by ``w <- w + m mu``.
    """
    nesterov = fl[F_AMS] != 0
    lr = sc[S_LR]
    mom = sc[S_ALPHA]
    Mf = M.reshape(-1)
    Pf = P.reshape(-1)
    for i in prange(Mf.shape[0]):
        Mf[i] = Mf[i] * mom
    for k in prange(rows.shape[0]):
        r = rows[k]
        Mr = M[r]
        Pr = P[r]
        g = sums[k]
        for j in range(g.shape[0]):
            add = (-g[j]) * lr
            Mr[j] = Mr[j] + add
            if nesterov:
                Pr[j] = Pr[j] + add
    for i in prange(Pf.shape[0]):
        if nesterov:
            Pf[i] = Pf[i] + Mf[i] * mom
        else:
            Pf[i] = Pf[i] + Mf[i]


@jit
def read_int64_at(addresses):
    """``out[k] = *(int64 *)addresses[k]``: reads raw memory (used on live ndarray objects)."""
    out = np.empty_like(addresses)
    for k in range(addresses.shape[0]):
        out[k] = carray(_ptr(addresses[k], addresses), (1,))[0]
    return out


#: Every dispatcher of this module (the import test checks none has compiled anything).
DISPATCHERS = (
    _chunks, _prefetch_row, _maximum, _minimum, _clip, _adam_span, adam_multi, _sgd_span,
    sgd_multi, _sq, _leaf_sumsq, _pairwise_sumsq, sumsq_multi,
    clip_value_k, clip_norm_k, scale_k, ema_k, decay_k, _run_starts, _segment_sums, dedup_rows,
    lazy_adam_rows, adam_sparse_rows, sgd_sparse_rows, read_int64_at,
)
