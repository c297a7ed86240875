"""Adamax with the tf.keras 2.11+ API, in every framework's numerics.

Follows ``keras/src/optimizers/adamax.py`` and ``tf_keras/optimizers/adamax.py`` for the API
and keyword names; the update of each convention is :func:`refopt.reference.adamax_update`
(readable NumPy, the reference backend) and :mod:`refopt.rules.adamax` (the fast backends).
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    default_learning_rate,
    optimizer_form,
)

__all__ = ["Adamax"]


class Adamax(Optimizer):
    r"""Adamax (Kingma & Ba, 2015, section 7.1) in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: the convention's (0.001 Keras, **0.002** PyTorch); optax's
        ``adamax`` has none, so it is required there.
    beta_1 : float, default 0.9
        Decay of the first moment, in [0, 1).
    beta_2 : float, default 0.999
        Decay of the infinity norm, in [0, 1).
    epsilon : float, optional
        Default: 1e-7 Keras, 1e-8 PyTorch and optax. Added to ``u`` in the denominator
        (Keras; under ``"keras2"`` 0 means 1e-7), or inside the maximum,
        ``u = max(beta_2*u, |g| + eps)`` (PyTorch, optax), so that it is stored in ``u``.
    {base_kwargs}

    Notes
    -----
    Slots: ``m`` (the first moment) and ``u`` (the exponentially weighted infinity norm:
    Keras 2's slot ``v``, PyTorch's ``exp_inf``, optax's ``nu``), zeros at the start. The
    update rules of the five forms are written out in :func:`refopt.reference.adamax_update`.
    ``weight_decay`` is Keras' decoupled decay (tf_keras, Keras 3) or PyTorch's L2 term
    (``g + wd*w``, dense gradients only); Keras 2 and optax's ``adamax`` have none. TF1 has no
    Adamax: ``convention="tf1"`` is refused.

    IndexedSlices gradients (duplicate indices summed first): tf_keras decays ``m`` and ``u``
    on every row and updates the whole variable (non-lazy); Keras 2 updates only the present
    rows; Keras 3 applies its dense step (with the knob ``keras3_sparse_square``, to the raw
    slices: the maximum sees the sum of ``|g|`` of duplicates); PyTorch and optax refuse them.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0], np.float32)
    >>> opt = refopt.Adamax(learning_rate=0.1)
    >>> opt.apply_gradients([(w.copy(), w)])
    1
    >>> w, opt.get_slot(w, "m"), opt.get_slot(w, "u")
    (array([0.90000004], dtype=float32), array([0.1], dtype=float32), array([1.], dtype=float32))
    """

    slot_variables = ("m", "u")

    def __init__(
        self,
        learning_rate=None,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Adamax",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        conv = _check_convention(convention)
        optimizer_form(conv, "Adamax")
        from refopt.reference.adamax import adamax_defaults

        defaults = adamax_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "Adamax")
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1, high_open=True)
        if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
            epsilon = defaults["epsilon"]
        self.epsilon = check_real("epsilon", epsilon, low=0)
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

    @property
    def _lazy_sparse(self):
        """Keras 2 alone updates only the present rows of an IndexedSlices gradient."""
        return self.convention.adamax_form == "keras2"

    def _sparse_update_kind(self):
        # Keras 3: its dense step on the summed gradient (unless the raw-slices knob is on);
        # tf_keras' whole-table update and the refusals (torch, optax): the host path
        conv = self.convention
        if conv.adamax_form == "keras3" and not conv.keras3_sparse_square:
            return "densify"
        return None

    def _hyper(self):
        return dict(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.adamax import adamax_rows
        from refopt.reference.variants import l2_torch

        conv = self.convention
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            if lazy_rows or isinstance(grad, IndexedSlices):
                raise TypeError(
                    f"convention={conv.name!r}: Adamax's weight_decay is not compatible with "
                    "sparse gradients (PyTorch refuses sparse gradients). Received an "
                    f"IndexedSlices gradient with weight_decay={weight_decay!r}"
                )
            grad = l2_torch(grad, param, weight_decay)
        kw = dict(learning_rate=learning_rate, step=step, convention=conv, **self._hyper())
        if lazy_rows:  # Keras 2: the present rows, gathered (duplicates summed)
            p, m, u = adamax_rows(param, grad, slots["m"], slots["u"], **kw)
            return p, {"m": m, "u": u}
        r = self._kernels.adamax_update(param, grad, slots["m"], slots["u"], **kw)
        return r.param, {"m": r.m, "u": r.u}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.adamax import adamax_call

        return adamax_call(np.dtype(dtype), self.convention, learning_rate=learning_rate,
                           step=step, lazy_rows=lazy_rows, **self._hyper())

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return config


Adamax.__doc__ = Adamax.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
