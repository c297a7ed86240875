"""Nadam's rule under every framework form (``Convention.nadam_form``).

Two slots, ``m`` and ``v``; one element function, :func:`nadam_element`, branching on
``F_FORM`` (a compile-time constant of the fused kernels):

0. tf_keras and Keras 3: ``m + (g - m) c1``, ``v + (g g - v) c2``,
   ``m_hat = (mu' m) / (1 - P') + ((1 - mu) g) / (1 - P)``,
   ``w - (m_hat lr) / (sqrt(v / (1 - b2^t)) + eps)``;
1. Keras 2 (legacy): ``g' = g / (1 - S)``, ``b1 m + c1 g``, ``b2 v + c2 (g g)``,
   ``m_bar = (1 - mu) g' + mu' (m / (1 - S'))``, ``w - (lr m_bar) / (sqrt(v / (1 - b2^t)) +
   eps)``;
2. PyTorch's for-loop: ``lerp`` (one FMA, the branch on the weight a flag),
   ``fma(c2 g, g, v b2)``, ``d = sqrt(v / bc2) + eps``, ``w + (c_g g) / d``, then
   ``+ (c_m m) / d``;
3. optax under ``jit``: ``fma(c1, g, b1 m)``, ``fma(c2, g g, b2 v)``,
   ``m_hat = fma(m / B1', b1, (g / B1) c1)``, ``w + (m_hat / (sqrt(v / B2) + eps)) (-lr)``.

The momentum schedule (``mu``, ``mu'``) and its running product (``P``, ``P'``; Keras 2's
``S``, ``S'``) are host scalars, rounded as each framework rounds them by the reference's own
:func:`refopt.reference.nadam.nadam_schedule`. The formulas are those of
:func:`refopt.reference.nadam_update` (its Notes, one framework at a time).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, div, fma, mul, sqrt, sub

F_FORM, F_LERP_HIGH, F_OPTAX_WD, F_OPTAX_JIT = 0, 1, 2, 3
(S_LR, S_EPS, S_C1, S_C2, S_B1, S_B2, S_OMU, S_MU1, S_OMP, S_OMP1, S_DEN2, S_CG, S_CM,
 S_W1, S_EPS_ROOT, S_WD) = range(16)
# optax reuses: S_LR = -lr, S_DEN2 = B2 (1 - b2^t), S_CG = B1 (1 - b1^t), S_CM = B1' (t + 1)

#: The element's forms, by name.
FORMS = {"keras": 0, "keras2": 1, "torch": 2, "optax": 3}


@register_jitable
def nadam_element(p, g, m, v, sc, fl, tail):
    """One Nadam element: returns ``(p, m, v)``."""
    form = fl[F_FORM]
    if form == 0:
        m = add(m, mul(sub(g, m), sc[S_C1]))
        v = add(v, mul(sub(mul(g, g), v), sc[S_C2]))
        m_hat = add(div(mul(sc[S_MU1], m), sc[S_OMP1]), div(mul(sc[S_OMU], g), sc[S_OMP]))
        den = add(sqrt(div(v, sc[S_DEN2])), sc[S_EPS])
        return sub(p, div(mul(m_hat, sc[S_LR]), den)), m, v
    if form == 1:
        g_prime = div(g, sc[S_OMP])
        m = add(mul(sc[S_B1], m), mul(sc[S_C1], g))
        v = add(mul(sc[S_B2], v), mul(sc[S_C2], mul(g, g)))
        m_bar = add(mul(sc[S_OMU], g_prime), mul(sc[S_MU1], div(m, sc[S_OMP1])))
        den = add(sqrt(div(v, sc[S_DEN2])), sc[S_EPS])
        return sub(p, div(mul(sc[S_LR], m_bar), den)), m, v
    if form == 2:
        d = sub(g, m)
        if fl[F_LERP_HIGH] == 0:
            m = fma(sc[S_C1], d, m)
        else:
            m = fma(sc[S_W1], d, g)
        v = fma(mul(sc[S_C2], g), g, mul(v, sc[S_B2]))
        den = add(sqrt(div(v, sc[S_DEN2])), sc[S_EPS])
        p = add(p, div(mul(sc[S_CG], g), den))
        return add(p, div(mul(sc[S_CM], m), den)), m, v
    if fl[F_OPTAX_JIT] == 1:  # optax eager: each operation rounded, no FMA
        m = add(mul(sc[S_C1], g), mul(sc[S_B1], m))
        v = add(mul(sc[S_C2], mul(g, g)), mul(sc[S_B2], v))
        m_hat = add(mul(sc[S_B1], div(m, sc[S_CM])), mul(sc[S_C1], div(g, sc[S_CG])))
        u = div(m_hat, add(sqrt(add(div(v, sc[S_DEN2]), sc[S_EPS_ROOT])), sc[S_EPS]))
        if fl[F_OPTAX_WD] != 0:
            u = add(u, mul(sc[S_WD], p))
        return add(p, mul(sc[S_LR], u)), m, v
    m = fma(sc[S_C1], g, mul(sc[S_B1], m))
    v = fma(sc[S_C2], mul(g, g), mul(sc[S_B2], v))
    m_hat = fma(div(m, sc[S_CM]), sc[S_B1], mul(div(g, sc[S_CG]), sc[S_C1]))
    # optax's eps_root inside the root (0 unless set: +0 changes no bit of v / B2 >= +0)
    u = div(m_hat, add(sqrt(add(div(v, sc[S_DEN2]), sc[S_EPS_ROOT])), sc[S_EPS]))
    if fl[F_OPTAX_WD] != 0:  # optax.adamw(nesterov=True): add_decayed_weights, one FMA
        u = fma(p, sc[S_WD], u)
    return optax_apply(p, u, sc[S_LR], fl[F_OPTAX_JIT]), m, v


NADAM = Rule("nadam", nadam_element, ("m", "v"))


def nadam_call(dtype, conv, *, learning_rate, beta_1, beta_2, epsilon, step,
               momentum_decay=None, product_dtype=None, eps_root=None,
               optax_weight_decay=None):
    """The :class:`~refopt.rules.RuleCall` of one dense Nadam step for ``dtype`` under
    ``conv`` (``product_dtype``: the Keras forms' shared product's dtype, default ``dtype``)."""
    from refopt import _libm
    from refopt.reference._common import lr_cast, scalar, tf_cast
    from refopt.reference.nadam import nadam_schedule

    dtype = np.dtype(dtype)
    form_name = conv.nadam_form
    sc = [0] * 16
    high = 0
    with np.errstate(all="ignore"):
        one = scalar(dtype, 1)
        if form_name == "optax":
            form = FORMS["optax"]
            work = np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)

            def bc(b, k):
                return one - scalar(dtype, _libm.power(work, work.type(b), work.type(k)))

            sc[S_LR] = scalar(dtype, -float(learning_rate))
            sc[S_EPS] = scalar(dtype, epsilon)
            sc[S_C1], sc[S_C2] = scalar(dtype, 1 - beta_1), scalar(dtype, 1 - beta_2)
            sc[S_B1], sc[S_B2] = scalar(dtype, beta_1), scalar(dtype, beta_2)
            sc[S_DEN2], sc[S_CG], sc[S_CM] = bc(beta_2, step), bc(beta_1, step), bc(beta_1,
                                                                                    step + 1)
            if eps_root:
                sc[S_EPS_ROOT] = scalar(dtype, eps_root)
            if optax_weight_decay is not None:
                sc[S_WD] = scalar(dtype, optax_weight_decay)
        else:
            sch = nadam_schedule(step, beta_1=beta_1, convention=conv, dtype=dtype,
                                 product_dtype=product_dtype, momentum_decay=momentum_decay)
            sc[S_EPS] = scalar(dtype, epsilon)
            if form_name == "torch":
                form = FORMS["torch"]
                lr = float(learning_rate)
                w = scalar(dtype, 1.0 - float(beta_1))
                high = 0 if abs(float(w)) < 0.5 else 1
                sc[S_C1], sc[S_W1] = w, w - one
                sc[S_C2], sc[S_B2] = scalar(dtype, 1.0 - float(beta_2)), scalar(dtype, beta_2)
                sc[S_DEN2] = scalar(dtype, 1.0 - float(beta_2) ** step)
                sc[S_CG] = scalar(dtype, -lr * (1.0 - sch.mu) / (1.0 - sch.product))
                sc[S_CM] = scalar(dtype, (-lr * sch.mu_next) / (1.0 - sch.product_next))
            else:
                form = FORMS["keras2" if form_name == "keras2" else "keras"]
                b1, b2 = tf_cast(dtype, beta_1), tf_cast(dtype, beta_2)
                sc[S_LR] = lr_cast(dtype, learning_rate)
                sc[S_B1], sc[S_B2] = b1, b2
                sc[S_C1], sc[S_C2] = one - b1, one - b2
                sc[S_OMU], sc[S_MU1] = one - sch.mu, sch.mu_next
                sc[S_OMP], sc[S_OMP1] = one - sch.product, one - sch.product_next
                sc[S_DEN2] = one - _libm.power(dtype, b2, scalar(dtype, step))
    wd = int(form == FORMS["optax"] and optax_weight_decay is not None)
    jit = OPTAX_JIT[conv.optax_jit] if form == FORMS["optax"] else 0
    return RuleCall(NADAM, scalars(dtype, sc), flags([form, high, wd, jit]))


def pure_update(apply, param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention, momentum_decay, product_dtype, eps_root=None):
    """:func:`refopt.reference.nadam_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step; an IndexedSlices gradient is
    computed by the reference (Keras 3's, densified without the ``keras3_sparse_square``
    knob, by the rule); returns a ``NadamResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import nadam as ref
    from refopt.reference.sqrt import needs_reference

    if needs_reference(convention):  # MKL's root (the `sqrt` knob): not in the rule
        return ref.nadam_update(param, grad, m, v, learning_rate=learning_rate,
            beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step,
            convention=convention, momentum_decay=momentum_decay,
            product_dtype=product_dtype, eps_root=eps_root)

    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step, momentum_decay=momentum_decay)
    param, grad, m, v, form = ref.check_nadam_args(param, grad, m, v, convention=convention,
                                                   eps_root=eps_root, **kw)
    conv = ref._convention(convention)
    if isinstance(grad, IndexedSlices):
        if form != "keras3" or conv.keras3_sparse_square:
            return ref.nadam_update(param, grad, m, v, convention=conv,
                                    product_dtype=product_dtype, eps_root=eps_root, **kw)
        grad = grad.deduplicate().to_dense()
    call = nadam_call(param.dtype, conv, product_dtype=product_dtype, eps_root=eps_root, **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [m, v])
    return ref.NadamResult(p, out[0], out[1])
