"""Adagrad's rule under every framework form (``Convention.adagrad_form``).

One slot, ``accumulator``; one element function, :func:`adagrad_element`, branching on
``F_FORM`` (a compile-time constant of the fused kernels):

0. the TensorFlow family's ``a + g*g`` and ``w - (lr*g) / (sqrt(a + e_in) + e_out)``:
   tf_keras and Keras 3 (``e_in = eps``, ``e_out = 0``), Keras 2's ``ApplyAdagradV2``
   (``e_in = 0``, ``e_out = eps``: epsilon outside the root) and TF1's sparse kernel on
   one-element rows (both 0). Adding the zero changes no bit: ``a + 0 = a`` for every
   accumulator after a step (it is never ``-0``: ``a + g*g`` with ``g*g >= +0``), and
   ``r + 0 = r`` for a root ``r >= +0`` or NaN; ``lr*g`` and ``g*lr`` are the same product.
   So four framework formulas share one kernel.
1. TF1's ``ApplyAdagrad``: no epsilon, ``w - (g*lr) * rsqrt(a)``.
2. PyTorch's dense for-loop: ``fma(g, g, a)``, ``w + (-clr*g) / (sqrt(a) + eps)``.
3. PyTorch's sparse branch (the present rows): ``a + g*g``, ``fma(-clr, g/(sqrt(a) + eps),
   w)``.
4. optax under ``jit``: ``fma(g, g, a)``, ``w + (-lr) * (s*g)`` with
   ``s = rsqrt(a + eps) if a > 0 else 0``.

The formulas are those of :func:`refopt.reference.adagrad_update` (its Notes, written there
one framework at a time); the host rounds the scalars as each framework does
(:func:`adagrad_call`).
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from refopt.rules import Root, Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, fma, mul, rsqrt, sqrt, sub

F_FORM, F_EAGER = 0, 1
S_LR, S_EPS_IN, S_EPS_OUT, S_NEG_LR, S_EPS, S_ZERO = range(6)

#: The element's forms, by name.
FORMS = {"tf": 0, "tf1": 1, "torch": 2, "torch_rows": 3, "optax": 4}


@register_jitable
def adagrad_finish(p, g, acc, root, sc, fl, tail):
    """PyTorch's step from ``root``, the square root of the new accumulator ``acc``: form 2
    (the dense for-loop) ``p + (-clr*g) / (root + eps)``, form 3 (the sparse branch)
    ``fma(-clr, g / (root + eps), p)``."""
    if fl[F_FORM] == 2:
        return add(p, div(mul(sc[S_NEG_LR], g), add(root, sc[S_EPS])))
    return fma(sc[S_NEG_LR], div(g, add(root, sc[S_EPS])), p)


@register_jitable
def adagrad_element(p, g, acc, sc, fl, tail):
    """One Adagrad element: returns ``(p, acc)``."""
    form = fl[F_FORM]
    if form == 0:
        acc = add(acc, mul(g, g))
        root = add(sqrt(add(acc, sc[S_EPS_IN])), sc[S_EPS_OUT])
        return sub(p, div(mul(sc[S_LR], g), root)), acc
    if form == 1:
        acc = add(acc, mul(g, g))
        return sub(p, mul(mul(g, sc[S_LR]), rsqrt(acc))), acc
    if form == 2:
        acc = fma(g, g, acc)
        return adagrad_finish(p, g, acc, sqrt(acc), sc, fl, tail), acc
    if form == 3:
        acc = add(acc, mul(g, g))
        return adagrad_finish(p, g, acc, sqrt(acc), sc, fl, tail), acc
    acc = add(mul(g, g), acc) if fl[F_EAGER] != 0 else fma(g, g, acc)  # optax eager: no FMA
    s = rsqrt(add(acc, sc[S_EPS])) if acc > 0 else sc[S_ZERO]
    return add(p, mul(sc[S_NEG_LR], mul(s, g))), acc


#: PyTorch's forms (2, 3) take the root of the new accumulator: MKL's under the for-loop
#: preset (``Root``: the CPU's ``rows_root`` kernel for the sparse branch).
ADAGRAD = Rule("adagrad", adagrad_element, ("accumulator",),
               root=Root(0, adagrad_finish, (FORMS["torch"], FORMS["torch_rows"])))


def adagrad_call(dtype, conv, *, learning_rate, epsilon, lr_decay=0.0, step=1,
                 lazy_rows=False, row_width=None):
    """The :class:`~refopt.rules.RuleCall` of one Adagrad step for ``dtype`` under ``conv``.

    ``lazy_rows``: the call updates the present rows of a sparse gradient (duplicates summed),
    with the framework's row form: PyTorch's sparse branch, TF1's kernel (``row_width == 1``:
    its one-element-row division). Returns None for TF1 rows of unknown width
    (``row_width=None``): the caller takes the reference's path.
    """
    from refopt.reference._common import lr_cast, scalar, tf_cast
    from refopt.reference.adagrad import _torch_lr

    dtype = np.dtype(dtype)
    form_name = conv.adagrad_form
    sc = [0] * 6
    with np.errstate(all="ignore"):
        if form_name in ("tf_keras", "keras3", "keras2"):
            form = FORMS["tf"]
            sc[S_LR] = lr_cast(dtype, learning_rate)
            sc[S_EPS_OUT if form_name == "keras2" else S_EPS_IN] = scalar(dtype, epsilon)
        elif form_name == "tf1":
            if lazy_rows and row_width is None:
                return None
            # one-element rows: (lr*g) / sqrt(a), form 0 with both epsilons 0
            form = FORMS["tf"] if lazy_rows and row_width == 1 else FORMS["tf1"]
            sc[S_LR] = tf_cast(dtype, learning_rate)
        else:
            form = FORMS["optax"]
            if form_name == "torch":
                form = FORMS["torch_rows"] if lazy_rows else FORMS["torch"]
                learning_rate = _torch_lr(learning_rate, lr_decay, step)
            sc[S_NEG_LR] = scalar(dtype, -float(learning_rate))
            sc[S_EPS] = scalar(dtype, epsilon)
    eager = form == FORMS["optax"] and conv.optax_jit == "eager"
    return RuleCall(ADAGRAD, scalars(dtype, sc), flags([form, eager]))


def pure_update(apply, param, grad, accumulator, *, learning_rate, epsilon, convention,
                lr_decay, step):
    """:func:`refopt.reference.adagrad_update` computed by this rule with a backend's
    ``apply(call, param, grad, slots) -> (param, slots)`` (the CPU and CUDA pure functions):
    the reference's own argument checks, then one rule step (a sparse gradient: on its
    gathered rows, as the reference); returns an ``AdagradResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference import adagrad as ref
    from refopt.reference.sqrt import needs_reference, takes_mkl_sqrt

    # MKL's root (the `sqrt` knob; a dense step under "torch_fused" takes IEEE's): not in
    # the rule
    if needs_reference(convention) and (isinstance(grad, IndexedSlices) or takes_mkl_sqrt(
            ref._convention(convention), fused_kernel=True)):
        return ref.adagrad_update(param, grad, accumulator, learning_rate=learning_rate,
            epsilon=epsilon, convention=convention, lr_decay=lr_decay, step=step)

    param, grad, accumulator, form = ref.check_adagrad_args(
        param, grad, accumulator, learning_rate=learning_rate, epsilon=epsilon,
        convention=convention, lr_decay=lr_decay, step=step)
    conv = ref._convention(convention)
    kw = dict(learning_rate=learning_rate, epsilon=epsilon, lr_decay=lr_decay, step=step)
    if isinstance(grad, IndexedSlices):
        if form == "keras3" and conv.keras3_sparse_square:  # per occurrence: the reference
            return ref.adagrad_update(param, grad, accumulator, convention=conv, **kw)
        grad = grad.deduplicate()
        if form == "keras3":
            grad = grad.to_dense()
        else:
            rows = grad.indices
            width = int(np.prod(param.shape[1:], dtype=np.int64))
            w, acc = param.copy(), accumulator.copy()
            if rows.size:
                call = adagrad_call(param.dtype, conv, lazy_rows=True, row_width=width, **kw)
                with np.errstate(all="ignore"):
                    p, out = apply(call, np.ascontiguousarray(param[rows]),
                                   np.ascontiguousarray(grad.values), [accumulator[rows]])
                w[rows], acc[rows] = p, out[0]
            return ref.AdagradResult(w, acc)
    call = adagrad_call(param.dtype, conv, **kw)
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, [accumulator])
    return ref.AdagradResult(p, out[0])
