"""SGD with momentum and Nesterov momentum, as tf-keras 2.11+ computes it.

Follows ``tf_keras/optimizers/sgd.py`` (``SGD.update_step``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_flag,
    check_grad,
    check_hyper,
    check_like,
    check_real,
    lr_cast,
    tf_cast,
)

__all__ = ["SGDResult", "sgd_update"]


class SGDResult(NamedTuple):
    """New arrays after one SGD step: ``param`` and the momentum buffer ``m``."""

    param: np.ndarray
    m: np.ndarray


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
        The gradient. Duplicate indices of an IndexedSlices are summed first.
    m : ndarray like ``param``
        The momentum buffer (a *velocity* in parameter units: it already contains ``-lr``).
        tf-keras keeps it even when ``momentum == 0``.
    learning_rate : float
        :math:`\eta`.
    momentum : float
        :math:`\mu` in [0, 1].
    nesterov : bool
        Use Nesterov momentum.

    Returns
    -------
    SGDResult
        ``(param, m)`` as new arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        If an array is not a float16/32/64 ndarray or does not match ``param``, a
        hyperparameter is not a real number, or ``nesterov`` not a bool.

    Notes
    -----
    Dense gradient, every operation in the dtype of ``param``:

    .. math::

        m &\leftarrow (-g)\eta + m\mu \\
        w &\leftarrow w + m \quad\text{or, Nesterov,}\quad w \leftarrow w + ((-g)\eta + m\mu)

    (the Nesterov form uses the *updated* ``m``). With an IndexedSlices ``(idx, g)``:
    ``m <- m*mu`` densely, ``m[idx] += (-g)*eta``; then ``w <- w + m``, or, Nesterov,
    ``w[idx] += (-g)*eta`` followed by ``w <- w + m*mu``. Convention difference: PyTorch keeps
    ``b = mu*b + g`` and steps ``w -= lr*b`` (velocity without the learning rate).

    ``learning_rate`` is rounded to float32 first (tf-keras' float32 variable) and
    ``momentum`` converted as ``tf.cast`` does (see :func:`refopt.reference.adam_scalars`).

    Source: ``tf_keras/optimizers/sgd.py`` (tf-keras 2.11+).
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    check_hyper("learning_rate", learning_rate)
    check_real("momentum", momentum, low=0, high=1)  # as refopt.SGD
    nesterov = check_flag("nesterov", nesterov)
    dtype = param.dtype
    lr = lr_cast(dtype, learning_rate)
    mu = tf_cast(dtype, momentum)
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            g = grad.deduplicate()
            add = (-g.values) * lr
            m_new = m * mu
            m_new[g.indices] += add
            if nesterov:
                param_new = param.copy()
                param_new[g.indices] += add
                param_new = param_new + m_new * mu
            else:
                param_new = param + m_new
        else:
            m_new = (-grad) * lr + m * mu
            if nesterov:
                param_new = param + ((-grad) * lr + m_new * mu)
            else:
                param_new = param + m_new
    return SGDResult(np.asarray(param_new), np.asarray(m_new))
