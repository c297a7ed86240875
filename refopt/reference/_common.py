"""Shared argument checks and scalar rounding for the reference functions."""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def as_float_array(name, a):
    """Return ``a`` as an ndarray of float16/32/64, or raise naming ``name``."""
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"`{name}` must be a numpy.ndarray. Received: {name} of type {type(a).__name__}"
        )
    if a.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"`{name}` must have dtype float16, float32 or float64. "
            f"Received: {name} with dtype={a.dtype}"
        )
    return a


def check_like(param, name, a):
    """Check that state or gradient ``a`` has the shape and dtype of ``param``."""
    as_float_array(name, a)
    if a.shape != param.shape or a.dtype != param.dtype:
        raise ValueError(
            f"`{name}` must have the shape and dtype of the variable, {param.shape} "
            f"{param.dtype}. Received: {name} with shape={a.shape}, dtype={a.dtype}"
        )


def check_grad(param, grad):
    """Check a dense or sparse gradient against its variable; return it unchanged."""
    if isinstance(grad, IndexedSlices):
        if grad.dense_shape != param.shape or grad.dtype != param.dtype:
            raise ValueError(
                "`grad` (IndexedSlices) must have dense_shape and dtype equal to the "
                f"variable's, {param.shape} {param.dtype}. Received: "
                f"dense_shape={grad.dense_shape}, dtype={grad.dtype}"
            )
        return grad
    check_like(param, "grad", grad)
    return grad


def scalar(dtype, x):
    """Round the Python number ``x`` once to ``dtype`` (what ``tf.cast`` of a Python float does)."""
    return dtype.type(x)
