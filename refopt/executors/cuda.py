"""The executor of ``backend="cuda"``: validation first, then one fused launch per dtype group.

Variables, gradients and state live on the GPU. A variable is the caller's object (a numba
device array, or anything with ``__cuda_array_interface__``: CuPy, PyTorch CUDA tensors),
identified by object identity and updated in place through a numba view of its memory;
variables must not share device memory (refused at build). Dense gradients are device arrays
of the variable's shape and dtype (a gradient that shares memory with a variable or the state
is copied first, as ``backend="cpu"`` does, so the result is the reference's); every optimizer
also takes :class:`~refopt.IndexedSlices` gradients (host ``values`` and ``indices``, copied
over each step).

Design: the rule drivers, one launch per dtype group (multi-tensor apply)
-------------------------------------------------------------------------
Every convention (tf_keras, Keras 3, Keras 2, TF1, PyTorch, optax) and every optimizer with a
rule (:meth:`~refopt.Optimizer.update_rule`: Adam, AMSGrad, AdamW, LazyAdam, SGD, RMSprop)
runs on the kernels :mod:`refopt.kernels.cuda.drivers` builds from the rule, with the host
plan of :mod:`refopt.executors.plan` (the same plan and rules as ``backend="cpu"``):

- **Flat state.** At build time each slot (``m``, ``v``, ``vhat``, the EMA ``average``) gets
  *one* flat device buffer per dtype holding every variable's slot back to back (started at
  the optimizer's ``_slot_initial_value``; Keras 3's averages at zero); ``get_slot`` and
  ``variables`` hand out reshaped views of it.
- **Segment table.** The variables and gradients stay the caller's separate allocations.
  They reach the kernel as two tuples of device arrays (numba passes each array's descriptor
  as kernel parameters; the simulator passes the objects), indexed at run time by the tensor
  number found in a small device table (:class:`refopt.kernels.cuda.Segments`: slot offset,
  size, first chunk, decay flag, tail start, active flag, clip mode), built once per set of
  tensors and cached. One launch clips, decays, updates and averages every dense variable of
  a dtype group, for up to ``config.TENSORS_PER_LAUNCH`` (24) tensors per launch; a group is
  one dtype, one step (PyTorch counts steps per variable: one group per distinct count) and,
  for optax's ``adamw``, decay or not (excluded variables get a rule call without it).
  Variables without a gradient (Keras 3's and PyTorch's EMA of every variable) and sparse
  variables after their rows are updated ride along as EMA-only entries.
- **Cost.** CUDA's 4 KiB kernel parameter space holds about 24 pairs of array descriptors,
  so a group of ``n > 24`` tensors takes ``ceil(n / 24)`` launches. The scalars are kernel
  parameters (tuples); per step nothing is copied to the device unless norms clip, then one
  small array of per-tensor clip factors per launch. Norm clipping needs the gradients' sums
  of squares bit for bit as NumPy sums them (the reference's): the leaves of NumPy's
  pairwise tree (at most 128 terms each) are summed on the device, one thread per leaf, and
  only those partial sums (under 1 % of the data) come back to the host, which adds them up
  the same tree (:func:`refopt.kernels.cuda.drivers.sums_of_squares`); under PyTorch's
  formula each gradient's ``torch.linalg.vector_norm`` in PyTorch's order
  (:func:`refopt.kernels.cuda.drivers.torch_norms`: device lanes, host tail).
- **Sparse gradients** (``IndexedSlices``: host ``values`` and ``indices``, copied over each
  step). Lazy optimizers (LazyAdam; SGD under TF1) run the rule's ``rows`` kernel on the
  present rows (duplicates summed after clipping, in order of appearance; SparseAdam's rule
  under PyTorch). Non-lazy ones do what their ``_update_step`` does: tf-keras' whole-table
  updates (the rule drivers' ``table`` kernels, through ``kc.adam_sparse`` /
  ``kc.sgd_sparse``), or the dense update on
  ``to_dense()`` (Keras 3's Adam, PyTorch's and optax's SGD).
- **An optimizer's own kernels**: an optimizer may define ``_cuda_calls(state, positions,
  grads, lr_value, kc)``, asked first by :func:`_prepare`, which checks (raising the
  reference's errors) and returns its launches, or None for the rule drivers / the host
  path below (RowWiseAdagrad: :mod:`refopt.kernels.cuda.rowwise_adagrad`, per-row sums).
- **The host path** (:func:`_host_step`, with one :class:`HostStepWarning` per optimizer and
  reason): what a single fused pass cannot express runs the reference's staged step on host
  copies of the whole state and uploads the results: Keras 2's several clips in sequence,
  TF1's and Keras 2's non-lazy sparse Adam (scatter form), global norm clipping over mixed
  dtypes (TensorFlow raises there: the reference's error), a decay inside the update with a
  sparse gradient (refused by the frameworks: the reference's error), PyTorch's and optax's
  sparse Adam (the reference's TypeError), ``keras3_sparse_square``, LazyAdam with AMSGrad
  under PyTorch (no SparseAdam rule), float16 RMSprop under torch/optax (the reference's
  float16 FMA rounds once, the rule's twice), float16 under torch's for-loop Adam, AdamW,
  SGD, Adagrad and RMSprop (op by op, :func:`refopt.reference.bf16.takes`: the staged step's
  own check) and float16 averaged by torch's ``AveragedModel`` (``takes_average``),
  float16/bfloat16 computed in float32 with
  clipping, the EMA or a sparse gradient (:mod:`refopt.precision`), and
  optimizers without a rule. Same numbers;
  the cost is the state's round trip. ``opt._state.fallbacks`` counts those steps per reason.

Everything that can raise is checked (and every scalar, norm, clip factor and table
computed) before the first launch, so a raising ``apply_gradients`` changes nothing.

float16 variables are computed in float32 and rounded to float16 after every operation
(NumPy's float16 arithmetic, bit for bit), where the convention computes in the dtype.
Where it computes them in float32 (``low_precision_compute="float32"``, and
``"torch_fused"`` for Adam/AdamW: PyTorch's fused kernels), float16 and bfloat16 variables
run on the low-precision ``dense`` kernel (``drivers.kernels(..., low=...)``): the variables,
gradients and flat slot buffers are passed as their uint16 bits, each element loaded exactly
into float32 (:mod:`refopt.kernels.cuda.halfbits`), the rule's float32 call (the plan and
scalars of a float32 variable) applied, and the variable and each slot rounded once to
nearest even; bit for bit the reference's (and torch 2.13's fused Adam, AdamW and SGD on the
golden cases). bfloat16 variables are numba device arrays of ``ml_dtypes.bfloat16``
(``refopt.kernels.cuda.to_device`` of a host bfloat16 array; numba allocates and copies them
as bytes, the kernels see them through ``.view(numpy.uint16)``); their slots are bfloat16
device arrays too. Never run on a real GPU yet.
"""

from __future__ import annotations

import bisect
import copy
import warnings

import numpy as np

from refopt import precision as _precision
from refopt.executors import Executor, staged
from refopt.executors.checks import describe
from refopt.indexed_slices import IndexedSlices

__all__ = ["CudaExecutor", "CudaState", "HostStepWarning"]


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
    """The numba device view of a variable, after checking dtype (float16, bfloat16,
    float32, float64; whether the convention takes bfloat16 is
    :func:`refopt.precision.check_supported`'s) and layout."""
    kc = _kc()
    d = kc.as_device(where, var)
    if np.dtype(d.dtype) not in kc.DTYPES and not _low_kind(d.dtype):
        raise TypeError(
            f"backend='cuda' computes in float16, float32 or float64 (and takes "
            f"ml_dtypes.bfloat16 where the convention computes it in float32). Received: "
            f"{where} with dtype={d.dtype}"
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
        Also keep an ``average`` buffer, initialised with device copies of the variables
        (zeros with ``average_zero``: Keras 3).
    initial : callable or None
        ``initial(name, dtype)``: the value a slot starts with (the optimizer's
        ``_slot_initial_value``; TF1's RMSprop velocity starts at 1). None: zeros.
    average_zero : bool
        Start the averages at zero instead of copies of the variables.

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

    def __init__(self, var_list, slot_names, use_ema, initial=None, average_zero=False,
                 slot_shape=None, slot_dtype=None):
        kc = _kc()
        kc.check_config()
        self.views = [view(v, f"var_list[{i}]") for i, v in enumerate(var_list)]
        # A slot whose shape or dtype differs from its variable's (Adafactor's factored
        # moments, Adam8bit's uint8 codes): separate device arrays, outside the flat buffers
        # (no rule kernel reads it).
        shape_of = slot_shape or (lambda name, shape: shape)
        dtype_of = slot_dtype or (lambda name, shape, dtype: dtype)
        apart = tuple(
            name for name in slot_names
            if any(tuple(shape_of(name, tuple(d.shape))) != tuple(d.shape)
                   or np.dtype(dtype_of(name, tuple(d.shape), np.dtype(d.dtype)))
                   != np.dtype(d.dtype) for d in self.views))
        check_no_overlap(self.views, "var_list")
        self.dtypes = [np.dtype(d.dtype) for d in self.views]
        self.specs = [(tuple(d.shape), dt) for d, dt in zip(self.views, self.dtypes)]
        self.offsets = []
        totals = {}
        for d, dt in zip(self.views, self.dtypes):
            self.offsets.append(totals.get(dt, 0))
            totals[dt] = self.offsets[-1] + d.size
        names = tuple(n for n in slot_names if n not in apart) + (
            ("average",) if use_ema else ())

        def start(name, dt, n):
            value = initial(name, dt) if (initial is not None and name in slot_names) else 0
            return kc.to_device(np.full(max(n, 1), value, dt))

        self.buffers = {dt: {name: start(name, dt, n) for name in names}
                        for dt, n in totals.items()}
        per = {name: [self._view(i, name) for i in range(len(self.views))] for name in names}
        for name in apart:
            per[name] = [
                kc.to_device(np.full(tuple(shape_of(name, tuple(d.shape))),
                                     0 if initial is None else initial(name, sdt), sdt))
                for d, dt in zip(self.views, self.dtypes)
                for sdt in (np.dtype(dtype_of(name, tuple(d.shape), dt)),)]
        self.slots = {name: per[name] for name in slot_names}
        self.averages = per.get("average", [])
        if not average_zero:
            for a, d in zip(self.averages, self.views):
                kc.copy(a, d)
        self._tables = {}
        self.plans = {}  # refopt.executors.plan.plan's cache
        self.fallbacks = {}  # reason -> count of steps computed on the host (tests, reports)
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

    def _cached(self, key, build):
        seg = self._tables.get(key)
        if seg is None:
            if len(self._tables) >= self.MAX_TABLES:
                self._tables.clear()
            seg = self._tables[key] = build()
        return seg

    def segments(self, dtype, positions, decay):
        """The cached :class:`refopt.kernels.cuda.Segments` of these variables."""
        return self._cached((dtype, tuple(positions), tuple(decay)), lambda: _kc().Segments(
            [self.views[i].size for i in positions], [self.offsets[i] for i in positions],
            decay))

    def rule_segments(self, dtype, positions, decay, tails, active, clip):
        """The cached segment table of a rule-driver launch (with tails, active flags and
        clip modes), per launch shape."""
        from refopt.kernels.cuda import config

        key = ("rule", dtype, tuple(positions), tuple(decay), tuple(tails), tuple(active),
               tuple(clip), int(config.THREADS_PER_BLOCK), int(config.ITEMS_PER_THREAD),
               int(config.TENSORS_PER_LAUNCH))
        return self._cached(key, lambda: _kc().Segments(
            [self.views[i].size for i in positions], [self.offsets[i] for i in positions],
            decay, tails=tails, active=active, clip=clip))


def _check_pairs(grads_and_vars):
    """The pairs as ``(gradient as a device array, variable, (shape, dtype))``."""
    from refopt.executors.checks import unpack_pairs

    pairs = unpack_pairs(grads_and_vars)
    seen = set()
    out = []
    for i, (grad, var) in enumerate(pairs):
        d = view(var, f"variable at position {i}")
        if id(var) in seen:
            raise ValueError(f"The same variable appears twice in `grads_and_vars` (position {i}).")
        seen.add(id(var))
        shape, dtype = tuple(d.shape), np.dtype(d.dtype)
        if grad is None:
            out.append((None, var, (shape, dtype)))
            continue
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
            out.append((grad, var, (shape, dtype)))
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
        out.append((g, var, (shape, dtype)))
    return out


# --------------------------------------------------------------------------- the fused step
class HostStepWarning(UserWarning):
    """A ``backend="cuda"`` step was computed on the host by the reference (see
    :func:`_host_step`): same numbers, but the state travels to the host and back."""


class _Fallback(Exception):
    """The rule drivers cannot express this step; the message says why."""


_CAPABLE = {}


def rule_capable(cls):
    """Whether ``cls``'s update has a rule: the class that defines its ``_update_step`` also
    defines ``update_rule`` (a subclass that rewrites the NumPy update of Adam or SGD takes
    the host path with its own ``_update_step``)."""
    if cls not in _CAPABLE:
        owner = next((k for k in cls.__mro__ if "_update_step" in vars(k)), None)
        _CAPABLE[cls] = owner is not None and "update_rule" in vars(owner)
    return _CAPABLE[cls]


class _NoExclusions:
    """``opt`` seen without its weight-decay exclusions (for :func:`refopt.executors.plan.plan`,
    which refuses optax's decay with exclusions: here the excluded tensors get their own rule
    call without the decay)."""

    _exclude_ids = frozenset()

    def __init__(self, opt):
        self._opt = opt

    def __getattr__(self, name):
        return getattr(self._opt, name)


class _Group:
    """The tensors of one dense launch: one dtype, one step (PyTorch counts per variable) and
    one optax weight decay (excluded variables get none)."""

    def __init__(self, dtype, step, owd):
        self.dtype, self.step, self.owd = dtype, step, owd
        self.pos, self.grads, self.ks = [], [], []  # ks: gradient number, None: EMA only


def _clip_host(values, mode, c, d, s):
    """:func:`refopt.rules.steps.clip` on host values (NumPy, one rounding per operation)."""
    with np.errstate(all="ignore"):
        if mode == 1:
            return np.maximum(np.minimum(values, c), -c)
        if mode == 2:
            return (values * c) / d
        if mode == 3:
            return values * s
        if mode == 4:
            return (values / d) * c
        if mode == 5:
            return (values * d) * c
    return values


def _prepare(opt, positions, present_grads, lr_value, kc):
    """The launches of one step, ``(calls, host_reason)``; nothing is written here.

    ``host_reason`` is None for the rule drivers' fused path, else why the step is computed
    on the host (:func:`_host_step`).
    """
    state = opt._state
    # A dense gradient that shares memory with what the kernels write (a variable, a slot) is
    # copied first, so that it is read as it was before the step (the reference's semantics).
    grads = []
    for g in present_grads:
        if not isinstance(g, IndexedSlices) and state.aliases(g):
            dup = kc.cuda.device_array(g.shape, g.dtype)
            kc.copy(dup, g)
            g = dup
        grads.append(g)
    # An optimizer with its own device kernels (``_cuda_calls``: RowWiseAdagrad's per-row
    # reductions, which the rules cannot express) gives its launches, or None: then as any.
    own = getattr(opt, "_cuda_calls", None)
    if own is not None:
        calls = own(state, positions, grads, lr_value, kc)
        if calls is not None:
            return calls, None
    try:
        return _fused(opt, positions, grads, lr_value, kc), None
    except _Fallback as why:
        return _host_step(opt, positions, grads, lr_value, kc), str(why)


def _fused(opt, positions, grads, lr_value, kc):
    """The rule drivers' launches of one step (see the module docstring), or ``_Fallback``."""
    from refopt.kernels.cuda import drivers
    from refopt.executors import plan as _plan
    from refopt.reference._common import scalar
    from refopt.rules import steps as S

    state = opt._state
    conv = opt.convention
    if not rule_capable(type(opt)):
        raise _Fallback(f"{type(opt).__name__} has no rule (update_rule)")
    if opt.use_ema and opt.ema_momentum is None:
        raise _Fallback("the equal-weight average (ema_momentum=None) has no rule")
    from refopt.reference import bf16 as _loop
    from refopt.reference.sqrt import optimizer_takes_mkl_sqrt

    if optimizer_takes_mkl_sqrt(opt, grads):
        raise _Fallback("MKL's sqrt (torch's for-loop path, convention knob sqrt) has no "
                        "device form")
    dtype_of = state.dtypes
    kind, _ = _plan.clip_kind(opt)
    if kind == "several":
        raise _Fallback("Keras 2's several clips in sequence")
    dtypes_present = {dtype_of[i] for i in positions}
    # float16/bfloat16 computed in float32 (refopt.precision: PyTorch's fused kernels): the
    # low-precision dense kernels (uint16 bits loaded exactly into float32, the rule in
    # float32, each stored tensor rounded once), for dense gradients without clipping or EMA
    # (as backend="cpu"); those, and bfloat16 computed in its dtype, take the host step
    low = {dt: _low_kind(dt) for dt in dtypes_present if _low_kind(dt)}
    for dt in low:
        if _precision.compute_dtype(conv, dt, opt) is None:
            if dt != np.float16:  # float16 computed in float16: the ordinary kernels
                raise _Fallback(f"{dt.name} computed in its dtype")
            if any(_loop.takes(opt, dt, sparse=isinstance(g, IndexedSlices))
                   for i, g in zip(positions, grads) if dtype_of[i] == dt):
                raise _Fallback("float16 computed op by op as torch's for-loop "
                                "(refopt.reference.bf16)")
        elif opt.use_ema or kind is not None or any(
                isinstance(g, IndexedSlices) for g in grads):
            raise _Fallback(f"{dt.name} computed in float32 (refopt.precision)")
    if any(_loop.takes_average(opt, dt) for dt in set(dtype_of)):  # every variable's EMA
        raise _Fallback("float16 averaged as torch's AveragedModel (refopt.reference.bf16)")
    low = {dt: k for dt, k in low.items()
           if _precision.compute_dtype(conv, dt, opt) is not None}
    if kind == "global" and len(dtypes_present) > 1:
        # TF: a TypeError (the reference raises it); torch/optax: one norm over mixed dtypes
        raise _Fallback("global norm clipping over gradients of mixed dtypes")
    per_var = conv.step_counter == "per_variable"
    gstep = opt._iterations + 1
    steps = [(opt._var_steps[i] + 1) if per_var else gstep for i in positions]
    wd = opt.weight_decay if opt._weight_decay_acts() else None
    decay_name = opt._decay_mode() if wd is not None else None
    decays = [wd is not None and id(opt._vars[i]) not in opt._exclude_ids for i in positions]
    lazy = opt._is_lazy()
    how = []
    for k, g in enumerate(grads):
        if not isinstance(g, IndexedSlices):
            how.append("dense")
            continue
        if conv.keras3_sparse_square and opt._raw_slices_matter:
            raise _Fallback("keras3_sparse_square with a sparse gradient")
        if decays[k] and decay_name in ("l2", "optax"):
            raise _Fallback("a decay inside the update with a sparse gradient (refused)")
        if decays[k] and decay_name == "tfa" and not lazy:
            raise _Fallback("TF-Addons' decay of the present rows only (host step)")
        sk = "rows" if lazy else opt._sparse_update_kind()
        if sk is None:
            raise _Fallback(f"a non-lazy sparse gradient of {type(opt).__name__} under "
                            f"convention={conv.name!r}")
        how.append(sk)
    _validate(opt, positions, how, steps, decays, decay_name, lr_value)

    # Sums of squares for norm clipping: NumPy's pairwise sums, bit for bit (device leaves,
    # host tree for dense gradients; NumPy itself for the host values of IndexedSlices).
    # Under PyTorch's formula: each gradient's torch.linalg.vector_norm in PyTorch's order
    # (device lanes, host tail; float16 and IndexedSlices values on the host).
    sums = [None] * len(grads)
    gnorm = None
    by_torch = conv.clip_formula == "torch"
    if kind in ("norm", "global") and by_torch:
        from refopt.reference.reductions import torch_vector_norm

        for dt in dtypes_present:
            ks = [k for k, i in enumerate(positions) if dtype_of[i] == dt]
            on_device = [k for k in ks if how[k] == "dense" and dt != np.float16]
            device_set = set(on_device)
            if on_device:
                for k, s in zip(on_device,
                                drivers.torch_norms([grads[k] for k in on_device], dt)):
                    sums[k] = s
            for k in ks:
                if k not in device_set:
                    g = grads[k]
                    sums[k] = torch_vector_norm(g.values if isinstance(g, IndexedSlices)
                                                else g.copy_to_host())
    elif kind in ("norm", "global"):
        half = kind == "global" and conv.clip_formula == "tf"  # TF's l2_loss halves
        for dt in dtypes_present:
            ks = [k for k, i in enumerate(positions) if dtype_of[i] == dt]
            dense_ks = [k for k in ks if how[k] == "dense"]
            for k, s in zip(dense_ks, drivers.sums_of_squares([grads[k] for k in dense_ks], dt,
                                                              half=half)):
                sums[k] = s
            with np.errstate(all="ignore"):
                for k in ks:
                    if isinstance(grads[k], IndexedSlices):
                        v = np.ascontiguousarray(grads[k].values)
                        sums[k] = (dt.type(np.sum(v * v * scalar(dt, 0.5), dtype=dt)) if half
                                   else np.sum(v * v, dtype=dt))
        if half:
            dt = next(iter(dtypes_present))
            with np.errstate(all="ignore"):
                h = np.sum(np.asarray(sums, dtype=dt), dtype=dt)
                gnorm = np.sqrt(h * scalar(dt, 2.0))

    # Clip mode, denominator and scale per gradient (global clipping over all of them).
    cm, cd, cs = [0] * len(grads), [1] * len(grads), [1] * len(grads)
    cvs = {}
    for dt in dtypes_present:
        ks = [k for k, i in enumerate(positions) if dtype_of[i] == dt]
        sub = [sums[k] for k in ks] if kind in ("norm", "global") else None
        if by_torch:  # sub: the norms
            cmode, cden, cscale, cv = _plan.clip_arrays(opt, dt, len(ks), norms=sub)
        else:
            cmode, cden, cscale, cv = _plan.clip_arrays(opt, dt, len(ks), sub, gnorm)
        cvs[dt] = cv
        for j, k in enumerate(ks):
            cm[k], cd[k], cs[k] = int(cmode[j]), cden[j], cscale[j]

    # Groups of the dense launches; sparse gradients: their own launches first.
    planner = _NoExclusions(opt) if decay_name == "optax" else opt
    groups = {}

    def group(dt, step, owd):
        grp = groups.get((dt, step, owd))
        if grp is None:
            grp = groups[(dt, step, owd)] = _Group(dt, step, owd)
        return grp

    sparse_calls = []
    for k, (i, g) in enumerate(zip(positions, grads)):
        owd = wd if (decay_name == "optax" and decays[k]) else None
        grp = group(dtype_of[i], steps[k], owd)
        if how[k] == "densify":
            vals = _clip_host(g.values, cm[k], cvs[dtype_of[i]], cd[k], cs[k])
            dense = IndexedSlices(vals, g.indices, g.dense_shape).deduplicate().to_dense()
            g = kc.to_device(np.ascontiguousarray(dense))
            cm[k] = 0  # clipped on the host
        if how[k] in ("dense", "densify"):
            grp.pos.append(i)
            grp.grads.append(g)
            grp.ks.append(k)
            continue
        sparse_calls.append((k, i, g, grp))
        if opt.use_ema:  # the EMA covers every row: an EMA-only entry, after the rows
            grp.pos.append(i)
            grp.grads.append(None)
            grp.ks.append(None)
    if opt.use_ema and conv.ema in ("keras3", "torch"):  # every built variable is averaged
        here = set(positions)
        for i in range(len(opt._vars)):
            if i not in here:
                dt = dtype_of[i]
                grp = next((gr for (d, _, _), gr in groups.items() if d == dt), None)
                if grp is None:
                    grp = group(dt, gstep, None)
                grp.pos.append(i)
                grp.grads.append(None)
                grp.ks.append(None)

    slot_names = set(opt._slot_names())
    for grp in groups.values():
        cdt = _FLOAT32 if grp.dtype in low else grp.dtype  # the compute dtype
        pl = _plan.plan(planner, cdt, lr_value, grp.step, 0)
        if pl is None:
            raise _Fallback("a step the fused plan cannot express")
        pl.psc[S.P_CLIP] = cdt.type(0) if grp.dtype in low else cvs.get(grp.dtype,
                                                                         cdt.type(0))
        grp.plan = pl  # the sparse members' decay reads it too
        if not grp.pos:
            continue
        rc = opt._rule(cdt, lr_value, grp.step, optax_weight_decay=grp.owd)
        if rc is None or "cuda" not in rc.rule.targets or set(rc.rule.slots) != slot_names:
            raise _Fallback(f"{type(opt).__name__} has no rule for this step")
        grp.rc = rc

    tpb = kc._launch._tpb()
    calls = []
    for k, i, g, grp in sparse_calls:
        d = state.views[i]
        dt = dtype_of[i]
        pl = grp.plan
        if how[k] == "rows":
            rc = opt._rule(dt, lr_value, steps[k], lazy_rows=True,
                           row_width=int(np.prod(tuple(d.shape)[1:])))
            if rc is None or "cuda" not in rc.rule.targets or rc.tail_lanes \
                    or not set(rc.rule.slots) <= slot_names:
                raise _Fallback(f"{type(opt).__name__} has no row rule for this step")
            if d.size == 0 or np.size(g.indices) == 0:
                continue
            ks_ = drivers.kernels(rc.rule, rc.fl, pl.dmode, 0, tpb, dt)
            rows = d.shape[0]
            width = d.size // rows
            _, vals, order, starts, urows = kc._launch._table_inputs(d, g.values, g.indices)
            P = d.reshape(rows, width)
            tables = [state.slots[name][i].reshape(rows, width) for name in rc.rule.slots]
            calls.append((drivers.launch_rows, (ks_, P, tables, vals, order, starts, urows,
                                                cm[k], cd[k], cs[k],
                                                pl.dmode if decays[k] else 0, pl.psc, rc.sc),
                          {}))
            continue
        # tf-keras' whole-table sparse updates (the hand-written kernels), values clipped here
        if decays[k] and pl.dmode != 1:
            raise _Fallback("a whole-table sparse update with this weight decay")
        vals = _clip_host(g.values, cm[k], cvs[dt], cd[k], cs[k])
        width = d.size // d.shape[0] if d.size else 1
        vals = (np.ascontiguousarray(vals).reshape(vals.shape[0], width)
                if vals.shape[0] and d.size else np.zeros((0, 1), dt))
        kw = dict(learning_rate=lr_value, weight_decay=wd if decays[k] else None)
        if how[k] == "adam_table":
            vh = state.slots["vhat"][i] if "vhat" in slot_names else None
            calls.append((kc.adam_sparse, (d, state.slots["m"][i], state.slots["v"][i], vh,
                                           vals, g.indices),
                          dict(step=steps[k], beta_1=opt.beta_1, beta_2=opt.beta_2,
                               epsilon=opt.epsilon, **kw)))
        else:
            calls.append((kc.sgd_sparse, (d, state.slots["m"][i], vals, g.indices),
                          dict(momentum=opt.momentum, nesterov=opt.nesterov, **kw)))

    for grp in groups.values():
        if not grp.pos:
            continue
        dt, pl, rc = grp.dtype, grp.plan, grp.rc
        lanes = rc.tail_lanes
        sizes = [state.views[i].size for i in grp.pos]
        tails = [n - n % lanes if lanes else n for n in sizes]
        active = [k is not None for k in grp.ks]
        dec = [k is not None and decays[k] for k in grp.ks]
        cmodes = [cm[k] if k is not None else 0 for k in grp.ks]
        segs = state.rule_segments(dt, grp.pos, dec, tails, active, cmodes)
        if dt in low:  # the bits, the rule in float32 (no clip, no EMA: checked above)
            ks_ = drivers.kernels(rc.rule, rc.fl, pl.dmode, 0, segs.tpb, _FLOAT32,
                                  items=segs.items, low=low[dt])
            params = [_bits(state.views[i]) for i in grp.pos]
            gs = [_bits(g) for g in grp.grads]
            slots = [_bits(state.buffers[dt][name]) for name in rc.rule.slots]
            calls.append((drivers.launch_dense, (ks_, segs, segs.clip_pairs(_FLOAT32), params,
                                                 gs, slots, slots[0] if slots else params[0],
                                                 False, pl.psc, rc.sc), {}))
            continue
        if kind in ("norm", "global"):
            clips = segs.clip_pairs(dt, [cd[k] if k is not None else 1 for k in grp.ks],
                                    [cs[k] if k is not None else 1 for k in grp.ks])
        else:
            clips = segs.clip_pairs(dt)
        ks_ = drivers.kernels(rc.rule, rc.fl, pl.dmode, pl.emode, segs.tpb, dt,
                              items=segs.items)
        params = [state.views[i] for i in grp.pos]
        gs = [g if g is not None else state.views[i] for i, g in zip(grp.pos, grp.grads)]
        buf = state.buffers[dt]
        slots = [buf[name] for name in rc.rule.slots]
        calls.append((drivers.launch_dense, (ks_, segs, clips, params, gs, slots,
                                             # without EMA a 1-d placeholder, never read
                                             # (a slot-less rule has no slot to lend)
                                             buf.get("average", slots[0] if slots
                                                     else params[0].ravel()), pl.overwrite,
                                             pl.psc, rc.sc), {}))
    return calls


_FLOAT32 = np.dtype(np.float32)


def _low_kind(dtype):
    """The :mod:`refopt.kernels.cuda.halfbits` format of a float16/bfloat16 dtype, else 0."""
    from refopt.kernels.cpu.halfbits import kind_of

    return kind_of(dtype)


def _bits(d):
    """The uint16 view (same device memory) of a float16/bfloat16 device array, flattened."""
    return d.reshape(d.size).view(np.uint16)


def _reference_clone(opt):
    """A shallow copy of ``opt`` that computes with the reference (no device state)."""
    from refopt import reference

    from refopt.executors import get_executor

    clone = copy.copy(opt)
    clone._executor = get_executor("reference")
    clone._kernels = reference
    clone._state = None
    return clone


def _validate(opt, positions, how, steps, decays, decay_name, lr_value):
    """Raise what the reference would for a hyperparameter changed to an invalid value.

    The scalars are rounded on the host when the launches are prepared; running the
    reference's own update (``_update_step`` with the reference's functions), weight decay
    and EMA on one-element arrays of each dtype of the step first raises the reference's
    exceptions, with its messages, before anything is launched.
    """
    from refopt import reference as R
    from refopt.reference import variants as V

    clone = _reference_clone(opt)
    dtype_of = opt._state.dtypes
    seen = set()
    with np.errstate(all="ignore"):
        for k, i in enumerate(positions):
            dt = dtype_of[i]
            lazy = how[k] == "rows"
            inside = decays[k] and decay_name in ("l2", "optax")
            key = (dt, steps[k], lazy, inside, decays[k])
            if key in seen:
                continue
            seen.add(key)
            z = np.zeros(1, dt)
            p = staged.decay(clone, z, lr_value) if decays[k] else z
            slots = {name: np.zeros(1, dt) for name in opt._slot_names()}
            extra = {}
            if inside:
                extra["weight_decay"] = opt.weight_decay
            if lazy:
                extra["lazy_rows"] = True
            clone._update_step(p, z, slots, lr_value, steps[k], **extra)
        if opt.use_ema:
            for dt in {dtype_of[i] for i in positions}:
                z = np.zeros(1, dt)
                if opt.convention.ema == "copy":
                    R.ema_update(z, z, ema_momentum=opt.ema_momentum)
                else:
                    V.ema_variant(z, z, ema_momentum=opt.ema_momentum,
                                  first_step=opt._iterations == 0, convention=opt.convention,
                                  num_averaged=opt._iterations)


# --------------------------------------------------------------------------- the host path
def _to_host(d):
    return d.copy_to_host() if d.size else np.zeros(d.shape, d.dtype)


def _upload(dst, host):
    """``dst[...] = host`` (cast as ``np.copyto`` casts), host to device."""
    if dst.size == 0:
        return
    kc = _kc()
    with np.errstate(all="ignore"):
        src = np.ascontiguousarray(np.asarray(host).astype(np.dtype(dst.dtype), copy=False))
    kc.copy(dst, kc.to_device(src.reshape(dst.shape)))


def _host_step(opt, positions, grads, lr_value, kc):
    """A step the rule drivers cannot express, computed on the host by the reference.

    Copies every variable, slot and average to the host, runs the reference's staged step
    (:func:`refopt.executors.staged.compute` on a clone of ``opt`` that computes with
    :mod:`refopt.reference`), and returns the uploads of what it changed (run after it
    returned: a step that raises changes nothing). The same numbers as
    ``backend="reference"``; the cost is the round trip of the whole state. Taken for:
    Keras 2's several clips in sequence, TF1's and Keras 2's non-lazy sparse Adam (scatter
    form), global norm clipping over mixed dtypes (where TF raises), a decay inside the
    update with a sparse gradient (the frameworks refuse: the reference's error),
    ``keras3_sparse_square``, an optimizer or a step without a rule (``update_rule`` returns
    None), lazy rows of a rule with a scalar tail.
    """
    state = opt._state
    n = len(opt._vars)
    hv = [_to_host(d) for d in state.views]
    hslots = {name: [_to_host(a) for a in opt._slots[name]] for name in opt._slot_names()}
    havg = [_to_host(a) for a in opt._averages]
    clone = _reference_clone(opt)
    clone._vars = hv
    clone._index = {id(h): i for i, h in enumerate(hv)}
    clone._slots = hslots
    clone._averages = havg
    clone._var_steps = list(opt._var_steps)
    clone._exclude_ids = {id(hv[i]) for i in range(n) if id(opt._vars[i]) in opt._exclude_ids}
    pairs = [(g if isinstance(g, IndexedSlices) else _to_host(g), hv[i])
             for g, i in zip(grads, positions)]
    with np.errstate(all="ignore"):
        new_values = staged.compute(clone, pairs, lr_value)
    calls = []
    for key, (param, slots, average, rows) in new_values.items():
        i = clone._index[key]
        if average is not None:
            calls.append((_upload, (opt._averages[i], average), {}))
        if rows is not None:  # lazy: only these rows were computed
            full = hv[i].copy()
            full[rows] = param
            param = full
            expanded = {}
            for name, arr in slots.items():
                expanded[name] = hslots[name][i].copy()
                expanded[name][rows] = arr
            slots = expanded
        calls.append((_upload, (state.views[i], param), {}))
        for name, arr in slots.items():
            calls.append((_upload, (opt._slots[name][i], arr), {}))
    return calls


def _note_fallback(opt, reason):
    counts = opt._state.fallbacks
    if reason not in counts:
        warnings.warn(
            f"backend='cuda': {reason}; this step was computed on the host by the reference "
            "(the same numbers; the state is copied to the host and back).",
            HostStepWarning, stacklevel=5)
    counts[reason] = counts.get(reason, 0) + 1


class CudaExecutor(Executor):
    """numba-cuda: device state (:class:`CudaState`), the rule drivers' launches, the staged
    step on host copies (:func:`_host_step`) for what one fused pass cannot express."""

    name = "cuda"

    def __init__(self):
        try:
            from refopt.kernels import cuda
        except ImportError as exc:
            raise RuntimeError(
                "backend='cuda' needs the numba-cuda package (pip install 'refopt[cuda]') and "
                f"an NVIDIA GPU. Use backend='cpu' or 'reference'. ({exc})"
            ) from None
        self.kernels = cuda

    def require_device(self):
        self.kernels.require_device()

    def check_var_list(self, var_list, what):
        var_list = check_var_list(var_list, what)
        var_list = list(var_list)
        seen = set()
        for i, var in enumerate(var_list):
            view(var, f"{what}[{i}]")
            if id(var) in seen:
                raise ValueError(
                    f"`{what}` lists the same variable twice (position {i}, {describe(var)}).")
            seen.add(id(var))
        return var_list

    def check_pairs(self, grads_and_vars):
        return _check_pairs(grads_and_vars)

    def allocate(self, opt, var_list):
        return CudaState(var_list, opt._slot_names(), opt.use_ema,
                         lambda name, dt: _precision.slot_initial_value(opt, name, dt),  # bf16
                         average_zero=opt.convention.ema == "keras3", slot_shape=opt.slot_shape,
                         slot_dtype=opt.slot_dtype)

    def run_step(self, opt, positions, grads, lr_value):
        kc = _kc()
        kc.check_config()
        calls, host_reason = _prepare(opt, positions, grads, lr_value, kc)
        for fn, args, kwargs in calls:  # nothing can fail from here on
            fn(*args, **kwargs)
        if host_reason is not None:
            _note_fallback(opt, host_reason)

    def finalize(self, opt, positions):
        for i in positions:
            _kc().copy(opt._state.views[i], opt._state.averages[i])

    def checkpoint_arrays(self, variables):
        check_var_list(variables, "variables")  # not one device array
        _kc().check_config()
        if isinstance(variables, np.ndarray) or variables is None:
            raise TypeError(
                "`variables` must be a list of the optimizer's variables (device arrays), in "
                f"a fixed order. Received: {type(variables).__name__}")
        variables = list(variables)
        arrays = [view(v, f"`variables[{i}]`") for i, v in enumerate(variables)]
        if len({id(v) for v in variables}) != len(variables):
            raise ValueError("`variables` lists the same array twice.")
        check_no_overlap(arrays, "variables")
        return variables, arrays
