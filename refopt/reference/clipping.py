"""Gradient clipping by value, by norm and by global norm, with TensorFlow's formulas.

Follows ``tensorflow/python/ops/clip_ops.py`` (``clip_by_value``, ``clip_by_norm``,
``global_norm``, ``clip_by_global_norm``), which the tf-keras 2.11+ base optimizer calls for
``clipvalue``, ``clipnorm`` and ``global_clipnorm``.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import _EXTRA_DTYPES, FLOAT_DTYPES, check_scalar, scalar

__all__ = ["clip_by_value", "clip_by_norm", "global_norm", "clip_by_global_norm"]


def _values(name, grad):
    if isinstance(grad, IndexedSlices):
        return grad.values
    if isinstance(grad, np.ndarray) and (grad.dtype in FLOAT_DTYPES
                                         or grad.dtype in _EXTRA_DTYPES.get()):  # bf16 step
        return np.asarray(grad)  # a plain ndarray view (np.matrix would make * a matmul)
    raise TypeError(
        f"`{name}` must be a float16/32/64 numpy.ndarray or an IndexedSlices. "
        f"Received: {name} of type {type(grad).__name__}"
        + (f" with dtype={grad.dtype}" if isinstance(grad, np.ndarray) else "")
    )


def _rewrap(grad, values):
    if isinstance(grad, IndexedSlices):
        return IndexedSlices(values, grad.indices, grad.dense_shape)
    return np.asarray(values)


def clip_by_value(grad, clip_value):
    r"""Clip every element to :math:`[-c, c]`: ``maximum(minimum(g, c), -c)``.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
        For an IndexedSlices the raw rows are clipped *before* any duplicate summing (as
        tf-keras does), and an IndexedSlices is returned.
    clip_value : float
        :math:`c`, rounded to the gradient dtype.

    Returns
    -------
    ndarray or IndexedSlices
        A new gradient of the same kind, shape and dtype. NaN stays NaN; :math:`\pm\infty`
        becomes :math:`\pm c`.

    Raises
    ------
    TypeError
        If ``grad`` is not a float ndarray or IndexedSlices, or ``clip_value`` not a number.

    Notes
    -----
    Source: ``tf.clip_by_value(g, -c, c)`` as called by ``Optimizer._clip_gradients``
    (``tf_keras/optimizers/optimizer.py``).
    """
    values = _values("grad", grad)
    check_scalar("clip_value", clip_value)
    c = scalar(values.dtype, clip_value)
    with np.errstate(all="ignore"):
        return _rewrap(grad, np.maximum(np.minimum(values, c), -c))


def clip_by_norm(grad, clip_norm):
    r"""Rescale a tensor so that its L2 norm is at most ``clip_norm``: :math:`g c / \max(\|g\|, c)`.

    Parameters
    ----------
    grad : ndarray of float16/32/64, or IndexedSlices
        For an IndexedSlices the norm is that of the raw ``values`` (duplicates are *not*
        summed first), and an IndexedSlices is returned.
    clip_norm : float
        :math:`c`, rounded to the gradient dtype; a negative value is treated as 0 (as
        TensorFlow does).

    Returns
    -------
    ndarray or IndexedSlices
        A new gradient of the same kind, shape and dtype.

    Raises
    ------
    TypeError
        If ``grad`` is not a float ndarray or IndexedSlices, or ``clip_norm`` not a number.

    Notes
    -----
    In the gradient dtype: :math:`s = \sum g^2` (a reduction; its summation order is
    NumPy's, so it may differ from TensorFlow's in the last ulp), :math:`n = \sqrt{s}` if
    :math:`s > 0` else :math:`s`, result ``(g * c) / maximum(n, c)``. Edge cases, all as TF
    2.21: ``c = 0`` with ``g = 0`` gives NaN (0/0); ``c = inf`` gives NaN everywhere
    (inf/inf; tensorflow/tensorflow PR #109327 changes this upstream); an ``inf`` element
    gives NaN there and 0 elsewhere.

    Source: ``tensorflow/python/ops/clip_ops.py`` (``clip_by_norm``).
    """
    values = _values("grad", grad)
    check_scalar("clip_norm", clip_norm)
    dtype = values.dtype
    c = scalar(dtype, max(clip_norm, 0))
    with np.errstate(all="ignore"):
        # Sum in C (row-major) order whatever the memory layout, as a TF tensor is laid out:
        # NumPy adds in memory order, so a transposed view would otherwise round differently.
        flat = np.ascontiguousarray(values)
        l2sum = np.sum(flat * flat, dtype=dtype)
        l2norm = np.sqrt(l2sum) if l2sum > 0 else l2sum
        return _rewrap(grad, (values * c) / np.maximum(l2norm, c))


def global_norm(grads):
    r"""The L2 norm of all gradients together, :math:`\sqrt{\sum_i \|g_i\|^2}`.

    Parameters
    ----------
    grads : sequence of (ndarray of float16/32/64, IndexedSlices or None)
        ``None`` entries are ignored; an IndexedSlices contributes its raw ``values``
        (duplicates not summed).

    Returns
    -------
    numpy floating scalar
        In the dtype of the gradients. 0 for an empty list or one of only ``None``.

    Raises
    ------
    TypeError
        If ``grads`` is not a sequence, holds something else, or mixes dtypes (TensorFlow
        refuses those too).

    Notes
    -----
    As ``tf.linalg.global_norm``: per tensor ``l2_loss(g) = sum(g*g * 0.5)`` in its dtype, the
    half squares summed, then ``sqrt(h * 2)``. The per-tensor sums are reductions whose order
    may differ from TensorFlow's in the last ulp.
    """
    if isinstance(grads, (str, bytes)) or not hasattr(grads, "__len__"):
        raise TypeError(
            f"`grads` must be a sequence of gradients. Received: {type(grads).__name__}"
        )
    values = [_values(f"grads[{i}]", g) for i, g in enumerate(grads) if g is not None]
    if not values:
        return np.float32(0.0)
    dtypes = sorted({v.dtype.name for v in values})
    if len(dtypes) > 1:
        raise TypeError(
            "All gradients of a global norm must have the same dtype (TensorFlow refuses to "
            f"stack mixed dtypes). Received dtypes {dtypes}"
        )
    dtype = values[0].dtype
    with np.errstate(all="ignore"):
        flats = [np.ascontiguousarray(v) for v in values]  # C order, as in clip_by_norm
        halves = [
            dtype.type(np.sum(v * v * scalar(v.dtype, 0.5), dtype=v.dtype)) for v in flats
        ]
        half = np.sum(np.asarray(halves, dtype=dtype), dtype=dtype)
        return np.sqrt(half * scalar(dtype, 2.0))


def clip_by_global_norm(grads, clip_norm, use_norm=None):
    r"""Scale all gradients by one factor so that their global norm is at most ``clip_norm``.

    Parameters
    ----------
    grads : sequence of (ndarray of float16/32/64, IndexedSlices or None)
        ``None`` entries stay ``None``; IndexedSlices stay IndexedSlices.
    clip_norm : float
        :math:`c > 0`.
    use_norm : float or None
        The global norm, if already computed; otherwise :func:`global_norm`.

    Returns
    -------
    clipped : list
        The scaled gradients, new arrays.
    norm : numpy floating scalar
        The global norm :math:`N` before clipping.

    Raises
    ------
    TypeError
        If ``grads`` is not a sequence of gradients of one dtype, or ``clip_norm`` or
        ``use_norm`` not a number.

    Notes
    -----
    In the dtype of :math:`N`:
    :math:`\text{scale} = c \cdot \min(1/N, 1/c) + (N - N)`; each gradient is multiplied by
    ``scale`` rounded to its dtype. :math:`N = 0` gives scale 1. A non-finite :math:`N` (any
    inf or NaN in any gradient) makes ``N - N`` NaN and therefore **every** gradient NaN,
    which an optimizer step then writes into every variable: TF's way of making the failure
    visible (tensorflow/tensorflow#21363, PR #27733). PyTorch's ``clip_grad_norm_`` uses
    ``c / (N + 1e-6)`` clamped to 1, and optax's ``clip_by_global_norm`` selects with
    ``where(N < c, g, g / N * c)``.

    Examples
    --------
    >>> import numpy as np
    >>> clipped, norm = clip_by_global_norm([np.array([3.0, 0.0], np.float32),
    ...                                      np.array([0.0, 4.0], np.float32)], 1.0)
    >>> clipped, float(norm)
    ([array([0.6, 0. ], dtype=float32), array([0. , 0.8], dtype=float32)], 5.0)

    Source: ``tensorflow/python/ops/clip_ops.py`` (``clip_by_global_norm``).
    """
    check_scalar("clip_norm", clip_norm)
    if use_norm is not None:
        check_scalar("use_norm", use_norm)
    norm = global_norm(grads) if use_norm is None else use_norm
    dtype = np.asarray(norm).dtype
    if dtype not in FLOAT_DTYPES:
        dtype = np.dtype(np.float32)
    n = dtype.type(norm)
    c = scalar(dtype, clip_norm)
    one = scalar(dtype, 1.0)
    with np.errstate(all="ignore"):
        scale = c * np.minimum(one / n, one / c) + (n - n)
        clipped = []
        for g in grads:
            if g is None:
                clipped.append(None)
                continue
            values = _values("grads", g)
            clipped.append(_rewrap(g, values * values.dtype.type(scale)))
    return clipped, n
