"""Rprop (PyTorch's ``torch.optim.Rprop``) with the tf.keras 2.11+ API, in PyTorch's numerics.

Keras has no Rprop: the keyword names are torch's (``etas``, ``step_sizes``) written Keras
style (``learning_rate``). Only ``convention="torch"`` has it (the default here); the update
is :func:`refopt.reference.rprop_update` (readable NumPy, the reference backend) and
:mod:`refopt.rules.rprop` (the fast backends).
"""

from __future__ import annotations

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    optimizer_form,
)

__all__ = ["Rprop"]


class Rprop(Optimizer):
    r"""Resilient backpropagation (Riedmiller & Braun, 1993) as ``torch.optim.Rprop``.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        torch's ``lr``: every step size's start (its only use), >= 0. Default 0.01. With a
        schedule, its value at the step that builds the optimizer.
    etas : (float, float), optional
        ``(etaminus, etaplus)``, the factors a step size is multiplied by when the
        gradient's sign flips / stays; ``0 < etaminus < 1 < etaplus``. Default (0.5, 1.2).
    step_sizes : (float, float), optional
        ``(min, max)`` of the step sizes, finite, ``0 <= min <= max``. Default (1e-6, 50).
    {base_kwargs}

    Notes
    -----
    Slots (torch's names): ``prev`` (the previous gradient, zero where its sign flipped; it
    starts at zero) and ``step_size`` (per element; it starts at the learning rate). The
    update is written out in :func:`refopt.reference.rprop_update`. torch's Rprop has no
    weight decay (``weight_decay`` is refused) and takes no sparse gradients (refused). Every
    convention but ``"torch"`` is refused (``rprop_form="none"``: no other framework has
    Rprop).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, -2.0, 0.3], np.float32)
    >>> opt = refopt.Rprop(learning_rate=0.15)
    >>> opt.apply_gradients([(np.array([1.0, 2.0, 0.0], np.float32), w)])
    1
    >>> w
    array([ 0.85, -2.15,  0.3 ], dtype=float32)
    """

    slot_variables = ("prev", "step_size")

    def __init__(
        self,
        learning_rate=None,
        etas=None,
        step_sizes=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Rprop",
        backend=None,
        convention="torch",
        **kwargs,
    ):
        conv = _check_convention(convention)
        optimizer_form(conv, "Rprop")
        from refopt.reference.rprop import check_etas, check_step_sizes, rprop_defaults

        defaults = rprop_defaults(conv)
        if learning_rate is None:
            learning_rate = defaults["learning_rate"]
        self.etas = check_etas(defaults["etas"] if etas is None else etas)
        self.step_sizes = check_step_sizes(
            defaults["step_sizes"] if step_sizes is None else step_sizes)
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
        return "none"  # torch's Rprop has no weight decay

    def slot_initial_value(self, name, dtype):
        from refopt.reference._common import scalar

        if name == "step_size":  # torch: full_like(grad, lr) when the state is created
            return scalar(dtype, self.learning_rate)
        return scalar(dtype, 0)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        if lazy_rows or isinstance(grad, IndexedSlices):
            raise TypeError(
                "Rprop takes dense gradients only (torch.optim.Rprop does not support sparse "
                "gradients); pass grad.to_dense(). Received: an IndexedSlices gradient"
            )
        r = self._kernels.rprop_update(
            param, grad, slots["prev"], slots["step_size"], etas=self.etas,
            step_sizes=self.step_sizes, convention=self.convention)
        return r.param, {"prev": r.prev, "step_size": r.step_size}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`); None for
        sparse rows (refused by :meth:`_update_step`)."""
        from refopt.rules.rprop import rprop_call

        if lazy_rows:
            return None
        return rprop_call(dtype, etas=self.etas, step_sizes=self.step_sizes)

    def get_config(self):
        config = super().get_config()
        config.update(etas=tuple(self.etas), step_sizes=tuple(self.step_sizes))
        return config


Rprop.__doc__ = Rprop.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
