"""Adamax's rule under every framework form (``Convention.adamax_form``).

Two slots, ``m`` and ``u``; one element function, :func:`adamax_element`, branching on
``F_FORM`` (a compile-time constant of the fused kernels):

0. tf_keras and Keras 3 (dense): ``m + (g - m)*c1``, ``max(b2*u, |g|)``,
   ``w - (lr*m) / (bc1*(u + eps))``.
1. TensorFlow's ``ApplyAdaMax`` (Keras 2, dense): the same moments (the maximum Eigen's,
   :func:`_eigen_max`: a NaN gradient keeps ``b2*u``),
   ``w - scale*(m / (u + eps))`` with ``scale = lr/(1 - b1^t)`` rounded on the host.
2. Keras 2's sparse rows: ``m*b1 + g*c1``, ``max(u*b2, |g|)``,
   ``w + (-scale)*(m / (u + eps))``.
3. PyTorch's for-loop: ``lerp`` as one FMA (``fma(W, g - m, base)`` with ``W = c1`` and
   ``base = m`` for ``c1 < 0.5``, else ``W = c1 - 1`` and ``base = g``: flag ``F_LERP_HIGH``),
   ``max(u*b2, |g| + eps)``, ``w + (-clr*m) / u``.
4. optax under ``jit``: ``fma(c1, g, b1*m)``, ``max(|g| + eps, b2*u)``,
   ``w + (m / (bc1*u)) * (-lr)``.

``|g|`` is :func:`_abs` (``0 - g`` below zero, ``g + 0`` otherwise: exactly NumPy's
``abs`` on every number, ``-0.0`` included; a NaN keeps its sign bit).

The formulas are those of :func:`refopt.reference.adamax_update` (its Notes, written there
one framework at a time); the host rounds the scalars as each framework does
(:func:`adamax_call`, from :func:`refopt.reference.adamax.adamax_scalars`). tf_keras'
non-lazy sparse update and Keras 3's raw slices (``keras3_sparse_square``) have no rule:
they take the reference's path.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.adam import OPTAX_JIT, optax_apply
from refopt.rules.ops import add, div, fma, maximum, mul, sub

F_FORM, F_LERP_HIGH, F_OPTAX_JIT = 0, 1, 2
S_LR, S_C1, S_B1, S_B2, S_EPS, S_BC1, S_SCALE, S_ZERO = range(8)

#: The element's forms, by name.
FORMS = {"keras": 0, "keras2": 1, "keras2_rows": 2, "torch": 3, "optax": 4}


@register_jitable
def _abs(x, zero):
    """``|x|`` with one exact operation (``zero`` is ``+0.0`` in the dtype)."""
    if x < zero:
        return sub(zero, x)
    return add(x, zero)


@register_jitable
def _eigen_max(a, b):
    """Eigen's ``cwiseMax`` (``std::max``): ``b`` if ``a < b``, else ``a`` (so ``a`` where
    either is NaN). No arithmetic: a selection."""
    if a < b:
        return b
    return a


@register_jitable
def adamax_element(p, g, m, u, sc, fl, tail):
    """One Adamax element: returns ``(p, m, u)``."""
    form = fl[F_FORM]
    zero = sc[S_ZERO]
    if form == 0:
        m = add(m, mul(sub(g, m), sc[S_C1]))
        u = maximum(mul(sc[S_B2], u), _abs(g, zero))
        return sub(p, div(mul(sc[S_LR], m), mul(sc[S_BC1], add(u, sc[S_EPS])))), m, u
    if form == 1:
        m = add(m, mul(sub(g, m), sc[S_C1]))
        u = _eigen_max(mul(sc[S_B2], u), _abs(g, zero))
        return sub(p, mul(sc[S_SCALE], div(m, add(u, sc[S_EPS])))), m, u
    if form == 2:  # S_SCALE holds -lr/(1 - b1^t)
        m = add(mul(m, sc[S_B1]), mul(g, sc[S_C1]))
        u = maximum(mul(u, sc[S_B2]), _abs(g, zero))
        return add(p, mul(sc[S_SCALE], div(m, add(u, sc[S_EPS])))), m, u
    if form == 3:  # S_C1 holds lerp's coefficient, S_SCALE -lr/(1 - b1^t)
        if fl[F_LERP_HIGH] == 1:
            m = fma(sc[S_C1], sub(g, m), g)
        else:
            m = fma(sc[S_C1], sub(g, m), m)
        u = maximum(mul(u, sc[S_B2]), add(_abs(g, zero), sc[S_EPS]))
        return add(p, div(mul(sc[S_SCALE], m), u)), m, u
    # optax: S_SCALE holds -lr
    if fl[F_OPTAX_JIT] == 1:  # eager: each operation rounded
        m = add(mul(sc[S_C1], g), mul(sc[S_B1], m))
        u = maximum(add(_abs(g, zero), sc[S_EPS]), mul(sc[S_B2], u))
        return add(p, mul(sc[S_SCALE], div(div(m, sc[S_BC1]), u))), m, u
    m = fma(sc[S_C1], g, mul(sc[S_B1], m))
    u = maximum(add(_abs(g, zero), sc[S_EPS]), mul(sc[S_B2], u))
    return optax_apply(p, div(m, mul(sc[S_BC1], u)), sc[S_SCALE], fl[F_OPTAX_JIT]), m, u


ADAMAX = Rule("adamax", adamax_element, ("m", "u"))


def adamax_call(dtype, conv, *, learning_rate, beta_1, beta_2, epsilon, step=1,
                lazy_rows=False):
    """The :class:`~refopt.rules.RuleCall` of one Adamax step for ``dtype`` under ``conv``.

    ``lazy_rows``: the call updates the present rows of a sparse gradient (duplicates
    summed), Keras 2's row form (the only lazy one).
    """
    from refopt.reference.adamax import adamax_scalars

    dtype = np.dtype(dtype)
    form_name = conv.adamax_form
    s = adamax_scalars(dtype, conv, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step)
    sc = [0] * 8
    high = 0
    with np.errstate(all="ignore"):
        if form_name in ("tf_keras", "keras3"):
            form = FORMS["keras"]
            sc[S_LR], sc[S_C1], sc[S_B2], sc[S_EPS], sc[S_BC1] = (
                s["lr"], s["c1"], s["b2"], s["eps"], s["bc1"])
        elif form_name == "keras2":
            form = FORMS["keras2_rows"] if lazy_rows else FORMS["keras2"]
            sc[S_C1], sc[S_B1], sc[S_B2], sc[S_EPS] = s["c1"], s["b1"], s["b2"], s["eps"]
            sc[S_SCALE] = -s["scale"] if lazy_rows else s["scale"]
        elif form_name == "torch":
            form = FORMS["torch"]
            c1 = s["c1"]
            high = 0 if abs(float(c1)) < 0.5 else 1
            sc[S_C1] = c1 if not high else c1 - dtype.type(1)
            sc[S_B2], sc[S_EPS], sc[S_SCALE] = s["b2"], s["eps"], s["neg_clr"]
        else:
            form = FORMS["optax"]
            sc[S_C1], sc[S_B1], sc[S_B2], sc[S_EPS], sc[S_BC1], sc[S_SCALE] = (
                s["c1"], s["b1"], s["b2"], s["eps"], s["bc1"], s["neg_lr"])
    jit = OPTAX_JIT[conv.optax_jit] if form == FORMS["optax"] else 0
    return RuleCall(ADAMAX, scalars(dtype, sc), flags([form, high, jit]))


def pure_update(apply, param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention):
    """:func:`refopt.reference.adamax_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (Keras 2's sparse gradient: on
    its gathered rows, as the reference; tf_keras' non-lazy sparse update and Keras 3's raw
    slices: the reference itself); returns an ``AdamaxResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import adamax as ref

    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step)
    param, grad, m, u, form = ref.check_adamax_args(param, grad, m, u, convention=convention,
                                                    **kw)
    conv = ref._convention(convention)
    if isinstance(grad, IndexedSlices):
        if form == "tf_keras" or (form == "keras3" and conv.keras3_sparse_square):
            return ref.adamax_update(param, grad, m, u, convention=conv, **kw)
        grad = grad.deduplicate()
        if form == "keras3":
            grad = grad.to_dense()
        else:  # keras2: the present rows
            rows = grad.indices
            w, m2, u2 = param.copy(), m.copy(), u.copy()
            if rows.size:
                call = adamax_call(param.dtype, conv, lazy_rows=True, **kw)
                with np.errstate(all="ignore"):
                    p, out = apply(call, np.ascontiguousarray(param[rows]),
                                   np.ascontiguousarray(grad.values), [m[rows], u[rows]])
                w[rows], m2[rows], u2[rows] = p, out[0], out[1]
            return ref.AdamaxResult(w, m2, u2)
    call = adamax_call(param.dtype, conv, **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [m, u])
    return ref.AdamaxResult(p, out[0], out[1])
