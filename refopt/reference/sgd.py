"""SGD with momentum and Nesterov momentum, as tf-keras 2.11+ computes it.

Follows ``tf_keras/optimizers/sgd.py`` (``SGD.update_step``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_flag,
    check_grad,
    check_hyper,
    check_like,
    check_real,
    lr_cast,
    tf_cast,
)

__all__ = ["SGDResult", "sgd_sparse_scatter_update", "sgd_sparse_torch_update", "sgd_update"]


class SGDResult(NamedTuple):
    """New arrays after one SGD step: ``param`` and the momentum buffer ``m``."""

    param: np.ndarray
    m: np.ndarray


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
        The gradient. Duplicate indices of an IndexedSlices are summed first.
    m : ndarray like ``param``
        The momentum buffer (a *velocity* in parameter units: it already contains ``-lr``).
        tf-keras keeps it even when ``momentum == 0``.
    learning_rate : float
        :math:`\eta`.
    momentum : float
        :math:`\mu` in [0, 1].
    nesterov : bool
        Use Nesterov momentum.

    Returns
    -------
    SGDResult
        ``(param, m)`` as new arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        If an array is not a float16/32/64 ndarray or does not match ``param``, a
        hyperparameter is not a real number, or ``nesterov`` not a bool.

    Notes
    -----
    Dense gradient, every operation in the dtype of ``param``:

    .. math::

        m &\leftarrow (-g)\eta + m\mu \\
        w &\leftarrow w + m \quad\text{or, Nesterov,}\quad w \leftarrow w + ((-g)\eta + m\mu)

    (the Nesterov form uses the *updated* ``m``). With an IndexedSlices ``(idx, g)``:
    ``m <- m*mu`` densely, ``m[idx] += (-g)*eta``; then ``w <- w + m``, or, Nesterov,
    ``w[idx] += (-g)*eta`` followed by ``w <- w + m*mu``. Convention difference: PyTorch keeps
    ``b = mu*b + g`` and steps ``w -= lr*b`` (velocity without the learning rate).

    ``learning_rate`` is rounded to float32 first (tf-keras' float32 variable) and
    ``momentum`` converted as ``tf.cast`` does (see :func:`refopt.reference.adam_scalars`).

    Source: ``tf_keras/optimizers/sgd.py`` (tf-keras 2.11+).
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_hyper("learning_rate", learning_rate)
    check_real("momentum", momentum, low=0, high=1)  # as refopt.SGD
    nesterov = check_flag("nesterov", nesterov)
    dtype = param.dtype
    lr = lr_cast(dtype, learning_rate)
    mu = tf_cast(dtype, momentum)
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            g = grad.deduplicate()
            add = (-g.values) * lr
            m_new = m * mu
            m_new[g.indices] += add
            if nesterov:
                param_new = param.copy()
                param_new[g.indices] += add
                param_new = param_new + m_new * mu
            else:
                param_new = param + m_new
        else:
            m_new = (-grad) * lr + m * mu
            if nesterov:
                param_new = param + ((-grad) * lr + m_new * mu)
            else:
                param_new = param + m_new
    return SGDResult(np.asarray(param_new), np.asarray(m_new))


def sgd_sparse_torch_update(param, grad, *, learning_rate):
    r"""``torch.optim.SGD`` (no momentum) on a sparse gradient: each occurrence in turn.

    PyTorch's ``SGD`` on a sparse COO gradient (``nn.Embedding(sparse=True)``) runs
    ``param.add_(grad, alpha=-lr)``; torch 2.13's CPU kernel of a dense tensor plus an
    uncoalesced sparse one adds every entry of the gradient in turn, in order, without summing
    the duplicates first. For each occurrence :math:`k` (row :math:`r_k`, values
    :math:`g_k`), in order:

    .. math:: w_{r_k} \leftarrow \mathrm{fma}(-\eta, g_k, w_{r_k})

    (one rounding, as torch's vectorised ``add_`` of a row; a variable of one dimension,
    whose rows are scalars, takes one rounding too, except for a gradient of a single entry:
    :math:`w_{r_k} + (-\eta) g_k`, two roundings, as measured on torch 2.13; float16
    tables take two roundings on every entry, torch adding them in ``c10::Half``
    arithmetic). Rows absent from the gradient do not change; an empty gradient changes
    nothing. A row that appears twice therefore differs from the step on the summed
    gradient (which is what ``IndexedSlices.deduplicate`` and the other frameworks give)
    in the last bits.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, shape ``(rows, ...)``
        The variable (at least one dimension); not modified.
    grad : IndexedSlices
        ``dense_shape == param.shape`` and the dtype of ``param``; duplicates allowed.
    learning_rate : float
        :math:`\eta`, converted to the dtype as ``-learning_rate`` (one rounding).

    Returns
    -------
    ndarray
        The new variable, a C-contiguous array of the input dtype and shape.

    Raises
    ------
    TypeError
        If ``grad`` is not an IndexedSlices, or ``param`` is not a float16/32/64 ndarray,
        or the dtypes differ.
    ValueError
        If ``param`` has no dimension, ``grad.dense_shape != param.shape``, or
        ``learning_rate`` is not a finite real number.

    Notes
    -----
    Source: ``torch/optim/sgd.py`` (``_single_tensor_sgd``: ``param.add_(grad,
    alpha=-lr)``), ATen's ``add_out_dense_sparse_cpu``; measured against torch 2.13
    (golden cases ``torch__sgd_sparse_*``). PyTorch refuses ``weight_decay`` with a sparse
    gradient (``add(sparse, dense)``); its momentum keeps a sparse buffer that grows by the
    gradient's entries each step (:func:`refopt.reference.sgd_sparse_torch_momentum_update`).
    Cost: O(occurrences x row size); this function takes one NumPy step per repetition of
    the most repeated row.
    """
    from refopt.reference._common import scalar
    from refopt.reference.variants import fma

    param = _check_sparse_torch(param, grad, learning_rate)
    out = np.array(param, copy=True, order="C")
    n = grad.indices.shape[0]
    if n == 0 or out.size == 0:
        return out
    neg_lr = scalar(out.dtype, -float(learning_rate))
    idx = np.asarray(grad.indices, np.int64)
    vals = np.asarray(grad.values)
    with np.errstate(all="ignore"):
        for sel in _occurrence_levels(idx):
            rows = idx[sel]  # distinct rows
            if (out.ndim == 1 and n == 1) or out.dtype == np.float16:
                # two roundings: torch's 1-D kernel on one entry, and every float16 entry
                # (c10::Half arithmetic: w + round(round(-lr) * g), no FMA)
                out[rows] = out[rows] + neg_lr * vals[sel]
            else:
                out[rows] = fma(neg_lr, vals[sel], out[rows])
    return out


def sgd_sparse_scatter_update(param, grad, *, learning_rate):
    r"""Keras 3's and Keras 2's plain ``SGD`` on a sparse gradient: a scatter, in turn.

    Keras 3 (TF backend) applies ``variable.assign_sub(gradient * learning_rate)`` to an
    ``IndexedSlices`` gradient as a ``scatter_sub``; Keras 2's legacy ``SGD`` without momentum
    skips the deduplication the other optimizers do and runs ``ResourceScatterAdd(var,
    indices, -grad * lr)``. TensorFlow's CPU scatter kernels apply the entries in order, so
    for each occurrence :math:`k` (row :math:`r_k`, values :math:`g_k`), in order:

    .. math:: w_{r_k} \leftarrow w_{r_k} - \mathrm{round}(g_k \eta)

    (the product rounded to the dtype, then the subtraction: two roundings; ``-grad*lr``
    added is the same bits). :math:`\eta` is the float32 learning rate cast to the dtype
    (Keras 2's ``decay`` included). Rows absent from the gradient do not change; a row that
    appears twice differs from the step on the summed gradient (tf-keras' and TF1's) in the
    last bits.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, shape ``(rows, ...)``
        The variable (at least one dimension); not modified.
    grad : IndexedSlices
        ``dense_shape == param.shape`` and the dtype of ``param``; duplicates allowed.
    learning_rate : float

    Returns
    -------
    ndarray
        The new variable, a C-contiguous array of the input dtype and shape.

    Raises
    ------
    TypeError
        ``grad`` not an IndexedSlices, ``param`` not a float array, a dtype mismatch.
    ValueError
        As :func:`sgd_sparse_torch_update`.

    Notes
    -----
    Sources: ``keras/src/optimizers/sgd.py`` (``update_step``), ``tf_keras``' legacy
    ``gradient_descent.py`` (``_resource_apply_sparse_duplicate_indices``); golden cases
    ``keras3/sgd_sparse_dup_f32``, ``keras2/sgd_sparse_dup_f32``. One NumPy step per
    repetition of the most repeated row.
    """
    from refopt.reference._common import lr_cast

    param = _check_sparse_torch(param, grad, learning_rate)
    out = np.array(param, copy=True, order="C")
    n = grad.indices.shape[0]
    if n == 0 or out.size == 0:
        return out
    lr = lr_cast(out.dtype, learning_rate)
    idx = np.asarray(grad.indices, np.int64)
    vals = np.asarray(grad.values)
    with np.errstate(all="ignore"):
        for sel in _occurrence_levels(idx):
            rows = idx[sel]  # distinct rows
            out[rows] = out[rows] - (vals[sel] * lr).astype(out.dtype)
    return out


def _occurrence_levels(idx):
    """Positions of the occurrences of ``idx``, level by level: level ``j`` holds the
    ``j``-th occurrence of every row that has one (distinct rows, in order of appearance), so
    applying the levels in turn applies each row's occurrences in their order."""
    n = idx.shape[0]
    order = np.argsort(idx, kind="stable")
    srows = idx[order]
    new_run = np.concatenate(([True], srows[1:] != srows[:-1]))
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(n), 0))
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - run_start  # the occurrence's number within its row
    by_rank = np.argsort(rank, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(np.bincount(rank))))
    for j in range(bounds.shape[0] - 1):
        yield by_rank[bounds[j]:bounds[j + 1]]


def _check_sparse_torch(param, grad, learning_rate):
    if not isinstance(grad, IndexedSlices):
        raise TypeError(
            "`grad` must be an IndexedSlices (PyTorch's sparse SGD step). "
            f"Received: grad of type {type(grad).__name__}")
    if not (isinstance(param, np.ndarray) and param.dtype in (np.float16, np.float32,
                                                                np.float64)):
        raise TypeError(
            "`param` must be an ndarray of float16, float32 or float64. Received: "
            f"param of type {type(param).__name__}"
            + (f" with dtype={param.dtype}" if isinstance(param, np.ndarray) else ""))
    if param.ndim == 0:
        raise ValueError("`param` must have at least one dimension (rows). "
                         f"Received: param with shape={param.shape}")
    if grad.dense_shape != param.shape:
        raise ValueError(
            "`grad.dense_shape` must equal `param.shape`. Received: "
            f"grad.dense_shape={grad.dense_shape}, param.shape={param.shape}")
    if grad.dtype != param.dtype:
        raise TypeError(
            "`grad` must have the dtype of `param`. Received: grad with dtype="
            f"{grad.dtype}, param with dtype={param.dtype}")
    check_real("learning_rate", learning_rate)
    if not np.isfinite(float(learning_rate)):
        raise ValueError(f"`learning_rate` must be finite. Received: "
                         f"learning_rate={learning_rate!r}")
    return param
