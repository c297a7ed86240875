"""Lion with the tf.keras 2.11+ API, in Keras 3's, tf_keras' and optax's numerics.

Follows ``keras/src/optimizers/lion.py`` and ``tf_keras/optimizers/lion.py`` for the API and
keyword names; the update of each convention is :func:`refopt.reference.lion_update`
(readable NumPy, the reference backend) and :mod:`refopt.rules.lion` (the fast backends).
PyTorch, Keras 2 and TF1 have no Lion: those conventions are refused.
"""

from __future__ import annotations

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    default_learning_rate,
    optimizer_form,
)

__all__ = ["Lion"]


class Lion(Optimizer):
    r"""Lion (Chen et al., 2023), the sign of an interpolated momentum, in each framework's
    numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size: every element moves by exactly this much (times the sign). Default 0.001
        (Keras); optax's ``lion`` has none, so it is required under ``"optax"``.
    beta_1 : float, default 0.9
        Interpolation between the momentum and the gradient for the sign, in (0, 1] (Keras'
        check).
    beta_2 : float, default 0.99
        Decay of the momentum, in [0, 1].
    weight_decay : float, optional
        Keras (``"tf_keras"``, ``"keras3"``): the base class's decoupled decay before the
        update, ``w <- w - w * weight_decay * lr``; default None (none). optax: ``lion``'s
        own decay inside the update, ``w <- w - lr * (sign + weight_decay * w)``; default
        **1e-3** (optax's); 0 switches it off (optax skips a zero).
    {base_kwargs}

    Notes
    -----
    Slot: ``m`` (Keras' ``momentums``, optax's ``mu``). The update rules are written out in
    :func:`refopt.reference.lion_update`. Keras casts the betas to the variable dtype
    through float32 and rounds ``1 - beta`` there; optax rounds ``1 - b`` once and XLA
    contracts the interpolations into FMAs; XLA's sign keeps ``-0.0``.

    IndexedSlices gradients (duplicate indices summed first): tf_keras' sparse branch is not
    lazy (every row moves by ``lr * sign(beta_1 * m)``, and ``m`` is rescaled by
    ``beta_2 / beta_1``); Keras 3 applies its dense step to the summed gradient; optax
    refuses them.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, -2.0, 0.5], np.float32)
    >>> opt = refopt.Lion(learning_rate=0.1, convention="keras3")
    >>> opt.apply_gradients([(np.array([0.3, -0.2, 0.0], np.float32), w)])
    1
    >>> w
    array([ 0.9, -1.9,  0.5], dtype=float32)
    """

    slot_variables = ("m",)

    def __init__(
        self,
        learning_rate=None,
        beta_1=0.9,
        beta_2=0.99,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Lion",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        conv = _check_convention(convention)
        optimizer_form(conv, "Lion")
        from refopt.reference.lion import lion_defaults

        defaults = lion_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "Lion")
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, low_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1)
        if weight_decay is None:
            weight_decay = defaults["weight_decay"]
        super().__init__(
            name=name,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            jit_compile=jit_compile,
            backend=backend,
            convention=conv if isinstance(convention, dict) else convention,
            **kwargs,
        )

    def _decay_mode(self):
        """Keras' decoupled step, or optax's decay inside the update."""
        return "optax" if self.convention.lion_form == "optax" else "decoupled"

    def _sparse_update_kind(self):
        # Keras 3: its dense step on the summed gradient (unless the convention keeps the
        # raw duplicates: keras3_sparse_square); tf_keras' own sparse branch is the
        # reference's (the host path)
        conv = self.convention
        return "densify" if conv.lion_form == "keras3" and not conv.keras3_sparse_square \
            else None

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
        if isinstance(grad, IndexedSlices) and conv.lion_form == "optax":
            raise TypeError(
                "convention='optax': optax's lion takes no sparse gradient. Received an "
                "IndexedSlices gradient"
            )
        r = self._kernels.lion_update(param, grad, slots["m"], learning_rate=learning_rate,
                                      beta_1=self.beta_1, beta_2=self.beta_2,
                                      convention=conv, weight_decay=weight_decay)
        return r.param, {"m": r.m}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one dense step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.lion import lion_call

        if lazy_rows:  # Lion is never lazy
            return None
        return lion_call(dtype, self.convention, learning_rate=learning_rate,
                         beta_1=self.beta_1, beta_2=self.beta_2,
                         optax_weight_decay=optax_weight_decay)

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2)
        return config


Lion.__doc__ = Lion.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
