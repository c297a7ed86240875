"""RMSprop with the tf.keras 2.11+ API, in every framework's numerics.

Follows ``keras/src/optimizers/rmsprop.py`` and ``tf_keras/optimizers/rmsprop.py`` for the API
and keyword names; the update of each convention is :func:`refopt.reference.rmsprop_update`
(readable NumPy, the reference backend) and :mod:`refopt.rules.rmsprop` (the fast backends).
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_bool,
    check_real,
    default_learning_rate,
)

__all__ = ["RMSprop"]


class RMSprop(Optimizer):
    r"""RMSprop (Tieleman & Hinton), plain, with momentum, centered, in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: the convention's (0.001 Keras, 0.01 PyTorch); TF1's
        ``RMSPropOptimizer`` and optax's ``rmsprop`` have none, so it is required there.
    rho : float, optional
        Decay of the moving average of ``g**2`` (PyTorch's ``alpha``, TF1's and optax's
        ``decay``), in [0, 1]. Default: 0.9, PyTorch 0.99.
    momentum : float, default 0.0
        Momentum (>= 0); 0 keeps no momentum buffer (TF1 always keeps one).
    epsilon : float, optional
        Default: 1e-7 Keras, 1e-10 TF1, 1e-8 PyTorch and optax. Inside the root
        (``sqrt(v + eps)``) for tf_keras, Keras 3, TF1, Keras 2 with momentum and optax;
        outside (``sqrt(v) + eps``) for PyTorch and Keras 2 without momentum.
    centered : bool, default False
        Normalise by an estimate of the variance, ``v - a**2`` (``a`` the moving average of
        ``g``).
    eps_in_sqrt : bool, optional
        optax's option (default True); refused under the other conventions.
    {base_kwargs}

    Notes
    -----
    Slots: ``velocity`` (Keras' ``velocities``; TF "rms", torch "square_avg", optax "nu"),
    ``momentum`` (when kept), ``average_gradient`` (centered). TF1 starts ``velocity`` at
    one, the others at zero. The update rules of the six forms are written out in
    :func:`refopt.reference.rmsprop_update`. ``weight_decay`` is Keras' decoupled decay
    (tf_keras, Keras 3) or PyTorch's L2 term (``g + wd*w``); Keras 2, TF1 and optax have
    none. Sparse (IndexedSlices) gradients are not supported yet (``NotImplementedError``).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([10.0], np.float32)
    >>> opt = refopt.RMSprop(learning_rate=0.1, convention="keras3")
    >>> opt.apply_gradients([(w.copy(), w)])
    1
    >>> w
    array([9.683772], dtype=float32)
    """

    def __init__(
        self,
        learning_rate=None,
        rho=None,
        momentum=0.0,
        epsilon=None,
        centered=False,
        eps_in_sqrt=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="RMSprop",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        from refopt.reference.rmsprop import rmsprop_defaults

        conv = _check_convention(convention)
        defaults = rmsprop_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "RMSprop")
        self.rho = check_real("rho", defaults["rho"] if rho is None else rho, low=0, high=1)
        self.momentum = check_real("momentum", momentum, low=0)
        if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
            epsilon = defaults["epsilon"]
        self.epsilon = check_real("epsilon", epsilon, low=0)
        self.centered = check_bool("centered", centered)
        if eps_in_sqrt is not None:
            eps_in_sqrt = check_bool("eps_in_sqrt", eps_in_sqrt)
            if conv.rmsprop_form != "optax":
                raise ValueError(
                    "`eps_in_sqrt` is optax's option; the other frameworks fix where epsilon "
                    f"goes. Received: eps_in_sqrt={eps_in_sqrt!r} with convention="
                    f"{conv.name!r}"
                )
        self.eps_in_sqrt = eps_in_sqrt
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

    #: torch's for-loop root (the ``sqrt`` knob; refopt.reference.sqrt): MKL's on the host
    _torch_sqrt = "loop"

    def _has_buffer(self):
        return self.momentum > 0 or self.convention.rmsprop_form == "tf1"

    def _slot_groups(self):
        groups = [("velocity",)]
        if self._has_buffer():
            groups.append(("momentum",))
        if self.centered:
            groups.append(("average_gradient",))
        return tuple(groups)

    def _slot_initial_value(self, name, dtype):
        if name == "velocity":
            from refopt.reference.rmsprop import initial_velocity

            return initial_velocity(self.convention, dtype)
        return np.dtype(dtype).type(0)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference import rmsprop_update
        from refopt.reference.variants import l2_torch

        if isinstance(grad, IndexedSlices):
            raise NotImplementedError(
                "RMSprop takes dense gradients only in this version (sparse RMSprop comes "
                "with the sparse family); pass grad.to_dense(). Received: an IndexedSlices "
                "gradient"
            )
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            grad = l2_torch(grad, param, weight_decay)
        with np.errstate(all="ignore"):
            r = rmsprop_update(
                param, grad, slots["velocity"], slots.get("momentum"),
                slots.get("average_gradient"), learning_rate=learning_rate, rho=self.rho,
                momentum=self.momentum, epsilon=self.epsilon, centered=self.centered,
                convention=self.convention, eps_in_sqrt=self.eps_in_sqrt)
        out = {"velocity": r.velocity}
        if "momentum" in slots:
            out["momentum"] = r.momentum
        if self.centered:
            out["average_gradient"] = r.average_gradient
        return r.param, out

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.rmsprop import rmsprop_call

        return rmsprop_call(dtype, self.convention, learning_rate=learning_rate, rho=self.rho,
                            momentum=self.momentum, epsilon=self.epsilon,
                            centered=self.centered, has_buffer=self._has_buffer(),
                            eps_in_sqrt=self.eps_in_sqrt is not False)

    def get_config(self):
        config = super().get_config()
        config.update(rho=self.rho, momentum=self.momentum, epsilon=self.epsilon,
                      centered=self.centered)
        if self.eps_in_sqrt is not None:
            config["eps_in_sqrt"] = self.eps_in_sqrt
        return config


RMSprop.__doc__ = RMSprop.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
