"""Partial row-wise Adam on the CPU: :mod:`refopt.reference.partial_rowwise_adam`'s row loop compiled.

One serial Numba loop (one row after another, deterministic), the same operations in the same
order as the reference: the sum of squares element after element in float32, the float64
arithmetic where FBGEMM's C++ promotes to double, each result rounded to float32 where C++
stores it into a float, and ``Vec4T::fma_``'s ``__fmaf_rn`` as one rounding of the exact
float64 value (what :func:`refopt.reference.variants.fma` computes). No ``fastmath``: LLVM
contracts nothing. The bias corrections are computed once on the host
(:func:`refopt.reference.partial_rowwise_adam.bias_corrections`, the C library's ``powf``)
and passed in.

The argument checks, the coalescing of an IndexedSlices
(:meth:`refopt.IndexedSlices.deduplicate`) and rows of no element are the reference's.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import partial_rowwise_adam as _ref
from refopt.reference.partial_rowwise_adam import (
    PartialRowWiseAdamResult,
    partial_rowwise_adam_initial_state,
)

__all__ = ["PartialRowWiseAdamResult", "partial_rowwise_adam_initial_state",
           "partial_rowwise_adam_rows", "partial_rowwise_adam_update"]

_F32 = np.dtype(np.float32)
_kernel = None


def _build():
    import numba

    @numba.njit(cache=True, error_model="numpy")
    def rows32(w, g, m, v, lr, b1, b2, eps, wd, one_b1, bc1, bc2,
               out_w, out_m, out_v):  # pragma: no cover - compiled
        """Every row ``r``: ``out_*[r]`` from ``w[r]``, ``g[r]``, ``m[r]``, ``v[r]``.
        ``one_b1`` is ``float(1.0 - beta1)``; ``bc1``, ``bc2`` the float64 corrections."""
        n, width = w.shape
        fw = np.float32(width)
        one_b2 = 1.0 - np.float64(b2)
        for r in range(n):
            s = np.float32(0.0)
            for d in range(width):
                s = np.float32(s + np.float32(g[r, d] * g[r, d]))
            g_avg = np.float32(s / fw)
            vb = np.float32(v[r] * b2)
            v_t = np.float32(np.float64(vb) + np.float64(g_avg) * one_b2)
            v_hat = np.float32(np.float64(v_t) / bc2)
            out_v[r] = v_t
            denom = np.float64(np.float32(np.float32(np.sqrt(v_hat)) + eps))
            for d in range(width):
                mb = np.float32(m[r, d] * b1)
                m_t = np.float32(np.float64(g[r, d]) * np.float64(one_b1) + np.float64(mb))
                out_m[r, d] = m_t
                x = w[r, d]
                dec = np.float64(np.float32(wd * x))
                upd = (np.float64(m_t) / bc1) / denom + dec
                out_w[r, d] = np.float32(np.float64(x) - np.float64(lr) * upd)

    return rows32


def _compiled():
    global _kernel
    if _kernel is None:
        _kernel = _build()
    return _kernel


def partial_rowwise_adam_rows(w, g, m, v, *, learning_rate, beta_1, beta_2, epsilon,
                              weight_decay=0.0, step):
    """As :func:`refopt.reference.partial_rowwise_adam.partial_rowwise_adam_rows`,
    bit-identical; compiled for float32 rows with at least one element (others: the
    reference)."""
    ok = (isinstance(w, np.ndarray) and w.dtype == _F32 and w.ndim >= 1 and w.size > 0
          and isinstance(g, np.ndarray) and g.dtype == _F32 and g.shape == w.shape
          and isinstance(m, np.ndarray) and m.dtype == _F32 and m.shape == w.shape
          and isinstance(v, np.ndarray) and v.dtype == _F32 and v.shape == w.shape[:1])
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              weight_decay=weight_decay, step=step)
    if not ok:
        return _ref.partial_rowwise_adam_rows(w, g, m, v, **kw)
    n = w.shape[0]
    width = w.size // n
    f = np.float32
    with np.errstate(all="ignore"):
        lr, b1, b2, eps, wd = (f(x) for x in (learning_rate, beta_1, beta_2, epsilon,
                                              weight_decay))
        one_b1 = f(np.float64(1.0) - np.float64(b1))
    bc1, bc2 = _ref.bias_corrections(b1, b2, step)
    out_w = np.empty((n, width), _F32)
    out_m = np.empty((n, width), _F32)
    out_v = np.empty(n, _F32)
    _compiled()(np.ascontiguousarray(w).reshape(n, width),
                np.ascontiguousarray(g).reshape(n, width),
                np.ascontiguousarray(m).reshape(n, width), np.ascontiguousarray(v),
                lr, b1, b2, eps, wd, one_b1, bc1, bc2, out_w, out_m, out_v)
    return out_w.reshape(w.shape), out_m.reshape(w.shape), out_v


def partial_rowwise_adam_update(param, grad, m, v, *, learning_rate=0.01, beta_1=0.9,
                                beta_2=0.999, epsilon=1e-8, weight_decay=0.0, step,
                                convention="fbgemm"):
    """As :func:`refopt.reference.partial_rowwise_adam_update`, bit for bit (the same
    checks); the rows computed by one compiled loop."""
    return _ref.exact_update(param, grad, m, v, partial_rowwise_adam_rows,
                             learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                             epsilon=epsilon, weight_decay=weight_decay, step=step,
                             convention=convention)
