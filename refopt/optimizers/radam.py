"""RAdam with the tf.keras 2.11+ API, in PyTorch's and optax's numerics.

Keras has no RAdam: the class takes PyTorch's name and options (``decoupled_weight_decay``)
and optax's (``epsilon_root``, ``threshold``), written Keras style (``learning_rate``,
``beta_1``, ``beta_2``, ``epsilon``). The update of each convention is
:func:`refopt.reference.radam_update` (readable NumPy, the reference backend) and
:mod:`refopt.rules.radam` (the fast backends). The Keras and TF conventions are refused.
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

__all__ = ["RAdam"]


class RAdam(Optimizer):
    r"""RAdam, rectified Adam (Liu et al., 2020), in PyTorch's or optax's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default 0.001 (PyTorch); optax's ``radam`` has none, so it is required
        under ``"optax"``.
    beta_1 : float, default 0.9
    beta_2 : float, default 0.999
        In [0, 1).
    epsilon : float, default 1e-8
        PyTorch adds it to the raw ``sqrt(v)``, optax to ``sqrt(v_hat)``.
    weight_decay : float, optional
        PyTorch only (optax's ``radam`` has none): an L2 term ``g + weight_decay * w``, or
        with ``decoupled_weight_decay=True`` the decay ``w * (1 - lr * weight_decay)``
        before the update. PyTorch's default 0 is no decay.
    decoupled_weight_decay : bool, optional
        PyTorch's option (default False); refused under ``"optax"``.
    epsilon_root : float, optional
        optax's ``eps_root`` (default 0.0), inside the root; refused under ``"torch"``.
    threshold : float, optional
        optax's ``threshold`` on the SMA length (default 5.0, test ``rho_t >= threshold``);
        PyTorch's is fixed (``rho_t > 5``), so it is refused under ``"torch"``.
    {base_kwargs}

    Notes
    -----
    Slots: ``m`` (torch ``exp_avg``, optax ``mu``) and ``v`` (``exp_avg_sq``, ``nu``). The
    update rules of both forms are written out in :func:`refopt.reference.radam_update`;
    the SMA length ``rho_t`` and the rectification are computed on the host each step, in
    float64 (PyTorch) or in the variable's precision (optax). PyTorch counts steps per
    parameter, optax globally. PyTorch's default implementation on CPU, the single-tensor
    for-loop (not ``foreach``), is the one reproduced. Neither framework takes sparse
    gradients.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, -2.0], np.float32)
    >>> opt = refopt.RAdam(learning_rate=0.1, convention="torch")
    >>> opt.apply_gradients([(np.array([0.5, 0.25], np.float32), w)])
    1
    >>> w
    array([ 0.95 , -2.025], dtype=float32)
    """

    slot_variables = ("m", "v")

    def __init__(
        self,
        learning_rate=None,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=None,
        weight_decay=None,
        decoupled_weight_decay=None,
        epsilon_root=None,
        threshold=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="RAdam",
        backend=None,
        convention="torch",
        **kwargs,
    ):
        conv = _check_convention(convention)
        form = optimizer_form(conv, "RAdam")
        from refopt.reference.radam import radam_defaults

        defaults = radam_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "RAdam")
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1, high_open=True)
        if epsilon is None:
            epsilon = defaults["epsilon"]
        self.epsilon = check_real("epsilon", epsilon, low=0)
        for key, value in (("decoupled_weight_decay", decoupled_weight_decay),):
            if value is not None and form != "torch":
                raise ValueError(
                    f"`{key}` is PyTorch's option; convention={conv.name!r} has none for "
                    f"RAdam. Received: {key}={value!r}"
                )
        for key, value in (("epsilon_root", epsilon_root), ("threshold", threshold)):
            if value is not None and form != "optax":
                raise ValueError(
                    f"`{key}` is optax's option; convention={conv.name!r} has none for RAdam "
                    f"(PyTorch rectifies when rho_t > 5). Received: {key}={value!r}"
                )
        if form == "torch":
            self.decoupled_weight_decay = (
                False if decoupled_weight_decay is None
                else check_bool("decoupled_weight_decay", decoupled_weight_decay))
            self.epsilon_root = None
            self.threshold = None
        else:
            self.decoupled_weight_decay = None
            self.epsilon_root = check_real(
                "epsilon_root", defaults["epsilon_root"] if epsilon_root is None
                else epsilon_root, low=0)
            self.threshold = check_real(
                "threshold", defaults["threshold"] if threshold is None else threshold)
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

    def _decay_mode(self):
        """PyTorch's L2 term or its decoupled decay; optax's radam has none."""
        if self.convention.radam_form != "torch":
            return "none"
        return "torch" if self.decoupled_weight_decay else "l2"

    def _sparse_update_kind(self):
        return None  # refused in _update_step, as both frameworks refuse them

    def _options(self):
        kw = dict(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        if self.convention.radam_form == "optax":
            kw.update(epsilon_root=self.epsilon_root, threshold=self.threshold)
        return kw

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.variants import l2_torch

        conv = self.convention
        if isinstance(grad, IndexedSlices) or lazy_rows:
            raise TypeError(
                f"convention={conv.name!r}: RAdam takes no sparse gradient (PyTorch raises "
                "'RAdam does not support sparse gradients'). Received an IndexedSlices "
                "gradient"
            )
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            grad = l2_torch(grad, param, weight_decay)
        r = self._kernels.radam_update(param, grad, slots["m"], slots["v"],
                                       learning_rate=learning_rate, step=step,
                                       convention=conv, **self._options())
        return r.param, {"m": r.m, "v": r.v}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one dense step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.radam import radam_call

        if lazy_rows:
            return None
        return radam_call(dtype, self.convention, learning_rate=learning_rate, step=step,
                          **self._options())

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        if self.convention.radam_form == "torch":
            config["decoupled_weight_decay"] = self.decoupled_weight_decay
        else:
            config.update(epsilon_root=self.epsilon_root, threshold=self.threshold)
        return config


RAdam.__doc__ = RAdam.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
