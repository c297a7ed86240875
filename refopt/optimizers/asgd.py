"""ASGD (PyTorch's ``torch.optim.ASGD``) with the tf.keras 2.11+ API, in PyTorch's numerics.

Keras has no ASGD: the keyword names are torch's (``lambd``, ``alpha``, ``t0``) written
Keras style (``learning_rate``). Only ``convention="torch"`` has it (the default here);
the update is :func:`refopt.reference.asgd_update` (readable NumPy, the reference backend)
and :mod:`refopt.rules.asgd` (the fast backends).
"""

from __future__ import annotations


from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    optimizer_form,
)

__all__ = ["ASGD"]


class ASGD(Optimizer):
    r"""Averaged SGD (Polyak & Juditsky, 1992) as ``torch.optim.ASGD`` computes it.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        torch's ``lr``, >= 0. Default 0.01.
    lambd : float, optional
        The decay term (``w <- w * (1 - lambd * eta)`` every step, and the step size's
        decay), finite and >= 0. Default 1e-4.
    alpha : float, optional
        The power of the step size's decay, ``eta = lr / (1 + lambd*lr*t)**alpha``; finite.
        Default 0.75.
    t0 : float, optional
        The step after which ``ax`` averages the variables (before, it is a copy of them);
        finite. Default 1e6.
    {base_kwargs}

    Notes
    -----
    Slot: ``ax`` (torch's name: the average of the variables). torch's scalar state
    ``eta`` and ``mu`` (float32 0-d tensors) is derived from each variable's own step count
    (PyTorch counts per parameter) and the learning rate:
    :func:`refopt.reference.asgd.asgd_scalars`. That is torch's value exactly while the
    learning rate is constant; with a schedule, refopt's ``eta`` of step ``t`` uses the
    learning rate of step ``t`` where torch's uses the one in force when step ``t - 1``
    ended (torch computes ``eta`` for the next step at the end of each step).
    ``weight_decay`` is PyTorch's L2 term (``g + wd*w``, one FMA); sparse (IndexedSlices)
    gradients are refused, as torch refuses them. Every convention but ``"torch"`` is
    refused (``asgd_form="none"``: no other framework has ASGD).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0], np.float32)
    >>> opt = refopt.ASGD()
    >>> opt.apply_gradients([(np.array([0.5], np.float32), w)])
    1
    >>> w, opt.get_slot(w, "ax")
    (array([0.994999], dtype=float32), array([0.994999], dtype=float32))
    """

    slot_variables = ("ax",)

    def __init__(
        self,
        learning_rate=None,
        lambd=None,
        alpha=None,
        t0=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="ASGD",
        backend=None,
        convention="torch",
        **kwargs,
    ):
        conv = _check_convention(convention)
        optimizer_form(conv, "ASGD")
        from refopt.reference.asgd import asgd_defaults

        defaults = asgd_defaults(conv)
        if learning_rate is None:
            learning_rate = defaults["learning_rate"]
        self.lambd = check_real("lambd", defaults["lambd"] if lambd is None else lambd, low=0)
        self.alpha = check_real("alpha", defaults["alpha"] if alpha is None else alpha)
        self.t0 = check_real("t0", defaults["t0"] if t0 is None else t0)
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
        # PyTorch's L2 term inside the update; no other framework has ASGD
        return "l2" if self.convention.asgd_form == "torch" else "none"

    def _scalars(self, learning_rate, step):
        from refopt.reference.asgd import asgd_scalars

        return asgd_scalars(learning_rate, self.lambd, self.alpha, self.t0, step)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.variants import l2_torch

        if lazy_rows or isinstance(grad, IndexedSlices):
            raise TypeError(
                "ASGD takes dense gradients only (torch.optim.ASGD does not support sparse "
                "gradients); pass grad.to_dense(). Received: an IndexedSlices gradient"
            )
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            grad = l2_torch(grad, param, weight_decay)
        eta, mu = self._scalars(learning_rate, step)
        r = self._kernels.asgd_update(
            param, grad, slots["ax"], learning_rate=learning_rate, lambd=self.lambd,
            alpha=self.alpha, t0=self.t0, step=step, eta=eta, mu=mu, convention=self.convention)
        return r.param, {"ax": r.ax}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`); None for
        sparse rows (refused by :meth:`_update_step`)."""
        from refopt.rules.asgd import asgd_call

        if lazy_rows:
            return None
        eta, mu = self._scalars(learning_rate, step)
        return asgd_call(dtype, lambd=self.lambd, eta=eta, mu=mu)

    def get_config(self):
        config = super().get_config()
        config.update(lambd=self.lambd, alpha=self.alpha, t0=self.t0)
        return config


ASGD.__doc__ = ASGD.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
