"""The in-place fast path of ``backend="cpu"``: flat state, one fused kernel call per dtype.

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
  fused kernel *once* (``_kernels.adam_multi`` / ``sgd_multi``), which turns each address
  into a typed array (a small Numba ``@intrinsic``) and runs clip, weight decay, the update
  and the EMA in one pass over memory, in parallel over fixed 64 Ki-element chunks of all
  tensors together.
- **Validation first.** Everything that can raise (types, shapes, the global norm's dtype
  rule, clip norms, scalars, address tables) is done before the first write; the kernels
  then update the variables and slots in place and cannot fail. A raising
  ``apply_gradients`` therefore changes nothing, as with the reference backend.

Sparse gradients of ``LazyAdam`` go to ``_kernels.lazy_adam_rows`` (one call per sparse
variable; cost proportional to the rows touched, no copy of the table). Everything else
(float16 variables, non-lazy sparse gradients of ``Adam``/``SGD``, variables that overlap in
memory) takes the staged path of the base class with the CPU kernels' pure functions: the
same numbers, computed into new arrays and committed at the end.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices

_FALLBACK = (np.dtype(np.float16),)


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

    def __init__(self, var_list, slot_names, use_ema):
        n = len(var_list)
        self.offset = np.zeros(n, np.int64)
        self.count = np.array([v.size for v in var_list], np.int64)
        self.paddr = np.array([v.ctypes.data for v in var_list], np.int64)
        self.dtype_of = [v.dtype for v in var_list]
        dtypes = set(self.dtype_of)
        self.single_dtype = dtypes.pop() if len(dtypes) == 1 else None
        totals = {}
        for i, var in enumerate(var_list):
            self.offset[i] = totals.get(var.dtype, 0)
            totals[var.dtype] = self.offset[i] + var.size
        names = tuple(slot_names) + (("average",) if use_ema else ())
        self.buffers = {dt: {name: np.zeros(total, dt) for name in names}
                        for dt, total in totals.items()}
        self.slots = {name: [] for name in slot_names}
        self.averages = []
        for i, var in enumerate(var_list):
            lo, hi = self.offset[i], self.offset[i] + var.size
            for name in slot_names:
                self.slots[name].append(self.buffers[var.dtype][name][lo:hi].reshape(var.shape))
            if use_ema:
                avg = self.buffers[var.dtype]["average"][lo:hi].reshape(var.shape)
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
        from refopt.kernels.cpu import _kernels as K

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
    from refopt.kernels.cpu import _kernels as K

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
    nbytes = np.fromiter([g.nbytes for g in grads], np.int64, len(grads))
    alias = state.overlaps_written(addr, addr + nbytes)
    if alias.any():
        for k in np.flatnonzero(alias).tolist():
            grads[k] = grads[k].copy()
            addr[k] = grads[k].ctypes.data
    return grads, addr


_CAPABLE = {}


def fast_capable(cls):
    """Whether ``cls``'s update has a fused kernel: the class that defines its
    ``_update_step`` also defines ``_fast_update`` (a subclass that rewrites the update of
    Adam or SGD, or a new optimizer, takes the staged path with its own ``_update_step``)."""
    if cls not in _CAPABLE:
        owner = next((k for k in cls.__mro__ if "_update_step" in vars(k)), None)
        _CAPABLE[cls] = owner is not None and "_fast_update" in vars(owner)
    return _CAPABLE[cls]


def try_fast_step(opt, positions, grads, lr_value):
    """Run one step of ``opt`` in place with the fused CPU kernels, if it qualifies.

    Parameters
    ----------
    opt : refopt.Optimizer
        Built, with ``backend="cpu"``.
    positions : list of int
        Build positions of the variables that have a gradient (validated, each once).
    grads : list of (ndarray or IndexedSlices)
        Their gradients (validated).
    lr_value : float
        This step's learning rate (float32-rounded).

    Returns
    -------
    bool
        ``True`` if the step was applied (the caller only moves the counter), ``False`` if it
        does not qualify and nothing was touched (the caller takes the staged path).

    Raises
    ------
    TypeError
        A global clip norm over gradients of mixed dtypes (TensorFlow's rule), raised before
        anything is written.
    """
    from refopt.kernels.cpu import _kernels as K
    from refopt.kernels.cpu._common import (
        flags,
        launch,
        lr_cast,
        rows2d,
        scalar,
        scalars,
        stable_order,
        tf_cast,
    )
    from refopt.kernels.cpu.clipping import (
        global_norm,
        global_scale,
        norm_denominators,
        sums_of_squares,
    )

    state = opt._flat
    if state is None or state.overlap or not fast_capable(type(opt)):
        return False
    # The kernels write through the addresses taken at build time: a variable whose buffer
    # moved since (ndarray.resize) takes the staged path instead.
    if not np.array_equal(data_addresses([opt._vars[i] for i in positions]),
                          state.paddr[positions]):
        return False
    dense, sparse = {}, []
    dtype_of = state.dtype_of
    if state.single_dtype is not None and all(type(g) is np.ndarray for g in grads):
        if state.single_dtype in _FALLBACK:
            return False
        dense[state.single_dtype] = (positions, grads)
    else:
        for i, g in zip(positions, grads):
            dt = dtype_of[i]
            if dt in _FALLBACK:
                return False
            if type(g) is np.ndarray:
                pos_list, grad_list = dense.setdefault(dt, ([], []))
                pos_list.append(i)
                grad_list.append(g)
            elif opt._lazy_sparse and isinstance(g, IndexedSlices):
                sparse.append((i, g))
            else:
                return False

    step = opt._iterations + 1
    mode, clip = 0, None
    if opt.clipnorm and opt.clipnorm > 0:
        mode, clip = 2, max(opt.clipnorm, 0)
    elif opt.global_clipnorm and opt.global_clipnorm > 0:
        mode = 3
        norm = global_norm(grads)  # TypeError on mixed dtypes, as TF
        _, gscale = global_scale(norm, opt.global_clipnorm)
    elif opt.clipvalue and opt.clipvalue > 0:
        mode, clip = 1, opt.clipvalue
    ema = opt.use_ema
    overwrite = bool(ema and opt.ema_overwrite_frequency
                     and step % opt.ema_overwrite_frequency == 0)
    kind, ams, update_scalars = opt._fast_update(lr_value, step)
    excluded = opt._exclude_ids
    decaying = opt.weight_decay is not None

    def scalars_for(dt):
        values = dict(update_scalars(dt), lr=lr_cast(dt, lr_value))
        if decaying:
            values["wd"] = tf_cast(dt, opt.weight_decay)
        if mode in (1, 2):
            values["clip"] = scalar(dt, clip)
        if mode == 3:
            with np.errstate(all="ignore"):
                values["gscale"] = dt.type(gscale)
        if ema:
            values["mu"] = scalar(dt, opt.ema_momentum)
            values["omu"] = scalar(dt, 1 - opt.ema_momentum)
        return scalars(dt, **values)

    fl = flags(ams=ams, clip=mode, ema=ema, overwrite=overwrite)
    calls = []  # (kernel, args, elements): prepared completely before the first one runs
    for dt, (pos_list, grad_list) in dense.items():
        pos = np.array(pos_list, np.int64)
        group_grads, gaddr = _safe_grads(state, grad_list)
        sc = scalars_for(dt)
        if mode == 2:
            cden = norm_denominators(sums_of_squares(group_grads, dt), sc[K.S_CLIP])
        else:
            cden = np.ones(len(pos_list), dt)
        if not decaying:
            decay = np.zeros(len(pos_list), np.uint8)
        elif not excluded:
            decay = np.ones(len(pos_list), np.uint8)
        else:
            decay = np.array([id(opt._vars[i]) not in excluded for i in pos_list], np.uint8)
        buf = state.buffers[dt]
        empty = np.zeros(0, dt)
        if kind == "adam":
            args = (state.paddr[pos], gaddr, state.offset[pos], state.count[pos], decay, cden,
                    buf["m"], buf["v"], buf.get("vhat", empty), buf.get("average", empty), fl,
                    sc, group_grads)
            calls.append((K.adam_multi, args, int(state.count[pos].sum())))
        else:
            args = (state.paddr[pos], gaddr, state.offset[pos], state.count[pos], decay, cden,
                    buf["m"], buf.get("average", empty), fl, sc, group_grads)
            calls.append((K.sgd_multi, args, int(state.count[pos].sum())))
    for i, g in sparse:
        var = opt._vars[i]
        dt = var.dtype
        (vals,), _ = _safe_grads(state, [rows2d(g.values)])
        sc = scalars_for(dt)
        d = dt.type(1)
        if mode == 2:
            d = norm_denominators(sums_of_squares([vals], dt), sc[K.S_CLIP])[0]
        decay = decaying and id(var) not in excluded
        P = rows2d(var)
        M = rows2d(opt._slots["m"][i])
        V = rows2d(opt._slots["v"][i])
        VH = rows2d(opt._slots["vhat"][i]) if ams else M
        order, srows = stable_order(g.indices)
        args = (P, M, V, VH, order, srows, vals, fl, sc, d, decay, dt.type(0))
        calls.append((K.lazy_adam_rows, args, vals.size))
        if ema:
            avg = opt._averages[i].reshape(-1)
            calls.append((K.ema_k, (avg, var.reshape(-1), avg, sc[K.S_MU], sc[K.S_OMU],
                                    overwrite), avg.size))
    # Nothing has been written so far; from here on nothing can fail.
    for kernel, args, elements in calls:
        if kernel is K.adam_multi or kernel is K.sgd_multi:
            args = args[:-1]  # the last entry only kept the gradient copies alive
        launch(kernel, args, elements)
    return True
