"""FTRL's rule, every TensorFlow form: the kernels (Keras 2, TF1) and tf.keras 2.11+/Keras 3.

Two slots, ``accumulator`` (``n``) and ``linear`` (``z``); two element functions branching on
``F_FORM`` (a compile-time constant of the fused kernels): :func:`ftrl_element`
(:data:`FTRL`, forms 0 and 1 with ``sqrt``, every target) and :func:`ftrl_pow_element`
(:data:`FTRL_POW`, every form with the C library's ``pow``, the CPU target only):

0. the dense kernels ``ApplyFtrl``/``ApplyFtrlV2``: the weight a select,
   ``|z| > l1 ? (l1 sign(z) - z) / y : 0`` with ``y = root(n')/lr + 2 l2``;
1. the sparse kernels' rows of several elements (``SparseApplyFtrl[V2]``'s Eigen chips): the
   weight from a clip, ``(clip(z, -l1, l1) - z) / y``;
2. the sparse kernels' scalar loop on rows of one element: ``sigma`` from ``pow`` even at
   the power 0.5, ``z`` summed ``(z + g_s) - sigma w``, the weight from a clip;
3. tf.keras 2.11+ and Keras 3 (the tensor ops of ``update_step``): ``pow`` always, the
   shrunk gradient always (``g + 2 shrinkage w``), the weight from a clip; tf_keras squares
   the gradient with ``tf.pow(g, 2)`` (``F_SQ_POW``), Keras 3 with a product.

``F_SHRINK``: whether ``2 * shrinkage * w`` is added to the gradient of ``z`` (the kernels'
V2, chosen by the configured shrinkage > 0); ``F_POW``: the kernels' root is ``pow`` (a
power other than 0.5) instead of the correctly rounded ``sqrt``.

``pow`` is the C library's (:func:`refopt.rules.ops.cpow`, as
:func:`refopt.reference.ftrl.c_pow`), which only the CPU target has (Numba calls ``powf``/
``pow`` per element; no CUDA function gives the same bits): :func:`ftrl_call` returns a rule
that calls it only when asked with ``allow_pow=True`` (``backend="cpu"``, the CPU pure
function) and :data:`refopt.rules.ops.CPU_POW` holds; otherwise None, and the executors take
the reference's step. Its ``targets`` is ``("cpu",)``: ``backend="cuda"`` takes its host step
for it, with the ``HostStepWarning``.

The formulas are those of :func:`refopt.reference.ftrl_update` (its Notes, one framework at
a time); the host rounds the scalars as each framework does
(:func:`refopt.reference.ftrl.ftrl_scalars`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, cpow, div, maximum, minimum, mul, sqrt, sub

F_FORM, F_SHRINK, F_POW, F_SQ_POW = 0, 1, 2, 3
S_LR, S_L1, S_NEG_L1, S_TWO_L2, S_TWO_SHRINK, S_ZERO, S_POWER, S_TWO = range(8)

#: The element's forms, by name.
FORMS = {"select": 0, "clip": 1, "scalar": 2, "keras": 3}


@register_jitable
def ftrl_element(p, g, n, z, sc, fl, tail):
    """One FTRL element of TensorFlow's kernels at the power 0.5 (``sqrt``; forms 0 and 1,
    every target): returns ``(p, n, z)``."""
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


@register_jitable
def ftrl_pow_element(p, g, n, z, sc, fl, tail):
    """One FTRL element where the framework calls ``pow`` (every form, ``F_FORM``; the CPU
    target only: :func:`refopt.rules.ops.cpow`): returns ``(p, n, z)``."""
    if fl[F_FORM] == 3:  # tf_keras, Keras 3
        g_s = add(g, mul(sc[S_TWO_SHRINK], p))
        g_sq = cpow(g, sc[S_TWO]) if fl[F_SQ_POW] else mul(g, g)
        n_new = add(n, g_sq)
        r_new = cpow(n_new, sc[S_POWER])
        z = add(z, sub(g_s, mul(div(sub(r_new, cpow(n, sc[S_POWER])), sc[S_LR]), p)))
        q = add(div(r_new, sc[S_LR]), sc[S_TWO_L2])
        p = div(sub(minimum(maximum(z, sc[S_NEG_L1]), sc[S_L1]), z), q)
        return p, n_new, z
    g_s = add(g, mul(sc[S_TWO_SHRINK], p)) if fl[F_SHRINK] else g
    n_new = add(n, mul(g, g))
    r_new = cpow(n_new, sc[S_POWER]) if fl[F_POW] else sqrt(n_new)
    if fl[F_FORM] == 2:  # the sparse kernels' scalar loop: pow for sigma, at any power
        sigma = div(sub(cpow(n_new, sc[S_POWER]), cpow(n, sc[S_POWER])), sc[S_LR])
        z = sub(add(z, g_s), mul(sigma, p))
    else:  # forms 0 and 1 at a power other than 0.5 (F_POW)
        z = add(z, sub(g_s, mul(div(sub(r_new, cpow(n, sc[S_POWER])), sc[S_LR]), p)))
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


#: The kernels' rule at the power 0.5 (every target).
FTRL = Rule("ftrl", ftrl_element, ("accumulator", "linear"))
#: The rule of the steps that call ``pow`` (the CPU target only; never compiled for CUDA).
FTRL_POW = Rule("ftrl_pow", ftrl_pow_element, ("accumulator", "linear"), targets=("cpu",))


def ftrl_call(dtype, conv, *, learning_rate, learning_rate_power=-0.5,
              l1_regularization_strength=0.0, l2_regularization_strength=0.0,
              l2_shrinkage_regularization_strength=0.0, beta=0.0, lazy_rows=False,
              row_width=None, allow_pow=False):
    """The :class:`~refopt.rules.RuleCall` of one FTRL step for ``dtype`` under ``conv``, or
    None for a convention without FTRL, a lazy row step of unknown ``row_width``, a lazy
    row step of tf_keras or Keras 3 (they have none), and, unless ``allow_pow`` (the CPU
    target, where :data:`refopt.rules.ops.CPU_POW` holds), wherever the framework calls
    ``pow`` (tf_keras, Keras 3, a power other than 0.5, the sparse kernels' one-element rows).

    ``lazy_rows``: the present rows of a sparse gradient (duplicates summed; Keras 2, TF1).
    """
    from refopt.reference.ftrl import _FORMS, ftrl_scalars
    from refopt.rules.ops import CPU_POW

    allow_pow = bool(allow_pow and CPU_POW)
    form_name = conv.ftrl_form
    if form_name not in _FORMS:
        return None
    keras = form_name in ("tf_keras", "keras3")
    if lazy_rows and (keras or row_width is None):
        return None
    if not allow_pow and (keras or (lazy_rows and row_width == 1)):
        return None
    dtype = np.dtype(dtype)
    s = ftrl_scalars(dtype, conv, learning_rate=learning_rate,
                     learning_rate_power=learning_rate_power,
                     l1_regularization_strength=l1_regularization_strength,
                     l2_regularization_strength=l2_regularization_strength,
                     l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                     beta=beta)
    use_pow = not s["use_sqrt"]
    if use_pow and not allow_pow:
        return None
    if keras:
        form = FORMS["keras"]
    elif lazy_rows:
        form = FORMS["scalar"] if row_width == 1 else FORMS["clip"]
    else:
        form = FORMS["select"]
    sc = [0] * 8
    with np.errstate(all="ignore"):
        sc[S_LR] = s["lr"]
        sc[S_L1] = s["l1"]
        sc[S_NEG_L1] = -s["l1"]
        sc[S_TWO_L2] = s["two_l2"]
        sc[S_TWO_SHRINK] = s["two_shrinkage"]
        sc[S_POWER] = s["power"]
        sc[S_TWO] = 2
    rule = FTRL_POW if (use_pow or form >= FORMS["scalar"]) else FTRL
    return RuleCall(rule, scalars(dtype, sc),
                    flags([form, int(s["shrinkage"]), int(use_pow),
                           int(form_name == "tf_keras")]))


def pure_update(apply, param, grad, accumulator, linear, *, learning_rate,
                learning_rate_power=-0.5, l1_regularization_strength=0.0,
                l2_regularization_strength=0.0, l2_shrinkage_regularization_strength=0.0,
                beta=0.0, convention=None, allow_pow=False):
    """:func:`refopt.reference.ftrl_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (a sparse gradient of Keras 2 or
    TF1: on its gathered rows, as the reference; of tf_keras or Keras 3: on the summed
    gradient made dense, as the reference); the reference itself where there is no rule
    (see :func:`ftrl_call`; ``allow_pow``: the CPU target). Returns an ``FtrlResult``."""
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
            if conv.keras3_sparse_square:  # the squares of the raw duplicates: the reference
                return reference()
            with np.errstate(all="ignore"):
                grad = grad.deduplicate().to_dense()
        else:
            grad = grad.deduplicate()
            rows = grad.indices
            width = int(np.prod(param.shape[1:], dtype=np.int64))
            call = ftrl_call(param.dtype, conv, lazy_rows=True, row_width=width,
                             allow_pow=allow_pow, **hyper)
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
    call = ftrl_call(param.dtype, conv, allow_pow=allow_pow, **hyper)
    if call is None:
        return reference()
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [accumulator, linear])
    return ref.FtrlResult(p, out[0], out[1])
