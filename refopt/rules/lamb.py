"""Lamb's update in phases (``Convention.lamb_form``): element rule, per-tensor norms, element rule.

Lamb cannot be one element rule: the step of every element needs two sums over its whole
tensor (``||w||`` and ``||u||``, the trust ratio). It is written as the phases of
:mod:`refopt.rules` ("Phased updates"):

1. :data:`LAMB_DIRECTION` (slots ``m``, ``v``): the moments and the direction ``u``, returned
   in the parameter's place (``element(p, g, m, v) -> (u, m, v)``);
2. the per-tensor sums of squares of ``w`` and ``u`` in the framework's order
   (:func:`refopt.reference.adafactor.eigen_sum` for Keras 3, in order with FMAs for optax:
   the reference's own reduction functions, on the host), and the trust ratio from them,
   rounded as the framework rounds it (:func:`ratio_scalars`);
3. :data:`LAMB_APPLY` (no slot; the direction in the gradient's place, ``element(p, u) ->
   (p,)``) with the ratio as a scalar.

Forms (flag ``F_FORM``): 0 Keras 3 (``m + (g - m)*(1 - b1)``, ``m/(1 - b1^t) / (sqrt(v/(1 -
b2^t)) + eps)``, ``w - (r*lr)*u``); 1 optax under ``jit`` (``fma(1 - b, g, b*m)``, ``m/(bc1 *
(sqrt(v/bc2 + eps_root) + eps))``, ``fma(wd, w, u)`` with a decay, ``w + (u*r)*(-lr)``). The
formulas are :func:`refopt.reference.lamb_update`'s.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, fma, mul, sqrt, sub

F_FORM, F_DECAY = 0, 1
S_C1, S_C2, S_B1, S_B2, S_BC1, S_BC2, S_EPS, S_EPS_ROOT, S_WD = range(9)
S_RATIO, S_NEG_LR = 0, 1  # LAMB_APPLY's: Keras 3 ratio*lr in S_RATIO; optax ratio, -lr

#: The forms, by ``Convention.lamb_form``.
FORMS = {"keras3": 0, "optax": 1}


@register_jitable
def lamb_direction_element(p, g, m, v, sc, fl, tail):
    """The moments and the direction: returns ``(u, m, v)``."""
    if fl[F_FORM] == 0:
        m = add(m, mul(sub(g, m), sc[S_C1]))
        v = add(v, mul(sub(mul(g, g), v), sc[S_C2]))
        u = div(div(m, sc[S_BC1]), add(sqrt(div(v, sc[S_BC2])), sc[S_EPS]))
        return u, m, v
    m = fma(sc[S_C1], g, mul(sc[S_B1], m))
    v = fma(sc[S_C2], mul(g, g), mul(sc[S_B2], v))
    u = div(m, mul(sc[S_BC1], add(sqrt(add(div(v, sc[S_BC2]), sc[S_EPS_ROOT])), sc[S_EPS])))
    if fl[F_DECAY] != 0:
        u = fma(sc[S_WD], p, u)
    return u, m, v


@register_jitable
def lamb_apply_element(p, u, sc, fl, tail):
    """The step with the trust ratio: returns ``(p,)``."""
    if fl[F_FORM] == 0:
        return (sub(p, mul(sc[S_RATIO], u)),)
    return (add(p, mul(mul(u, sc[S_RATIO]), sc[S_NEG_LR])),)


LAMB_DIRECTION = Rule("lamb_direction", lamb_direction_element, ("m", "v"))
LAMB_APPLY = Rule("lamb_apply", lamb_apply_element, ())


def direction_call(dtype, conv, *, beta_1, beta_2, epsilon, step, eps_root=None,
                   weight_decay=None):
    """Phase 1's :class:`~refopt.rules.RuleCall`, its scalars rounded as the framework."""
    from refopt import _libm
    from refopt.reference._common import scalar, tf_cast

    dt = np.dtype(dtype)
    form = conv.lamb_form
    sc = [0] * 9
    with np.errstate(all="ignore"):
        sc[S_C1], sc[S_C2] = scalar(dt, 1 - beta_1), scalar(dt, 1 - beta_2)
        sc[S_EPS] = scalar(dt, epsilon)
        if form == "keras3":
            one, t = scalar(dt, 1), scalar(dt, step)
            sc[S_BC1] = one - _libm.power(dt, tf_cast(dt, beta_1), t)
            sc[S_BC2] = one - _libm.power(dt, tf_cast(dt, beta_2), t)
        else:
            work = np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
            for k, b in ((S_BC1, beta_1), (S_BC2, beta_2)):
                sc[k] = scalar(dt, work.type(1) - _libm.power(work, work.type(b),
                                                              work.type(step)))
            sc[S_B1], sc[S_B2] = scalar(dt, beta_1), scalar(dt, beta_2)
            sc[S_EPS_ROOT] = scalar(dt, 0.0 if eps_root is None else eps_root)
            if weight_decay is not None:
                sc[S_WD] = scalar(dt, weight_decay)
    return RuleCall(LAMB_DIRECTION, scalars(dt, sc),
                    flags([FORMS[form], weight_decay is not None]))


def ratio_scalars(dtype, conv, w, u, learning_rate, sums=None):
    """Phase 2: the trust ratio of ``w`` and the direction ``u`` from their norms in the
    framework's order, and phase 3's :class:`~refopt.rules.RuleCall`. ``sums``: the sums of
    squares (default :data:`refopt.rules.adafactor.HOST_SUMS`, the reference's functions)."""
    from refopt.rules.adafactor import HOST_SUMS

    S = HOST_SUMS if sums is None else sums
    with np.errstate(all="ignore"):
        if conv.lamb_form == "keras3":
            sq = S.eigen_sum_squares(w), S.eigen_sum_squares(u)
        else:
            sq = S.xla_sum_squares(w), S.xla_sum_squares(u)
    return ratio_call(dtype, conv, *sq, learning_rate)


def ratio_call(dtype, conv, w_sq, u_sq, learning_rate):
    """Phase 3's :class:`~refopt.rules.RuleCall` from the sums of squares of ``w`` and ``u``
    (scalars of ``dtype``, summed in the framework's order): the trust ratio rounded as the
    framework rounds it."""
    from refopt.reference._common import lr_cast, scalar

    dt = np.dtype(dtype)
    one = scalar(dt, 1)
    with np.errstate(all="ignore"):
        if conv.lamb_form == "keras3":
            w_norm, u_norm = np.sqrt(w_sq), np.sqrt(u_sq)
            ratio = w_norm / u_norm if (w_norm > 0 and u_norm > 0) else one
            sc = [ratio * lr_cast(dt, learning_rate)]
        else:
            w_norm, u_norm = np.sqrt(w_sq), np.sqrt(u_sq)
            ratio = one if (w_norm == 0 or u_norm == 0) else w_norm / (u_norm + scalar(dt, 0))
            sc = [ratio, scalar(dt, -float(learning_rate))]
    return RuleCall(LAMB_APPLY, scalars(dt, sc), flags([FORMS[conv.lamb_form]]))


def pure_update(apply, param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None, sums=None):
    """:func:`refopt.reference.lamb_update` in phases with a backend's ``apply(call, param,
    grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions): the reference's own
    checks, the direction, the norms on the host (``sums``: see :func:`ratio_scalars`), the
    step. Returns a ``LambResult``."""
    from refopt.reference import lamb as ref

    param, grad, m, v, conv = ref.check_lamb_args(
        param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, step=step, convention=convention, eps_root=eps_root,
        weight_decay=weight_decay)
    dt = param.dtype
    with np.errstate(all="ignore"):
        call = direction_call(dt, conv, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                              step=step, eps_root=eps_root, weight_decay=weight_decay)
        u, (m2, v2) = apply(call, param, grad, [m, v])
        p, _ = apply(ratio_scalars(dt, conv, param, u, learning_rate, sums), param, u,
                     [])
    return ref.LambResult(p, m2, v2)
