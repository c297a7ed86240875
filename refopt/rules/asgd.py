"""ASGD's rule (PyTorch's ``_single_tensor_asgd``; ``Convention.asgd_form == "torch"``).

One slot, ``ax`` (the average of the variables); one element function,
:func:`asgd_element`: ``w = fma(-eta, g, w * (1 - lambd*eta))`` (torch's ``mul_`` by a Python
float, then ``add_(alpha=-eta)``, one FMA in its vectorised loop and in its scalar tail), then
``ax + (w - ax) * mu`` or, while ``mu == 1``, a copy of ``w`` (``F_AVERAGE``).

The host computes ``eta`` and ``mu`` as torch does, in Python floats rounded to float32
(:func:`refopt.reference.asgd.asgd_scalars`), and ``1 - lambd*eta`` in Python floats rounded
once to the dtype (:func:`asgd_call`). The formulas are those of
:func:`refopt.reference.asgd_update`.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, fma, mul, sub

F_AVERAGE = 0
S_DECAY, S_NEG_ETA, S_MU = range(3)


@register_jitable
def asgd_element(p, g, ax, sc, fl, tail):
    """One ASGD element: returns ``(p, ax)``."""
    p = fma(sc[S_NEG_ETA], g, mul(p, sc[S_DECAY]))
    if fl[F_AVERAGE] != 0:
        ax = add(ax, mul(sub(p, ax), sc[S_MU]))
    else:
        ax = p
    return p, ax


ASGD = Rule("asgd", asgd_element, ("ax",))


def asgd_call(dtype, *, lambd, eta, mu):
    """The :class:`~refopt.rules.RuleCall` of one ASGD step for ``dtype`` with torch's
    scalars ``eta`` and ``mu`` of this step (Python floats holding float32 values)."""
    from refopt.reference._common import scalar

    dtype = np.dtype(dtype)
    eta, mu = float(eta), float(mu)
    with np.errstate(all="ignore"):
        sc = [scalar(dtype, 1 - float(lambd) * eta), scalar(dtype, -eta), scalar(dtype, mu)]
    return RuleCall(ASGD, scalars(dtype, sc), flags([mu != 1]))


def pure_update(apply, param, grad, ax, *, learning_rate, lambd, alpha, t0, step, eta=None,
                mu=None, convention=None):
    """:func:`refopt.reference.asgd_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step; returns an ``ASGDResult``."""
    from refopt.reference import asgd as ref

    param, grad, ax, _ = ref.check_asgd_args(
        param, grad, ax, learning_rate=learning_rate, lambd=lambd, alpha=alpha, t0=t0,
        step=step, eta=eta, mu=mu, convention=convention)
    eta0, mu0 = ref.asgd_scalars(learning_rate, lambd, alpha, t0, step)
    eta = eta0 if eta is None else float(eta)
    mu = mu0 if mu is None else float(mu)
    call = asgd_call(param.dtype, lambd=lambd, eta=eta, mu=mu)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [ax])
    return ref.ASGDResult(p, out[0], ref._next_eta(learning_rate, lambd, alpha, step),
                          ref._next_mu(t0, step))
