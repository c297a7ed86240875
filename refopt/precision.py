"""Low-precision variables: float16 and bfloat16, and how each convention computes them.

A float16 variable (or a bfloat16 one: NumPy arrays of ``ml_dtypes.bfloat16``) is computed as
the convention knob ``low_precision_compute`` (:class:`refopt.conventions.Convention`) says:

``"dtype"``
    every operation rounded to the variable's dtype (NumPy's float16 loops compute in float32
    and round after each operation; TensorFlow's float16 kernels on the CPU do the same). The
    presets of the TF family and optax.
``"float32"``
    PyTorch's fused CPU kernels (``opmath_t`` is ``float`` for ``Half`` and ``BFloat16``):
    the variable, its gradient and its slots are loaded into float32, the step (weight decay
    and update) is computed exactly as for a float32 variable, and the new variable and each
    new slot are rounded once to the variable's dtype, round-to-nearest-even
    (``c10::Half``/``c10::BFloat16`` from ``float``). Clipping and the EMA stay in the
    variable's dtype (``clip_grad_norm_`` scales the stored gradients, ``AveragedModel``
    writes its averages).
``"torch_fused"``
    The torch_fused preset: ``"float32"`` for ``Adam`` and ``AdamW`` (there refopt's Adam
    is ``torch.optim.Adam(fused=True)``), ``"dtype"`` for every other optimizer
    (refopt's torch forms are torch's for-loop paths, whose ops each round to float16:
    ``"dtype"`` is closest but not exact, see ``conformance/README.md``). ``SGD(fused=True)``
    is ``"float32"``.

The rule is implemented once, around the optimizer's update, in the staged step
(:func:`refopt.executors.staged.compute`), which every backend runs for low-precision
variables, except that ``backend="cpu"`` and ``backend="cuda"`` run the float32 compute of
dense steps without clipping or EMA on their fused kernels (generic over the rules: the
variable and slots as uint16 bits, loaded into float32 and each stored value rounded once,
with the bits of :func:`round_to`; :mod:`refopt.kernels.cpu.halfbits`,
:mod:`refopt.kernels.cuda.halfbits`; ``"cuda"`` takes the rest on the host, with a
``HostStepWarning``): no optimizer has code of its own
for it, and the numbers are the same on every backend. bfloat16 computed in its dtype is
taken where it is reproduced op by op (:mod:`refopt.reference.bf16`, run by the staged step
on every backend: torch's for-loop Adam, AdamW, SGD, Adagrad and RMSprop; Adam and SGD of
tf_keras, Keras 3 and optax; their other optimizers through the generic reference
functions on bfloat16, :mod:`refopt.reference.bf16_generic`; golden cases ``*_bf16``) and
refused elsewhere
(:func:`check_supported`); :class:`refopt.MasterWeights` takes it under any convention
(float32 masters). float16 computed in its dtype by torch's for-loop Adam, AdamW, SGD,
Adagrad and RMSprop takes the same op model (:func:`refopt.reference.bf16.takes`: dense
gradients; golden cases ``torch/*_f16`` of the for-loop, bit for bit), and so does the
``AveragedModel`` EMA of float16 variables (``takes_average``); every other float16 step
computed in its dtype is NumPy's float16 arithmetic.

:func:`round_to` is the one rounding used; :func:`stochastic_round` is the seeded stochastic
rounding of master weights.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices

__all__ = ["BFLOAT16", "LOW_PRECISION_DTYPES", "check_supported", "compute_dtype",
           "is_low_precision", "random_bits", "round_to", "slot_initial_value",
           "stochastic_round", "upcast"]

try:  # ml_dtypes comes with jax, and is a dependency of refopt
    import ml_dtypes as _ml_dtypes

    #: ``numpy.dtype(ml_dtypes.bfloat16)``, or None where ml_dtypes is missing.
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    BFLOAT16 = None

#: The dtypes a convention may compute in float32 (``low_precision_compute="float32"``).
LOW_PRECISION_DTYPES = tuple(d for d in (np.dtype(np.float16), BFLOAT16) if d is not None)

_FLOAT32 = np.dtype(np.float32)


def is_low_precision(dtype):
    """Whether ``dtype`` is float16 or bfloat16."""
    return np.dtype(dtype) in LOW_PRECISION_DTYPES


def _torch_fused(opt):
    """Whether refopt takes ``opt``'s torch step from a fused kernel: ``Adam``/``AdamW``
    (and subclasses), not ``LazyAdam`` (``SparseAdam``)."""
    if opt is None or opt._is_lazy():
        return False
    return any(k.__name__ == "Adam" and k.__module__ == "refopt.optimizers.adam"
               for k in type(opt).__mro__)


def compute_dtype(convention, dtype, opt=None):
    """The dtype a step of a ``dtype`` variable is computed in under ``convention``.

    Parameters
    ----------
    convention : refopt.conventions.Convention
    dtype : numpy.dtype
        The variable's dtype.
    opt : refopt.Optimizer, optional
        The optimizer (``low_precision_compute="torch_fused"`` depends on it; without it,
        ``"torch_fused"`` means the dtype).

    Returns
    -------
    numpy.dtype or None
        ``float32`` for a float16/bfloat16 variable computed in float32; None where the step
        is computed in the variable's dtype.
    """
    mode = convention.low_precision_compute
    if not is_low_precision(dtype) or mode == "dtype":
        return None
    if mode == "float32" or _torch_fused(opt):
        return _FLOAT32
    return None


def upcast(x, dtype=_FLOAT32):
    """``x`` (an ndarray, an :class:`~refopt.indexed_slices.IndexedSlices` or None) converted
    exactly to ``dtype`` (float32 holds every float16 and bfloat16 value); a new object, or
    ``x`` itself where it is not float16/bfloat16."""
    if x is None:
        return None
    if isinstance(x, IndexedSlices):
        if not is_low_precision(x.dtype):
            return x
        return IndexedSlices(np.asarray(x.values).astype(dtype), x.indices, x.dense_shape)
    x = np.asarray(x)
    return x.astype(dtype) if is_low_precision(x.dtype) else x


def round_to(x, dtype):
    """``x`` rounded once to ``dtype``, round-to-nearest-even (a new array).

    NumPy's float32 -> float16 and ml_dtypes' float32 -> bfloat16 conversions round to
    nearest, ties to even, overflow to infinity, keep the sign of zeros and infinities and
    give a NaN for a NaN (ml_dtypes keeps its sign and top mantissa bits), as PyTorch's
    ``c10::Half`` and ``c10::BFloat16`` conversions.
    """
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(dtype)


def check_supported(opt, variables, what="var_list"):
    """Raise unless ``opt`` (its convention) can compute every variable's dtype.

    bfloat16 is taken where the step is computed in float32 (:func:`compute_dtype`:
    PyTorch's fused kernels), and computed in its own dtype where
    :func:`refopt.reference.bf16.supported` reproduces it (torch's for-loop Adam, AdamW,
    SGD, Adagrad, RMSprop; Adam and SGD of tf_keras, Keras 3 and optax, and their other
    optimizers listed in :data:`refopt.reference.bf16_generic.EXACT`; tf_keras and Keras 3
    with EMA and ``clipvalue``; no norm clipping or sparse gradient); elsewhere it is
    refused.

    Raises
    ------
    TypeError
        A bfloat16 variable computed in its dtype, naming ``{what}[i]``, the optimizer and
        the convention; nothing has changed.
    """
    if BFLOAT16 is None or compute_dtype(opt.convention, BFLOAT16, opt) is not None:
        return
    from refopt.reference import bf16 as _loop

    why = _loop.supported(opt)  # torch's for-loop; Keras' and optax's Adam, SGD: op by op
    if why is None:
        return
    conv = opt.convention
    for i, v in enumerate(variables):
        if getattr(v, "dtype", None) == BFLOAT16:
            raise TypeError(
                f"`{what}[{i}]` has dtype bfloat16, which {type(opt).__name__} under "
                f"convention={conv.name!r} computes in the variable's dtype "
                f"(low_precision_compute={conv.low_precision_compute!r}), not modelled for "
                f"bfloat16 ({why}; reproduced: torch's for-loop Adam, AdamW, SGD, Adagrad, "
                "RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD and Rprop under "
                "convention='torch'; Adam, AdamW, SGD, RMSprop, Adagrad, "
                "Adadelta, Adamax, Nadam and Lion under 'tf_keras', 'keras3' (with EMA and "
                "clipvalue) and the optax presets; no norm clipping). "
                "Use low_precision_compute='float32' (PyTorch's fused kernels), "
                "refopt.MasterWeights (float32 masters), or float16/float32 variables. "
                f"Received: {what}[{i}] with shape={v.shape}, dtype=bfloat16"
            )


def slot_initial_value(opt, name, dtype):
    """The value slot ``name`` of a ``dtype`` variable of ``opt`` starts with: the
    optimizer's own (``opt._slot_initial_value``), for bfloat16 its float32 value rounded
    once (PyTorch fills bfloat16 state from a float; the optimizers' functions know float16,
    float32 and float64)."""
    if BFLOAT16 is not None and np.dtype(dtype) == BFLOAT16:
        return round_to(opt._slot_initial_value(name, _FLOAT32), dtype)[()]
    return opt._slot_initial_value(name, dtype)


# ------------------------------------------------------------------ stochastic rounding
_M64 = (1 << 64) - 1


def _mix(z):
    """SplitMix64's step on a Python int or a uint64 array (wrapping): ``z + 0x9E37...``,
    then the finaliser (xor-shift 30, multiply, xor-shift 27, multiply, xor-shift 31)."""
    if isinstance(z, int):
        z = (z + 0x9E3779B97F4A7C15) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def random_bits(seed, step, position, size):
    """The 32 random bits of each element for stochastic rounding: counter-based, so every
    backend and every run draws the same ones.

    ``key = mix(mix(mix(seed) + step) + position)`` and element ``i`` gets the high 32 bits
    of ``mix(key + i)``, where ``mix`` is SplitMix64 (``z += 0x9E3779B97F4A7C15``;
    ``z = (z ^ z >> 30) * 0xBF58476D1CE4E5B9``; ``z = (z ^ z >> 27) * 0x94D049BB133111EB``;
    ``z ^ z >> 31``), all modulo 2**64.

    Parameters
    ----------
    seed, step, position : int
        The rounding's seed, the step count (1 on the first step) and the variable's position
        in the optimizer's build order; each in ``[0, 2**64)``.
    size : int
        The number of elements (C order).

    Returns
    -------
    ndarray of uint32, shape ``(size,)``
    """
    key = _mix((_mix((_mix(seed) + step) & _M64) + position) & _M64)
    idx = np.arange(size, dtype=np.uint64)
    return (_mix(idx + np.uint64(key)) >> np.uint64(32)).astype(np.uint32)


def stochastic_round(x, dtype, bits):
    """float32 ``x`` rounded to float16 or bfloat16 stochastically: up (away from zero) with
    probability equal to the distance from the value below, in units of the gap.

    With ``lo`` the neighbour of ``x`` toward zero in ``dtype`` and ``hi`` the next one away
    from zero (infinity past the largest finite value), the result is ``hi`` when
    ``bits < p * 2**32``, ``p = (|x| - |lo|) / (|hi| - |lo|)`` computed in float64 (exact
    differences of float32 values; infinity as ``2**(emax+1)``), else ``lo``. Values of
    ``dtype`` are kept; NaN, infinities and zeros are rounded to nearest.

    Parameters
    ----------
    x : ndarray of float32
    dtype : float16 or bfloat16
    bits : ndarray of uint32, ``x.size`` elements (:func:`random_bits`)

    Returns
    -------
    ndarray of ``dtype``, the shape of ``x``
    """
    dtype = np.dtype(dtype)
    x = np.asarray(x, np.float32)
    near = round_to(x, dtype)
    ub = near.view(np.uint16).copy()
    mag = np.abs(x.astype(np.float64))
    with np.errstate(all="ignore"):
        near64 = np.abs(near.astype(np.float64))
        finite = np.isfinite(x) & (x != 0)
        # lo: the neighbour toward zero (near rounded away from zero steps back one)
        lo_b = np.where(finite & (near64 > mag), ub - np.uint16(1), ub)
        lo_b = np.where(finite & ~np.isfinite(near64), ub - np.uint16(1), lo_b)
        hi_b = lo_b + np.uint16(1)
        lo = np.abs(lo_b.view(dtype).astype(np.float64))
        hi = np.abs(hi_b.view(dtype).astype(np.float64))
        inf_as = 2.0 * float(_largest(dtype))  # 2**(emax+1)
        hi = np.where(np.isinf(hi), inf_as, hi)
        p = (mag - lo) / (hi - lo)
        up = finite & (bits.reshape(x.shape).astype(np.float64) < p * 2.0**32)
    out = np.where(finite, np.where(up, hi_b, lo_b), ub).astype(np.uint16)
    return out.view(dtype).reshape(x.shape)


def _largest(dtype):
    """The largest finite value of ``dtype`` (float16 or bfloat16), as a float."""
    if dtype == np.float16:
        return 65504.0
    return float(np.array(0x7F7F, np.uint16).view(dtype).astype(np.float64))
