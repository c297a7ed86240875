"""Target arithmetic: the operations every rule is written with (one rounding each).

A rule (see :mod:`refopt.rules`) never uses ``*``, ``+``, ``-``, ``/`` or ``np.sqrt`` on
floats: it calls :func:`mul`, :func:`add`, :func:`sub`, :func:`div`, :func:`sqrt`,
:func:`fma`, :func:`maximum` and :func:`minimum`. Each is one function with three
implementations, chosen by where the rule is compiled:

- **Python** (the bodies below): NumPy scalar arithmetic. Used by numba-cuda's simulator and
  when a rule is called from plain Python (tests).
- **CPU** (``@overload(..., target="cpu")``): the plain operators. Numba compiles without
  ``fastmath``, so LLVM neither contracts ``a * b + c`` nor reorders anything.
- **CUDA** (``@overload(..., target="cuda")``, registered by :func:`register_cuda`):
  libdevice's explicitly rounded ``__nv_fmul_rn`` & co., which NVVM never contracts into an
  FMA (numba-cuda has no ``-fma=0``); float16 computes on operands widened to float32 and
  rounds back once (``2 * 11 + 2 <= 24`` significand bits: the correctly rounded float16
  result, as NumPy's float16 loops).

:func:`fma` is ``a * b + c`` rounded *once*, where a framework's kernel contracts (PyTorch's
vectorised CPU kernels, XLA under ``jit``). It is computed by the same algorithm on every
target and in :func:`refopt.reference.variants.fma`: float32 through float64 (the product is
exact there, the sum is rounded to float64 and then to float32; float16 likewise), float64
with Dekker's product and Knuth's sum (error-free transformations, falling back to
``a * b + c`` where they overflow). So every backend gives the same bits,
which the property tests check.

:func:`cpow` is the C library's ``powf``/``pow`` (:func:`refopt.reference.ftrl.c_pow`, as
TensorFlow's scalar ``pow``), on the CPU target only: Numba lowers ``math.pow`` on float32 and
float64 to one call of ``powf``/``pow`` per element (no vector library: ``USING_SVML`` is
False; :data:`CPU_POW` says whether the fast paths may use it). CUDA has no libm-identical
``pow``: it has no CUDA implementation, so a rule that calls it is never compiled for a GPU.

``maximum``/``minimum`` are NumPy's: a NaN on either side propagates; of two equal values
(``+0.0``, ``-0.0``) the float32/float64 loops return the second operand and the float16
loops the first.
"""

from __future__ import annotations

import math

import numpy as np
from numba import types
from numba.core.extending import overload, register_jitable

__all__ = ["add", "sub", "mul", "div", "sqrt", "fma", "rsqrt", "maximum", "minimum", "cpow",
           "CPU_POW", "register_cuda"]

_SPLIT = 134217729.0  # 2**27 + 1 (Veltkamp)


# ----------------------------------------------------------------------------- Python
def add(a, b):
    """``a + b``, one rounding."""
    return a + b


def sub(a, b):
    """``a - b``, one rounding."""
    return a - b


def mul(a, b):
    """``a * b``, one rounding."""
    return a * b


def div(a, b):
    """``a / b``, one rounding."""
    return a / b


def sqrt(a):
    """Correctly rounded square root."""
    return np.sqrt(a)


def maximum(a, b):
    """``np.maximum(a, b)`` of two scalars."""
    return np.maximum(a, b)


def minimum(a, b):
    """``np.minimum(a, b)`` of two scalars."""
    return np.minimum(a, b)


def _fma64_py(a, b, c):
    a, b, c = np.float64(a), np.float64(b), np.float64(c)
    p = a * b
    ta = _SPLIT * a
    ah = ta - (ta - a)
    al = a - ah
    tb = _SPLIT * b
    bh = tb - (tb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    s = p + c
    bb = s - p
    f = (p - (s - bb)) + (c - bb)
    out = s + (f + e)
    if np.isfinite(out) and np.isfinite(p) and abs(p) < 1e300:
        return out
    return a * b + c


def fma(a, b, c):
    """``a * b + c`` rounded once (see the module docstring for the method per dtype)."""
    dt = np.result_type(a, b, c)
    with np.errstate(all="ignore"):
        if dt == np.float32:
            return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
        if dt == np.float64:
            return _fma64_py(a, b, c)
        return np.float16(np.float64(a) * np.float64(b) + np.float64(c))


# ----------------------------------------------------------------------------- rsqrt
# Correctly rounded 1/sqrt(x), built from the operations above (so the same bits on every
# target): the algorithms of :func:`refopt.reference.rmsprop.rsqrt`, per element.
def _two_prod(a, b):
    p = mul(a, b)
    ta = mul(134217729.0, a)
    ah = sub(ta, sub(ta, a))
    al = sub(a, ah)
    tb = mul(134217729.0, b)
    bh = sub(tb, sub(tb, b))
    bl = sub(b, bh)
    e = add(add(add(sub(mul(ah, bh), p), mul(ah, bl)), mul(al, bh)), mul(al, bl))
    return p, e


def _positive_finite(x64):
    return x64 > 0.0 and x64 <= 1.7976931348623157e308


def _rsqrt16(x):
    x64 = np.float64(x)
    return np.float16(div(1.0, sqrt(x64)))


def _rsqrt32(x):
    # 1/sqrt in float64 (two correctly rounded operations), rounded once to float32: correctly
    # rounded for every float32. 1/sqrt(4x) = (1/sqrt(x))/2 exactly in float64 and in the
    # float32 rounding (results lie in [5e-20, 3e22], normal), so every positive x behaves as
    # its representative in [1, 4); all 2**24 of those were checked against the correctly
    # rounded reference (tests/test_rmsprop_reference.py), no exception. Branch-free.
    return np.float32(div(1.0, sqrt(np.float64(x))))


def _rsqrt64(x):
    if not _positive_finite(x):
        return div(1.0, sqrt(x))
    f, e = math.frexp(x)
    if e % 2 != 0:
        f = mul(f, 2.0)
        e = e - 1
    y0 = div(1.0, sqrt(f))
    a, b = _two_prod(y0, y0)
    c, d = _two_prod(a, f)
    z = add(add(sub(c, 1.0), d), mul(b, f))
    y = add(y0, mul(y0, mul(z, sub(mul(0.375, z), 0.5))))
    return math.ldexp(y, -(e // 2))


def rsqrt(x):
    """Correctly rounded ``1/sqrt(x)`` (``0 -> inf``, ``inf -> 0``, negative or NaN -> NaN).

    float32 and float16: ``1/sqrt`` in float64 rounded once (shown correctly rounded for every
    float32 by an exhaustive check over one binade pair); float64: one Newton step with an
    error-free residual. The reference (:func:`refopt.reference.rmsprop.rsqrt`) computes the
    float32 case differently (with a midpoint correction), so the tests compare two
    algorithms.
    """
    dt = np.asarray(x).dtype
    with np.errstate(all="ignore"):
        if dt == np.float64:
            return np.float64(_rsqrt64(np.float64(x)))
        if dt == np.float32:
            return _rsqrt32(x)
        return _rsqrt16(x)


# ----------------------------------------------------------------------------- pow
def cpow(x, y):
    """``x ** y`` by the C library's ``powf`` (float32; float16: on the float32 values,
    rounded) or ``pow`` (float64): :func:`refopt.reference.ftrl.c_pow` on one element.

    CPU target only (see the module docstring); rules that call it must be refused on CUDA.
    """
    from refopt import _libm

    dt = np.result_type(np.asarray(x).dtype, np.asarray(y).dtype)
    with np.errstate(all="ignore"):
        return _libm.power(dt, x, y)


def _cpu_pow_is_libm():
    import sys

    import numba

    from refopt import _libm

    # the reference calls the C library through ctypes; Numba's math.pow calls the same
    # symbols of the same (glibc) library, element by element, where no vector library
    # replaces them. Elsewhere the fast paths keep the reference's step.
    return bool(_libm.HAVE_LIBM and sys.platform.startswith("linux")
                and not getattr(numba.config, "USING_SVML", False))


#: Whether :func:`cpow` compiled for the CPU gives the reference's bits (the rules that call
#: it are offered only then).
CPU_POW = _cpu_pow_is_libm()


def _cpow_overload(x, y):
    if x == types.float32 and y == types.float32:
        def f32(x, y):
            # c_pow hands powf Python floats: a signalling NaN arrives quietened, so
            # pow(sNaN, 0) and pow(1, sNaN) give 1 there (powf itself: NaN). The same here.
            if y == 0 or x == 1:
                return np.float32(1.0)
            return math.pow(x, y)
        return f32
    if x == types.float64 and y == types.float64:
        return lambda x, y: math.pow(x, y)
    return None


# ----------------------------------------------------------------------------- CPU
def _float(t):
    return isinstance(t, types.Float)


@overload(add, target="cpu")
def _add_cpu(a, b):
    return lambda a, b: a + b


@overload(sub, target="cpu")
def _sub_cpu(a, b):
    return lambda a, b: a - b


@overload(mul, target="cpu")
def _mul_cpu(a, b):
    return lambda a, b: a * b


@overload(div, target="cpu")
def _div_cpu(a, b):
    return lambda a, b: a / b


@overload(sqrt, target="cpu")
def _sqrt_cpu(a):
    return lambda a: np.sqrt(a)


def _max_impl(tie_first):
    if tie_first:
        return lambda a, b: a if (a >= b or a != a) else b
    return lambda a, b: a if (a > b or a != a) else b


def _min_impl(tie_first):
    if tie_first:
        return lambda a, b: a if (a <= b or a != a) else b
    return lambda a, b: a if (a < b or a != a) else b


@overload(maximum, target="cpu")
def _maximum_cpu(a, b):
    return _max_impl(a == types.float16)


@overload(minimum, target="cpu")
def _minimum_cpu(a, b):
    return _min_impl(a == types.float16)


def _fma_impl(kind, mul_, add_, sub_):
    """The fma of one dtype built from a target's ``mul``/``add``/``sub`` (float64 ones)."""
    if kind == "f32":
        def f32(a, b, c):
            return np.float32(add_(mul_(np.float64(a), np.float64(b)), np.float64(c)))
        return f32
    if kind == "f64":
        def f64(a, b, c):
            p = mul_(a, b)
            ta = mul_(134217729.0, a)
            ah = sub_(ta, sub_(ta, a))
            al = sub_(a, ah)
            tb = mul_(134217729.0, b)
            bh = sub_(tb, sub_(tb, b))
            bl = sub_(b, bh)
            e = add_(add_(add_(sub_(mul_(ah, bh), p), mul_(ah, bl)), mul_(al, bh)),
                     mul_(al, bl))
            s = add_(p, c)
            bb = sub_(s, p)
            f = add_(sub_(p, sub_(s, bb)), sub_(c, bb))
            out = add_(s, add_(f, e))
            if abs(out) <= 1.7976931348623157e308 and abs(p) < 1e300:
                return out
            return add_(mul_(a, b), c)
        return f64
    def f16(a, b, c):
        return np.float16(add_(mul_(np.float64(a), np.float64(b)), np.float64(c)))
    return f16


def _fma_kind(a, b, c):
    ts = (a, b, c)
    if any(t == types.float64 for t in ts):
        return "f64"
    if any(t == types.float32 for t in ts):
        return "f32"
    return "f16"


def _rsqrt_overload(x):
    if x == types.float64:
        return _rsqrt64
    if x == types.float32:
        return _rsqrt32
    if x == types.float16:
        return _rsqrt16
    return None


for _helper in (_two_prod, _positive_finite, _rsqrt16, _rsqrt32, _rsqrt64):
    register_jitable(_helper)
overload(rsqrt, target="cpu")(_rsqrt_overload)


@overload(fma, target="cpu")
def _fma_cpu(a, b, c):
    return _fma_impl(_fma_kind(a, b, c), mul, add, sub)


overload(cpow, target="cpu")(_cpow_overload)


# ----------------------------------------------------------------------------- CUDA
_CUDA_REGISTERED = False


def register_cuda():
    """Register the CUDA implementations (libdevice ``*_rn``); idempotent.

    Called by :mod:`refopt.kernels.cuda` before it compiles a rule for a GPU (not on the
    simulator, which runs the Python bodies).
    """
    global _CUDA_REGISTERED
    if _CUDA_REGISTERED:
        return
    from numba.cuda import libdevice as ld

    f16, f32, f64 = types.float16, types.float32, types.float64

    def binary(name, f_op, d_op):
        def impl(a, b):
            if a == f64 or b == f64:
                return lambda a, b: d_op(np.float64(a), np.float64(b))
            if a == f32 or b == f32:
                return lambda a, b: f_op(np.float32(a), np.float32(b))
            if a == f16 and b == f16:
                return lambda a, b: np.float16(f_op(np.float32(a), np.float32(b)))
            return None
        return impl

    @register_jitable  # a device function: a plain Python one cannot be called from a kernel
    def dsub(a, b):
        return ld.dadd_rn(a, -b)

    overload(add, target="cuda")(binary("add", ld.fadd_rn, ld.dadd_rn))
    overload(sub, target="cuda")(binary("sub", ld.fsub_rn, dsub))
    overload(mul, target="cuda")(binary("mul", ld.fmul_rn, ld.dmul_rn))
    overload(div, target="cuda")(binary("div", ld.fdiv_rn, ld.ddiv_rn))

    @overload(sqrt, target="cuda")
    def _sqrt_cuda(a):
        if a == f64:
            return lambda a: ld.dsqrt_rn(a)
        if a == f32:
            return lambda a: ld.fsqrt_rn(a)
        if a == f16:
            return lambda a: np.float16(ld.fsqrt_rn(np.float32(a)))
        return None

    @overload(maximum, target="cuda")
    def _maximum_cuda(a, b):
        return _max_impl(a == f16)

    @overload(minimum, target="cuda")
    def _minimum_cuda(a, b):
        return _min_impl(a == f16)

    overload(rsqrt, target="cuda")(_rsqrt_overload)

    @overload(fma, target="cuda")
    def _fma_cuda(a, b, c):
        return _fma_impl(_fma_kind(a, b, c), mul, add, sub)

    _CUDA_REGISTERED = True
