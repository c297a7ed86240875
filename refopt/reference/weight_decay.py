"""Decoupled weight decay, the step the tf-keras base optimizer applies before the update.

Follows ``tf_keras/optimizers/optimizer.py`` (``_apply_weight_decay``).
"""

from __future__ import annotations

import numpy as np

from refopt.reference._common import as_float_array, check_hyper, check_real, lr_cast, tf_cast

__all__ = ["apply_weight_decay"]


def apply_weight_decay(param, *, learning_rate, weight_decay):
    r"""Shrink a variable towards zero: :math:`w \leftarrow w - (w\lambda)\eta`.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`; not modified.
    learning_rate : float
        :math:`\eta`, the learning rate of this step (the schedule's value at the
        pre-increment ``iterations``).
    weight_decay : float
        :math:`\lambda`, per unit of learning rate.

    Returns
    -------
    ndarray
        The decayed variable, a new array of the input dtype and shape.

    Raises
    ------
    TypeError
        If ``param`` is not a float16/32/64 ndarray or a hyperparameter not a real number.

    Notes
    -----
    Computed in the dtype of ``param`` as ``w - (w * wd) * lr``, left to right, with ``lr``
    rounded to float32 first and ``wd`` converted as ``tf.cast`` does,
    as ``variable.assign_sub(variable * wd * lr)`` in tf-keras. ``LazyAdam`` calls it on the
    gathered rows of a sparse gradient only, so absent rows are not decayed. The decay is decoupled from
    the gradient (Loshchilov & Hutter) and multiplied by the learning rate, like PyTorch's
    ``AdamW``; TF-Addons' ``AdamW`` does *not* multiply by the learning rate.
    """
    param = as_float_array("param", param)
    check_hyper("learning_rate", learning_rate)
    check_real("weight_decay", weight_decay, low=0)  # as the optimizers' weight_decay
    dtype = param.dtype
    wd = tf_cast(dtype, weight_decay)
    lr = lr_cast(dtype, learning_rate)
    with np.errstate(all="ignore"):
        return np.asarray(param - param * wd * lr)
