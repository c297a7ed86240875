"""Adadelta, dense and sparse, as each framework computes it (``Convention.adadelta_form``).

Adadelta (Zeiler, 2012) keeps two slots, the running mean of squared gradients
``accumulated_grad`` (:math:`E_g`) and the running mean of squared steps
``accumulated_delta`` (:math:`E_x`), both starting at zero, and scales the gradient by
``sqrt(E_x + eps) / sqrt(E_g + eps)``. The frameworks agree on that and differ in the
rounding: where ``1 - rho`` is computed and which product it multiplies first (Keras),
TensorFlow's kernel with its ``rsqrt`` (Keras 2, TF1, whose scalars go through float32),
PyTorch's FMA primitives and optax's contracted moments; the defaults (learning rate 0.001
Keras and TF1, **1** PyTorch, none optax; rho 0.95 / 0.9; epsilon 1e-7, 1e-8 TF1, 1e-6
PyTorch and optax); and the sparse step (tf_keras' dense-formula branch, TensorFlow's lazy
row kernel, Keras 3's dense step on the summed gradient or, with the knob
``keras3_sparse_square``, its per-occurrence step; refused by PyTorch and optax).
:func:`adadelta_update` writes each of them out as readable NumPy in the variable dtype
with the rounding points of the framework; the Notes of its docstring give the forms.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/adadelta.py`` (``Adadelta.update_step``, dense and
            ``tf.IndexedSlices`` branches)
keras3      ``keras/src/optimizers/adadelta.py`` (``update_step``), ``keras/src/backend/
            tensorflow/numpy.py`` (Python scalars converted straight to the dtype)
keras2      ``tf_keras/optimizers/legacy/adadelta.py`` (``ResourceApplyAdadelta``,
            ``ResourceSparseApplyAdadelta``) and TensorFlow's ``core/kernels/training_ops.cc``
            (``ApplyAdadelta``, ``SparseApplyAdadeltaOp`` on CPU)
tf1         ``tensorflow/python/training/adadelta.py`` (``AdadeltaOptimizer``: every scalar
            a float32 tensor cast to the dtype) and the same kernels
torch       ``torch/optim/adadelta.py`` (``_single_tensor_adadelta``, the default for-loop
            path on CPU)
optax       ``optax/_src/alias.py`` (``adadelta``), ``optax/_src/transform.py``
            (``scale_by_adadelta``), ``optax/tree_utils/_tree_math.py``
            (``tree_update_moment``), under ``jax.jit`` on XLA:CPU
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
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.rmsprop import rsqrt
from refopt.reference.sqrt import sqrt_function
from refopt.reference.variants import fma, optax_apply

__all__ = [
    "AdadeltaResult",
    "adadelta_update",
    "adadelta_rows",
    "adadelta_defaults",
    "adadelta_initial_state",
    "is_lazy_sparse",
    "check_adadelta_args",
]


class AdadeltaResult(NamedTuple):
    """New arrays after one Adadelta step: ``param``, ``accumulated_grad`` (the running mean
    of squared gradients: Keras' name; TF's "accum", torch's "square_avg", optax's "e_g")
    and ``accumulated_delta`` (the running mean of squared steps: Keras'
    "accumulated_delta_var", TF's "accum_update", torch's "acc_delta", optax's "e_x")."""

    param: np.ndarray
    accumulated_grad: np.ndarray
    accumulated_delta: np.ndarray


# The constructors' defaults. ``None``: optax's ``learning_rate=None`` (no scaling at all, so
# ``apply_updates`` climbs the gradient); refopt asks for a learning rate there.
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, rho=0.95, epsilon=1e-7),
    "keras3": dict(learning_rate=0.001, rho=0.95, epsilon=1e-7),
    "keras2": dict(learning_rate=0.001, rho=0.95, epsilon=1e-7),
    "tf1": dict(learning_rate=0.001, rho=0.95, epsilon=1e-8),
    "torch": dict(learning_rate=1.0, rho=0.9, epsilon=1e-6),
    "optax": dict(learning_rate=None, rho=0.9, epsilon=1e-6),
}

# Which forms update only the rows of an IndexedSlices gradient (TensorFlow's sparse kernel).
_LAZY_FORMS = ("keras2", "tf1")
# Which forms take no IndexedSlices gradient at all.
_NO_SPARSE = ("torch", "optax")


def _convention(convention):
    if convention is None:
        return get_convention("tf_keras")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf_keras), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def _form(convention):
    form = _convention(convention).adadelta_form
    if form == "none":
        raise ValueError(
            "This convention has no Adadelta (adadelta_form='none'). Received: "
            f"convention={_convention(convention).name!r}"
        )
    return form


def adadelta_defaults(convention=None):
    """The framework's Adadelta constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.adadelta_form``.

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras and TF1; **1.0** PyTorch; **None** for optax, whose
        ``adadelta(learning_rate=None)`` does not scale at all and so *ascends* the gradient
        after ``apply_updates``), ``rho`` (0.95 Keras and TF1; **0.9** PyTorch and optax) and
        ``epsilon`` (1e-7 Keras; **1e-8** TF1; **1e-6** PyTorch and optax). Keras 2 also
        turns ``epsilon=0`` (or None) into 1e-7 (``epsilon or backend.epsilon()``); that
        substitution belongs to the optimizer, :func:`adadelta_update` uses the epsilon it
        is given.
    """
    return dict(_DEFAULTS[_form(convention)])


def adadelta_initial_state(param):
    """Fresh ``(accumulated_grad, accumulated_delta)`` for ``param``: two new zero arrays of
    its shape and dtype (every framework starts both at zero)."""
    param = as_float_array("param", param)
    return np.zeros(param.shape, param.dtype), np.zeros(param.shape, param.dtype)


def is_lazy_sparse(convention=None):
    """Whether an IndexedSlices gradient moves only its rows (and their slot rows).

    True for Keras 2 and TF1 (``SparseApplyAdadelta`` on the present rows); False for
    tf_keras (its sparse branch decays ``accumulated_grad`` on every row and computes the
    step densely: ``accumulated_delta`` decays on every row), Keras 3 (the dense step on the
    summed gradient), PyTorch and optax (no sparse gradients: refused).
    """
    return _form(convention) in _LAZY_FORMS


# ----------------------------------------------------------------------------- the forms
def _tf_keras(w, g, eg, ex, lr, rho, eps):
    """tf_keras 2.11+ dense: ``rho*E + (1-rho)*g*g`` (left to right), ``-rms(Ex)*g/rms(Eg)``."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    eg = r * eg + (c * g) * g
    d = (-np.sqrt(ex + e) * g) / np.sqrt(eg + e)
    ex = r * ex + (c * d) * d
    return w + lr_cast(dt, lr) * d, eg, ex


def _tf_keras_sparse(w, grad, eg, ex, lr, rho, eps):
    """tf_keras 2.11+ on (deduplicated) ``tf.IndexedSlices``: ``Eg + (rho-1)*Eg`` on every
    row, the scatter-add of ``(1-rho)*square(values)``, then the dense formula with the
    gradient converted to a dense tensor (so ``Ex`` decays and ``w`` is written on every row;
    an absent row moves by ``lr * -0``)."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    eg = eg + scalar(dt, rho - 1) * eg
    rows = grad.indices
    if rows.size:
        eg[rows] = eg[rows] + c * np.square(grad.values)
    g = grad.to_dense()
    d = (-np.sqrt(ex + e) * g) / np.sqrt(eg + e)
    ex = r * ex + (c * d) * d
    return w + lr_cast(dt, lr) * d, eg, ex


def _keras3(w, g, eg, ex, lr, rho, eps):
    """Keras 3: ``rho*E + (1-rho)*square(g)`` (the square first), ``-((rms(Ex)*g)/rms(Eg))``."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    eg = r * eg + c * np.square(g)
    d = -((np.sqrt(ex + e) * g) / np.sqrt(eg + e))
    ex = r * ex + c * np.square(d)
    return w + lr_cast(dt, lr) * d, eg, ex


def _keras3_slices(w, grad, eg, ex, lr, rho, eps):
    """Keras 3's TF backend on raw ``tf.IndexedSlices`` (knob ``keras3_sparse_square``):
    ``ops.add(dense, slices)`` densifies the slices (``unsorted_segment_sum``: the
    occurrences of a row summed from zero in order), so ``E_g`` gets ``Σ (1-rho)*g_i**2``
    (not ``(1-rho)*(Σ g_i)**2``); the step is computed per occurrence on the gathered rows
    (``elementwise_division`` adds the rows whose divisor is 0 or NaN, where ``0/d`` is NaN);
    ``E_x`` gets ``Σ (1-rho)*d_i**2``; ``assign_add`` scatter-adds ``lr*d_i`` one occurrence at
    a time, in order."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    w = w.copy()
    rows, vals = list(grad.indices), list(grad.values)
    s = np.zeros_like(eg)
    for i, v in zip(rows, vals):
        s[i] = s[i] + c * np.square(v)
    eg = r * eg + s
    den = np.sqrt(eg + e)
    width = int(np.prod(den.shape[1:], dtype=np.int64))
    bad = np.flatnonzero(np.any(((den == 0) | np.isnan(den)).reshape(den.shape[0], width),
                                axis=1))
    extra = [int(i) for i in np.setdiff1d(bad, grad.indices)]
    rows += extra
    vals += [np.zeros(w.shape[1:], dt)] * len(extra)
    rx = np.sqrt(ex + e)
    d = [-((rx[i] * v) / den[i]) for i, v in zip(rows, vals)]
    t = np.zeros_like(ex)
    for i, di in zip(rows, d):
        t[i] = t[i] + c * np.square(di)
    ex = r * ex + t
    lr = lr_cast(dt, lr)
    for i, di in zip(rows, d):
        w[i] = w[i] + lr * di
    return w, eg, ex


def _kernel(w, g, eg, ex, lr, rho, eps):
    """TensorFlow's ``ApplyAdadelta`` (and, per row, ``SparseApplyAdadelta``) CPU kernel; the
    scalars already in the dtype, ``1 - rho`` computed there."""
    c = w.dtype.type(1) - rho
    eg = eg * rho + np.square(g) * c
    u = (np.sqrt(ex + eps) * rsqrt(eg + eps)) * g
    w = w - u * lr
    ex = ex * rho + np.square(u) * c
    return w, eg, ex


def _keras2(w, g, eg, ex, lr, rho, eps):
    """Keras 2 legacy: lr and rho are float32 hyperparameter variables cast to the dtype,
    epsilon ``tf.convert_to_tensor(epsilon, dtype)``."""
    dt = w.dtype
    return _kernel(w, g, eg, ex, lr_cast(dt, lr), lr_cast(dt, rho), scalar(dt, eps))


def _tf1(w, g, eg, ex, lr, rho, eps):
    """TF1 ``AdadeltaOptimizer``: every scalar a float32 tensor, ``math_ops.cast`` to the
    dtype (float64 epsilon 1e-8 is ``float64(float32(1e-8))``)."""
    dt = w.dtype
    return _kernel(w, g, eg, ex, tf_cast(dt, lr), tf_cast(dt, rho), tf_cast(dt, eps))


def _torch(w, g, eg, ex, lr, rho, eps, sqrt=np.sqrt):
    """``_single_tensor_adadelta``: ``mul_(rho).addcmul_(g, g, value=1-rho)`` (``value*g``
    rounded, then one FMA), ``add(eps).sqrt_()``, ``div_(std).mul_(g)``, ``param.add_(delta,
    alpha=-lr)`` (one FMA). ``sqrt``: the convention's root (MKL's under ``sqrt="mkl"``)."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    eg = fma(c * g, g, eg * r)
    std = sqrt(eg + e)
    d = (sqrt(ex + e) / std) * g
    ex = fma(c * d, d, ex * r)
    return fma(scalar(dt, -float(lr)), d, w), eg, ex


def _optax(w, g, eg, ex, lr, rho, eps, jit="update"):
    """``scale_by_adadelta`` then ``scale_by_learning_rate`` under ``jit`` (XLA contracts
    each ``(1-rho)*x**2 + rho*E`` into one FMA, and turns the division by a root into a
    product with ``rsqrt``), ``apply_updates`` outside (``w + u``). ``jit`` is
    ``Convention.optax_jit``: ``"eager"`` rounds every operation as written (a true division
    by a correctly rounded root, no FMA); ``"step"`` fuses ``w + (-lr)*u`` into one FMA."""
    dt = w.dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    if jit == "eager":
        eg = c * np.square(g) + r * eg
        u = (np.sqrt(ex + e) / np.sqrt(eg + e)) * g
        ex = c * np.square(u) + r * ex
        return w + scalar(dt, -float(lr)) * u, eg, ex
    eg = fma(c, np.square(g), r * eg)  # (1-rho)*g**2 + rho*e_g: the first product fused
    u = (np.sqrt(ex + e) * rsqrt(eg + e)) * g  # XLA rewrites a / sqrt(b) as a * rsqrt(b)
    ex = fma(r, ex, c * np.square(u))  # (1-rho)*u**2 + rho*e_x: here the second one fused
    return optax_apply(w, u, scalar(dt, -float(lr)), jit), eg, ex


_FORMS = {"tf_keras": _tf_keras, "keras3": _keras3, "keras2": _keras2, "tf1": _tf1,
          "torch": _torch, "optax": _optax}


def adadelta_rows(param_rows, grad_rows, accumulated_grad_rows, accumulated_delta_rows, *,
                  learning_rate, rho, epsilon, convention=None):
    """The lazy sparse step on gathered rows (duplicates already summed): new
    ``(param_rows, accumulated_grad_rows, accumulated_delta_rows)``.

    The row form of a lazy convention (:func:`is_lazy_sparse`: Keras 2 and TF1), which is
    TensorFlow's dense kernel formula applied to each present row. Arrays of shape
    ``(rows, ...)``, checked by the caller.
    """
    form = _form(convention)
    with np.errstate(all="ignore"):
        w, eg, ex = _FORMS[form](param_rows, grad_rows, accumulated_grad_rows,
                                 accumulated_delta_rows, learning_rate, rho, epsilon)
    return np.asarray(w), np.asarray(eg), np.asarray(ex)


def adadelta_update(param, grad, accumulated_grad, accumulated_delta, *, learning_rate, rho,
                    epsilon, convention=None):
    r"""One Adadelta step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes): tf_keras' sparse
        branch, TensorFlow's row kernel (Keras 2, TF1), the dense step on the summed
        gradient (Keras 3), or refused (PyTorch, optax).
    accumulated_grad : ndarray like ``param``
        :math:`E_g`, the running mean of :math:`g^2` (zeros at the start).
    accumulated_delta : ndarray like ``param``
        :math:`E_x`, the running mean of the squared steps (zeros at the start).
    learning_rate : float
        :math:`\eta` (:func:`adadelta_defaults`; the paper's method is :math:`\eta = 1`).
    rho : float
        :math:`\rho \in [0, 1]`, the decay of both means.
    epsilon : float
        :math:`\epsilon \ge 0`, inside both roots.
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.adadelta_form``.

    Returns
    -------
    AdadeltaResult
        ``(param, accumulated_grad, accumulated_delta)``, new arrays of the input dtype and
        shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type; an IndexedSlices gradient under PyTorch or optax.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a negative
        learning rate or epsilon; ``rho`` outside [0, 1]; a convention whose
        ``adadelta_form`` is ``"none"``. Messages name the argument and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\bar x` is a Python
    number converted straight to the dtype (:math:`\overline{1-\rho}`: ``1 - rho`` computed
    in float64 first); :math:`x_{32}` is the number rounded to float32 and then to the dtype
    (Keras' float32 learning-rate variable; Keras 2's float32 hyperparameters; TF1's float32
    tensors); :math:`\mathrm{rsqrt}` is :func:`refopt.reference.rmsprop.rsqrt` (correctly
    rounded).

    **tf_keras** (tf.keras 2.11+; ``(1 - rho) * g * g`` evaluates left to right):

    .. math::

        E_g &\leftarrow \bar\rho E_g + (\overline{1-\rho}\, g)\, g, \qquad
        d = \big(-\sqrt{E_x + \bar\epsilon}\; g\big) / \sqrt{E_g + \bar\epsilon} \\
        E_x &\leftarrow \bar\rho E_x + (\overline{1-\rho}\, d)\, d, \qquad
        w \leftarrow w + \eta_{32}\, d

    **keras3** (Keras 3 on TensorFlow): the same with the squares taken first,
    :math:`\overline{1-\rho}\,(g^2)` and :math:`\overline{1-\rho}\,(d^2)`.

    **keras2** and **tf1** (TensorFlow's ``ApplyAdadelta`` kernel; Keras 2 passes
    :math:`\eta_{32}, \rho_{32}, \bar\epsilon`, TF1 :math:`\eta_{32}, \rho_{32},
    \epsilon_{32}`; :math:`c = 1 - \rho_{32}` in the dtype):

    .. math::

        E_g &\leftarrow E_g \rho_{32} + g^2 c, \qquad
        u = \big(\sqrt{E_x + \epsilon}\; \mathrm{rsqrt}(E_g + \epsilon)\big)\, g \\
        w &\leftarrow w - u\, \eta_{32}, \qquad
        E_x \leftarrow E_x \rho_{32} + u^2 c

    TensorFlow's CPU ``rsqrt`` is not correctly rounded (Eigen's hardware estimate and a
    Newton step); the golden cases carry that tolerance.

    **torch** (``torch.optim.Adadelta``, the single-tensor for-loop path on CPU):

    .. math::

        E_g &\leftarrow \mathrm{fma}(\overline{1-\rho}\, g,\ g,\ E_g \bar\rho), \qquad
        d = \big(\sqrt{E_x + \bar\epsilon} / \sqrt{E_g + \bar\epsilon}\big)\, g \\
        E_x &\leftarrow \mathrm{fma}(\overline{1-\rho}\, d,\ d,\ E_x \bar\rho), \qquad
        w \leftarrow \mathrm{fma}(\overline{-\eta},\ d,\ w)

    torch's CPU ``sqrt_`` (MKL's vector math) is not correctly rounded; the golden cases
    carry that tolerance. ``weight_decay`` (the optimizer's) is PyTorch's L2 term
    :math:`g \leftarrow \mathrm{fma}(w, \overline{wd}, g)` before the step.

    **optax** (``optax.adadelta`` = ``scale_by_adadelta`` then ``scale_by_learning_rate``,
    under ``jax.jit``; ``apply_updates`` outside):

    .. math::

        E_g &\leftarrow \mathrm{fma}(\overline{1-\rho},\ g^2,\ \bar\rho E_g), \qquad
        u = \big(\sqrt{E_x + \bar\epsilon}\; \mathrm{rsqrt}(E_g + \bar\epsilon)\big)\, g \\
        E_x &\leftarrow \mathrm{fma}(\bar\rho,\ E_x,\ \overline{1-\rho}\, u^2), \qquad
        w \leftarrow w + \overline{-\eta}\, u

    XLA's algebraic simplifier turns ``sqrt(a) / sqrt(b)`` into ``sqrt(a) * rsqrt(b)``, and
    LLVM fuses the first product of the ``E_g`` sum but the second of the ``E_x`` sum (both
    confirmed bit for bit on the slots the golden cases record, every other element within
    one rsqrt ulp). XLA:CPU's ``rsqrt`` is not always correctly rounded: the golden cases
    carry that tolerance.

    optax's default ``learning_rate=None`` skips the scaling, so ``apply_updates`` adds
    :math:`+u` (gradient *ascent*); refopt requires a learning rate under optax. Its
    ``weight_decay`` (``add_decayed_weights`` before ``scale_by_adadelta``) is, under
    ``jit``, the same fused L2 term as PyTorch's, :math:`\mathrm{fma}(w, \overline{wd}, g)`
    (golden case ``optax/adadelta_wd_f32``).

    **Sparse gradients** (:class:`~refopt.IndexedSlices`; duplicate indices are summed first,
    from zero in order of appearance, as TensorFlow's optimizers do):

    - tf_keras: :math:`E_g \leftarrow E_g + \overline{\rho - 1}\, E_g` on **every** row, then
      :math:`E_g[r] \leftarrow E_g[r] + \overline{1-\rho}\, v_r^2` on the present rows, then the
      dense formulas for :math:`d`, :math:`E_x` and :math:`w` with the gradient made dense
      (zeros elsewhere): :math:`E_x` decays on every row, an absent row's :math:`w` stays
      (it moves by :math:`\eta \cdot (-0)`).
    - Keras 2 and TF1: the kernel's formulas on the present rows only (the other rows and
      their slots do not move).
    - Keras 3: the dense step on ``grad.to_dense()`` (Keras 3's TensorFlow backend applies
      its formula to the slices; without duplicate indices that is the same). With the
      convention knob ``keras3_sparse_square`` (Keras 3's actual handling of *unsummed*
      duplicates): :math:`E_g \leftarrow \bar\rho E_g + \sum_i \overline{1-\rho}\, g_i^2`
      (the occurrences summed from zero in order), the step :math:`d_i` per occurrence on
      the gathered rows, :math:`E_x \leftarrow \bar\rho E_x + \sum_i
      \overline{1-\rho}\, d_i^2`, and :math:`w \leftarrow w + \eta_{32} d_i` one
      occurrence at a time.
    - PyTorch ("Adadelta does not support sparse gradients") and optax: TypeError.

    Where the forms differ, in short: the products :math:`(\overline{1-\rho} g) g` (tf_keras)
    vs :math:`\overline{1-\rho} g^2` (Keras 3, TF kernel, optax) vs torch's
    :math:`\mathrm{fma}(\overline{1-\rho} g, g, \cdot)`; ``1 - rho`` in float64 (Keras, torch,
    optax) or in the dtype from a float32 rho (TF kernel); TensorFlow's ``rsqrt``; the order
    of the scaled division (``(-r_x g)/r_g`` Keras, ``(r_x \cdot rsqrt) g`` TF, ``(r_x/r_g) g``
    torch and optax); FMAs in torch and optax; the defaults.

    float16: every form is evaluated with each operation rounded to float16 (as TensorFlow's
    Eigen and NumPy do); the FMA steps round once from float64. Not checked against torch or
    optax, which compute some float16 primitives in float32.

    Examples
    --------
    One step from zero state with ``g = 1``, ``rho = 0.5``, ``epsilon = 0.25`` (exact in
    binary): :math:`E_g = 0.5`, :math:`d = -\sqrt{0.25}/\sqrt{0.75}`:

    >>> import numpy as np
    >>> w = np.array([1.0], np.float64)
    >>> eg, ex = adadelta_initial_state(w)
    >>> r = adadelta_update(w, np.array([1.0]), eg, ex, learning_rate=1.0, rho=0.5,
    ...                     epsilon=0.25, convention="keras3")
    >>> r.accumulated_grad, bool(r.param[0] == 1 - 0.5 / np.sqrt(0.75))
    (array([0.5]), True)

    References
    ----------
    Zeiler, "ADADELTA: An Adaptive Learning Rate Method", arXiv:1212.5701 (2012).
    """
    param, grad, accumulated_grad, accumulated_delta, form = check_adadelta_args(
        param, grad, accumulated_grad, accumulated_delta, learning_rate=learning_rate,
        rho=rho, epsilon=epsilon, convention=convention)
    kw = (learning_rate, rho, epsilon)
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and _convention(convention).keras3_sparse_square:
                w, eg, ex = _keras3_slices(param, grad, accumulated_grad, accumulated_delta,
                                           *kw)
                return AdadeltaResult(np.asarray(w), np.asarray(eg), np.asarray(ex))
            grad = grad.deduplicate()
            if form == "tf_keras":
                w, eg, ex = _tf_keras_sparse(param, grad, accumulated_grad.copy(),
                                             accumulated_delta, *kw)
                return AdadeltaResult(np.asarray(w), np.asarray(eg), np.asarray(ex))
            if form == "keras3":
                grad = grad.to_dense()
            else:  # keras2, tf1: the present rows only
                rows = grad.indices
                w, eg, ex = param.copy(), accumulated_grad.copy(), accumulated_delta.copy()
                if rows.size:
                    w[rows], eg[rows], ex[rows] = adadelta_rows(
                        param[rows], grad.values, accumulated_grad[rows],
                        accumulated_delta[rows], learning_rate=learning_rate, rho=rho,
                        epsilon=epsilon, convention=convention)
                return AdadeltaResult(w, eg, ex)
        if form == "torch":  # the convention's root (knob `sqrt`: MKL's, torch.sqrt on CPU)
            w, eg, ex = _torch(param, grad, accumulated_grad, accumulated_delta, *kw,
                               sqrt=sqrt_function(_convention(convention)))
        elif form == "optax":  # the convention's jit mode
            w, eg, ex = _optax(param, grad, accumulated_grad, accumulated_delta, *kw,
                               jit=_convention(convention).optax_jit)
        else:
            w, eg, ex = _FORMS[form](param, grad, accumulated_grad, accumulated_delta, *kw)
    return AdadeltaResult(np.asarray(w), np.asarray(eg), np.asarray(ex))


def check_adadelta_args(param, grad, accumulated_grad, accumulated_delta, *, learning_rate,
                        rho, epsilon, convention):
    """Validate :func:`adadelta_update`'s arguments (its Raises section); return
    ``(param, grad, accumulated_grad, accumulated_delta, form)``. Shared with the fast
    backends' ``adadelta_update`` so that they raise the same errors."""
    param = as_float_array("param", param)
    conv = _convention(convention)
    form = _form(conv)
    if isinstance(grad, IndexedSlices):
        if form in _NO_SPARSE:
            raise TypeError(
                f"{'PyTorch' if form == 'torch' else 'optax'}'s Adadelta takes no sparse "
                "gradient; pass grad.to_dense(). Received: grad of type IndexedSlices with "
                f"adadelta_form={form!r}"
            )
        if param.ndim == 0:
            raise ValueError(
                "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). "
                "Received: a 0-d variable"
            )
    grad = check_grad(param, grad)
    accumulated_grad = check_like(param, "accumulated_grad", accumulated_grad)
    accumulated_delta = check_like(param, "accumulated_delta", accumulated_delta)
    check_hyper("learning_rate", learning_rate)
    if not learning_rate >= 0:
        raise ValueError(
            f"`learning_rate` must be >= 0. Received: learning_rate={learning_rate!r}")
    check_hyper("rho", rho)
    if not 0 <= rho <= 1:
        raise ValueError(f"`rho` must be in [0, 1]. Received: rho={rho!r}")
    check_hyper("epsilon", epsilon)
    if not epsilon >= 0:
        raise ValueError(f"`epsilon` must be >= 0. Received: epsilon={epsilon!r}")
    return param, grad, accumulated_grad, accumulated_delta, form
