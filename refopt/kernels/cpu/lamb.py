"""Lamb on the CPU: :func:`refopt.reference.lamb_update`, computed in phases by rule kernels.

The element phases are :mod:`refopt.rules.lamb` (the direction with the moments, then the
step with the trust ratio), their scalars rounded by the rule module
(:func:`refopt.rules.lamb.direction_call`, :func:`refopt.rules.lamb.ratio_call`), run by this
module's parallel kernels (:func:`_direction_in_place`, :func:`_step_in_place`: the rules'
elements; :func:`lamb_update` runs them on new copies of the moments and the variable);
between them the sums of squares of ``w`` and ``u`` in the
framework's order (Eigen's lanes for Keras 3, XLA's chain of FMAs for optax, both chains in
one pass), compiled in :mod:`refopt.kernels.cpu._reduce_seq` (the reference's orders, bit for
bit). The arguments are checked by the reference's checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).

:func:`prepare_in_place` is the optimizer's step on ``backend="cpu"`` (``Lamb._in_place_step``
through :func:`refopt.executors.cpu.try_in_place_step`): the same elements and sums, with the
moments and the variable overwritten in place and the direction in a reused scratch array;
Keras 3's two sums of squares, each serial in its order, run at once on two threads (optax's
two chains of FMAs, bound by latency, interleaved on one). It moves 44 bytes per float32
element (the direction's pass reads ``g, m, v`` and writes ``m, v, u``; the norms read ``w,
u``; the step reads ``w, u`` and writes ``w``), where :func:`lamb_update` into new arrays
plus the staged step's commit moved about twice as much.
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

__all__ = ["lamb_update", "prepare_in_place"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))
_OPTS = {"cache": True, "error_model": "numpy", "fastmath": False, "nogil": True}
_CHUNK = 1 << 16


@njit(**_OPTS)
def _tuple8(a):
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7])


@njit(**_OPTS)
def _tuple16(a):
    return (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
            a[13], a[14], a[15])


# ---------------------------------------------------------------- the in-place step
# The same element functions, each array both read and written at the same index through
# one name (two names for one array would keep LLVM from vectorising the loop).
@njit(**_OPTS)
def _direction_span_in_place(P, G, M, V, sc, fl, U):
    for i in range(P.shape[0]):
        ui, mi, vi = lamb_direction_element(P[i], G[i], M[i], V[i], sc, fl, False)
        U[i] = ui
        M[i] = mi
        V[i] = vi


@njit(parallel=True, **_OPTS)
def _direction_in_place(p, g, m, v, sc, fl, u):
    """The direction into ``u``, the moments ``m, v`` updated in place."""
    sc = _tuple16(sc)
    form, decay = fl[F_FORM], fl[F_DECAY]
    n = p.size
    chunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(chunks):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        if form == 0:
            _direction_span_in_place(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                                     (0, 0, 0, 0, 0, 0, 0, 0), u[lo:hi])
        elif decay == 0:
            _direction_span_in_place(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                                     (1, 0, 0, 0, 0, 0, 0, 0), u[lo:hi])
        else:
            _direction_span_in_place(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], sc,
                                     (1, 1, 0, 0, 0, 0, 0, 0), u[lo:hi])


@njit(**_OPTS)
def _step_span_in_place(P, U, sc, fl):
    for i in range(P.shape[0]):
        P[i] = lamb_apply_element(P[i], U[i], sc, fl, False)[0]


@njit(parallel=True, **_OPTS)
def _step_in_place(p, u, sc, fl):
    """The step with the trust ratio, ``p`` updated in place."""
    sc = _tuple16(sc)
    form = fl[F_FORM]
    n = p.size
    chunks = (n + _CHUNK - 1) // _CHUNK
    for c in prange(chunks):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        if form == 0:
            _step_span_in_place(p[lo:hi], u[lo:hi], sc, (0, 0, 0, 0, 0, 0, 0, 0))
        else:
            _step_span_in_place(p[lo:hi], u[lo:hi], sc, (1, 0, 0, 0, 0, 0, 0, 0))


@njit(**_OPTS)
def _eigen_squares(x, lanes, zero):
    # eigen_sum(x*x) in Eigen's lanes (_reduce_seq's own)
    if lanes == 8:
        return _S._eigen_sq8(x, zero)
    return _S._eigen_sq4(x, zero)


@njit(parallel=True, **_OPTS)
def _eigen_norms(w, u, lanes, zero, out):
    """``out[0], out[1]``: Keras 3's sums of squares of ``w`` and ``u``, each serial in
    Eigen's order, the two on two threads at once (each pass is bound by one thread's memory
    bandwidth). optax's two chains of FMAs are bound by the FMA's latency instead: one
    thread interleaves them (:func:`refopt.kernels.cpu._reduce_seq.xla_sum_squares2`)."""
    for k in prange(2):
        out[k] = _eigen_squares(w if k == 0 else u, lanes, zero)


def _in_place_ok(a, dt, shape):
    return (type(a) is np.ndarray and a.dtype == dt and a.shape == shape
            and a.flags.c_contiguous)


def prepare_in_place(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                     convention=None, eps_root=None, weight_decay=None, source=None,
                     scratch=None):
    """One Lamb step that overwrites ``param``, ``m`` and ``v``, checked and ready to run.

    The numbers are :func:`lamb_update`'s (the reference's, bit for bit); the memory is
    different: the moments are updated in place in the direction's pass (which writes the
    direction ``u`` into ``scratch``), the two sums of squares follow (each serial, in the
    framework's order; Keras 3's at once on two threads), then ``param`` is updated in
    place. No array of
    the variable's size is allocated when ``scratch`` is given.

    Parameters
    ----------
    param, m, v : ndarray of float32 or float64
        The variable and its moments, C-contiguous and writeable, one shape and dtype, no two
        sharing memory: written by the returned function.
    grad : ndarray
        The gradient, of ``param``'s shape and dtype, C-contiguous, sharing no memory with
        ``param``, ``m``, ``v`` or ``scratch``.
    learning_rate, beta_1, beta_2, epsilon, step, convention, eps_root, weight_decay
        As :func:`refopt.reference.lamb_update`.
    source : ndarray, optional
        The variable the step starts from, when it is not ``param`` (Keras 3's decoupled
        weight decay, applied before the update: the decayed copy), of ``param``'s shape and
        dtype. Read only.
    scratch : ndarray, optional
        A 1-d array of ``param``'s dtype and at least ``param.size`` elements, for the
        direction (default: a new array per call).

    Returns
    -------
    callable or None
        A function of no argument that runs the step and cannot fail; ``None`` (nothing
        checked, nothing written) when these arrays are not for the in-place step (another
        dtype, a non-contiguous or foreign array): the caller computes with
        :func:`lamb_update` instead.

    Raises
    ------
    ValueError, TypeError
        As :func:`refopt.reference.lamb_update` (the same checks), before anything is
        written.
    """
    dt = getattr(param, "dtype", None)
    if dt not in _FAST or not param.flags.writeable:
        return None
    shape = param.shape
    src = param if source is None else source
    if not all(_in_place_ok(a, dt, shape) for a in (param, grad, m, v, src)) or not (
            m.flags.writeable and v.flags.writeable):
        return None
    n = param.size
    if scratch is not None and not (type(scratch) is np.ndarray and scratch.dtype == dt
                                    and scratch.ndim == 1 and scratch.size >= n
                                    and scratch.flags.c_contiguous
                                    and scratch.flags.writeable):
        return None
    from refopt.rules.lamb import direction_call, ratio_call

    kw = {"learning_rate": learning_rate, "beta_1": beta_1, "beta_2": beta_2,
          "epsilon": epsilon, "step": step, "convention": convention, "eps_root": eps_root,
          "weight_decay": weight_decay}
    conv = _ref.check_lamb_args(src, grad, m, v, **kw)[4]
    form = 0 if conv.lamb_form == "keras3" else 1
    with np.errstate(all="ignore"):
        call = direction_call(dt, conv, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                              step=step, eps_root=eps_root, weight_decay=weight_decay)
    p, g, mm, vv, s = (a.reshape(-1) for a in (param, grad, m, v, src))
    lanes = 32 // dt.itemsize
    zero = dt.type(0)

    def run():
        with np.errstate(all="ignore"):
            u = np.empty(n, dt) if scratch is None else scratch[:n]
            launch(_direction_in_place, (s, g, mm, vv, call.sc, call.fl, u), n)
            if form == 0:
                sums = np.empty(2, dt)  # (small: on the calling thread, the same sums)
                launch(_eigen_norms, (s, u, lanes, zero, sums), n)
            else:
                sums = _S.xla_sum_squares2(s, u)
            step_call = ratio_call(dt, conv, sums[0], sums[1], learning_rate)
            if source is not None:  # (Keras 3's decayed copy: the step starts from it)
                np.copyto(p, s)
            launch(_step_in_place, (p, u, step_call.sc, step_call.fl), n)

    return run



def lamb_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None):
    """As :func:`refopt.reference.lamb_update`, bit-identical in float32 and float64."""
    kw = {"learning_rate": learning_rate, "beta_1": beta_1, "beta_2": beta_2,
          "epsilon": epsilon, "step": step, "convention": convention, "eps_root": eps_root,
          "weight_decay": weight_decay}
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.lamb_update(param, grad, m, v, **kw)
    from refopt.rules.lamb import direction_call, ratio_call

    p, g, m, v, conv = _ref.check_lamb_args(param, grad, m, v, **kw)
    dt = p.dtype
    shape = p.shape
    p, g = (np.ascontiguousarray(a, dt).reshape(-1) for a in (p, g))
    # new moments: copies, updated in place by the in-place step's kernel
    m2, v2 = (np.array(a, dt, order="C").reshape(-1) for a in (m, v))
    u = np.empty_like(p)
    with np.errstate(all="ignore"):
        call = direction_call(dt, conv, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                              step=step, eps_root=eps_root, weight_decay=weight_decay)
        launch(_direction_in_place, (p, g, m2, v2, call.sc, call.fl, u), p.size)
        if conv.lamb_form == "optax":
            w_sq, u_sq = _S.xla_sum_squares2(p, u)
        else:
            w_sq, u_sq = _S.eigen_sum_squares(p), _S.eigen_sum_squares(u)
        call = ratio_call(dt, conv, dt.type(w_sq), dt.type(u_sq), learning_rate)
        out = p.copy()
        launch(_step_in_place, (out, u, call.sc, call.fl), p.size)
    return _ref.LambResult(out.reshape(shape), m2.reshape(shape), v2.reshape(shape))
