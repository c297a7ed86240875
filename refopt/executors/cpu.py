"""The executor of ``backend="cpu"``: flat state, one fused rule-built kernel call per dtype.

Design (many small tensors)
---------------------------
A model is often hundreds of small arrays; calling a kernel per tensor would cost more than
the arithmetic. So:

- **Flat state.** At build time the optimizer allocates, for each dtype and each slot
  (``m``, ``v``, ``vhat``, the EMA ``average``), *one* flat buffer holding the slots of every
  variable of that dtype back to back; :meth:`~refopt.Optimizer.get_slot` and
  ``optimizer.variables`` hand out reshaped views of it (live arrays, as before).
- **Address tables.** The variables and gradients stay the caller's arrays. One step builds,
  per dtype, an int64 table of their data addresses (variables' addresses are taken once at
  build time), their element counts and their offsets in the flat buffers, and calls the
  fused kernel *once* (the ``dense`` kernel :mod:`refopt.kernels.cpu.drivers` builds from the
  optimizer's rule), which turns each address
  into a typed array (a small Numba ``@intrinsic``) and runs clip, weight decay, the update
  and the EMA in one pass over memory, in parallel over fixed 64 Ki-element chunks of all
  tensors together.
- **Validation first.** Everything that can raise (types, shapes, the global norm's dtype
  rule, clip norms, scalars, address tables) is done before the first write; the kernels
  then update the variables and slots in place and cannot fail. A raising
  ``apply_gradients`` therefore changes nothing, as with the reference backend.

Sparse gradients of lazy optimizers go to the rule's ``rows`` kernel (one call per sparse
variable; cost proportional to the rows touched, no copy of the table). float16 and bfloat16
variables that the convention computes in float32 (``low_precision_compute="float32"``, and
``"torch_fused"`` for ``Adam``/``AdamW``: :func:`refopt.precision.compute_dtype`) with dense
gradients, no clipping and no EMA take the rule's low-precision ``dense`` kernel
(:func:`refopt.kernels.cpu.drivers.kernels` with ``low=True``): their uint16 bits loaded
exactly into float32, the float32 step and scalars, every stored tensor (variable and each
slot) rounded once to nearest even (:mod:`refopt.kernels.cpu.halfbits`), as the staged step
computes them. Everything else (float16/bfloat16 computed in their dtype, or with clipping
or EMA, which the conventions compute in the dtype; non-lazy sparse gradients of
``Adam``/``SGD``; variables that overlap in memory) takes the staged step
(:mod:`refopt.executors.staged`) with the CPU kernels' pure functions: the same numbers,
computed into new arrays and committed at the end.
"""

from __future__ import annotations

import bisect

import numpy as np

from refopt import _mkl
from refopt import precision as _precision
from refopt.executors import checks as _checks
from refopt.executors import plan as _plan
from refopt.executors import staged
from refopt.executors.checks import _INT64_MAX
from refopt.executors.reference import ReferenceExecutor
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cpu import _kernels as K
from refopt.kernels.cpu import drivers
from refopt.kernels.cpu import halfbits as _halfbits
from refopt.kernels.cpu._common import deduplicate, launch, rows2d, stable_order
from refopt.kernels.cpu.clipping import global_norm, sums_of_squares, torch_norms
from refopt.reference import sqrt as _sqrt

__all__ = ["CpuExecutor", "FlatState", "quick_pairs", "try_fast_step", "try_in_place_step"]

_FALLBACK = (np.dtype(np.float16),) + tuple(  # and bfloat16 (ml_dtypes): the staged step
    d for d in _checks.FLOAT_DTYPES if d.kind == "V")  # unless computed in float32
_FLOAT32 = np.dtype(np.float32)


class FlatState:
    """The slots and EMA averages of an optimizer's variables, one flat buffer per dtype and slot.

    Parameters
    ----------
    var_list : list of ndarray
        The variables, validated (float, C-contiguous, writeable, each once).
    slot_names : tuple of str
        The optimizer's slots.
    use_ema : bool
        Also keep an ``average`` buffer, initialised with copies of the variables.

    Attributes
    ----------
    slots : dict of str -> list of ndarray
        Per slot, one view per variable (the variable's shape) into the flat buffer.
    averages : list of ndarray
        Views of the EMA buffer (empty list without EMA).
    buffers : dict of numpy.dtype -> dict of str -> ndarray
        The flat buffers.
    offset, count : int64 ndarray (n_vars,)
        Where each variable's state starts in its dtype's buffers, and its size.
    paddr : int64 ndarray (n_vars,)
        The variables' data addresses.
    dtype_of : list of numpy.dtype
        Each variable's dtype; ``single_dtype`` is the only one, or None if there are several.
    overlap : bool
        Whether two variables share memory (then the fast path is not used: the reference
        semantics compute both from the old values, which an in-place pass cannot).
    """

    def __init__(self, var_list, slot_names, use_ema, initial=None, average_zero=False,
                 slot_shape=None, slot_dtype=None):
        # A slot whose shape or dtype differs from its variable's (Adafactor's factored
        # moments, Adam8bit's uint8 codes) is kept as separate arrays, outside the flat
        # buffers: no rule kernel reads it.
        shape_of = slot_shape or (lambda name, shape: shape)
        dtype_of = slot_dtype or (lambda name, shape, dtype: dtype)
        apart = tuple(
            name for name in slot_names
            if any(tuple(shape_of(name, v.shape)) != v.shape
                   or np.dtype(dtype_of(name, v.shape, v.dtype)) != v.dtype for v in var_list))
        flat_names = tuple(name for name in slot_names if name not in apart)
        n = len(var_list)
        self.offset = np.zeros(n, np.int64)
        self.count = np.array([v.size for v in var_list], np.int64)
        self.paddr = np.array([v.ctypes.data for v in var_list], np.int64)
        self.dtype_of = [v.dtype for v in var_list]
        self.specs = [(v.shape, v.dtype) for v in var_list]
        dtypes = set(self.dtype_of)
        self.single_dtype = dtypes.pop() if len(dtypes) == 1 else None
        totals = {}
        for i, var in enumerate(var_list):
            self.offset[i] = totals.get(var.dtype, 0)
            totals[var.dtype] = self.offset[i] + var.size
        names = flat_names + (("average",) if use_ema else ())
        self.buffers = {dt: {name: np.zeros(total, dt) for name in names}
                        for dt, total in totals.items()}
        if initial is not None:  # slots that do not start at zero (TF1's RMSprop velocity)
            for dt, per_dtype in self.buffers.items():
                for name in flat_names:
                    value = initial(name, dt)
                    if value != 0:
                        per_dtype[name].fill(value)
        self.slots = {name: [] for name in slot_names}
        self.averages = []
        for i, var in enumerate(var_list):
            lo, hi = self.offset[i], self.offset[i] + var.size
            for name in slot_names:
                if name in apart:
                    sdt = np.dtype(dtype_of(name, var.shape, var.dtype))
                    value = 0 if initial is None else initial(name, sdt)
                    self.slots[name].append(
                        np.full(tuple(shape_of(name, var.shape)), value, sdt))
                    continue
                self.slots[name].append(self.buffers[var.dtype][name][lo:hi].reshape(var.shape))
            if use_ema:
                avg = self.buffers[var.dtype]["average"][lo:hi].reshape(var.shape)
                if not average_zero:  # Keras 3 starts its averages at zero
                    np.copyto(avg, var)
                self.averages.append(avg)
        # Memory the kernels write: the variables and the flat buffers, as sorted byte ranges.
        ranges = [(a, a + v.nbytes) for a, v in zip(self.paddr.tolist(), var_list) if v.nbytes]
        ranges += [(b.ctypes.data, b.ctypes.data + b.nbytes)
                   for per_dtype in self.buffers.values() for b in per_dtype.values() if b.nbytes]
        ranges.sort()
        self.overlap = any(ranges[k + 1][0] < ranges[k][1] for k in range(len(ranges) - 1))
        self.w_lo = np.array([r[0] for r in ranges], np.int64)
        self.w_hi = np.array([r[1] for r in ranges], np.int64)
        self.w_lo_list = [r[0] for r in ranges]
        self.w_hi_list = [r[1] for r in ranges]
        self.paddr_list = self.paddr.tolist()
        self.plans = {}  # refopt.executors.plan.plan's cache
        self._templates = {}

    #: Segment tables kept per set of tensors (a training loop has one or a few).
    MAX_TEMPLATES = 64

    def template(self, dtype, positions, active, decay, clip, lanes):
        """The read-only tables of a dense call over the variables at ``positions``
        (``active``: has a gradient, else EMA only; ``decay``, ``clip``: per tensor):
        ``(pos, seg, cden, cscale, paddr, elements)``, built once per combination; the
        caller must not write them (``cden``/``cscale`` are ones: copied to write norms)."""
        key = (dtype, positions, active, decay, clip, lanes)
        t = self._templates.get(key)
        if t is None:
            if len(self._templates) >= self.MAX_TEMPLATES:
                self._templates.clear()
            n = len(positions)
            pos = np.array(positions, np.int64)
            seg = np.zeros((n, drivers.SEG_COLUMNS), np.int64)
            seg[:, drivers.SEG_OFFSET] = self.offset[pos]
            cnt = self.count[pos]
            seg[:, drivers.SEG_COUNT] = cnt
            seg[:, drivers.SEG_TAIL] = cnt - cnt % lanes if lanes else cnt
            seg[:, drivers.SEG_ACTIVE] = active
            seg[:, drivers.SEG_DECAY] = decay
            seg[:, drivers.SEG_CLIP] = clip
            ones = np.ones(n, dtype)  # never written: the executor copies it to write norms
            t = self._templates[key] = (pos, seg, ones, ones, self.paddr[pos],
                                        int(cnt.sum()))
        return t

    def overlaps_written(self, lo, hi):
        """Mask of the byte ranges ``[lo, hi)`` that overlap memory the kernels write."""
        k = np.searchsorted(self.w_lo, hi, side="left") - 1
        hit = k >= 0
        hit[hit] = self.w_hi[k[hit]] > lo[hit]
        return hit & (hi > lo)


_DATA_OFFSET = None  # offset of the data pointer in an ndarray object; False: unusable


def _data_offset():
    """Where CPython/NumPy keep an ndarray's data pointer inside the object, checked once.

    ``PyArrayObject`` starts with the object header and then ``char *data``; reading it for
    hundreds of gradients in one kernel call costs a few nanoseconds each, where
    ``a.ctypes.data`` costs about a microsecond. The offset is verified against
    ``ctypes.data`` on owning arrays, views and foreign buffers; if anything disagrees (another
    interpreter build or NumPy layout), ``ctypes.data`` is used instead.
    """
    global _DATA_OFFSET
    if _DATA_OFFSET is None:
        base = np.arange(10, dtype=np.float32)
        probes = [base, base[3:], np.frombuffer(bytearray(40), np.float64), np.zeros((2, 3))]
        offset = 2 * np.dtype(np.intp).itemsize  # after ob_refcnt and ob_type
        ids = np.array([id(a) + offset for a in probes], np.int64)
        ok = np.array_equal(K.read_int64_at(ids), [a.ctypes.data for a in probes])
        _DATA_OFFSET = offset if ok else False
    return _DATA_OFFSET


def data_addresses(arrays):
    """int64 data addresses of exact ``numpy.ndarray`` objects (the caller keeps them alive)."""
    offset = _data_offset()
    if offset is False:
        return np.array([a.ctypes.data for a in arrays], np.int64)
    return K.read_int64_at(np.fromiter([id(a) + offset for a in arrays], np.int64, len(arrays)))


def quick_pairs(opt, pairs):
    """The common step, validated cheaply: every gradient a dense ndarray of its variable's shape
    and dtype (or, for LazyAdam, an IndexedSlices of its shape and dtype), every variable
    built, writeable, C-contiguous, once.

    Returns ``(positions, grads)``, or ``None`` when anything is unusual (a ``None`` or sparse
    gradient, an error to report...): the caller then runs the full validation, which raises
    the precise error or accepts the step.
    """
    index = opt._index
    variables = opt._vars
    specs = opt._var_specs
    positions, grads = [], []
    ndarray = np.ndarray
    lazy = opt._lazy_sparse
    try:
        for g, var in pairs:
            i = index.get(id(var))
            if i is None or variables[i] is not var or (var.shape, var.dtype) != specs[i]:
                return None
            if type(g) is ndarray:
                if g.shape != var.shape or g.dtype != var.dtype:
                    return None
            elif not (lazy and type(g) is IndexedSlices and g.dense_shape == var.shape
                      and g.dtype == var.dtype):
                return None
            flags = var.flags
            if not (flags.writeable and flags.c_contiguous):
                return None
            positions.append(i)
            grads.append(g)
    except (TypeError, ValueError):
        return None
    if not positions or len(set(positions)) != len(positions):
        return None
    return positions, grads


def _safe_grads(state, grads):
    """C-contiguous gradients that share no memory with what the kernels write (copies if needed),
    and their addresses."""
    grads = [g if g.flags.c_contiguous else np.ascontiguousarray(g) for g in grads]
    addr = data_addresses(grads)
    if len(grads) <= 8:  # a few gradients: Python's bisect beats NumPy's per-call cost
        starts, ends = state.w_lo_list, state.w_hi_list
        for k, g in enumerate(grads):
            lo = int(addr[k])
            hi = lo + g.nbytes
            j = bisect.bisect_left(starts, hi) - 1
            if hi > lo and j >= 0 and ends[j] > lo:
                grads[k] = g.copy()
                addr[k] = grads[k].ctypes.data
        return grads, addr
    nbytes = np.fromiter([g.nbytes for g in grads], np.int64, len(grads))
    alias = state.overlaps_written(addr, addr + nbytes)
    if alias.any():
        for k in np.flatnonzero(alias).tolist():
            grads[k] = grads[k].copy()
            addr[k] = grads[k].ctypes.data
    return grads, addr


_SLOTS_MATCH = {}


def _slots_match(opt, rule):
    """Whether ``rule``'s slots are exactly ``opt``'s, in its order (decided once per pair)."""
    key = (type(opt), opt._slot_names(), rule)
    ok = _SLOTS_MATCH.get(key)
    if ok is None:
        names = opt._slot_names()
        ok = _SLOTS_MATCH[key] = (
            tuple(rule.slots) == tuple(n for n in names if n in rule.slots)
            and set(rule.slots) == set(names))
    return ok


class _Group:
    """The tensors of one fused call: one dtype and one step (PyTorch counts per variable)."""

    def __init__(self, dtype, step):
        self.dtype, self.step = dtype, step
        self.pos, self.grads, self.active = [], [], []


def try_fast_step(opt, positions, grads, lr_value):
    """Run one step of ``opt`` in place with the rule-built CPU kernels, if it qualifies.

    Parameters
    ----------
    opt : refopt.Optimizer
        Built, with ``backend="cpu"``.
    positions : list of int
        Build positions of the variables that have a gradient (validated, each once).
    grads : list of (ndarray or IndexedSlices)
        Their gradients (validated).
    lr_value : float
        This step's learning rate.

    Returns
    -------
    bool
        ``True`` if the step was applied (the caller moves the counters), ``False`` if it does
        not qualify and nothing was touched (the caller takes the staged path): float16 or
        bfloat16 computed in its dtype, or with clipping, EMA or a sparse gradient in the
        step, variables sharing memory, non-lazy sparse gradients, a rule-less optimizer,
        Keras 2's several clips in sequence, norm clipping of torch/optax over mixed dtypes
        or sparse gradients.

    Raises
    ------
    TypeError
        A global clip norm over gradients of mixed dtypes (TensorFlow's rule), raised before
        anything is written.
    """
    state = opt._state
    if state is None or state.overlap:
        return False
    # The kernels write through the addresses taken at build time: a variable whose buffer
    # moved since (ndarray.resize) takes the staged path instead.
    if data_addresses([opt._vars[i] for i in positions]).tolist() != [
            state.paddr_list[i] for i in positions]:
        return False
    conv = opt.convention
    dtype_of = state.dtype_of
    # float16/bfloat16 computed in float32 (low_precision_compute "float32", torch's fused
    # Adam): the low kernels, dense gradients without clipping or EMA (computed in the
    # variable's dtype, refopt.precision); computed in the dtype: the staged step
    low = {dt: _FLOAT32 for dt in {dtype_of[i] for i in positions} if dt in _FALLBACK}
    if low and (opt.use_ema or _plan.clip_kind(opt)[0] is not None or any(
            _precision.compute_dtype(conv, dt, opt) is None for dt in low) or any(
            type(g) is not np.ndarray for g in grads)):
        return False
    if opt.use_ema and opt.ema_momentum is None:  # torch's equal-weight average: staged
        return False
    # MKL's sqrt (torch's for-loop; refopt.reference.sqrt): a rule whose root is split
    # (refopt.rules.Root) calls it from the dense_root/rows_root kernels; else staged, host
    mkl = _sqrt.optimizer_takes_mkl_sqrt(opt, grads)
    lazy = opt._is_lazy()
    sparse = [k for k, g in enumerate(grads) if type(g) is not np.ndarray]
    if sparse and (not lazy or (conv.keras3_sparse_square and opt._raw_slices_matter)):
        return False
    kind, _ = _plan.clip_kind(opt)
    if kind == "several":
        return False
    if kind in ("norm", "global") and conv.clip_formula != "tf" and (
            sparse or len({dtype_of[i] for i in positions}) > 1):
        return False
    per_var = conv.step_counter == "per_variable"
    steps = [(opt._var_steps[i] if per_var else opt._iterations) + 1 for i in positions]

    # Norms: every gradient's sum of squares (NumPy's pairwise order), or under PyTorch's
    # formula its torch.linalg.vector_norm (PyTorch's order), one call per dtype.
    values = [g if type(g) is np.ndarray else rows2d(g.values) for g in grads]
    sums = [None] * len(grads)
    gnorm = None
    by_torch = conv.clip_formula == "torch"
    if kind in ("norm", "global"):
        if kind == "global" and conv.clip_formula == "tf":
            gnorm = global_norm(grads)  # TypeError on mixed dtypes, as TF
        else:
            reduce_ = torch_norms if by_torch else sums_of_squares
            for dt in {dtype_of[i] for i in positions}:
                ks = [k for k, i in enumerate(positions) if dtype_of[i] == dt]
                for k, v in zip(ks, reduce_([values[k] for k in ks], dt)):
                    sums[k] = v

    # Clip mode, denominator and scale per gradient (global clipping over all of them).
    cvs = {}
    if kind is None:  # no clipping: mode 0, and the kernels never read cden/cscale
        cm = [0] * len(grads)
        cd = cs = None
    else:
        by_dtype = {}
        for k, i in enumerate(positions):
            by_dtype.setdefault(dtype_of[i], []).append(k)
        cm, cd, cs = [None] * len(grads), [None] * len(grads), [None] * len(grads)
        for dt, ks in by_dtype.items():
            sub = [sums[k] for k in ks] if sums[ks[0]] is not None else None
            if by_torch:  # sub: the norms
                cmode, cden, cscale, cv = _plan.clip_arrays(opt, dt, len(ks), norms=sub)
            else:
                cmode, cden, cscale, cv = _plan.clip_arrays(opt, dt, len(ks), sub, gnorm)
            cvs[dt] = cv
            for j, k in enumerate(ks):
                cm[k], cd[k], cs[k] = cmode[j], cden[j], cscale[j]

    excluded = opt._exclude_ids
    decaying = opt._weight_decay_acts()
    groups = {}
    rows_calls = []
    for k, (i, g) in enumerate(zip(positions, grads)):
        key = (dtype_of[i], steps[k])
        grp = groups.get(key)
        if grp is None:
            grp = groups[key] = _Group(dtype_of[i], steps[k])
        if type(g) is np.ndarray:
            grp.pos.append(i)
            grp.grads.append(g)
            grp.active.append(k)
        else:
            rows_calls.append((k, i, g, grp))
            if opt.use_ema:  # the EMA covers every row: an EMA-only segment after the rows
                grp.pos.append(i)
                grp.grads.append(None)
                grp.active.append(None)
    if opt.use_ema and conv.ema in ("keras3", "torch"):
        present = set(positions)
        for i in range(len(opt._vars)):
            if i not in present:
                dt = dtype_of[i]
                grp = next((g for (d, _), g in groups.items() if d == dt), None)
                if grp is None:
                    grp = groups[(dt, opt._iterations + 1)] = _Group(dt, opt._iterations + 1)
                grp.pos.append(i)
                grp.grads.append(None)
                grp.active.append(None)

    calls = []  # (kernel, args, elements): prepared completely before the first one runs
    plans = {}
    for (dt, step), grp in groups.items():
        cdt = low.get(dt, dt)  # the compute dtype: float32 for float16/bfloat16
        pl = _plan.plan(opt, cdt, lr_value, step, 0)
        if pl is None:
            return False
        pl.psc[2] = cvs.get(dt, cdt.type(0))  # steps.P_CLIP
        plans[(dt, step)] = pl
        rc = opt._rule(cdt, lr_value, step, optax_weight_decay=pl.optax_weight_decay)
        if rc is None or not _slots_match(opt, rc.rule):
            return False
        grp.root = _vector_root(rc, cdt) if mkl else None
        # MKL's root on dense tensors: dense_root (not the low-precision kernels)
        if mkl and grp.pos and (grp.root is None or dt in low):
            return False
        grp.rc, grp.plan = rc, pl
    for k, i, g, grp in rows_calls:
        if grp.plan.dmode == 3 or grp.plan.optax_weight_decay is not None:
            return False  # the framework refuses this decay with sparse gradients
        var = opt._vars[i]
        rc = opt._rule(grp.dtype, lr_value, grp.step, lazy_rows=True,
                       row_width=int(np.prod(var.shape[1:])))
        if rc is None:
            return False
        (vals,), _ = _safe_grads(state, [rows2d(g.values)])
        root = _vector_root(rc, grp.dtype) if mkl else None
        if mkl and root is None:
            return False
        K = drivers.kernels(rc.rule, rc.fl, grp.plan.dmode)
        order, srows = stable_order(g.indices)
        tables = [rows2d(opt._slots[name][i]) for name in rc.rule.slots]
        decay = decaying and id(var) not in excluded
        args = (rows2d(var), *tables, order, srows, vals, int(cm[k]),
                *((cd[k], cs[k]) if cd is not None else (grp.dtype.type(1),) * 2),
                grp.plan.dmode if decay else 0, grp.plan.psc, rc.sc, rc.fl)
        if root is None:
            calls.append((K.rows, args, vals.size))
        else:
            calls.append((K.rows_root, args + root, vals.size))
    for (dt, step), grp in groups.items():
        if not grp.pos:
            continue
        rc, pl = grp.rc, grp.plan
        dense_grads = [g for g in grp.grads if g is not None]
        safe, gaddr_dense = _safe_grads(state, dense_grads) if dense_grads else ([], [])
        active = tuple(k is not None for k in grp.active)
        decay = tuple(bool(decaying and k is not None and id(opt._vars[i]) not in excluded)
                      for i, k in zip(grp.pos, grp.active))
        clip = tuple(0 if k is None else int(cm[k]) for k in grp.active)
        pos, seg, cden, cscale, paddr, elements = state.template(
            low.get(dt, dt), tuple(grp.pos), active, decay, clip, rc.tail_lanes)
        if len(gaddr_dense) == len(active):  # every tensor has a gradient
            gaddr = gaddr_dense
        else:
            gaddr = np.zeros(len(active), np.int64)
            gaddr[list(active)] = gaddr_dense if len(gaddr_dense) else 0
        if cd is not None:  # norms: this step's denominators and scales
            cden, cscale = cden.copy(), cscale.copy()
            for q, k in enumerate(grp.active):
                if k is not None:
                    cden[q] = cd[k]
                    cscale[q] = cs[k]
        buf = state.buffers[dt]
        empty = np.zeros(0, dt)
        if dt in low:  # the bits of the low-precision buffers, and the format
            K = drivers.kernels(rc.rule, rc.fl, pl.dmode, bool(rc.tail_lanes), low=True)
            args = (paddr, gaddr, seg, cden, cscale,
                    *[buf[name].view(np.uint16) for name in rc.rule.slots],
                    np.zeros(0, np.uint16), pl.dmode, pl.emode, pl.overwrite, pl.psc, rc.sc,
                    rc.fl, _halfbits.kind_of(dt), safe)
            calls.append((K.dense, args, elements))
            continue
        K = drivers.kernels(rc.rule, rc.fl, pl.dmode, bool(rc.tail_lanes))
        args = (paddr, gaddr, seg, cden, cscale,
                *[buf[name] for name in rc.rule.slots], buf.get("average", empty),
                pl.dmode, pl.emode, pl.overwrite, pl.psc, rc.sc, rc.fl)
        if grp.root is None:
            calls.append((K.dense, args + (safe,), elements))
        else:
            calls.append((K.dense_root, args + grp.root + (safe,), elements))
    # Nothing has been written so far; from here on nothing can fail.
    for kernel, args, elements in calls:
        if kernel.__name__ in ("dense", "dense_root"):
            args = args[:-1]  # the last entry only kept the gradient copies alive
        launch(kernel, args, elements)
    return True


def _vector_root(rc, dtype):
    """(address, mode) of MKL's root for the rule call ``rc`` on ``dtype`` (the extra
    arguments of the ``dense_root``/``rows_root`` kernels), or None where the rule's root is
    not split for this form (:class:`refopt.rules.Root`) or MKL is missing."""
    root = rc.rule.root
    if root is None or int(rc.fl[0]) not in root.forms:
        return None
    return _mkl.mkl_address(dtype)


def try_in_place_step(opt, positions, grads, lr_value):
    """Run one step with the optimizer's own in-place CPU step, if it has one and qualifies.

    For the optimizers that are no single rule (the phased updates: ``Lamb``, ``Adafactor``),
    which define ``_in_place_step(items, lr_value) -> bool``: ``items`` is one ``(variable,
    gradient, {slot: array}, step, decays)`` per variable (the live arrays; ``decays``: the
    weight decay acts on it); the method checks everything before it writes, and returns False having
    written nothing when it does not take a variable. The executor passes only what the
    staged step would add nothing to: dense ndarray gradients (copied where they share memory
    with what is written), no clipping, no EMA, no low-precision compute, no MKL root, no
    variables sharing memory. Same arguments and return value as :func:`try_fast_step`.
    """
    method = getattr(opt, "_in_place_step", None)
    state = opt._state
    if method is None or state is None or state.overlap or opt.use_ema:
        return False
    if _plan.clip_kind(opt)[0] is not None or any(type(g) is not np.ndarray for g in grads):
        return False
    conv = opt.convention
    if any(_precision.compute_dtype(conv, state.dtype_of[i], opt) is not None
           for i in positions) or _sqrt.optimizer_takes_mkl_sqrt(opt, grads):
        return False
    if data_addresses([opt._vars[i] for i in positions]).tolist() != [
            state.paddr_list[i] for i in positions]:
        return False
    grads, _ = _safe_grads(state, grads)
    per_var = conv.step_counter == "per_variable"
    decaying = opt._weight_decay_acts()
    names = opt._slot_names()
    items = [(opt._vars[i], g, {name: opt._slots[name][i] for name in names},
              (opt._var_steps[i] if per_var else opt._iterations) + 1,
              bool(decaying and id(opt._vars[i]) not in opt._exclude_ids))
             for i, g in zip(positions, grads)]
    return bool(method(items, lr_value))


class CpuExecutor(ReferenceExecutor):
    """Numba: the host checks of the reference, a flat state, the fused rule-built kernels
    (:func:`try_fast_step`), and the staged step with :mod:`refopt.kernels.cpu`'s pure
    functions for what they do not take."""

    name = "cpu"

    def __init__(self):
        from refopt.kernels import cpu

        self.kernels = cpu

    def allocate(self, opt, var_list):
        return FlatState(var_list, opt._slot_names(), opt.use_ema,
                         lambda name, dt: _precision.slot_initial_value(opt, name, dt),
                         average_zero=opt.convention.ema == "keras3", slot_shape=opt.slot_shape,
                         slot_dtype=opt.slot_dtype)

    def quick_step(self, opt, grads_and_vars, lr_value):
        quick = quick_pairs(opt, grads_and_vars)
        if quick is None or opt._iterations >= _INT64_MAX:
            return None
        with np.errstate(all="ignore"):
            return quick[0] if (try_fast_step(opt, *quick, lr_value)
                                or try_in_place_step(opt, *quick, lr_value)) else None

    def run_step(self, opt, positions, grads, lr_value):
        with np.errstate(all="ignore"):  # NaN and inf propagate silently, as in TensorFlow
            if try_fast_step(opt, positions, grads, lr_value) or try_in_place_step(
                    opt, positions, grads, lr_value):
                return
            kernels = opt._kernels
            if _sqrt.optimizer_takes_mkl_sqrt(opt, grads):
                # MKL's root (the convention's `sqrt` knob): the reference's pure functions,
                # whose roots follow the knob (the CPU kernels' are IEEE)
                from refopt import reference

                opt._kernels = reference
            try:
                new_values = staged.compute(
                    opt, [(g, opt._vars[i]) for g, i in zip(grads, positions)], lr_value,
                    dedup=deduplicate)
            finally:
                opt._kernels = kernels
        staged.commit(opt, new_values)
