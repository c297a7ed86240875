"""Lamb on the CPU: :func:`refopt.reference.lamb_update`, computed in phases by rule kernels.

The element phases are :mod:`refopt.rules.lamb` (the direction with the moments, then the
step with the trust ratio), their scalars rounded by the rule module
(:func:`refopt.rules.lamb.direction_call`, :func:`refopt.rules.lamb.ratio_call`), run by this
module's parallel kernels into new arrays (:func:`_direction`, :func:`_step`: the rules'
elements, no copy of the inputs); between them the sums of squares of ``w`` and ``u`` in the
framework's order (Eigen's lanes for Keras 3, XLA's chain of FMAs for optax, both chains in
one pass), compiled in :mod:`refopt.kernels.cpu._reduce_seq` (the reference's orders, bit for
bit). The arguments are checked by the reference's checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refopt.kernels.cpu import _reduce_seq as _S
from refopt.kernels.cpu._common import launch
from refopt.reference import lamb as _ref
from refopt.rules.lamb import (
    F_DECAY,
    F_FORM,
    lamb_apply_element,
    lamb_direction_element,
)

__all__ = ["lamb_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_OPTS = dict(cache=True, error_model="numpy", fastmath=False, nogil=True)
_CHUNK = 1 << 16


@njit(**_OPTS)
def _tuple8(a):
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@njit(**_OPTS)
def _tuple16(a):
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
            a[13], a[14], a[15])


@njit(**_OPTS)
def _direction_span(P, G, M, V, sc, fl, U, M2, V2):
    # slices of one span, indexed from 0 (a loop that vectorises)
    for i in range(P.shape[0]):
        ui, mi, vi = lamb_direction_element(P[i], G[i], M[i], V[i], sc, fl, False)
        U[i] = ui
        M2[i] = mi
        V2[i] = vi


@njit(parallel=True, **_OPTS)
def _direction(p, g, m, v, sc, fl, u, m2, v2):
    """The direction of every element into ``u, m2, v2`` (the rule's element)."""
    # scalars as a tuple: in registers, never reloaded from memory the loop writes; the
    # flags as literal tuples, one loop per flag set (their branches fold away)
    sc = _tuple16(sc)
    form, decay = fl[F_FORM], fl[F_DECAY]
    n = p.size
    chunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(chunks):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        if form == 0:
            _direction_span(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                            (0, 0, 0, 0, 0, 0, 0, 0), u[lo:hi], m2[lo:hi], v2[lo:hi])
        elif decay == 0:
            _direction_span(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                            (1, 0, 0, 0, 0, 0, 0, 0), u[lo:hi], m2[lo:hi], v2[lo:hi])
        else:
            _direction_span(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                            (1, 1, 0, 0, 0, 0, 0, 0), u[lo:hi], m2[lo:hi], v2[lo:hi])


@njit(**_OPTS)
def _step_span(P, U, sc, fl, O):
    for i in range(P.shape[0]):
        O[i] = lamb_apply_element(P[i], U[i], sc, fl, False)[0]


@njit(parallel=True, **_OPTS)
def _step(p, u, sc, fl, out):
    """The step with the trust ratio into ``out`` (the rule's element)."""
    sc = _tuple16(sc)
    form = fl[F_FORM]
    n = p.size
    chunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(chunks):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        if form == 0:
            _step_span(p[lo:hi], u[lo:hi], sc, (0, 0, 0, 0, 0, 0, 0, 0), out[lo:hi])
        else:
            _step_span(p[lo:hi], u[lo:hi], sc, (1, 0, 0, 0, 0, 0, 0, 0), out[lo:hi])


def lamb_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None):
    """As :func:`refopt.reference.lamb_update`, bit-identical in float32 and float64."""
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, convention=convention, eps_root=eps_root, weight_decay=weight_decay)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.lamb_update(param, grad, m, v, **kw)
    from refopt.rules.lamb import direction_call, ratio_call

    p, g, m, v, conv = _ref.check_lamb_args(param, grad, m, v, **kw)
    dt = p.dtype
    shape = p.shape
    p, g, m, v = (np.ascontiguousarray(a, dt).reshape(-1) for a in (p, g, m, v))
    u, m2, v2 = np.empty_like(p), np.empty_like(p), np.empty_like(p)
    with np.errstate(all="ignore"):
        call = direction_call(dt, conv, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                              step=step, eps_root=eps_root, weight_decay=weight_decay)
        launch(_direction, (p, g, m, v, call.sc, call.fl, u, m2, v2), p.size)
        if conv.lamb_form == "optax":
            w_sq, u_sq = _S.xla_sum_squares2(p, u)
        else:
            w_sq, u_sq = _S.eigen_sum_squares(p), _S.eigen_sum_squares(u)
        call = ratio_call(dt, conv, dt.type(w_sq), dt.type(u_sq), learning_rate)
        out = np.empty_like(p)
        launch(_step, (p, u, call.sc, call.fl, out), p.size)
    return _ref.LambResult(out.reshape(shape), m2.reshape(shape), v2.reshape(shape))
