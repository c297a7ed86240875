"""The C math library's ``pow``, ``powf``, ``cosf`` and ``logf``, as TensorFlow's CPU kernels call them.

TensorFlow evaluates ``tf.pow`` (and the ``cos``/``log`` of the schedules) on a scalar with the
C library's functions. NumPy's array ``np.power`` instead may use a vectorised approximation
(AVX-512 SVML on some CPUs) that differs in the last bit, which made the bias correction
``beta ** t`` of Adam differ from tf-keras at t = 4 for beta 0.9 (``np.power`` gives 0.6561,
``powf`` and ``tf.pow`` 0.6560999). These wrappers call the C library through ``ctypes``; where
it cannot be loaded they fall back to the correctly rounded value (computed in float64, rounded
once), which agrees with glibc except in rare last-bit cases.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

__all__ = ["power", "powf", "cosf", "logf"]


def _load():
    for name in (ctypes.util.find_library("m"), "libm.so.6", ctypes.util.find_library("c")):
        if not name:
            continue
        try:
            lib = ctypes.CDLL(name)
            fns = {}
            for fn, ctype in (("powf", ctypes.c_float), ("cosf", ctypes.c_float),
                              ("logf", ctypes.c_float), ("pow", ctypes.c_double)):
                f = getattr(lib, fn)
                f.restype = ctype
                f.argtypes = [ctype, ctype] if fn.startswith("pow") else [ctype]
                fns[fn] = f
            return fns
        except (OSError, AttributeError):
            continue
    return None


_C = _load()
#: True when the C library's functions are used (False: correctly rounded fallback).
HAVE_LIBM = _C is not None


def powf(x, y):
    """float32 ``x ** y`` as the C library's ``powf`` computes it; returns ``np.float32``."""
    if _C is not None:
        return np.float32(_C["powf"](float(x), float(y)))
    with np.errstate(all="ignore"):
        return np.float32(np.float64(x) ** np.float64(y))


def cosf(x):
    """float32 ``cos(x)`` as the C library's ``cosf``; returns ``np.float32``."""
    if _C is not None:
        return np.float32(_C["cosf"](float(x)))
    return np.float32(math.cos(float(x)))


def logf(x):
    """float32 ``log(x)`` as the C library's ``logf``; returns ``np.float32``."""
    if _C is not None:
        return np.float32(_C["logf"](float(x)))
    with np.errstate(all="ignore"):
        return np.float32(np.log(np.float64(x)))


def power(dtype, x, y):
    """``x ** y`` in ``dtype`` as TensorFlow's CPU ``tf.pow`` on scalars of that dtype.

    float32: ``powf``; float64: ``pow``; float16: ``powf`` on the float32 values, rounded to
    float16 (Eigen's ``half`` computes through float).
    """
    dtype = np.dtype(dtype)
    if dtype == np.float64:
        if _C is not None:
            return np.float64(_C["pow"](float(x), float(y)))
        with np.errstate(all="ignore"):
            return np.float64(x) ** np.float64(y)
    with np.errstate(all="ignore"):
        return dtype.type(powf(np.float32(x), np.float32(y)))
