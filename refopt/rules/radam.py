"""RAdam's rule under both framework forms (``Convention.radam_form``).

Slots ``m``, ``v``; one element function, :func:`radam_element`, branching on ``F_FORM``
and on ``F_RECT`` (whether this step is rectified: decided on the host from
:math:`\\rho_t`, as both frameworks decide it):

0. PyTorch's single-tensor for-loop: ``m = lerp(m, g, c1)`` (one FMA, branching on
   ``F_LERP_LOW``), ``v = fma(c2*g, g, v*b2)``, ``mh = m / bc1``; rectified
   ``p - ((mh*lr) * ((1 / (sqrt(v) + eps)) * sqrt_bc2)) * rect``, else ``p - mh*lr``.
1. optax under ``jit``: ``m = fma(c1, g, b1*m)``, ``v = fma(c2, g*g, b2*v)``, ``mh = m /
   bc1``; rectified ``u = (rect*mh) / (sqrt(v/bc2 + eps_root) + eps)``, else ``u = mh``;
   ``p + (-lr)*u``.

The formulas are those of :func:`refopt.reference.radam_update` (its Notes); the host
computes :math:`\\rho_t`, the rectification and the bias corrections as each framework does
(:func:`refopt.reference.radam.radam_scalars`) and rounds them (:func:`radam_call`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, div, fma, mul, sqrt, sub

F_FORM, F_RECT, F_LERP_LOW, F_OPTAX_JIT = 0, 1, 2, 3
(S_C1, S_W1, S_B1, S_C2, S_B2, S_BC1, S_BC2, S_LR, S_NEG_LR, S_EPS, S_EPS_ROOT,
 S_BC2_SQRT, S_RECT, S_ONE) = range(14)

#: The element's forms, by name.
FORMS = {"torch": 0, "optax": 1}


@register_jitable
def radam_element(p, g, m, v, sc, fl, tail):
    """One RAdam element: returns ``(p, m, v)``."""
    if fl[F_FORM] == 0:
        d = sub(g, m)
        if fl[F_LERP_LOW] != 0:
            m = fma(sc[S_C1], d, m)
        else:
            m = fma(sc[S_W1], d, g)
        v = fma(mul(sc[S_C2], g), g, mul(v, sc[S_B2]))
        mh = div(m, sc[S_BC1])
        if fl[F_RECT] != 0:
            adaptive = mul(div(sc[S_ONE], add(sqrt(v), sc[S_EPS])), sc[S_BC2_SQRT])
            return sub(p, mul(mul(mul(mh, sc[S_LR]), adaptive), sc[S_RECT])), m, v
        return sub(p, mul(mh, sc[S_LR])), m, v
    if fl[F_OPTAX_JIT] == 1:  # optax eager: each operation rounded, no FMA
        m = add(mul(sc[S_C1], g), mul(sc[S_B1], m))
        v = add(mul(sc[S_C2], mul(g, g)), mul(sc[S_B2], v))
    else:
        m = fma(sc[S_C1], g, mul(sc[S_B1], m))
        v = fma(sc[S_C2], mul(g, g), mul(sc[S_B2], v))
    u = div(m, sc[S_BC1])
    if fl[F_RECT] != 0:
        den = add(sqrt(add(div(v, sc[S_BC2]), sc[S_EPS_ROOT])), sc[S_EPS])
        u = div(mul(sc[S_RECT], u), den)
    return optax_apply(p, u, sc[S_NEG_LR], fl[F_OPTAX_JIT]), m, v


RADAM = Rule("radam", radam_element, ("m", "v"))


def radam_call(dtype, conv, *, learning_rate, beta_1, beta_2, epsilon, step,
               epsilon_root=0.0, threshold=5.0):
    """The :class:`~refopt.rules.RuleCall` of one RAdam step (1-based ``step``) for
    ``dtype`` under ``conv``."""
    from refopt.reference._common import scalar
    from refopt.reference.radam import _convention, _form, radam_scalars

    dtype = np.dtype(dtype)
    conv = _convention(conv)
    form_name = _form(conv)
    s = radam_scalars(dtype, beta_1=beta_1, beta_2=beta_2, step=step, convention=conv,
                      threshold=threshold)
    sc = [0] * 14
    sc[S_ONE] = 1
    with np.errstate(all="ignore"):
        if form_name == "torch":
            form = FORMS["torch"]
            c1 = scalar(dtype, 1 - beta_1)
            sc[S_C1], sc[S_W1] = c1, c1 - scalar(dtype, 1)
            sc[S_C2], sc[S_B2] = scalar(dtype, 1 - beta_2), scalar(dtype, beta_2)
            sc[S_BC1] = scalar(dtype, s["bc1"])
            sc[S_LR] = scalar(dtype, learning_rate)
            sc[S_EPS] = scalar(dtype, epsilon)
            if s["rectified"]:
                sc[S_BC2_SQRT] = scalar(dtype, s["bc2"] ** 0.5)
                sc[S_RECT] = scalar(dtype, s["rect"])
            lerp_low = abs(float(c1)) < 0.5
        else:
            form = FORMS["optax"]
            sc[S_C1], sc[S_B1] = scalar(dtype, 1 - beta_1), scalar(dtype, beta_1)
            sc[S_C2], sc[S_B2] = scalar(dtype, 1 - beta_2), scalar(dtype, beta_2)
            sc[S_BC1], sc[S_BC2] = scalar(dtype, s["bc1"]), scalar(dtype, s["bc2"])
            sc[S_RECT] = scalar(dtype, s["rect"])
            sc[S_EPS], sc[S_EPS_ROOT] = scalar(dtype, epsilon), scalar(dtype, epsilon_root)
            sc[S_NEG_LR] = scalar(dtype, -float(learning_rate))
            lerp_low = False
    jit = OPTAX_JIT[_convention(conv).optax_jit] if form == FORMS["optax"] else 0
    return RuleCall(RADAM, scalars(dtype, sc), flags([form, s["rectified"], lerp_low, jit]))


def pure_update(apply, param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention, epsilon_root=0.0, threshold=5.0):
    """:func:`refopt.reference.radam_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step; returns a ``RAdamResult``."""
    from refopt.reference import radam as ref
    from refopt.reference.sqrt import needs_reference

    if needs_reference(convention):  # MKL's root (the `sqrt` knob): not in the rule
        return ref.radam_update(param, grad, m, v, learning_rate=learning_rate,
            beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step,
            convention=convention, epsilon_root=epsilon_root, threshold=threshold)

    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, epsilon_root=epsilon_root, threshold=threshold)
    param, grad, m, v, _ = ref.check_radam_args(param, grad, m, v, convention=convention,
                                                **kw)
    call = radam_call(param.dtype, ref._convention(convention), **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [m, v])
    return ref.RAdamResult(p, out[0], out[1])
