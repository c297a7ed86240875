"""Host launchers of the CUDA kernels: in place on device arrays, one place for launch shapes.

Every kernel is built from a rule by :mod:`refopt.kernels.cuda.drivers` (no hand-written
kernel is left): Adam and SGD in tf-keras' form (:mod:`refopt.rules.adam`,
:mod:`refopt.rules.sgd`, their whole-table sparse rules for :func:`adam_sparse` and
:func:`sgd_sparse`), the pipeline's clip, decay and EMA steps as rules
(:mod:`refopt.rules.steps`) for :func:`clip_dense`, :func:`decay_dense`, :func:`ema_dense`
and :func:`copy`, NumPy's pairwise sums of squares for :func:`sumsq`. Every scalar is
computed on the host by the reference's helpers (:func:`refopt.reference.adam_scalars`,
``lr_cast``, ``tf_cast``, ``scalar``) and passed rounded to the array dtype. float16, float32
and float64.

Multi-tensor launches (:func:`adam_multi`, :func:`sgd_multi`): the variables and gradients are
the caller's separate device arrays, passed to the kernel as tuples of arrays (numba flattens
each array argument into its descriptor, 56 bytes for a 1-d array); the slots are one flat
buffer per slot; a :class:`Segments` table says where each tensor's slots start, how many
elements it has, its first chunk and whether it decays. CUDA's kernel parameter space is
4 KiB, so one launch takes at most ``config.TENSORS_PER_LAUNCH`` (24) tensors: a dtype group of
up to 24 dense tensors is one launch, a larger one ``ceil(n / 24)`` launches.
"""

from __future__ import annotations

import copy as _copy
import numbers

import numpy as np

try:
    from numba import cuda
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "backend='cuda' needs the numba-cuda package: pip install 'refopt[cuda]' "
        f"(import failed: {exc})"
    ) from exc

from refopt.kernels.cuda import config
from refopt.reference._common import lr_cast, scalar, tf_cast

__all__ = [
    "DTYPES", "Segments", "adam_dense", "adam_multi", "adam_sparse", "as_device",
    "check_config", "clip_dense", "copy", "decay_dense", "ema_dense", "is_device_array",
    "lazy_adam_rows", "require_device", "sgd_dense", "sgd_multi", "sgd_sparse", "simulator",
    "sumsq", "to_device",
]

#: The dtypes the CUDA kernels compute in (float16 through float32, rounded after each
#: operation: see :func:`refopt.rules.ops.register_cuda`).
DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: Whether numba runs CUDA code in its simulator (``NUMBA_ENABLE_CUDASIM=1``).
simulator = hasattr(cuda, "FakeCUDAKernel")

#: Columns of the int64 segment table of the multi-tensor kernels (:class:`Segments`), one
#: row per tensor: its offset in the flat slot buffers, its element count, its first chunk,
#: whether it decays, where its scalar tail starts (``tail=True`` from there on), whether it
#: has a gradient (else only its EMA is updated) and its clip mode
#: (:func:`refopt.rules.steps.clip`).
SEG_OFFSET, SEG_SIZE, SEG_CHUNK, SEG_DECAY, SEG_TAIL, SEG_ACTIVE, SEG_CLIP = range(7)
SEG_COLUMNS = 7

to_device = cuda.to_device


def require_device():
    """Raise one clear ``RuntimeError`` unless a CUDA GPU or the simulator is usable."""
    ok = False
    try:
        ok = bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver trouble reads as "no device"
        ok = False
    if not ok:
        raise RuntimeError(
            "backend='cuda' needs an NVIDIA GPU with a working driver (numba.cuda."
            "is_available() is False), or numba's CUDA simulator (set NUMBA_ENABLE_CUDASIM=1 "
            "before numba is imported; slow, for tests). Use backend='cpu' or 'reference'."
        )


#: Upper bounds of the launch shape: CUDA's 1024 threads per block; 32 tensors per launch
#: keep the multi-tensor kernels' parameters within 4 KiB (24 take 3137 bytes, each more 112:
#: ``python -m refopt.kernels.cuda.ptx`` measures it); 2**31 - 1 blocks in x.
_LIMITS = {"THREADS_PER_BLOCK": 1024, "ITEMS_PER_THREAD": 1 << 16, "TENSORS_PER_LAUNCH": 32,
           "MAX_BLOCKS": (1 << 31) - 1}


def _config_int(name):
    value = getattr(config, name)
    if (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
            or not 1 <= value <= _LIMITS[name]):
        raise ValueError(
            f"config.{name} must be an int in [1, {_LIMITS[name]}]. Received: {value!r}")
    return int(value)


def check_config():
    """Raise ``ValueError`` naming the first invalid value of :mod:`refopt.kernels.cuda.config`.

    Every launcher and the optimizers (before building or launching anything) call it, so that
    a bad launch shape fails a step without changing anything.

    Raises
    ------
    ValueError
        If a value is not an integer in its range (``THREADS_PER_BLOCK`` a power of two up to
        1024, ``TENSORS_PER_LAUNCH`` up to 32).
    """
    _tpb()
    for name in ("ITEMS_PER_THREAD", "TENSORS_PER_LAUNCH", "MAX_BLOCKS"):
        _config_int(name)


def _tpb():
    tpb = _config_int("THREADS_PER_BLOCK")
    if tpb & (tpb - 1):
        raise ValueError(
            f"config.THREADS_PER_BLOCK must be a power of two. Received: {tpb!r}")
    return tpb


def is_device_array(a):
    """Whether ``a`` is a numba device array (or the simulator's).

    Parameters
    ----------
    a : object

    Returns
    -------
    bool
    """
    if simulator:
        from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

        return isinstance(a, FakeCUDAArray)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return isinstance(a, DeviceNDArray)


def as_device(name, a):
    """A numba device array viewing ``a`` (no copy), or a ``TypeError`` naming ``name``.

    Accepts numba device arrays and objects with ``__cuda_array_interface__`` (CuPy arrays,
    PyTorch CUDA tensors). A host ``numpy.ndarray`` is refused with the helper to move it.

    Parameters
    ----------
    name : str
        How to name ``a`` in an error message.
    a : device array or object with ``__cuda_array_interface__``

    Returns
    -------
    numba device array
        A view of the same device memory.

    Raises
    ------
    TypeError
        For a host ndarray (naming ``to_device``) or any other object.
    """
    if isinstance(a, np.ndarray):
        raise TypeError(
            f"{name} is a host numpy.ndarray, but backend='cuda' keeps variables and "
            "gradients on the GPU. Move it with refopt.kernels.cuda.to_device(a) (that is "
            "numba.cuda.to_device), or pass a CuPy array / PyTorch CUDA tensor, and keep "
            "that device array as the variable."
        )
    if is_device_array(a):
        return a
    if hasattr(a, "__cuda_array_interface__") and hasattr(cuda, "as_cuda_array"):
        return cuda.as_cuda_array(a)
    raise TypeError(
        f"{name} must be a device array (numba device array, or an object with "
        f"__cuda_array_interface__ such as a CuPy array or a PyTorch CUDA tensor). "
        f"Received: {type(a).__name__}"
    )


def _grid(n, tpb):
    # Python ints only: a GPU launch refuses NumPy integers (the simulator does not).
    return max(1, min(_config_int("MAX_BLOCKS"), -(-int(n) // tpb))), tpb


def _flat(a):
    return a.reshape(a.size)


def zeros_like(a):
    """A zeroed device array of ``a``'s shape and dtype."""
    return cuda.to_device(np.zeros(a.shape, a.dtype))


def _drivers():
    from refopt.kernels.cuda import drivers

    return drivers


def _step(dst, src, rule, mode, **values):
    """A step rule of :mod:`refopt.rules.steps` on flat views, one launch of its dense
    kernel: ``dst = clip(src)``, ``dst = decay(dst)`` or ``dst = ema(dst, src)``."""
    from refopt.rules.steps import step_call

    drivers = _drivers()
    call = step_call(rule, np.dtype(dst.dtype), mode, **values)
    drivers.launch_one(call, _flat(dst), _flat(src), [])


def copy(dst, src):
    """``dst[...] = src`` on the device (same shape and dtype, C-contiguous): a
    device-to-device copy (no kernel).

    Parameters
    ----------
    dst : numba device array of float16, bfloat16 (ml_dtypes), float32 or float64,
        C-contiguous
    src : device array (or object with ``__cuda_array_interface__``) of ``dst``'s shape
        and dtype, C-contiguous.
    """
    if dst.size == 0:
        return
    if not is_device_array(src):
        src = cuda.as_cuda_array(src)
    dst, src = _flat(dst), _flat(src)
    if np.dtype(dst.dtype).kind == "V":  # bfloat16: its bits (numba knows no bfloat16)
        dst, src = dst.view(np.uint16), src.view(np.uint16)
    dst.copy_to_device(src)


def clip_args(dtype, mode, clip=None, cden=None, gscale=None):
    """The clip arguments of the fused kernels, rounded to ``dtype``.

    ``mode`` 0: none; 1: by value ``clip``; 2: by norm ``clip`` with divisor ``cden``
    (``maximum(norm, c)``); 3: global norm, multiply by ``gscale``.
    """
    t = dtype.type
    cv = scalar(dtype, clip) if mode in (1, 2) else t(0)
    return (mode, cv, t(1) if cden is None else t(cden), t(1) if gscale is None else t(gscale))


def sumsq(g, half=False):
    """``sum(g * g [* 0.5])`` of a device array, bit for bit as NumPy sums it.

    ``np.sum(g * g, dtype=g.dtype)`` (``g * g * 0.5`` when ``half``): each square rounded to
    ``g``'s dtype, NumPy's pairwise summation tree (leaves on the device, the tree on the
    host: :func:`refopt.kernels.cuda.drivers.sums_of_squares`). Deterministic.

    Parameters
    ----------
    g : numba device array of float16, float32 or float64, C-contiguous, any shape
    half : bool
        Multiply each square by 0.5 (TensorFlow's ``l2_loss``).

    Returns
    -------
    numpy scalar of ``g``'s dtype
    """
    dtype = np.dtype(g.dtype)
    check_config()
    if g.size == 0:
        return dtype.type(0)
    return _drivers().sums_of_squares([g], dtype, half=bool(half))[0]


def clip_dense(out, g, mode, clip=None, cden=None, gscale=None):
    """``out = clip(g)`` (mode as :func:`clip_args`), elementwise as the reference.

    Parameters
    ----------
    out, g : numba device array of float16, float32 or float64, C-contiguous, same shape and dtype
    mode : int
        0 none, 1 by value, 2 by norm, 3 global scale (see :func:`clip_args`).
    clip, cden, gscale : float or None
        The threshold, the norm divisor ``maximum(norm, clip)``, the global scale.
    """
    from refopt.rules.steps import CLIP

    if g.size == 0:
        return
    mode, cv, d, s = clip_args(np.dtype(g.dtype), mode, clip, cden, gscale)
    _step(out, g, CLIP, mode, clip=cv, d=d, s=s)


def decay_dense(out, p, *, learning_rate, weight_decay):
    """``out = p - p * wd * lr`` (:func:`refopt.reference.apply_weight_decay`).

    Parameters
    ----------
    out, p : numba device array of float16, float32 or float64, C-contiguous, same shape and dtype
    learning_rate, weight_decay : float
        Rounded as the reference rounds them (``lr`` through float32, ``wd`` as ``tf.cast``).
    """
    from refopt.rules.steps import DECAY

    if p.size == 0:
        return
    dt = np.dtype(p.dtype)
    wd, lr = tf_cast(dt, weight_decay), lr_cast(dt, learning_rate)
    if out is not p:
        copy(out, p)
    _step(out, out, DECAY, 1, wd=wd, lr=lr)


def ema_dense(average, p, *, ema_momentum, overwrite=False):
    """``average = mu * average + (1 - mu) * p`` in place; then ``p = average`` if asked.

    Parameters
    ----------
    average, p : numba device array of float16, float32 or float64
        C-contiguous, same shape and dtype.
    ema_momentum : float
        ``mu`` in [0, 1].
    overwrite : bool
        Then write the new average into ``p``.
    """
    from refopt.rules.steps import EMA

    if p.size == 0:
        return
    dt = np.dtype(p.dtype)
    _step(average, p, EMA, 1, mu=scalar(dt, ema_momentum), omu=scalar(dt, 1 - ema_momentum))
    if overwrite:
        copy(p, average)


def _pipeline(dt, weight_decay, learning_rate, average, ema_momentum, cv=None):
    """``(psc, dmode, emode)``: the pipeline's scalars of a launch of the fused kernels
    (Keras' decoupled decay, tf-keras' EMA), as the reference rounds them."""
    from refopt.rules import steps as S

    psc = np.zeros(S.N_PSC, dt)
    if cv is not None:
        psc[S.P_CLIP] = cv
    dmode = emode = 0
    if weight_decay is not None:
        dmode = 1
        psc[S.P_WD] = tf_cast(dt, weight_decay)
        psc[S.P_LR] = lr_cast(dt, learning_rate)
    if average is not None and ema_momentum is not None:
        emode = 1
        psc[S.P_MU] = scalar(dt, ema_momentum)
        psc[S.P_OMU] = scalar(dt, 1 - ema_momentum)
    return psc, dmode, emode


class Segments:
    """The segment tables of a group of same-dtype tensors for the multi-tensor kernels.

    Built once per group (the optimizers cache it per set of variables present in a step)
    and reused every step: the tables live on the device.

    Parameters
    ----------
    sizes : sequence of int
        Element count of each tensor. Empty tensors are left out of the launches.
    offsets : sequence of int
        Where each tensor's slots start in the flat slot buffers.
    decay : sequence of bool
        Whether each tensor gets the weight decay.
    tails, active, clip : sequences of int, optional
        Read by the rule drivers only (:mod:`refopt.kernels.cuda.drivers`): where each
        tensor's scalar tail starts (default: its size, no tail), whether it has a gradient
        (default 1; 0: only its EMA is updated) and its clip mode (default 0).

    Attributes
    ----------
    launches : list of (members, table, nchunks)
        One entry per launch: the tensors' positions in ``sizes`` (at most
        ``config.TENSORS_PER_LAUNCH``), the device int64 table ``(len(members), 7)`` (columns
        ``SEG_*``: slot offset, size, first chunk, decay flag, tail start, active flag, clip
        mode) and the number of chunks of ``THREADS_PER_BLOCK * ITEMS_PER_THREAD`` elements
        the launch covers.

    Raises
    ------
    ValueError
        If the sequences differ in length, or ``config.TENSORS_PER_LAUNCH`` < 1.
    """

    def __init__(self, sizes, offsets, decay, tails=None, active=None, clip=None):
        tails = list(sizes) if tails is None else list(tails)
        active = [1] * len(sizes) if active is None else list(active)
        clip = [0] * len(sizes) if clip is None else list(clip)
        if not (len(sizes) == len(offsets) == len(decay) == len(tails) == len(active)
                == len(clip)):
            raise ValueError(
                f"sizes, offsets and decay must have one entry per tensor. Received lengths "
                f"{len(sizes)}, {len(offsets)}, {len(decay)}")
        width = int(config.TENSORS_PER_LAUNCH)
        if width < 1:
            raise ValueError(f"config.TENSORS_PER_LAUNCH must be >= 1. Received: {width}")
        check_config()
        self.tpb = _tpb()
        self.items = int(config.ITEMS_PER_THREAD)
        self.chunk = self.tpb * self.items
        self.width = width
        self.count = len(sizes)
        self._ones = {}
        self._host = []  # the host tables (for with_clip)
        keep = [k for k in range(len(sizes)) if int(sizes[k]) > 0]
        self.launches = []
        for lo in range(0, len(keep), width):
            members = keep[lo:lo + width]
            table = np.zeros((len(members), SEG_COLUMNS), np.int64)
            first = 0
            for r, k in enumerate(members):
                table[r, SEG_OFFSET] = int(offsets[k])
                table[r, SEG_SIZE] = int(sizes[k])
                table[r, SEG_CHUNK] = first
                table[r, SEG_DECAY] = bool(decay[k])
                table[r, SEG_TAIL] = int(tails[k])
                table[r, SEG_ACTIVE] = bool(active[k])
                table[r, SEG_CLIP] = int(clip[k])
                first += -(-int(sizes[k]) // self.chunk)
            self._host.append(table)
            self.launches.append((members, cuda.to_device(table), first))

    def with_clip(self, mode):
        """These segments with every tensor's clip mode ``mode`` (a copy with its own device
        tables, cached; ``self`` when every mode already is ``mode``)."""
        mode = int(mode)
        if all((t[:, SEG_CLIP] == mode).all() for t in self._host):
            return self
        key = ("clip", mode)
        if key not in self._ones:
            other = _copy.copy(self)
            other._ones = {}
            other._host = [t.copy() for t in self._host]
            for t in other._host:
                t[:, SEG_CLIP] = mode
            other.launches = [(members, cuda.to_device(t), nchunks) for (members, _, nchunks), t
                              in zip(self.launches, other._host)]
            self._ones[key] = other
        return self._ones[key]

    def scales(self, dtype, values=None):
        """The per-tensor clip factors on the device, one array per launch.

        Parameters
        ----------
        dtype : numpy dtype (float16, float32 or float64)
        values : array_like of float, shape ``(len(sizes),)``, or None
            Per tensor: the norm divisor ``maximum(norm, clip)`` (clip mode 2) or the global
            scale (mode 3), rounded to ``dtype``. None: ones.

        Returns
        -------
        list of numba device array of ``dtype``
        """
        dtype = np.dtype(dtype)
        with np.errstate(all="ignore"):
            values = (np.ones(self.count, dtype) if values is None
                      else np.asarray(values).astype(dtype))
        return [cuda.to_device(np.ascontiguousarray(values[members]))
                for members, _, _ in self.launches]

    def ones(self, dtype):
        """:meth:`scales` of ones (no per-tensor clip factor), cached per dtype."""
        dtype = np.dtype(dtype)
        if dtype not in self._ones:
            self._ones[dtype] = self.scales(dtype)
        return self._ones[dtype]

    def clip_pairs(self, dtype, cden=None, cscale=None):
        """Per launch, the device array ``(len(members), 2)`` of each tensor's clip
        denominator and scale (the rule drivers' ``clip`` argument), rounded to ``dtype``.

        ``None`` for both: ones, cached per dtype (steps without norm clipping copy
        nothing).
        """
        dtype = np.dtype(dtype)
        if cden is None and cscale is None:
            key = ("pairs", dtype)
            if key not in self._ones:
                self._ones[key] = self.clip_pairs(dtype, np.ones(self.count), np.ones(self.count))
            return self._ones[key]
        with np.errstate(all="ignore"):
            both = np.stack([np.asarray(cden).astype(dtype), np.asarray(cscale).astype(dtype)],
                            axis=1)
        return [cuda.to_device(np.ascontiguousarray(both[members]))
                for members, _, _ in self.launches]

    def tuples(self, arrays, members):
        """``arrays[k]`` (flattened) for the members, padded to ``width`` with the first."""
        flat = [_flat(arrays[k]) for k in members]
        return tuple(flat + [flat[0]] * (self.width - len(flat)))

    def grid(self, nchunks):
        return max(1, min(_config_int("MAX_BLOCKS"), int(nchunks))), self.tpb


def _clips(dt, segments, scales, mode):
    """The rule drivers' per-tensor clip pairs from the per-launch ``scales`` (the norm
    divisors in mode 2, the global scales in mode 3; ones otherwise)."""
    if scales is None or mode not in (2, 3):
        return segments.clip_pairs(dt)
    values = np.ones(segments.count, dt)
    for (members, _, _), sc in zip(segments.launches, scales):
        values[members] = sc.copy_to_host()
    ones = np.ones(segments.count, dt)
    return segments.clip_pairs(dt, values if mode == 2 else ones, values if mode == 3 else ones)


def _launch_multi(call, params, grads, slots, segments, scales, clip, weight_decay,
                  learning_rate, average, ema_momentum, overwrite):
    """One rule call over a group of tensors with the pipeline's clip, decay and EMA."""
    drivers = _drivers()
    dt = np.dtype(slots[0].dtype)
    mode, cv, _, _ = clip_args(dt, *clip)
    psc, dmode, emode = _pipeline(dt, weight_decay, learning_rate, average, ema_momentum, cv)
    segs = segments.with_clip(mode)
    ks = drivers.kernels(call.rule, call.fl, dmode, emode, segs.tpb, dt, items=segs.items)
    drivers.launch_dense(ks, segs, _clips(dt, segs, scales, mode), params, grads, slots,
                         average if emode else slots[0], bool(overwrite) and emode != 0, psc,
                         call.sc)


def adam_multi(params, grads, m, v, vhat=None, *, segments, scales=None, learning_rate,
               beta_1, beta_2, epsilon, step, weight_decay=None, clip=(0,), average=None,
               ema_momentum=None, overwrite=False):
    """One fused Adam/AMSGrad/AdamW step on a group of tensors, in place, one launch per group.

    In the order of the optimizer step, per element: clip the gradient, weight decay (the
    tensors flagged in ``segments``), the update of :func:`refopt.reference.adam_update`, and
    with ``average`` the EMA (then ``p = average`` if ``overwrite``).

    Parameters
    ----------
    params, grads : sequence of numba device array of float16, float32 or float64, C-contiguous
        Variables (updated in place) and their gradients, ``grads[k]`` of ``params[k]``'s
        shape; all of one dtype.
    m, v : numba device array, 1-d, of that dtype
        Flat moment buffers; tensor ``k``'s slots are ``[offset_k, offset_k + size_k)``.
    vhat : 1-d device array like ``m``, or None
        Flat AMSGrad maxima (None: plain Adam).
    segments : Segments
        Built from the tensors' sizes, slot offsets and decay flags.
    scales : list of device arrays, or None
        :meth:`Segments.scales` of the per-tensor clip factors (None: ones).
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        1-based global step.
    weight_decay : float or None
        The decay of the flagged tensors, as :func:`refopt.reference.apply_weight_decay`.
    clip : tuple
        ``(mode, threshold)``: mode 0 none, 1 by value (``threshold``), 2 by norm
        (``threshold`` and the per-tensor divisor in ``scales``), 3 global (the scale in
        ``scales``).
    average : 1-d device array like ``m``, or None
        Flat EMA averages, updated in place when given.
    ema_momentum : float or None
    overwrite : bool

    Raises
    ------
    ValueError
        From :func:`refopt.reference.adam_scalars` for invalid hyperparameters or ``step``
        (before any launch).
    """
    from refopt.rules.adam import tf_keras_call

    call = tf_keras_call(np.dtype(m.dtype), learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon, step=step, amsgrad=vhat is not None)
    _launch_multi(call, params, grads, [m, v] + ([vhat] if vhat is not None else []), segments,
                  scales, clip, weight_decay, learning_rate, average, ema_momentum, overwrite)


def sgd_multi(params, grads, m, *, segments, scales=None, learning_rate, momentum,
              nesterov=False, weight_decay=None, clip=(0,), average=None, ema_momentum=None,
              overwrite=False):
    """One fused SGD step (:func:`refopt.reference.sgd_update`) on a group of tensors.

    Parameters
    ----------
    params, grads : sequence of numba device array of float16, float32 or float64, C-contiguous
        As :func:`adam_multi`.
    m : numba device array, 1-d
        The flat momentum buffer.
    segments, scales, weight_decay, clip, average, ema_momentum, overwrite
        As :func:`adam_multi`.
    learning_rate, momentum : float
    nesterov : bool
    """
    from refopt.rules.sgd import tf_keras_call

    call = tf_keras_call(np.dtype(m.dtype), learning_rate=learning_rate, momentum=momentum,
                         nesterov=bool(nesterov))
    _launch_multi(call, params, grads, [m], segments, scales, clip, weight_decay,
                  learning_rate, average, ema_momentum, overwrite)


#: One-tensor segment tables of :func:`adam_dense`/:func:`sgd_dense`, per size, decay flag
#: and launch shape: built once (a host-to-device copy) instead of at every call.
_ONE_TENSOR_TABLES = {}


def _one(p, clip, weight_decay):
    """A one-tensor segment table, its clip factor and ``(mode, threshold)``."""
    dt = np.dtype(p.dtype)
    key = (p.size, weight_decay is not None, config.THREADS_PER_BLOCK,
           config.ITEMS_PER_THREAD, config.TENSORS_PER_LAUNCH)
    seg = _ONE_TENSOR_TABLES.get(key)
    if seg is None:
        if len(_ONE_TENSOR_TABLES) >= 64:
            _ONE_TENSOR_TABLES.clear()
        seg = _ONE_TENSOR_TABLES[key] = Segments([p.size], [0], [weight_decay is not None])
    mode, _, cden, gscale = clip_args(dt, *clip)
    threshold = clip[1] if mode in (1, 2) else None
    if mode in (2, 3):
        scales = seg.scales(dt, [cden if mode == 2 else gscale])
    else:
        scales = seg.ones(dt)  # cached on the device
    return seg, scales, (mode, threshold)


def adam_dense(p, g, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step,
               weight_decay=None, clip=(0,), average=None, ema_momentum=None,
               overwrite=False):
    """One fused Adam/AMSGrad/AdamW step on one tensor, in place (:func:`adam_multi`).

    Parameters
    ----------
    p, g, m, v : numba device array of float16, float32 or float64
        C-contiguous, same shape and dtype.
        Variable, gradient, moments; ``p``, ``m``, ``v`` are updated in place.
    vhat : device array like ``p`` or None
        AMSGrad maximum (None: plain Adam).
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        1-based global step.
    weight_decay : float or None
        Decoupled decay, as :func:`refopt.reference.apply_weight_decay`.
    clip : tuple
        ``(mode, clip, cden, gscale)`` or a prefix of it, as :func:`clip_args`.
    average : device array like ``p`` or None
        EMA average, updated in place when given.
    ema_momentum : float or None
    overwrite : bool

    Notes
    -----
    Each element runs the reference's operations in its order; on the simulator the results
    are bit-identical to :func:`refopt.reference.adam_update` (tested). On a GPU every
    multiply, add and subtract is an explicitly rounded ``mul.rn``/``add.rn``/``sub.rn``
    that the compiler does not fuse into an FMA (:func:`refopt.rules.ops.register_cuda`;
    audited in the PTX by :mod:`refopt.kernels.cuda.ptx`).
    """
    if p.size == 0:
        return
    seg, sc, clip2 = _one(p, clip, weight_decay)
    adam_multi([p], [g], _flat(m), _flat(v), None if vhat is None else _flat(vhat),
               segments=seg, scales=sc, learning_rate=learning_rate, beta_1=beta_1,
               beta_2=beta_2, epsilon=epsilon, step=step, weight_decay=weight_decay,
               clip=clip2, average=None if average is None else _flat(average),
               ema_momentum=ema_momentum, overwrite=overwrite)


def sgd_dense(p, g, m, *, learning_rate, momentum, nesterov=False, weight_decay=None,
              clip=(0,), average=None, ema_momentum=None, overwrite=False):
    """One fused SGD step on one tensor, in place (:func:`sgd_multi`).

    Parameters
    ----------
    p, g, m : numba device array of float16, float32 or float64, C-contiguous, same shape and dtype
        Variable, gradient and momentum buffer (``p`` and ``m`` updated in place).
    learning_rate, momentum : float
    nesterov : bool
    weight_decay, clip, average, ema_momentum, overwrite
        As :func:`adam_dense`.
    """
    if p.size == 0:
        return
    seg, sc, clip2 = _one(p, clip, weight_decay)
    sgd_multi([p], [g], _flat(m), segments=seg, scales=sc, learning_rate=learning_rate,
              momentum=momentum, nesterov=nesterov, weight_decay=weight_decay, clip=clip2,
              average=None if average is None else _flat(average),
              ema_momentum=ema_momentum, overwrite=overwrite)


def sorted_rows(indices):
    """Host preparation of a sparse gradient: ``(order, starts, unique_rows)`` (int64).

    ``order`` is a stable argsort of ``indices`` (duplicates keep their order of appearance),
    ``unique_rows`` the sorted distinct rows and ``starts`` the run boundaries in ``order``
    (``len(unique_rows) + 1`` entries).
    """
    idx = np.asarray(indices, np.int64).reshape(-1)
    order = np.argsort(idx, kind="stable")
    srt = idx[order]
    first = np.flatnonzero(np.r_[True, srt[1:] != srt[:-1]]) if srt.size else np.zeros(0,
                                                                                        np.int64)
    starts = np.r_[first, srt.size].astype(np.int64)
    return order.astype(np.int64), starts, srt[first].astype(np.int64)


def lazy_adam_rows(p, m, v, vhat, values, indices, *, learning_rate, beta_1, beta_2, epsilon,
                   step, weight_decay=None):
    """Lazy Adam on the rows of ``indices``, in place (one launch).

    ``values`` (a device array ``(n, ...)``, or host rows, copied over) are summed per unique
    row from zero in order of appearance (bit-identical to
    :meth:`refopt.IndexedSlices.deduplicate`) by the one thread that owns each element of the
    row, which then applies weight decay (present rows only) and the Adam update.

    Parameters
    ----------
    p, m, v : numba device array of float16, float32 or float64
        C-contiguous, shape ``(rows, ...)``.
        Table and moments, updated in place on the present rows only.
    vhat : device array like ``p`` or None
    values : ndarray or device array, shape ``(n,) + p.shape[1:]``
        Gradient rows (host rows are copied to the device).
    indices : array_like of int, shape ``(n,)``
        Row of each value, validated by the caller (``IndexedSlices``).
    learning_rate, beta_1, beta_2, epsilon, step, weight_decay
        As :func:`adam_dense`.
    """
    from refopt.rules.adam import tf_keras_call

    call = tf_keras_call(np.dtype(p.dtype), learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon, step=step, amsgrad=vhat is not None)
    if np.size(indices) == 0 or p.size == 0:
        return
    _sparse(call, p, [m, v] + ([vhat] if vhat is not None else []), values, indices,
            weight_decay, learning_rate, lazy=True)


def _sparse(call, p, slots, values, indices, weight_decay, learning_rate, lazy):
    """A rule's ``rows`` (``lazy``) or ``table`` kernel on the ``(rows, width)`` views of a
    table and its slots, with Keras' decoupled decay when ``weight_decay`` is given."""
    drivers = _drivers()
    check_config()
    dt = np.dtype(p.dtype)
    psc, dmode, _ = _pipeline(dt, weight_decay, learning_rate, None, None)
    width, vals, order, starts, urows = _table_inputs(p, values, indices)
    rows = p.shape[0]
    ks = drivers.kernels(call.rule, call.fl, dmode, 0, _tpb(), dt)
    tables = [a.reshape(rows, width) for a in slots]
    launch = drivers.launch_rows if lazy else drivers.launch_table
    launch(ks, p.reshape(rows, width), tables, vals, order, starts, urows, 0, 1, 1, dmode, psc,
           call.sc)


def _table_inputs(p, values, indices):
    """``(width, values, order, starts, urows)`` on the device for the sparse table kernels.

    ``values`` become a ``(n, width)`` device array (host rows are copied over). With no
    index at all, one-element stand-ins make every row absent (``urows = [-1]``): the
    kernels still update every element (moments decay, the weights move).
    """
    width = p.size // p.shape[0]
    order, starts, urows = sorted_rows(indices)
    if urows.size == 0:
        order, starts, urows = (np.zeros(1, np.int64), np.zeros(2, np.int64),
                                np.full(1, -1, np.int64))
        values = np.zeros((1, width), np.dtype(p.dtype))
    if isinstance(values, np.ndarray):
        values = cuda.to_device(np.ascontiguousarray(values).reshape(-1, width))
    else:
        values = values.reshape(values.shape[0], width)
    return width, values, cuda.to_device(order), cuda.to_device(starts), cuda.to_device(urows)


def adam_sparse(p, m, v, vhat, values, indices, *, learning_rate, beta_1, beta_2, epsilon,
                step, weight_decay=None):
    """tf-keras' non-lazy sparse Adam on a whole table, in place (one launch).

    Every element of ``p``, ``m``, ``v`` (and ``vhat``) is updated, as
    :func:`refopt.reference.adam_update` does for an IndexedSlices gradient: the moments
    decay everywhere, the summed gradient rows (duplicates summed from zero in order of
    appearance, the bits of :meth:`refopt.IndexedSlices.deduplicate`) are added to the rows
    present, and every weight moves. One thread owns each element and finds its row among
    the sorted unique rows by binary search; no atomics.

    Parameters
    ----------
    p, m, v : numba device array of float16, float32 or float64
        C-contiguous, shape ``(rows, ...)``.
    vhat : device array like ``p`` or None
    values : ndarray or device array, shape ``(n,) + p.shape[1:]``
    indices : array_like of int, shape ``(n,)``
        Validated by the caller (``IndexedSlices``).
    learning_rate, beta_1, beta_2, epsilon, step
        As :func:`adam_dense`.
    weight_decay : float or None
        Decoupled decay of the whole variable before the update (tf-keras applies it to
        every element whatever the gradient).

    Raises
    ------
    ValueError
        From :func:`refopt.reference.adam_scalars` (before any launch).
    """
    from refopt.rules.adam import tf_keras_call

    call = tf_keras_call(np.dtype(p.dtype), learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon, step=step, amsgrad=vhat is not None,
                         table=True)
    if p.size == 0:
        return
    _sparse(call, p, [m, v] + ([vhat] if vhat is not None else []), values, indices,
            weight_decay, learning_rate, lazy=False)


def sgd_sparse(p, m, values, indices, *, learning_rate, momentum, nesterov=False,
               weight_decay=None):
    """tf-keras' sparse SGD on a whole table, in place (one launch).

    As :func:`refopt.reference.sgd_update` with an IndexedSlices gradient: ``m <- m mu``
    everywhere, ``m += (-s) lr`` on the rows present (``s`` the summed duplicates), then
    ``w <- w + m``; with Nesterov ``w += (-s) lr`` on the rows present, then
    ``w <- w + m mu``.

    Parameters
    ----------
    p, m : numba device array of float16, float32 or float64, C-contiguous, shape ``(rows, ...)``
    values, indices
        As :func:`adam_sparse`.
    learning_rate, momentum : float
    nesterov : bool
    weight_decay : float or None
        As :func:`adam_sparse`.
    """
    from refopt.rules.sgd import tf_keras_call

    if p.size == 0:
        return
    call = tf_keras_call(np.dtype(p.dtype), learning_rate=learning_rate, momentum=momentum,
                         nesterov=bool(nesterov), table=True)
    _sparse(call, p, [m], values, indices, weight_decay, learning_rate, lazy=False)
