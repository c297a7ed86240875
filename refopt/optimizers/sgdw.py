"""TF-Addons' ``SGDW``: SGD with decoupled weight decay not scaled by the learning rate.

Follows ``tensorflow_addons/optimizers/weight_decay_optimizers.py`` (TF-Addons 0.23,
``DecoupledWeightDecayExtension`` over ``tf.keras.optimizers.legacy.SGD``). It exists only
under ``convention="keras2"``, the convention of Keras 2's legacy optimizers and TF-Addons.
"""

from __future__ import annotations

from refopt.optimizers.base import BASE_KWARGS_DOC, _check_convention, check_real
from refopt.optimizers.sgd import SGD

__all__ = ["SGDW"]


class SGDW(SGD):
    r"""SGD with TF-Addons' decoupled weight decay (``tfa.optimizers.SGDW``), Keras 2 numerics.

    Parameters
    ----------
    weight_decay : float
        :math:`\lambda`, required (TF-Addons has no default), finite and >= 0. Each step, before
        the SGD update of a variable, ``w <- w - weight_decay * w``: **not** multiplied by the
        learning rate (TF-Addons' docs advise scheduling it together with the rate). The
        float is stored as a float32 hyperparameter and cast to the variable's dtype.
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 0.001
        TF-Addons' default (not SGD's 0.01).
    momentum : float, default 0.0
        In [0, 1]; Keras' velocity ``m <- m*momentum - g*lr; w <- w + m``.
    nesterov : bool, default False
    {base_kwargs}

    Raises
    ------
    TypeError
        ``weight_decay`` missing or not a number.
    ValueError
        A convention other than ``"keras2"`` (TF-Addons' optimizers are Keras 2 optimizers;
        the message names the convention received); ``weight_decay`` negative or not finite;
        and everything :class:`refopt.SGD` refuses.

    Notes
    -----
    One step of variable :math:`w` with gradient :math:`g` (after Keras 2's clipping):

    .. math::

        w' = w - \lambda w, \qquad m \leftarrow \mu m - \eta g, \qquad w \leftarrow w' + m

    For an :class:`~refopt.IndexedSlices` gradient only the rows present (duplicates summed
    first) decay, as TF-Addons' ``_decay_weights_sparse_op``; the SGD step is Keras 2's.
    With ``momentum=0`` an ``IndexedSlices`` gradient does **not** decay at all, as in
    TF-Addons 0.23 (Keras 2's SGD then scatter-adds the raw rows itself and never calls the
    method TF-Addons hooks; a TF-Addons bug, reproduced). Keras
    2's ``decay=`` (learning-rate decay) is accepted too and scales only the SGD step. A
    ``LearningRateSchedule`` as ``weight_decay`` (which TF-Addons takes) is not supported.
    torch's ``SGD(weight_decay=...)`` is an L2 term, and tf-keras' ``SGD(weight_decay=...)``
    multiplies by the learning rate: neither is this.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 2.0], np.float32)
    >>> opt = refopt.SGDW(weight_decay=0.1, learning_rate=0.5, convention="keras2")
    >>> _ = opt.apply_gradients([(np.array([0.2, 0.2], np.float32), w)])
    >>> w  # (1 - 0.1*1) - 0.5*0.2, (2 - 0.1*2) - 0.5*0.2
    array([0.79999995, 1.6999999 ], dtype=float32)
    """

    def __init__(self, weight_decay=None, learning_rate=0.001, momentum=0.0, nesterov=False,
                 name="SGDW", convention="keras2", **kwargs):
        conv = _check_convention(convention)
        if conv.adamw_weight_decay != "tfa":
            raise ValueError(
                f"SGDW is TF-Addons' (tfa.optimizers.SGDW), a Keras 2 optimizer: it exists only "
                f"under convention='keras2'. Use SGD (with `weight_decay` where the "
                f"framework has it) under convention={conv.name!r}. Received: "
                f"convention={conv.name!r}")
        if weight_decay is None:
            raise TypeError("SGDW requires a `weight_decay` (TF-Addons has no default). "
                            "Received: weight_decay=None")
        check_real("weight_decay", weight_decay, low=0)
        super().__init__(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov,
                         name=name, convention=conv, weight_decay=weight_decay, **kwargs)

    def _decay_mode(self):
        return self.convention.adamw_weight_decay

    @property
    def _decays_sparse(self):
        # TF-Addons' decay hooks _resource_apply_sparse, which Keras 2's SGD without momentum
        # bypasses (its _resource_apply_sparse_duplicate_indices scatter-adds directly)
        return self.momentum != 0


SGDW.__doc__ = SGDW.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
