"""SGD's rule under every convention: one slot ``m`` (the momentum buffer).

``F_FORM``: 0 Keras' velocity ``m = (-g) lr + m mu; p = p + m`` (Nesterov ``p + ((-g) lr +
m mu)`` with the new ``m``); 1 TF1's ``MomentumOptimizer`` ``a = a mu + g; p - a lr``
(Nesterov ``p - (g lr + a mu lr)``); 2 PyTorch's ``b = fma(1 - dampening, g, b mu)`` (no
momentum: ``b`` kept, the step is ``g``; ``1 - dampening`` is 1 on a variable's first step,
where torch's buffer starts as ``g``), ``p = fma(-lr, step, p)`` with the Nesterov step
``fma(mu, b, g)``; ``SGD(fused=True)`` (convention knob ``sgd_momentum="torch_fused"``) is
form 2 with ``b = fma(b, mu, g (1 - dampening))`` on its scalar tail (``tail``: the last
``numel % (32 / itemsize)`` elements of a float32/float64 tensor, :attr:`RuleCall.tail_lanes`);
3 optax's trace ``t = fma(mu, t, g)``, ``p + (-lr) step`` with the Nesterov step
``fma(mu, t, g)``. ``F_NESTEROV``, ``F_MOMENTUM`` (momentum != 0, PyTorch only).

:data:`SGD_TABLE` is tf-keras' sparse update of a whole table (the drivers' ``table``
kernels); :func:`pure_update` is :func:`refopt.reference.sgd_update` on a backend's drivers.
"""

from __future__ import annotations

import numpy as np

from refopt.rules import Rule, RuleCall, flags, scalars
from numba.extending import register_jitable

from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, fma, mul, sub

F_FORM, F_NESTEROV, F_MOMENTUM, F_OPTAX_JIT = range(4)
S_LR, S_MU, S_NEG_LR, S_UNDAMPED = range(4)


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
            if tail:  # SGD(fused=True)'s scalar tail: contracted the other way round
                m = fma(m, mu, mul(g, sc[S_UNDAMPED]))
            else:  # add_(g, alpha=1 - dampening): one FMA
                m = fma(sc[S_UNDAMPED], g, mul(m, mu))
            step = fma(mu, m, g) if nesterov else m
        return fma(sc[S_NEG_LR], step, p), m
    if fl[F_OPTAX_JIT] == 1:  # optax eager: g + mu*t, -lr*t, p + u, each rounded
        m = add(g, mul(mu, m))
        step = add(g, mul(mu, m)) if nesterov else m
        return add(p, mul(sc[S_NEG_LR], step)), m
    m = fma(mu, m, g)
    step = fma(mu, m, g) if nesterov else m
    return optax_apply(p, step, sc[S_NEG_LR], fl[F_OPTAX_JIT]), m


@register_jitable
def sgd_table_element(p, g, m, sc, fl, tail):
    """tf-keras' sparse SGD on one element of the whole table: slot ``m`` (``g`` None where
    the element's row has no gradient). ``m <- m mu``, ``m += (-g) lr`` where ``g`` is;
    then ``p + m``, or Nesterov ``p += (-g) lr`` where ``g`` is and ``p + m mu``."""
    nesterov = fl[F_NESTEROV] != 0
    mu = sc[S_MU]
    m = mul(m, mu)
    if g is not None:
        a = mul(-g, sc[S_LR])
        m = add(m, a)
        if nesterov:
            p = add(p, a)
    if nesterov:
        return add(p, mul(m, mu)), m
    return add(p, m), m


SGD = Rule("sgd", sgd_element, ("m",))
#: The whole-table sparse rule (the drivers' ``table`` kernel): tf-keras' ``IndexedSlices``
#: path of :func:`refopt.reference.sgd_update`.
SGD_TABLE = Rule("sgd_table", sgd_table_element, ("m",))

_FORMS = {"keras": 0, "tf1": 1, "torch": 2, "torch_fused": 2, "optax": 3}


def sgd_call(dtype, conv, *, learning_rate, momentum, nesterov, dampening=0.0, step=None):
    """The :class:`~refopt.rules.RuleCall` of one SGD step for ``dtype`` under ``conv``
    (``dampening``: PyTorch's, not applied at ``step`` 1)."""
    from refopt.reference._common import lr_cast, scalar, tf_cast

    dtype = np.dtype(dtype)
    form = _FORMS[conv.sgd_momentum]
    if form in (0, 1):
        lr, mu = lr_cast(dtype, learning_rate), tf_cast(dtype, momentum)
    else:
        lr, mu = scalar(dtype, learning_rate), scalar(dtype, momentum)
    neg_lr = scalar(dtype, -float(learning_rate))
    undamped = scalar(dtype, 1.0 if step == 1 else 1.0 - float(dampening))
    # the fused kernel's scalar tail (AVX2 lanes); on step 1 both forms give b = g
    lanes = (32 // dtype.itemsize if conv.sgd_momentum == "torch_fused" and momentum != 0
             and dtype.itemsize in (4, 8) else 0)
    return RuleCall(SGD, scalars(dtype, [lr, mu, neg_lr, undamped]),
                    flags([form, nesterov, momentum != 0,
                           OPTAX_JIT[conv.optax_jit] if form == 3 else 0]), lanes)


def tf_keras_call(dtype, *, learning_rate, momentum, nesterov, table=False):
    """The :class:`~refopt.rules.RuleCall` of :func:`refopt.reference.sgd_update` (tf-keras'
    SGD, Keras' velocity form; ``table``: the whole-table sparse rule)."""
    from refopt.reference._common import lr_cast, tf_cast

    dtype = np.dtype(dtype)
    sc = [lr_cast(dtype, learning_rate), tf_cast(dtype, momentum)]  # as the reference
    return RuleCall(SGD_TABLE if table else SGD, scalars(dtype, sc),
                    flags([_FORMS["keras"], nesterov]))


def pure_update(apply, apply_sparse, param, grad, m, *, learning_rate, momentum,
                nesterov=False):
    """:func:`refopt.reference.sgd_update` computed by these rules with a backend's
    one-tensor drivers (as :func:`refopt.rules.adam.pure_update`): the reference's own
    argument checks, then one step, dense or (``IndexedSlices``) of the whole table;
    returns an ``SGDResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference._common import (as_float_array, check_flag, check_grad, check_like,
                                          check_scalar)
    from refopt.reference.sgd import SGDResult

    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_scalar("learning_rate", learning_rate)
    check_scalar("momentum", momentum)
    nesterov = check_flag("nesterov", nesterov)
    sparse = isinstance(grad, IndexedSlices)
    call = tf_keras_call(param.dtype, learning_rate=learning_rate, momentum=momentum,
                         nesterov=nesterov, table=sparse)
    with np.errstate(all="ignore"):
        if sparse:
            p, (m,) = apply_sparse(call, param, grad, [m], False)
        else:
            p, (m,) = apply(call, param, grad, [m])
    return SGDResult(p, m)
