"""Lion, dense and sparse, as each framework computes it (``Convention.lion_form``).

Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms") keeps one slot, the
momentum ``m``, and moves every element by exactly the learning rate in the direction of the
sign of an interpolation of ``m`` and the gradient. The frameworks that have it (Keras 3,
tf_keras 2.11+, optax; PyTorch has none) agree on the rule and differ in rounding: Keras
casts ``beta`` to the variable dtype first (through float32, as ``tf.cast`` of a Python float)
and rounds ``1 - beta`` there, optax rounds the Python ``1 - b`` once and lets XLA contract
``(1-b)*g + b*m`` into one FMA; Keras' weight decay is its decoupled step, optax's is added to
the sign inside the update (default 1e-3); XLA's ``sign`` keeps ``-0.0`` where TensorFlow's
gives ``+0.0``; and tf_keras' sparse branch uses ``m`` as a buffer and divides by ``beta_1``.
:func:`lion_update` writes each of them out as readable NumPy in the variable dtype.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/lion.py`` (``Lion.update_step``, dense and
            ``tf.IndexedSlices`` branches)
keras3      ``keras/src/optimizers/lion.py`` (``update_step``), on the TensorFlow backend
optax       ``optax/_src/alias.py`` (``lion``), ``optax/_src/transform.py``
            (``scale_by_lion``), ``optax/transforms/_adding.py`` (``add_decayed_weights``),
            ``optax/tree_utils/_tree_math.py`` (``tree_update_moment``), under ``jax.jit``
            on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_grad,
    check_hyper,
    check_like,
    check_real,
    check_scalar,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.variants import fma, optax_apply

__all__ = [
    "LionResult",
    "lion_update",
    "lion_defaults",
    "lion_initial_state",
    "check_lion_args",
]

_FORMS = ("tf_keras", "keras3", "optax")


class LionResult(NamedTuple):
    """New arrays after one Lion step: ``param`` and ``m`` (the momentum: Keras'
    ``momentums``, optax's ``mu``)."""

    param: np.ndarray
    m: np.ndarray


# The constructors' defaults. ``learning_rate`` None: optax's lion requires one.
# ``weight_decay``: Keras' base-class decoupled decay is off (None); optax's lion chains
# ``add_decayed_weights(1e-3)`` unless told otherwise.
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.99, weight_decay=None),
    "keras3": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.99, weight_decay=None),
    "optax": dict(learning_rate=None, beta_1=0.9, beta_2=0.99, weight_decay=1e-3),
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
    form = conv.lion_form
    if form not in _FORMS:
        raise ValueError(
            f"Lion does not exist under convention={conv.name!r} (lion_form={form!r}; "
            "PyTorch, Keras 2 and TF1 have no Lion). Received: "
            f"convention={conv.name!r}"
        )
    return form


def lion_defaults(convention=None):
    """The framework's Lion constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.lion_form`` (an error for ``"none"``).

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras; None for optax, which requires one), ``beta_1`` 0.9,
        ``beta_2`` 0.99 and ``weight_decay`` (None for Keras: no decay; **1e-3** for optax,
        whose ``lion`` adds ``1e-3 * w`` to the sign unless told otherwise).
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def lion_initial_state(param):
    """A fresh momentum for ``param``: zeros of its shape and dtype (every framework)."""
    param = as_float_array("param", param)
    return np.zeros(param.shape, param.dtype)


def _tf_sign(x):
    """``tf.math.sign``: -1, +0 or +1 (``+0.0`` for ``-0.0``), NaN for NaN."""
    return np.sign(x)


def _xla_sign(x):
    """XLA's ``sign`` (``jnp.sign`` under ``jit``): -1 or +1, and ``x`` itself where it is
    zero (``-0.0`` stays ``-0.0``) or NaN."""
    return np.where((x == 0) | np.isnan(x), x, np.sign(x))


def _keras(w, g, m, lr, b1, b2):
    """Keras 3 and tf_keras dense: ``w -= lr*sign(m*b1 + g*(1-b1))``, ``m = m*b2 +
    g*(1-b2)``, with ``b`` cast through float32 and ``1 - b`` rounded in the dtype."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1, b2 = tf_cast(dt, b1), tf_cast(dt, b2)
    lr = lr_cast(dt, lr)
    u = _tf_sign(m * b1 + g * (one - b1))
    return w - lr * u, m * b2 + g * (one - b2)


def _tf_keras_slices(w, grad, m, lr, b1, b2):
    """tf_keras' ``IndexedSlices`` branch (duplicates already summed): ``m`` as a buffer,
    every row of ``w`` moves."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1, b2 = tf_cast(dt, b1), tf_cast(dt, b2)
    lr = lr_cast(dt, lr)
    rows, vals = grad.indices, grad.values
    buf = m * b1  # m.assign(m * beta_1)
    buf[rows] = buf[rows] + vals * (one - b1)  # scatter_add (unique rows)
    w = w - lr * _tf_sign(buf)  # every row
    ratio = b2 / b1
    m = (buf * b2) / b1  # m.assign(m * beta_2 / beta_1)
    m[rows] = m[rows] + vals * (one - ratio)  # scatter_add(g * (1 - beta_2 / beta_1))
    return w, m


def _segment_sum(grad, factor):
    """``tf.convert_to_tensor`` of the slices ``grad.values * factor`` (raw, duplicates
    included): ``unsorted_segment_sum`` into zeros, each occurrence added in order."""
    out = np.zeros(grad.dense_shape, grad.dtype)
    for r, v in zip(grad.indices, grad.values * factor):
        out[r] = out[r] + v
    return out


def _keras3_slices(w, grad, m, lr, b1, b2):
    """Keras 3's TF backend on raw ``tf.IndexedSlices`` (knob ``keras3_sparse_square``):
    ``ops.multiply(slices, 1 - b)`` scales each occurrence, and ``ops.add(m*b, slices)``
    densifies them (a sum of the scaled occurrences, not the scaled sum)."""
    dt = w.dtype
    one = scalar(dt, 1)
    b1, b2 = tf_cast(dt, b1), tf_cast(dt, b2)
    u = _tf_sign(m * b1 + _segment_sum(grad, one - b1))
    return w - lr_cast(dt, lr) * u, m * b2 + _segment_sum(grad, one - b2)


def _optax(w, g, m, lr, b1, b2, wd, jit="update"):
    """``scale_by_lion`` then ``add_decayed_weights`` then ``scale_by_learning_rate`` under
    ``jit`` (``(1-b)*g + b*m`` contracted into one FMA), ``apply_updates`` outside.
    ``jit`` is ``Convention.optax_jit``: ``"eager"`` rounds every operation (no FMA),
    ``"step"`` fuses ``apply_updates`` into one FMA."""
    dt = w.dtype
    if jit == "eager":
        u = _xla_sign(scalar(dt, 1 - b1) * g + scalar(dt, b1) * m)
        m = scalar(dt, 1 - b2) * g + scalar(dt, b2) * m
        if wd is not None and wd != 0:
            u = u + scalar(dt, wd) * w
        return w + scalar(dt, -float(lr)) * u, m
    x = fma(scalar(dt, 1 - b1), g, scalar(dt, b1) * m)
    u = _xla_sign(x)
    m = fma(scalar(dt, 1 - b2), g, scalar(dt, b2) * m)
    if wd is not None and wd != 0:  # optax skips a Python-float 0 decay entirely
        u = fma(scalar(dt, wd), w, u)
    return optax_apply(w, u, scalar(dt, -float(lr)), jit), m


def lion_update(param, grad, m, *, learning_rate, beta_1=0.9, beta_2=0.99, convention=None,
                weight_decay=None):
    r"""One Lion step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes); optax refuses it.
    m : ndarray like ``param``
        The momentum; a fresh one is zeros (:func:`lion_initial_state`).
    learning_rate : float
        :math:`\eta`.
    beta_1, beta_2 : float, default 0.9, 0.99
        :math:`\beta_1` (interpolation for the sign) and :math:`\beta_2` (the momentum's
        decay).
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.lion_form``.
    weight_decay : float or None
        optax's decay :math:`\lambda`, inside the update (``None`` or ``0``: none, as
        optax skips a zero). Keras' ``weight_decay`` is its decoupled step before the update
        (:func:`refopt.reference.apply_weight_decay`), not an argument here: a Keras form
        with a weight decay raises ValueError.

    Returns
    -------
    LionResult
        ``(param, m)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type; an IndexedSlices gradient under optax.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a
        convention without Lion (``lion_form="none"``); ``weight_decay`` negative or given
        to a Keras form. Messages name the argument and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\eta_{32}` is the
    learning rate rounded to float32 and then to the dtype (Keras' float32 variable);
    :math:`\beta^{32}` a beta converted as ``tf.cast`` converts a Python float (through
    float32: ``0.8999999761581421`` in float64); :math:`\bar x` a Python number converted
    straight to the dtype.

    **tf_keras** and **keras3** (the same dense step; ``1 - beta`` rounded in the dtype,
    ``0.100000024`` and ``0.00999999`` in float32):

    .. math::

        w \leftarrow w - \eta_{32}\,\mathrm{sign}\big(m \beta_1^{32} + g (1 - \beta_1^{32})\big),
        \qquad m \leftarrow m \beta_2^{32} + g (1 - \beta_2^{32})

    with TensorFlow's ``sign`` (:math:`+0` for :math:`\pm 0`, NaN for NaN).

    **optax** (``optax.lion`` = ``scale_by_lion``, ``add_decayed_weights``,
    ``scale_by_learning_rate``, the update under ``jax.jit``, ``apply_updates`` outside):

    .. math::

        u = \mathrm{sign}_{\mathrm{XLA}}\big(\mathrm{fma}(\overline{1-\beta_1}, g,
        \bar\beta_1 m)\big), \quad
        m \leftarrow \mathrm{fma}(\overline{1-\beta_2}, g, \bar\beta_2 m), \quad
        u \leftarrow \mathrm{fma}(\bar\lambda, w, u), \quad
        w \leftarrow w + \overline{-\eta}\, u

    where XLA's ``sign`` returns a zero (:math:`-0` included) or NaN unchanged; the decay
    line is skipped for :math:`\lambda = 0` (optax skips a constant zero). optax's default
    :math:`\lambda` is **1e-3** (:func:`lion_defaults`), Keras' none.

    **Sparse gradients** (duplicate indices summed first, as tf_keras' optimizer does):
    tf_keras' branch is **not** lazy and not the dense formula: with :math:`R` the present
    rows,

    .. math::

        b \leftarrow m \beta_1^{32};\ b_R \leftarrow b_R + g_R (1 - \beta_1^{32}); \quad
        w \leftarrow w - \eta_{32}\,\mathrm{sign}(b) \text{ (every row)}; \quad
        m \leftarrow (b \beta_2^{32}) / \beta_1^{32};\
        m_R \leftarrow m_R + g_R (1 - \beta_2^{32}/\beta_1^{32})

    (equal to the dense step in exact arithmetic, not in rounding: every row's momentum is
    multiplied by :math:`\beta_2` and divided by :math:`\beta_1`, and a row without a
    gradient still moves by :math:`\eta\,\mathrm{sign}(m)`). Keras 3 applies its dense
    formula to the slices, which on the summed gradient is the dense step on
    ``grad.to_dense()`` (what this function does); with the convention knob
    ``keras3_sparse_square`` (Keras 3's handling of *unsummed* duplicates) each occurrence
    is scaled first, :math:`m \beta + \sum_i g_i (1 - \beta)` summed from zero in order
    (``tf.convert_to_tensor`` of the scaled slices), not :math:`(\sum_i g_i)(1 - \beta)`.
    optax takes no sparse gradient.

    float16: every form is evaluated with each operation rounded to float16; not checked
    against a framework.

    Examples
    --------
    One step from ``m = 0``: every element moves by the learning rate against the sign of
    its gradient (``keras.optimizers.Lion(learning_rate=0.1)``):

    >>> import numpy as np
    >>> w = np.array([1.0, -2.0, 0.5], np.float32)
    >>> g = np.array([0.3, -0.2, 0.0], np.float32)
    >>> r = lion_update(w, g, lion_initial_state(w), learning_rate=0.1)
    >>> r.param, r.m
    (array([ 0.9, -1.9,  0.5], dtype=float32), array([ 0.003, -0.002,  0.   ], dtype=float32))

    References
    ----------
    Chen et al., "Symbolic Discovery of Optimization Algorithms", NeurIPS 2023
    (arXiv:2302.06675).
    """
    param, grad, m, form = check_lion_args(
        param, grad, m, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        convention=convention, weight_decay=weight_decay)
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and _convention(convention).keras3_sparse_square:
                w, m_new = _keras3_slices(param, grad, m, learning_rate, beta_1, beta_2)
                return LionResult(np.asarray(w), np.asarray(m_new))
            grad = grad.deduplicate()
            if form == "tf_keras":
                w, m_new = _tf_keras_slices(param, grad, m, learning_rate, beta_1, beta_2)
                return LionResult(np.asarray(w), np.asarray(m_new))
            grad = grad.to_dense()
        if form == "optax":
            w, m_new = _optax(param, grad, m, learning_rate, beta_1, beta_2, weight_decay,
                              jit=_convention(convention).optax_jit)
        else:
            w, m_new = _keras(param, grad, m, learning_rate, beta_1, beta_2)
    return LionResult(np.asarray(w), np.asarray(m_new))


def check_lion_args(param, grad, m, *, learning_rate, beta_1, beta_2, convention,
                    weight_decay):
    """Validate :func:`lion_update`'s arguments (its Raises section); return
    ``(param, grad, m, form)``. Shared with the fast backends' ``lion_update`` so that they
    raise the same errors."""
    param = as_float_array("param", param)
    form = _form(_convention(convention))
    if isinstance(grad, IndexedSlices) and form == "optax":
        raise TypeError(
            "optax's lion takes no sparse gradient (JAX has no IndexedSlices); pass "
            "grad.to_dense(). Received: grad of type IndexedSlices with lion_form='optax'"
        )
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_hyper("learning_rate", learning_rate)
    check_real("beta_1", beta_1, low=0, high=1, low_open=True)  # as refopt.Lion
    check_real("beta_2", beta_2, low=0, high=1)
    if weight_decay is not None:
        check_scalar("weight_decay", weight_decay)
        if not weight_decay >= 0:
            raise ValueError(
                f"`weight_decay` must be >= 0. Received: weight_decay={weight_decay!r}")
        if form != "optax":
            raise ValueError(
                "Keras' Lion decays the weights in a separate step before the update "
                "(refopt.reference.apply_weight_decay); only optax's lion takes "
                f"`weight_decay` inside it. Received: weight_decay={weight_decay!r} with "
                f"lion_form={form!r}"
            )
    return param, grad, m, form
