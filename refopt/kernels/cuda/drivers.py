"""Generic CUDA drivers: every fused kernel of ``backend="cuda"`` built from a rule.

The mirror of :mod:`refopt.kernels.cpu.drivers` for numba-cuda. For a rule
(:mod:`refopt.rules`) with ``k`` slots, :func:`kernels` builds three ``@cuda.jit`` kernels:

``dense(ps, gs, seg, clip, nchunks, S_0..S_k-1, A, ow, psc, sc)``
    Multi-tensor apply over a segment table (:class:`refopt.kernels.cuda.Segments`):
    ``ps``/``gs`` are tuples of up to ``config.TENSORS_PER_LAUNCH`` variables and gradients
    (the tensor of a chunk is found by binary search over the table's first chunks),
    ``seg`` the int64 table (slot offset, size, first chunk, decay flag, tail start, active
    flag, clip mode), ``clip`` a ``(tensors, 2)`` array of the per-tensor clip denominator
    and scale, ``S_i`` the flat slot buffers, ``A`` the flat EMA buffer, ``ow`` whether the
    weights are overwritten with their averages, ``psc`` the pipeline's 8 scalars and ``sc``
    the rule's 16 scalars (tuples: kernel parameters, nothing to copy). Per element, in the
    pipeline's order: :func:`refopt.rules.steps.clip`, :func:`~refopt.rules.steps.decay`,
    the rule's element (``tail`` from the table), :func:`~refopt.rules.steps.ema` and the
    overwrite. A tensor whose active flag is 0 (no gradient this step: Keras 3's and
    PyTorch's EMA of every variable, or a sparse tensor whose rows were just updated) gets
    only the EMA.
``rows(P, S_0..S_k-1, vals, order, starts, urows, cm, d, sv, dm, psc, sc, zero)``
    A lazy sparse step on the present rows of ``(rows, width)`` tables: one thread per
    element of each unique row sums that element's clipped gradient values from ``zero`` in
    order of appearance (``order`` a stable argsort of the indices, ``starts`` the runs;
    the bits of :meth:`refopt.IndexedSlices.deduplicate`), then applies the weight decay
    (mode ``dm``) and the rule's element (``tail`` always False, as the CPU driver).
``table(P, S_0..S_k-1, vals, order, starts, urows, cm, d, sv, dm, psc, sc, zero)``
    A whole-table sparse step (tf-keras' non-lazy ``IndexedSlices`` updates) on every
    element of the ``(rows, width)`` tables, one thread per element: it finds its row among
    the sorted unique rows (binary search); present, it sums its clipped gradient values as
    ``rows`` does and applies the decay and the element; absent, the decay and the element
    with ``g = None`` (a whole-table rule, e.g. :data:`refopt.rules.adam.ADAM_TABLE`, says
    what its elements do without a gradient).

With ``low`` (:func:`kernels`), ``dense`` alone is built for float16/bfloat16 variables
computed in float32: its arrays are uint16 bits, each element loaded into float32 and each
stored tensor rounded once (:mod:`refopt.kernels.cuda.halfbits`), no clip, no EMA.

A rule may have no slot (the pipeline's steps as rules, :mod:`refopt.rules.steps`:
:func:`launch_one` runs them for the launchers of :mod:`refopt.kernels.cuda._launch`).

The rule's flags ``fl``, the decay mode and the EMA mode are compile-time constants of the
kernel (captured from the generated module's globals), so every branch on them folds away;
the launch shape (threads per block, items per thread) too. A kernel's source is generated
for the rule's slot count (one argument per slot) and compiled in memory; :func:`kernels`
caches the pair per ``(rule, fl, dmode, emode, tpb, items, dtype)``.

On a GPU the rule's operations are the libdevice ``*_rn`` overloads of
:func:`refopt.rules.ops.register_cuda` (explicitly rounded, never contracted into an FMA;
``ops.fma`` itself emits no ``fma`` instruction): :func:`kernels` registers them before
anything compiles. On the simulator the rules' Python bodies run (NumPy scalar arithmetic).

Reductions (:class:`refopt.rules.reduce.Reduction`, the second kind of rule) get their own
kernels from the same kind of template (:func:`reduce_kernels`): ``leaf_sums`` sums the
leaves of NumPy's pairwise tree (at most 128 terms, 8 interleaved partial sums), one thread
per leaf, and :func:`reduce` combines the few partial sums on the host along the same tree;
``lane_sums`` sums PyTorch's lanes, one thread per lane, and the host adds the lanes and the
tail. :func:`sums_of_squares` (norm clipping: ``np.sum(g * g, dtype=g.dtype)`` bit for bit)
and :func:`torch_norms` (``torch.linalg.vector_norm``) are those reductions.
"""

from __future__ import annotations

import threading

import numpy as np
from numba.extending import register_jitable

from refopt.kernels.cuda import _launch, config
from refopt.kernels.cuda._launch import _flat, _grid, _tpb, check_config, cuda, simulator
from refopt.rules import ops, steps

__all__ = ["kernels", "source", "launch_dense", "launch_rows", "launch_table", "launch_one",
           "apply", "apply_sparse", "reduce", "reduce_kernels", "sums_of_squares",
           "torch_norms", "pairwise_tree"]


@register_jitable
def find_segment(seg, c):
    """The last segment whose first chunk is ``<= c`` (segments non-empty, in order)."""
    lo = 0
    hi = seg.shape[0] - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if seg[mid, 2] <= c:
            lo = mid
        else:
            hi = mid - 1
    return lo


@register_jitable
def find_row(urows, r):
    """Position of row ``r`` in the sorted unique rows ``urows``, or -1 when absent."""
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


_TEMPLATE = '''\
# Generated by refopt.kernels.cuda.drivers for the rule {rule_name!r}.


def dense(ps, gs, seg, clip, nchunks, {slot_args}A, ow, psc, sc):
    t = cuda.threadIdx.x
    c = cuda.blockIdx.x
    cv = psc[P_CLIP]
    while c < nchunks:
        s = find_segment(seg, c)
        p = ps[s]
        g = gs[s]
        off = seg[s, SEG_OFFSET]
        n = seg[s, SEG_SIZE]
        dm = DMODE if seg[s, SEG_DECAY] != 0 else 0
        tstart = seg[s, SEG_TAIL]
        active = seg[s, SEG_ACTIVE] != 0
        cm = seg[s, SEG_CLIP]
        d = clip[s, 0]
        sv = clip[s, 1]
        base = (c - seg[s, SEG_CHUNK]) * CHUNK
        for k in range(ITEMS):
            i = base + k * TPB + t
            if i < n:
                j = off + i
                pi = p[i]
                if active:
                    pi, gi = decay(pi, clip_(g[i], cm, cv, d, sv), dm, psc)
                    pi, {slot_vals} = element(pi, gi, {slot_loads}sc, FL, i >= tstart)
{slot_stores}
                if EMODE != 0:
                    a = ema(A[j], pi, EMODE, psc)
                    A[j] = a
                    if ow:
                        pi = a
                    if active or ow:
                        p[i] = pi
                elif active:
                    p[i] = pi
        c += cuda.gridDim.x


def rows(P, {slot_args}vals, order, starts, urows, cm, d, sv, dm, psc, sc, zero):
    k = cuda.grid(1)
    stride = cuda.gridsize(1)
    width = P.shape[1]
    total = urows.shape[0] * width
    cv = psc[P_CLIP]
    while k < total:
        u = k // width
        c = k - u * width
        r = urows[u]
        s = zero
        for q in range(starts[u], starts[u + 1]):
            s = add(s, clip_(vals[order[q], c], cm, cv, d, sv))
        pi, gi = decay(P[r, c], s, dm, psc)
        pi, {slot_vals} = element(pi, gi, {row_loads}sc, FL, False)
{row_stores}
        P[r, c] = pi
        k += stride


def table(P, {slot_args}vals, order, starts, urows, cm, d, sv, dm, psc, sc, zero):
    k = cuda.grid(1)
    stride = cuda.gridsize(1)
    width = P.shape[1]
    total = P.shape[0] * width
    cv = psc[P_CLIP]
    while k < total:
        r = k // width
        c = k - r * width
        u = find_row(urows, r)
        if u >= 0:
            s = zero
            for q in range(starts[u], starts[u + 1]):
                s = add(s, clip_(vals[order[q], c], cm, cv, d, sv))
            pi, gi = decay(P[r, c], s, dm, psc)
            pi, {slot_vals} = element(pi, gi, {row_loads}sc, FL, False)
        else:
            pi, gi = decay(P[r, c], zero, dm, psc)
            pi, {slot_vals} = element(pi, None, {row_loads}sc, FL, False)
{row_stores}
        P[r, c] = pi
        k += stride
'''


# The low-precision dense kernel (float16/bfloat16 variables computed in float32): the
# arrays hold uint16 bits, each element is loaded with _ld into float32 and every stored
# tensor rounded once with _st (KIND, the format, a compile-time constant); no clip (mode 0
# only) and no EMA (the executor takes the host step for those), so A and ow are unread.
_LOW_TEMPLATE = '''\
# Generated by refopt.kernels.cuda.drivers for the rule {rule_name!r} (low precision).


def dense(ps, gs, seg, clip, nchunks, {slot_args}A, ow, psc, sc):
    t = cuda.threadIdx.x
    c = cuda.blockIdx.x
    while c < nchunks:
        s = find_segment(seg, c)
        p = ps[s]
        g = gs[s]
        off = seg[s, SEG_OFFSET]
        n = seg[s, SEG_SIZE]
        dm = DMODE if seg[s, SEG_DECAY] != 0 else 0
        tstart = seg[s, SEG_TAIL]
        active = seg[s, SEG_ACTIVE] != 0
        base = (c - seg[s, SEG_CHUNK]) * CHUNK
        for k in range(ITEMS):
            i = base + k * TPB + t
            if i < n and active:
                j = off + i
                pi, gi = decay(_ld(p[i], KIND), _ld(g[i], KIND), dm, psc)
                pi, {slot_vals} = element(pi, gi, {low_loads}sc, FL, i >= tstart)
{low_stores}
                p[i] = _st(pi, KIND)
        c += cuda.gridDim.x
'''


def source(rule, low=0):
    """The Python source of the three kernels of ``rule`` (its slot count fixes the arguments);
    with ``low`` (a :mod:`refopt.kernels.cuda.halfbits` format) the low-precision ``dense``
    kernel only."""
    if low:
        names = [f"S{i}" for i in range(rule.arity)]
        return _LOW_TEMPLATE.format(
            rule_name=rule.name,
            slot_args="".join(f"{n}, " for n in names),
            slot_vals="".join(f"s{i}, " for i in range(rule.arity)),
            low_loads="".join(f"_ld({n}[j], KIND), " for n in names),
            low_stores="\n".join(f"                {n}[j] = _st(s{i}, KIND)"
                                 for i, n in enumerate(names)))
    k = rule.arity
    names = [f"S{i}" for i in range(k)]
    # the element returns (p, s0, ...): unpacked as "pi, s0, ..., = " ("pi, = " without slot)
    vals = "".join(f"s{i}, " for i in range(k))
    return _TEMPLATE.format(
        rule_name=rule.name,
        slot_args="".join(f"{n}, " for n in names),
        slot_vals=vals,
        slot_loads="".join(f"{n}[j], " for n in names),
        slot_stores="\n".join(f"                    {n}[j] = s{i}" for i, n in enumerate(names)),
        row_loads="".join(f"{n}[r, c], " for n in names),
        row_stores="\n".join(f"        {n}[r, c] = s{i}" for i, n in enumerate(names)),
    )


class Kernels:
    """The kernels of one ``(rule, fl, dmode, emode, tpb, items, dtype)``.

    Attributes
    ----------
    dense, rows, table : numba-cuda kernels (the simulator's stand-ins on the simulator)
    rule, fl, dmode, emode, tpb, items, dtype
        What they were built for.
    """

    def __init__(self, rule, fl, dmode, emode, tpb, items, dtype, low=0):
        self.rule, self.fl, self.dmode, self.emode = rule, fl, dmode, emode
        self.tpb, self.items, self.dtype, self.low = tpb, items, dtype, low
        namespace = dict(
            cuda=cuda, find_segment=find_segment, find_row=find_row, clip_=steps.clip,
            decay=steps.decay, ema=steps.ema, add=ops.add, element=rule.element, FL=fl,
            DMODE=dmode, EMODE=emode, TPB=tpb, ITEMS=items, CHUNK=tpb * items,
            P_CLIP=steps.P_CLIP,
            SEG_OFFSET=_launch.SEG_OFFSET, SEG_SIZE=_launch.SEG_SIZE,
            SEG_CHUNK=_launch.SEG_CHUNK, SEG_DECAY=_launch.SEG_DECAY,
            SEG_TAIL=_launch.SEG_TAIL, SEG_ACTIVE=_launch.SEG_ACTIVE,
            SEG_CLIP=_launch.SEG_CLIP,
        )
        filename = f"<refopt.kernels.cuda.drivers {rule.name} fl={fl} d={dmode} e={emode}>"
        if low:  # float16/bfloat16 bits, computed in float32: the dense kernel only
            from refopt.kernels.cuda import halfbits

            namespace.update(_ld=halfbits.load, _st=halfbits.store, KIND=int(low))
            exec(compile(source(rule, low), filename[:-1] + f" low={low}>", "exec"),  # noqa: S102
                 namespace)
            self.dense = cuda.jit(namespace["dense"])
            self.rows = self.table = None
            return
        exec(compile(source(rule), filename, "exec"), namespace)  # noqa: S102
        self.dense = cuda.jit(namespace["dense"])
        self.rows = cuda.jit(namespace["rows"])
        self.table = cuda.jit(namespace["table"])


_LOCK = threading.Lock()
_BUILT = {}


def kernels(rule, fl, dmode, emode, tpb, dtype, items=None, low=0):
    """The :class:`Kernels` of ``rule`` with flags ``fl`` (a sequence of ints, the rule
    call's), decay mode ``dmode`` and EMA mode ``emode`` (:mod:`refopt.rules.steps`), for
    ``tpb`` threads per block, ``items`` elements per thread (default
    ``config.ITEMS_PER_THREAD``) and ``dtype``; built once and kept.

    ``low``: :data:`refopt.kernels.cuda.halfbits.KIND_F16` or ``KIND_BF16`` for float16 or
    bfloat16 variables computed in float32 (``dtype`` float32, the compute dtype; ``emode``
    0): only ``dense``, whose arrays (variables, gradients, slots) are uint16 bits, loaded
    exactly into float32 and each stored tensor rounded once to nearest even; no clipping
    (clip mode 0) and no EMA."""
    fl = tuple(int(f) for f in fl)
    items = int(config.ITEMS_PER_THREAD if items is None else items)
    key = (rule.name, rule.element, rule.slots, fl, int(dmode), int(emode), int(tpb), items,
           np.dtype(dtype), int(low))
    ks = _BUILT.get(key)
    if ks is None:
        with _LOCK:
            ks = _BUILT.get(key)
            if ks is None:
                if not simulator:
                    ops.register_cuda()
                ks = _BUILT[key] = Kernels(rule, fl, int(dmode), int(emode), int(tpb), items,
                                           np.dtype(dtype), int(low))
    return ks


def launch_dense(ks, segments, clips, params, grads, slots, average, overwrite, psc, sc):
    """Run ``ks.dense`` over every launch of ``segments``.

    Parameters
    ----------
    ks : Kernels
    segments : refopt.kernels.cuda.Segments
        Built with the tensors' tails, active flags and clip modes.
    clips : list of device arrays
        :meth:`Segments.clip_pairs` (one per launch).
    params, grads : list of device arrays
        One per tensor of ``segments`` (an inactive tensor's gradient is never read: pass
        its variable).
    slots : list of 1-d device arrays
        The flat slot buffers, in the rule's order.
    average : 1-d device array
        The flat EMA buffer (any array of the dtype when the EMA mode is 0).
    overwrite : bool
    psc, sc : ndarray of the dtype
        The pipeline's and the rule's scalars (passed as tuples).
    """
    psc_t, sc_t = tuple(psc), tuple(sc)
    for (members, table, nchunks), cl in zip(segments.launches, clips):
        ks.dense[segments.grid(nchunks)](
            segments.tuples(params, members), segments.tuples(grads, members), table, cl,
            int(nchunks), *slots, average, bool(overwrite), psc_t, sc_t)


def launch_rows(ks, P, slots, vals, order, starts, urows, cmode, d, s, dmode, psc, sc):
    """Run ``ks.rows`` on the ``(rows, width)`` views ``P`` and ``slots`` (device inputs
    from ``_launch._table_inputs``; nothing to do without a present row)."""
    width = P.shape[1]
    if urows.size == 0 or width == 0 or urows.shape[0] == 0:
        return
    dt = np.dtype(P.dtype)
    ks.rows[_grid(urows.shape[0] * width, ks.tpb)](
        P, *slots, vals, order, starts, urows, int(cmode), dt.type(d), dt.type(s), int(dmode),
        tuple(psc), tuple(sc), dt.type(0))


def launch_table(ks, P, slots, vals, order, starts, urows, cmode, d, s, dmode, psc, sc):
    """Run ``ks.table`` on every element of the ``(rows, width)`` views ``P`` and ``slots``
    (device inputs from ``_launch._table_inputs``: with no index, ``urows = [-1]`` makes every
    row absent)."""
    if P.size == 0:
        return
    dt = np.dtype(P.dtype)
    ks.table[_grid(P.size, ks.tpb)](
        P, *slots, vals, order, starts, urows, int(cmode), dt.type(d), dt.type(s), int(dmode),
        tuple(psc), tuple(sc), dt.type(0))


#: One-tensor segment tables of :func:`launch_one`, per size, tail, decay flag, clip mode and
#: launch shape: built once (a host-to-device copy) instead of at every call.
_ONE = {}


def launch_one(call, p, g, slots, *, psc=None, dmode=0, emode=0, average=None,
               overwrite=False, cmode=0, d=1, s=1):
    """One rule step on one device tensor, in place, by the ``dense`` kernel.

    Parameters
    ----------
    call : refopt.rules.RuleCall
    p, g : 1-d device arrays of one size and dtype
        The parameter (updated in place) and the gradient.
    slots : list of 1-d device arrays like ``p``, in the order of ``call.rule.slots``
    psc : ndarray of the dtype, or None
        The pipeline's scalars (:mod:`refopt.rules.steps`; None: zeros).
    dmode, emode : int
        The decay and EMA modes (the EMA into ``average``, then ``p = average`` with
        ``overwrite``).
    cmode, d, s : int, float, float
        The clip mode, its per-tensor denominator and scale (the clip value in ``psc``).
    """
    if p.size == 0:
        return
    dt = np.dtype(p.dtype)
    n = int(p.size)
    lanes = call.tail_lanes
    check_config()
    key = (n, n - n % lanes if lanes else n, dmode != 0, int(cmode), config.THREADS_PER_BLOCK,
           config.ITEMS_PER_THREAD, config.TENSORS_PER_LAUNCH)
    segs = _ONE.get(key)
    if segs is None:
        if len(_ONE) >= 64:
            _ONE.clear()
        segs = _ONE[key] = _launch.Segments([n], [0], [dmode != 0], tails=[key[1]],
                                            clip=[int(cmode)])
    clips = segs.clip_pairs(dt, [d], [s]) if cmode in (2, 3, 4) else segs.clip_pairs(dt)
    ks = kernels(call.rule, call.fl, dmode, emode, segs.tpb, dt, items=segs.items)
    psc = np.zeros(steps.N_PSC, dt) if psc is None else psc
    flat = [_flat(a) for a in slots]
    avg = _flat(average) if average is not None else (flat[0] if flat else p)
    launch_dense(ks, segs, clips, [p], [g], flat, avg, overwrite, psc, call.sc)


# --------------------------------------------------------------------------- reductions
# The second kind of rule (refopt.rules.reduce.Reduction): per reduction, order, block size
# and dtype, the device kernel of the order's independent parts, its host launcher finishing
# the order's sequence of additions.

_REDUCE_TEMPLATE = '''\
# Generated by refopt.kernels.cuda.drivers for the reduction {name!r}.


def term(x, sc):
    # the element map, widened to the accumulator (float16 terms add in float32, as NumPy's
    # HALF_pairwise_sum)
    return WIDEN(element(x, sc))


def leaf_sums(xs, leaf_t, leaf_lo, leaf_n, out, sc, zero):
    # NumPy's order: one thread per leaf of the pairwise tree (at most LEAF terms). Fewer
    # than 8 terms are added left to right from -0; otherwise 8 interleaved partial sums,
    # combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the remainder in order.
    q = cuda.grid(1)
    stride = cuda.gridsize(1)
    while q < out.shape[0]:
        X = xs[leaf_t[q]]
        lo = leaf_lo[q]
        n = leaf_n[q]
        if n < 8:
            res = -zero
            for i in range(lo, lo + n):
                res = add(res, term(X[i], sc))
        else:
            r0 = term(X[lo], sc)
            r1 = term(X[lo + 1], sc)
            r2 = term(X[lo + 2], sc)
            r3 = term(X[lo + 3], sc)
            r4 = term(X[lo + 4], sc)
            r5 = term(X[lo + 5], sc)
            r6 = term(X[lo + 6], sc)
            r7 = term(X[lo + 7], sc)
            i = 8
            stop = n - n % 8
            while i < stop:
                b = lo + i
                r0 = add(r0, term(X[b], sc))
                r1 = add(r1, term(X[b + 1], sc))
                r2 = add(r2, term(X[b + 2], sc))
                r3 = add(r3, term(X[b + 3], sc))
                r4 = add(r4, term(X[b + 4], sc))
                r5 = add(r5, term(X[b + 5], sc))
                r6 = add(r6, term(X[b + 6], sc))
                r7 = add(r7, term(X[b + 7], sc))
                i += 8
            res = add(add(add(r0, r1), add(r2, r3)), add(add(r4, r5), add(r6, r7)))
            while i < n:
                res = add(res, term(X[lo + i], sc))
                i += 1
        out[q] = res
        q += stride


def lane_sums(xs, out, sc, zero):
    # PyTorch's order: one thread per (tensor, column) of out (tensors, 2 LANES - 1). Column
    # j < LANES: lane j's running sum from zero over the terms i = j, j + LANES, ... below
    # m = n - n % LANES, in order; column LANES + k: the k-th element of the tail (the raw
    # value; the host adds the lanes and the tail).
    q = cuda.grid(1)
    stride = cuda.gridsize(1)
    width = out.shape[1]
    while q < out.shape[0] * width:
        t = q // width
        j = q - t * width
        X = xs[t]
        n = X.shape[0]
        m = n - n % LANES
        if j < LANES:
            a = zero
            for i in range(j, m, LANES):
                a = add(a, term(X[i], sc))
            out[t, j] = a
        elif m + j - LANES < n:
            out[t, j] = X[m + j - LANES]
        q += stride
'''


class ReduceKernels:
    """The device kernels of one ``(reduction, tpb, dtype)``: ``leaf_sums`` (NumPy's order)
    and, for float32 and float64, ``lane_sums`` (PyTorch's order)."""

    def __init__(self, reduction, tpb, dtype):
        from refopt.rules import reduce as R

        self.reduction, self.tpb, self.dtype = reduction, tpb, np.dtype(dtype)
        half = self.dtype == np.dtype(np.float16)
        namespace = dict(
            cuda=cuda, add=ops.add, element=reduction.element,
            WIDEN=np.float32 if half else _same, LEAF=R.NUMPY_LEAF,
            LANES=R.TORCH_VECTOR_BYTES // self.dtype.itemsize)
        filename = f"<refopt.kernels.cuda.drivers reduction {reduction.name}>"
        exec(compile(_REDUCE_TEMPLATE.format(name=reduction.name), filename, "exec"),  # noqa: S102
             namespace)
        namespace["term"] = cuda.jit(device=True)(namespace["term"])
        self.leaf_sums = cuda.jit(namespace["leaf_sums"])
        self.lane_sums = None if half else cuda.jit(namespace["lane_sums"])


@register_jitable
def _same(x):
    return x


_REDUCE_BUILT = {}


def reduce_kernels(reduction, tpb, dtype):
    """The :class:`ReduceKernels` of ``reduction`` for ``tpb`` threads per block and
    ``dtype``; built once and kept."""
    key = (reduction, int(tpb), np.dtype(dtype))
    ks = _REDUCE_BUILT.get(key)
    if ks is None:
        with _LOCK:
            ks = _REDUCE_BUILT.get(key)
            if ks is None:
                if not simulator:
                    ops.register_cuda()
                ks = _REDUCE_BUILT[key] = ReduceKernels(reduction, int(tpb), dtype)
    return ks


_TREES = {}


def pairwise_tree(n):
    """NumPy's summation tree of ``n`` terms (:func:`refopt.rules.reduce.numpy_tree`:
    ``(leaf_lo, leaf_n, levels)``), cached per ``n``."""
    from refopt.rules.reduce import numpy_tree

    tree = _TREES.get(n)
    if tree is None:
        if len(_TREES) >= 256:
            _TREES.clear()
        tree = _TREES[n] = numpy_tree(n)
    return tree


def _combine(levels, leaf_sums):
    """The root of the tree from its leaves' sums (each internal node: left + right)."""
    below = None
    with np.errstate(all="ignore"):
        for internal, a, b in reversed(levels):
            cur = np.empty(internal.size, leaf_sums.dtype)
            cur[~internal] = leaf_sums[a:b]
            if below is not None:
                cur[internal] = below[0::2] + below[1::2]
            below = cur
    return below[0]


_LEAF_TABLES = {}


def _leaf_table(sizes):
    """Device ``(tensor, lo, n)`` leaf columns of a group of tensors and their trees."""
    key = tuple(sizes)
    table = _LEAF_TABLES.get(key)
    if table is None:
        trees = [pairwise_tree(int(n)) for n in sizes]
        t = np.concatenate([np.full(tr[0].size, k, np.int64) for k, tr in enumerate(trees)])
        lo = np.concatenate([tr[0] for tr in trees])
        n = np.concatenate([tr[1] for tr in trees])
        table = (trees, cuda.to_device(t), cuda.to_device(lo), cuda.to_device(n), t.size)
        if len(_LEAF_TABLES) >= 64:
            _LEAF_TABLES.clear()
        _LEAF_TABLES[key] = table
    return table


def _launches(grads):
    """The non-empty arrays' positions in launches of ``config.TENSORS_PER_LAUNCH``, with
    their flat views and the tuple of device arrays a launch takes (padded)."""
    width = int(config.TENSORS_PER_LAUNCH)
    todo = [k for k, g in enumerate(grads) if g.size]
    for start in range(0, len(todo), width):
        members = todo[start:start + width]
        flat = [grads[k].reshape(grads[k].size) for k in members]
        yield members, flat, tuple(flat + [flat[0]] * (width - len(flat)))


def _reduce_numpy(ks, grads, dtype, sc):
    acc = np.dtype(np.float32) if dtype == np.dtype(np.float16) else dtype
    out = np.zeros(len(grads), dtype)
    for members, flat, xs in _launches(grads):
        trees, t, lo, n, count = _leaf_table([f.size for f in flat])
        sums = cuda.device_array(count, acc)
        with np.errstate(all="ignore"):  # (the simulator computes with NumPy scalars)
            ks.leaf_sums[_grid(count, ks.tpb)](xs, t, lo, n, sums, sc, acc.type(0))
        host = sums.copy_to_host()
        first = 0
        with np.errstate(all="ignore"):
            for k, tree in zip(members, trees):
                leaves = tree[0].size
                root = _combine(tree[2], host[first:first + leaves])
                out[k] = dtype.type(acc.type(0) + root)
                first += leaves
    return out


def _reduce_torch(ks, grads, dtype, sc):
    """PyTorch's order: ``(sums, singles)``, ``singles[k]`` the element of a one-element
    array (else None)."""
    from refopt.rules.reduce import torch_lanes, torch_unfused

    red = ks.reduction
    lanes = torch_lanes(dtype)
    out = np.zeros(len(grads), dtype)
    singles = [None] * len(grads)
    for members, flat, xs in _launches(grads):
        cols = cuda.device_array((len(members), 2 * lanes - 1), dtype)
        with np.errstate(all="ignore"):
            ks.lane_sums[_grid(cols.size, ks.tpb)](xs, cols, sc, dtype.type(0))
        host = cols.copy_to_host()
        with np.errstate(all="ignore"):
            for k, f, row in zip(members, flat, host):
                n = f.size
                s = row[0]
                for j in range(1, lanes):
                    s = ops.add(s, row[j])
                tail = row[lanes:lanes + n % lanes]
                unfused = torch_unfused(dtype, tail.size)
                for i, x in enumerate(tail):
                    s = (ops.add(s, red.element(x, sc)) if i < unfused or red.fused is None
                         else red.fused(s, x, sc))
                out[k] = s
                if n == 1:
                    singles[k] = tail[0]
    return out, singles


def reduce(reduction, grads, dtype, order="numpy", sc=()):
    """Each device array's sum of ``reduction``'s element map in ``order``.

    Parameters
    ----------
    reduction : refopt.rules.reduce.Reduction
    grads : list of C-contiguous device arrays of ``dtype``
    dtype : numpy dtype (float16, float32 or float64; ``"torch"``: float32 or float64)
    order : {"numpy", "torch"}
    sc : sequence of float
        The reduction's scalars, rounded to ``dtype``.

    Returns
    -------
    ndarray of ``dtype``, one sum per array.

    Notes
    -----
    ``"numpy"``: the leaves of NumPy's pairwise tree are summed on the device (float16 in
    float32, as NumPy's ``HALF_pairwise_sum``), one thread per leaf of at most 128 terms, in
    ``config.TENSORS_PER_LAUNCH``-tensor launches; the leaf sums (under 1 % of the data)
    come back to the host and are added up the same tree; then ``0 + root`` is rounded to
    ``dtype``, as NumPy's reduction adds its result to the identity. ``"torch"``: one thread
    per lane of each tensor (8 float32 or 4 float64) sums its lane on the device; the host
    adds the lanes in order and the tail (:mod:`refopt.rules.reduce`). Every operation is
    explicitly rounded, so the sums are those of the CPU backend and of the reference.
    """
    from refopt.rules.reduce import reduce_scalars

    dtype = np.dtype(dtype)
    check_config()
    ks = reduce_kernels(reduction, _tpb(), dtype)
    sc = tuple(reduce_scalars(dtype, sc))
    if order == "numpy":
        return _reduce_numpy(ks, grads, dtype, sc)
    if order == "torch":
        if ks.lane_sums is None:
            raise TypeError(f"PyTorch's order takes float32 or float64. Received: {dtype}")
        return _reduce_torch(ks, grads, dtype, sc)[0]
    raise ValueError(f"order must be 'numpy' or 'torch'. Received: order={order!r}")


def sums_of_squares(grads, dtype, half=False, order="numpy"):
    """``np.sum(g * g, dtype=dtype)`` (``g * g * 0.5`` when ``half``) of each device array,
    bit for bit (or in PyTorch's ``order``): the reduction
    :data:`refopt.rules.reduce.SUM_SQUARES` (:data:`~refopt.rules.reduce.SUM_HALF_SQUARES`,
    ``tf.nn.l2_loss``'s halves, with ``half``) by :func:`reduce`.

    Parameters
    ----------
    grads : list of C-contiguous device arrays of ``dtype``
    dtype : numpy dtype (float16, float32 or float64)
    half : bool
    order : {"numpy", "torch"}

    Returns
    -------
    ndarray of ``dtype``, one sum per array (each square, and half, rounded to ``dtype`` as
    NumPy's array product does).
    """
    from refopt.rules.reduce import SUM_HALF_SQUARES, SUM_SQUARES

    if half:
        return reduce(SUM_HALF_SQUARES, grads, dtype, order, sc=[0.5])
    return reduce(SUM_SQUARES, grads, dtype, order)


def torch_norms(grads, dtype):
    """``torch.linalg.vector_norm(g, 2.0)`` of each device array (float32 or float64) as
    PyTorch computes it on the CPU, bit for bit
    (:func:`refopt.reference.reductions.torch_vector_norm`)."""
    from refopt.rules.reduce import SUM_SQUARES, reduce_scalars, torch_vector_norms

    dtype = np.dtype(dtype)
    check_config()
    ks = reduce_kernels(SUM_SQUARES, _tpb(), dtype)
    if ks.lane_sums is None:
        raise TypeError(f"PyTorch's order takes float32 or float64. Received: {dtype}")
    sums, singles = _reduce_torch(ks, grads, dtype, tuple(reduce_scalars(dtype)))
    return torch_vector_norms(sums, singles)


# --------------------------------------------------------------------------- one tensor
def apply(call, param, grad, slots):
    """One rule step on one tensor, on the device, into new host arrays (the mirror
    functions' path, as :func:`refopt.kernels.cpu.drivers.apply`).

    Parameters
    ----------
    call : refopt.rules.RuleCall
    param, grad : host ndarray of float16, float32 or float64, one shape
    slots : list of host ndarray like ``param``, in the order of ``call.rule.slots``

    Returns
    -------
    (ndarray, list of ndarray)
        The new parameter and slots; the inputs are not modified.
    """
    dtype = np.dtype(param.dtype)
    shape = param.shape
    if param.size == 0:
        return (np.array(param, dtype, copy=True),
                [np.array(a, dtype, copy=True) for a in slots])
    P = cuda.to_device(np.array(param, dtype, order="C").reshape(-1))
    G = cuda.to_device(np.ascontiguousarray(grad, dtype).reshape(-1))
    S = [cuda.to_device(np.array(a, dtype, order="C").reshape(-1)) for a in slots]
    launch_one(call, P, G, S)
    return P.copy_to_host().reshape(shape), [d.copy_to_host().reshape(shape) for d in S]


def apply_sparse(call, param, grad, slots, lazy):
    """One rule step with a sparse gradient on one table, on the device, into new host
    arrays (as :func:`refopt.kernels.cpu.drivers.apply_sparse`).

    Parameters
    ----------
    call : refopt.rules.RuleCall
    param : host ndarray of float16, float32 or float64, shape ``(rows, ...)``
    grad : IndexedSlices of ``param``'s dtype and shape (validated: indices in range)
    slots : list of host ndarray like ``param``, in the order of ``call.rule.slots``
    lazy : bool
        The ``rows`` kernel (the rows present only), else the ``table`` kernel (every row).

    Returns
    -------
    (ndarray, list of ndarray)
        The new table and slots; the inputs are not modified.
    """
    from refopt.kernels.cuda._launch import _table_inputs

    dtype = np.dtype(param.dtype)
    if param.size == 0 or (lazy and np.size(grad.indices) == 0):  # nothing to update
        return (np.array(param, dtype, copy=True),
                [np.array(a, dtype, copy=True) for a in slots])
    check_config()
    P = cuda.to_device(np.array(param, dtype, order="C"))
    S = [cuda.to_device(np.array(a, dtype, order="C")) for a in slots]
    width, vals, order, starts, urows = _table_inputs(P, grad.values, grad.indices)
    rows = P.shape[0]
    ks = kernels(call.rule, call.fl, 0, 0, _tpb(), dtype)
    launch = launch_rows if lazy else launch_table
    launch(ks, P.reshape(rows, width), [a.reshape(rows, width) for a in S], vals, order,
           starts, urows, 0, 1, 1, 0, np.zeros(steps.N_PSC, dtype), call.sc)
    return P.copy_to_host(), [a.copy_to_host() for a in S]
