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
=====  =============================================================================

Decay modes (``lr`` and ``wd`` in the dtype; ``f`` PyTorch's factor ``dtype(1 - lr wd)``):
0 none; 1 Keras' ``p - (p wd) lr``; 2 PyTorch ``AdamW``'s ``p f``; 3 PyTorch's L2 term
``g = fma(p, wd, g)`` (the gradient, not the parameter).

EMA modes: 0 none; 1 ``mu a + omu p`` (tf-keras, Keras 3 with ``mu = 0`` on its first
step); 2 copy (``AveragedModel``'s first update); 3 ``fma(w, p - a, a)`` and 4
``fma(w - 1, p - a, p)`` (PyTorch's ``lerp`` with ``|w| < 0.5`` and ``>= 0.5``).
"""

from __future__ import annotations

from numba.extending import register_jitable

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
