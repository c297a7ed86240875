"""Adafactor's update in phases (``Convention.adafactor_form``).

Every element of an Adafactor step needs means over its row, its column and its whole tensor,
so the step is written as the phases of :mod:`refopt.rules` ("Phased updates"):

1. on the host, in the framework's order (the reference's own functions,
   :mod:`refopt.reference.adafactor`): the variable's RMS, the row and column means of
   ``g^2`` and the factored moments (arrays of one row or one column: small), the decay;
2. :data:`ADAFACTOR_DIRECTION`: the second-moment estimate and the update ``u``, returned in
   the parameter's place; its three slots carry the moment (a vector's ``velocity``, updated
   here) or the factored estimate's factors broadcast to the variable's shape;
3. on the host: the update's RMS (the clip) and the step's scalars;
4. :data:`ADAFACTOR_STEP` (no slot; ``u`` in the gradient's place): the step.

Forms (flag ``F_FORM``): 0 Keras 3, 1 tf_keras (``g * rsqrt(V)``), 2 torch, 3 optax; flag
``F_FACTORED``. The formulas are :func:`refopt.reference.adafactor_update`'s.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, fma, maximum, mul, rsqrt, sqrt, sub

F_FORM, F_FACTORED, F_LERP_LOW, F_CLIP, F_LR, F_SCALE, F_DECAY = range(7)
# ADAFACTOR_DIRECTION's scalars
S_B2T, S_OMB, S_E1, S_ONE, S_E1SQ, S_W, S_WM1 = range(7)
# ADAFACTOR_STEP's scalars
S_ALPHA, S_DEN, S_LR, S_SCALE, S_WD, S_MINUS_ONE, S_DECAY = range(7)

#: The forms, by ``Convention.adafactor_form``.
FORMS = {"keras3": 0, "tf_keras": 1, "torch": 2, "optax": 3}


@register_jitable
def adafactor_direction_element(p, g, s0, s1, s2, sc, fl, tail):
    """The estimate and the update: returns ``(u, s0, s1, s2)`` (``s0`` the new moment of a
    vector; Keras: the estimate it stores)."""
    form = fl[F_FORM]
    if form <= 1:  # Keras
        if fl[F_FACTORED] != 0:  # s0: r / mean(r) per row, s1: c per column
            vv = mul(s0, s1)
        else:  # s0: v
            vv = add(mul(sc[S_B2T], s0), mul(sc[S_OMB], add(mul(g, g), sc[S_E1])))
        u = div(g, sqrt(vv)) if form == 0 else mul(g, rsqrt(vv))
        return u, vv, s1, s2
    if form == 2:  # torch
        if fl[F_FACTORED] != 0:  # s0: row_var, s1: col_var, s2: clamp(mean(row_var), eps1)
            est = div(mul(s0, s1), s2)
            v = s0
        else:  # s0: variance.lerp_(g*g, w)
            gg = mul(g, g)
            d = sub(gg, s0)
            if fl[F_LERP_LOW] != 0:
                v = fma(sc[S_W], d, s0)
            else:
                v = fma(sc[S_WM1], d, gg)
            est = v
        u = mul(div(sc[S_ONE], sqrt(maximum(est, sc[S_E1SQ]))), g)
        return u, v, s1, s2
    if fl[F_FACTORED] != 0:  # optax; s0: the row factor, s1: the column factor
        return mul(mul(g, s0), s1), s0, s1, s2
    v = fma(sc[S_B2T], s0, mul(sc[S_OMB], fma(g, g, sc[S_E1])))
    return mul(g, rsqrt(v)), v, s1, s2


@register_jitable
def adafactor_step_element(p, u, sc, fl, tail):
    """The step: returns ``(p,)``."""
    form = fl[F_FORM]
    if form <= 1:
        return (sub(p, mul(sc[S_ALPHA], div(u, sc[S_DEN]))),)
    if form == 2:
        if fl[F_DECAY] != 0:
            p = mul(p, sc[S_DECAY])
        return (fma(u, sc[S_ALPHA], p),)
    if fl[F_CLIP] != 0:
        u = div(u, sc[S_DEN])
    if fl[F_LR] != 0:
        u = mul(u, sc[S_LR])
    if fl[F_SCALE] != 0:
        u = mul(u, sc[S_SCALE])
    if fl[F_DECAY] != 0:
        u = fma(sc[S_WD], p, u)
    return (add(p, mul(u, sc[S_MINUS_ONE])),)


ADAFACTOR_DIRECTION = Rule("adafactor_direction", adafactor_direction_element,
                           ("s0", "s1", "s2"))
ADAFACTOR_STEP = Rule("adafactor_step", adafactor_step_element, ())


def _full_copy(a, shape):
    return np.ascontiguousarray(np.broadcast_to(a, shape))


class _HostSums:
    """The sums of the phases, by the reference's own functions (readable NumPy): the default
    ``sums`` of :func:`pure_update` and :func:`refopt.rules.lamb.pure_update`. A backend may
    hand its own with the same bits (``refopt.kernels.cpu._reduce_seq.SUMS``, compiled)."""

    @staticmethod
    def eigen_sum_squares(x):
        from refopt.reference.adafactor import eigen_sum

        return eigen_sum(x * x)

    @staticmethod
    def xla_sum_squares(x):
        from refopt.reference.adafactor import xla_sum_squares

        return xla_sum_squares(x)

    @staticmethod
    def torch_vector_norm(x):
        from refopt.reference.reductions import torch_vector_norm

        return torch_vector_norm(x)

    @staticmethod
    def xla_sum_squares2(x, y):
        from refopt.reference.adafactor import xla_sum_squares

        return xla_sum_squares(x), xla_sum_squares(y)

    @staticmethod
    def eigen_rows_sq_add(g, e):
        from refopt.reference.adafactor import eigen_sum_rows

        return eigen_sum_rows(g * g + e)

    @staticmethod
    def seq_sum_sq_add(g, e, axis):
        from refopt.reference.adafactor import _seq_sum

        return _seq_sum(g * g + e, axis)

    @staticmethod
    def seq_sum_fma(g, e, axis):
        from refopt.reference.adafactor import _seq_sum, fma

        return _seq_sum(fma(g, g, e), axis)

    @staticmethod
    def seq_sum_sq(g, axis):
        from refopt.reference.adafactor import _seq_sum

        return _seq_sum(g * g, axis)

    @staticmethod
    def torch_rows_norm(g):
        from refopt.reference.adafactor import _torch_norm_axis

        return _torch_norm_axis(g, -1)[..., 0]


HOST_SUMS = _HostSums()


def pure_update(apply, param, grad, velocity_row, velocity_col, velocity, *, learning_rate,
                step, convention=None, sums=None, copy=True, **options):
    """:func:`refopt.reference.adafactor_update` in phases with a backend's ``apply(call,
    param, grad, slots) -> (param, slots)``: the reference's checks, the host's means (the
    reference's functions), the direction, the host's clip, the step. Returns an
    ``AdafactorResult``. ``sums``: the means' sums (default :data:`HOST_SUMS`, the
    reference's functions; the CPU's compiled ones have the same bits). ``copy=False``: the
    slots of the result may be the arrays ``apply`` returned or the inputs themselves (an
    ``apply`` that writes in place: the CPU's in-place step)."""
    from refopt import _libm
    from refopt.reference import adafactor as R
    from refopt.reference._common import lr_cast, scalar, tf_cast

    S = HOST_SUMS if sums is None else sums

    def rms_tf(x):  # the reference's _rms_tf
        return np.sqrt(x.dtype.type(S.eigen_sum_squares(x) / scalar(x.dtype, x.size)))

    squares = {}  # sums of squares taken ahead (two chains in one pass: xla_sum_squares2)

    def xla_mean_squares(x):  # the reference's _xla_mean_squares
        ssq = squares.pop(id(x)) if id(x) in squares else S.xla_sum_squares(x)
        return x.dtype.type(ssq * (scalar(x.dtype, 1) / scalar(x.dtype, np.size(x))))

    options = dict(dict.fromkeys(("beta_2_decay", "epsilon_1", "epsilon_2", "clip_threshold",
                                  "weight_decay", "min_dim_size_to_factor", "decay_offset",
                                  "multiply_by_parameter_scale", "factored")), **options)
    wd = options["weight_decay"]
    (w, g, r, c, v, conv, form, o) = R.check_adafactor_args(
        param, grad, velocity_row, velocity_col, velocity, learning_rate=learning_rate,
        step=step, convention=convention, **options)
    dt = w.dtype
    shape = w.shape
    one = scalar(dt, 1)
    dsc = [0] * 7
    ssc = [0] * 7
    fl = [FORMS[form]] + [0] * 6
    # a backend whose apply takes broadcast (read-only) views of the slots gets the factors
    # and the zero slots unexpanded (``apply.takes_views``, the CPU's); others full arrays
    views = getattr(apply, "takes_views", False)
    _full = np.broadcast_to if views else _full_copy
    zeros = np.broadcast_to(dt.type(0), shape) if views else np.zeros(shape, dt)
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3"):
            tt = scalar(dt, step)
            rho = min(lr_cast(dt, learning_rate), one / np.sqrt(tt))
            alpha = np.maximum(tf_cast(dt, o["epsilon_2"]), rms_tf(w)) * rho
            b2t = one - _libm.power(dt, tt, scalar(dt, o["beta_2_decay"]))
            if w.ndim >= 2:
                e1 = scalar(dt, o["epsilon_1"])  # the means of g*g + e1
                r = b2t * r + (one - b2t) * (S.eigen_rows_sq_add(g, e1)
                                             / scalar(dt, g.shape[-1]))
                c = b2t * c + (one - b2t) * (S.seq_sum_sq_add(g, e1, -2)
                                             / scalar(dt, g.shape[-2]))
                fl[F_FACTORED] = 1
                slots = [_full(np.expand_dims(r / R._mean(r, -1, keepdims=True, eigen=True),
                                              -1), shape), _full(np.expand_dims(c, -2), shape),
                         zeros]
            else:
                dsc[S_B2T], dsc[S_OMB], dsc[S_E1] = b2t, one - b2t, scalar(dt, o["epsilon_1"])
                slots = [v.reshape(shape), zeros, zeros]
            u, out = apply(RuleCall(ADAFACTOR_DIRECTION, scalars(dt, dsc), flags(fl)), w, g,
                           slots)
            v_new = out[0]
            ssc[S_ALPHA] = alpha
            ssc[S_DEN] = np.maximum(one, rms_tf(u) / scalar(dt, o["clip_threshold"]))
        elif form == "torch":
            lr = float(learning_rate)
            stepf = float(step)
            b = stepf ** o["beta_2_decay"]
            rho = min(lr, 1 / (stepf ** 0.5))
            eps1 = float(np.finfo(dt).eps) if o["epsilon_1"] is None else o["epsilon_1"]
            dsc[S_ONE], dsc[S_E1SQ] = one, scalar(dt, eps1 * eps1)
            if w.ndim > 1:
                row_norm = np.expand_dims(S.torch_rows_norm(g), -1)  # _torch_norm_axis
                row_mean = np.square(row_norm) / scalar(dt, g.shape[-1])
                r = R._torch_lerp(r, row_mean, b)
                col_norm = np.sqrt(np.expand_dims(S.seq_sum_sq(g, -2), -2))  # _torch_col_norm
                col_mean = np.square(col_norm) / scalar(dt, g.shape[-2])
                c = R._torch_lerp(c, col_mean, b)
                m = np.maximum(R._mean(r, -2, keepdims=True), scalar(dt, eps1))
                fl[F_FACTORED] = 1
                slots = [_full(r, shape), _full(c, shape), _full(m, shape)]
            else:
                wgt = scalar(dt, b)
                dsc[S_W], dsc[S_WM1] = wgt, wgt - scalar(dt, 1)
                fl[F_LERP_LOW] = abs(float(wgt)) < 0.5
                slots = [v.reshape(shape), zeros, zeros]
            u, out = apply(RuleCall(ADAFACTOR_DIRECTION, scalars(dt, dsc), flags(fl)), w, g,
                           slots)
            v_new = out[0] if w.ndim <= 1 else v
            # the norms of w (unchanged by the direction) and u, at once where the sums can
            norm2 = getattr(S, "torch_vector_norm2", None)
            w_norm, u_norm = (norm2(w, u) if norm2 is not None else
                              (S.torch_vector_norm(w), S.torch_vector_norm(u)))
            alpha = max(o["epsilon_2"], float(w_norm) / (w.size ** 0.5)) * rho
            denom = max(1.0, float(u_norm) / ((u.size ** 0.5) * o["clip_threshold"]))
            ssc[S_ALPHA] = scalar(dt, -alpha / denom)
            if wd:
                fl[F_DECAY] = 1
                ssc[S_DECAY] = scalar(dt, 1 - lr * wd)
        else:
            axes = R.factored_axes(shape, conv, factored=o["factored"],
                                   min_dim_size_to_factor=o["min_dim_size_to_factor"])
            tt = np.float32(step - o["decay_offset"])
            dec32 = np.float32(1.0) - _libm.power(np.float32, tt, np.float32(o["beta_2_decay"]))
            dec, omd = scalar(dt, dec32), scalar(dt, np.float32(1.0) - dec32)
            if axes is not None:
                ra, ca = axes
                e1 = scalar(dt, o["epsilon_1"])  # the means of fma(g, g, e1), XLA's
                r = R.fma(dec, r, omd * (S.seq_sum_fma(g, e1, ra)
                                         * (one / scalar(dt, g.shape[ra]))))
                c = R.fma(dec, c, omd * (S.seq_sum_fma(g, e1, ca)
                                         * (one / scalar(dt, g.shape[ca]))))
                rc = ca - 1 if ca > ra else ca
                fl[F_FACTORED] = 1
                slots = [_full(np.expand_dims(R.rsqrt(r / R._mean(r, rc, keepdims=True,
                                                                  xla=True)), ra), shape),
                         _full(np.expand_dims(R.rsqrt(c), ca), shape), zeros]
            else:
                dsc[S_B2T], dsc[S_OMB], dsc[S_E1] = dec, omd, scalar(dt, o["epsilon_1"])
                slots = [v.reshape(shape), zeros, zeros]
            u, out = apply(RuleCall(ADAFACTOR_DIRECTION, scalars(dt, dsc), flags(fl)), w, g,
                           slots)
            v_new = out[0] if axes is None else v
            clip = o["clip_threshold"] is not None and o["clip_threshold"] != np.inf
            if clip and o["multiply_by_parameter_scale"]:
                squares[id(u)], squares[id(w)] = S.xla_sum_squares2(u, w)
            if clip:
                fl[F_CLIP] = 1
                ssc[S_DEN] = np.maximum(scalar(dt, 1), np.sqrt(xla_mean_squares(u))
                                        / scalar(dt, o["clip_threshold"]))
            if learning_rate is not None:
                fl[F_LR] = 1
                ssc[S_LR] = scalar(dt, learning_rate)
            if o["multiply_by_parameter_scale"]:
                fl[F_SCALE] = 1
                rms = np.sqrt(xla_mean_squares(w))
                e2 = scalar(dt, o["epsilon_2"])
                ssc[S_SCALE] = e2 if rms <= e2 else rms  # noqa: FURB136 (a NaN RMS: NaN)
            if wd is not None:
                fl[F_DECAY] = 1
                ssc[S_WD] = scalar(dt, wd)
            ssc[S_MINUS_ONE] = scalar(dt, -1)
        p, _ = apply(RuleCall(ADAFACTOR_STEP, scalars(dt, ssc), flags(fl)), w, u, [])
    # new arrays (a slot a form leaves alone is not handed back as the input itself),
    # unless copy=False
    new = np.array if copy else np.asarray
    return R.AdafactorResult(p, new(r, dt).reshape(velocity_row.shape),
                             new(c, dt).reshape(velocity_col.shape),
                             new(v_new, dt).reshape(velocity.shape))
