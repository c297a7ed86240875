"""Adagrad, dense and sparse, as each framework computes it (``Convention.adagrad_form``).

Adagrad keeps one slot, the running sum of squared gradients (the *accumulator*), and
divides each step by its root. The frameworks agree on that and on little else: epsilon
sits inside the root (Keras, optax), outside it (Keras 2, PyTorch) or nowhere (TF1, whose
kernel multiplies by ``rsqrt``); the accumulator starts at 0.1 (Keras, TF1, optax) or 0
(PyTorch), and Keras 3 rounds that start through float32; PyTorch decays its learning rate
with ``lr_decay`` and fuses the square into an FMA; optax guards a zero sum; and a sparse
gradient updates only its rows (TF, PyTorch), the dense sum (Keras 3) or is refused
(optax). :func:`adagrad_update` writes each of them out as readable NumPy in the variable
dtype with the rounding points of the framework; the Notes of its docstring give the forms.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/adagrad.py`` (``Adagrad.build``, ``update_step``, dense
            and ``tf.IndexedSlices`` branches)
keras3      ``keras/src/optimizers/adagrad.py`` (``update_step``), ``keras/src/initializers/
            constant_initializers.py`` (``Constant``), ``keras/src/backend/tensorflow/
            optimizer.py`` (``assign_add``/``assign_sub`` on ``tf.IndexedSlices``) and
            ``sparse.py`` (``elementwise_division``)
keras2      ``tf_keras/optimizers/legacy/adagrad.py`` (``ResourceApplyAdagradV2``,
            ``ResourceSparseApplyAdagradV2``) and TensorFlow's ``core/kernels/training_ops.cc``
            (``ApplyAdagradV2``, ``SparseApplyAdagrad<..., has_epsilon=true>`` on CPU)
tf1         ``tensorflow/python/training/adagrad.py`` (``AdagradOptimizer``) and
            ``training_ops.cc`` (``ApplyAdagrad``, ``SparseApplyAdagrad<..., false>``)
torch       ``torch/optim/adagrad.py`` (``_single_tensor_adagrad``, the default for-loop
            path on CPU, dense and sparse branches)
optax       ``optax/_src/alias.py`` (``adagrad``), ``optax/_src/transform.py``
            (``scale_by_rss``, ``scale_by_learning_rate``), under ``jax.jit`` on XLA:CPU
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
    check_scalar,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.rmsprop import rsqrt
from refopt.reference.sqrt import sqrt_function
from refopt.reference.variants import fma

__all__ = [
    "AdagradResult",
    "adagrad_update",
    "adagrad_rows",
    "adagrad_defaults",
    "initial_accumulator",
    "adagrad_initial_state",
    "is_lazy_sparse",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


class AdagradResult(NamedTuple):
    """New arrays after one Adagrad step: ``param`` and ``accumulator`` (the running sum of
    squared gradients: Keras' and TF's "accumulator", torch's "sum", optax's
    "sum_of_squares")."""

    param: np.ndarray
    accumulator: np.ndarray


# The constructors' defaults. ``None``: the framework has no default (TF1 and optax require a
# learning rate) or no such argument (TF1 has no epsilon).
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                     lr_decay=0.0),
    "keras3": dict(learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                   lr_decay=0.0),
    "keras2": dict(learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                   lr_decay=0.0),
    "tf1": dict(learning_rate=None, initial_accumulator_value=0.1, epsilon=None,
                lr_decay=0.0),
    "torch": dict(learning_rate=0.01, initial_accumulator_value=0.0, epsilon=1e-10,
                  lr_decay=0.0),
    "optax": dict(learning_rate=None, initial_accumulator_value=0.1, epsilon=1e-7,
                  lr_decay=0.0),
}

# Which forms update only the rows of an IndexedSlices gradient (the others: see
# :func:`is_lazy_sparse`).
_LAZY_FORMS = ("tf_keras", "keras2", "tf1", "torch")


def _convention(convention):
    if convention is None:
        return get_convention("tf_keras")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf_keras), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def adagrad_defaults(convention=None):
    """The framework's Adagrad constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.adagrad_form``.

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras; **0.01** PyTorch; None where the framework requires
        one: TF1, optax), ``initial_accumulator_value`` (0.1; **0** for PyTorch),
        ``epsilon`` (1e-7 Keras and optax; **1e-10** PyTorch; **None** for TF1, whose
        Adagrad has no epsilon) and ``lr_decay`` (PyTorch's; 0 everywhere). Keras 2 also
        turns ``epsilon=0`` (or None) into 1e-7 (``epsilon or backend.epsilon()``); that
        substitution belongs to the optimizer, :func:`adagrad_update` uses the epsilon it
        is given.
    """
    return dict(_DEFAULTS[_convention(convention).adagrad_form])


def initial_accumulator(convention=None, dtype=np.float32, initial_accumulator_value=None):
    """The value the framework fills the accumulator with before the first step.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras.
    dtype : numpy dtype
        float16, float32 or float64.
    initial_accumulator_value : float or None
        The constructor's value; None: the framework's default (0.1, PyTorch 0).

    Returns
    -------
    numpy.floating
        The value in ``dtype``. Converted straight to the dtype by every framework but Keras
        3, whose ``initializers.Constant`` casts a float32 tensor of it
        (``ops.cast(value, dtype)``): a float64 variable starts at ``float64(float32(0.1))``
        = 0.10000000149011612, not 0.1 (golden case ``keras3/adagrad_f64``).
    """
    dtype = np.dtype(dtype)
    if dtype not in (_F16, _F32, _F64):
        raise TypeError(f"`dtype` must be float16, float32 or float64. Received: dtype={dtype}")
    conv = _convention(convention)
    form = conv.adagrad_form
    value = (_DEFAULTS[form]["initial_accumulator_value"] if initial_accumulator_value is None
             else check_scalar("initial_accumulator_value", initial_accumulator_value))
    if form == "keras3":
        return tf_cast(dtype, value)
    return scalar(dtype, value)


def adagrad_initial_state(param, *, initial_accumulator_value=None, convention=None):
    """A fresh accumulator for ``param`` as the framework creates it (a new array of
    ``param``'s shape and dtype, filled with :func:`initial_accumulator`)."""
    param = as_float_array("param", param)
    start = initial_accumulator(convention, param.dtype, initial_accumulator_value)
    return np.full(param.shape, start, param.dtype)


def is_lazy_sparse(convention=None):
    """Whether an IndexedSlices gradient moves only its rows (and their accumulator rows).

    True for tf_keras (its ``IndexedSlices`` branch scatters into the present rows), Keras 2
    and TF1 (``SparseApplyAdagrad[V2]``) and PyTorch (the ``grad.is_sparse`` branch); False
    for Keras 3 (its TF backend applies the dense formula to the slices: the result is the
    dense step on the summed gradient, see :func:`adagrad_update`) and optax (no sparse
    gradients: refused).
    """
    return _convention(convention).adagrad_form in _LAZY_FORMS


# ----------------------------------------------------------------------------- the forms
def _keras(w, g, acc, lr, eps):
    """tf_keras and Keras 3: ``acc += g*g; w -= (lr*g) / sqrt(acc + eps)``."""
    dt = w.dtype
    acc = acc + g * g
    return w - (lr_cast(dt, lr) * g) / np.sqrt(acc + scalar(dt, eps)), acc


def _keras2(w, g, acc, lr, eps):
    """TensorFlow's ``ApplyAdagradV2`` kernel (Keras 2 legacy): epsilon outside the root."""
    dt = w.dtype
    acc = acc + g * g
    return w - (g * lr_cast(dt, lr)) / (np.sqrt(acc) + scalar(dt, eps)), acc


def _tf1(w, g, acc, lr, one_element_rows=False):
    """TensorFlow's ``ApplyAdagrad`` kernel (TF1): no epsilon, ``rsqrt``; the sparse kernel
    on rows of one element divides by ``sqrt`` instead."""
    dt = w.dtype
    lr = tf_cast(dt, lr)
    acc = acc + g * g
    if one_element_rows:
        return w - (lr * g) / np.sqrt(acc), acc
    return w - (g * lr) * rsqrt(acc), acc


def _torch_lr(lr, lr_decay, step):
    """``clr = lr / (1 + (step - 1) * lr_decay)`` in Python floats (float64), as torch."""
    return float(lr) / (1 + (float(step) - 1) * float(lr_decay))


def _torch(w, g, acc, lr, eps, lr_decay, step, sqrt=np.sqrt):
    """``_single_tensor_adagrad``'s dense branch: ``addcmul_`` (one FMA), ``sqrt().add_``,
    ``addcdiv_`` (the scaled gradient divided, then added). ``sqrt``: the convention's root
    (MKL's under ``sqrt="mkl"``, :mod:`refopt.reference.sqrt`)."""
    dt = w.dtype
    acc = fma(g, g, acc)
    std = sqrt(acc) + scalar(dt, eps)
    return w + (scalar(dt, -_torch_lr(lr, lr_decay, step)) * g) / std, acc


def _torch_rows(w, g, acc, lr, eps, lr_decay, step, sqrt=np.sqrt):
    """``_single_tensor_adagrad``'s sparse branch on the coalesced rows: ``add_`` of the
    squared values (no FMA), ``sqrt_().add_``, the division *first*, then ``param.add_(...,
    alpha=-clr)`` (one FMA)."""
    dt = w.dtype
    acc = acc + g * g
    q = g / (sqrt(acc) + scalar(dt, eps))
    return fma(scalar(dt, -_torch_lr(lr, lr_decay, step)), q, w), acc


def _optax(w, g, acc, lr, eps, jit="update"):
    """``scale_by_rss`` then ``scale_by_learning_rate`` under ``jit`` (``g*g + sum``
    contracted into one FMA), ``apply_updates`` outside. ``jit`` (``Convention.optax_jit``)
    ``"eager"``: ``g*g + sum`` rounded twice; ``"step"`` compiles as ``"update"``."""
    dt = w.dtype
    acc = g * g + acc if jit == "eager" else fma(g, g, acc)
    s = np.where(acc > 0, rsqrt(acc + scalar(dt, eps)), dt.type(0))
    return w + scalar(dt, -float(lr)) * (s * g), acc


def _dense(form, w, g, acc, lr, eps, lr_decay, step, one_element_rows=False, jit="update",
           sqrt=np.sqrt):
    if form in ("tf_keras", "keras3"):
        return _keras(w, g, acc, lr, eps)
    if form == "keras2":
        return _keras2(w, g, acc, lr, eps)
    if form == "tf1":
        return _tf1(w, g, acc, lr, one_element_rows)
    if form == "torch":
        return _torch(w, g, acc, lr, eps, lr_decay, step, sqrt)
    return _optax(w, g, acc, lr, eps, jit)


def adagrad_rows(param_rows, grad_rows, accumulator_rows, *, learning_rate, epsilon,
                 convention=None, lr_decay=0.0, step=1, row_width=None):
    """The lazy sparse step on gathered rows (duplicates already summed): new
    ``(param_rows, accumulator_rows)``.

    The row form of a lazy convention (:func:`is_lazy_sparse`): tf_keras and Keras 2 apply
    their dense formula to the rows; TF1 its dense formula on rows of several elements and
    ``w -= (lr*g) / sqrt(acc)`` on rows of one element (``row_width == 1``; None: taken from
    the rows' shape); PyTorch its sparse branch. Arrays of shape ``(rows, ...)``, checked by
    the caller.
    """
    conv = _convention(convention)
    form = conv.adagrad_form
    if row_width is None:
        row_width = int(np.prod(param_rows.shape[1:], dtype=np.int64))
    with np.errstate(all="ignore"):
        if form == "torch":
            w, acc = _torch_rows(param_rows, grad_rows, accumulator_rows, learning_rate,
                                 epsilon, lr_decay, step, sqrt_function(conv))
        else:
            w, acc = _dense(form, param_rows, grad_rows, accumulator_rows, learning_rate,
                            epsilon, lr_decay, step, one_element_rows=row_width == 1)
    return np.asarray(w), np.asarray(acc)


def _keras3_slices(w, grad, acc, lr, eps):
    """Keras 3's TF backend on raw ``tf.IndexedSlices`` (knob ``keras3_sparse_square``):
    ``assign_add`` scatter-adds ``g_i**2`` once per occurrence (sum of squares of the
    duplicates), the slices of ``lr*g_i`` are divided by the gathered ``sqrt(acc + eps)``,
    and ``assign_sub`` scatter-subtracts them one occurrence at a time, in order."""
    dt = w.dtype
    w, acc = w.copy(), acc.copy()
    rows = grad.indices
    vals = grad.values
    for r, v in zip(rows, vals):
        acc[r] = acc[r] + v * v
    den = np.sqrt(acc + scalar(dt, eps))
    lr = lr_cast(dt, lr)
    # elementwise_division widens the result to every row whose divisor has a zero or NaN:
    # there 0 / den is NaN, as in the dense step
    width = int(np.prod(den.shape[1:], dtype=np.int64))
    bad = np.flatnonzero(np.any(((den == 0) | np.isnan(den)).reshape(den.shape[0], width),
                                axis=1))
    for r, v in zip(rows, vals):
        w[r] = w[r] - (lr * v) / den[r]
    extra = np.setdiff1d(bad, rows)
    if extra.size:
        w[extra] = w[extra] - (dt.type(0) * lr) / den[extra]
    return w, acc


def adagrad_update(param, grad, accumulator, *, learning_rate, epsilon, convention=None,
                   lr_decay=0.0, step=1):
    r"""One Adagrad step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes): only its rows
        (tf_keras, Keras 2, TF1, PyTorch), as the dense step on the summed gradient (Keras
        3), or refused (optax).
    accumulator : ndarray like ``param``
        The running sum of squared gradients :math:`a`. A fresh one is
        :func:`adagrad_initial_state` (0.1 everywhere, PyTorch 0; Keras 3 through float32).
    learning_rate : float
        :math:`\eta`.
    epsilon : float or None
        :math:`\epsilon`, used as given (see :func:`adagrad_defaults`). Must be None for TF1,
        whose Adagrad has none, and a real number otherwise.
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.adagrad_form``.
    lr_decay : float, default 0.0
        PyTorch's learning-rate decay :math:`\delta \ge 0`; another form with a non-zero
        value raises ValueError.
    step : int, default 1
        The 1-based step :math:`t` of this variable (PyTorch counts per parameter); only
        PyTorch's decayed learning rate uses it.

    Returns
    -------
    AdagradResult
        ``(param, accumulator)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number (epsilon
        not None under TF1 is a ValueError); ``convention`` of the wrong type; an
        IndexedSlices gradient under optax.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a negative
        epsilon or ``lr_decay``; ``lr_decay`` for a form other than torch; ``epsilon`` given
        to TF1 or missing elsewhere; ``step`` not an integer >= 1. Messages name the argument
        and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\eta_{32}` is the
    learning rate rounded to float32 and then to the dtype (Keras' float32 variable, TF1's
    float32 tensor); :math:`\bar x` a Python number converted straight to the dtype;
    :math:`\mathrm{rsqrt}` is :func:`refopt.reference.rmsprop.rsqrt` (correctly rounded).
    The accumulator starts at ``initial_accumulator_value`` (:func:`initial_accumulator`).

    **tf_keras** and **keras3** (tf.keras 2.11+, Keras 3 on TensorFlow; the same dense step):

    .. math::

        a \leftarrow a + g^2, \qquad
        w \leftarrow w - (\eta_{32}\, g) / \sqrt{a + \bar\epsilon}

    **keras2** (Keras 2 legacy, TensorFlow's ``ApplyAdagradV2`` kernel), **epsilon outside
    the root**:

    .. math::

        a \leftarrow a + g^2, \qquad
        w \leftarrow w - (g\, \eta_{32}) / (\sqrt{a} + \bar\epsilon)

    **tf1** (``tf.compat.v1.train.AdagradOptimizer``, ``ApplyAdagrad``), **no epsilon**:

    .. math::

        a \leftarrow a + g^2, \qquad
        w \leftarrow w - (g\, \eta_{32})\, \mathrm{rsqrt}(a)

    TensorFlow's CPU ``rsqrt`` is not correctly rounded (a hardware estimate refined by one
    Newton step in Eigen's vector loop, ``1/sqrt`` in its scalar tail); the golden cases
    carry that tolerance. TF1 requires ``initial_accumulator_value > 0`` (the first step
    divides by :math:`\sqrt{a}`).

    **torch** (``torch.optim.Adagrad``, single-tensor for-loop path on CPU; the decayed
    learning rate :math:`c = \eta / (1 + (t - 1)\delta)` in Python floats):

    .. math::

        a \leftarrow \mathrm{fma}(g, g, a), \qquad
        w \leftarrow w + (\overline{-c}\, g) / (\sqrt{a} + \bar\epsilon)

    torch's CPU ``sqrt`` (MKL's vector math) is not correctly rounded (about 17% of float32
    results 1 ulp off); refopt calls it under the convention knob ``sqrt="mkl"``
    (:mod:`refopt.reference.sqrt`). ``Adagrad(fused=True)`` (``FusedAdagradKernel.cpp``; the
    ``"torch_fused"`` preset, knob ``sqrt="torch_fused"``) computes the same formula on a
    dense gradient, body and scalar tail alike (``sum + g*g`` contracted into one FMA,
    ``p - (c g) / std`` with ``c`` rounded to the dtype), with the correctly rounded root;
    its sparse rows stay the for-loop's (the fused kernel refuses sparse gradients).

    **optax** (``optax.adagrad`` = ``scale_by_rss`` then ``scale_by_learning_rate``, the update
    under ``jax.jit``, where XLA:CPU contracts ``g*g + a`` into one FMA):

    .. math::

        a \leftarrow \mathrm{fma}(g, g, a), \qquad
        s = \mathrm{rsqrt}(a + \bar\epsilon) \text{ if } a > 0 \text{ else } 0, \qquad
        w \leftarrow w + \overline{-\eta}\,(s g)

    (so a zero, or NaN, sum gives a zero step, not NaN). XLA:CPU's ``rsqrt`` is not always
    correctly rounded: the recorded float32 cases match bit for bit, float64 within 1 ulp, and
    a one-element leaf was 1 ulp off (``conformance/README.md``, section 5).

    **Sparse gradients** (:class:`~refopt.IndexedSlices`; duplicate indices are summed first,
    from zero in order of appearance, as TensorFlow's optimizers and torch's ``coalesce``
    do): tf_keras, Keras 2 and TF1 apply their dense formula to the present rows only (the
    other rows and their accumulator do not move), except that TF1's sparse kernel on rows of
    **one element** (a 1-D variable, or shape ``(n, 1)``) computes
    :math:`w \leftarrow w - (\eta_{32} g)/\sqrt{a}`. PyTorch's sparse branch on the present
    rows:

    .. math::

        a \leftarrow a + g^2, \qquad
        w \leftarrow \mathrm{fma}\big(\overline{-c},\ g / (\sqrt{a} + \bar\epsilon),\ w\big)

    (the division first, then the scale: not the dense branch's rounding). Keras 3 applies
    its formula to the slices in its TensorFlow backend; on the summed gradient that is the
    dense step on ``grad.to_dense()`` (absent rows: :math:`w - 0/\sqrt{a + \epsilon} = w`;
    where that root is 0 or NaN both give NaN), which is what this function does. With the
    convention knob ``keras3_sparse_square`` (Keras 3's actual handling of *unsummed*
    duplicates) the squares are scatter-added per occurrence (:math:`a + \sum g_i^2`, not
    :math:`(\sum g_i)^2`) and :math:`(\eta_{32} g_i)/\sqrt{a + \epsilon}` is subtracted once
    per occurrence, in order. optax takes no sparse gradient (TypeError).

    Where the forms differ, in short: epsilon inside the root (tf_keras, Keras 3, optax),
    outside (Keras 2, PyTorch) or absent (TF1, ``rsqrt``); the accumulator's start (0.1; 0
    for PyTorch; Keras 3 rounds it through float32); FMA in the accumulator (PyTorch dense,
    optax); the order of the scaled division (``(lr g)/d`` Keras, ``(g lr)/d`` Keras 2,
    ``(-lr g)/d`` PyTorch dense, ``-lr (g/d)`` PyTorch sparse and optax); optax's zero guard;
    PyTorch's ``lr_decay``; the defaults (PyTorch lr 0.01, epsilon 1e-10).

    float16: every form is evaluated with each operation rounded to float16 (as TensorFlow's
    Eigen and NumPy do); the FMA steps round once from float64. Not checked against torch or
    optax, which compute some float16 primitives in float32.

    Examples
    --------
    One step of ``loss = w**2 / 2`` (so ``g = w``) from ``w = 10`` and the 0.1 start, as
    ``tf_keras.optimizers.Adagrad(learning_rate=0.1)`` computes it (9.90005, 100.1):

    >>> import numpy as np
    >>> w = np.array([10.0], np.float32)
    >>> acc = adagrad_initial_state(w)
    >>> r = adagrad_update(w, w.copy(), acc, learning_rate=0.1, epsilon=1e-7)
    >>> r.param, r.accumulator
    (array([9.90005], dtype=float32), array([100.1], dtype=float32))

    References
    ----------
    Duchi, Hazan & Singer, "Adaptive Subgradient Methods for Online Learning and Stochastic
    Optimization", JMLR 12 (2011).
    """
    param, grad, accumulator, form = check_adagrad_args(
        param, grad, accumulator, learning_rate=learning_rate, epsilon=epsilon,
        convention=convention, lr_decay=lr_decay, step=step)
    conv = _convention(convention)
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and conv.keras3_sparse_square:
                w, acc = _keras3_slices(param, grad, accumulator, learning_rate, epsilon)
                return AdagradResult(np.asarray(w), np.asarray(acc))
            grad = grad.deduplicate()
            if form == "keras3":
                grad = grad.to_dense()
            else:
                rows = grad.indices
                w, acc = param.copy(), accumulator.copy()
                if rows.size:
                    w[rows], acc[rows] = adagrad_rows(
                        param[rows], grad.values, accumulator[rows], learning_rate=learning_rate,
                        epsilon=epsilon, convention=conv, lr_decay=lr_decay, step=step,
                        row_width=int(np.prod(param.shape[1:], dtype=np.int64)))
                return AdagradResult(w, acc)
        # dense: torch's fused kernel under sqrt="torch_fused" (the hardware's root)
        w, acc = _dense(form, param, grad, accumulator, learning_rate, epsilon, lr_decay, step,
                        jit=conv.optax_jit, sqrt=sqrt_function(conv, fused_kernel=True))
    return AdagradResult(np.asarray(w), np.asarray(acc))


def check_adagrad_args(param, grad, accumulator, *, learning_rate, epsilon, convention,
                       lr_decay, step):
    """Validate :func:`adagrad_update`'s arguments (its Raises section); return
    ``(param, grad, accumulator, form)``. Shared with the fast backends' ``adagrad_update``
    so that they raise the same errors."""
    param = as_float_array("param", param)
    conv = _convention(convention)
    form = conv.adagrad_form
    if isinstance(grad, IndexedSlices) and form == "optax":
        raise TypeError(
            "optax's adagrad takes no sparse gradient (JAX has no IndexedSlices); pass "
            "grad.to_dense(). Received: grad of type IndexedSlices with "
            f"adagrad_form={form!r}"
        )
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    accumulator = check_like(param, "accumulator", accumulator)
    check_hyper("learning_rate", learning_rate)
    if form == "tf1":
        if epsilon is not None:
            raise ValueError(
                "TF1's AdagradOptimizer has no epsilon (its kernel multiplies by "
                f"rsqrt(accumulator)); pass epsilon=None. Received: epsilon={epsilon!r} with "
                "adagrad_form='tf1'"
            )
    else:
        if epsilon is None:
            raise ValueError(
                f"`epsilon` must be a real number >= 0 for adagrad_form={form!r} (only TF1 "
                "has none). Received: epsilon=None"
            )
        check_hyper("epsilon", epsilon)
        if not epsilon >= 0:
            raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon!r}")
    check_scalar("lr_decay", lr_decay)
    if not lr_decay >= 0:
        raise ValueError(f"`lr_decay` must be >= 0. Received: lr_decay={lr_decay!r}")
    if lr_decay != 0 and form != "torch":
        raise ValueError(
            "`lr_decay` is PyTorch's option; the other frameworks' Adagrad has none. "
            f"Received: lr_decay={lr_decay!r} with adagrad_form={form!r}"
        )
    check_step(step)
    return param, grad, accumulator, form
