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
    """Convert the Python number ``x`` to ``dtype`` with one rounding.

    What TensorFlow does when a Python float meets a tensor in an operation (``eps + sqrt(v)``,
    ``g * (1 - beta_1)``, ``ema_momentum * average``): the number is converted straight to the
    tensor's dtype.
    """
    return np.dtype(dtype).type(x)


def tf_cast(dtype, x):
    """Convert the Python number ``x`` to ``dtype`` as ``tf.cast(x, dtype)`` does: via float32.

    ``tf.cast`` first makes a tensor of the Python float, which is float32, then casts it; so
    for float64 the value is ``float64(float32(x))`` (``tf.cast(0.9, tf.float64)`` is
    0.8999999761581421) and for float16 it is rounded twice. tf-keras uses ``tf.cast`` for
    ``beta_1``/``beta_2`` inside the bias-correction powers, for SGD's ``momentum``, for
    ``weight_decay`` and (from its float32 variable) for the learning rate.
    """
    with np.errstate(over="ignore"):
        return np.dtype(dtype).type(np.float32(x))
