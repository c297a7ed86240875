"""Row-wise Adagrad on the CPU: :mod:`refopt.reference.rowwise_adagrad`, its row loops compiled.

Two serial Numba loops, the same operations in the same order as the reference (the sum of
squares element after element; FBGEMM's three FMAs, the L2 gradient, the decay factor and
the weight update, each as one rounding of the exact float64 value, which is what the
reference's float32 emulation :func:`refopt.reference.variants.fma` computes):

- the exact step (:func:`rowwise_adagrad_rows`): every given row once;
- the approximate step (:func:`rowwise_adagrad_sequential_update`): every occurrence of an
  IndexedSlices in turn, in place on a copy of the table (FBGEMM's ``ROWWISE_ADAGRAD``),
  O(occurrences x D) in one compiled call.

float32 only; float16 and float64 tables, rows of no element (``D = 0``), the argument
checks and the coalescing of an IndexedSlices (:meth:`refopt.IndexedSlices.deduplicate`)
are the reference's.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference import rowwise_adagrad as _ref
from refopt.reference.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
)

__all__ = ["RowWiseAdagradResult", "rowwise_adagrad_initial_state", "rowwise_adagrad_rows",
           "rowwise_adagrad_sequential_update", "rowwise_adagrad_update"]

_F32 = np.dtype(np.float32)
_MODES = {"none": 0, "l2": 1, "decoupled": 2}
_kernels = None


def _build():
    import numba

    @numba.njit(cache=True, error_model="numpy")
    def row32(w, g, a_old, lr, eps, wd, mode, out):  # pragma: no cover - compiled
        """One row: ``out`` (may be ``w`` itself) gets the new row; returns the new
        accumulator. ``fma(a, b, c)`` is ``float32(float64(a)*float64(b) + float64(c))``."""
        width = w.shape[0]
        s = np.float32(0.0)
        for d in range(width):
            if mode == 1:  # fma(wd, w, g)
                x = np.float32(np.float64(wd) * np.float64(w[d]) + np.float64(g[d]))
            else:
                x = g[d]
            s = np.float32(s + np.float32(x * x))
        a = np.float32(a_old + np.float32(s / np.float32(width)))
        mult = np.float32(lr / np.float32(np.sqrt(a) + eps))
        if mode == 1:  # fma(-mult, wd, 1)
            corr = np.float32(np.float64(-mult) * np.float64(wd) + 1.0)
        elif mode == 2:  # fma(-lr, wd, 1)
            corr = np.float32(np.float64(-lr) * np.float64(wd) + 1.0)
        else:
            corr = np.float32(1.0)
        for d in range(width):  # fma(corr, w, -(g*mult)); w[d] is read before out[d] is set
            p = np.float32(g[d] * mult)
            out[d] = np.float32(np.float64(corr) * np.float64(w[d]) - np.float64(p))
        return a

    @numba.njit(cache=True, error_model="numpy")
    def rows32(w, g, acc, lr, eps, wd, mode, out_w, out_a):  # pragma: no cover - compiled
        for r in range(w.shape[0]):
            out_a[r] = row32(w[r], g[r], acc[r], lr, eps, wd, mode, out_w[r])

    @numba.njit(cache=True, error_model="numpy")
    def seq32(w, acc, idx, vals, lr, eps, wd, mode):  # pragma: no cover - compiled
        """Every occurrence ``k`` in order: row ``idx[k]`` of ``w``/``acc`` in place."""
        for k in range(idx.shape[0]):
            r = idx[k]
            acc[r] = row32(w[r], vals[k], acc[r], lr, eps, wd, mode, w[r])

    return rows32, seq32


def _compiled():
    global _kernels
    if _kernels is None:
        _kernels = _build()
    return _kernels


def _scalars(learning_rate, epsilon, weight_decay):
    f = np.float32
    with np.errstate(all="ignore"):
        return f(learning_rate), f(epsilon), f(weight_decay)


def rowwise_adagrad_rows(w, g, acc, *, learning_rate, epsilon, weight_decay=0.0,
                         weight_decay_mode="none"):
    """As :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_rows`, bit-identical;
    compiled for float32 rows of rank 2 with at least one element."""
    ok = (isinstance(w, np.ndarray) and w.dtype == _F32 and w.ndim == 2 and w.shape[1] > 0
          and isinstance(g, np.ndarray) and g.dtype == _F32 and g.shape == w.shape
          and isinstance(acc, np.ndarray) and acc.dtype == _F32 and acc.shape == w.shape[:1]
          and weight_decay_mode in _MODES)
    if not ok:
        return _ref.rowwise_adagrad_rows(w, g, acc, learning_rate=learning_rate,
                                         epsilon=epsilon, weight_decay=weight_decay,
                                         weight_decay_mode=weight_decay_mode)
    rows32, _ = _compiled()
    out_w = np.empty_like(w)
    out_a = np.empty_like(acc)
    lr, eps, wd = _scalars(learning_rate, epsilon, weight_decay)
    rows32(np.ascontiguousarray(w), np.ascontiguousarray(g), np.ascontiguousarray(acc),
           lr, eps, wd, _MODES[weight_decay_mode], out_w, out_a)
    return out_w, out_a


def rowwise_adagrad_update(param, grad, accumulator, *, learning_rate=0.01, epsilon=1e-8,
                           weight_decay=0.0, weight_decay_mode="none", convention="fbgemm"):
    """As :func:`refopt.reference.rowwise_adagrad_update`, bit for bit (the same checks)."""
    return _ref.exact_update(
        param, grad, accumulator, rowwise_adagrad_rows, learning_rate=learning_rate,
        epsilon=epsilon, weight_decay=weight_decay, weight_decay_mode=weight_decay_mode,
        convention=convention)


def rowwise_adagrad_sequential_update(param, grad, accumulator, *, learning_rate=0.01,
                                      epsilon=1e-8, weight_decay=0.0,
                                      weight_decay_mode="none", convention="fbgemm"):
    """As :func:`refopt.reference.rowwise_adagrad_sequential_update`, bit for bit (the same
    checks); a float32 table with rows of at least one element takes one compiled loop over
    the occurrences (cost O(occurrences x D), whatever the duplicates)."""
    kw = dict(learning_rate=learning_rate, epsilon=epsilon, weight_decay=weight_decay,
              weight_decay_mode=weight_decay_mode, convention=convention)
    if not isinstance(grad, IndexedSlices):
        return rowwise_adagrad_update(param, grad, accumulator, **kw)
    param = _ref.check_arguments(param, grad, accumulator, **kw)
    width = int(np.prod(param.shape[1:], dtype=np.int64))
    if param.dtype != _F32 or width == 0:
        return _ref.rowwise_adagrad_sequential_update(param, grad, accumulator, **kw)
    _, seq32 = _compiled()
    n = param.shape[0]
    out_w = np.array(param, copy=True, order="C")
    out_a = np.array(accumulator, copy=True, order="C")
    lr, eps, wd = _scalars(learning_rate, epsilon, weight_decay)
    k = grad.indices.shape[0]
    seq32(out_w.reshape(n, width), out_a, np.asarray(grad.indices, np.int64),
          np.ascontiguousarray(grad.values).reshape(k, width), lr, eps, wd,
          _MODES[weight_decay_mode])
    return RowWiseAdagradResult(out_w, out_a)
