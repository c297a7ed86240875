"""Gradient clipping by value, by norm and by global norm on the GPU.

Same functions, signatures and errors as :mod:`refopt.reference.clipping`
(``tensorflow/python/ops/clip_ops.py``). The elementwise parts are the pipeline's clip step
(:func:`refopt.rules.steps.clip`, run as the rule :data:`refopt.rules.steps.CLIP`: the
reference's operations, bit-identical under the simulator given the same norm). The sums of
squares are NumPy's pairwise sums in the dtype (:func:`refopt.kernels.cuda.sumsq`, the
optimizers' :func:`refopt.kernels.cuda.drivers.sums_of_squares`: device leaves, host tree),
deterministic.
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cuda._common import (
    FLOAT_DTYPES,
    check_scalar,
    cuda,
    scalar,
    to_dev,
    to_host,
)
from refopt.kernels.cuda._launch import clip_dense, sumsq
from refopt.reference.clipping import _rewrap, _values

__all__ = ["clip_by_global_norm", "clip_by_norm", "clip_by_value", "global_norm"]


def _clipped(values, mode, clip=None, cden=None, gscale=None):
    out = cuda.device_array(values.shape, values.dtype)
    clip_dense(out, to_dev(values), mode, clip, cden, gscale)
    return to_host(out)


def norm_denominator(sum_of_squares, c):
    """``maximum(sqrt(s) if s > 0 else s, c)``: clip_by_norm's divisor, in ``s``'s dtype."""
    with np.errstate(all="ignore"):
        n = np.sqrt(sum_of_squares) if sum_of_squares > 0 else sum_of_squares
        return np.maximum(n, c)


def clip_by_value(grad, clip_value):
    r"""Clip every element to :math:`[-c, c]` with the CUDA kernel.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
        Host gradient (its raw rows for an IndexedSlices), never modified.
    clip_value : float

    Returns
    -------
    ndarray or IndexedSlices
        A new host gradient of the same kind; under the simulator bit-identical to
        :func:`refopt.reference.clip_by_value`.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.clip_by_value`.
    """
    values = _values("grad", grad)
    check_scalar("clip_value", clip_value)
    if values.size == 0:
        return _ref.clip_by_value(grad, clip_value)
    return _rewrap(grad, _clipped(values, 1, clip_value))


def clip_by_norm(grad, clip_norm):
    r"""Rescale a tensor to L2 norm at most ``clip_norm``, :math:`g c / \max(\|g\|, c)`.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
        Host gradient; for an IndexedSlices the norm is that of the raw rows.
    clip_norm : float

    Returns
    -------
    ndarray or IndexedSlices
        As :func:`refopt.reference.clip_by_norm`: elementwise bit-identical given the same
        norm (under the simulator); the norm as NumPy sums it (module docstring).

    Raises
    ------
    TypeError
        As :func:`refopt.reference.clip_by_norm`.
    """
    values = _values("grad", grad)
    check_scalar("clip_norm", clip_norm)
    dtype = values.dtype
    if values.size == 0:
        return _ref.clip_by_norm(grad, clip_norm)
    c = scalar(dtype, max(clip_norm, 0))
    G = to_dev(values)
    d = norm_denominator(sumsq(G), c)
    out = cuda.device_array(values.shape, dtype)
    clip_dense(out, G, 2, max(clip_norm, 0), d)
    return _rewrap(grad, to_host(out))


def _same_dtype_values(grads):
    """The values of the non-None gradients if they share a device dtype, else None."""
    if isinstance(grads, (str, bytes)) or not hasattr(grads, "__len__"):
        return None
    values = []
    for g in grads:
        if g is None:
            continue
        if isinstance(g, IndexedSlices):
            values.append(g.values)
        elif isinstance(g, np.ndarray) and g.dtype in FLOAT_DTYPES:
            values.append(np.asarray(g))
        else:
            return None
    if not values or len({v.dtype for v in values}) > 1:
        return None
    return values


def global_norm(grads):
    r"""The L2 norm of all gradients together, :math:`\sqrt{\sum_i \|g_i\|^2}`.

    Parameters
    ----------
    grads : sequence of (ndarray of float16/32/64, IndexedSlices or None)

    Returns
    -------
    numpy floating scalar
        As :func:`refopt.reference.global_norm`: per tensor ``sum(g * g * 0.5)`` on the
        device (:func:`refopt.kernels.cuda.sumsq`, NumPy's pairwise order), then NumPy's sum
        of those halves in the dtype and ``sqrt(h * 2)`` on the host, as the reference.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.global_norm` (which computes every case this function
        does not: empty, mixed dtypes, bad arguments).
    """
    values = _same_dtype_values(grads)
    if values is None:
        return _ref.global_norm(grads)
    dtype = values[0].dtype
    halves = [sumsq(to_dev(v), half=True) if v.size else dtype.type(0) for v in values]
    with np.errstate(all="ignore"):
        half = np.sum(np.asarray(halves, dtype=dtype), dtype=dtype)
        return np.sqrt(half * scalar(dtype, 2.0))


def global_scale(norm, clip_norm):
    """``(N, c * min(1/N, 1/c) + (N - N))`` in the dtype of ``norm`` (float32 if not float)."""
    dtype = np.asarray(norm).dtype
    if dtype not in FLOAT_DTYPES:
        dtype = np.dtype(np.float32)
    n = dtype.type(norm)
    c = scalar(dtype, clip_norm)
    one = scalar(dtype, 1.0)
    with np.errstate(all="ignore"):
        return n, c * np.minimum(one / n, one / c) + (n - n)


def clip_by_global_norm(grads, clip_norm, use_norm=None):
    r"""Scale all gradients by one factor so that their global norm is at most ``clip_norm``.

    Parameters
    ----------
    grads : sequence of (ndarray of float16/32/64, IndexedSlices or None)
    clip_norm : float
    use_norm : float or None
        The global norm, if already computed; otherwise :func:`global_norm`.

    Returns
    -------
    clipped : list
        New host gradients, each times the scale rounded to its dtype (the CUDA kernel;
        bit-identical to the reference given the same norm, under the simulator).
    norm : numpy floating scalar
        The global norm, as the reference computes it.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.clip_by_global_norm`.
    """
    check_scalar("clip_norm", clip_norm)
    if use_norm is not None:
        check_scalar("use_norm", use_norm)
    norm = global_norm(grads) if use_norm is None else use_norm
    n, scale = global_scale(norm, clip_norm)
    clipped = []
    for g in grads:
        if g is None:
            clipped.append(None)
            continue
        values = _values("grads", g)
        with np.errstate(all="ignore"):
            s = values.dtype.type(scale)
            if values.size == 0:
                clipped.append(_rewrap(g, values * s))
                continue
        clipped.append(_rewrap(g, _clipped(values, 3, gscale=s)))
    return clipped, n
