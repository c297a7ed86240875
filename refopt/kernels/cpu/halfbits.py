"""float16 and bfloat16 as uint16 bits in Numba CPU kernels: exact conversions from and to float32.

Numba's CPU target has no float16 (nor bfloat16) type, so the fused kernels take the uint16
bits of a low-precision array (``a.view(np.uint16)``), load each element into float32 with
:func:`f16_to_f32` / :func:`bf16_to_f32` (exact: float32 holds every float16 and bfloat16
value) and store a float32 result with :func:`f32_to_f16` / :func:`f32_to_bf16`, rounded once
to nearest, ties to even. The functions are ``register_jitable`` (callable from any
``@njit`` code and, unjitted, from Python on ints, under ``np.errstate(all="ignore")``:
the bit arithmetic wraps, and every case is computed before one is selected) and work on the
bits only: no float16
arithmetic, no library call, no dependence on the CPU's F16C instructions.

They give the bits :func:`refopt.precision.round_to` (NumPy's float32 -> float16 cast,
ml_dtypes' float32 -> bfloat16 cast) and ``astype(np.float32)`` give, for all 65,536 inputs
of the loads and for every float32 input of the stores (``tests/test_halfbits.py``), NaNs
included:

===================  =====================================================================
float16 -> float32   exact; subnormals normalised; NaN keeps its sign and payload
                     (``payload << 13``, not quieted), as NumPy's ``npy_halfbits_to_floatbits``
float32 -> float16   round to nearest even, subnormal results, overflow to infinity from
                     65520 up; NaN keeps its sign and the top 10 payload bits, a payload that
                     would vanish becomes 1 (NumPy's ``npy_floatbits_to_halfbits``)
bfloat16 -> float32  exact: the bits shifted left by 16
float32 -> bfloat16  round to nearest even on the top 16 bits (subnormals and overflow
                     included); a NaN becomes the quiet NaN ``0x7FC0`` with its sign
                     (ml_dtypes 0.7, Eigen's ``float_to_bfloat16_rtne``)
===================  =====================================================================

The bits of a float32 are reinterpreted with :func:`f32_bits` / :func:`bits_f32`, two LLVM
``bitcast`` intrinsics (no memory round trip; LLVM vectorises loops that use them).
Written from the IEEE 754 binary16 and bfloat16 layouts, not from any library's code.
"""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic, overload, register_jitable

__all__ = ["KIND_BF16", "KIND_F16", "bf16_to_f32", "bits_f32", "f16_to_f32", "f32_bits",
           "f32_to_bf16", "f32_to_f16", "kind_of"]

#: Codes of the low-precision formats (a compile-time constant of a generated kernel).
KIND_F16, KIND_BF16 = 1, 2


def kind_of(dtype):
    """:data:`KIND_F16` for float16, :data:`KIND_BF16` for bfloat16, else 0."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return KIND_F16
    if dtype.kind == "V" and dtype.itemsize == 2 and dtype.name == "bfloat16":
        return KIND_BF16
    return 0


@intrinsic
def _f32_bits(typingctx, x):
    if not isinstance(x, types.Float) or x.bitwidth != 32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(x), codegen


@intrinsic
def _bits_f32(typingctx, u):
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = context.get_value_type(types.uint32)
        v = args[0]
        width = v.type.width
        if width > 32:
            v = builder.trunc(v, i32)
        elif width < 32:
            v = builder.zext(v, i32)
        return builder.bitcast(v, context.get_value_type(types.float32))

    return types.float32(u), codegen


def f32_bits(x):
    """The uint32 bits of the float32 ``x`` (jitted: an LLVM ``bitcast``)."""
    return int(np.float32(x).view(np.uint32))


def bits_f32(u):
    """The float32 whose bits are the low 32 bits of the integer ``u``."""
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


# In jitted code the two are the intrinsics; from Python, the NumPy forms above.

@overload(f32_bits, jit_options={"inline": "always"})
def _ov_f32_bits(x):
    return lambda x: _f32_bits(x)


@overload(bits_f32, jit_options={"inline": "always"})
def _ov_bits_f32(u):
    return lambda u: _bits_f32(u)


# Constants of the binary16 layout (sign 1, exponent 5 bits biased by 15, fraction 10) against
# binary32 (exponent 8 bits biased by 127, fraction 23): a fraction moves 13 bits.
_REBIAS = (127 - 15) << 23  # float32 exponent field minus float16's, in float32 position
_F16_MIN_NORMAL = 0x38800000  # 2**-14 as float32 bits
_F16_OVERFLOW = 0x477FF000  # 65520: half-way between 65504 and 2**16, rounds (even) to inf


# Each conversion is written without branches (every case computed, the result selected), so
# that LLVM vectorises the kernels' loops around it.
@register_jitable
def f16_to_f32(h):
    """The float32 value of the float16 bits ``h`` (an integer in [0, 65536)): exact."""
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    em = h & np.uint32(0x7FFF)  # exponent and fraction
    normal = (em << np.uint32(13)) + np.uint32(_REBIAS)
    # inf and NaN: exponent 0x1F -> 0xFF, the fraction (NaN payload) kept, not quieted
    special = normal + np.uint32(_REBIAS)
    # zero and subnormals em * 2**-24: exact in float32, and no float32 subnormal involved
    small = f32_bits(np.float32(em) * np.float32(2.0**-24))
    r = small if em < np.uint32(0x400) else (special if em >= np.uint32(0x7C00) else normal)
    return bits_f32(r | sign)


@register_jitable
def f32_to_f16(x):
    """The float16 bits (uint16) of the float32 ``x`` rounded to nearest, ties to even."""
    u = f32_bits(np.float32(x))
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    # normal results: rebias, then round the 13 dropped bits to nearest even (a carry moves
    # into the exponent; from 65520 up it would reach infinity's bits and beyond: selected)
    m = a - np.uint32(_REBIAS)
    normal = (m + np.uint32(0xFFF) + ((m >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
    # subnormal results and zero: |x| + 0.5 in float32 has an ulp of 2**-24, the float16
    # subnormal unit, so the float32 addition rounds |x| * 2**24 to nearest even, exactly
    # (a float32 subnormal |x| gives 0 even where the CPU treats it as zero)
    small = f32_bits(bits_f32(a) + np.float32(0.5)) - np.uint32(0x3F000000)
    # NaN: the top 10 payload bits, at least 1 (still a NaN)
    payload = (a & np.uint32(0x7FFFFF)) >> np.uint32(13)
    nan = np.uint32(0x7C00) + max(payload, np.uint32(1))
    big = nan if a > np.uint32(0x7F800000) else np.uint32(0x7C00)
    r = small if a < np.uint32(_F16_MIN_NORMAL) else (
        big if a >= np.uint32(_F16_OVERFLOW) else normal)
    return np.uint16(r | sign)


@register_jitable
def bf16_to_f32(h):
    """The float32 value of the bfloat16 bits ``h``: exact (the bits shifted by 16)."""
    return bits_f32(np.uint32(h) << np.uint32(16))


@register_jitable
def f32_to_bf16(x):
    """The bfloat16 bits (uint16) of the float32 ``x`` rounded to nearest, ties to even."""
    u = f32_bits(np.float32(x))
    # adding 0x7FFF plus the kept lsb rounds the 16 dropped bits to nearest even; a carry
    # moves into the exponent (to infinity past the largest finite value), as it should
    r = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)  # quiet, signed
    return np.uint16(nan if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000) else r)


@register_jitable
def load(h, kind):
    """The float32 value of the bits ``h`` of format ``kind`` (:data:`KIND_F16` or
    :data:`KIND_BF16`; both computed, one selected: no branch in a vectorised loop)."""
    b = bf16_to_f32(h)
    f = f16_to_f32(h)
    return b if kind == KIND_BF16 else f


@register_jitable
def store(x, kind):
    """The bits of the float32 ``x`` rounded to format ``kind``."""
    b = f32_to_bf16(x)
    f = f32_to_f16(x)
    return b if kind == KIND_BF16 else f
