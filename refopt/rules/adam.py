"""The Adam family's rules: Adam and AMSGrad under every convention, and SparseAdam's rows.

One element function per slot layout (``m, v`` and ``m, v, vhat``), both built from the same
moment and step helpers, with the convention's form chosen by flags:

``F_FORM``
    0: epsilon-hat (TF, Keras): ``p - (m alpha) / (sqrt(v) + eps)``; 1: PyTorch's fused CPU
    kernel (float64 scalars, ``p + (-step_size m) / (sqrt(v) / bc2_sqrt + eps)``); 2: optax
    under ``jit`` (``u = m / (bc1 (sqrt(v / bc2) + eps))``, optional ``fma(p, wd, u)``,
    ``p + u (-lr)``).
``F_MOMENTS``
    0: Keras' ``m + (g - m)(1 - b)``; 1: ``b m + (1 - b) g``; 2: PyTorch's ``lerp`` (one FMA,
    branch on the weight) and ``fma((1-b2) g, g, v b2)`` (the scalar tail the other way
    round); 3: XLA's ``fma(1 - b, g, b m)``.

:data:`ADAM_TABLE` and :data:`AMSGRAD_TABLE` are tf-keras' non-lazy sparse update of a
whole table (the drivers' ``table`` kernels: the element gets ``g = None`` where its row has
no gradient); :func:`pure_update` is :func:`refopt.reference.adam_update` and
:func:`~refopt.reference.lazy_adam_update` on a backend's drivers.

The scalars are rounded on the host (:func:`adam_call`) with the same helpers the reference
uses to round its scalars (``refopt.reference.variants``); the element arithmetic here is
independent of the reference's NumPy code, and the property tests compare the two.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from refopt.rules import Root, Rule, RuleCall, flags, scalars
from numba.extending import register_jitable

from refopt.rules.ops import add, div, fma, maximum, mul, sqrt, sub

# flags
F_FORM, F_MOMENTS, F_LERP_LOW, F_AMS_CORRECTED, F_OPTAX_WD, F_OPTAX_JIT = range(6)
# scalars
(S_ALPHA, S_C1, S_C2, S_B1, S_B2, S_EPS, S_W1, S_BC2, S_BC2_SQRT, S_NEG_STEP, S_BC1,
 S_NEG_LR, S_WD, S_EPS_ROOT) = range(14)


@register_jitable
def moments(m, v, g, sc, fl, tail):
    """The new first and second moments."""
    how = fl[F_MOMENTS]
    c1 = sc[S_C1]
    c2 = sc[S_C2]
    if how == 0:
        return add(m, mul(sub(g, m), c1)), add(v, mul(sub(mul(g, g), v), c2))
    if how == 1:
        return add(mul(sc[S_B1], m), mul(c1, g)), add(mul(sc[S_B2], v), mul(c2, mul(g, g)))
    if how == 2:
        d = sub(g, m)
        if fl[F_LERP_LOW] != 0:
            m = fma(c1, d, m)
        else:
            m = fma(sc[S_W1], d, g)
        if tail:
            v = fma(v, sc[S_B2], mul(mul(c2, g), g))
        else:
            v = fma(mul(c2, g), g, mul(v, sc[S_B2]))
        return m, v
    return fma(c1, g, mul(sc[S_B1], m)), fma(c2, mul(g, g), mul(sc[S_B2], v))


@register_jitable
def step_hat(p, m, den, sc):
    """``p - (m alpha) / (sqrt(den) + eps)``."""
    return sub(p, div(mul(m, sc[S_ALPHA]), add(sqrt(den), sc[S_EPS])))


@register_jitable
def step_torch(p, m, den, sc):
    """``p + (-step_size m) / (sqrt(den) / bc2_sqrt + eps)``."""
    return step_torch_root(p, m, sqrt(den), sc)


@register_jitable
def step_torch_root(p, m, root, sc):
    """``p + (-step_size m) / (root / bc2_sqrt + eps)``."""
    denom = add(div(root, sc[S_BC2_SQRT]), sc[S_EPS])
    return add(p, div(mul(sc[S_NEG_STEP], m), denom))


@register_jitable
def adam_finish(p, g, m, v, root, sc, fl, tail):
    """Adam's PyTorch step (form 1) from the new moments and ``root = sqrt(v)``."""
    return step_torch_root(p, m, root, sc)


@register_jitable
def step_optax(p, m, den, sc, fl):
    """``u = m / (bc1 (sqrt(den + eps_root) + eps))``, ``u = fma(p, wd, u)`` for adamw,
    ``p + u (-lr)``. ``eps_root`` is 0 unless set (``den >= +0``: adding +0 changes no bit)."""
    if fl[F_OPTAX_JIT] == 1:  # eager: m/bc1 / (sqrt(den + eps_root) + eps), u + wd*p, -lr*u
        u = div(div(m, sc[S_BC1]), add(sqrt(add(den, sc[S_EPS_ROOT])), sc[S_EPS]))
        if fl[F_OPTAX_WD] != 0:
            u = add(u, mul(sc[S_WD], p))
        return add(p, mul(sc[S_NEG_LR], u))
    u = div(m, mul(sc[S_BC1], add(sqrt(add(den, sc[S_EPS_ROOT])), sc[S_EPS])))
    if fl[F_OPTAX_WD] != 0:
        u = fma(p, sc[S_WD], u)
    return optax_apply(p, u, sc[S_NEG_LR], fl[F_OPTAX_JIT])


@register_jitable
def optax_apply(p, u, neg_lr, mode):
    """``apply_updates(p, -lr*u)``: ``p + u*(-lr)`` (``mode`` 0 ``jit(update)``, 1 eager)
    or one FMA ``fma(u, -lr, p)`` (2: the whole step under ``jit``)."""
    if mode == 2:
        return fma(u, neg_lr, p)
    return add(p, mul(u, neg_lr))


@register_jitable
def adam_element(p, g, m, v, sc, fl, tail):
    """Adam on one element: slots ``m, v``."""
    m, v = moments(m, v, g, sc, fl, tail)
    form = fl[F_FORM]
    if form == 0:
        p = step_hat(p, m, v, sc)
    elif form == 1:
        p = step_torch(p, m, v, sc)
    else:
        p = step_optax(p, m, div(v, sc[S_BC2]), sc, fl)
    return p, m, v


@register_jitable
def amsgrad_element(p, g, m, v, vh, sc, fl, tail):
    """AMSGrad on one element: slots ``m, v, vhat``."""
    m, v = moments(m, v, g, sc, fl, tail)
    form = fl[F_FORM]
    corrected = fl[F_AMS_CORRECTED] != 0
    if form == 0:
        vh = maximum(vh, v)
        p = step_hat(p, m, vh, sc)
    elif form == 1:
        if corrected:
            vh = maximum(vh, div(v, sc[S_BC2]))
            p = step_torch(p, m, mul(vh, sc[S_BC2]), sc)
        else:
            vh = maximum(vh, v)
            p = step_torch(p, m, vh, sc)
    else:
        if corrected:
            vh = maximum(vh, div(v, sc[S_BC2]))
            p = step_optax(p, m, vh, sc, fl)
        else:
            vh = maximum(vh, v)
            p = step_optax(p, m, div(vh, sc[S_BC2]), sc, fl)
    return p, m, v, vh


@register_jitable
def sparse_adam_finish(p, g, m, v, root, sc, fl, tail):
    """SparseAdam's step from the new moments and ``root = sqrt(v)``:
    ``p + (-step_size) (m / (root + eps))``."""
    return add(p, mul(sc[S_NEG_STEP], div(m, add(root, sc[S_EPS]))))


@register_jitable
def sparse_adam_element(p, g, m, v, sc, fl, tail):
    """``torch.optim.SparseAdam`` on one element of a present row: slots ``m, v``.

    torch computes ``numer = dm + m`` and ``sqrt(dv + v)`` apart from the slots' ``m + dm``
    and ``v + dv``: the same sums (IEEE addition commutes), so the step is taken from the new
    slots (:func:`sparse_adam_finish`)."""
    dm = mul(sub(g, m), sc[S_C1])
    dv = mul(sub(mul(g, g), v), sc[S_C2])
    m = add(m, dm)
    v = add(v, dv)
    return sparse_adam_finish(p, g, m, v, sqrt(v), sc, fl, tail), m, v


@register_jitable
def table_moments(m, v, g, sc):
    """tf-keras' non-lazy sparse moments: ``m + (-m)(1 - b1)`` everywhere, then
    ``+ g (1 - b1)`` where the row has a gradient (``g`` None: it has none); ``v`` likewise
    with ``g g``."""
    m = add(m, mul(-m, sc[S_C1]))
    v = add(v, mul(-v, sc[S_C2]))
    if g is not None:
        m = add(m, mul(g, sc[S_C1]))
        v = add(v, mul(mul(g, g), sc[S_C2]))
    return m, v


@register_jitable
def adam_table_element(p, g, m, v, sc, fl, tail):
    """tf-keras' non-lazy sparse Adam on one element of the whole table: slots ``m, v``
    (``g`` None where the element's row has no gradient; the weight moves anyway)."""
    m, v = table_moments(m, v, g, sc)
    return step_hat(p, m, v, sc), m, v


@register_jitable
def amsgrad_table_element(p, g, m, v, vh, sc, fl, tail):
    """As :func:`adam_table_element` with AMSGrad's maximum: slots ``m, v, vhat``."""
    m, v = table_moments(m, v, g, sc)
    vh = maximum(vh, v)
    return step_hat(p, m, vh, sc), m, v, vh


#: PyTorch's form (1) takes the root of the new ``v``: MKL's under the for-loop preset.
ADAM = Rule("adam", adam_element, ("m", "v"), root=Root(1, adam_finish, (1,)))
AMSGRAD = Rule("amsgrad", amsgrad_element, ("m", "v", "vhat"))
#: SparseAdam's root is torch's ``sqrt_`` (MKL's under the for-loop preset): ``Root``.
SPARSE_ADAM = Rule("sparse_adam", sparse_adam_element, ("m", "v"),
                   root=Root(1, sparse_adam_finish, (0,)))
#: The whole-table sparse rules (the drivers' ``table`` kernels): tf-keras' ``IndexedSlices``
#: path of :func:`refopt.reference.adam_update`.
ADAM_TABLE = Rule("adam_table", adam_table_element, ("m", "v"))
AMSGRAD_TABLE = Rule("amsgrad_table", amsgrad_table_element, ("m", "v", "vhat"))

# "torch_loop" (PyTorch's for-loop path) is form 2 without the fused kernel's scalar tail
#: ``Convention.optax_jit`` -> the ``F_OPTAX_JIT`` flag (read by the optax forms only)
OPTAX_JIT = {"update": 0, "eager": 1, "step": 2}
_MOMENTS = {"keras": 0, "ema": 1, "torch_fma": 2, "torch_loop": 2, "optax_fma": 3}


def adam_call(dtype, conv, *, learning_rate, beta_1, beta_2, epsilon, step, amsgrad,
              optax_weight_decay=None, lazy_rows=False, eps_root=None):
    """The :class:`~refopt.rules.RuleCall` of one Adam step for ``dtype`` under ``conv``.

    ``optax_weight_decay``: optax ``adamw``'s decay inside the update; ``eps_root``: optax's
    term inside the root (optax form only; None is 0). ``lazy_rows``: the
    call is for the rows of a lazy sparse step (``conv.lazy_update``: TF1/TF-Addons rows use
    the ``b m + (1 - b) g`` moments; ``"torch_sparse"`` is SparseAdam's rule). The scalars
    that do not depend on the step are computed once per configuration (cached).
    """
    V = _variants()
    dtype = np.dtype(dtype)
    rule, base, fl, lanes, form, bases = _adam_static(dtype, conv, beta_1, beta_2, epsilon, amsgrad,
                                                optax_weight_decay, lazy_rows, eps_root)
    sc = base.copy()
    if lazy_rows and conv.lazy_update == "ema_rows":
        conv = conv.replace(moment_update="ema")
    with np.errstate(all="ignore"):
        if form == 3:  # SparseAdam
            step_size = float(learning_rate) * math.sqrt(1 - float(beta_2) ** step) / (
                1 - float(beta_1) ** step)
            sc[S_NEG_STEP] = -step_size
            return RuleCall(rule, sc, fl)
        one = dtype.type(1)
        lr = _lr_value(dtype, learning_rate, conv)
        if form == 0 and conv.bias_correction == "pow" and dtype in _POW:
            # the hot path of the Keras conventions: powf/pow of the tf.cast betas
            pw, (b1c, b2c) = _POW[dtype], bases
            t = float(dtype.type(step))
            p1, p2 = dtype.type(pw(float(b1c), t)), dtype.type(pw(float(b2c), t))
            sc[S_ALPHA] = dtype.type(lr) * np.sqrt(one - p2) / (one - p1)
        elif form == 0:
            p1 = V.beta_power(dtype, beta_1, step, conv)
            p2 = V.beta_power(dtype, beta_2, step, conv)
            if conv.bias_correction == "float64":
                p1, p2 = V.scalar(dtype, p1), V.scalar(dtype, p2)
            sc[S_ALPHA] = V.scalar(dtype, lr) * np.sqrt(one - p2) / (one - p1)
        elif form == 1:
            bc1 = 1.0 - float(beta_1) ** step
            sc[S_BC2] = 1.0 - float(beta_2) ** step
            sc[S_BC2_SQRT] = math.sqrt(1.0 - float(beta_2) ** step)
            sc[S_NEG_STEP] = -(float(lr) / bc1)
        else:
            sc[S_BC1] = one - V.beta_power(dtype, beta_1, step, conv)
            sc[S_BC2] = one - V.beta_power(dtype, beta_2, step, conv)
            sc[S_NEG_LR] = -float(lr)
    return RuleCall(rule, sc, fl, lanes)


@functools.lru_cache(maxsize=1)
def _variants():
    from refopt.reference import variants

    return variants


@functools.lru_cache(maxsize=1024)
def _lr_value(dtype, learning_rate, conv):
    """The learning rate as the convention holds it (cached: a constant rate repeats)."""
    with np.errstate(all="ignore"):
        return _variants().lr_value(dtype, learning_rate, conv)


def _pow_functions():
    from refopt import _libm

    if not _libm.HAVE_LIBM:
        return {}
    return {np.dtype(np.float32): _libm._C["powf"], np.dtype(np.float64): _libm._C["pow"]}


#: The C library's powf/pow by dtype (what tf.pow calls), or empty without it.
_POW = _pow_functions()


@functools.lru_cache(maxsize=256)
def _adam_static(dtype, conv, beta_1, beta_2, epsilon, amsgrad, optax_weight_decay, lazy_rows,
                 eps_root=None):
    """``(rule, scalars without the step's, flags, tail lanes, form, the betas as tf.cast
    gives them)``; form 3: SparseAdam."""
    from refopt.reference import variants as V

    sc = [0] * 14
    with np.errstate(all="ignore"):
        if lazy_rows and conv.lazy_update == "torch_sparse":
            sc[S_C1] = V.scalar(dtype, 1 - beta_1)
            sc[S_C2] = V.scalar(dtype, 1 - beta_2)
            sc[S_EPS] = V.scalar(dtype, epsilon)
            return SPARSE_ADAM, scalars(dtype, sc), flags([0]), 0, 3, None
        if lazy_rows and conv.lazy_update == "ema_rows":
            conv = conv.replace(moment_update="ema")
        one = V.scalar(dtype, 1)
        sc[S_C1] = V.one_minus(dtype, beta_1, conv)
        sc[S_C2] = V.one_minus(dtype, beta_2, conv)
        sc[S_B1] = V.beta(dtype, beta_1, conv)
        sc[S_B2] = V.beta(dtype, beta_2, conv)
        sc[S_EPS] = V.eps_value(dtype, epsilon, conv)
        sc[S_W1] = sc[S_C1] - one
        if optax_weight_decay is not None:
            sc[S_WD] = V.scalar(dtype, optax_weight_decay)
        if eps_root:
            sc[S_EPS_ROOT] = V.scalar(dtype, eps_root)
    moments_form = _MOMENTS[conv.moment_update]
    if moments_form == 3 and conv.optax_jit == "eager":
        moments_form = 1  # optax eager: (1-b)*g + b*m rounded op by op, as "ema" (same bits)
    lerp_low = abs(float(sc[S_C1])) < 0.5
    if conv.epsilon_placement == "hat":
        form = 0
    elif conv.bias_correction == "float64":
        form = 1
    else:
        form = 2
    fl = [form, moments_form, lerp_low, conv.amsgrad_maximum == "corrected",
          optax_weight_decay is not None, OPTAX_JIT[conv.optax_jit]]
    lanes = 32 // dtype.itemsize if (conv.moment_update == "torch_fma"
                                     and dtype.itemsize in (4, 8)) else 0
    from refopt.reference._common import tf_cast

    bases = (tf_cast(dtype, beta_1), tf_cast(dtype, beta_2))  # tf.pow's operands
    return AMSGRAD if amsgrad else ADAM, scalars(dtype, sc), flags(fl), lanes, form, bases


def tf_keras_call(dtype, *, learning_rate, beta_1, beta_2, epsilon, step, amsgrad, table=False):
    """The :class:`~refopt.rules.RuleCall` of :func:`refopt.reference.adam_update` (tf-keras'
    Adam): its scalars are :func:`refopt.reference.adam_scalars` (the reference's own
    rounding, checks and errors), the epsilon-hat form with Keras' moments; ``table``: the
    whole-table sparse rule (an ``IndexedSlices`` gradient)."""
    from refopt.reference.adam import adam_scalars

    s = adam_scalars(dtype, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, step=step)
    sc = [0] * 13
    sc[S_ALPHA], sc[S_C1], sc[S_C2], sc[S_EPS] = (s.alpha, s.one_minus_beta_1,
                                                  s.one_minus_beta_2, s.epsilon)
    sc.append(0)  # S_EPS_ROOT
    if table:
        rule = AMSGRAD_TABLE if amsgrad else ADAM_TABLE
    else:
        rule = AMSGRAD if amsgrad else ADAM
    return RuleCall(rule, scalars(dtype, sc), flags([0, _MOMENTS["keras"]]))


def pure_update(apply, apply_sparse, param, grad, m, v, vhat, *, learning_rate, beta_1,
                beta_2, epsilon, step, lazy=False):
    """:func:`refopt.reference.adam_update` (``lazy``: :func:`~refopt.reference.lazy_adam_update`
    with an ``IndexedSlices``) computed by these rules with a backend's one-tensor drivers
    (``apply(call, param, grad, slots)`` and ``apply_sparse(call, param, grad, slots, lazy)``,
    both returning ``(param, slots)``): the reference's own argument checks, then one step:
    dense, the present rows (lazy) or the whole table; returns an ``AdamResult``."""
    from refopt.indexed_slices import IndexedSlices
    from refopt.reference._common import as_float_array, check_grad, check_like
    from refopt.reference.adam import AdamResult

    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    sparse = isinstance(grad, IndexedSlices)
    call = tf_keras_call(param.dtype, learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon, step=step, amsgrad=vhat is not None,
                         table=sparse and not lazy)
    slots = [m, v] + ([vhat] if vhat is not None else [])
    with np.errstate(all="ignore"):
        if sparse:
            p, out = apply_sparse(call, param, grad, slots, lazy)
        else:
            p, out = apply(call, param, grad, slots)
    return AdamResult(p, out[0], out[1], out[2] if vhat is not None else None)
