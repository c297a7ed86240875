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

:func:`sums_of_squares` computes the per-tensor sums of squares that norm clipping needs, bit
for bit as ``np.sum(g * g, dtype=g.dtype)`` (NumPy's pairwise summation): the leaves of
NumPy's recursion (at most 128 terms, 8 interleaved partial sums) are summed on the device,
one thread per leaf, and the few partial sums are combined on the host along the same tree.
"""

from __future__ import annotations

import threading

import numpy as np
from numba.extending import register_jitable

from refopt.kernels.cuda import _launch, config
from refopt.kernels.cuda._launch import _flat, _grid, _tpb, check_config, cuda, simulator
from refopt.rules import ops, steps

__all__ = ["kernels", "source", "launch_dense", "launch_rows", "launch_table", "launch_one",
           "apply", "apply_sparse", "sums_of_squares", "pairwise_tree"]


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


def source(rule):
    """The Python source of the three kernels of ``rule`` (its slot count fixes the arguments)."""
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

    def __init__(self, rule, fl, dmode, emode, tpb, items, dtype):
        self.rule, self.fl, self.dmode, self.emode = rule, fl, dmode, emode
        self.tpb, self.items, self.dtype = tpb, items, dtype
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
        exec(compile(source(rule), filename, "exec"), namespace)  # noqa: S102
        self.dense = cuda.jit(namespace["dense"])
        self.rows = cuda.jit(namespace["rows"])
        self.table = cuda.jit(namespace["table"])


_LOCK = threading.Lock()
_BUILT = {}


def kernels(rule, fl, dmode, emode, tpb, dtype, items=None):
    """The :class:`Kernels` of ``rule`` with flags ``fl`` (a sequence of ints, the rule
    call's), decay mode ``dmode`` and EMA mode ``emode`` (:mod:`refopt.rules.steps`), for
    ``tpb`` threads per block, ``items`` elements per thread (default
    ``config.ITEMS_PER_THREAD``) and ``dtype``; built once and kept."""
    fl = tuple(int(f) for f in fl)
    items = int(config.ITEMS_PER_THREAD if items is None else items)
    key = (rule.name, rule.element, rule.slots, fl, int(dmode), int(emode), int(tpb), items,
           np.dtype(dtype))
    ks = _BUILT.get(key)
    if ks is None:
        with _LOCK:
            ks = _BUILT.get(key)
            if ks is None:
                if not simulator:
                    ops.register_cuda()
                ks = _BUILT[key] = Kernels(rule, fl, int(dmode), int(emode), int(tpb), items,
                                           np.dtype(dtype))
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


# --------------------------------------------------------------------------- sums of squares
#: NumPy's pairwise summation: runs of at most this many terms are leaves.
_LEAF = 128
_TREES = {}


def pairwise_tree(n):
    """NumPy's summation tree of ``n`` terms: ``(leaf_lo, leaf_n, levels)``.

    ``pairwise_sum`` (``numpy/_core/src/umath/loops_utils.h.src``) sums at most 128 terms
    directly and splits a longer run at ``n/2`` rounded down to a multiple of 8. ``levels``
    lists, from the root down, each level's mask of internal nodes and the range of its
    leaves in ``leaf_lo``/``leaf_n``; a level's nodes are the two children of each internal
    node of the level above, in order. Cached per ``n``.
    """
    tree = _TREES.get(n)
    if tree is not None:
        return tree
    lo = np.zeros(1, np.int64)
    size = np.full(1, n, np.int64)
    leaf_lo, leaf_n, levels = [], [], []
    count = 0
    while lo.size:
        internal = size > _LEAF
        leaves = ~internal
        k = int(leaves.sum())
        levels.append((internal, count, count + k))
        leaf_lo.append(lo[leaves])
        leaf_n.append(size[leaves])
        count += k
        half = size[internal] // 2
        half -= half % 8
        lo = np.stack([lo[internal], lo[internal] + half], axis=1).reshape(-1)
        size = np.stack([half, size[internal] - half], axis=1).reshape(-1)
    tree = (np.concatenate(leaf_lo), np.concatenate(leaf_n), levels)
    if len(_TREES) >= 256:
        _TREES.clear()
    _TREES[n] = tree
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


_LEAF_KERNELS = {}


def _leaf_kernel(tpb, dtype):
    key = (tpb, np.dtype(dtype))
    k = _LEAF_KERNELS.get(key)
    if k is not None:
        return k
    if not simulator:
        ops.register_cuda()
    add, mul = ops.add, ops.mul
    half_dtype = np.dtype(dtype) == np.dtype(np.float16)
    if half_dtype:  # NumPy sums float16 in float32 (HALF_pairwise_sum), rounds at the end
        @cuda.jit(device=True)
        def widen(x):
            return np.float32(x)
    else:
        @cuda.jit(device=True)
        def widen(x):
            return x

    @cuda.jit(device=True)
    def sq(x, half, hv):
        y = mul(x, x)
        if half:
            y = mul(y, hv)
        return widen(y)

    @cuda.jit
    def leaf_sums(xs, leaf_t, leaf_lo, leaf_n, out, half, hv, zero):
        # One thread per leaf: NumPy's pairwise_sum on at most 128 terms. Fewer than 8
        # terms are added left to right from zero; otherwise 8 interleaved partial sums,
        # combined as ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the remainder in order.
        q = cuda.grid(1)
        stride = cuda.gridsize(1)
        while q < out.shape[0]:
            X = xs[leaf_t[q]]
            lo = leaf_lo[q]
            n = leaf_n[q]
            if n < 8:
                res = zero
                for i in range(lo, lo + n):
                    res = add(res, sq(X[i], half, hv))
            else:
                r0 = sq(X[lo], half, hv)
                r1 = sq(X[lo + 1], half, hv)
                r2 = sq(X[lo + 2], half, hv)
                r3 = sq(X[lo + 3], half, hv)
                r4 = sq(X[lo + 4], half, hv)
                r5 = sq(X[lo + 5], half, hv)
                r6 = sq(X[lo + 6], half, hv)
                r7 = sq(X[lo + 7], half, hv)
                i = 8
                stop = n - n % 8
                while i < stop:
                    b = lo + i
                    r0 = add(r0, sq(X[b], half, hv))
                    r1 = add(r1, sq(X[b + 1], half, hv))
                    r2 = add(r2, sq(X[b + 2], half, hv))
                    r3 = add(r3, sq(X[b + 3], half, hv))
                    r4 = add(r4, sq(X[b + 4], half, hv))
                    r5 = add(r5, sq(X[b + 5], half, hv))
                    r6 = add(r6, sq(X[b + 6], half, hv))
                    r7 = add(r7, sq(X[b + 7], half, hv))
                    i += 8
                res = add(add(add(r0, r1), add(r2, r3)), add(add(r4, r5), add(r6, r7)))
                while i < n:
                    res = add(res, sq(X[lo + i], half, hv))
                    i += 1
            out[q] = res
            q += stride

    _LEAF_KERNELS[key] = leaf_sums
    return leaf_sums


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


def sums_of_squares(grads, dtype, half=False):
    """``np.sum(g * g, dtype=dtype)`` (``g * g * 0.5`` when ``half``) of each device array,
    bit for bit.

    Parameters
    ----------
    grads : list of C-contiguous device arrays of ``dtype``
    dtype : numpy dtype (float16, float32 or float64)
    half : bool
        ``tf.nn.l2_loss``'s ``g * g * 0.5`` (TensorFlow's global norm).

    Returns
    -------
    ndarray of ``dtype``, one sum per array.

    Notes
    -----
    Each square (and half) is rounded to ``dtype`` as NumPy's array product does; the leaves
    of NumPy's pairwise tree are summed on the device (float16 in float32, as NumPy's
    ``HALF_pairwise_sum``), one thread per leaf of at most 128 terms, in
    ``config.TENSORS_PER_LAUNCH``-tensor launches; the leaf sums (under 1 % of the data) come
    back to the host and are added up the same tree; then ``0 + root`` is rounded to
    ``dtype``, as NumPy's reduction adds its result to the identity.
    """
    dtype = np.dtype(dtype)
    acc = np.dtype(np.float32) if dtype == np.dtype(np.float16) else dtype
    out = np.zeros(len(grads), dtype)
    check_config()
    tpb = _tpb()
    width = int(config.TENSORS_PER_LAUNCH)
    kernel = _leaf_kernel(tpb, dtype)
    hv = dtype.type(0.5)
    todo = [k for k, g in enumerate(grads) if g.size]
    for start in range(0, len(todo), width):
        members = todo[start:start + width]
        flat = [grads[k].reshape(grads[k].size) for k in members]
        trees, t, lo, n, count = _leaf_table([f.size for f in flat])
        sums = cuda.device_array(count, acc)
        xs = tuple(flat + [flat[0]] * (width - len(flat)))
        kernel[_grid(count, tpb)](xs, t, lo, n, sums, bool(half), hv, acc.type(0))
        host = sums.copy_to_host()
        first = 0
        with np.errstate(all="ignore"):
            for k, tree in zip(members, trees):
                leaves = tree[0].size
                root = _combine(tree[2], host[first:first + leaves])
                out[k] = dtype.type(acc.type(0) + root)
                first += leaves
    return out


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
