"""float16 and bfloat16 as uint16 bits in the CUDA kernels: exact conversions from and to float32.

The low-precision ``dense`` kernels of :mod:`refopt.kernels.cuda.drivers` (``kernels(...,
low=KIND)``) take the uint16 bits of float16 and bfloat16 device arrays, load each element
into float32 with :func:`load`, run the rule in float32 and store each result with
:func:`store`, rounded once to nearest, ties to even. The conversions are the bit arithmetic
of :mod:`refopt.kernels.cpu.halfbits` (the same steps, so the same bits, checked on all
65,536 loads and on float32 stores in ``tests/test_cuda_low_precision.py``; arranged so that
no unsigned operation wraps, which NumPy scalars would warn about on the simulator), with its two
float operations (the exact scaling of a float16 subnormal, and the rounding of a float16
subnormal result by a float32 addition) written with :func:`refopt.rules.ops.mul` and
:func:`~refopt.rules.ops.add`: on a GPU libdevice's ``__nv_fmul_rn``/``__nv_fadd_rn``
(``mul.rn.f32``/``add.rn.f32``, never contracted, never flushed to zero), so the kernels
pass the PTX audit (:mod:`refopt.kernels.cuda.ptx`: no plain ``mul``); on the simulator their
Python bodies. The float32 <-> uint32 reinterpretations are the CPU module's LLVM ``bitcast``
intrinsics, which numba-cuda lowers to ``mov.b32``.

No ``cuda.fp16`` intrinsic is used: ``cvt.rn.f16.f32`` would round the same finite values,
but NaNs would not keep NumPy's payloads, and there is no bfloat16 conversion in numba-cuda.

=================== =====================================================================
float16 -> float32  exact; NaN keeps its sign and payload (NumPy's ``astype``)
float32 -> float16  nearest even, subnormals, overflow to inf from 65520; NaN keeps its sign
                    and top 10 payload bits, at least 1 (NumPy's cast)
bfloat16 -> float32 exact: the bits shifted left by 16
float32 -> bfloat16 nearest even on the top 16 bits (a ``0x7FFF`` + lsb bias, then the
                    shift); NaN becomes the quiet ``0x7FC0`` with its sign (ml_dtypes' cast)
=================== =====================================================================
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.kernels.cpu.halfbits import (
    _F16_MIN_NORMAL,
    _F16_OVERFLOW,
    _REBIAS,
    KIND_BF16,
    KIND_F16,
    bf16_to_f32,
    bits_f32,
    f32_bits,
    kind_of,
)
from refopt.rules import ops

__all__ = ["KIND_BF16", "KIND_F16", "bf16_to_f32", "f16_to_f32", "f32_to_bf16", "f32_to_f16",
           "kind_of", "load", "store"]


@register_jitable
def f16_to_f32(h):
    """The float32 value of the float16 bits ``h``: exact."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    em = h & np.uint32(0x7FFF)
    normal = (em << np.uint32(13)) + np.uint32(_REBIAS)
    special = normal + np.uint32(_REBIAS)  # inf and NaN: exponent 0xFF, payload kept
    # zero and subnormals: em * 2**-24, exact (a power-of-two scaling of an exact integer)
    small = f32_bits(ops.mul(np.float32(em), np.float32(2.0**-24)))
    r = small if em < np.uint32(0x400) else (special if em >= np.uint32(0x7C00) else normal)
    return bits_f32(r | sign)


@register_jitable
def f32_to_f16(x):
    """The float16 bits (uint16) of the float32 ``x``, rounded to nearest even."""
    u = f32_bits(np.float32(x))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    # (no unsigned wrap anywhere: the simulator runs this on NumPy scalars, which warn)
    m = max(a, np.uint32(_F16_MIN_NORMAL)) - np.uint32(_REBIAS)
    normal = (m + np.uint32(0xFFF) + ((m >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
    # subnormal results: |x| + 0.5 has an ulp of 2**-24, the float16 subnormal unit
    # (|x| clamped to the float16 normal range's start first: no NaN operand, no wrap)
    small = f32_bits(ops.add(bits_f32(min(a, np.uint32(_F16_MIN_NORMAL))),
                             np.float32(0.5))) - np.uint32(0x3F000000)
    payload = (a & np.uint32(0x7FFFFF)) >> np.uint32(13)
    nan = np.uint32(0x7C00) + max(payload, np.uint32(1))
    big = nan if a > np.uint32(0x7F800000) else np.uint32(0x7C00)
    r = small if a < np.uint32(_F16_MIN_NORMAL) else (
        big if a >= np.uint32(_F16_OVERFLOW) else normal)
    return np.uint16(r | sign)


@register_jitable
def f32_to_bf16(x):
    """The bfloat16 bits (uint16) of the float32 ``x``, rounded to nearest even: the
    magnitude rounded (``0x7FFF`` plus the kept lsb, then the shift; a carry reaches the
    exponent, and infinity past the largest finite value), the sign put back; a NaN becomes
    the quiet ``0x7FC0`` with its sign."""
    u = f32_bits(np.float32(x))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    r = (a + np.uint32(0x7FFF) + ((a >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    r = np.uint32(0x7FC0) if a > np.uint32(0x7F800000) else r
    return np.uint16(r | sign)


@register_jitable
def load(h, kind):
    """The float32 value of the bits ``h`` of format ``kind`` (a compile-time constant in the
    kernels: only one conversion is compiled)."""
    if kind == KIND_BF16:
        return bf16_to_f32(h)
    return f16_to_f32(h)


@register_jitable
def store(x, kind):
    """The bits (uint16) of the float32 ``x`` rounded to format ``kind``."""
    if kind == KIND_BF16:
        return f32_to_bf16(x)
    return f32_to_f16(x)
