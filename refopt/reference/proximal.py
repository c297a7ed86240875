"""TF1's proximal optimizers, dense and sparse: ProximalAdagrad and ProximalGradientDescent.

Both take a plain (Adagrad or gradient-descent) step and then the *proximal* step of the
regularisation ``l1 |w| + l2/2 w^2`` (FOBOS, Duchi & Singer 2009): soft-thresholding by the
step's ``lr * l1`` and a shrink by ``1 + lr * l2``. Only TensorFlow 1 has them
(``tf.compat.v1.train.ProximalAdagradOptimizer``, ``ProximalGradientDescentOptimizer``);
the conventions' knobs ``proximal_adagrad_form`` and ``proximal_sgd_form`` are ``"tf1"``
under the ``"tf1"`` preset and ``"none"`` elsewhere.

Sources (read for facts only; nothing here is copied from them):

====================  =========================================================================
optimizer             framework file
====================  =========================================================================
ProximalAdagrad       ``tensorflow/python/training/proximal_adagrad.py`` and TensorFlow's
                      ``core/kernels/training_ops.cc`` (``ApplyProximalAdagrad``,
                      ``SparseApplyProximalAdagrad`` on CPU)
ProximalGradient-     ``tensorflow/python/training/proximal_gradient_descent.py``,
Descent               ``training_ops.cc`` (``ApplyProximalGradientDescent``,
                      ``SparseApplyProximalGradientDescent``)
both                  ``tensorflow/python/training/optimizer.py`` (``apply_gradients``: an
                      ``IndexedSlices`` gradient is de-duplicated, its repeated indices summed,
                      before the sparse kernel sees it)
====================  =========================================================================

Facts checked on TensorFlow 2.15.1 (``tf.compat.v1``, graph mode, CPU); see
``conformance/README.md``, section "Sparse and proximal (TF1)":

- the dense kernels compute ``a += g*g``, ``lr_t = lr * rsqrt(a)``, ``v = w - g*lr_t``, then
  ``w = sign(v) * max(|v| - lr_t*l1, 0) / (1 + l2*lr_t)`` when ``l1 > 0``, else
  ``w = v / (1 + l2*lr_t)`` (ProximalGradientDescent: ``lr_t = lr``, no accumulator);
- the sparse kernels loop over the given rows *one after another*: rows of several elements
  take the dense formula; rows of one element (a 1-D variable or shape ``(n, 1)``) compute
  ``lr_t = lr / sqrt(a)`` and divide by ``1.0 + l2*lr_t`` **in double** (the literal ``1.0``
  promotes a float32 quotient to double, rounded once to float32 at the end);
- the optimizers sum duplicate indices first, so through the optimizer a repeated row moves
  once, by the sum (the raw ops ``tf.raw_ops.SparseApplyProximal*`` would apply each
  occurrence in turn);
- an empty gradient changes nothing; rows absent from the gradient (and their accumulator)
  do not move;
- the dense optimizers do not cast their hyperparameters: a float64 variable with Python-float
  hyperparameters raises ``TypeError`` in TF (``lr`` is a float32 tensor); the resource
  sparse path casts them through float32. refopt computes every float64 step with the
  hyperparameters cast through float32 (``tf.cast``: a NumPy float64 keeps its value), which
  is TensorFlow's result given float64 tensors of those values.
"""

from __future__ import annotations

import warnings
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
    scalar,
    tf_cast,
)
from refopt.reference.rmsprop import rsqrt

__all__ = [
    "ProximalAdagradResult",
    "ProximalGradientDescentResult",
    "proximal_adagrad_defaults",
    "proximal_adagrad_initial_state",
    "proximal_adagrad_rows",
    "proximal_adagrad_update",
    "proximal_gradient_descent_defaults",
    "proximal_gradient_descent_rows",
    "proximal_gradient_descent_update",
]

_F64 = np.dtype(np.float64)


class ProximalAdagradResult(NamedTuple):
    """New arrays after one ProximalAdagrad step: ``param`` and ``accumulator`` (the running
    sum of squared gradients, TF1's slot "accumulator")."""

    param: np.ndarray
    accumulator: np.ndarray


class ProximalGradientDescentResult(NamedTuple):
    """The new ``param`` after one ProximalGradientDescent step (it has no slot)."""

    param: np.ndarray


# TF1's constructor defaults; the learning rate is required (None).
_PA_DEFAULTS = {"tf1": {"learning_rate": None, "initial_accumulator_value": 0.1,
                            "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0}}
_PGD_DEFAULTS = {"tf1": {"learning_rate": None, "l1_regularization_strength": 0.0,
                             "l2_regularization_strength": 0.0}}

_KNOBS = {"ProximalAdagrad": "proximal_adagrad_form",
          "ProximalGradientDescent": "proximal_sgd_form"}


def _convention(convention):
    if convention is None:
        return get_convention("tf1")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf1), a preset name or a refopt.conventions.Convention. "
        f"Received: convention={convention!r}"
    )


def proximal_form(convention, optimizer):
    """The form of ``optimizer`` (``"ProximalAdagrad"`` or ``"ProximalGradientDescent"``)
    under ``convention`` (None: tf1): its knob's value, ``"tf1"``.

    Raises
    ------
    ValueError
        Where the knob is ``"none"`` (the framework has no such optimizer), naming both.
    """
    from refopt.conventions import PRESETS

    conv = _convention(convention)
    knob = _KNOBS[optimizer]
    form = getattr(conv, knob)
    if form == "none":
        having = [n for n, p in PRESETS.items() if getattr(p, knob) != "none"]
        raise ValueError(
            f"{optimizer} does not exist under convention={conv.name!r} (its `{knob}` is "
            f"'none': {conv.framework} has no {optimizer}; the presets that have it: "
            f"{', '.join(having)}). Received: convention={conv.name!r}")
    return form


def proximal_adagrad_defaults(convention=None):
    """TF1's ``ProximalAdagradOptimizer`` defaults under refopt's names: ``learning_rate``
    None (required), ``initial_accumulator_value`` 0.1, ``l1_regularization_strength`` and
    ``l2_regularization_strength`` 0. Raises ValueError where the convention has none."""
    return dict(_PA_DEFAULTS[proximal_form(convention, "ProximalAdagrad")])


def proximal_gradient_descent_defaults(convention=None):
    """TF1's ``ProximalGradientDescentOptimizer`` defaults: ``learning_rate`` None
    (required), both regularisation strengths 0. Raises ValueError where the convention has
    none."""
    return dict(_PGD_DEFAULTS[proximal_form(convention, "ProximalGradientDescent")])


def check_float32(name, value):
    """Refuse a finite ``value`` that overflows float32 (``1e39``): TF1 makes a float32
    tensor of a Python float (the learning rate, the strengths), which would hold inf.
    Returns ``value``; raises ValueError naming ``name``."""
    with np.errstate(over="ignore"):
        if np.isfinite(value) and not np.isfinite(np.float32(value)):
            raise ValueError(f"`{name}` must be finite in float32 (TF1 makes a float32 tensor "
                             f"of it). Received: {name}={value!r}")
    return value


def check_strength(name, value):
    """``l1_regularization_strength`` or ``l2_regularization_strength``: a real number,
    finite, >= 0 and finite in float32. Returns it; TypeError or ValueError naming it."""
    return check_float32(name, check_real(name, value, low=0))


def warn_if_accumulator_underflows(initial_accumulator_value, dtype):
    """Warn (RuntimeWarning) when ``initial_accumulator_value`` (> 0) rounds to 0 in
    ``dtype``: the accumulator starts at 0, as TF1's ``constant(value, dtype)`` does, and an
    element whose first gradient is 0 then becomes NaN (``0 * rsqrt(0)``)."""
    with np.errstate(under="ignore"):
        zero = scalar(dtype, initial_accumulator_value) == 0
    if zero:
        warnings.warn(
            f"initial_accumulator_value={initial_accumulator_value!r} rounds to 0 in "
            f"{np.dtype(dtype)}: the accumulator starts at 0 (as TF1's does), and an element "
            "whose first gradient is 0 becomes NaN", RuntimeWarning, stacklevel=3)


def proximal_adagrad_initial_state(param, *, initial_accumulator_value=0.1, convention=None):
    """A fresh accumulator for ``param``: ``initial_accumulator_value`` (> 0, TF1's rule)
    converted straight to ``param``'s dtype (TF1's ``constant_op.constant(value,
    dtype=var.dtype)``), a new array of ``param``'s shape.

    Raises
    ------
    TypeError
        ``param`` not a float16/32/64 ndarray; the value not a real number.
    ValueError
        The value not finite or not > 0; a convention without ProximalAdagrad.

    Warns
    -----
    RuntimeWarning
        The value rounds to 0 in ``param``'s dtype (``1e-50`` in float32).
    """
    param = as_float_array("param", param)
    proximal_form(convention, "ProximalAdagrad")
    check_real("initial_accumulator_value", initial_accumulator_value, low=0, low_open=True)
    warn_if_accumulator_underflows(initial_accumulator_value, param.dtype)
    return np.full(param.shape, scalar(param.dtype, initial_accumulator_value), param.dtype)


# ----------------------------------------------------------------------------- the steps
def _shrink(v, t):
    """``sign(v) * max(|v| - t, 0)`` with Eigen's ``sign`` (0 at +-0; NaN gives NaN)."""
    dt = v.dtype.type
    s = np.where(v > 0, dt(1), np.where(v < 0, dt(-1), dt(0)))
    return s * np.maximum(np.abs(v) - t, dt(0))


def _divide(num, den, wide):
    """``num / den``; ``wide``: computed in double and rounded once to the dtype, as the
    sparse kernels' one-element rows divide by ``1.0 + ...`` (``den`` then a float64)."""
    if not wide or num.dtype == _F64:
        return num / den.astype(num.dtype)
    return (num.astype(np.float64) / den).astype(num.dtype)


def _proximal(v, lr_t, l1, l2, wide):
    """The proximal step of ``v`` with the step size ``lr_t`` (array or scalar)."""
    dt = v.dtype.type
    num = _shrink(v, lr_t * l1) if l1 > 0 else v
    if wide:  # 1.0 + l2*lr_t: the product in the dtype, the sum in double
        den = np.float64(1.0) + np.asarray(l2 * lr_t, dtype=np.float64)
    else:
        den = np.asarray(dt(1) + l2 * lr_t)
    return _divide(num, den, wide)


def _kernel_rsqrt(a):
    """Eigen's ``rsqrt`` on TF's CPU, as far as it is reproducible: float64 ``1/sqrt(a)``
    (two roundings, Eigen's double packet and scalar forms); float32 and float16 the
    correctly rounded one (TF's float32 is a hardware estimate refined by a Newton step, 1-2
    ulp off on about a fifth of inputs: not reproduced, the golden cases carry a bound)."""
    if a.dtype == _F64:
        return 1.0 / np.sqrt(a)
    return rsqrt(a)


def _scalars(dtype, learning_rate, l1, l2):
    """The hyperparameters as TF1's tensors in ``dtype`` (``tf.cast`` of a float32 tensor
    of a Python float; a NumPy scalar keeps its precision)."""
    return tf_cast(dtype, learning_rate), tf_cast(dtype, l1), tf_cast(dtype, l2)


def proximal_adagrad_rows(param, grad, accumulator, *, learning_rate,
                          l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                          one_element_rows=False):
    """One ProximalAdagrad step of the dense kernel (``one_element_rows=False``; also the
    sparse kernel's rows of several elements) or of the sparse kernel's one-element rows,
    on arrays already checked and (sparse) gathered, duplicates summed: new ``(param,
    accumulator)``."""
    lr, l1, l2 = _scalars(param.dtype, learning_rate, l1_regularization_strength,
                          l2_regularization_strength)
    with np.errstate(all="ignore"):
        acc = accumulator + grad * grad
        if one_element_rows:
            lr_t = lr / np.sqrt(acc)
            v = param - lr_t * grad
        else:
            lr_t = lr * _kernel_rsqrt(acc)
            v = param - grad * lr_t
        w = _proximal(v, lr_t, l1, l2, one_element_rows)
    return np.asarray(w, param.dtype), np.asarray(acc)


def proximal_gradient_descent_rows(param, grad, *, learning_rate,
                                   l1_regularization_strength=0.0,
                                   l2_regularization_strength=0.0, one_element_rows=False):
    """One ProximalGradientDescent step of the dense kernel (also the sparse kernel's rows of
    several elements) or of the sparse kernel's one-element rows, on checked arrays: the new
    param."""
    lr, l1, l2 = _scalars(param.dtype, learning_rate, l1_regularization_strength,
                          l2_regularization_strength)
    with np.errstate(all="ignore"):
        v = param - (lr * grad if one_element_rows else grad * lr)
        w = _proximal(v, lr, l1, l2, one_element_rows)
    return np.asarray(w, param.dtype)


def check_proximal_args(optimizer, param, grad, slots, *, learning_rate,
                        l1_regularization_strength, l2_regularization_strength, convention):
    """Validate the arguments of :func:`proximal_adagrad_update` (``slots``: the accumulator)
    or :func:`proximal_gradient_descent_update` (``slots`` empty); return ``(param, grad,
    slots)``. Shared with the fast backends' functions so they raise the same errors."""
    proximal_form(convention, optimizer)
    param = as_float_array("param", param)
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    slots = [check_like(param, "accumulator", a) for a in slots]
    check_float32("learning_rate", check_hyper("learning_rate", learning_rate))
    check_strength("l1_regularization_strength", l1_regularization_strength)
    check_strength("l2_regularization_strength", l2_regularization_strength)
    return param, grad, slots


def _row_width(param):
    return int(np.prod(param.shape[1:], dtype=np.int64))


def proximal_adagrad_update(param, grad, accumulator, *, learning_rate,
                            l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                            convention=None):
    r"""One ProximalAdagrad step as TF1 computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``; rank >= 1) has its repeated indices summed first (TF1's optimizer), then
        only its rows and their accumulator rows move.
    accumulator : ndarray like ``param``
        The running sum of squared gradients :math:`a` (:func:`proximal_adagrad_initial_state`:
        0.1 everywhere by default).
    learning_rate : float
        :math:`\eta >= 0`.
    l1_regularization_strength, l2_regularization_strength : float, default 0.0
        :math:`\lambda_1, \lambda_2 \ge 0`.
    convention : None, str or refopt.conventions.Convention
        None means tf1; its ``proximal_adagrad_form`` must be ``"tf1"``.

    Returns
    -------
    ProximalAdagradResult
        ``(param, accumulator)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a negative or
        non-finite hyperparameter, or one that overflows float32 (``1e39``: TF1's float32
        tensor would hold inf); a sparse gradient for a 0-d variable; a convention whose
        ``proximal_adagrad_form`` is ``"none"``. Messages name the argument and the value.

    Notes
    -----
    Every operation rounds once in the dtype of ``param``; :math:`\bar x` is the
    hyperparameter as ``tf.cast`` makes it (a Python float through float32);
    :math:`\mathrm{rsqrt}` is Eigen's: in float64 ``1/sqrt(a)`` (two roundings, reproduced:
    bit-identical), in float32 a hardware estimate with a Newton step, 1-2 ulp off on about a
    fifth of inputs, which refopt does not reproduce (it takes the correctly rounded one; the
    golden cases carry the measured bound). TF1's dense kernel ``ApplyProximalAdagrad``:

    .. math::

        a \leftarrow a + g^2, \quad \eta_t = \bar\eta\,\mathrm{rsqrt}(a), \quad
        v = w - g\,\eta_t, \\
        w \leftarrow \frac{\mathrm{sign}(v)\,\max(|v| - \eta_t\bar\lambda_1,\ 0)}
                          {1 + \bar\lambda_2\eta_t} \ \text{if}\ \bar\lambda_1 > 0,
        \quad\text{else}\quad w \leftarrow \frac{v}{1 + \bar\lambda_2\eta_t}

    (``sign(0) = 0``, so an element thresholded to zero from below is ``-0``). The sparse
    kernel applies the same to rows of several elements; on rows of **one element** it
    computes :math:`\eta_t = \bar\eta / \sqrt{a}` and the final quotient in double
    (:math:`1.0 + \bar\lambda_2\eta_t` with the product in the dtype), rounded once.
    Duplicate indices are summed first (from zero, in order of appearance, as TF's
    ``unsorted_segment_sum``); absent rows and their accumulator do not move; an empty
    gradient changes nothing.

    Examples
    --------
    One step from ``w = 1``, ``g = 1`` with the 0.1 start: ``a = 1.1``, ``v = 1 - 0.1/sqrt(1.1)``
    (TF 2.15 ``ProximalAdagradOptimizer(0.1)`` gives 0.9046537):

    >>> import numpy as np
    >>> w = np.ones(1, np.float32)
    >>> r = proximal_adagrad_update(w, w.copy(), proximal_adagrad_initial_state(w),
    ...                             learning_rate=0.1)
    >>> r.param, r.accumulator
    (array([0.9046537], dtype=float32), array([1.1], dtype=float32))

    References
    ----------
    Duchi & Singer, "Efficient Online and Batch Learning Using Forward Backward Splitting",
    JMLR 10 (2009); Duchi, Hazan & Singer, JMLR 12 (2011).
    """
    param, grad, (accumulator,) = check_proximal_args(
        "ProximalAdagrad", param, grad, [accumulator], learning_rate=learning_rate,
        l1_regularization_strength=l1_regularization_strength,
        l2_regularization_strength=l2_regularization_strength, convention=convention)
    kw = {"learning_rate": learning_rate, "l1_regularization_strength": l1_regularization_strength,
              "l2_regularization_strength": l2_regularization_strength}
    if isinstance(grad, IndexedSlices):
        with np.errstate(all="ignore"):
            grad = grad.deduplicate()
        rows = grad.indices
        w, acc = param.copy(), accumulator.copy()
        if rows.size:
            w[rows], acc[rows] = proximal_adagrad_rows(
                param[rows], grad.values, accumulator[rows],
                one_element_rows=_row_width(param) == 1, **kw)
        return ProximalAdagradResult(w, acc)
    w, acc = proximal_adagrad_rows(param, grad, accumulator, **kw)
    return ProximalAdagradResult(w, acc)


def proximal_gradient_descent_update(param, grad, *, learning_rate,
                                     l1_regularization_strength=0.0,
                                     l2_regularization_strength=0.0, convention=None):
    r"""One ProximalGradientDescent step as TF1 computes it; returns a new array.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient; an :class:`~refopt.IndexedSlices` has its repeated indices summed
        first (TF1's optimizer), then only its rows move.
    learning_rate : float
        :math:`\eta \ge 0`.
    l1_regularization_strength, l2_regularization_strength : float, default 0.0
        :math:`\lambda_1, \lambda_2 \ge 0`.
    convention : None, str or refopt.conventions.Convention
        None means tf1; its ``proximal_sgd_form`` must be ``"tf1"``.

    Returns
    -------
    ProximalGradientDescentResult
        ``(param,)``, a new array of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`proximal_adagrad_update`.

    Notes
    -----
    TF1's ``ApplyProximalGradientDescent`` (the scalars :math:`\bar\eta\bar\lambda_1` and
    :math:`1 + \bar\lambda_2\bar\eta` rounded in the dtype):

    .. math::

        v = w - g\,\bar\eta, \quad
        w \leftarrow \frac{\mathrm{sign}(v)\,\max(|v| - \bar\eta\bar\lambda_1,\ 0)}
                          {1 + \bar\lambda_2\bar\eta} \ \text{if}\ \bar\lambda_1 > 0,
        \quad\text{else}\quad w \leftarrow \frac{v}{1 + \bar\lambda_2\bar\eta}

    Sparse gradients as :func:`proximal_adagrad_update`: summed duplicates, only present
    rows; on rows of one element the quotient is computed in double (``1.0 + l2*lr``) and
    rounded once. No ``rsqrt``: every recorded case is bit-identical.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([1.0, 0.01], np.float32)
    >>> g = np.array([1.0, 0.0], np.float32)
    >>> proximal_gradient_descent_update(w, g, learning_rate=0.1,
    ...                                  l1_regularization_strength=0.5).param
    array([0.84999996, 0.        ], dtype=float32)
    """
    param, grad, _ = check_proximal_args(
        "ProximalGradientDescent", param, grad, [], learning_rate=learning_rate,
        l1_regularization_strength=l1_regularization_strength,
        l2_regularization_strength=l2_regularization_strength, convention=convention)
    kw = {"learning_rate": learning_rate, "l1_regularization_strength": l1_regularization_strength,
              "l2_regularization_strength": l2_regularization_strength}
    if isinstance(grad, IndexedSlices):
        with np.errstate(all="ignore"):
            grad = grad.deduplicate()
        rows = grad.indices
        w = param.copy()
        if rows.size:
            w[rows] = proximal_gradient_descent_rows(
                param[rows], grad.values, one_element_rows=_row_width(param) == 1, **kw)
        return ProximalGradientDescentResult(w)
    return ProximalGradientDescentResult(proximal_gradient_descent_rows(param, grad, **kw))
