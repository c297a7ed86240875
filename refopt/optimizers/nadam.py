"""Nadam with the tf.keras 2.11+ API, in every framework's numerics.

Follows ``keras/src/optimizers/nadam.py`` and ``tf_keras/optimizers/nadam.py`` for the API and
keyword names (plus PyTorch's ``momentum_decay`` and ``decoupled_weight_decay`` under its
convention); the update of each convention is :func:`refopt.reference.nadam_update` (readable
NumPy, the reference backend) and :mod:`refopt.rules.nadam` (the fast backends).
"""

from __future__ import annotations

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_bool,
    check_real,
    default_learning_rate,
    optimizer_form,
)

__all__ = ["Nadam"]


class Nadam(Optimizer):
    r"""Nadam (Dozat, 2016): Adam with Nesterov momentum, in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: the convention's (0.001 Keras, 0.002 PyTorch); optax's ``nadam``
        has none, so it is required there. Keras 2's legacy Nadam refuses schedules, and so
        does refopt under ``"keras2"``.
    beta_1, beta_2 : float, default 0.9, 0.999
        The moments' decay rates, in [0, 1).
    epsilon : float, optional
        Default: 1e-7 Keras, 1e-8 PyTorch and optax; >= 0. Keras 2 turns 0 into 1e-7.
    momentum_decay : float, optional
        PyTorch's :math:`\psi` in its momentum schedule
        :math:`\mu_t = \beta_1 (1 - 0.5 \cdot 0.96^{t\psi})`, >= 0; default 0.004; accepted
        under ``convention="torch"`` only (Keras 3 and tf_keras use :math:`0.96^t`, Keras 2 a
        fixed :math:`0.96^{0.004 t}`, optax no schedule).
    decoupled_weight_decay : bool, optional
        PyTorch's NAdamW switch: ``weight_decay`` multiplies the variable by
        ``1 - lr * weight_decay`` before the step instead of adding ``weight_decay * w`` to
        the gradient; default False; accepted under ``convention="torch"`` only.
    eps_root : float, optional
        optax's ``eps_root`` inside the square root, :math:`\sqrt{\hat v + \epsilon_r}`
        (finite, >= 0; None or 0: none); a nonzero value is accepted under
        ``convention="optax"`` (``nadam_form="optax"``) only.
    {base_kwargs}

    Notes
    -----
    Slots: ``m`` and ``v`` (Keras' momentums and velocities, torch's ``exp_avg`` and
    ``exp_avg_sq``, optax's ``mu`` and ``nu``). The momentum schedule's running product
    (Keras' ``_u_product``, one scalar per optimizer in the dtype of the first variable;
    Keras 2's ``momentum_cache``, likewise; PyTorch's ``mu_product``, one float32 scalar per
    parameter) is not a slot: it is a function of the step count (of each variable's own
    count under PyTorch), :func:`refopt.reference.nadam.momentum_product`, so checkpoints
    restore it exactly. The update rules of the five forms are written out in
    :func:`refopt.reference.nadam_update`. ``weight_decay`` is Keras' decoupled decay
    (tf_keras, Keras 3) or PyTorch's L2 term or, with ``decoupled_weight_decay``, its
    multiplicative decay; Keras 2 and optax's ``nadam`` have none. TF1 has no Nadam.

    IndexedSlices gradients (duplicate indices summed first): tf_keras decays both moments
    on every row and moves every row; Keras 2 decays both moments on every row and moves the
    present rows only; Keras 3 applies its dense step to the summed gradient; PyTorch and
    optax refuse them.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0], np.float32)
    >>> opt = refopt.Nadam(learning_rate=0.1, convention="keras3")
    >>> opt.apply_gradients([(w.copy(), w)])
    1
    >>> w
    array([0.8937212], dtype=float32)
    """

    slot_variables = ("m", "v")

    # Keras 2's legacy Nadam takes `decay` and never applies it (its _prepare_local reads the
    # raw learning-rate hyperparameter, not _decayed_lr); TF 2.15, issue 12 item 6
    _legacy_decay_ignored = True

    def __init__(
        self,
        learning_rate=None,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=None,
        momentum_decay=None,
        decoupled_weight_decay=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Nadam",
        backend=None,
        convention="tf_keras",
        eps_root=None,
        **kwargs,
    ):
        from refopt import schedules as _schedules
        from refopt.reference.nadam import nadam_defaults

        conv = _check_convention(convention)
        form = optimizer_form(conv, "Nadam")
        defaults = nadam_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "Nadam")
        if form == "keras2" and isinstance(learning_rate, _schedules.LearningRateSchedule):
            raise ValueError(
                "convention='keras2': Keras 2's legacy Nadam does not support learning-rate "
                f"schedules. Received: learning_rate={learning_rate!r}"
            )
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1, high_open=True)
        if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
            epsilon = defaults["epsilon"]
        self.epsilon = check_real("epsilon", epsilon, low=0)
        if momentum_decay is not None:
            momentum_decay = check_real("momentum_decay", momentum_decay, low=0)
            if form != "torch":
                raise ValueError(
                    f"`momentum_decay` is PyTorch's option; convention={conv.name!r} has no "
                    f"momentum decay for Nadam. Received: momentum_decay={momentum_decay!r}"
                )
        elif form == "torch":
            momentum_decay = defaults["momentum_decay"]  # configs and checkpoints say it
        self.momentum_decay = momentum_decay
        if decoupled_weight_decay is not None:
            decoupled_weight_decay = check_bool("decoupled_weight_decay",
                                                decoupled_weight_decay)
            if form != "torch":
                raise ValueError(
                    "`decoupled_weight_decay` is PyTorch's option (NAdamW); "
                    f"convention={conv.name!r} has no such switch for Nadam. Received: "
                    f"decoupled_weight_decay={decoupled_weight_decay!r}"
                )
        elif form == "torch":
            decoupled_weight_decay = False
        self.decoupled_weight_decay = decoupled_weight_decay
        if eps_root is not None:
            eps_root = check_real("eps_root", eps_root, low=0)
            if eps_root and form != "optax":
                raise ValueError(
                    f"`eps_root` is optax's option; convention={conv.name!r} has no such term "
                    f"for Nadam. Received: eps_root={eps_root!r}")
        self.eps_root = eps_root or None
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
    def learning_rate(self):
        return Optimizer.learning_rate.fget(self)

    @learning_rate.setter
    def learning_rate(self, value):
        from refopt import schedules as _schedules

        if (isinstance(value, _schedules.LearningRateSchedule)
                and self.convention.nadam_form == "keras2"):
            raise ValueError(
                "convention='keras2': Keras 2's legacy Nadam does not support learning-rate "
                f"schedules. Received: learning_rate={value!r}"
            )
        Optimizer.learning_rate.fset(self, value)

    #: torch's for-loop root (the ``sqrt`` knob; refopt.reference.sqrt): MKL's on the host
    _torch_sqrt = "loop"

    def _decay_mode(self):
        # getattr: the strategies probe this method on an object with a convention only
        if getattr(self, "decoupled_weight_decay", None):  # torch's NAdamW: p *= 1 - lr*wd
            return "torch"
        return self.convention.adam_weight_decay

    def _product_dtype(self):
        """The dtype of the Keras forms' shared momentum product: the first variable's."""
        return self._var_specs[0][1] if self._var_specs else None

    @property
    def _lazy_sparse(self):
        return False  # every form that takes IndexedSlices moves the moments of every row

    def _sparse_update_kind(self):
        # Keras 3: its dense step on the summed gradient; the others: their own sparse update
        conv = self.convention
        if conv.nadam_form == "keras3" and not conv.keras3_sparse_square:
            return "densify"
        return None

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.variants import l2_torch

        conv = self.convention
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            if lazy_rows or isinstance(grad, IndexedSlices):
                raise TypeError(
                    f"convention={conv.name!r}: Nadam's weight_decay is not compatible with "
                    "sparse gradients (PyTorch refuses sparse gradients). Received an "
                    f"IndexedSlices gradient with weight_decay={weight_decay!r}"
                )
            grad = l2_torch(grad, param, weight_decay)
        r = self._kernels.nadam_update(
            param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
            beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, step=step,
            convention=conv, momentum_decay=self.momentum_decay,
            product_dtype=self._product_dtype(), eps_root=self.eps_root)
        return r.param, {"m": r.m, "v": r.v}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one dense step (see :meth:`Optimizer.update_rule`); None
        for a lazy row step (Nadam has none)."""
        from refopt.rules.nadam import nadam_call

        if lazy_rows:
            return None
        return nadam_call(dtype, self.convention, learning_rate=learning_rate,
                          beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                          step=step, momentum_decay=self.momentum_decay,
                          product_dtype=self._product_dtype(), eps_root=self.eps_root)

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        if self.momentum_decay is not None:
            config["momentum_decay"] = self.momentum_decay
        if self.decoupled_weight_decay is not None:
            config["decoupled_weight_decay"] = self.decoupled_weight_decay
        if self.eps_root:  # optax's option: only in the config where it is used
            config["eps_root"] = self.eps_root
        return config


Nadam.__doc__ = Nadam.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
