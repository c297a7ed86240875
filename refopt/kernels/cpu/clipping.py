"""Gradient clipping by value, by norm and by global norm on the CPU (Numba kernels).

Same functions, signatures and results as :mod:`refopt.reference.clipping`
(``tensorflow/python/ops/clip_ops.py``): the elementwise parts are bit-identical (the
pipeline's clip step, :func:`refopt.rules.steps.clip`, run by the drivers as the rule
:data:`refopt.rules.steps.CLIP`); the sums of squares follow NumPy's pairwise summation order
(the reduction :data:`refopt.rules.reduce.SUM_SQUARES` in the ``"numpy"`` order, built by
:func:`refopt.kernels.cpu.drivers.reduce`), so norms are those of the reference (``np.sum``:
identical on every machine checked; the contract is 1 ulp).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cpu._common import FALLBACK_DTYPES, check_scalar, scalar
from refopt.reference.clipping import _rewrap, _values


def _clip(values, mode, c=0, d=1, s=1):
    """The values clipped by :func:`refopt.rules.steps.clip` (the step the optimizers' fused
    kernels run), as the rule :data:`refopt.rules.steps.CLIP`; a new array."""
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.steps import clip_values

    return clip_values(apply, values, mode, c, d, s)

__all__ = ["clip_by_value", "clip_by_norm", "global_norm", "clip_by_global_norm"]


def sums_of_squares(values, dtype, half=False, order="numpy"):
    """``sum(v * v [* 0.5])`` per array in an order of addition (by default NumPy's
    ``np.sum``, ``0 + pairwise sum``), one kernel call.

    The reductions :data:`refopt.rules.reduce.SUM_SQUARES` (``SUM_HALF_SQUARES`` with
    ``half``) on the drivers' multi-tensor ``reduce`` kernel
    (:func:`refopt.kernels.cpu.drivers.reduce`).

    Parameters
    ----------
    values : list of ndarray of ``dtype`` (float32 or float64)
    half : bool
        Multiply each square by 0.5 first (``l2_loss``, as :func:`global_norm`).
    order : {"numpy", "torch"}
        NumPy's pairwise sum (``np.sum``) or PyTorch's (``torch.linalg.vector_norm``'s sum
        on the CPU; see :mod:`refopt.rules.reduce`).

    Returns
    -------
    ndarray of ``dtype``, shape ``(len(values),)``
    """
    from refopt.kernels.cpu.drivers import reduce
    from refopt.rules.reduce import SUM_HALF_SQUARES, SUM_SQUARES

    if half:
        return reduce(SUM_HALF_SQUARES, values, dtype, order, sc=[0.5])
    return reduce(SUM_SQUARES, values, dtype, order)


def torch_norms(values, dtype):
    """``torch.linalg.vector_norm(v, 2.0)`` of each array as PyTorch computes it on the CPU
    (bit for bit :func:`refopt.reference.reductions.torch_vector_norm`), one kernel call.

    Parameters
    ----------
    values : list of ndarray of ``dtype`` (float32 or float64)

    Returns
    -------
    ndarray of ``dtype``, shape ``(len(values),)``
    """
    from refopt.rules.reduce import torch_vector_norms

    sums = sums_of_squares(values, dtype, order="torch")
    return torch_vector_norms(sums, [v.reshape(-1)[0] if v.size == 1 else None
                                     for v in values])


def norm_denominators(sums, c):
    """``maximum(sqrt(s) if s > 0 else s, c)`` per sum: clip_by_norm's divisor."""
    with np.errstate(all="ignore"):
        l2norm = np.where(sums > 0, np.sqrt(sums), sums)
        return np.maximum(l2norm, c)


def clip_by_value(grad, clip_value):
    r"""Clip every element to :math:`[-c, c]` with the CPU kernel.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
    clip_value : float

    Returns
    -------
    ndarray or IndexedSlices
        Bit-identical to :func:`refopt.reference.clip_by_value`.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.clip_by_value`.
    """
    values = _values("grad", grad)
    check_scalar("clip_value", clip_value)
    if values.dtype in FALLBACK_DTYPES:
        return _ref.clip_by_value(grad, clip_value)
    return _rewrap(grad, _clip(values, 1, scalar(values.dtype, clip_value)))


def clip_by_norm(grad, clip_norm):
    r"""Rescale a tensor to L2 norm at most ``clip_norm``, :math:`g c / \max(\|g\|, c)`.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
    clip_norm : float

    Returns
    -------
    ndarray or IndexedSlices
        As :func:`refopt.reference.clip_by_norm`; elementwise bit-identical given the same
        norm, the norm within 1 ulp.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.clip_by_norm`.
    """
    values = _values("grad", grad)
    check_scalar("clip_norm", clip_norm)
    dtype = values.dtype
    if dtype in FALLBACK_DTYPES:
        return _ref.clip_by_norm(grad, clip_norm)
    c = scalar(dtype, max(clip_norm, 0))
    flat = np.ascontiguousarray(values).reshape(-1)
    d = norm_denominators(sums_of_squares([flat], dtype), c)[0]
    return _rewrap(grad, _clip(values, 2, c, d))


def _same_dtype_values(grads):
    """The values of the non-None gradients if they all share a fast dtype, else None."""
    if isinstance(grads, (str, bytes)) or not hasattr(grads, "__len__"):
        return None
    values = []
    for g in grads:
        if g is None:
            continue
        if isinstance(g, IndexedSlices):
            values.append(g.values)
        elif isinstance(g, np.ndarray) and g.dtype in _ref.clipping.FLOAT_DTYPES:
            values.append(g)
        else:
            return None
    if not values or len({v.dtype for v in values}) > 1 or values[0].dtype in FALLBACK_DTYPES:
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
        As :func:`refopt.reference.global_norm` (within 1 ulp): per tensor the pairwise sum
        of ``g * g * 0.5`` (one kernel call for all tensors), then NumPy's sum of those halves
        and ``sqrt(h * 2)``.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.global_norm` (which handles every case this one does not:
        empty, mixed dtypes, float16, bad arguments).
    """
    values = _same_dtype_values(grads)
    if values is None:
        return _ref.global_norm(grads)
    dtype = values[0].dtype
    halves = sums_of_squares(values, dtype, half=True)
    with np.errstate(all="ignore"):
        half = np.sum(halves, dtype=dtype)
        return np.sqrt(half * scalar(dtype, 2.0))


def global_scale(norm, clip_norm):
    """TF's ``c * min(1/N, 1/c) + (N - N)`` in the dtype of ``norm`` (NaN if N is not finite)."""
    dtype = np.asarray(norm).dtype
    if dtype not in _ref.clipping.FLOAT_DTYPES:
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

    Returns
    -------
    clipped : list
        As :func:`refopt.reference.clip_by_global_norm`; each gradient times the scale
        (rounded to its dtype) by the CPU kernel, bit-identical given the same norm.
    norm : numpy floating scalar
        The global norm, within 1 ulp of the reference's.

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
        if values.dtype in FALLBACK_DTYPES:
            with np.errstate(all="ignore"):
                clipped.append(_rewrap(g, values * values.dtype.type(scale)))
            continue
        with np.errstate(all="ignore"):
            s = values.dtype.type(scale)
        clipped.append(_rewrap(g, _clip(values, 3, s=s)))
    return clipped, n
