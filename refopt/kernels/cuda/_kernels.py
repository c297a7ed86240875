"""The ``@cuda.jit`` kernels (built on first use, one set per threads-per-block and dtype).

Every elementwise kernel is a grid-stride loop in which each element is computed by one
thread with the reference's operations in the reference's order, in the variable's dtype (the
scalars arrive already rounded to it).

No FMA contraction. With numba-cuda's default options NVVM contracts ``a * b + c`` into one
``fma.rn`` instruction (checked: the PTX of the plain-operator Adam kernel had 12), which
rounds once where the reference rounds twice, so a GPU would differ from the reference in
the last bit. numba-cuda has no switch for NVVM's ``-fma=0`` without ``fastmath``, so every
``*``, ``+``, ``-``, ``/`` and square root of a float in these kernels goes through
:func:`ops`: libdevice's explicitly rounded ``__nv_fmul_rn`` / ``__nv_fadd_rn`` /
``__nv_fsub_rn`` / ``__nv_fdiv_rn`` / ``__nv_fsqrt_rn`` (the ``d`` versions in float64), which
compile to ``mul.rn`` / ``add.rn`` / ``sub.rn`` / ``div.rn`` / ``sqrt.rn`` and which neither
NVVM nor ptxas fuses (PTX ISA: an instruction with an explicit rounding modifier is not
contracted). float16 widens each operand to float32, computes there and rounds back (see
:func:`ops`). ``python -m refopt.kernels.cuda.ptx`` compiles every kernel to
PTX without a GPU and audits exactly this.

The dense updates (``adam_multi``, ``sgd_multi``) are multi-tensor kernels: one launch updates
up to ``config.TENSORS_PER_LAUNCH`` tensors, described by a segment table (see
:class:`refopt.kernels.cuda._launch.Segments`). No ``fastmath``. Only the norm reduction
combines values, in a fixed order: each block sums one fixed tile (thread ``t`` adds elements
``t, t + TPB, ...`` of the tile, then a fixed tree in shared memory), the host adds the block
sums with ``math.fsum``. Repeated runs give the same bits.

NaN handling follows NumPy: ``minimum``/``maximum`` propagate a NaN from either side.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float64

_BUILT = {}

#: Whether numba runs CUDA code in its simulator (plain Python: ``a * b`` on NumPy scalars
#: is already one correctly rounded operation, and libdevice does not exist there).
_SIMULATOR = hasattr(cuda, "FakeCUDAKernel")

#: Columns of the int64 segment table of the multi-tensor kernels, one row per tensor: its
#: offset in the flat slot buffers, its element count, its first chunk, whether it decays;
#: then the columns only the rule drivers (:mod:`refopt.kernels.cuda.drivers`) read: where
#: its scalar tail starts (``tail=True`` from there on), whether it has a gradient (else
#: only its EMA is updated) and its clip mode (:func:`refopt.rules.steps.clip`).
SEG_OFFSET, SEG_SIZE, SEG_CHUNK, SEG_DECAY, SEG_TAIL, SEG_ACTIVE, SEG_CLIP = range(7)
SEG_COLUMNS = 7


def get(tpb, items, dtype):
    """The kernels for ``tpb`` threads per block, ``items`` elements per thread and ``dtype``.

    Cached per ``(tpb, items, dtype)``; ``dtype`` (float16, float32 or float64) selects the
    explicitly rounded operations of :func:`ops`.
    """
    key = (int(tpb), int(items), np.dtype(dtype))
    if key not in _BUILT:
        _BUILT[key] = _build(*key)
    return _BUILT[key]


#: The dtypes the kernels are built for.
DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def ops(dtype):
    """``(mul, add, sub, div, sqrt)``: device functions of one IEEE round-to-nearest operation.

    On a GPU, float32 and float64 use libdevice's explicitly rounded functions
    (``fmul_rn``/``fadd_rn``/``fsub_rn``/``fdiv_rn``/``fsqrt_rn``; ``dmul_rn``/``dadd_rn``/
    ``ddiv_rn``/``dsqrt_rn``, ``a - b`` as ``dadd_rn(a, -b)``, the same IEEE result), which
    the compiler never fuses into an FMA. float16 computes each operation on the operands
    widened to float32 with those functions and rounds the result to float16 (``cvt.rn``):
    float32 has at least ``2 * 11 + 2`` significand bits (24), so this double rounding gives the
    correctly rounded float16 result, as NumPy's float16 arithmetic (which computes in float32
    and rounds) does. On the simulator the plain operators and ``np.sqrt`` on NumPy scalars.

    Parameters
    ----------
    dtype : numpy dtype, float16, float32 or float64

    Returns
    -------
    tuple of five device functions: four of two scalars of ``dtype``, ``sqrt`` of one

    Raises
    ------
    ValueError
        For any other dtype.
    """
    dtype = np.dtype(dtype)
    if dtype not in DTYPES:
        raise ValueError(
            f"The CUDA kernels compute in float16, float32 or float64. Received: {dtype}")
    if _SIMULATOR:
        @cuda.jit(device=True)
        def mul(a, b):
            return a * b

        @cuda.jit(device=True)
        def add(a, b):
            return a + b

        @cuda.jit(device=True)
        def sub(a, b):
            return a - b

        @cuda.jit(device=True)
        def div(a, b):
            return a / b

        @cuda.jit(device=True)
        def sqrt(a):
            return np.sqrt(a)

        return mul, add, sub, div, sqrt
    from numba.cuda import libdevice as ld

    if dtype == np.dtype(np.float64):
        dadd = ld.dadd_rn

        @cuda.jit(device=True)
        def dsub(a, b):
            return dadd(a, -b)

        return ld.dmul_rn, dadd, dsub, ld.ddiv_rn, ld.dsqrt_rn
    if dtype == np.dtype(np.float32):
        return ld.fmul_rn, ld.fadd_rn, ld.fsub_rn, ld.fdiv_rn, ld.fsqrt_rn
    fmul, fadd, fsub, fdiv, fsqrt = ld.fmul_rn, ld.fadd_rn, ld.fsub_rn, ld.fdiv_rn, ld.fsqrt_rn
    h, w = np.float16, np.float32

    @cuda.jit(device=True)
    def hmul(a, b):
        return h(fmul(w(a), w(b)))

    @cuda.jit(device=True)
    def hadd(a, b):
        return h(fadd(w(a), w(b)))

    @cuda.jit(device=True)
    def hsub(a, b):
        return h(fsub(w(a), w(b)))

    @cuda.jit(device=True)
    def hdiv(a, b):
        return h(fdiv(w(a), w(b)))

    @cuda.jit(device=True)
    def hsqrt(a):
        return h(fsqrt(w(a)))

    return hmul, hadd, hsub, hdiv, hsqrt


class _Kernels:
    pass


def _build(tpb, items, dtype):
    K = _Kernels()
    K.dtype = dtype
    mul, add, sub, div, sqrt = ops(dtype)
    # np.minimum/np.maximum on equal operands (+0 and -0): NumPy's float16 loops return the
    # first, its float32/float64 loops the second (NumPy 2 on x86-64; the reference is NumPy).
    # NaN from either side propagates, as in NumPy.
    tie_first = dtype == np.dtype(np.float16)

    @cuda.jit(device=True)
    def minimum(a, b):  # np.minimum(a, b) in this dtype
        if tie_first:
            return a if (a <= b or a != a) else b
        return a if (a < b or a != a) else b

    @cuda.jit(device=True)
    def maximum(a, b):  # np.maximum(a, b) in this dtype
        if tie_first:
            return a if (a >= b or a != a) else b
        return a if (a > b or a != a) else b

    @cuda.jit(device=True)
    def clip_one(gi, mode, cv, cden, gscale):
        if mode == 1:  # np.maximum(np.minimum(g, c), -c)
            gi = maximum(minimum(gi, cv), -cv)
        elif mode == 2:  # (g * c) / maximum(norm, c)
            gi = div(mul(gi, cv), cden)
        elif mode == 3:  # g * scale
            gi = mul(gi, gscale)
        return gi

    K.clip_one = clip_one

    @cuda.jit(device=True)
    def adam_one(pi, gi, mi, vi, hi, ams, decay, wd, lr, alpha, c1, c2, eps):
        if decay:
            pi = sub(pi, mul(mul(pi, wd), lr))
        mi = add(mi, mul(sub(gi, mi), c1))
        vi = add(vi, mul(sub(mul(gi, gi), vi), c2))
        den = vi
        if ams:
            hi = maximum(hi, vi)  # np.maximum(vhat, v)
            den = hi
        pi = sub(pi, div(mul(mi, alpha), add(sqrt(den), eps)))
        return pi, mi, vi, hi

    chunk = tpb * items

    @cuda.jit(device=True)
    def find_segment(seg, c):
        # The last segment whose first chunk is <= c (segments are non-empty, in order).
        lo = 0
        hi = seg.shape[0] - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if seg[mid, SEG_CHUNK] <= c:
                lo = mid
            else:
                hi = mid - 1
        return lo

    K.find_segment = find_segment

    @cuda.jit
    def adam_multi(ps, gs, seg, scale, nchunks, m, v, vh, avg, mode, cv, wd, lr, alpha, c1,
                   c2, eps, ams, ema, mu, omu, overwrite):
        # Block b handles chunks b, b + gridDim, ... of all segments together; thread t the
        # elements t, t + tpb, ... of a chunk (coalesced). ps[s], gs[s] are tensor s's
        # variable and gradient (a tuple indexed at run time); its slots are
        # m[off:off + n], ... of the flat buffers.
        t = cuda.threadIdx.x
        c = cuda.blockIdx.x
        while c < nchunks:
            s = find_segment(seg, c)
            p = ps[s]
            g = gs[s]
            off = seg[s, SEG_OFFSET]
            n = seg[s, SEG_SIZE]
            decay = seg[s, SEG_DECAY] != 0
            sc = scale[s]
            base = (c - seg[s, SEG_CHUNK]) * chunk
            for k in range(items):
                i = base + k * tpb + t
                if i < n:
                    j = off + i
                    gi = clip_one(g[i], mode, cv, sc, sc)
                    hi = m[j]
                    if ams:
                        hi = vh[j]
                    pi, mi, vi, hi = adam_one(p[i], gi, m[j], v[j], hi, ams, decay, wd, lr,
                                              alpha, c1, c2, eps)
                    m[j] = mi
                    v[j] = vi
                    if ams:
                        vh[j] = hi
                    if ema:
                        a = add(mul(mu, avg[j]), mul(omu, pi))
                        avg[j] = a
                        if overwrite:
                            pi = a
                    p[i] = pi
            c += cuda.gridDim.x

    K.adam_multi = adam_multi

    @cuda.jit
    def sgd_multi(ps, gs, seg, scale, nchunks, m, avg, mode, cv, wd, lr, mom, nesterov, ema,
                  mu, omu, overwrite):
        t = cuda.threadIdx.x
        c = cuda.blockIdx.x
        while c < nchunks:
            s = find_segment(seg, c)
            p = ps[s]
            g = gs[s]
            off = seg[s, SEG_OFFSET]
            n = seg[s, SEG_SIZE]
            decay = seg[s, SEG_DECAY] != 0
            sc = scale[s]
            base = (c - seg[s, SEG_CHUNK]) * chunk
            for k in range(items):
                i = base + k * tpb + t
                if i < n:
                    j = off + i
                    gi = clip_one(g[i], mode, cv, sc, sc)
                    pi = p[i]
                    if decay:
                        pi = sub(pi, mul(mul(pi, wd), lr))
                    mi = add(mul(-gi, lr), mul(m[j], mom))
                    m[j] = mi
                    if nesterov:
                        pi = add(pi, add(mul(-gi, lr), mul(mi, mom)))
                    else:
                        pi = add(pi, mi)
                    if ema:
                        a = add(mul(mu, avg[j]), mul(omu, pi))
                        avg[j] = a
                        if overwrite:
                            pi = a
                    p[i] = pi
            c += cuda.gridDim.x

    K.sgd_multi = sgd_multi

    @cuda.jit(device=True)
    def find_row(urows, r):
        # Position of row r in the sorted unique rows, or -1 when absent.
        lo = 0
        hi = urows.shape[0]
        while lo < hi:
            mid = (lo + hi) // 2
            if urows[mid] < r:
                lo = mid + 1
            else:
                hi = mid
        if lo < urows.shape[0] and urows[lo] == r:
            return lo
        return -1

    @cuda.jit(device=True)
    def row_sum(vals, order, starts, u, c, zero):
        # Element c of unique row u's gradient: its duplicates summed from zero in order of
        # appearance (order is a stable argsort), as IndexedSlices.deduplicate.
        s = zero
        for j in range(starts[u], starts[u + 1]):
            s = add(s, vals[order[j], c])
        return s

    @cuda.jit
    def lazy_adam_rows(P, M, V, VH, vals, order, starts, urows, zero, ams, decay, wd, lr,
                       alpha, c1, c2, eps):
        # One thread owns element (u, c) of unique row u: it sums the gradient rows of u from
        # zero in order of appearance (order is a stable argsort), then updates that element.
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        width = P.shape[1]
        total = urows.shape[0] * width
        while k < total:
            u = k // width
            c = k - u * width
            r = urows[u]
            s = row_sum(vals, order, starts, u, c, zero)
            hi = M[r, c]
            if ams:
                hi = VH[r, c]
            pi, mi, vi, hi = adam_one(P[r, c], s, M[r, c], V[r, c], hi, ams, decay, wd, lr,
                                      alpha, c1, c2, eps)
            M[r, c] = mi
            V[r, c] = vi
            if ams:
                VH[r, c] = hi
            P[r, c] = pi
            k += stride

    K.lazy_adam_rows = lazy_adam_rows

    @cuda.jit
    def adam_sparse_table(P, M, V, VH, vals, order, starts, urows, zero, ams, decay, wd, lr,
                          alpha, c1, c2, eps):
        # tf-keras' non-lazy sparse Adam: one thread per element (r, c) of the whole table.
        # m <- m + (-m) c1 and v <- v + (-v) c2 everywhere, then the row's summed gradient
        # s is added (m += s c1, v += (s s) c2) where row r is present, then the AMSGrad
        # maximum and the update of every element. Weight decay (whole variable) first.
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        width = P.shape[1]
        total = P.shape[0] * width
        while k < total:
            r = k // width
            c = k - r * width
            pi = P[r, c]
            if decay:
                pi = sub(pi, mul(mul(pi, wd), lr))
            mi = M[r, c]
            mi = add(mi, mul(-mi, c1))
            vi = V[r, c]
            vi = add(vi, mul(-vi, c2))
            u = find_row(urows, r)
            if u >= 0:
                s = row_sum(vals, order, starts, u, c, zero)
                mi = add(mi, mul(s, c1))
                vi = add(vi, mul(mul(s, s), c2))
            den = vi
            if ams:
                hi = VH[r, c]
                den = maximum(hi, vi)  # np.maximum(vhat, v)
                VH[r, c] = den
            M[r, c] = mi
            V[r, c] = vi
            P[r, c] = sub(pi, div(mul(mi, alpha), add(sqrt(den), eps)))
            k += stride

    K.adam_sparse_table = adam_sparse_table

    @cuda.jit
    def sgd_sparse_table(P, M, vals, order, starts, urows, zero, nesterov, decay, wd, lr,
                         mom):
        # tf-keras' sparse SGD: m <- m mom everywhere, m += (-s) lr on present rows; then
        # w <- w + m, or (Nesterov) w += (-s) lr on present rows, then w <- w + m mom.
        k = cuda.grid(1)
        stride = cuda.gridsize(1)
        width = P.shape[1]
        total = P.shape[0] * width
        while k < total:
            r = k // width
            c = k - r * width
            pi = P[r, c]
            if decay:
                pi = sub(pi, mul(mul(pi, wd), lr))
            mi = mul(M[r, c], mom)
            u = find_row(urows, r)
            if u >= 0:
                a = mul(-row_sum(vals, order, starts, u, c, zero), lr)
                mi = add(mi, a)
                if nesterov:
                    pi = add(pi, a)
            if nesterov:
                pi = add(pi, mul(mi, mom))
            else:
                pi = add(pi, mi)
            M[r, c] = mi
            P[r, c] = pi
            k += stride

    K.sgd_sparse_table = sgd_sparse_table

    @cuda.jit
    def ema_k(avg, p, mu, omu, overwrite):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < avg.shape[0]:
            a = add(mul(mu, avg[i]), mul(omu, p[i]))
            avg[i] = a
            if overwrite:
                p[i] = a
            i += stride

    K.ema_k = ema_k

    @cuda.jit
    def clip_k(out, g, mode, cv, cden, gscale):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.shape[0]:
            out[i] = clip_one(g[i], mode, cv, cden, gscale)
            i += stride

    K.clip_k = clip_k

    @cuda.jit
    def decay_k(out, p, wd, lr):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < out.shape[0]:
            pi = p[i]
            out[i] = sub(pi, mul(mul(pi, wd), lr))
            i += stride

    K.decay_k = decay_k

    @cuda.jit
    def sumsq_blocks(g, partial, zero64, half, h):
        # Block b sums tile [b*tpb*items, (b+1)*tpb*items): each square (times 0.5 for
        # global_norm's l2_loss) in the gradient dtype, accumulated in float64.
        sh = cuda.shared.array(tpb, float64)
        t = cuda.threadIdx.x
        base = cuda.blockIdx.x * (tpb * items)
        acc = zero64
        n = g.shape[0]
        for k in range(items):
            i = base + k * tpb + t
            if i < n:
                x = g[i]
                sq = mul(x, x)
                if half:
                    sq = mul(sq, h)
                acc = acc + sq  # float64 + a rounded square: nothing to contract
        sh[t] = acc
        cuda.syncthreads()
        s = tpb // 2
        while s > 0:
            if t < s:
                sh[t] = sh[t] + sh[t + s]
            cuda.syncthreads()
            s //= 2
        if t == 0:
            partial[cuda.blockIdx.x] = sh[0]

    K.sumsq_blocks = sumsq_blocks

    @cuda.jit
    def copy_k(dst, src):
        i = cuda.grid(1)
        stride = cuda.gridsize(1)
        while i < dst.shape[0]:
            dst[i] = src[i]
            i += stride

    K.copy_k = copy_k
    return K
