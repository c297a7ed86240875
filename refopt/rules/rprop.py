"""Rprop's rule (PyTorch's ``_single_tensor_rprop``; ``Convention.rprop_form == "torch"``).

Two slots, ``prev`` and ``step_size`` (torch's names); one element function,
:func:`rprop_element`: the factor ``sign(g*prev)`` replaced in torch's order (``> 0`` by
``etaplus``, then ``< 0`` by ``etaminus``, then ``== 0`` by 1), the step size multiplied and
clamped, the gradient zeroed where the factor equals ``etaminus``, then
``w + (-1 * sign(g)) * step_size`` (an exact product, so torch's ``addcmul_`` rounds once
whether or not it is contracted). ``sign`` is ``torch.sign``: +0 for NaN and for -0.0.

The formulas are those of :func:`refopt.reference.rprop_update`; the host rounds ``etas``
and ``step_sizes`` to the dtype as torch converts its Python floats (:func:`rprop_call`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, maximum, minimum, mul

S_ETAPLUS, S_ETAMINUS, S_LO, S_HI, S_ONE, S_MINUS_ONE, S_ZERO = range(7)


@register_jitable
def _torch_sign(x, sc):
    if x > 0:
        return sc[S_ONE]
    if x < 0:
        return sc[S_MINUS_ONE]
    return sc[S_ZERO]


@register_jitable
def rprop_element(p, g, prev, step_size, sc, fl, tail):
    """One Rprop element: returns ``(p, prev, step_size)``."""
    f = _torch_sign(mul(g, prev), sc)
    if f > 0:
        f = sc[S_ETAPLUS]
    if f < 0:
        f = sc[S_ETAMINUS]
    if f == 0:
        f = sc[S_ONE]
    step_size = minimum(maximum(mul(step_size, f), sc[S_LO]), sc[S_HI])
    if f == sc[S_ETAMINUS]:
        g = sc[S_ZERO]
    p = add(p, mul(mul(sc[S_MINUS_ONE], _torch_sign(g, sc)), step_size))
    return p, g, step_size


RPROP = Rule("rprop", rprop_element, ("prev", "step_size"))


def rprop_call(dtype, *, etas, step_sizes):
    """The :class:`~refopt.rules.RuleCall` of one Rprop step for ``dtype``."""
    from refopt.reference._common import scalar

    dtype = np.dtype(dtype)
    (em, ep), (lo, hi) = etas, step_sizes
    with np.errstate(all="ignore"):
        sc = [scalar(dtype, ep), scalar(dtype, em), scalar(dtype, lo), scalar(dtype, hi),
              1, -1, 0]
    return RuleCall(RPROP, scalars(dtype, sc), flags([0]))


def pure_update(apply, param, grad, prev, step_size, *, etas, step_sizes, convention=None):
    """:func:`refopt.reference.rprop_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step; returns an ``RpropResult``."""
    from refopt.reference import rprop as ref

    param, grad, prev, step_size, etas, step_sizes = ref.check_rprop_args(
        param, grad, prev, step_size, etas=etas, step_sizes=step_sizes, convention=convention)
    call = rprop_call(param.dtype, etas=etas, step_sizes=step_sizes)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [prev, step_size])
    return ref.RpropResult(p, out[0], out[1])
