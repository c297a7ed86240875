"""Adam and AMSGrad, dense and non-lazy sparse, as tf-keras 2.11+ computes them.

Follows ``tf_keras/optimizers/adam.py`` (``Adam.update_step``), which is also the update of
``tf_keras/optimizers/adamw.py`` (the decoupled decay is a separate step, see
:mod:`refopt.reference.weight_decay`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt import _libm
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

__all__ = ["AdamResult", "adam_update", "adam_scalars"]


class AdamResult(NamedTuple):
    """New arrays after one Adam step: ``param``, ``m``, ``v`` and ``vhat`` (None without AMSGrad)."""

    param: np.ndarray
    m: np.ndarray
    v: np.ndarray
    vhat: Optional[np.ndarray]


class AdamScalars(NamedTuple):
    """The per-step scalars of Adam, each rounded to the variable dtype."""

    alpha: np.floating
    one_minus_beta_1: np.floating
    one_minus_beta_2: np.floating
    epsilon: np.floating


def adam_scalars(dtype, *, learning_rate, beta_1, beta_2, epsilon, step):
    """The scalars of one Adam step, rounded as tf-keras rounds them.

    Parameters
    ----------
    dtype : numpy.dtype
        The variable dtype (float16, float32 or float64); every scalar is computed in it.
    learning_rate, beta_1, beta_2, epsilon : float
        Python numbers.
    step : int
        The 1-based time step ``t = iterations + 1``.

    Returns
    -------
    AdamScalars
        ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)`` evaluated left to right in ``dtype``, where
        ``lr`` is rounded to float32 first (tf-keras keeps it in a float32 variable), ``b`` is
        converted as ``tf.cast`` does (:func:`refopt.reference._common.tf_cast`: a Python float
        goes through float32, a NumPy scalar keeps its dtype), ``t`` is
        ``dtype(step)`` and ``b^t`` is the C library's ``powf``/``pow`` (what ``tf.pow`` calls
        on CPU; NumPy's vectorised ``np.power`` differs in the last bit on some CPUs, e.g.
        0.9**4); ``one_minus_beta_i = dtype(1 - beta_i)`` (the difference taken in float64,
        then rounded once, as tf-keras' Python expression ``1 - self.beta_1``);
        ``epsilon = dtype(epsilon)``.
    """
    for name, value in (("learning_rate", learning_rate), ("beta_1", beta_1),
                        ("beta_2", beta_2), ("epsilon", epsilon)):
        check_hyper(name, value)
    check_step(step)
    dtype = np.dtype(dtype)
    one = scalar(dtype, 1)
    t = scalar(dtype, step)
    p1 = _libm.power(dtype, tf_cast(dtype, beta_1), t)
    p2 = _libm.power(dtype, tf_cast(dtype, beta_2), t)
    alpha = lr_cast(dtype, learning_rate) * np.sqrt(one - p2) / (one - p1)
    return AdamScalars(
        alpha=alpha,
        one_minus_beta_1=scalar(dtype, 1 - beta_1),
        one_minus_beta_2=scalar(dtype, 1 - beta_2),
        epsilon=scalar(dtype, epsilon),
    )


def adam_update(param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    r"""One Adam (or AMSGrad) step; returns new arrays, inputs are never modified.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
        The gradient :math:`g`. An IndexedSlices takes the non-lazy sparse path (every row of
        ``m`` and ``v`` decays; every row of ``param`` may move); duplicate indices are summed
        first (:meth:`IndexedSlices.deduplicate`).
    m, v : ndarray like ``param``
        First and second moments.
    vhat : ndarray like ``param`` or None
        AMSGrad's running maximum of ``v``; ``None`` selects plain Adam.
    learning_rate : float
        :math:`\eta`, in parameter units per unit of normalised gradient.
    beta_1, beta_2 : float
        Decay rates in [0, 1).
    epsilon : float
        :math:`\hat\epsilon`, added to :math:`\sqrt{v}` (not bias-corrected: the
        "epsilon hat" of Kingma & Ba, just before their section 2.1).
    step : int
        The 1-based time step :math:`t` (the optimizer's ``iterations + 1``).

    Returns
    -------
    AdamResult
        ``(param, m, v, vhat)``, new arrays of the input dtype and shape (``vhat`` is None when
        it was None).

    Raises
    ------
    TypeError, ValueError
        If an array is not a float16/32/64 ndarray, or its shape or dtype differs from
        ``param``'s; if a hyperparameter is not a real number, or ``step`` not an integer
        >= 1. The message names the argument.

    Notes
    -----
    Every operation is done in the dtype of ``param``, in this order (dense gradient):

    .. math::

        \alpha &= \eta \sqrt{1-\beta_2^t} / (1-\beta_1^t) \\
        m &\leftarrow m + (g - m)(1-\beta_1) \\
        v &\leftarrow v + (g^2 - v)(1-\beta_2) \\
        \hat v &\leftarrow \max(\hat v, v) \quad\text{(AMSGrad only; then } v := \hat v) \\
        w &\leftarrow w - (m\alpha) / (\sqrt{v} + \hat\epsilon)

    See :func:`adam_scalars` for how each scalar is rounded. With an IndexedSlices gradient
    ``(idx, g)`` (deduplicated) tf-keras computes ``m <- m + (-m)(1-b1)`` densely, then
    ``m[idx] += g (1-b1)``; the same for ``v`` with ``g^2``; then the AMSGrad maximum and the
    dense ``w`` update. This equals the dense update on the summed gradient up to rounding
    (exactly, for the rows absent from ``idx``).

    Source: ``tf_keras/optimizers/adam.py`` (tf-keras 2.11+, ``Adam.update_step``); reproduces
    tf.keras 2.21 float32 bit for bit on the three-step vector of the semantics notes.

    Examples
    --------
    >>> import numpy as np
    >>> w, g, z = np.array([1.0, 2.0], np.float32), np.array([0.5, -0.5], np.float32), np.zeros(2, np.float32)
    >>> r = adam_update(w, g, z, z, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1)
    >>> r.param, r.m, r.v
    (array([0.9000013, 2.0999987], dtype=float32), array([ 0.05, -0.05], dtype=float32), array([0.00025, 0.00025], dtype=float32))

    References
    ----------
    Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015.
    Reddi, Kale & Kumar, "On the Convergence of Adam and Beyond", ICLR 2018 (AMSGrad).
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    s = adam_scalars(
        param.dtype,
        learning_rate=learning_rate,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        step=step,
    )
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            g = grad.deduplicate()
            m_new = m + (-m) * s.one_minus_beta_1
            m_new[g.indices] += g.values * s.one_minus_beta_1
            v_new = v + (-v) * s.one_minus_beta_2
            v_new[g.indices] += np.square(g.values) * s.one_minus_beta_2
        else:
            m_new = m + (grad - m) * s.one_minus_beta_1
            v_new = v + (np.square(grad) - v) * s.one_minus_beta_2
        vhat_new = None
        denom_v = v_new
        if vhat is not None:
            vhat_new = np.maximum(vhat, v_new)
            denom_v = vhat_new
        param_new = param - (m_new * s.alpha) / (np.sqrt(denom_v) + s.epsilon)
    return AdamResult(
        np.asarray(param_new), np.asarray(m_new), np.asarray(v_new),
        None if vhat_new is None else np.asarray(vhat_new),
    )
