"""MKL's vector square root, the one torch's CPU ``sqrt`` calls.

torch's CPU ``sqrt`` on float32 and float64 tensors goes to MKL's vector math library
(``vmsSqrt`` / ``vmdSqrt`` in high-accuracy mode), which is not correctly rounded: about 17% of
float32 results and 1% of float64 results are 1 ulp away from IEEE ``sqrt``. Frameworks built
on torch's tensor operations (torch's for-loop optimizers, bitsandbytes' CPU kernels) inherit
it. This module calls the same function, found without importing torch:

1. in torch's own ``libtorch_cpu`` (which exports MKL's symbols), else
2. in the ``mkl`` wheel's ``libmkl_rt``.

The result is elementwise (it does not depend on the array's length or alignment; checked
against torch on 10^6 values and every length up to 1000) but may depend on the CPU, as MKL
picks its code path by instruction set: it equals torch's on the machine it runs on.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os
import sys

import numpy as np

__all__ = ["mkl_address", "mkl_available", "mkl_sqrt"]

# VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE: the mode torch passes (aten/src/ATen/cpu/vml.h)
_MODE = 0x2 | 0x140000 | 0x100
_FUNCS = None
_ADDRESSES = {}  # dtype -> (address, mode) or None, for mkl_address


def _candidates():
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            yield os.path.join(root, "lib", "libtorch_cpu.so")
    yield from sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))


def _load():
    global _FUNCS
    if _FUNCS is None:
        _FUNCS = False
        for path in _candidates():
            if not os.path.exists(path):
                continue
            try:
                lib = ctypes.CDLL(path)
                fs, fd = lib.vmsSqrt, lib.vmdSqrt
            except (OSError, AttributeError):
                continue
            for f in (fs, fd):
                f.argtypes = [ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_longlong]
                f.restype = None
            _FUNCS = {np.dtype(np.float32): fs, np.dtype(np.float64): fd}
            break
    return _FUNCS


def mkl_available():
    """bool: whether MKL's vector ``sqrt`` was found (torch or the ``mkl`` wheel installed)."""
    return bool(_load())


def mkl_address(dtype):
    """(address, mode): the integer address of ``vmsSqrt`` (float32) or ``vmdSqrt``
    (float64) and the mode torch passes, for compiled code that calls it
    (:func:`refopt.kernels.cpu._kernels._vector_root`); None when MKL was not found or for
    another dtype."""
    dtype = np.dtype(dtype)
    if dtype not in _ADDRESSES:
        funcs = _load()
        f = funcs.get(dtype) if funcs else None
        _ADDRESSES[dtype] = None if f is None else (ctypes.cast(f, ctypes.c_void_p).value,
                                                    _MODE)
    return _ADDRESSES[dtype]


def mkl_sqrt(x):
    """Elementwise square root by MKL's ``vmsSqrt``/``vmdSqrt``, as torch's CPU ``sqrt``.

    Parameters
    ----------
    x : array_like of float32 or float64

    Returns
    -------
    ndarray
        A new array, same shape and dtype.

    Raises
    ------
    TypeError
        Another dtype.
    RuntimeError
        Neither torch nor the ``mkl`` wheel is installed.
    """
    x = np.asarray(x)
    funcs = _load()
    if not funcs:
        raise RuntimeError(
            "MKL's vector sqrt (torch's CPU sqrt) needs torch or the `mkl` wheel: "
            "pip install torch (or mkl)")
    f = funcs.get(x.dtype)
    if f is None:
        raise TypeError(f"mkl_sqrt takes float32 or float64. Received: dtype={x.dtype}")
    src = np.ascontiguousarray(x)
    out = np.empty_like(src)
    if src.size:
        f(src.size, src.ctypes.data, out.ctypes.data, _MODE)
    return out.reshape(x.shape)
