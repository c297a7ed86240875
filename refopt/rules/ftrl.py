"""FTRL's rule for TensorFlow's kernels at the power 0.5 (Keras 2 and TF1).

Two slots, ``accumulator`` (``n``) and ``linear`` (``z``); one element function,
:func:`ftrl_element`, branching on ``F_FORM`` (a compile-time constant of the fused kernels):

0. the dense kernels ``ApplyFtrl``/``ApplyFtrlV2``: the weight a select,
   ``|z| > l1 ? (l1 sign(z) - z) / y : 0`` with ``y = sqrt(n')/lr + 2 l2``;
1. the sparse kernels' rows of several elements (``SparseApplyFtrl[V2]``'s Eigen chips): the
   weight from a clip, ``(clip(z, -l1, l1) - z) / y``.

``F_SHRINK``: whether ``2 * shrinkage * w`` is added to the gradient of ``z`` (the V2
kernels, chosen by the configured shrinkage > 0).

Only where the framework takes the correctly rounded ``sqrt`` is there a rule: the kernels'
special case ``learning_rate_power == -0.5``. Everywhere else the framework calls ``pow``
(tf.keras 2.11+ and Keras 3 always, even at -0.5; the kernels at any other power; the sparse
kernels' scalar loop on one-element rows for ``sigma``), and on scalars TensorFlow's ``pow``
is the C library's, which is not correctly rounded (not even ``pow(x, 0.5)``, see
:func:`refopt.reference.ftrl.c_pow`) and which no CUDA target has: :func:`ftrl_call` returns
None and the executors take the reference's step.

The formulas are those of :func:`refopt.reference.ftrl_update` (its Notes, one framework at
a time); the host rounds the scalars as each framework does
(:func:`refopt.reference.ftrl.ftrl_scalars`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, maximum, minimum, mul, sqrt, sub

F_FORM, F_SHRINK = 0, 1
S_LR, S_L1, S_NEG_L1, S_TWO_L2, S_TWO_SHRINK, S_ZERO = range(6)

#: The element's forms, by name.
FORMS = {"select": 0, "clip": 1}


@register_jitable
def ftrl_element(p, g, n, z, sc, fl, tail):
    """One FTRL element of TensorFlow's kernels (power 0.5): returns ``(p, n, z)``."""
    g_s = add(g, mul(sc[S_TWO_SHRINK], p)) if fl[F_SHRINK] else g
    n_new = add(n, mul(g, g))
    r_new = sqrt(n_new)
    z = add(z, sub(g_s, mul(div(sub(r_new, sqrt(n)), sc[S_LR]), p)))
    y = add(div(r_new, sc[S_LR]), sc[S_TWO_L2])
    if fl[F_FORM] == 0:
        if z > sc[S_L1]:
            p = div(sub(sc[S_L1], z), y)
        elif z < sc[S_NEG_L1]:
            p = div(sub(sc[S_NEG_L1], z), y)
        else:
            p = sc[S_ZERO]
    else:
        p = div(sub(minimum(maximum(z, sc[S_NEG_L1]), sc[S_L1]), z), y)
    return p, n_new, z


FTRL = Rule("ftrl", ftrl_element, ("accumulator", "linear"))


def ftrl_call(dtype, conv, *, learning_rate, learning_rate_power=-0.5,
              l1_regularization_strength=0.0, l2_regularization_strength=0.0,
              l2_shrinkage_regularization_strength=0.0, beta=0.0, lazy_rows=False,
              row_width=None):
    """The :class:`~refopt.rules.RuleCall` of one FTRL step for ``dtype`` under ``conv``, or
    None where the framework calls ``pow`` (tf_keras, Keras 3, a power other than 0.5, the
    sparse kernels' one-element rows), for a lazy row step of unknown ``row_width``, and for
    a convention without FTRL.

    ``lazy_rows``: the present rows of a sparse gradient (duplicates summed; Keras 2, TF1).
    """
    from refopt.reference.ftrl import _FORMS, ftrl_scalars

    form_name = conv.ftrl_form
    if form_name not in _FORMS or form_name in ("tf_keras", "keras3"):
        return None
    if lazy_rows and (row_width is None or row_width == 1):
        return None
    dtype = np.dtype(dtype)
    s = ftrl_scalars(dtype, conv, learning_rate=learning_rate,
                     learning_rate_power=learning_rate_power,
                     l1_regularization_strength=l1_regularization_strength,
                     l2_regularization_strength=l2_regularization_strength,
                     l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                     beta=beta)
    if not s["use_sqrt"]:
        return None
    form = FORMS["clip"] if lazy_rows else FORMS["select"]
    sc = [0] * 6
    with np.errstate(all="ignore"):
        sc[S_LR] = s["lr"]
        sc[S_L1] = s["l1"]
        sc[S_NEG_L1] = -s["l1"]
        sc[S_TWO_L2] = s["two_l2"]
        sc[S_TWO_SHRINK] = s["two_shrinkage"]
    return RuleCall(FTRL, scalars(dtype, sc), flags([form, int(s["shrinkage"])]))


def pure_update(apply, param, grad, accumulator, linear, *, learning_rate,
                learning_rate_power=-0.5, l1_regularization_strength=0.0,
                l2_regularization_strength=0.0, l2_shrinkage_regularization_strength=0.0,
                beta=0.0, convention=None):
    """:func:`refopt.reference.ftrl_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (a sparse gradient of Keras 2 or
    TF1: on its gathered rows, as the reference); the reference itself where there is no
    rule (see :func:`ftrl_call`). Returns an ``FtrlResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import ftrl as ref

    hyper = dict(learning_rate=learning_rate, learning_rate_power=learning_rate_power,
                 l1_regularization_strength=l1_regularization_strength,
                 l2_regularization_strength=l2_regularization_strength,
                 l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                 beta=beta)
    param, grad, accumulator, linear, form = ref.check_ftrl_args(
        param, grad, accumulator, linear, convention=convention, **hyper)
    conv = ref._convention(convention)

    def reference():
        return ref.ftrl_update(param, grad, accumulator, linear, convention=conv, **hyper)

    if isinstance(grad, IndexedSlices):
        if form in ("tf_keras", "keras3"):
            return reference()
        else:
            grad = grad.deduplicate()
            rows = grad.indices
            width = int(np.prod(param.shape[1:], dtype=np.int64))
            call = ftrl_call(param.dtype, conv, lazy_rows=True, row_width=width, **hyper)
            if call is None:
                return reference()
            w, n, z = param.copy(), accumulator.copy(), linear.copy()
            if rows.size:
                with np.errstate(all="ignore"):
                    p, out = apply(call, np.ascontiguousarray(param[rows]),
                                   np.ascontiguousarray(grad.values),
                                   [accumulator[rows], linear[rows]])
                w[rows], n[rows], z[rows] = p, out[0], out[1]
            return ref.FtrlResult(w, n, z)
    call = ftrl_call(param.dtype, conv, **hyper)
    if call is None:
        return reference()
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [accumulator, linear])
    return ref.FtrlResult(p, out[0], out[1])
