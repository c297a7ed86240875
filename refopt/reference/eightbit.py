r"""8-bit optimizer state as bitsandbytes keeps it: blockwise dynamic quantization, and the
8-bit Adam and Lion steps of its CPU implementation.

bitsandbytes (``bnb.optim.Adam8bit``, ``AdamW8bit``, ``Lion8bit``) stores each moment of a
parameter with at least ``min_8bit_size`` elements (4096 by default) as one byte per element:
the index of a value in a 256-entry *dynamic map* (a fixed table of signed or unsigned
numbers in ``[-1, 1]``, dense near zero), scaled per block of 256 elements by the block's
absolute maximum. Smaller parameters keep float32 moments and take another code path. This
module computes, in NumPy and readably, what bitsandbytes 0.50.2 computes on the CPU; the
golden trajectories in ``conformance/bnb/`` (recorded by ``conformance/generators/gen_bnb.py``
from bitsandbytes itself) hold its values.

Quantization of a float32 array ``x`` with map ``code`` (256 sorted float32 values), block by
block of ``block_size`` elements (the last block may be shorter):

.. math::

    a_b = \max_{i \in b} |x_i|, \qquad
    u_i = \mathrm{clip}(x_i \cdot \mathrm{f32}(1/a_b), -1, 1), \qquad
    j_i = \lfloor \mathrm{f32}\big(\mathrm{f32}((u_i + 1)/2) \cdot 65535 + 0.5\big) \rfloor

and the stored byte is ``lut[j_i]``: the number of midpoints ``(code[k] + code[k+1])/2`` below
the grid point ``-1 + 2j/65535``, i.e. the code nearest to the grid point nearest to ``u_i``
(bitsandbytes' CPU lookup table of 65536 bins, not the code nearest to ``u_i`` itself). A block
whose maximum is 0 stores byte 0. Dequantization is ``code[q_i] * a_b`` in float32.

Non-finite values follow bitsandbytes' C loop (``csrc/cpu_ops.cpp``, ``quantize_cpu_impl``),
measured on bitsandbytes 0.50.2 (golden cases ``*_nonfinite`` in ``conformance/bnb/``):

- the block maximum is ``std::max(acc, |x_i|)`` from ``acc = 0``; a comparison with NaN is
  false, so NaN elements are skipped wherever they sit (:func:`numpy.fmax`, not
  :func:`numpy.max`): a block of NaN only has maximum 0 and stores byte 0; an infinite element
  makes the maximum ``inf``;
- an element whose scaled value ``u_i`` is NaN (``x_i`` NaN; ``x_i`` infinite, as ``1/inf = 0``
  and ``inf * 0``; ``x_i = 0`` with a maximum so small that ``1/a_b`` overflows) stores byte 0:
  C's float-to-``uint16`` cast of NaN gives lookup index 0, and ``lut[0] = 0``. Byte 0 is
  ``code[0]``: about ``-0.993`` in the signed map, 0 in the unsigned one;
- with an infinite maximum every finite element scales to 0, which is grid point 32768 (the
  code nearest ``+1.5e-5``: the grid has no point at 0), and dequantization gives ``code * inf``:
  ``+-inf``, or NaN for byte 0 of the unsigned map. So a block of ``m`` (signed map) that holds
  an infinity stays at ``+-inf`` from then on; a block of ``v`` goes ``inf`` (finite elements),
  then all ``inf``, stored as byte 0 with maximum ``inf``, dequantized to NaN, stored with
  maximum 0, and restarts from 0, its weights NaN by then. A NaN element alone does not
  spread: its neighbours keep their maximum, and it comes back as ``code[0] * a_b`` (in Lion
  a large negative moment: the weight usually moves by ``+lr`` the next step; in Adam the
  weight is already NaN).

The step's float32 arithmetic follows bitsandbytes' CPU kernels
(``bitsandbytes/backends/cpu/ops.py``), which are torch tensor operations: ``add_`` with
``alpha`` and ``addcmul_`` round as one fused multiply-add on torch's vectorised CPU path
(``../shared/semantics/torch_optax.md`` §0); Python-float scalars are rounded to float32 where
they meet a tensor; bias corrections are float64.

torch's CPU ``sqrt`` is MKL's vector square root, which is not correctly rounded (1 ulp off on
about 17% of float32 inputs). :func:`adam8bit_update` takes ``sqrt="mkl"`` for it (the same MKL
function, through torch's library or the ``mkl`` wheel: :mod:`refopt._mkl`), bit-identical to
bitsandbytes on every recorded case; with the default ``sqrt="ieee"`` the moments (the stored
bytes and block maxima) are still bit-identical, and the parameters differ by an ulp or so per
step where MKL's ``sqrt`` is 1 ulp away. Lion has no square root: bit-identical either way.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .._mkl import mkl_sqrt
from ._common import check_real, check_step
from .variants import fma

__all__ = [
    "BLOCK_SIZE",
    "MIN_8BIT_SIZE",
    "EightBitState",
    "adam8bit_initial_state",
    "adam8bit_update",
    "create_dynamic_map",
    "dequantize_blockwise",
    "lion8bit_initial_state",
    "lion8bit_update",
    "quantize_blockwise",
]

_F32 = np.float32
#: bitsandbytes' CPU block size for the optimizers' state.
BLOCK_SIZE = 256
#: bitsandbytes' default ``min_8bit_size``: smaller parameters keep float32 moments.
MIN_8BIT_SIZE = 4096
_LUT_BINS = 65536


def _linspace_f32(start, end, steps):
    """torch's float32 ``linspace`` on the CPU: a float32 step; the first half
    ``fma(step, i, start)``, the second half ``fma(-step, steps - 1 - i, end)`` (each rounded
    once, as torch's vectorised kernel computes them)."""
    start, end = _F32(start), _F32(end)
    step = _F32((end - start) / _F32(steps - 1))
    i = np.arange(steps)
    up = fma(step, i.astype(_F32), start)
    down = fma(-step, (steps - 1 - i).astype(_F32), end)
    return np.where(i < steps // 2, up, down).astype(_F32)


def create_dynamic_map(signed=True):
    """bitsandbytes' 8-bit dynamic quantization map (7 exponent bits, 8 bits in all).

    For each decade ``k = 0..6`` the values ``10**(k-6) * m`` where ``m`` runs over the
    midpoints of ``2**k + 1`` (signed) or ``2**(k+1) + 1`` (unsigned) equally spaced points of
    ``[0.1, 1]`` (their negatives too when signed), then 0 and 1, sorted: 256 float32 values.

    Parameters
    ----------
    signed : bool, default True
        The signed map (first moments) or the unsigned one (second moments).

    Returns
    -------
    ndarray of float32, shape (256,)
        Sorted ascending.
    """
    values = []
    for k in range(7):
        points = 2 ** k + 1 if signed else 2 ** (k + 1) + 1
        b = _linspace_f32(0.1, 1.0, points)
        mids = ((b[:-1] + b[1:]) / _F32(2)).astype(_F32)
        scaled = (_F32(10.0 ** (k - 6)) * mids).astype(_F32)
        values.extend(scaled.tolist())
        if signed:
            values.extend((-scaled).tolist())
    values += [0.0, 1.0]
    assert len(values) == 256
    return np.array(sorted(values), dtype=_F32)


def _lut(code):
    """The 65536-bin lookup table: for grid point ``-1 + 2j/65535`` (float32), the number of
    code midpoints strictly below it."""
    code = np.asarray(code, dtype=_F32)
    mids = (_F32(0.5) * (code[:-1] + code[1:])).astype(_F32)
    j = np.arange(_LUT_BINS)
    grid = (_F32(-1) + (_F32(2) * j.astype(_F32)) / _F32(_LUT_BINS - 1)).astype(_F32)
    return np.searchsorted(mids, grid, side="left").astype(np.uint8)


_LUT_CACHE = {}


def _cached_lut(code):
    key = np.asarray(code, dtype=_F32).tobytes()
    lut = _LUT_CACHE.get(key)
    if lut is None:
        lut = _LUT_CACHE[key] = _lut(code)
    return lut


def _blocks(n, block_size):
    return -(-n // block_size)


def quantize_blockwise(x, code, block_size=BLOCK_SIZE):
    """Quantize float32 ``x`` to bytes, per block of ``block_size`` (bitsandbytes' CPU rule).

    Parameters
    ----------
    x : ndarray of float32
        Any shape; quantized in C order.
    code : ndarray of float32, shape (256,)
        A sorted map (:func:`create_dynamic_map`).
    block_size : int, default 256

    Returns
    -------
    codes : ndarray of uint8, shape of ``x``
    absmax : ndarray of float32, shape (ceil(x.size / block_size),)

    Raises
    ------
    TypeError
        ``x`` not float32.
    ValueError
        ``code`` not 256 values, ``block_size`` < 1.

    Notes
    -----
    NaN elements never set a block's maximum; an element whose scaled value is NaN (NaN, an
    infinity scaled by ``1/inf``, 0 scaled by an overflowing ``1/a_b``) stores byte 0; see the
    module docstring.
    """
    x = np.asarray(x)
    if x.dtype != _F32:
        raise TypeError(f"`x` must be float32. Received: dtype={x.dtype}")
    code = np.asarray(code)
    if code.shape != (256,):
        raise ValueError(f"`code` must have shape (256,). Received: shape={code.shape}")
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"`block_size` must be an integer >= 1. Received: {block_size!r}")
    flat = x.reshape(-1)
    n = flat.size
    nb = _blocks(n, block_size)
    pad = nb * block_size - n
    blocks = np.concatenate([flat, np.zeros(pad, _F32)]).reshape(nb, block_size)
    # std::max(acc, |x|) from acc = 0: a NaN never wins a comparison, so it is skipped (an
    # all-NaN block has maximum 0); an infinity is the maximum
    absmax = np.fmax.reduce(np.abs(blocks), axis=1, initial=_F32(0)).astype(_F32)
    with np.errstate(all="ignore"):  # blocks of maximum 0 are replaced by byte 0 below
        inv = (_F32(1) / absmax).astype(_F32)  # 0 for an infinite maximum
        u = np.clip((blocks * inv[:, None]).astype(_F32), _F32(-1), _F32(1))
        nan = np.isnan(u)  # x NaN, or inf * 0 (infinite maximum), or 0 * inf (tiny maximum)
        u[nan] = 0  # placeholder: these take byte 0 below
        half = ((u + _F32(1)) * _F32(0.5)).astype(_F32)  # exact: a power-of-two scaling
        # the multiply-add rounds once (bitsandbytes' C compiles it as an FMA)
        j = fma(half, _F32(_LUT_BINS - 1), _F32(0.5)).astype(np.int64)
    j = np.clip(j, 0, _LUT_BINS - 1)
    q = _cached_lut(code)[j]
    q[nan] = 0  # C's uint16 cast of NaN is index 0 (x86's 0x80000000 truncated): lut[0] = 0
    q[absmax == 0] = 0
    return q.reshape(-1)[:n].reshape(x.shape), absmax


def dequantize_blockwise(codes, absmax, code, block_size=BLOCK_SIZE):
    """``code[codes] * absmax[block]`` in float32 (the inverse of :func:`quantize_blockwise`
    up to the map's resolution).

    Parameters
    ----------
    codes : ndarray of uint8
    absmax : ndarray of float32, shape (ceil(codes.size / block_size),)
    code : ndarray of float32, shape (256,)
    block_size : int, default 256

    Returns
    -------
    ndarray of float32, shape of ``codes``
    """
    codes = np.asarray(codes)
    flat = codes.reshape(-1)
    block = np.arange(flat.size) // block_size
    with np.errstate(invalid="ignore"):  # 0 * inf is NaN, as in bitsandbytes
        out = (np.asarray(code, _F32)[flat] * np.asarray(absmax, _F32)[block]).astype(_F32)
    return out.reshape(codes.shape)


class EightBitState(NamedTuple):
    """The state of one parameter: ``state1``/``state2`` are uint8 codes (8-bit path) or
    float32 moments (parameters under ``min_8bit_size``); ``absmax1``/``absmax2`` the blocks'
    maxima (float32, ``None`` on the 32-bit path); ``state2``/``absmax2`` are ``None`` for
    Lion."""

    state1: np.ndarray
    state2: np.ndarray | None
    absmax1: np.ndarray | None
    absmax2: np.ndarray | None


class EightBitResult(NamedTuple):
    """``param`` (new array) and ``state`` (:class:`EightBitState`, new arrays)."""

    param: np.ndarray
    state: EightBitState


def _initial(param, two, min_8bit_size, block_size):
    param = np.asarray(param)
    if param.dtype != _F32:
        raise TypeError("bitsandbytes' CPU 8-bit optimizers take float32 parameters here. "
                        f"Received: dtype={param.dtype}")
    if param.size < min_8bit_size:
        z = np.zeros(param.shape, _F32)
        return EightBitState(z, z.copy() if two else None, None, None)
    nb = _blocks(param.size, block_size)
    q = np.zeros(param.shape, np.uint8)
    a = np.zeros(nb, _F32)
    return EightBitState(q, q.copy() if two else None, a, a.copy() if two else None)


def adam8bit_initial_state(param, min_8bit_size=MIN_8BIT_SIZE, block_size=BLOCK_SIZE):
    """Zero state for :func:`adam8bit_update` (byte 0 with block maxima 0 on the 8-bit path)."""
    return _initial(param, True, min_8bit_size, block_size)


def lion8bit_initial_state(param, min_8bit_size=MIN_8BIT_SIZE, block_size=BLOCK_SIZE):
    """Zero state for :func:`lion8bit_update` (one moment)."""
    return _initial(param, False, min_8bit_size, block_size)


def _check(param, grad):
    param, grad = np.asarray(param), np.asarray(grad)
    if param.dtype != _F32 or grad.dtype != _F32:
        raise TypeError("`param` and `grad` must be float32. Received: "
                        f"param.dtype={param.dtype}, grad.dtype={grad.dtype}")
    if param.shape != grad.shape:
        raise ValueError(f"`grad` must have the shape of `param` {param.shape}. "
                         f"Received: {grad.shape}")
    return param, grad


def _check_state(param, state, two, block_size):
    if not isinstance(state, EightBitState):
        raise TypeError("`state` must be an EightBitState (from adam8bit_initial_state or "
                        f"lion8bit_initial_state). Received: {type(state).__name__}")
    s1 = np.asarray(state.state1)
    if s1.shape != param.shape or s1.dtype not in (np.uint8, _F32):
        raise ValueError("`state.state1` must be uint8 codes or float32 moments shaped like "
                         f"`param` {param.shape}. Received: {s1.dtype} {s1.shape}")
    if two and (state.state2 is None or np.asarray(state.state2).shape != param.shape
                or np.asarray(state.state2).dtype != s1.dtype):
        raise ValueError("`state.state2` must match `state.state1`.")
    if s1.dtype == np.uint8:
        if int(block_size) != block_size or block_size < 1:
            raise ValueError(f"`block_size` must be an integer >= 1. Received: {block_size!r}")
        nb = _blocks(param.size, int(block_size))
        for name in ("absmax1", "absmax2") if two else ("absmax1",):
            a = getattr(state, name)
            if a is None or np.asarray(a).dtype != _F32 or np.asarray(a).shape != (nb,):
                raise ValueError(
                    f"`state.{name}` must be a float32 vector of the {nb} block maxima of "
                    f"blocks of block_size={block_size!r} (the state's blocks). Received: "
                    f"{None if a is None else (np.asarray(a).dtype, np.asarray(a).shape)}")


def _torch_sign(x):
    """torch's ``sign``: ``(x > 0) - (x < 0)`` in float32, so NaN (and -0) give +0 (NumPy's
    ``sign`` gives NaN and -0)."""
    return ((x > 0).astype(_F32) - (x < 0).astype(_F32)).astype(_F32)


def adam8bit_update(param, grad, state, step, learning_rate=1e-3, beta_1=0.9, beta_2=0.999,
                    epsilon=1e-8, weight_decay=0.0, block_size=BLOCK_SIZE, sqrt="ieee"):
    r"""One step of bitsandbytes' ``Adam8bit`` / ``AdamW8bit`` on the CPU (pure).

    With ``m, v`` the dequantized moments (8-bit path) or the float32 ones (32-bit path),
    ``c_1 = 1 - \beta_1^t`` and ``c_2 = \sqrt{1 - \beta_2^t}`` in float64:

    .. math::

        m &\leftarrow \mathrm{fma}(1-\beta_1,\ g,\ m\beta_1), \qquad
        v \leftarrow \mathrm{fma}((1-\beta_2) g,\ g,\ v\beta_2) \\
        w &\leftarrow w \cdot (1 - \eta\lambda) \quad (\lambda > 0) \\
        \text{8-bit:}\quad w &\leftarrow w + \frac{(-\eta/c_1)\, m}{\sqrt{v}/c_2 + \epsilon},
        \quad\text{then } m, v \text{ quantized (signed / unsigned map)} \\
        \text{32-bit:}\quad w &\leftarrow \mathrm{fma}\Big(-\frac{\eta c_2}{c_1},\
        \frac{m}{\sqrt{v} + \epsilon c_2},\ w\Big)

    The weight decay is decoupled (``AdamW8bit`` is ``Adam8bit`` with ``weight_decay=1e-2``).

    Parameters
    ----------
    param, grad : ndarray of float32, same shape
    state : EightBitState
        From :func:`adam8bit_initial_state` or a previous step; its kind (uint8 codes or
        float32 moments) selects the path.
    step : int
        The 1-based step.
    learning_rate, beta_1, beta_2, epsilon, weight_decay : float
        bitsandbytes' ``lr``, ``betas``, ``eps``, ``weight_decay``.
    block_size : int, default 256
    sqrt : {"ieee", "mkl"}, default "ieee"
        The square root: IEEE's (NumPy), or MKL's vector one as torch's CPU ``sqrt``
        (bitsandbytes' bits; needs torch or the ``mkl`` wheel).

    Returns
    -------
    EightBitResult

    Raises
    ------
    TypeError, ValueError
        Non-float32 arrays, mismatched shapes, a hyperparameter out of range, ``step`` < 1,
        an unknown ``sqrt``.
    RuntimeError
        ``sqrt="mkl"`` without torch or the ``mkl`` wheel.

    Notes
    -----
    Follows ``bitsandbytes/backends/cpu/ops.py`` (``_optimizer_update_8bit_blockwise_cpu``,
    ``_optimizer_update_32bit_cpu``), ``csrc/cpu_ops.cpp`` (quantization) and
    ``bitsandbytes/functional.py`` (``create_dynamic_map``). The square root is IEEE's; see
    the module docstring for bitsandbytes' MKL one.
    """
    param, grad = _check(param, grad)
    _check_state(param, state, True, block_size)
    step = check_step(step)
    lr = check_real("learning_rate", learning_rate, low=0)
    b1 = check_real("beta_1", beta_1, low=0, high=1)
    b2 = check_real("beta_2", beta_2, low=0, high=1)
    eps = check_real("epsilon", epsilon, low=0)
    wd = check_real("weight_decay", weight_decay, low=0)
    if sqrt not in ("ieee", "mkl"):
        raise ValueError(f"`sqrt` must be 'ieee' or 'mkl'. Received: sqrt={sqrt!r}")
    root = mkl_sqrt if sqrt == "mkl" else np.sqrt
    eight = state.state1.dtype == np.uint8
    with np.errstate(all="ignore"):
        if eight:
            q1, q2 = create_dynamic_map(True), create_dynamic_map(False)
            m = dequantize_blockwise(state.state1, state.absmax1, q1, block_size)
            v = dequantize_blockwise(state.state2, state.absmax2, q2, block_size)
        else:
            m, v = state.state1, state.state2
        m = fma(_F32(1.0 - b1), grad, (m * _F32(b1)).astype(_F32)).astype(_F32)
        v = fma((_F32(1.0 - b2) * grad).astype(_F32), grad, (v * _F32(b2)).astype(_F32))
        v = v.astype(_F32)
        c1 = 1.0 - b1 ** step
        c2 = math.sqrt(1.0 - b2 ** step)
        w = param
        if eight:
            denom = ((root(v) / _F32(c2)).astype(_F32) + _F32(eps)).astype(_F32)
            if wd > 0:
                w = (w * _F32(1.0 - lr * wd)).astype(_F32)
            w = (w + ((_F32(-lr / c1) * m).astype(_F32) / denom).astype(_F32)).astype(_F32)
            s1, a1 = quantize_blockwise(m, q1, block_size)
            s2, a2 = quantize_blockwise(v, q2, block_size)
            return EightBitResult(w, EightBitState(s1, s2, a1, a2))
        step_size = -lr * c2 / c1
        if wd > 0:
            w = (w * _F32(1.0 - lr * wd)).astype(_F32)
        update = (m / (root(v) + _F32(eps * c2)).astype(_F32)).astype(_F32)
        w = fma(_F32(step_size), update, w).astype(_F32)
        return EightBitResult(w, EightBitState(m, v, None, None))


def lion8bit_update(param, grad, state, step, learning_rate=1e-4, beta_1=0.9, beta_2=0.99,
                    weight_decay=0.0, block_size=BLOCK_SIZE):
    r"""One step of bitsandbytes' ``Lion8bit`` on the CPU (pure).

    With ``m`` the dequantized moment (8-bit path) or the float32 one (32-bit path):

    .. math::

        w &\leftarrow w \cdot (1 - \eta\lambda) \quad (\lambda > 0) \\
        u &= \mathrm{sign}(m\beta_1 + g(1-\beta_1)) \quad
        \text{(8-bit: two products rounded, then added; 32-bit: one fma)} \\
        w &\leftarrow w - \eta u, \qquad m \leftarrow \mathrm{fma}(1-\beta_2,\ g,\ m\beta_2)

    then ``m`` is quantized with the signed map on the 8-bit path. The sign is torch's,
    ``(x > 0) - (x < 0)``: 0 for NaN, so a weight whose ``m\beta_1 + g(1-\beta_1)`` is NaN
    keeps its value (NumPy's ``sign`` would give NaN).

    Parameters
    ----------
    param, grad : ndarray of float32, same shape
    state : EightBitState
        From :func:`lion8bit_initial_state` or a previous step.
    step : int
        The 1-based step (Lion does not use it; checked for symmetry).
    learning_rate, beta_1, beta_2, weight_decay : float
    block_size : int, default 256

    Returns
    -------
    EightBitResult

    Raises
    ------
    TypeError, ValueError
        As :func:`adam8bit_update`.
    """
    param, grad = _check(param, grad)
    _check_state(param, state, False, block_size)
    check_step(step)
    lr = check_real("learning_rate", learning_rate, low=0)
    b1 = check_real("beta_1", beta_1, low=0, high=1)
    b2 = check_real("beta_2", beta_2, low=0, high=1)
    wd = check_real("weight_decay", weight_decay, low=0)
    eight = state.state1.dtype == np.uint8
    with np.errstate(all="ignore"):
        if eight:
            q1 = create_dynamic_map(True)
            m = dequantize_blockwise(state.state1, state.absmax1, q1, block_size)
        else:
            m = state.state1
        w = param
        if wd > 0:
            w = (w * _F32(1.0 - lr * wd)).astype(_F32)
        mb = (m * _F32(b1)).astype(_F32)
        if eight:
            d = (mb + (grad * _F32(1.0 - b1)).astype(_F32)).astype(_F32)
        else:
            d = fma(_F32(1.0 - b1), grad, mb).astype(_F32)
        w = fma(_F32(-lr), _torch_sign(d), w).astype(_F32)
        m = fma(_F32(1.0 - b2), grad, (m * _F32(b2)).astype(_F32)).astype(_F32)
        if eight:
            s1, a1 = quantize_blockwise(m, q1, block_size)
            return EightBitResult(w, EightBitState(s1, None, a1, None))
        return EightBitResult(w, EightBitState(m, None, None, None))
