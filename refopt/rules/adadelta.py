"""Adadelta's rule under every framework form (``Convention.adadelta_form``).

Two slots, ``accumulated_grad`` (:math:`E_g`) and ``accumulated_delta`` (:math:`E_x`); one
element function, :func:`adadelta_element`, branching on ``F_FORM`` (a compile-time
constant of the fused kernels):

0. tf_keras: ``rho*Eg + ((1-rho)*g)*g``, ``d = (-rms(Ex)*g)/rms(Eg)``,
   ``rho*Ex + ((1-rho)*d)*d``, ``w + lr*d``;
1. Keras 3: the same with ``(1-rho)*(g*g)`` and ``(1-rho)*(d*d)``;
2. TensorFlow's ``ApplyAdadelta`` kernel (Keras 2, TF1, and their sparse kernel on the
   present rows): ``Eg*rho + (g*g)*c``, ``u = (sqrt(Ex + eps)*rsqrt(Eg + eps))*g``,
   ``w - u*lr``, ``Ex*rho + (u*u)*c``;
3. PyTorch's for-loop: ``fma((1-rho)*g, g, Eg*rho)``, ``d = (rms(Ex)/rms(Eg))*g``,
   ``fma((1-rho)*d, d, Ex*rho)``, ``fma(-lr, d, w)``;
4. optax under ``jit``: ``fma(1-rho, g*g, rho*Eg)``, ``u = (rms(Ex)*rsqrt(Eg + eps))*g``,
   ``fma(rho, Ex, (1-rho)*(u*u))``, ``w + (-lr)*u``.

The Keras forms negate ``d``; the rule keeps its magnitude ``q = (rms(Ex)*g)/rms(Eg)`` and
writes ``w - lr*q`` and ``((1-rho)*q)*q``, the same bits (IEEE's ``x - y`` is ``x + (-y)``,
negation is exact and rounding is symmetric), except the sign of a NaN.

The formulas are those of :func:`refopt.reference.adadelta_update` (its Notes, written there
one framework at a time); the host rounds the scalars as each framework does
(:func:`adadelta_call`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, div, fma, mul, rsqrt, sqrt, sub

F_FORM, F_OPTAX_JIT = 0, 1
S_LR, S_RHO, S_C, S_EPS, S_NEG_LR = range(5)

#: The element's forms, by name.
FORMS = {"tf_keras": 0, "keras3": 1, "tf": 2, "torch": 3, "optax": 4}


@register_jitable
def adadelta_element(p, g, eg, ex, sc, fl, tail):
    """One Adadelta element: returns ``(p, accumulated_grad, accumulated_delta)``."""
    form = fl[F_FORM]
    rho = sc[S_RHO]
    c = sc[S_C]
    eps = sc[S_EPS]
    if form == 0:
        eg = add(mul(rho, eg), mul(mul(c, g), g))
        q = div(mul(sqrt(add(ex, eps)), g), sqrt(add(eg, eps)))
        ex = add(mul(rho, ex), mul(mul(c, q), q))
        return sub(p, mul(sc[S_LR], q)), eg, ex
    if form == 1:
        eg = add(mul(rho, eg), mul(c, mul(g, g)))
        q = div(mul(sqrt(add(ex, eps)), g), sqrt(add(eg, eps)))
        ex = add(mul(rho, ex), mul(c, mul(q, q)))
        return sub(p, mul(sc[S_LR], q)), eg, ex
    if form == 2:
        eg = add(mul(eg, rho), mul(mul(g, g), c))
        u = mul(mul(sqrt(add(ex, eps)), rsqrt(add(eg, eps))), g)
        p = sub(p, mul(u, sc[S_LR]))
        ex = add(mul(ex, rho), mul(mul(u, u), c))
        return p, eg, ex
    if form == 3:
        eg = fma(mul(c, g), g, mul(eg, rho))
        d = mul(div(sqrt(add(ex, eps)), sqrt(add(eg, eps))), g)
        ex = fma(mul(c, d), d, mul(ex, rho))
        return fma(sc[S_NEG_LR], d, p), eg, ex
    if fl[F_OPTAX_JIT] == 1:  # optax eager: each operation rounded, a true division
        eg = add(mul(c, mul(g, g)), mul(rho, eg))
        u = mul(div(sqrt(add(ex, eps)), sqrt(add(eg, eps))), g)
        ex = add(mul(c, mul(u, u)), mul(rho, ex))
        return add(p, mul(sc[S_NEG_LR], u)), eg, ex
    eg = fma(c, mul(g, g), mul(rho, eg))
    u = mul(mul(sqrt(add(ex, eps)), rsqrt(add(eg, eps))), g)
    ex = fma(rho, ex, mul(c, mul(u, u)))
    return optax_apply(p, u, sc[S_NEG_LR], fl[F_OPTAX_JIT]), eg, ex


ADADELTA = Rule("adadelta", adadelta_element, ("accumulated_grad", "accumulated_delta"))


def adadelta_call(dtype, conv, *, learning_rate, rho, epsilon):
    """The :class:`~refopt.rules.RuleCall` of one Adadelta step for ``dtype`` under ``conv``
    (dense, or the lazy rows of Keras 2 and TF1, whose row kernel is the dense formula)."""
    from refopt.reference._common import lr_cast, scalar, tf_cast

    dtype = np.dtype(dtype)
    form_name = conv.adadelta_form
    sc = [0] * 5
    with np.errstate(all="ignore"):
        if form_name in ("keras2", "tf1"):
            form = FORMS["tf"]
            if form_name == "keras2":  # float32 hyperparameter variables; epsilon direct
                sc[S_LR], sc[S_RHO], sc[S_EPS] = (lr_cast(dtype, learning_rate),
                                                  lr_cast(dtype, rho), scalar(dtype, epsilon))
            else:  # every scalar a float32 tensor
                sc[S_LR], sc[S_RHO], sc[S_EPS] = (tf_cast(dtype, learning_rate),
                                                  tf_cast(dtype, rho), tf_cast(dtype, epsilon))
            sc[S_C] = dtype.type(1) - sc[S_RHO]  # the kernel's 1 - rho, in the dtype
        else:
            form = FORMS[form_name]
            sc[S_RHO], sc[S_C], sc[S_EPS] = (scalar(dtype, rho), scalar(dtype, 1 - rho),
                                             scalar(dtype, epsilon))
            if form_name in ("tf_keras", "keras3"):
                sc[S_LR] = lr_cast(dtype, learning_rate)
            else:
                sc[S_NEG_LR] = scalar(dtype, -float(learning_rate))
    jit = OPTAX_JIT[conv.optax_jit] if form == FORMS["optax"] else 0
    return RuleCall(ADADELTA, scalars(dtype, sc), flags([form, jit]))


def pure_update(apply, param, grad, accumulated_grad, accumulated_delta, *, learning_rate,
                rho, epsilon, convention):
    """:func:`refopt.reference.adadelta_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (a sparse gradient: Keras 2's
    and TF1's on its gathered rows, Keras 3's on the summed dense gradient, tf_keras' sparse
    branch by the reference); returns an ``AdadeltaResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import adadelta as ref
    from refopt.reference.sqrt import needs_reference

    if needs_reference(convention):  # MKL's root (the `sqrt` knob): not in the rule
        return ref.adadelta_update(param, grad, accumulated_grad, accumulated_delta,
            learning_rate=learning_rate, rho=rho, epsilon=epsilon, convention=convention)

    param, grad, accumulated_grad, accumulated_delta, form = ref.check_adadelta_args(
        param, grad, accumulated_grad, accumulated_delta, learning_rate=learning_rate,
        rho=rho, epsilon=epsilon, convention=convention)
    conv = ref._convention(convention)
    kw = dict(learning_rate=learning_rate, rho=rho, epsilon=epsilon)
    if isinstance(grad, IndexedSlices):
        if form == "tf_keras" or (form == "keras3" and conv.keras3_sparse_square):
            # a whole-table branch of its own, or Keras 3 per occurrence: the reference
            return ref.adadelta_update(param, grad, accumulated_grad, accumulated_delta,
                                       convention=conv, **kw)
        grad = grad.deduplicate()
        if form == "keras3":
            grad = grad.to_dense()
        else:
            rows = grad.indices
            w, eg, ex = param.copy(), accumulated_grad.copy(), accumulated_delta.copy()
            if rows.size:
                call = adadelta_call(param.dtype, conv, **kw)
                with np.errstate(all="ignore"):
                    p, out = apply(call, np.ascontiguousarray(param[rows]),
                                   np.ascontiguousarray(grad.values),
                                   [accumulated_grad[rows], accumulated_delta[rows]])
                w[rows], eg[rows], ex[rows] = p, out[0], out[1]
            return ref.AdadeltaResult(w, eg, ex)
    call = adadelta_call(param.dtype, conv, **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [accumulated_grad, accumulated_delta])
    return ref.AdadeltaResult(p, out[0], out[1])
