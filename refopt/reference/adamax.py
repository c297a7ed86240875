"""Adamax, dense and sparse, as each framework computes it (``Convention.adamax_form``).

Adamax (Kingma & Ba, 2015, section 7.1) replaces Adam's second moment by an exponentially
weighted infinity norm ``u = max(beta_2*u, |g|)``; only the first moment is bias-corrected.
The frameworks agree on that and differ in where epsilon goes (added to ``u`` in the
denominator: Keras; inside the maximum, ``max(beta_2*u, |g| + eps)``, so stored in ``u``:
PyTorch and optax), in how the step is grouped and rounded (``(lr*m) / ((1 - b1^t)*(u +
eps))`` Keras, ``lr/(1 - b1^t) * (m/(u + eps))`` TensorFlow's ``ApplyAdaMax`` kernel,
``m * (-lr/(1 - b1^t)) / u`` PyTorch, ``-lr * m / ((1 - b1^t)*u)`` optax under ``jit``), in
the moment update (Keras' ``m + (g - m)(1 - b1)``, PyTorch's ``lerp`` and optax's
contraction, both one FMA), in ``beta**t`` and ``1 - beta`` rounding, in the defaults, and
in what a sparse gradient does (tf_keras: a non-lazy whole-table update; Keras 2: the present
rows only; Keras 3: its dense step on the slices; PyTorch and optax refuse it).
:func:`adamax_update` writes each of them out as readable NumPy in the variable dtype with the
rounding points of the framework; the Notes of its docstring give the forms.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/adamax.py`` (``Adamax.update_step``, dense and
            ``tf.IndexedSlices`` branches)
keras3      ``keras/src/optimizers/adamax.py`` (``update_step``), ``keras/src/backend/
            tensorflow/numpy.py`` and ``sparse.py`` (``subtract``, ``absolute``, ``maximum``
            on ``tf.IndexedSlices``)
keras2      ``tf_keras/optimizers/legacy/adamax.py`` (``ResourceApplyAdaMax``; the sparse
            branch in Python ops) and TensorFlow's ``core/kernels/training_ops.cc``
            (``ApplyAdaMax`` on CPU)
torch       ``torch/optim/adamax.py`` (``_single_tensor_adamax``, the default for-loop path
            on CPU)
optax       ``optax/_src/alias.py`` (``adamax``), ``optax/_src/transform.py``
            (``scale_by_adamax``), ``optax/tree_utils/_tree_math.py``
            (``tree_update_moment``, ``tree_update_infinity_moment``,
            ``tree_bias_correction``), under ``jax.jit`` on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_grad,
    check_hyper,
    check_like,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.variants import fma, optax_apply

__all__ = [
    "AdamaxResult",
    "adamax_update",
    "adamax_rows",
    "adamax_defaults",
    "adamax_initial_state",
    "adamax_scalars",
    "is_lazy_sparse",
    "check_adamax_args",
    "eigen_max",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


class AdamaxResult(NamedTuple):
    """New arrays after one Adamax step: ``param``, ``m`` (the first moment: torch's
    ``exp_avg``, optax's ``mu``) and ``u`` (the exponentially weighted infinity norm: Keras'
    ``u``, Keras 2's slot ``v``, torch's ``exp_inf``, optax's ``nu``)."""

    param: np.ndarray
    m: np.ndarray
    u: np.ndarray


# The constructors' defaults (optax requires a learning rate: None).
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    "keras3": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    "keras2": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7),
    "torch": dict(learning_rate=0.002, beta_1=0.9, beta_2=0.999, epsilon=1e-8),
    "optax": dict(learning_rate=None, beta_1=0.9, beta_2=0.999, epsilon=1e-8),
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
    form = conv.adamax_form
    if form == "none":
        raise ValueError(
            f"convention={conv.name!r} has no Adamax ({conv.framework}); "
            "Received: adamax_form='none'"
        )
    return form


def adamax_defaults(convention=None):
    """The framework's Adamax constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.adamax_form``.

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras; **0.002** PyTorch; None for optax, which requires
        one), ``beta_1`` 0.9, ``beta_2`` 0.999, ``epsilon`` (1e-7 Keras; **1e-8** PyTorch and
        optax). Keras 2 also turns ``epsilon=0`` into 1e-7 (``epsilon or
        backend.epsilon()``); that substitution belongs to the optimizer.

    Raises
    ------
    ValueError
        A convention whose ``adamax_form`` is ``"none"`` (TF1).
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def adamax_initial_state(param):
    """Fresh ``(m, u)`` for ``param``: new zero arrays of its shape and dtype (every
    framework starts both at zero)."""
    param = as_float_array("param", param)
    return np.zeros_like(param), np.zeros_like(param)


def is_lazy_sparse(convention=None):
    """Whether an IndexedSlices gradient moves only its rows (and their ``m`` and ``u``).

    True for Keras 2 only (the legacy optimizer's ``_resource_apply_sparse`` gathers,
    updates and scatters the present rows). tf_keras decays ``m`` and ``u`` on every row and
    updates the whole variable; Keras 3 applies its dense formula; PyTorch and optax refuse
    sparse gradients.
    """
    return _form(_convention(convention)) == "keras2"


# ----------------------------------------------------------------------------- scalars
def adamax_scalars(dtype, convention=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    """The step's scalars in ``dtype`` as the framework rounds them (a dict).

    Keys: ``lr`` (Keras: the float32 learning rate cast), ``c1`` (``1 - beta_1``), ``b1``,
    ``b2``, ``eps``, and the bias-corrected step scale: ``bc1`` (``1 - beta_1**t`` in the
    dtype: Keras, optax), ``scale`` (Keras 2's ``lr/(1 - b1^t)`` in the dtype) or
    ``neg_clr`` (PyTorch's ``-lr/(1 - b1^t)``, computed in float64 and rounded once), and
    ``neg_lr`` (optax's ``-lr``).
    """
    dt = np.dtype(dtype)
    form = _form(_convention(convention))
    out = {}
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3", "keras2"):
            lr = lr_cast(dt, learning_rate)
            # tf.pow(tf.cast(beta_1, dtype), tf.cast(t, dtype)): the C library's pow
            p1 = _libm.power(dt, tf_cast(dt, beta_1), scalar(dt, step))
            one = scalar(dt, 1)
            out.update(lr=lr, eps=scalar(dt, epsilon))
            if form == "keras2":
                # hyperparameters are float32 variables cast to the dtype; 1 - beta in dtype
                b1, b2 = tf_cast(dt, beta_1), tf_cast(dt, beta_2)
                out.update(b1=b1, b2=b2, c1=one - b1, scale=lr / (one - p1))
            else:
                out.update(b1=tf_cast(dt, beta_1), b2=scalar(dt, beta_2),
                           c1=scalar(dt, 1 - beta_1), bc1=one - p1)
        elif form == "torch":
            clr = float(learning_rate) / (1 - float(beta_1) ** step)
            out.update(c1=scalar(dt, 1 - beta_1), b2=scalar(dt, beta_2),
                       eps=scalar(dt, epsilon), neg_clr=scalar(dt, -clr))
        else:  # optax: decay**count with an int32 count: float32 (float64 under x64) pow
            work = _F64 if dt == _F64 else _F32
            p1 = _libm.power(work, work.type(beta_1), work.type(step))
            out.update(c1=scalar(dt, 1 - beta_1), b1=scalar(dt, beta_1),
                       b2=scalar(dt, beta_2), eps=scalar(dt, epsilon),
                       bc1=scalar(dt, work.type(1) - p1), neg_lr=scalar(dt, -float(learning_rate)),
                       jit=_convention(convention).optax_jit)
    return out


# ----------------------------------------------------------------------------- the forms
def _keras(w, g, m, u, s, abs_g=None):
    """tf_keras and Keras 3 (dense): ``abs_g`` replaces ``|g|`` (Keras 3's raw slices)."""
    m = m + (g - m) * s["c1"]
    u = np.maximum(s["b2"] * u, np.abs(g) if abs_g is None else abs_g)
    return w - (s["lr"] * m) / (s["bc1"] * (u + s["eps"])), m, u


def eigen_max(a, b):
    """Eigen's ``cwiseMax`` on the CPU (``std::max`` order: ``b if a < b else a``): where
    either side is NaN the result is ``a``, not NaN (``ApplyAdaMax``'s ``(b2*u).cwiseMax(
    |g|)`` keeps ``b2*u`` for a NaN gradient; ``tf.maximum`` propagates it)."""
    return np.where(a < b, b, a)


def _keras2(w, g, m, u, s):
    """TensorFlow's ``ApplyAdaMax`` kernel (Keras 2 legacy, dense)."""
    m = m + (g - m) * s["c1"]
    u = eigen_max(s["b2"] * u, np.abs(g))
    return w - s["scale"] * (m / (u + s["eps"])), m, u


def _keras2_rows(w, g, m, u, s):
    """Keras 2's sparse branch on the gathered rows (Python ops): ``m*b1 + g*(1 - b1)``, then
    the rows plus ``(-lr/(1 - b1^t)) * (m/(u + eps))`` (scatter-add)."""
    m = m * s["b1"] + g * s["c1"]
    u = np.maximum(u * s["b2"], np.abs(g))
    return w + (-s["scale"]) * (m / (u + s["eps"])), m, u


def _torch_lerp(m, g, c1):
    """``m.lerp_(g, c1)`` on CPU: one FMA, ``fma(c1, g - m, m)`` for ``|c1| < 0.5``, else
    ``fma(c1 - 1, g - m, g)``."""
    d = g - m
    if abs(float(c1)) < 0.5:
        return fma(c1, d, m)
    return fma(c1 - c1.dtype.type(1), d, g)


def _torch(w, g, m, u, s):
    """``_single_tensor_adamax``: ``lerp_``, ``maximum(u*b2, |g| + eps)``, ``addcdiv_``."""
    m = _torch_lerp(m, g, s["c1"])
    u = np.maximum(u * s["b2"], np.abs(g) + s["eps"])
    return w + (s["neg_clr"] * m) / u, m, u


def _optax(w, g, m, u, s):
    """``scale_by_adamax`` then ``scale_by_learning_rate`` under ``jit`` (XLA contracts
    ``(1-b1)*g + b1*m`` into one FMA and folds ``(m/bc1)/u`` into ``m/(bc1*u)``),
    ``apply_updates`` outside. ``s["jit"] == "eager"``: nothing jitted, ``(m/bc1)/u`` and
    ``-lr*u`` each rounded; ``"step"``: ``apply_updates`` fused, ``fma(u, -lr, w)``."""
    if s.get("jit") == "eager":
        m = s["c1"] * g + s["b1"] * m
        u = np.maximum(np.abs(g) + s["eps"], s["b2"] * u)
        return w + s["neg_lr"] * ((m / s["bc1"]) / u), m, u
    m = fma(s["c1"], g, s["b1"] * m)
    u = np.maximum(np.abs(g) + s["eps"], s["b2"] * u)
    return optax_apply(w, m / (s["bc1"] * u), s["neg_lr"], s.get("jit", "update")), m, u


def _dense(form, w, g, m, u, s, abs_g=None):
    if form in ("tf_keras", "keras3"):
        return _keras(w, g, m, u, s, abs_g)
    if form == "keras2":
        return _keras2(w, g, m, u, s)
    if form == "torch":
        return _torch(w, g, m, u, s)
    return _optax(w, g, m, u, s)


def adamax_rows(param_rows, grad_rows, m_rows, u_rows, *, learning_rate, beta_1, beta_2,
                epsilon, step, convention=None):
    """Keras 2's lazy sparse step on gathered rows (duplicates already summed): new
    ``(param_rows, m_rows, u_rows)``. Arrays of shape ``(rows, ...)``, checked by the caller.
    The only lazy form (:func:`is_lazy_sparse`); another form raises ValueError."""
    conv = _convention(convention)
    if not is_lazy_sparse(conv):
        raise ValueError(
            "Only Keras 2's Adamax updates the rows of a sparse gradient alone. Received: "
            f"adamax_form={conv.adamax_form!r}"
        )
    s = adamax_scalars(param_rows.dtype, conv, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step)
    with np.errstate(all="ignore"):
        w, m, u = _keras2_rows(param_rows, grad_rows, m_rows, u_rows, s)
    return np.asarray(w), np.asarray(m), np.asarray(u)


def _tf_keras_sparse(w, grad, m, u, s):
    """tf_keras' ``IndexedSlices`` branch (duplicates summed): ``m + (-m)(1-b1)`` on every row,
    then scatter-add of ``g(1-b1)``; ``u*b2`` on every row, then scatter-add of
    ``max(u_r, |g|) - u_r``; the whole variable updated as for a dense gradient."""
    rows, vals = grad.indices, grad.values
    m = m + (-m) * s["c1"]
    if rows.size:
        m[rows] = m[rows] + vals * s["c1"]
    u = u * s["b2"]
    if rows.size:
        ur = u[rows]
        u[rows] = ur + (np.maximum(ur, np.abs(vals)) - ur)
    return w - (s["lr"] * m) / (s["bc1"] * (u + s["eps"])), m, u


def adamax_update(param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step=1,
                  convention=None):
    r"""One Adamax step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes): non-lazy over the
        whole variable (tf_keras), on its rows only (Keras 2), as the dense step on the summed
        gradient (Keras 3), or refused (PyTorch, optax).
    m : ndarray like ``param``
        The first moment :math:`m` (zeros at the start: :func:`adamax_initial_state`).
    u : ndarray like ``param``
        The exponentially weighted infinity norm :math:`u` (zeros at the start).
    learning_rate : float
        :math:`\eta`.
    beta_1, beta_2 : float
        :math:`\beta_1, \beta_2`.
    epsilon : float
        :math:`\epsilon`, used as given (see :func:`adamax_defaults`; Keras 2's optimizer
        turns 0 into 1e-7 before calling this).
    step : int, default 1
        The 1-based step :math:`t` (PyTorch counts per parameter).
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.adamax_form``; ``"none"``
        (TF1) raises ValueError.

    Returns
    -------
    AdamaxResult
        ``(param, m, u)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type; an IndexedSlices gradient under PyTorch or optax.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a negative
        epsilon; ``step`` not an integer >= 1; a convention without Adamax. Messages name the
        argument and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\eta_{32}` is the
    learning rate rounded to float32 and then to the dtype (Keras' float32 variable);
    :math:`\bar x` a Python number converted straight to the dtype, :math:`\tilde x` one
    converted through float32 (``tf.cast`` of a Python float); :math:`p_t` is
    :math:`\tilde\beta_1^{\,t}` by the C library's ``pow``/``powf`` in the dtype.

    **tf_keras** and **keras3** (the same dense step; epsilon **added to** :math:`u` in the
    denominator):

    .. math::

        m \leftarrow m + (g - m)\,\overline{1-\beta_1}, \qquad
        u \leftarrow \max(\bar\beta_2 u, |g|), \qquad
        w \leftarrow w - (\eta_{32} m) / \big((1 - p_t)(u + \bar\epsilon)\big)

    **keras2** (Keras 2 legacy, TensorFlow's ``ApplyAdaMax`` kernel; its hyperparameters are
    float32 variables, so :math:`1 - \tilde\beta_1` is computed in the dtype):

    .. math::

        m \leftarrow m + (g - m)(1 - \tilde\beta_1), \qquad
        u \leftarrow \max(\tilde\beta_2 u, |g|), \qquad
        w \leftarrow w - \big(\eta_{32} / (1 - p_t)\big)\,\big(m / (u + \bar\epsilon)\big)

    where the maximum is Eigen's ``cwiseMax`` (:func:`eigen_max`): a NaN gradient leaves
    :math:`u = \tilde\beta_2 u` (golden case ``keras2/adamax_nonfinite_f32``).

    **torch** (``torch.optim.Adamax``, single-tensor for-loop path; epsilon **inside the
    maximum**, so it is stored in :math:`u`; :math:`c = \eta / (1 - \beta_1^t)` in Python
    floats):

    .. math::

        m \leftarrow \mathrm{lerp}(m, g, \overline{1-\beta_1}), \qquad
        u \leftarrow \max(u \bar\beta_2, |g| + \bar\epsilon), \qquad
        w \leftarrow w + (\overline{-c}\, m) / u

    with ``lerp`` one FMA: :math:`\mathrm{fma}(a, g - m, m)` for a weight :math:`a < 0.5`,
    else :math:`\mathrm{fma}(a - 1, g - m, g)`.

    **optax** (``optax.adamax`` = ``scale_by_adamax`` then ``scale_by_learning_rate``, under
    ``jax.jit`` on XLA:CPU; epsilon inside the maximum as PyTorch; :math:`q_t` is
    :math:`\beta_1^t` by ``powf`` in float32, ``pow`` in float64):

    .. math::

        m \leftarrow \mathrm{fma}(\overline{1-\beta_1}, g, \bar\beta_1 m), \qquad
        u \leftarrow \max(|g| + \bar\epsilon, \bar\beta_2 u), \qquad
        w \leftarrow w + \big(m / (\overline{1 - q_t}\, u)\big)\,\overline{-\eta}

    (XLA folds optax's ``(m / bc) / u`` into one division by the product).

    **Sparse gradients** (:class:`~refopt.IndexedSlices`; duplicate indices are summed first,
    from zero in order of appearance, as TensorFlow's optimizers do). tf_keras (non-lazy:
    every row decays, the whole variable moves):

    .. math::

        m \leftarrow m + (-m)\,\overline{1-\beta_1}, \quad
        m_r \leftarrow m_r + g_r\,\overline{1-\beta_1}, \quad
        u \leftarrow u \bar\beta_2, \quad
        u_r \leftarrow u_r + (\max(u_r, |g_r|) - u_r)

    then the dense step's :math:`w` update on every row (rows :math:`r` present; the other
    rows equal the dense step on a zero gradient bit for bit; the present ones may differ
    from it by rounding). Keras 2 updates only the present rows, with its Python-ops formula

    .. math::

        m_r \leftarrow m_r \tilde\beta_1 + g_r (1 - \tilde\beta_1), \quad
        u_r \leftarrow \max(u_r \tilde\beta_2, |g_r|), \quad
        w_r \leftarrow w_r + \big(-\eta_{32} / (1 - p_t)\big)\big(m_r / (u_r + \bar\epsilon)\big)

    Keras 3 applies its dense formula to the slices in its TensorFlow backend: the gradient
    is densified (duplicates summed), which is the dense step on ``grad.to_dense()``. With
    the convention knob ``keras3_sparse_square`` (Keras 3's actual handling of *unsummed*
    duplicates) :math:`|g|` is taken of each slice before they are summed: the maximum sees
    :math:`\sum_i |g_i|`, not :math:`|\sum_i g_i|`. PyTorch (``RuntimeError: Adamax does not
    support sparse gradients``) and optax take none (TypeError).

    Where the forms differ, in short: epsilon added to :math:`u` (Keras) or inside the
    maximum and stored in :math:`u` (PyTorch, optax); the grouping of the step (above); the
    moment update (Keras' subtraction form, Keras 2's sparse ``b1*m + (1-b1)*g``, PyTorch's
    and optax's FMA); :math:`1-\beta_1` in the dtype (Keras 2) or from the Python float;
    :math:`\beta^t` in the dtype (TensorFlow), float64 (PyTorch) or float32 (optax); the
    defaults (PyTorch lr 0.002; epsilon 1e-7 Keras, 1e-8 PyTorch and optax).

    NaN: every form but Keras 2's dense kernel takes a NaN-propagating maximum (NumPy's, as
    ``tf.maximum``, ``torch.maximum`` and XLA's; recorded in the ``*/adamax_nonfinite_f32``
    golden cases); Keras 2's ``ApplyAdaMax`` keeps :math:`\tilde\beta_2 u` where
    :math:`|g|` is NaN (its sparse branch, ``tf.maximum``, propagates). float16: every
    form is evaluated with each operation rounded to float16; the FMA steps round once from
    float64. Not checked against the frameworks.

    Examples
    --------
    One step of ``loss = w**2 / 2`` (so ``g = w``) from ``w = 1``, as
    ``tf_keras.optimizers.Adamax(learning_rate=0.1)`` computes it:

    >>> import numpy as np
    >>> w = np.array([1.0], np.float32)
    >>> m, u = adamax_initial_state(w)
    >>> r = adamax_update(w, w.copy(), m, u, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
    ...                   epsilon=1e-7)
    >>> r.param, r.m, r.u
    (array([0.90000004], dtype=float32), array([0.1], dtype=float32), array([1.], dtype=float32))

    References
    ----------
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015, section 7.1.
    """
    param, grad, m, u, form = check_adamax_args(
        param, grad, m, u, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, step=step, convention=convention)
    conv = _convention(convention)
    s = adamax_scalars(param.dtype, conv, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step)
    abs_g = None
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and conv.keras3_sparse_square:
                raw = grad
                abs_g = IndexedSlices(np.abs(raw.values), raw.indices,
                                      raw.dense_shape).to_dense()
                grad = raw.to_dense()
            else:
                grad = grad.deduplicate()
                if form == "keras3":
                    grad = grad.to_dense()
                elif form == "tf_keras":
                    w, m2, u2 = _tf_keras_sparse(param, grad, m, u, s)
                    return AdamaxResult(np.asarray(w), np.asarray(m2), np.asarray(u2))
                else:  # keras2: the present rows
                    rows = grad.indices
                    w, m2, u2 = param.copy(), m.copy(), u.copy()
                    if rows.size:
                        w[rows], m2[rows], u2[rows] = _keras2_rows(
                            param[rows], grad.values, m[rows], u[rows], s)
                    return AdamaxResult(w, m2, u2)
        w, m2, u2 = _dense(form, param, grad, m, u, s, abs_g)
    return AdamaxResult(np.asarray(w), np.asarray(m2), np.asarray(u2))


def check_adamax_args(param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step,
                      convention):
    """Validate :func:`adamax_update`'s arguments (its Raises section); return
    ``(param, grad, m, u, form)``. Shared with the fast backends' ``adamax_update`` so that
    they raise the same errors."""
    param = as_float_array("param", param)
    conv = _convention(convention)
    form = _form(conv)
    if isinstance(grad, IndexedSlices) and form in ("torch", "optax"):
        raise TypeError(
            f"{'PyTorch' if form == 'torch' else 'optax'}'s Adamax takes no sparse gradient; "
            "pass grad.to_dense(). Received: grad of type IndexedSlices with "
            f"adamax_form={form!r}"
        )
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    u = check_like(param, "u", u)
    for name, value in (("learning_rate", learning_rate), ("beta_1", beta_1),
                        ("beta_2", beta_2), ("epsilon", epsilon)):
        check_hyper(name, value)
    if not epsilon >= 0:
        raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon!r}")
    check_step(step)
    return param, grad, m, u, form
