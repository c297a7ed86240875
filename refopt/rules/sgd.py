"""SGD's rule under every convention: one slot ``m`` (the momentum buffer).

``F_FORM``: 0 Keras' velocity ``m = (-g) lr + m mu; p = p + m`` (Nesterov ``p + ((-g) lr +
m mu)`` with the new ``m``); 1 TF1's ``MomentumOptimizer`` ``a = a mu + g; p - a lr``
(Nesterov ``p - (g lr + a mu lr)``); 2 PyTorch's ``b = b mu + g`` (no momentum: ``b`` kept,
the step is ``g``), ``p = fma(-lr, step, p)`` with the Nesterov step ``fma(mu, b, g)``;
3 optax's trace ``t = fma(mu, t, g)``, ``p + (-lr) step`` with the Nesterov step
``fma(mu, t, g)``. ``F_NESTEROV``, ``F_MOMENTUM`` (momentum != 0, PyTorch only).
"""

from __future__ import annotations

import numpy as np

from refopt.rules import Rule, RuleCall, flags, scalars
from numba.extending import register_jitable

from refopt.rules.ops import add, fma, mul, sub

F_FORM, F_NESTEROV, F_MOMENTUM = range(3)
S_LR, S_MU, S_NEG_LR = range(3)


@register_jitable
def sgd_element(p, g, m, sc, fl, tail):
    """SGD with (Nesterov) momentum on one element: slot ``m``."""
    form = fl[F_FORM]
    nesterov = fl[F_NESTEROV] != 0
    lr = sc[S_LR]
    mu = sc[S_MU]
    if form == 0:
        step = mul(-g, lr)
        m = add(step, mul(m, mu))
        if nesterov:
            return add(p, add(step, mul(m, mu))), m
        return add(p, m), m
    if form == 1:
        m = add(mul(m, mu), g)
        if nesterov:
            return sub(p, add(mul(g, lr), mul(mul(m, mu), lr))), m
        return sub(p, mul(m, lr)), m
    if form == 2:
        step = g
        if fl[F_MOMENTUM] != 0:
            m = add(mul(m, mu), g)
            step = fma(mu, m, g) if nesterov else m
        return fma(sc[S_NEG_LR], step, p), m
    m = fma(mu, m, g)
    step = fma(mu, m, g) if nesterov else m
    return add(p, mul(sc[S_NEG_LR], step)), m


SGD = Rule("sgd", sgd_element, ("m",))

_FORMS = {"keras": 0, "tf1": 1, "torch": 2, "optax": 3}


def sgd_call(dtype, conv, *, learning_rate, momentum, nesterov):
    """The :class:`~refopt.rules.RuleCall` of one SGD step for ``dtype`` under ``conv``."""
    from refopt.reference._common import lr_cast, scalar, tf_cast

    dtype = np.dtype(dtype)
    form = _FORMS[conv.sgd_momentum]
    if form in (0, 1):
        lr, mu = lr_cast(dtype, learning_rate), tf_cast(dtype, momentum)
    else:
        lr, mu = scalar(dtype, learning_rate), scalar(dtype, momentum)
    neg_lr = scalar(dtype, -float(learning_rate))
    return RuleCall(SGD, scalars(dtype, [lr, mu, neg_lr]),
                    flags([form, nesterov, momentum != 0]))
