"""Nadam (Adam with Nesterov momentum), dense and sparse, as each framework computes it
(``Convention.nadam_form``).

Nadam keeps Adam's two slots, the first moment ``m`` and the second moment ``v``, and replaces
Adam's bias-corrected ``m`` by a Nesterov look-ahead weighted by a *momentum schedule*. The
frameworks agree on that and on little else. Keras 3 and tf.keras 2.11+ take
``mu_t = beta_1 * (1 - 0.5 * 0.96**t)``; Keras 2 (legacy) and PyTorch take Dozat's
``0.96**(0.004 * t)`` (PyTorch's ``momentum_decay``); optax's ``nadam`` has no schedule at all
(it is ``adam(nesterov=True)``). Each keeps the running product of the schedule (Keras'
``_u_product``, Keras 2's ``momentum_cache``: one scalar per optimizer, in the dtype of the
first variable; PyTorch's ``mu_product``: one float32 scalar per parameter) and rounds it and
the other scalars in its own way. :func:`nadam_update` writes each of them out as readable
NumPy in the variable dtype with the rounding points of the framework; the Notes of its
docstring give the forms.

The momentum product is not a slot here: it is a function of the step count (its value after
step ``t`` is the product of the schedule over steps ``1..t``, rounded as the framework
rounds it), computed by :func:`momentum_product` and memoised. refopt checkpoints the step
counts (``iterations``, and PyTorch's per-parameter steps), so a resumed run is bit-identical.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/nadam.py`` (``Nadam.build``, ``update_step``: the
            ``_u_product`` update under ``tf.cond`` in the first variable's step; dense and
            ``tf.IndexedSlices`` branches)
keras3      ``keras/src/optimizers/nadam.py`` (``build``, ``_backend_update_step``: the
            ``_u_product`` update once per apply; ``update_step``)
keras2      ``tf_keras/optimizers/legacy/nadam.py`` (``_prepare``, ``_prepare_local``,
            ``_resource_apply_dense``, ``_resource_apply_sparse``; ``decay`` = 0.004)
torch       ``torch/optim/nadam.py`` (``_single_tensor_nadam``, the default for-loop path
            on CPU)
optax       ``optax/_src/alias.py`` (``nadam = adam(nesterov=True)``),
            ``optax/_src/transform.py`` (``scale_by_adam``), under ``jax.jit`` on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    _EXTRA_DTYPES,
    as_float_array,
    check_grad,
    check_hyper,
    check_like,
    check_scalar,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.sqrt import sqrt_function
from refopt.reference.variants import fma, optax_apply

__all__ = [
    "NadamResult",
    "nadam_update",
    "nadam_defaults",
    "nadam_initial_state",
    "nadam_schedule",
    "momentum_product",
    "NadamSchedule",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

#: Keras 2's ``schedule_decay`` (the legacy constructor's hidden ``decay``): the exponent
#: factor of its momentum schedule, fixed here at the constructor's default.
KERAS2_SCHEDULE_DECAY = 0.004


class NadamResult(NamedTuple):
    """New arrays after one Nadam step: ``param``, ``m`` (the first moment: Keras'
    "momentum", torch's "exp_avg", optax's "mu") and ``v`` (the second moment: Keras'
    "velocity", torch's "exp_avg_sq", optax's "nu")."""

    param: np.ndarray
    m: np.ndarray
    v: np.ndarray


# The constructors' defaults. ``None``: the framework has no default (optax requires a
# learning rate) or no such argument (momentum_decay is PyTorch's).
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                     momentum_decay=None),
    "keras3": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                   momentum_decay=None),
    "keras2": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                   momentum_decay=None),
    "torch": dict(learning_rate=0.002, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                  momentum_decay=0.004),
    "optax": dict(learning_rate=None, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                  momentum_decay=None),
}


def _convention(convention):
    if convention is None:
        return get_convention("tf_keras")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf_keras), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def _form(conv):
    form = conv.nadam_form
    if form == "none":
        raise ValueError(
            f"convention={conv.name!r} has no Nadam ({conv.framework}); nadam_form='none'."
        )
    return form


def nadam_defaults(convention=None):
    """The framework's Nadam constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.nadam_form``.

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras; **0.002** PyTorch; None for optax, which requires
        one), ``beta_1`` 0.9, ``beta_2`` 0.999, ``epsilon`` (1e-7 Keras; **1e-8** PyTorch
        and optax) and ``momentum_decay`` (PyTorch's 0.004; None elsewhere: Keras 3 and
        tf_keras have no decay factor in the exponent, Keras 2 a fixed 0.004). Keras 2 also
        turns ``epsilon=0`` into 1e-7 (``epsilon or backend.epsilon()``); that substitution
        belongs to the optimizer, :func:`nadam_update` uses the epsilon it is given.
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def nadam_initial_state(param):
    """Fresh ``(m, v)`` for ``param``: zeros of its shape and dtype (every framework)."""
    param = as_float_array("param", param)
    return np.zeros_like(param), np.zeros_like(param)


# ----------------------------------------------------------------------- the momentum schedule
def _keras_mu(dtype, b1, t):
    """tf_keras / Keras 3 ``update_step``: ``tf.cast(beta_1) * (1 - 0.5 * pow(tf.cast(0.96),
    t))`` in ``dtype`` (both numbers through a float32 tensor)."""
    one, half = scalar(dtype, 1), scalar(dtype, 0.5)
    return tf_cast(dtype, b1) * (one - half * _libm.power(dtype, tf_cast(dtype, 0.96),
                                                          scalar(dtype, t)))


def _keras3_factor(dtype, b1, t):
    """Keras 3 ``_backend_update_step``: ``(u * beta_1) * (1 - 0.5 * 0.96**t)``, the Python
    floats converted straight to the product's dtype; returns ``(beta_1, schedule factor)``."""
    one, half = scalar(dtype, 1), scalar(dtype, 0.5)
    return scalar(dtype, b1), one - half * _libm.power(dtype, scalar(dtype, 0.96),
                                                        scalar(dtype, t))


def _keras2_mu(dtype, b1, t):
    """Keras 2 ``_prepare_local``: ``beta_1_t * (1 - 0.5 * pow(tf.cast(0.96), 0.004 * t))``
    (``beta_1_t`` a float32 hyperparameter variable cast to ``dtype``)."""
    one, half = scalar(dtype, 1), scalar(dtype, 0.5)
    exponent = scalar(dtype, KERAS2_SCHEDULE_DECAY) * scalar(dtype, t)
    return tf_cast(dtype, b1) * (one - half * _libm.power(dtype, tf_cast(dtype, 0.96),
                                                          exponent))


def _torch_mu(b1, psi, t):
    """PyTorch: ``beta1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))`` in Python floats."""
    return float(b1) * (1.0 - 0.5 * (0.96 ** (float(t) * float(psi))))


def _next_product(form, dtype, b1, psi, prev, t):
    """The stored product after step ``t`` from the one after ``t - 1``."""
    with np.errstate(all="ignore"):
        if form == "keras3":
            beta, factor = _keras3_factor(dtype, b1, t)
            return (prev * beta) * factor
        if form == "tf_keras":
            return prev * _keras_mu(dtype, b1, t)
        if form == "keras2":
            return prev * _keras2_mu(dtype, b1, t)
        # torch: a float32 tensor times a Python float: the float rounded to float32 first
        return np.float32(prev * np.float32(_torch_mu(b1, psi, t)))


_PRODUCTS = {}
_PRODUCTS_LOCK = threading.Lock()
_MAX_KEYS = 256  # distinct (form, dtype, beta_1, momentum_decay) memoised at once


def momentum_product(step, *, beta_1=0.9, convention=None, dtype=np.float32,
                     momentum_decay=None):
    """The framework's stored momentum product after ``step`` steps (1 before the first).

    Parameters
    ----------
    step : int
        The number of steps taken, >= 0.
    beta_1 : float
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.nadam_form`` (optax has no product:
        ValueError).
    dtype : numpy dtype
        The product's dtype: the dtype of the optimizer's *first* variable for the Keras
        forms (``var_list[0].dtype`` at build); ignored for torch, whose ``mu_product`` is a
        float32 tensor (``torch.get_default_dtype()``; a float64 default is not reproduced).
    momentum_decay : float or None
        PyTorch's ``momentum_decay`` (None: 0.004); must be None for the other forms.

    Returns
    -------
    numpy.floating
        Keras 3's ``_u_product``: ``u <- (u * beta_1) * (1 - 0.5*0.96**t)`` once per step,
        the numbers converted straight to ``dtype``; tf_keras' ``_u_product``:
        ``u <- u * mu_t`` with ``mu_t`` as in its ``update_step`` (``beta_1`` and 0.96
        through float32); Keras 2's ``momentum_cache``: ``c <- c * mu_t`` with Dozat's
        exponent ``0.004*t``; PyTorch's ``mu_product``: ``p <- float32(p * float32(mu_t))``
        with ``mu_t`` in float64. Memoised: a call costs O(1) after the first at a larger
        step.
    """
    conv = _convention(convention)
    form = _form(conv)
    if form == "optax":
        raise ValueError("optax's nadam has no momentum schedule (nadam_form='optax').")
    if (not isinstance(step, (int, np.integer)) or isinstance(step, (bool, np.bool_))
            or step < 0):
        raise ValueError(f"`step` must be an integer >= 0. Received: step={step!r}")
    check_scalar("beta_1", beta_1)
    if form == "torch":
        psi = 0.004 if momentum_decay is None else float(check_scalar("momentum_decay",
                                                                      momentum_decay))
        dtype = _F32
    else:
        if momentum_decay is not None:
            raise ValueError(
                "`momentum_decay` is PyTorch's option; the other frameworks' Nadam has none. "
                f"Received: momentum_decay={momentum_decay!r} with nadam_form={form!r}")
        psi = None
        dtype = np.dtype(dtype)
        if dtype not in (_F16, _F32, _F64) and dtype not in _EXTRA_DTYPES.get():  # bf16 step
            raise TypeError(
                f"`dtype` must be float16, float32 or float64. Received: dtype={dtype}")
    key = (form, dtype.str, float(beta_1), psi)
    with _PRODUCTS_LOCK:
        seq = _PRODUCTS.get(key)
        if seq is None:
            if len(_PRODUCTS) >= _MAX_KEYS:
                _PRODUCTS.clear()
            seq = _PRODUCTS[key] = [dtype.type(1)]
        while len(seq) <= step:
            seq.append(_next_product(form, dtype, float(beta_1), psi, seq[-1], len(seq)))
        return seq[step]


class NadamSchedule(NamedTuple):
    """The scalars of one Nadam step (see :func:`nadam_schedule`)."""

    mu: object
    mu_next: object
    product: object
    product_next: object


def nadam_schedule(step, *, beta_1, convention=None, dtype=np.float32, product_dtype=None,
                   momentum_decay=None):
    """The momentum schedule of step ``step`` as a variable of ``dtype`` sees it.

    Returns
    -------
    NadamSchedule
        ``mu`` (:math:`\\mu_t`), ``mu_next`` (:math:`\\mu_{t+1}`), ``product`` (the stored
        product after this step, :math:`\\Pi_t`) and ``product_next``
        (:math:`\\Pi_t \\mu_{t+1}`) as the form uses them: numbers of ``dtype`` for the Keras
        forms (the product computed in ``product_dtype``, default ``dtype``, and cast), Python
        floats for PyTorch (the float32 product read with ``.item()``). Keras 2's
        ``product`` is :math:`\\Pi_{t-1}` cast to ``dtype`` times :math:`\\mu_t` in ``dtype``.
    """
    conv = _convention(convention)
    form = _form(conv)
    dtype = np.dtype(dtype)
    pdt = dtype if product_dtype is None else np.dtype(product_dtype)
    b1 = float(beta_1)
    kw = dict(beta_1=beta_1, convention=conv, momentum_decay=momentum_decay)
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3"):
            mu, mu1 = _keras_mu(dtype, b1, step), _keras_mu(dtype, b1, step + 1)
            p = dtype.type(momentum_product(step, dtype=pdt, **kw))
            return NadamSchedule(mu, mu1, p, p * mu1)
        if form == "keras2":
            mu, mu1 = _keras2_mu(dtype, b1, step), _keras2_mu(dtype, b1, step + 1)
            p = dtype.type(momentum_product(step - 1, dtype=pdt, **kw)) * mu
            return NadamSchedule(mu, mu1, p, p * mu1)
        psi = 0.004 if momentum_decay is None else float(momentum_decay)
        mu, mu1 = _torch_mu(b1, psi, step), _torch_mu(b1, psi, step + 1)
        p = float(momentum_product(step, **kw))
        return NadamSchedule(mu, mu1, p, p * mu1)


# ----------------------------------------------------------------------------- the forms
def _keras(w, g, m, v, lr, b1, b2, eps, t, sch):
    """tf_keras and Keras 3 (dense): ``m + (g - m)(1 - b1)``, ``v + (g^2 - v)(1 - b2)``."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1d, b2d = tf_cast(dt, b1), tf_cast(dt, b2)
    m = m + (g - m) * (one - b1d)
    v = v + (np.square(g) - v) * (one - b2d)
    return _keras_apply(w, g, m, v, lr, b2d, eps, t, sch), m, v


def _keras_apply(w, g, m, v, lr, b2d, eps, t, sch):
    dt = w.dtype
    one = scalar(dt, 1)
    m_hat = (sch.mu_next * m) / (one - sch.product_next) + ((one - sch.mu) * g) / (
        one - sch.product)
    v_hat = v / (one - _libm.power(dt, b2d, scalar(dt, t)))
    return w - (m_hat * lr_cast(dt, lr)) / (np.sqrt(v_hat) + scalar(dt, eps))


def _tf_keras_sparse(w, grad, m, v, lr, b1, b2, eps, t, sch):
    """tf_keras' ``IndexedSlices`` branch: the moments decay on every row
    (``m + (-m)(1 - b1)``), the rows' ``g(1 - b1)`` are scatter-added, and the update is the
    dense formula on the densified gradient (every row moves)."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1d, b2d = tf_cast(dt, b1), tf_cast(dt, b2)
    c1, c2 = one - b1d, one - b2d
    rows, vals = grad.indices, grad.values
    m = m + (-m) * c1
    m[rows] = m[rows] + vals * c1
    v = v + (-v) * c2
    v[rows] = v[rows] + np.square(vals) * c2
    return _keras_apply(w, grad.to_dense(), m, v, lr, b2d, eps, t, sch), m, v


def _keras3_slices(w, grad, m, v, lr, b1, b2, eps, t, sch):
    """Keras 3's TF backend on raw ``tf.IndexedSlices`` (knob ``keras3_sparse_square``): the
    dense step, except that ``v`` gets the densified *squared slices* (the sum of the squares
    of duplicate rows, not the square of their sum) and the gradient's term of ``m_hat`` is
    computed per slice, then densified (summed) into the first term."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1d, b2d = tf_cast(dt, b1), tf_cast(dt, b2)
    g = grad.to_dense()
    sq = IndexedSlices(np.square(grad.values), grad.indices, grad.dense_shape).to_dense()
    m = m + (g - m) * (one - b1d)
    v = v + (sq - v) * (one - b2d)
    # the gradient's term is computed per slice and the slices are summed into the dense
    # first term (a row with duplicates gets the sum of their terms, not the term of their sum)
    term = IndexedSlices(((one - sch.mu) * grad.values) / (one - sch.product), grad.indices,
                         grad.dense_shape).to_dense()
    m_hat = (sch.mu_next * m) / (one - sch.product_next) + term
    v_hat = v / (one - _libm.power(dt, b2d, scalar(dt, t)))
    return w - (m_hat * lr_cast(dt, lr)) / (np.sqrt(v_hat) + scalar(dt, eps)), m, v


def _keras2(w, g, m, v, lr, b1, b2, eps, t, sch):
    """Keras 2 legacy ``_resource_apply_dense``."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1d, b2d = tf_cast(dt, b1), tf_cast(dt, b2)
    g_prime = g / (one - sch.product)
    m = b1d * m + (one - b1d) * g
    m_prime = m / (one - sch.product_next)
    v = b2d * v + (one - b2d) * np.square(g)
    v_prime = v / (one - _libm.power(dt, b2d, scalar(dt, t)))
    m_bar = (one - sch.mu) * g_prime + sch.mu_next * m_prime
    w = w - (lr_cast(dt, lr) * m_bar) / (np.sqrt(v_prime) + scalar(dt, eps))
    return w, m, v


def _keras2_sparse(w, grad, m, v, lr, b1, b2, eps, t, sch):
    """Keras 2 legacy ``_resource_apply_sparse``: ``m*b1`` and ``v*b2`` on every row, the
    rows' ``g(1 - b1)`` and ``(g g)(1 - b2)`` scatter-added, the variable moves on the rows
    only (``w[rows] += (-lr * m_bar) / den``)."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1d, b2d = tf_cast(dt, b1), tf_cast(dt, b2)
    rows, g = grad.indices, grad.values
    g_prime = g / (one - sch.product)
    m = m * b1d
    m[rows] = m[rows] + g * (one - b1d)
    m_prime = m[rows] / (one - sch.product_next)
    m_bar = (one - sch.mu) * g_prime + sch.mu_next * m_prime
    v = v * b2d
    v[rows] = v[rows] + (g * g) * (one - b2d)
    v_prime = v[rows] / (one - _libm.power(dt, b2d, scalar(dt, t)))
    den = np.sqrt(v_prime) + scalar(dt, eps)
    w = w.copy()
    w[rows] = w[rows] + ((-lr_cast(dt, lr)) * m_bar) / den
    return w, m, v


def _lerp(start, end, weight):
    """PyTorch's ``start.lerp_(end, weight)`` on CPU: one FMA, branch on ``|weight| < 0.5``."""
    d = end - start
    if abs(float(weight)) < 0.5:
        return fma(weight, d, start)
    return fma(weight - weight.dtype.type(1), d, end)


def _torch(w, g, m, v, lr, b1, b2, eps, t, sch, sqrt=np.sqrt):
    """``_single_tensor_nadam`` (dense; weight decay applied by the caller); ``sqrt``: the
    convention's root (MKL's under ``sqrt="mkl"``, :mod:`refopt.reference.sqrt`)."""
    dt = w.dtype
    bc2 = 1.0 - float(b2) ** t
    m = _lerp(m, g, scalar(dt, 1.0 - float(b1)))
    v = fma(scalar(dt, 1.0 - float(b2)) * g, g, v * scalar(dt, b2))
    denom = sqrt(v / scalar(dt, bc2)) + scalar(dt, eps)
    lr = float(lr)
    c_g = -lr * (1.0 - sch.mu) / (1.0 - sch.product)
    c_m = (-lr * sch.mu_next) / (1.0 - sch.product_next)
    w = w + (scalar(dt, c_g) * g) / denom
    w = w + (scalar(dt, c_m) * m) / denom
    return w, m, v


def _optax(w, g, m, v, lr, b1, b2, eps, t, eps_root=None, weight_decay=None, jit="update"):
    """``scale_by_adam(nesterov=True)`` under ``jit`` (several leaves) and
    ``apply_updates``; ``eps_root`` inside the root, ``sqrt(nu_hat + eps_root)``;
    ``weight_decay``: ``optax.adamw(nesterov=True)``'s ``fma(w, wd, u)`` before ``-lr``.
    ``jit``: ``Convention.optax_jit`` (``"eager"``: no FMA, each operation rounded;
    ``"step"``: ``apply_updates`` fused into one FMA)."""
    dt = w.dtype
    work = _F64 if dt == _F64 else _F32
    one = scalar(dt, 1)
    b1d, b2d = scalar(dt, b1), scalar(dt, b2)
    c1, c2 = scalar(dt, 1 - b1), scalar(dt, 1 - b2)
    def bc(b, k):  # 1 - b**k: a float32 power (float64 with x64) of the int32 count
        if dt in _EXTRA_DTYPES.get():  # bfloat16 (bf16_generic): 1 - b**k in float32, cast
            return scalar(dt, work.type(1) - _libm.power(work, work.type(b), work.type(k)))
        return one - scalar(dt, _libm.power(work, work.type(b), work.type(k)))

    if jit == "eager":  # optax's expressions as written, each jnp operation rounded
        m = c1 * g + b1d * m
        v = c2 * (g * g) + b2d * v
        m_hat = b1d * (m / bc(b1, t + 1)) + c1 * (g / bc(b1, t))
        v_hat = v / bc(b2, t)
        if eps_root:
            v_hat = v_hat + scalar(dt, eps_root)
        u = m_hat / (np.sqrt(v_hat) + scalar(dt, eps))
        if weight_decay is not None:
            u = u + scalar(dt, weight_decay) * w
        return w + scalar(dt, -float(lr)) * u, m, v
    m = fma(c1, g, b1d * m)
    v = fma(c2, g * g, b2d * v)
    m_hat = fma(m / bc(b1, t + 1), b1d, (g / bc(b1, t)) * c1)
    v_hat = v / bc(b2, t)
    if eps_root:  # (+0 would change no bit of v_hat >= +0)
        v_hat = v_hat + scalar(dt, eps_root)
    u = m_hat / (np.sqrt(v_hat) + scalar(dt, eps))
    if weight_decay is not None:
        u = fma(w, scalar(dt, weight_decay), u)
    return optax_apply(w, u, scalar(dt, -float(lr)), jit), m, v


def nadam_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                 convention=None, momentum_decay=None, product_dtype=None, eps_root=None):
    r"""One Nadam step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes); PyTorch and optax
        refuse them.
    m, v : ndarray like ``param``
        The first and second moments (zeros before the first step).
    learning_rate : float
        :math:`\eta`.
    beta_1, beta_2 : float
        :math:`\beta_1, \beta_2` in [0, 1).
    epsilon : float
        :math:`\epsilon`, used as given (see :func:`nadam_defaults`).
    step : int
        The 1-based step :math:`t` (PyTorch: this parameter's own count).
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.nadam_form`` ("none":
        ValueError).
    momentum_decay : float or None
        PyTorch's :math:`\psi` (None: 0.004); another form with a value raises ValueError.
    product_dtype : numpy dtype or None
        The dtype of the Keras forms' shared momentum product (the optimizer's first
        variable's dtype); None: ``param``'s.
    eps_root : float or None
        optax's ``eps_root``, inside the square root (:math:`\sqrt{\hat v + \epsilon_r}`),
        >= 0; None or 0: none. A nonzero value under another form raises ValueError.

    Returns
    -------
    NadamResult
        ``(param, m, v)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type; an IndexedSlices gradient under torch or optax.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a beta
        outside [0, 1), a negative epsilon or ``momentum_decay``; ``momentum_decay`` for a
        form other than torch; ``step`` not an integer >= 1; a convention without Nadam.
        Messages name the argument and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\eta_{32}` is the
    learning rate rounded to float32 and then to the dtype (Keras' float32 variable);
    :math:`\bar x` a Python number converted straight to the dtype, :math:`\tilde x` one
    converted through float32 (``tf.cast`` of a Python float); :math:`\mathrm{pow}` the C
    library's ``powf``/``pow`` as TensorFlow's CPU ``tf.pow``. :math:`\Pi_t` is the stored
    momentum product after step :math:`t` (:func:`momentum_product`), :math:`\Pi_0 = 1`.

    **keras3** (Keras 3 on TensorFlow) and **tf_keras** (tf.keras 2.11+), with
    :math:`\mu_k = \tilde\beta_1 (1 - 0.5\, \mathrm{pow}(\widetilde{0.96}, k))` in the dtype:

    .. math::

        m &\leftarrow m + (g - m)(1 - \tilde\beta_1), \qquad
        v \leftarrow v + (g^2 - v)(1 - \tilde\beta_2) \\
        \hat m &= \frac{\mu_{t+1} m}{1 - \Pi_t \mu_{t+1}}
                + \frac{(1 - \mu_t) g}{1 - \Pi_t}, \qquad
        \hat v = \frac{v}{1 - \mathrm{pow}(\tilde\beta_2, t)} \\
        w &\leftarrow w - (\hat m\, \eta_{32}) / (\sqrt{\hat v} + \bar\epsilon)

    The two differ only in :math:`\Pi_t`, a scalar Variable in the dtype of the first
    variable: Keras 3 updates it once per step, before any variable, as
    :math:`\Pi_t = (\Pi_{t-1} \bar\beta_1)(1 - 0.5\, \mathrm{pow}(\overline{0.96}, t))` (the
    Python floats converted **straight** to the dtype: in float64, 0.9 and 0.96 exactly,
    where the update step's :math:`\mu_t` uses their float32 roundings), tf_keras as
    :math:`\Pi_t = \Pi_{t-1} \mu_t`. Both cast it to each variable's dtype (tf_keras would
    raise for a variable of another dtype than the first; refopt casts). Keras 3's product
    starts at 1 when the optimizer is built, even when ``iterations`` was set before; refopt
    takes the product over steps ``1..t`` (the same whenever the run started at step 0 or was
    restored with its state).

    **keras2** (``tf.keras.optimizers.legacy.Nadam``; the exponent has Dozat's
    ``schedule_decay`` 0.004: :math:`\mu_k = \tilde\beta_1 (1 - 0.5\,
    \mathrm{pow}(\widetilde{0.96}, \overline{0.004}\, k))`; :math:`S = \Pi_{t-1} \mu_t`
    (the ``momentum_cache`` of the first variable's dtype, cast, times :math:`\mu_t`),
    :math:`S' = S \mu_{t+1}`; epsilon 0 means 1e-7 in the optimizer):

    .. math::

        g' &= g / (1 - S), \qquad m \leftarrow \tilde\beta_1 m + (1 - \tilde\beta_1) g,
        \qquad v \leftarrow \tilde\beta_2 v + (1 - \tilde\beta_2) g^2 \\
        \bar m &= (1 - \mu_t) g' + \mu_{t+1} \frac{m}{1 - S'}, \qquad
        w \leftarrow w - (\eta_{32} \bar m) / \Big(\sqrt{v / (1 - \mathrm{pow}(\tilde\beta_2,
        t))} + \bar\epsilon\Big)

    **torch** (``torch.optim.NAdam``, the single-tensor for-loop path on CPU; the scalars
    :math:`\mu_k = \beta_1 (1 - 0.5 \cdot 0.96^{k\psi})`, :math:`b = 1 - \beta_2^t`,
    :math:`c_g = -\eta (1 - \mu_t) / (1 - P)` and :math:`c_m = -\eta \mu_{t+1} / (1 - P
    \mu_{t+1})` in Python floats, :math:`P` the float32 ``mu_product``
    :math:`\Pi_t = \mathrm{f32}(\Pi_{t-1} \cdot \mathrm{f32}(\mu_t))` read as a float;
    L2 or decoupled weight decay before, by the optimizer):

    .. math::

        m &\leftarrow \mathrm{lerp}(m, g, \overline{1 - \beta_1}), \qquad
        v \leftarrow \mathrm{fma}(\overline{1 - \beta_2}\, g, g, v \bar\beta_2), \qquad
        d = \sqrt{v / \bar b} + \bar\epsilon \\
        w &\leftarrow w + (\bar c_g\, g) / d, \qquad w \leftarrow w + (\bar c_m\, m) / d

    (``lerp`` is one FMA, branch on the weight: :math:`\mathrm{fma}(w, g - m, m)` for
    :math:`w < 0.5`). torch's CPU ``sqrt`` (MKL's vector math) is not correctly rounded
    (about 17% of float32 results 1 ulp off); the golden cases carry that tolerance.
    The ``mu_product`` is float32 even for float64 parameters (torch's scalar dtype).

    **optax** (``optax.nadam`` = ``adam(nesterov=True)``: **no momentum schedule**; under
    ``jax.jit`` with several leaves, where XLA:CPU contracts the moment updates and the
    Nesterov sum into FMAs; :math:`B_k = 1 - \mathrm{pow}(\beta, k)` in float32, float64 with
    x64):

    .. math::

        m &\leftarrow \mathrm{fma}(\overline{1 - \beta_1}, g, \bar\beta_1 m), \qquad
        v \leftarrow \mathrm{fma}(\overline{1 - \beta_2}, g g, \bar\beta_2 v) \\
        \hat m &= \mathrm{fma}(m / B^{(1)}_{t+1}, \bar\beta_1,
                              (g / B^{(1)}_t)\, \overline{1 - \beta_1}), \qquad
        w \leftarrow w + \big(\hat m / (\sqrt{v / B^{(2)}_t} + \bar\epsilon)\big)
                         \,\overline{-\eta}

    With a single leaf XLA multiplies by the reciprocals of the :math:`B` instead (not
    reproduced: ulp-level).

    **Sparse gradients** (:class:`~refopt.IndexedSlices`, duplicate indices summed first,
    in order of appearance): tf_keras decays the moments on every row
    (:math:`m + (-m)(1-\tilde\beta_1)`), scatter-adds the rows'
    :math:`g(1-\tilde\beta_1)` and :math:`g^2(1-\tilde\beta_2)`, and applies its dense
    update to the densified gradient: every row moves. Keras 2 multiplies the moments of
    every row by :math:`\tilde\beta`, scatter-adds the rows' terms, and moves the variable
    on the present rows only. Keras 3 applies its dense step to the summed gradient; with
    the convention knob ``keras3_sparse_square`` (Keras 3's actual handling of *unsummed*
    duplicates) :math:`v` gets the sum of the squared slices instead of the square of their
    sum. PyTorch's NAdam and optax take no sparse gradient (TypeError).

    Where the forms differ, in short: the schedule's exponent (:math:`t`: Keras 3, tf_keras;
    :math:`0.004 t`: Keras 2; :math:`\psi t`: PyTorch; no schedule: optax); the product's
    rounding (Keras 3 and tf_keras multiply in another order; Keras 2 in the first variable's
    dtype; PyTorch in float32 whatever the parameter); the moments' form (Keras
    ``m + (g-m)(1-b)``, Keras 2 ``b m + (1-b) g``, PyTorch ``lerp``/``addcmul``, optax FMA);
    Keras 2's division of :math:`g` by :math:`1 - S` before the sum; PyTorch's two separate
    additions into :math:`w` with epsilon outside the bias-corrected root and
    :math:`\hat v` divided before the root; the defaults (PyTorch lr 0.002, epsilon 1e-8).

    float16: every form is evaluated with each operation rounded to float16; the FMA steps
    round once from float64. Not checked against torch or optax.

    Examples
    --------
    One step of ``loss = w**2 / 2`` (so ``g = w``) from ``w = 1``, as
    ``keras.optimizers.Nadam(learning_rate=0.1)`` computes it (``m_hat`` = 1.0628 > ``g``:
    the look-ahead adds ``mu_2 m / (1 - mu_1 mu_2)`` to the corrected gradient):

    >>> import numpy as np
    >>> w = np.array([1.0], np.float32)
    >>> m, v = nadam_initial_state(w)
    >>> r = nadam_update(w, w.copy(), m, v, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
    ...                  epsilon=1e-7, step=1, convention="keras3")
    >>> r.param
    array([0.8937212], dtype=float32)

    References
    ----------
    Dozat, "Incorporating Nesterov Momentum into Adam", ICLR 2016 workshop.
    """
    param, grad, m, v, form = check_nadam_args(
        param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, step=step, convention=convention, momentum_decay=momentum_decay,
        eps_root=eps_root)
    conv = _convention(convention)
    args = (learning_rate, beta_1, beta_2, epsilon, step)
    with np.errstate(all="ignore"):
        if form == "optax":
            w, m_new, v_new = _optax(param, grad, m, v, *args, eps_root,
                                     jit=conv.optax_jit)
            return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))
        sch = nadam_schedule(step, beta_1=beta_1, convention=conv, dtype=param.dtype,
                             product_dtype=product_dtype, momentum_decay=momentum_decay)
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and conv.keras3_sparse_square:
                w, m_new, v_new = _keras3_slices(param, grad, m, v, *args, sch)
                return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))
            grad = grad.deduplicate()
            if form == "tf_keras":
                w, m_new, v_new = _tf_keras_sparse(param, grad, m, v, *args, sch)
                return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))
            if form == "keras2":
                w, m_new, v_new = _keras2_sparse(param, grad, m, v, *args, sch)
                return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))
            grad = grad.to_dense()  # Keras 3: its dense step on the summed gradient
        if form == "torch":  # the convention's root (knob `sqrt`: MKL's, torch.sqrt on CPU)
            w, m_new, v_new = _torch(param, grad, m, v, *args, sch, sqrt=sqrt_function(conv))
            return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))
        fn = {"tf_keras": _keras, "keras3": _keras, "keras2": _keras2}[form]
        w, m_new, v_new = fn(param, grad, m, v, *args, sch)
    return NadamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))


def check_nadam_args(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                     convention, momentum_decay, eps_root=None):
    """Validate :func:`nadam_update`'s arguments (its Raises section); return
    ``(param, grad, m, v, form)``. Shared with the fast backends' ``nadam_update`` so that
    they raise the same errors."""
    param = as_float_array("param", param)
    conv = _convention(convention)
    form = _form(conv)
    if isinstance(grad, IndexedSlices) and form in ("torch", "optax"):
        raise TypeError(
            f"{'PyTorch' if form == 'torch' else 'optax'}'s Nadam takes no sparse gradient; "
            "pass grad.to_dense(). Received: grad of type IndexedSlices with "
            f"nadam_form={form!r}"
        )
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    check_hyper("learning_rate", learning_rate)
    for name, b in (("beta_1", beta_1), ("beta_2", beta_2)):
        check_hyper(name, b)
        if not 0 <= b < 1:
            raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={b!r}")
    check_hyper("epsilon", epsilon)
    if not epsilon >= 0:
        raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon!r}")
    if momentum_decay is not None:
        check_scalar("momentum_decay", momentum_decay)
        if form != "torch":
            raise ValueError(
                "`momentum_decay` is PyTorch's option; the other frameworks' Nadam has none. "
                f"Received: momentum_decay={momentum_decay!r} with nadam_form={form!r}"
            )
        if not (momentum_decay >= 0 and math.isfinite(momentum_decay)):
            raise ValueError(
                f"`momentum_decay` must be finite and >= 0. Received: "
                f"momentum_decay={momentum_decay!r}")
    if eps_root is not None:
        check_hyper("eps_root", eps_root)
        if not (eps_root >= 0 and math.isfinite(eps_root)):
            raise ValueError(f"`eps_root` must be finite and >= 0. Received: eps_root={eps_root!r}")
        if eps_root and form != "optax":
            raise ValueError(
                "`eps_root` is optax's option; the other frameworks' Nadam has none. "
                f"Received: eps_root={eps_root!r} with nadam_form={form!r}")
    check_step(step)
    return param, grad, m, v, form
