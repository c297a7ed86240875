"""Row-wise Adagrad on the CPU: :mod:`refopt.reference.rowwise_adagrad`, its row step compiled.

The row step (:func:`rowwise_adagrad_rows`) is a serial Numba loop over the rows, the same
operations in the same order as the reference (the sum of squares element after element,
FBGEMM's two FMAs as one rounding of the exact float64 value, which is what the reference's
float32 emulation computes); float32 only. float16 and float64 rows, and the coalescing of
an IndexedSlices (:meth:`refopt.IndexedSlices.deduplicate`), are the reference's.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import rowwise_adagrad as _ref
from refopt.reference.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
)

__all__ = ["RowWiseAdagradResult", "rowwise_adagrad_initial_state", "rowwise_adagrad_rows",
           "rowwise_adagrad_sequential_update", "rowwise_adagrad_update"]

_F32 = np.dtype(np.float32)
_MODES = {"none": 0, "l2": 1, "decoupled": 2}
_kernel = None


def _build():
    import numba

    @numba.njit(cache=True, error_model="numpy")
    def rows32(w, g, acc, lr, eps, wd, mode, out_w, out_a):  # pragma: no cover - compiled
        n, width = w.shape
        one = np.float32(1.0)
        for r in range(n):
            s = np.float32(0.0)
            for d in range(width):
                if mode == 1:  # fma(wd, w, g): exact in float64, rounded once
                    x = np.float32(np.float64(wd) * np.float64(w[r, d]) + np.float64(g[r, d]))
                else:
                    x = g[r, d]
                s = np.float32(s + np.float32(x * x))
            a = np.float32(acc[r] + np.float32(s / np.float32(width)))
            out_a[r] = a
            mult = np.float32(lr / np.float32(np.sqrt(a) + eps))
            if mode == 1:
                corr = np.float32(one - np.float32(mult * wd))
            elif mode == 2:
                corr = np.float32(one - np.float32(lr * wd))
            else:
                corr = one
            for d in range(width):
                p = np.float32(g[r, d] * mult)
                out_w[r, d] = np.float32(np.float64(corr) * np.float64(w[r, d]) - np.float64(p))

    return rows32


def rowwise_adagrad_rows(w, g, acc, *, learning_rate, epsilon, weight_decay=0.0,
                         weight_decay_mode="none"):
    """As :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_rows`, bit-identical;
    compiled for float32 rows of rank 2."""
    global _kernel
    ok = (isinstance(w, np.ndarray) and w.dtype == _F32 and w.ndim == 2
          and isinstance(g, np.ndarray) and g.dtype == _F32 and g.shape == w.shape
          and isinstance(acc, np.ndarray) and acc.dtype == _F32 and acc.shape == w.shape[:1]
          and weight_decay_mode in _MODES)
    if not ok:
        return _ref.rowwise_adagrad_rows(w, g, acc, learning_rate=learning_rate,
                                         epsilon=epsilon, weight_decay=weight_decay,
                                         weight_decay_mode=weight_decay_mode)
    if _kernel is None:
        _kernel = _build()
    out_w = np.empty_like(w)
    out_a = np.empty_like(acc)
    f = np.float32
    with np.errstate(all="ignore"):
        lr, eps, wd = f(learning_rate), f(epsilon), f(weight_decay)
    _kernel(np.ascontiguousarray(w), np.ascontiguousarray(g), np.ascontiguousarray(acc),
            lr, eps, wd, _MODES[weight_decay_mode], out_w, out_a)
    return out_w, out_a


def rowwise_adagrad_update(param, grad, accumulator, *, learning_rate=0.01, epsilon=1e-8,
                           weight_decay=0.0, weight_decay_mode="none", convention="fbgemm"):
    """As :func:`refopt.reference.rowwise_adagrad_update`, bit for bit."""
    return _ref.exact_update(
        param, grad, accumulator, rowwise_adagrad_rows, learning_rate=learning_rate,
        epsilon=epsilon, weight_decay=weight_decay, weight_decay_mode=weight_decay_mode,
        convention=convention)


def rowwise_adagrad_sequential_update(param, grad, accumulator, *, learning_rate=0.01,
                                      epsilon=1e-8, weight_decay=0.0,
                                      weight_decay_mode="none", convention="fbgemm"):
    """As :func:`refopt.reference.rowwise_adagrad_sequential_update` (the reference's)."""
    return _ref.rowwise_adagrad_sequential_update(
        param, grad, accumulator, learning_rate=learning_rate, epsilon=epsilon,
        weight_decay=weight_decay, weight_decay_mode=weight_decay_mode, convention=convention)
