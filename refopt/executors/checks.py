"""Checks shared by the pipeline and the executors: the bottom of the step's layers.

Owns: unpacking ``grads_and_vars``, the int64 counter limit, and the validation of host
(NumPy) variables and gradients, with the error messages of every backend that keeps its
state in host memory (``"reference"``, ``"cpu"``). Imports nothing of the package above it.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices

__all__ = ["unpack_pairs", "describe", "check_host_variable", "check_host_pairs",
           "FLOAT_DTYPES"]

#: tf-keras' ``iterations`` is an int64.
_INT64_MAX = 2**63 - 1

#: The dtypes a variable may have (bfloat16: ``ml_dtypes.bfloat16``, where the convention
#: computes it in float32, see :mod:`refopt.precision`).
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
try:
    import ml_dtypes as _ml_dtypes

    FLOAT_DTYPES += (np.dtype(_ml_dtypes.bfloat16),)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    pass


def describe(a):
    """A short description of ``a`` for error messages."""
    if isinstance(a, np.ndarray):
        return f"ndarray(shape={a.shape}, dtype={a.dtype})"
    return type(a).__name__


def unpack_pairs(grads_and_vars):
    """``grads_and_vars`` as a list of ``(grad, var)`` tuples, or a TypeError naming the position."""
    pairs = []
    for i, pair in enumerate(grads_and_vars):
        try:
            grad, var = pair
        except (TypeError, ValueError):
            raise TypeError(
                "`grads_and_vars` must be an iterable of (gradient, variable) pairs. "
                f"Received at position {i}: {type(pair).__name__}"
            ) from None
        pairs.append((grad, var))
    return pairs


def check_host_variable(var, where):
    """Raise unless ``var`` is a float16/32/64, C-contiguous, writeable ``numpy.ndarray``."""
    if not isinstance(var, np.ndarray):
        raise TypeError(
            f"Variables must be numpy.ndarray. Received: {where} of type {type(var).__name__}"
        )
    if var.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"Variables must have dtype float16, float32 or float64 (or ml_dtypes.bfloat16). "
            f"Received: {where} with dtype={var.dtype}"
        )
    if not var.flags.c_contiguous:
        raise ValueError(
            f"Variables must be C-contiguous (they are updated in place). Received: {where} "
            f"with shape={var.shape}, strides={var.strides}; pass np.ascontiguousarray(...) "
            "and keep that array as the variable."
        )
    if not var.flags.writeable:
        raise ValueError(
            f"Variables must be writeable (they are updated in place). Received: {where} is "
            "read-only."
        )


def check_host_pairs(grads_and_vars):
    """Validate ``(gradient, variable)`` pairs of host arrays; return them as a list.

    Raises
    ------
    TypeError
        A malformed pair, a variable that is not a float ndarray, a gradient of another type
        or dtype than its variable.
    ValueError
        A shape mismatch, a non-contiguous or read-only variable, the same variable twice.
    """
    pairs = unpack_pairs(grads_and_vars)
    seen = set()
    for i, (grad, var) in enumerate(pairs):
        check_host_variable(var, f"variable at position {i}")
        if id(var) in seen:
            raise ValueError(
                f"The same variable appears twice in `grads_and_vars` (position {i}, "
                f"{describe(var)})."
            )
        seen.add(id(var))
        if grad is None:
            continue
        if isinstance(grad, IndexedSlices):
            if grad.dense_shape != var.shape:
                raise ValueError(
                    f"Gradient at position {i} (IndexedSlices) has dense_shape="
                    f"{grad.dense_shape}, but its variable has shape={var.shape}."
                )
            if grad.dtype != var.dtype:
                raise TypeError(
                    f"Gradient at position {i} (IndexedSlices) has dtype={grad.dtype}, but "
                    f"its variable has dtype={var.dtype}; cast the gradient values."
                )
        elif isinstance(grad, np.ndarray):
            if grad.shape != var.shape:
                raise ValueError(
                    f"Gradient at position {i} has shape={grad.shape}, but its variable has "
                    f"shape={var.shape}."
                )
            if grad.dtype != var.dtype:
                raise TypeError(
                    f"Gradient at position {i} has dtype={grad.dtype}, but its variable has "
                    f"dtype={var.dtype}; cast the gradient."
                )
        else:
            raise TypeError(
                f"Gradient at position {i} must be a numpy.ndarray, an IndexedSlices or "
                f"None. Received: {type(grad).__name__}"
            )
    return pairs
