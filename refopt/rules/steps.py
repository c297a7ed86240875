"""The pipeline's own element steps, around every rule: clip, weight decay, EMA.

Written once with :mod:`refopt.rules.ops`, used by every driver. The host decides the modes
and rounds the scalars (:mod:`refopt.pipeline`); these functions only apply them.

Clip modes (per tensor: ``c`` the clip value or norm, ``d`` a per-tensor denominator, ``s`` a
per-tensor scale):

=====  =============================================================================
0      none
1      ``maximum(minimum(g, c), -c)`` (``clipvalue``)
2      ``(g c) / d`` (TF's ``clip_by_norm``: ``d = max(norm, c)``)
3      ``g s`` (TF's global norm scale; PyTorch's clamped coefficient)
4      ``(g / d) c`` (optax: ``d`` the norm, for tensors with ``norm >= c``)
5      ``(g d) c`` (optax eager, ``Convention.optax_jit="eager"``: ``d = 1/norm``, XLA's
       reciprocal for a division by a broadcast scalar)
=====  =============================================================================

Decay modes (``lr`` and ``wd`` in the dtype; ``f`` PyTorch's factor ``dtype(1 - lr wd)``):
0 none; 1 Keras' ``p - (p wd) lr``; 2 PyTorch ``AdamW``'s ``p f``; 3 PyTorch's L2 term
``g = fma(p, wd, g)`` (the gradient, not the parameter).

EMA modes: 0 none; 1 ``mu a + omu p`` (tf-keras, Keras 3 with ``mu = 0`` on its first
step); 2 copy (``AveragedModel``'s first update); 3 ``fma(w, p - a, a)`` and 4
``fma(w - 1, p - a, p)`` (PyTorch's ``lerp`` with ``|w| < 0.5`` and ``>= 0.5``).

Each step is also a rule without slots (:data:`CLIP`, :data:`DECAY`, :data:`EMA`: its mode
in ``fl[0]``, its scalars in ``sc`` laid out as ``psc``), so that the drivers run a step
alone: the pure functions :func:`refopt.kernels.cpu.clip_by_value`,
:func:`~refopt.kernels.cpu.apply_weight_decay`, :func:`~refopt.kernels.cpu.ema_update`
(and their CUDA mirrors) are these rules on the drivers' one-tensor entry points.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, fma, maximum, minimum, mul, sub

# The pipeline's scalar array ``psc`` (variable dtype) and flag array ``pfl`` (int64).
P_LR, P_WD, P_CLIP, P_MU, P_OMU, P_W, P_W1 = range(7)
N_PSC = 8
PF_DECAY, PF_EMA, PF_OVERWRITE = range(3)
N_PFL = 3


@register_jitable
def clip(g, mode, c, d, s):
    """The clipped gradient element."""
    if mode == 1:
        return maximum(minimum(g, c), -c)
    if mode == 2:
        return div(mul(g, c), d)
    if mode == 3:
        return mul(g, s)
    if mode == 4:
        return mul(div(g, d), c)
    if mode == 5:
        return mul(mul(g, d), c)
    return g


@register_jitable
def decay(p, g, mode, psc):
    """``(p, g)`` after the weight decay of ``mode``."""
    if mode == 1:
        return sub(p, mul(mul(p, psc[P_WD]), psc[P_LR])), g
    if mode == 2:
        return mul(p, psc[P_WD]), g
    if mode == 3:
        return p, fma(p, psc[P_WD], g)
    return p, g


@register_jitable
def ema(a, p, mode, psc):
    """The new average of one element."""
    if mode == 1:
        return add(mul(psc[P_MU], a), mul(psc[P_OMU], p))
    if mode == 2:
        return p
    if mode == 3:
        return fma(psc[P_W], sub(p, a), a)
    return fma(psc[P_W1], sub(p, a), p)


# ----------------------------------------------------------------------------- step rules
#: Where the clip rule finds the per-tensor denominator and scale in ``sc`` (after ``psc``).
S_CLIP_D, S_CLIP_S = N_PSC, N_PSC + 1


@register_jitable
def clip_element(p, g, sc, fl, tail):
    """:func:`clip` as a rule: the parameter becomes the clipped gradient (mode ``fl[0]``;
    mode 0 copies it)."""
    return (clip(g, fl[0], sc[P_CLIP], sc[S_CLIP_D], sc[S_CLIP_S]),)


@register_jitable
def decay_element(p, g, sc, fl, tail):
    """:func:`decay` of the parameter as a rule (mode ``fl[0]``)."""
    return (decay(p, g, fl[0], sc)[0],)


@register_jitable
def ema_element(p, g, sc, fl, tail):
    """:func:`ema` as a rule: the parameter is the average, the gradient the weights it
    follows (mode ``fl[0]``)."""
    return (ema(p, g, fl[0], sc),)


CLIP = Rule("clip", clip_element, ())
DECAY = Rule("decay", decay_element, ())
EMA = Rule("ema", ema_element, ())


def step_call(rule, dtype, mode, **values):
    """The :class:`~refopt.rules.RuleCall` of a step rule: its ``mode`` and its scalars by
    name (``lr``, ``wd``, ``clip``, ``mu``, ``omu``, ``w``, ``w1`` as ``P_*``; ``d``, ``s``
    the clip rule's denominator and scale, default 1), already rounded to ``dtype``."""
    dtype = np.dtype(dtype)
    names = dict(lr=P_LR, wd=P_WD, clip=P_CLIP, mu=P_MU, omu=P_OMU, w=P_W, w1=P_W1,
                 d=S_CLIP_D, s=S_CLIP_S)
    sc = [0] * (N_PSC + 2)
    sc[S_CLIP_D] = sc[S_CLIP_S] = 1
    for name, value in values.items():
        sc[names[name]] = value
    return RuleCall(rule, scalars(dtype, sc), flags([mode]))


def pure_weight_decay(apply, param, *, learning_rate, weight_decay):
    """:func:`refopt.reference.apply_weight_decay` (Keras' decoupled decay, mode 1) by the
    :data:`DECAY` rule with a backend's ``apply(call, param, grad, slots)``: the reference's
    checks and rounding, then one step; a new array."""
    from refopt.reference._common import as_float_array, check_scalar, lr_cast, tf_cast

    param = as_float_array("param", param)
    check_scalar("learning_rate", learning_rate)
    check_scalar("weight_decay", weight_decay)
    dtype = param.dtype
    call = step_call(DECAY, dtype, 1, wd=tf_cast(dtype, weight_decay),
                     lr=lr_cast(dtype, learning_rate))
    with np.errstate(all="ignore"):
        return apply(call, param, param, [])[0]


def pure_ema(apply, average, param, *, ema_momentum):
    """:func:`refopt.reference.ema_update` (mode 1) by the :data:`EMA` rule with a backend's
    ``apply``: the reference's checks and rounding, then one step; the new average."""
    from refopt.reference._common import as_float_array, check_like, check_scalar, scalar

    average = as_float_array("average", average)
    param = check_like(average, "param", param)
    check_scalar("ema_momentum", ema_momentum)
    dtype = average.dtype
    call = step_call(EMA, dtype, 1, mu=scalar(dtype, ema_momentum),
                     omu=scalar(dtype, 1 - ema_momentum))
    with np.errstate(all="ignore"):
        return apply(call, average, param, [])[0]


def clip_values(apply, values, mode, c=0, d=1, s=1):
    """The clipped values (mode 1 by value ``c``, 2 by norm ``(g c) / d``, 3 times ``s``;
    :func:`clip`) by the :data:`CLIP` rule with a backend's ``apply``; a new array. The
    scalars are already rounded to the values' dtype."""
    call = step_call(CLIP, values.dtype, mode, clip=c, d=d, s=s)
    with np.errstate(all="ignore"):
        return apply(call, values, values, [])[0]
