"""Adafactor on the CPU: :func:`refopt.reference.adafactor_update`, computed in phases.

The element phases are :mod:`refopt.rules.adafactor` (the second-moment estimate with the
update, then the step), run by this module's kernels (:func:`_apply`: the rules' elements
over the variable, the factored moments' factors read from broadcast views, never expanded
to the variable's size, each phase writing new arrays only); the means between them (the
variable's RMS, the row and column means, the update's RMS) and the factored moments (one
row or column of numbers) are computed on the host in the framework's order by the compiled
sums of :mod:`refopt.kernels.cpu._reduce_seq` (the reference's orders, bit for bit). The
arguments are checked by the reference's checks, so the errors are the same. float16 is
computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from refopt.kernels.cpu._common import launch
from refopt.reference import adafactor as _ref
from refopt.rules.adafactor import (  # F_FORM, F_FACTORED, F_LERP_LOW: flags 0, 1, 2
    ADAFACTOR_DIRECTION,
    ADAFACTOR_STEP,
    F_FACTORED,
    F_FORM,
    adafactor_direction_element,
    adafactor_step_element,
)

__all__ = ["adafactor_update", "prepare_in_place"]

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
def _direction_row(P, G, S0, S1, S2, sc, fl, U, O):
    # O: the new first slot, or an empty array where the rule leaves it as given
    if O.shape[0] == 0:
        for j in range(P.shape[0]):
            U[j] = adafactor_direction_element(P[j], G[j], S0[j], S1[j], S2[j], sc, fl,
                                               False)[0]
        return
    for j in range(P.shape[0]):
        u, s0, _, _ = adafactor_direction_element(P[j], G[j], S0[j], S1[j], S2[j], sc, fl,
                                                  False)
        U[j] = u
        O[j] = s0


@njit(parallel=True, **_OPTS)
def _direction(p, g, s0, s1, s2, sc, fl, u, o):
    # (B, R, C) arrays; the slots may be broadcast views (zero strides), copied row by row
    # into contiguous buffers. One row per iteration; the scalars as a tuple (in registers),
    # the form and factoring as literal flags (one loop each: their branches fold away)
    sc = _tuple16(sc)
    form, factored, low = fl[0], fl[1], fl[2]
    B, R, C = p.shape[0], p.shape[1], p.shape[2]
    nc = (C + _CHUNK - 1) // _CHUNK  # a row in spans of at most _CHUNK elements
    for t in prange(B * R * nc):
        b, i, c = t // (R * nc), (t // nc) % R, t % nc
        lo, hi = c * _CHUNK, min(C, (c + 1) * _CHUNK)
        r0, r1, r2 = np.empty(hi - lo, p.dtype), np.empty(hi - lo, p.dtype), np.empty(
            hi - lo, p.dtype)
        r0[:] = s0[b, i, lo:hi]
        r1[:] = s1[b, i, lo:hi]
        r2[:] = s2[b, i, lo:hi]
        P, G, U = p[b, i, lo:hi], g[b, i, lo:hi], u[b, i, lo:hi]
        O = o[b, i, lo:hi] if o.shape[2] else o[0, 0]
        if form == 0 and factored != 0:
            _direction_row(P, G, r0, r1, r2, sc, (0, 1, low, 0, 0, 0, 0, 0), U, O)
        elif form == 0:
            _direction_row(P, G, r0, r1, r2, sc, (0, 0, low, 0, 0, 0, 0, 0), U, O)
        elif form == 1 and factored != 0:
            _direction_row(P, G, r0, r1, r2, sc, (1, 1, low, 0, 0, 0, 0, 0), U, O)
        elif form == 1:
            _direction_row(P, G, r0, r1, r2, sc, (1, 0, low, 0, 0, 0, 0, 0), U, O)
        elif form == 2 and factored != 0:
            _direction_row(P, G, r0, r1, r2, sc, (2, 1, low, 0, 0, 0, 0, 0), U, O)
        elif form == 2:
            _direction_row(P, G, r0, r1, r2, sc, (2, 0, low, 0, 0, 0, 0, 0), U, O)
        elif factored != 0:
            _direction_row(P, G, r0, r1, r2, sc, (3, 1, low, 0, 0, 0, 0, 0), U, O)
        else:
            _direction_row(P, G, r0, r1, r2, sc, (3, 0, low, 0, 0, 0, 0, 0), U, O)


def _three(a, shape3):
    return np.reshape(a, shape3)  # a view where the strides allow, else a copy


def _apply(call, param, grad, slots):
    """The CPU's ``apply`` for :func:`refopt.rules.adafactor.pure_update`: the two Adafactor
    rules into new arrays; the slots may be broadcast views (``takes_views``). The direction
    returns its new first slot (the only one the rule changes) and the others as given."""
    dt = param.dtype
    shape = param.shape
    n = param.size
    if call.rule is ADAFACTOR_STEP:
        out = np.array(param, dt, order="C").reshape(-1)  # the new variable, stepped in place
        u = np.ascontiguousarray(grad, dt).reshape(-1)
        with np.errstate(all="ignore"):
            launch(_step_in_place, (out, u, call.sc, call.fl), n)
        return out.reshape(shape), []
    assert call.rule is ADAFACTOR_DIRECTION
    if len(shape) >= 2:
        shape3 = (int(np.prod(shape[:-2], dtype=np.int64)), shape[-2], shape[-1])
    else:
        shape3 = (1, 1, n)
    u = np.empty(shape3, dt)
    # torch's and optax's factored estimates leave the first slot as given (a factor, not a
    # moment of the variable's size): not written
    same = call.fl[F_FORM] >= 2 and call.fl[F_FACTORED] != 0
    o = np.empty((1, 1, 0) if same else shape3, dt)
    if n:
        p3 = _three(np.ascontiguousarray(param), shape3)
        g3 = _three(np.ascontiguousarray(grad, dt), shape3)
        s3 = [_three(np.asarray(a, dt), shape3) for a in slots]
        with np.errstate(all="ignore"):
            launch(_direction, (p3, g3, *s3, call.sc, call.fl, u, o), n)
    return u.reshape(shape), [slots[0] if same else o.reshape(shape), slots[1], slots[2]]


_apply.takes_views = True


# ---------------------------------------------------------------- the in-place step
@njit(**_OPTS)
def _step_span_in_place(P, U, sc, fl):
    for i in range(P.shape[0]):
        P[i] = adafactor_step_element(P[i], U[i], sc, fl, False)[0]


@njit(parallel=True, **_OPTS)
def _step_in_place(p, u, sc, fl):
    sc, fl = _tuple16(sc), _tuple8(fl)
    n = p.size
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        _step_span_in_place(p[lo:hi], u[lo:hi], sc, fl)


@njit(**_OPTS)
def _direction_span_flat(P, G, V, sc, fl, U, zero):
    # an unfactored moment, read and written in place through one name (vectorises)
    for i in range(P.shape[0]):
        u, v, _, _ = adafactor_direction_element(P[i], G[i], V[i], zero, zero, sc, fl, False)
        U[i] = u
        V[i] = v


@njit(parallel=True, **_OPTS)
def _direction_flat(p, g, v, sc, fl, u, zero):
    """The unfactored direction over flat arrays: ``u``, and the moment ``v`` in place."""
    sc = _tuple16(sc)
    form, low = fl[0], fl[2]
    n = p.size
    for c in prange((n + _CHUNK - 1) // _CHUNK):
        lo, hi = c * _CHUNK, min(n, (c + 1) * _CHUNK)
        P, G, V, U = p[lo:hi], g[lo:hi], v[lo:hi], u[lo:hi]
        if form == 0:
            _direction_span_flat(P, G, V, sc, (0, 0, 0, 0, 0, 0, 0, 0), U, zero)
        elif form == 1:
            _direction_span_flat(P, G, V, sc, (1, 0, 0, 0, 0, 0, 0, 0), U, zero)
        elif form == 2 and low != 0:
            _direction_span_flat(P, G, V, sc, (2, 0, 1, 0, 0, 0, 0, 0), U, zero)
        elif form == 2:
            _direction_span_flat(P, G, V, sc, (2, 0, 0, 0, 0, 0, 0, 0), U, zero)
        else:
            _direction_span_flat(P, G, V, sc, (3, 0, 0, 0, 0, 0, 0, 0), U, zero)


def _in_place_apply(var, velocity, scratch):
    """An ``apply`` for :func:`refopt.rules.adafactor.pure_update` that writes the moment of
    the variable's size into ``velocity``, the direction into ``scratch`` (or a new array)
    and the step into ``var``; like :func:`_apply` otherwise (broadcast views of the
    factors)."""

    def apply(call, param, grad, slots):
        dt = param.dtype
        shape = param.shape
        n = param.size
        if call.rule is ADAFACTOR_STEP:
            p = var.reshape(-1)
            u = np.ascontiguousarray(grad, dt).reshape(-1)
            if param.ctypes.data != var.ctypes.data:  # from another array (Keras' decayed
                np.copyto(p, np.asarray(param).reshape(-1))  # copy): the step starts there
            with np.errstate(all="ignore"):
                launch(_step_in_place, (p, u, call.sc, call.fl), n)
            return var, []
        assert call.rule is ADAFACTOR_DIRECTION
        if len(shape) >= 2:
            shape3 = (int(np.prod(shape[:-2], dtype=np.int64)), shape[-2], shape[-1])
        else:
            shape3 = (1, 1, n)
        u = (np.empty(n, dt) if scratch is None else scratch[:n]).reshape(shape3)
        s0 = slots[0]
        if (call.fl[F_FACTORED] == 0 and velocity.size == n and n
                and isinstance(s0, np.ndarray) and s0.flags.c_contiguous
                and s0.ctypes.data == velocity.ctypes.data):
            # unfactored: the moment is the velocity slot itself, updated in place
            v = velocity.reshape(-1)
            with np.errstate(all="ignore"):
                launch(_direction_flat, (np.ascontiguousarray(param).reshape(-1),
                                         np.ascontiguousarray(grad, dt).reshape(-1), v,
                                         call.sc, call.fl, u.reshape(-1), dt.type(0)), n)
            return u.reshape(shape), [v.reshape(shape), slots[1], slots[2]]
        same = call.fl[F_FORM] >= 2 and call.fl[F_FACTORED] != 0
        # the kernel copies each row of the slots before it writes the row of `o`: `o` may
        # be the moment it reads
        if same:
            o = np.empty((1, 1, 0), dt)
        elif velocity.size == n:
            o = velocity.reshape(shape3)
        else:  # (not a shape the framework has: kept apart, as _apply)
            o = np.empty(shape3, dt)
        if n:
            p3 = _three(np.ascontiguousarray(param), shape3)
            g3 = _three(np.ascontiguousarray(grad, dt), shape3)
            s3 = [_three(np.asarray(a, dt), shape3) for a in slots]
            with np.errstate(all="ignore"):
                launch(_direction, (p3, g3, *s3, call.sc, call.fl, u, o), n)
        return u.reshape(shape), [slots[0] if same else o.reshape(shape), slots[1], slots[2]]

    apply.takes_views = True
    return apply


def _writable(a, dt):
    return type(a) is np.ndarray and a.dtype == dt and a.flags.writeable and (
        a.flags.c_contiguous)


def prepare_in_place(param, grad, velocity_row, velocity_col, velocity, *, learning_rate,
                     step, convention=None, source=None, scratch=None, **options):
    """One Adafactor step that overwrites ``param`` and its three slots, checked and ready.

    The numbers are :func:`adafactor_update`'s (the reference's, bit for bit); the moment of
    the variable's size (a vector's ``velocity``, Keras' stored estimate) is updated in place
    in the direction's pass, the direction goes to ``scratch`` and the step is written into
    ``param`` in place; the factored moments (one row or column) are copied into their
    slots at the end.

    Parameters
    ----------
    param : ndarray of float32 or float64
        The variable, C-contiguous and writeable: written by the returned function.
    grad : ndarray
        The gradient, of ``param``'s shape and dtype, C-contiguous, sharing no memory with
        what is written.
    velocity_row, velocity_col, velocity : ndarray
        The slots (their shapes as :func:`refopt.reference.adafactor_initial_state`), of
        ``param``'s dtype, C-contiguous and writeable: written by the returned function.
    learning_rate, step, convention, **options
        As :func:`refopt.reference.adafactor_update`.
    source : ndarray, optional
        The variable the step starts from when it is not ``param`` (Keras' decoupled weight
        decay, applied before the update), of ``param``'s shape and dtype. Read only.
    scratch : ndarray, optional
        A 1-d array of ``param``'s dtype with at least ``param.size`` elements, for the
        direction (default: a new array per call).

    Returns
    -------
    callable or None
        A function of no argument that runs the step and cannot fail; ``None`` (nothing
        written) when these arrays are not for it (another dtype, a non-contiguous array):
        the caller computes with :func:`adafactor_update` instead.

    Raises
    ------
    ValueError, TypeError
        As :func:`refopt.reference.adafactor_update` (the same checks), before anything is
        written.
    """
    dt = getattr(param, "dtype", None)
    if dt not in _FAST:
        return None
    src = param if source is None else source
    if not (all(_writable(a, dt) for a in (param, velocity_row, velocity_col, velocity))
            and type(grad) is np.ndarray and grad.flags.c_contiguous
            and type(src) is np.ndarray and src.dtype == dt and src.shape == param.shape
            and src.flags.c_contiguous):
        return None
    if scratch is not None and not (_writable(scratch, dt) and scratch.ndim == 1
                                    and scratch.size >= param.size):
        return None
    from refopt.kernels.cpu._reduce_seq import SUMS
    from refopt.rules.adafactor import pure_update

    _ref.check_adafactor_args(src, grad, velocity_row, velocity_col, velocity,
                              learning_rate=learning_rate, step=step, convention=convention,
                              **options)
    apply = _in_place_apply(param, velocity, scratch)

    def run():
        r = pure_update(apply, src, grad, velocity_row, velocity_col, velocity,
                        learning_rate=learning_rate, step=step, convention=convention,
                        sums=SUMS, copy=False, **options)
        for slot, new in ((velocity_row, r.velocity_row), (velocity_col, r.velocity_col),
                          (velocity, r.velocity)):
            if new.size and new.ctypes.data != slot.ctypes.data:
                np.copyto(slot, new)

    return run


def adafactor_update(param, grad, velocity_row, velocity_col, velocity, *, learning_rate, step,
                     convention=None, beta_2_decay=None, epsilon_1=None, epsilon_2=None,
                     clip_threshold=None, weight_decay=None, min_dim_size_to_factor=None,
                     decay_offset=None, multiply_by_parameter_scale=None, factored=None):
    """As :func:`refopt.reference.adafactor_update`, bit-identical in float32 and float64."""
    options = dict(beta_2_decay=beta_2_decay, epsilon_1=epsilon_1, epsilon_2=epsilon_2,
                   clip_threshold=clip_threshold, weight_decay=weight_decay,
                   min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset,
                   multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adafactor_update(param, grad, velocity_row, velocity_col, velocity,
                                     learning_rate=learning_rate, step=step,
                                     convention=convention, **options)
    from refopt.kernels.cpu._reduce_seq import SUMS
    from refopt.rules.adafactor import pure_update

    return pure_update(_apply, param, grad, velocity_row, velocity_col, velocity,
                       learning_rate=learning_rate, step=step, convention=convention, sums=SUMS,
                       **options)
