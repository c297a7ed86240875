"""TF1's proximal rules: ProximalAdagrad and ProximalGradientDescent.

:data:`PROXIMAL_ADAGRAD` (slot ``accumulator``) and :data:`PROXIMAL_SGD` (no slot), each
branching on ``F_FORM`` (a compile-time constant of the fused kernels):

0. the dense kernels ``ApplyProximal*`` and the sparse kernels' rows of several elements
   (Eigen's chips): ``lr_t = lr * rsqrt(a)`` (Adagrad; ``lr`` for gradient descent),
   ``v = w - g*lr_t``; ProximalAdagrad in float64 takes form 2, the same with Eigen's
   double ``rsqrt``, ``1/sqrt(a)`` (two roundings);
1. the sparse kernels' rows of one element (their scalar loop): ``lr_t = lr / sqrt(a)``,
   ``v = w - lr_t*g``; the final quotient is computed in double there, which these rules
   reproduce only where it is the dtype's own division (float64, or ``l2 == 0``, where the
   divisor is exactly 1): :func:`proximal_adagrad_call` and :func:`proximal_sgd_call`
   return None otherwise and the executors take the reference's step.

``F_L1``: ``l1 > 0`` in the dtype (the kernels' branch): the soft threshold
``sign(v) * max(|v| - lr_t*l1, 0)`` (Eigen's ``sign``: 0 at +-0, so the result is +0 there;
-0 where a negative ``v`` is thresholded), else ``v`` itself; both divided by
``1 + l2*lr_t``.

The formulas are those of :mod:`refopt.reference.proximal` (its Notes); the host rounds the
scalars as TF1 (``tf.cast`` of float32 tensors).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, maximum, mul, rsqrt, sqrt, sub

F_FORM, F_L1 = 0, 1
S_LR, S_L1, S_L2, S_ONE, S_ZERO, S_NEG_ONE, S_T, S_DEN = range(8)

#: The element's forms, by name.
FORMS = {"kernel": 0, "one_element_rows": 1, "kernel_f64": 2}


@register_jitable
def _shrink(v, t, zero, neg_one):
    """``sign(v) * max(|v| - t, 0)`` with Eigen's ``sign`` (exact negations by -1)."""
    if v > zero:
        return maximum(sub(v, t), zero)
    if v < zero:
        return mul(neg_one, maximum(sub(mul(neg_one, v), t), zero))
    if v == zero:
        return zero
    return v  # NaN


@register_jitable
def proximal_adagrad_element(p, g, acc, sc, fl, tail):
    """One ProximalAdagrad element: returns ``(p, acc)``."""
    acc = add(acc, mul(g, g))
    if fl[F_FORM] == 0:
        lr_t = mul(sc[S_LR], rsqrt(acc))
        v = sub(p, mul(g, lr_t))
    elif fl[F_FORM] == 2:  # float64: Eigen's rsqrt is 1/sqrt
        lr_t = mul(sc[S_LR], div(sc[S_ONE], sqrt(acc)))
        v = sub(p, mul(g, lr_t))
    else:
        lr_t = div(sc[S_LR], sqrt(acc))
        v = sub(p, mul(lr_t, g))
    num = _shrink(v, mul(lr_t, sc[S_L1]), sc[S_ZERO], sc[S_NEG_ONE]) if fl[F_L1] else v
    return div(num, add(sc[S_ONE], mul(sc[S_L2], lr_t))), acc


@register_jitable
def proximal_sgd_element(p, g, sc, fl, tail):
    """One ProximalGradientDescent element: returns ``(p,)``."""
    if fl[F_FORM] == 0:
        v = sub(p, mul(g, sc[S_LR]))
    else:
        v = sub(p, mul(sc[S_LR], g))
    num = _shrink(v, sc[S_T], sc[S_ZERO], sc[S_NEG_ONE]) if fl[F_L1] else v
    return (div(num, sc[S_DEN]),)


PROXIMAL_ADAGRAD = Rule("proximal_adagrad", proximal_adagrad_element, ("accumulator",))
PROXIMAL_SGD = Rule("proximal_sgd", proximal_sgd_element, ())


def _form(dtype, lazy_rows, row_width, l2):
    """The form, or None where there is no rule (see the module docstring)."""
    if not lazy_rows:
        return FORMS["kernel"]
    if row_width is None:
        return None
    if row_width != 1:
        return FORMS["kernel"]
    if dtype != np.float64 and l2 != 0:  # the double quotient of the scalar loop
        return None
    return FORMS["one_element_rows"]


def _common(dtype, conv, knob, learning_rate, l1, l2):
    from refopt.reference.proximal import _scalars

    if getattr(conv, knob) != "tf1":
        return None
    return _scalars(dtype, learning_rate, l1, l2)


def proximal_adagrad_call(dtype, conv, *, learning_rate, l1_regularization_strength=0.0,
                          l2_regularization_strength=0.0, lazy_rows=False, row_width=None):
    """The :class:`~refopt.rules.RuleCall` of one ProximalAdagrad step for ``dtype`` under
    ``conv``, or None: a convention without it; a lazy row step of unknown ``row_width``; a
    lazy step on one-element rows whose quotient TF computes in double (float32/float16 with
    ``l2 > 0``).

    ``lazy_rows``: the present rows of a sparse gradient (duplicates summed)."""
    dtype = np.dtype(dtype)
    s = _common(dtype, conv, "proximal_adagrad_form", learning_rate,
                l1_regularization_strength, l2_regularization_strength)
    if s is None:
        return None
    lr, l1, l2 = s
    form = _form(dtype, lazy_rows, row_width, l2)
    if form is None:
        return None
    if form == FORMS["kernel"] and dtype == np.float64:
        form = FORMS["kernel_f64"]
    sc = [0] * 8
    sc[S_LR], sc[S_L1], sc[S_L2], sc[S_ONE], sc[S_NEG_ONE] = lr, l1, l2, 1, -1
    return RuleCall(PROXIMAL_ADAGRAD, scalars(dtype, sc), flags([form, int(l1 > 0)]))


def proximal_sgd_call(dtype, conv, *, learning_rate, l1_regularization_strength=0.0,
                      l2_regularization_strength=0.0, lazy_rows=False, row_width=None):
    """The :class:`~refopt.rules.RuleCall` of one ProximalGradientDescent step, or None (as
    :func:`proximal_adagrad_call`). The threshold ``lr*l1`` and divisor ``1 + l2*lr`` are
    rounded on the host in the dtype, as TF's kernels compute them from scalars."""
    dtype = np.dtype(dtype)
    s = _common(dtype, conv, "proximal_sgd_form", learning_rate,
                l1_regularization_strength, l2_regularization_strength)
    if s is None:
        return None
    lr, l1, l2 = s
    form = _form(dtype, lazy_rows, row_width, l2)
    if form is None:
        return None
    sc = [0] * 8
    with np.errstate(all="ignore"):
        sc[S_LR], sc[S_NEG_ONE] = lr, -1
        sc[S_T] = lr * l1
        sc[S_DEN] = dtype.type(1) + l2 * lr
    return RuleCall(PROXIMAL_SGD, scalars(dtype, sc), flags([form, int(l1 > 0)]))


def _rows_update(apply, call, param, grad, slots):
    """The rule on the gathered present rows of a summed sparse gradient: new arrays."""
    rows = grad.indices
    w, new = param.copy(), [a.copy() for a in slots]
    if rows.size:
        with np.errstate(all="ignore"):
            p, out = apply(call, np.ascontiguousarray(param[rows]),
                           np.ascontiguousarray(grad.values),
                           [np.ascontiguousarray(a[rows]) for a in slots])
        w[rows] = p
        for a, o in zip(new, out):
            a[rows] = o
    return w, new


def pure_update(apply, optimizer, param, grad, slots, *, learning_rate,
                l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                convention=None):
    """:func:`refopt.reference.proximal_adagrad_update` (``optimizer="ProximalAdagrad"``,
    ``slots=[accumulator]``) or :func:`~refopt.reference.proximal_gradient_descent_update`
    (``"ProximalGradientDescent"``, ``slots=[]``) computed by these rules with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)``: the reference's own checks, then
    one rule step (a sparse gradient: summed, on its gathered rows); the reference itself
    where there is no rule. Returns the reference's result type."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import proximal as ref

    hyper = {"learning_rate": learning_rate,
                 "l1_regularization_strength": l1_regularization_strength,
                 "l2_regularization_strength": l2_regularization_strength}
    param, grad, slots = ref.check_proximal_args(optimizer, param, grad, slots,
                                                 convention=convention, **hyper)
    conv = ref._convention(convention)
    adagrad = optimizer == "ProximalAdagrad"
    make = proximal_adagrad_call if adagrad else proximal_sgd_call
    result = ref.ProximalAdagradResult if adagrad else ref.ProximalGradientDescentResult

    def reference():
        if adagrad:
            return ref.proximal_adagrad_update(param, grad, slots[0], convention=conv, **hyper)
        return ref.proximal_gradient_descent_update(param, grad, convention=conv, **hyper)

    if isinstance(grad, IndexedSlices):
        width = int(np.prod(param.shape[1:], dtype=np.int64))
        call = make(param.dtype, conv, lazy_rows=True, row_width=width, **hyper)
        if call is None:
            return reference()
        with np.errstate(all="ignore"):
            grad = grad.deduplicate()
        w, new = _rows_update(apply, call, param, grad, slots)
        return result(w, *new)
    call = make(param.dtype, conv, **hyper)
    if call is None:
        return reference()
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, slots)
    return result(p, *out)
