"""Lion's rule under every framework form (``Convention.lion_form``).

One slot, ``m``; one element function, :func:`lion_element`, branching on ``F_FORM`` (a
compile-time constant of the fused kernels):

0. Keras 3 and tf_keras (dense): ``u = sign(m*b1 + g*c1)`` with TensorFlow's sign (``+0`` for
   a zero), ``p - lr*u``, ``m*b2 + g*c2``; ``b`` cast through float32 and ``c = 1 - b``
   rounded in the dtype on the host.
1. optax under ``jit``: ``u = sign(fma(c1, g, b1*m))`` with XLA's sign (a zero or NaN kept as
   it is), ``m = fma(c2, g, b2*m)``, with ``F_WD`` the decay ``u = fma(wd, p, u)``, then
   ``p + (-lr)*u``.

The formulas are those of :func:`refopt.reference.lion_update` (its Notes); the host rounds
the scalars as each framework does (:func:`lion_call`). tf_keras' sparse branch (``m`` as a
buffer, every row moving, a division by ``beta_1``) is not a rule: it runs in the reference
(:func:`pure_update`, and the optimizer's host path).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, fma, mul, sub

F_FORM, F_WD, F_OPTAX_JIT = 0, 1, 2
S_LR, S_B1, S_C1, S_B2, S_C2, S_NEG_LR, S_WD, S_ONE, S_MONE, S_ZERO = range(10)

#: The element's forms, by name.
FORMS = {"keras": 0, "optax": 1}


@register_jitable
def lion_element(p, g, m, sc, fl, tail):
    """One Lion element: returns ``(p, m)``."""
    if fl[F_FORM] == 0:
        x = add(mul(m, sc[S_B1]), mul(g, sc[S_C1]))
        if x > 0:
            u = sc[S_ONE]
        elif x < 0:
            u = sc[S_MONE]
        elif x == 0:
            u = sc[S_ZERO]  # TensorFlow's sign of -0.0 is +0.0
        else:
            u = x  # NaN
        return sub(p, mul(sc[S_LR], u)), add(mul(m, sc[S_B2]), mul(g, sc[S_C2]))
    eager = fl[F_OPTAX_JIT] == 1  # optax eager: each operation rounded, no FMA
    x = add(mul(sc[S_C1], g), mul(sc[S_B1], m)) if eager else fma(sc[S_C1], g, mul(sc[S_B1], m))
    if x > 0:
        u = sc[S_ONE]
    elif x < 0:
        u = sc[S_MONE]
    else:
        u = x  # XLA's sign keeps a zero's sign and a NaN
    if eager:
        m = add(mul(sc[S_C2], g), mul(sc[S_B2], m))
        if fl[F_WD] != 0:
            u = add(u, mul(sc[S_WD], p))
        return add(p, mul(sc[S_NEG_LR], u)), m
    m = fma(sc[S_C2], g, mul(sc[S_B2], m))
    if fl[F_WD] != 0:
        u = fma(sc[S_WD], p, u)
    return optax_apply(p, u, sc[S_NEG_LR], fl[F_OPTAX_JIT]), m


LION = Rule("lion", lion_element, ("m",))


def lion_call(dtype, conv, *, learning_rate, beta_1, beta_2, optax_weight_decay=None):
    """The :class:`~refopt.rules.RuleCall` of one dense Lion step for ``dtype`` under
    ``conv`` (``optax_weight_decay``: optax's decay inside the update; None or 0: none)."""
    from refopt.reference._common import lr_cast, scalar, tf_cast
    from refopt.reference.lion import _convention, _form

    dtype = np.dtype(dtype)
    form_name = _form(_convention(conv))
    sc = [0] * 10
    sc[S_ONE], sc[S_MONE], sc[S_ZERO] = 1, -1, 0
    wd = 0
    with np.errstate(all="ignore"):
        if form_name in ("tf_keras", "keras3"):
            form = FORMS["keras"]
            one = scalar(dtype, 1)
            b1, b2 = tf_cast(dtype, beta_1), tf_cast(dtype, beta_2)
            sc[S_LR] = lr_cast(dtype, learning_rate)
            sc[S_B1], sc[S_C1] = b1, one - b1
            sc[S_B2], sc[S_C2] = b2, one - b2
        else:
            form = FORMS["optax"]
            sc[S_B1], sc[S_C1] = scalar(dtype, beta_1), scalar(dtype, 1 - beta_1)
            sc[S_B2], sc[S_C2] = scalar(dtype, beta_2), scalar(dtype, 1 - beta_2)
            sc[S_NEG_LR] = scalar(dtype, -float(learning_rate))
            if optax_weight_decay is not None and optax_weight_decay != 0:
                wd = 1
                sc[S_WD] = scalar(dtype, optax_weight_decay)
    jit = OPTAX_JIT[_convention(conv).optax_jit] if form == FORMS["optax"] else 0
    return RuleCall(LION, scalars(dtype, sc), flags([form, wd, jit]))


def pure_update(apply, param, grad, m, *, learning_rate, beta_1, beta_2, convention,
                weight_decay=None):
    """:func:`refopt.reference.lion_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (tf_keras' sparse branch: the
    reference; Keras 3's: the dense step on the summed gradient); returns a
    ``LionResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import lion as ref

    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2)
    param, grad, m, form = ref.check_lion_args(param, grad, m, convention=convention,
                                               weight_decay=weight_decay, **kw)
    conv = ref._convention(convention)
    if isinstance(grad, IndexedSlices):
        if form == "tf_keras" or conv.keras3_sparse_square:
            return ref.lion_update(param, grad, m, convention=conv, weight_decay=weight_decay,
                                   **kw)
        grad = grad.deduplicate().to_dense()
    call = lion_call(param.dtype, conv, optax_weight_decay=weight_decay, **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [m])
    return ref.LionResult(p, out[0])
