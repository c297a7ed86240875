"""The step of ``backend="cuda"``: validation first, then one fused launch per dtype group.

Variables, gradients and state live on the GPU. A variable is the caller's object (a numba
device array, or anything with ``__cuda_array_interface__``: CuPy, PyTorch CUDA tensors),
identified by object identity and updated in place through a numba view of its memory;
variables must not share device memory (refused at build). Dense gradients are device arrays
of the variable's shape and dtype (a gradient that shares memory with a variable or the state
is copied first, as ``backend="cpu"`` does, so the result is the reference's); every optimizer
also takes :class:`~refopt.IndexedSlices` gradients (host ``values`` and ``indices``, copied
over each step).

Design: one launch per dtype group (multi-tensor apply)
--------------------------------------------------------
- **Flat state.** At build time each slot (``m``, ``v``, ``vhat``, the EMA ``average``) gets
  *one* flat device buffer per dtype holding every variable's slot back to back;
  ``get_slot`` and ``variables`` hand out reshaped views of it.
- **Segment table.** The variables and gradients stay the caller's separate allocations.
  They reach the kernel as two tuples of device arrays (numba passes each array's descriptor
  as kernel parameters; the simulator passes the objects), indexed at run time by the tensor
  number found in a small device table of ``(slot offset, size, first chunk, decay flag)``
  rows, built once per set of present variables and cached. Each block takes fixed chunks of
  ``THREADS_PER_BLOCK * ITEMS_PER_THREAD`` elements of all tensors together, so every dense
  variable of a dtype is clipped, decayed, updated and averaged by **one launch**
  (``_kernels.adam_multi`` / ``sgd_multi``), for up to ``config.TENSORS_PER_LAUNCH`` (24)
  tensors per dtype.
- **Cost.** CUDA's 4 KiB kernel parameter space holds about 24 pairs of array descriptors,
  so a group of ``n > 24`` tensors takes ``ceil(n / 24)`` launches (500 small tensors: 21
  launches instead of 500). No data is copied: raw device pointers would lift the limit but
  numba cannot dereference them portably and the simulator not at all. Per step and group
  the host also copies one small array of per-tensor clip factors to the device (the
  ``clipnorm`` divisors or the global scale; a cached array of ones otherwise), and with
  ``clipnorm``/``global_clipnorm`` computes each tensor's norm first (one reduction launch
  and a device-to-host copy per tensor). Each distinct set of present variables builds its
  table once (a few host-to-device copies).
- **Lazy rows.** ``IndexedSlices`` gradients of ``LazyAdam`` stay one launch per sparse
  tensor (``_kernels.lazy_adam_rows``, then the EMA if any), on views of the same flat slots.

Everything that can raise is checked (and every scalar, norm, clip factor and table
computed) before the first launch, so a raising ``apply_gradients`` changes nothing.

IndexedSlices gradients of ``Adam``/``AdamW``/``SGD`` take tf-keras' non-lazy sparse update of
the whole variable (``_kernels.adam_sparse_table`` / ``sgd_sparse_table``, one launch per
sparse tensor). float16 variables are computed in float32 and rounded to float16 after every
operation (NumPy's float16 arithmetic, bit for bit). Never run on a real GPU yet.
"""

from __future__ import annotations

import bisect
import warnings

import numpy as np

from refopt.indexed_slices import IndexedSlices


def _kc():
    from refopt.kernels import cuda as kc

    return kc


def _byte_bounds(a):
    try:
        from numpy.lib.array_utils import byte_bounds  # NumPy >= 2
    except ImportError:  # pragma: no cover - NumPy 1.x
        byte_bounds = np.byte_bounds
    return byte_bounds(a)


def extent(d):
    """``(first byte, end byte)`` of the memory of a C-contiguous device array, or None if empty.

    On a GPU the device address of the numba device array ``d``; on the simulator the bounds
    of the host memory behind the simulated array.
    """
    if d.size == 0:
        return None
    if _kc().simulator:
        lo, hi = _byte_bounds(d._ary)
        return int(lo), int(hi)
    # device_ctypes_pointer: cheaper than building the __cuda_array_interface__ dict; a
    # ctypes integer in numba-cuda 0.30, a CUdeviceptr handle (int() works) in older releases
    p = d.device_ctypes_pointer
    ptr = int(getattr(p, "value", p) or 0)
    return ptr, ptr + d.size * np.dtype(d.dtype).itemsize


def check_var_list(var_list, what):
    """Refuse a single device array given as a list, and variables that share device memory.

    Raises
    ------
    TypeError
        If ``var_list`` is itself one device array (iterating it would give its rows).
    ValueError
        If two variables overlap in device memory: the kernels update every variable in place
        in parallel, so the reference's order of writes could not be reproduced.
    """
    kc = _kc()
    if hasattr(var_list, "__cuda_array_interface__") or kc.is_device_array(var_list):
        raise TypeError(
            f"`{what}` must be a list of device arrays, not a single array. Received: "
            f"{type(var_list).__name__} of shape {tuple(var_list.shape)}")
    return var_list


def check_no_overlap(views, what):
    """Raise ``ValueError`` naming two of ``views`` (variables) that share device memory."""
    spans = sorted((e[0], e[1], i) for i, e in enumerate(map(extent, views)) if e is not None)
    end, owner = -1, None
    for lo, hi, i in spans:
        if lo < end:
            a, b = sorted((owner, i))
            raise ValueError(
                f"The variables at positions {a} and {b} (of `{what}`, or of `grads_and_vars` "
                "when a step builds the optimizer) share device memory: backend='cuda' "
                "updates every variable in place in parallel, so variables must not overlap. "
                "Pass separate arrays, or use backend='cpu'.")
        if hi > end:
            end, owner = hi, i


def view(var, where):
    """The numba device view of a variable, after checking dtype and layout."""
    kc = _kc()
    d = kc.as_device(where, var)
    if np.dtype(d.dtype) not in kc.DTYPES:
        raise TypeError(
            f"backend='cuda' computes in float16, float32 or float64. Received: {where} with "
            f"dtype={d.dtype}"
        )
    if not d.is_c_contiguous():
        raise ValueError(
            f"Variables must be C-contiguous (they are updated in place). Received: {where} "
            f"with shape={d.shape}"
        )
    return d


class CudaState:
    """Device views of the variables and the flat device slots and EMA averages.

    Parameters
    ----------
    var_list : list of device arrays
        The variables (validated by :func:`view`).
    slot_names : tuple of str
    use_ema : bool
        Also keep an ``average`` buffer, initialised with device copies of the variables.

    Attributes
    ----------
    views : list of numba device array
        The variables' numba views.
    buffers : dict of numpy.dtype -> dict of str -> numba device array (1-d)
        One flat buffer per dtype and slot (and ``"average"``).
    offsets : list of int
        Where each variable's slots start in its dtype's buffers.
    slots : dict of str -> list of numba device array
        Per slot, one view per variable (its shape) into the flat buffer.
    averages : list of numba device array
        Views of the ``average`` buffers (empty without EMA).
    """

    #: Segment tables kept per (dtype, present variables, decay flags); cleared past this
    #: many (a training loop has one or a few sets of present variables).
    MAX_TABLES = 64

    def __init__(self, var_list, slot_names, use_ema):
        kc = _kc()
        kc.check_config()
        self.views = [view(v, f"var_list[{i}]") for i, v in enumerate(var_list)]
        check_no_overlap(self.views, "var_list")
        self.dtypes = [np.dtype(d.dtype) for d in self.views]
        self.offsets = []
        totals = {}
        for d, dt in zip(self.views, self.dtypes):
            self.offsets.append(totals.get(dt, 0))
            totals[dt] = self.offsets[-1] + d.size
        names = tuple(slot_names) + (("average",) if use_ema else ())
        self.buffers = {dt: {name: kc.to_device(np.zeros(max(n, 1), dt)) for name in names}
                        for dt, n in totals.items()}
        per = {name: [self._view(i, name) for i in range(len(self.views))] for name in names}
        self.slots = {name: per[name] for name in slot_names}
        self.averages = per.get("average", [])
        for a, d in zip(self.averages, self.views):
            kc.copy(a, d)
        self._tables = {}
        # Memory the kernels write (variables and the flat state), sorted, non-overlapping.
        written = [extent(d) for d in self.views]
        written += [extent(b) for bufs in self.buffers.values() for b in bufs.values()]
        self._written = sorted(e for e in written if e is not None)
        self._written_starts = [e[0] for e in self._written]

    def aliases(self, g):
        """Whether device array ``g`` shares memory with a variable or the state."""
        e = extent(g)
        if e is None:
            return False
        k = bisect.bisect_right(self._written_starts, e[1] - 1) - 1
        return k >= 0 and self._written[k][1] > e[0]

    def _view(self, i, name):
        d = self.views[i]
        if d.size == 0:
            return _kc().zeros_like(d)
        off = self.offsets[i]
        return self.buffers[self.dtypes[i]][name][off:off + d.size].reshape(d.shape)

    def segments(self, dtype, positions, decay):
        """The cached :class:`refopt.kernels.cuda.Segments` of these variables."""
        key = (dtype, tuple(positions), tuple(decay))
        seg = self._tables.get(key)
        if seg is None:
            if len(self._tables) >= self.MAX_TABLES:
                self._tables.clear()
            seg = _kc().Segments([self.views[i].size for i in positions],
                                 [self.offsets[i] for i in positions], decay)
            self._tables[key] = seg
        return seg


def _check_pairs(opt, grads_and_vars):
    from refopt.optimizers.base import unpack_pairs

    pairs = unpack_pairs(grads_and_vars)
    seen = set()
    out = []
    for i, (grad, var) in enumerate(pairs):
        d = view(var, f"variable at position {i}")
        if id(var) in seen:
            raise ValueError(f"The same variable appears twice in `grads_and_vars` (position {i}).")
        seen.add(id(var))
        if grad is None:
            out.append((None, var, d))
            continue
        shape, dtype = tuple(d.shape), np.dtype(d.dtype)
        if isinstance(grad, IndexedSlices):
            if grad.dense_shape != shape:
                raise ValueError(
                    f"Gradient at position {i} (IndexedSlices) has dense_shape="
                    f"{grad.dense_shape}, but its variable has shape={shape}."
                )
            if grad.dtype != dtype:
                raise TypeError(
                    f"Gradient at position {i} (IndexedSlices) has dtype={grad.dtype}, but "
                    f"its variable has dtype={dtype}; cast the gradient values."
                )
            out.append((grad, var, d))
            continue
        g = _kc().as_device(f"Gradient at position {i}", grad)
        if tuple(g.shape) != shape or np.dtype(g.dtype) != dtype:
            err = ValueError if tuple(g.shape) != shape else TypeError
            raise err(
                f"Gradient at position {i} has shape={tuple(g.shape)}, dtype={g.dtype}, but "
                f"its variable has shape={shape}, dtype={dtype}."
            )
        if not g.is_c_contiguous():
            raise ValueError(f"Gradient at position {i} must be C-contiguous on the device.")
        out.append((g, var, d))
    return out


def apply_gradients(opt, grads_and_vars, lr_value):
    """``Optimizer.apply_gradients`` for ``backend="cuda"`` (same order, same errors)."""
    from refopt import schedules as _schedules
    from refopt.optimizers.base import _INT64_MAX
    from refopt.reference import clipping as rclip

    kc = _kc()
    is_schedule = isinstance(opt._learning_rate, _schedules.LearningRateSchedule)
    pairs = _check_pairs(opt, grads_and_vars)
    if not pairs:
        if is_schedule:
            opt._current_learning_rate = lr_value
        return opt._iterations
    if opt._iterations >= _INT64_MAX:
        raise OverflowError(f"`iterations` is {opt._iterations}; one more step would overflow.")
    kc.check_config()
    if opt._built:  # the reference's order: unknown variables (KeyError) before the rest
        for k, (_, var, d) in enumerate(pairs):
            shape, dtype = opt._var_specs[opt._position(var)]
            if tuple(d.shape) != shape or np.dtype(d.dtype) != dtype:
                raise ValueError(
                    f"The variable at position {k} changed shape or dtype after build.")
    present = [(g, var, d) for g, var, d in pairs if g is not None]
    if not present:
        raise ValueError(
            "No gradients provided for any variable (every gradient is None). Received "
            f"{len(pairs)} (gradient, variable) pairs."
        )
    if len(present) < len(pairs):
        missing = [i for i, (g, _, _) in enumerate(pairs) if g is None]
        warnings.warn(
            f"Gradients do not exist for the variables at positions {missing}; they are "
            "skipped in this step.", UserWarning, stacklevel=3)
    building = not opt._built
    if building:
        opt.build([var for _, var, _ in pairs])
    try:
        calls = _prepare(opt, present, lr_value, kc, rclip)
    except BaseException:
        if building:
            opt._reset_state()
        raise
    for fn, args, kwargs in calls:  # nothing can fail from here on
        fn(*args, **kwargs)
    opt._iterations += 1
    if is_schedule:
        opt._current_learning_rate = lr_value
    return opt._iterations


def _prepare(opt, present, lr_value, kc, rclip):
    from refopt.optimizers._fast import fast_capable

    if not fast_capable(type(opt)):
        raise NotImplementedError(
            f"{type(opt).__name__} defines its own update; backend='cuda' has kernels only "
            "for the updates of Adam, AdamW, LazyAdam and SGD.")
    state = opt._cuda
    positions = [opt._position(var) for _, var, _ in present]  # checked in apply_gradients
    step = opt._iterations + 1
    # A dense gradient that shares memory with what the kernels write (a variable, a slot) is
    # copied first, so that it is read as it was before the step (the reference's semantics).
    grads = []
    for g, _, _ in present:
        if not isinstance(g, IndexedSlices) and state.aliases(g):
            copy = kc.cuda.device_array(g.shape, g.dtype)
            kc.copy(copy, g)
            g = copy
        grads.append(g)
    # Clipping (tf-keras: clipnorm, else global_clipnorm, else clipvalue). Dense gradients are
    # clipped inside the fused kernel; sparse values on the host by the reference.
    dense_clip = [(0,)] * len(grads)
    if opt.clipnorm and opt.clipnorm > 0:
        c = max(opt.clipnorm, 0)
        for k, g in enumerate(grads):
            if isinstance(g, IndexedSlices):
                grads[k] = rclip.clip_by_norm(g, opt.clipnorm)
            else:
                dt = np.dtype(g.dtype)
                cc = dt.type(c)
                s = kc.sumsq(g)
                with np.errstate(all="ignore"):
                    n = np.sqrt(s) if s > 0 else s
                    dense_clip[k] = (2, c, np.maximum(n, cc))
    elif opt.global_clipnorm and opt.global_clipnorm > 0:
        dtypes = sorted({np.dtype(g.dtype).name for g in grads})
        if len(dtypes) > 1:
            raise TypeError(
                "All gradients of a global norm must have the same dtype (TensorFlow refuses "
                f"to stack mixed dtypes). Received dtypes {dtypes}")
        dt = np.dtype(dtypes[0])
        halves = []
        for g in grads:
            if isinstance(g, IndexedSlices):
                flat = np.ascontiguousarray(g.values)
                with np.errstate(all="ignore"):
                    halves.append(dt.type(np.sum(flat * flat * dt.type(0.5), dtype=dt)))
            else:
                halves.append(kc.sumsq(g, half=True))
        with np.errstate(all="ignore"):
            half = np.sum(np.asarray(halves, dtype=dt), dtype=dt)
            norm = np.sqrt(half * dt.type(2.0))
        _, gscale = _global_scale(norm, opt.global_clipnorm)
        for k, g in enumerate(grads):
            if isinstance(g, IndexedSlices):
                grads[k] = rclip.clip_by_global_norm([g], opt.global_clipnorm, use_norm=norm)[0][0]
            else:
                dense_clip[k] = (3, None, None, gscale)
    elif opt.clipvalue and opt.clipvalue > 0:
        for k, g in enumerate(grads):
            if isinstance(g, IndexedSlices):
                grads[k] = rclip.clip_by_value(g, opt.clipvalue)
            else:
                dense_clip[k] = (1, opt.clipvalue)
    ema = opt.use_ema
    overwrite = bool(ema and opt.ema_overwrite_frequency
                     and step % opt.ema_overwrite_frequency == 0)
    ema_kw = dict(ema_momentum=opt.ema_momentum if ema else None, overwrite=overwrite)
    kind, flag, hyper = opt._cuda_update()
    _validate_hyperparameters(opt, kind, flag, hyper, present, positions, lr_value, step)
    calls = []
    groups = {}  # dtype -> [(position, view, gradient, clip tuple, decays)], in input order
    for k, (i, g) in enumerate(zip(positions, grads)):
        d = present[k][2]
        decays = (opt.weight_decay is not None and id(opt._vars[i]) not in opt._exclude_ids)
        wd = opt.weight_decay if decays else None
        if isinstance(g, IndexedSlices):
            width = d.size // d.shape[0] if d.size else 1
            vals = kc.to_device(np.ascontiguousarray(g.values).reshape(g.values.shape[0], width)
                                if g.values.shape[0] and d.size else np.zeros((0, 1), g.dtype))
            m_i = state.slots["m"][i]
            if kind == "adam":  # LazyAdam: the present rows; Adam/AdamW: the whole table
                fn = kc.lazy_adam_rows if opt._lazy_sparse else kc.adam_sparse
                vh = state.slots["vhat"][i] if flag else None
                calls.append((fn, (d, m_i, state.slots["v"][i], vh, vals, g.indices),
                              dict(learning_rate=lr_value, step=step, weight_decay=wd,
                                   **hyper)))
            else:
                calls.append((kc.sgd_sparse, (d, m_i, vals, g.indices),
                              dict(learning_rate=lr_value, nesterov=flag, weight_decay=wd,
                                   **hyper)))
            if ema:
                calls.append((kc.ema_dense, (state.averages[i], d), ema_kw))
            continue
        groups.setdefault(np.dtype(d.dtype), []).append((i, d, g, dense_clip[k], decays))
    for dt, members in groups.items():
        pos = [i for i, _, _, _, _ in members]
        seg = state.segments(dt, pos, [dec for _, _, _, _, dec in members])
        mode = members[0][3][0]
        clip = (mode, members[0][3][1] if mode in (1, 2) else None)
        if mode == 2:
            scales = seg.scales(dt, [c[2] for _, _, _, c, _ in members])
        elif mode == 3:
            scales = seg.scales(dt, [c[3] for _, _, _, c, _ in members])
        else:
            scales = seg.ones(dt)
        buf = state.buffers[dt]
        common = dict(segments=seg, scales=scales, learning_rate=lr_value,
                      weight_decay=opt.weight_decay, clip=clip,
                      average=buf["average"] if ema else None, **ema_kw)
        ps = [d for _, d, _, _, _ in members]
        gs = [g for _, _, g, _, _ in members]
        if kind == "adam":
            calls.append((kc.adam_multi, (ps, gs, buf["m"], buf["v"],
                                          buf["vhat"] if flag else None),
                          dict(step=step, **hyper, **common)))
        else:
            calls.append((kc.sgd_multi, (ps, gs, buf["m"]),
                          dict(nesterov=flag, **hyper, **common)))
    return calls


def _validate_hyperparameters(opt, kind, flag, hyper, present, positions, lr_value, step):
    """Raise what the reference would for a hyperparameter changed to an invalid value.

    The launchers convert the hyperparameters at launch time; running the reference's own
    functions on one-element arrays of each dtype of the step first raises the reference's
    exceptions, with its messages, before anything is launched.
    """
    from refopt import reference as R

    decays = opt.weight_decay is not None and any(
        id(opt._vars[i]) not in opt._exclude_ids for i in positions)
    for dt in {np.dtype(d.dtype) for _, _, d in present}:
        z = np.zeros(1, dt)
        with np.errstate(all="ignore"):
            if decays:
                R.apply_weight_decay(z, learning_rate=lr_value, weight_decay=opt.weight_decay)
            if kind == "adam":
                R.adam_update(z, z, z, z, z if flag else None, learning_rate=lr_value,
                              step=step, **hyper)
            else:
                R.sgd_update(z, z, z, learning_rate=lr_value, nesterov=flag, **hyper)
            if opt.use_ema:
                R.ema_update(z, z, ema_momentum=opt.ema_momentum)


def _global_scale(norm, clip_norm):
    dtype = np.asarray(norm).dtype
    n = dtype.type(norm)
    c = dtype.type(clip_norm)
    one = dtype.type(1.0)
    with np.errstate(all="ignore"):
        return n, c * np.minimum(one / n, one / c) + (n - n)


def finalize(opt, positions):
    for i in positions:
        _kc().copy(opt._cuda.views[i], opt._cuda.averages[i])
