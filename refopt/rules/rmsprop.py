"""RMSprop's rules under every framework form (``Convention.rmsprop_form``).

Slots ``velocity`` (always), ``momentum`` (when the form keeps a buffer) and
``average_gradient`` (centered): one element function per layout, all four calling
:func:`rms_core`. ``F_FORM``: 0 tf_keras (``rsqrt``), 1 Keras 3 (``sqrt`` and a division),
2 TensorFlow's ``ApplyRMSProp`` kernel (Keras 2 with momentum, TF1), 3 Keras 2's Python
branch (momentum 0, epsilon outside the root), 4 PyTorch's for-loop, 5 optax under ``jit``.
The formulas are those of :func:`refopt.reference.rmsprop_update` (its Notes); the host
rounds the scalars as each framework does (:func:`rmsprop_call`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Root, Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, div, fma, mul, rsqrt, sqrt, sub

F_FORM, F_CENTERED, F_MOMENTUM, F_EPS_IN_SQRT, F_LERP_LOW, F_OPTAX_JIT = range(6)
S_LR, S_RHO, S_C, S_EPS, S_MU, S_NEG_LR, S_C1M, S_ZERO, S_ONE = range(9)

_FORMS = {"tf_keras": 0, "keras3": 1, "kernel": 2, "keras2": 3, "torch": 4, "optax": 5}


@register_jitable
def rms_torch_step(p, g, root, sc):
    """PyTorch's step without momentum from ``root`` (``sqrt`` of the new ``v``, or of
    ``v - a*a`` centered): ``p + (-lr*g) / (root + eps)``."""
    return add(p, div(mul(sc[S_NEG_LR], g), add(root, sc[S_EPS])))


@register_jitable
def rms_v_finish(p, g, v, root, sc, fl, tail):
    """The plain rule's PyTorch step (form 4) from ``root = sqrt(v)`` (:class:`Root`)."""
    return rms_torch_step(p, g, root, sc)


@register_jitable
def rms_core(p, g, v, b, a, sc, fl):
    """One RMSprop element: returns ``(p, v, b, a)`` (``b``, ``a`` unchanged when unused)."""
    form = fl[F_FORM]
    centered = fl[F_CENTERED] != 0
    has_mom = fl[F_MOMENTUM] != 0
    c = sc[S_C]
    eps = sc[S_EPS]
    if form == 0 or form == 1:
        r = sc[S_RHO]
        v = add(mul(r, v), mul(c, mul(g, g)))
        if centered:
            a = add(mul(r, a), mul(c, g))
            den = add(sub(v, mul(a, a)), eps)
        else:
            den = add(v, eps)
        if form == 0:
            inc = mul(mul(sc[S_LR], g), rsqrt(den))
        else:
            inc = div(mul(sc[S_LR], g), sqrt(den))
        if has_mom:
            b = add(mul(sc[S_MU], b), inc)
            return sub(p, b), v, b, a
        return sub(p, inc), v, b, a
    if form == 2:
        v = add(v, mul(sub(mul(g, g), v), c))
        if centered:
            a = add(a, mul(sub(g, a), c))
            den = add(sub(v, mul(a, a)), eps)
        else:
            den = add(v, eps)
        b = add(mul(b, sc[S_MU]), div(mul(g, sc[S_LR]), sqrt(den)))
        return sub(p, b), v, b, a
    if form == 3:
        r = sc[S_RHO]
        v = add(mul(r, v), mul(c, mul(g, g)))
        den = v
        if centered:
            a = add(mul(r, a), mul(c, g))
            den = sub(v, mul(a, a))
        return sub(p, div(mul(sc[S_LR], g), add(sqrt(den), eps))), v, b, a
    if form == 4:
        v = fma(mul(c, g), g, mul(v, sc[S_RHO]))
        if centered:
            d = sub(g, a)
            if fl[F_LERP_LOW] != 0:
                a = fma(c, d, a)
            else:
                a = fma(sc[S_C1M], d, g)
            root = sqrt(fma(-a, a, v))
        else:
            root = sqrt(v)
        if has_mom:
            b = add(mul(b, sc[S_MU]), div(g, add(root, eps)))
            return fma(sc[S_NEG_LR], b, p), v, b, a
        return rms_torch_step(p, g, root, sc), v, b, a
    jit = fl[F_OPTAX_JIT]  # optax: 0 jit(update), 1 eager (no FMA), 2 whole step jitted
    if jit == 1:
        v = add(mul(c, mul(g, g)), mul(sc[S_RHO], v))
    else:
        v = fma(c, mul(g, g), mul(sc[S_RHO], v))
    if centered:
        if jit == 1:
            a = add(mul(c, g), mul(sc[S_RHO], a))
            second = sub(v, mul(a, a))
        else:
            a = fma(c, g, mul(sc[S_RHO], a))
            second = fma(-a, a, v)
    else:
        second = v
    if fl[F_EPS_IN_SQRT] != 0:
        s = rsqrt(add(second, eps))
    else:
        s = div(sc[S_ONE], add(sqrt(second), eps))
    if not has_mom:
        return optax_apply(p, mul(s, g), sc[S_NEG_LR], jit), v, b, a
    u = mul(sc[S_NEG_LR], mul(s, g))
    b = add(u, mul(sc[S_MU], b)) if jit == 1 else fma(sc[S_MU], b, u)
    return add(p, b), v, b, a


@register_jitable
def rms_v(p, g, v, sc, fl, tail):
    """Slots ``velocity``."""
    p, v, _, _ = rms_core(p, g, v, sc[S_ZERO], sc[S_ZERO], sc, fl)
    return p, v


@register_jitable
def rms_vb(p, g, v, b, sc, fl, tail):
    """Slots ``velocity, momentum``."""
    p, v, b, _ = rms_core(p, g, v, b, sc[S_ZERO], sc, fl)
    return p, v, b


@register_jitable
def rms_va(p, g, v, a, sc, fl, tail):
    """Slots ``velocity, average_gradient``."""
    p, v, _, a = rms_core(p, g, v, sc[S_ZERO], a, sc, fl)
    return p, v, a


@register_jitable
def rms_vba(p, g, v, b, a, sc, fl, tail):
    """Slots ``velocity, momentum, average_gradient``."""
    return rms_core(p, g, v, b, a, sc, fl)


RULES = {
    # PyTorch's plain for-loop RMSprop takes the root of the new v: MKL's (Root)
    (False, False): Rule("rmsprop", rms_v, ("velocity",),
                         root=Root(0, rms_v_finish, (_FORMS["torch"],))),
    (True, False): Rule("rmsprop_momentum", rms_vb, ("velocity", "momentum")),
    (False, True): Rule("rmsprop_centered", rms_va, ("velocity", "average_gradient")),
    (True, True): Rule("rmsprop_centered_momentum", rms_vba,
                       ("velocity", "momentum", "average_gradient")),
}


def rmsprop_call(dtype, conv, *, learning_rate, rho, momentum, epsilon, centered,
                 has_buffer, update_buffer=None, eps_in_sqrt=True):
    """The :class:`~refopt.rules.RuleCall` of one RMSprop step for ``dtype`` under ``conv``.

    ``has_buffer``: the optimizer keeps a ``momentum`` slot (momentum > 0, or TF1);
    ``update_buffer``: the step updates it (default ``has_buffer``).
    """
    if update_buffer is None:
        update_buffer = has_buffer
    from refopt.reference._common import lr_cast, scalar, tf_cast

    dtype = np.dtype(dtype)
    form_name = conv.rmsprop_form
    sc = [0] * 9
    sc[S_ONE] = 1
    with np.errstate(all="ignore"):
        if form_name in ("tf_keras", "keras3"):
            form = _FORMS[form_name]
            sc[S_LR] = lr_cast(dtype, learning_rate)
            sc[S_RHO] = scalar(dtype, rho)
            sc[S_C] = scalar(dtype, 1 - rho)
            sc[S_EPS] = scalar(dtype, epsilon)
            sc[S_MU] = scalar(dtype, momentum)
        elif form_name == "keras2":
            sc[S_LR] = lr_cast(dtype, learning_rate)
            sc[S_RHO] = lr_cast(dtype, rho)
            sc[S_MU] = lr_cast(dtype, momentum)
            sc[S_EPS] = scalar(dtype, epsilon)
            sc[S_C] = scalar(dtype, 1) - sc[S_RHO]
            form = _FORMS["kernel"] if momentum > 0 else _FORMS["keras2"]
        elif form_name == "tf1":
            form = _FORMS["kernel"]
            sc[S_LR] = tf_cast(dtype, learning_rate)
            sc[S_RHO] = tf_cast(dtype, rho)
            sc[S_MU] = tf_cast(dtype, momentum)
            sc[S_EPS] = tf_cast(dtype, epsilon)
            sc[S_C] = scalar(dtype, 1) - sc[S_RHO]
        else:
            form = _FORMS[form_name]
            sc[S_RHO] = scalar(dtype, rho)
            sc[S_C] = scalar(dtype, 1 - rho)
            sc[S_EPS] = scalar(dtype, epsilon)
            sc[S_MU] = scalar(dtype, momentum)
            sc[S_NEG_LR] = scalar(dtype, -float(learning_rate))
            sc[S_C1M] = sc[S_C] - scalar(dtype, 1)
    fl = [form, centered, update_buffer, eps_in_sqrt, abs(float(sc[S_C])) < 0.5,
          OPTAX_JIT[conv.optax_jit] if form == _FORMS["optax"] else 0]
    return RuleCall(RULES[(bool(has_buffer), bool(centered))], scalars(dtype, sc), flags(fl))


def pure_update(apply, param, grad, velocity, momentum_buf, average_gradient, *,
                learning_rate, rho, momentum, epsilon, centered, convention, eps_in_sqrt):
    """:func:`refopt.reference.rmsprop_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step; returns an ``RMSpropResult``."""
    from refopt.reference import rmsprop as ref
    from refopt.reference.sqrt import needs_reference

    if needs_reference(convention):  # MKL's root (the `sqrt` knob): not in the rule
        return ref.rmsprop_update(param, grad, velocity, momentum_buf, average_gradient,
            learning_rate=learning_rate, rho=rho, momentum=momentum, epsilon=epsilon,
            centered=centered, convention=convention, eps_in_sqrt=eps_in_sqrt)

    param, grad, velocity, momentum_buf, average_gradient, form = ref.check_rmsprop_args(
        param, grad, velocity, momentum_buf, average_gradient, learning_rate=learning_rate,
        rho=rho, momentum=momentum, epsilon=epsilon, centered=centered, convention=convention,
        eps_in_sqrt=eps_in_sqrt)
    has_buffer = momentum_buf is not None
    updates = has_buffer and (momentum > 0 or form in ("tf1", "optax"))
    call = rmsprop_call(param.dtype, ref._convention(convention), learning_rate=learning_rate,
                        rho=rho, momentum=momentum, epsilon=epsilon, centered=centered,
                        has_buffer=has_buffer, update_buffer=updates,
                        eps_in_sqrt=eps_in_sqrt is not False)
    slots = [velocity] + ([momentum_buf] if has_buffer else []) + (
        [average_gradient] if centered else [])
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, slots)
    v = out.pop(0)
    b = out.pop(0) if has_buffer else None
    a = out.pop(0) if centered else None
    return ref.RMSpropResult(p, v, b, a)
