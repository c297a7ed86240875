"""Adam, AdamW and LazyAdam with the tf.keras 2.11+ API.

Follows ``tf_keras/optimizers/adam.py`` and ``tf_keras/optimizers/adamw.py``; ``LazyAdam``
applies the TF1 contrib ``LazyAdamOptimizer`` row semantics to sparse gradients.
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
)
from refopt.reference import variants as _variants

__all__ = ["Adam", "AdamW", "LazyAdam"]


class _ConventionDefault:
    """The default of a hyperparameter that depends on the convention."""

    def __repr__(self):
        return "<the convention's default>"


_CONVENTION_DEFAULT = _ConventionDefault()


class Adam(Optimizer):
    r"""Adam (and AMSGrad) with tf.keras 2.11+ numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 0.001
        Step size (>= 0, finite; stored rounded to float32).
    beta_1 : float, default 0.9
        Decay of the first moment, in [0, 1).
    beta_2 : float, default 0.999
        Decay of the second moment, in [0, 1).
    epsilon : float, optional
        Added to :math:`\sqrt{v}` (not bias-corrected, under tf-keras' convention), finite
        and >= 0. Default: the convention's (``default_epsilon``): 1e-7 for the Keras
        conventions, 1e-8 for ``"tf1"``, ``"torch"`` and ``"optax"``.
    amsgrad : bool, default False
        Keep ``vhat = max(vhat, v)`` and divide by its square root (Reddi et al., 2018).
    nesterov : bool, default False
        optax's ``adam(nesterov=True)`` (``scale_by_adam(nesterov=True)``, what ``optax.nadam``
        is): the update uses :math:`\hat m = \beta_1 m_t / (1 - \beta_1^{t+1}) + (1 - \beta_1)
        g_t / (1 - \beta_1^t)` instead of :math:`m_t / (1 - \beta_1^t)`, with no momentum
        schedule; computed exactly as :class:`refopt.Nadam` under ``"optax"``. Only under a
        convention whose ``nadam_form`` is ``"optax"``: the other frameworks' Adam has no such
        option (``ValueError`` naming the convention; use :class:`refopt.Nadam`). Not with
        ``amsgrad`` (optax's ``amsgrad`` has no ``nesterov``: ``ValueError``).
        :class:`AdamW` takes it too (``optax.adamw(nesterov=True)``).
    eps_root : float, optional
        optax's ``eps_root``, added inside the square root:
        :math:`\sqrt{\hat v + \epsilon_{root}} + \epsilon` (finite, >= 0; None or 0: none).
        Only where the Adam form is optax's (``epsilon_placement="corrected"`` with
        ``bias_correction="float32"``, i.e. ``convention="optax"``); a nonzero value elsewhere
        raises ``ValueError`` naming the convention (Keras and PyTorch have no such term).
    {base_kwargs}

    Notes
    -----
    Slots per variable: ``m``, ``v`` (and ``vhat`` with AMSGrad), zeros of the variable's
    shape and dtype. The update is :func:`refopt.reference.adam_update` with
    ``step = iterations + 1``; an :class:`~refopt.IndexedSlices` gradient takes tf-keras'
    non-lazy sparse path (every row's moments decay), which equals the dense update on the
    summed gradient up to rounding. Defaults and keyword names are those of
    ``tf.keras.optimizers.Adam`` (TF 2.11+); epsilon is 1e-7 (TF1 and PyTorch use 1e-8).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    >>> opt = refopt.Adam(learning_rate=0.01)
    >>> opt.apply_gradients([(np.array([0.1, -0.2, 0.3], np.float32), w)])
    1
    >>> w
    array([0.99000037, 2.0099998 , 2.9900002 ], dtype=float32)
    """

    def __init__(
        self,
        learning_rate=0.001,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=None,
        amsgrad=False,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Adam",
        backend=None,
        convention="tf_keras",
        nesterov=False,
        eps_root=None,
        **kwargs,
    ):
        self.nesterov = check_bool("nesterov", nesterov)
        if self.nesterov:
            _check_nesterov(_check_convention(convention), amsgrad)
        self.eps_root = _check_eps_root(_check_convention(convention), eps_root)
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1, high_open=True)
        conv = _check_convention(convention)
        if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
            epsilon = conv.default_epsilon
        self.epsilon = check_real("epsilon", epsilon, low=0)
        self.amsgrad = check_bool("amsgrad", amsgrad)
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
            convention=convention,
            **kwargs,
        )

    #: Where the torch conventions' root comes from (the ``sqrt`` knob,
    #: :func:`refopt.reference.sqrt.optimizer_takes_mkl_sqrt`): a PyTorch fused kernel
    #: under ``"torch_fused"`` (SparseAdam's for-loop for the lazy subclass).
    _torch_sqrt = "fused"

    def _slot_groups(self):
        return (("m", "v"), ("vhat",)) if self.amsgrad else (("m", "v"),)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
        if isinstance(grad, IndexedSlices) and conv.sparse_adam == "error":
            raise TypeError(
                f"{type(self).__name__} with convention={conv.name!r} takes no IndexedSlices "
                f"gradient ({conv.framework}: Adam refuses sparse gradients); use LazyAdam, "
                "or pass grad.to_dense()."
            )
        if self.nesterov:  # optax's adam(nesterov=True) is optax's nadam
            from refopt.reference import nadam as _nadam

            param, grad, m, v, _ = _nadam.check_nadam_args(
                param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
                beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, step=step,
                convention=conv, momentum_decay=None, eps_root=self.eps_root)
            with np.errstate(all="ignore"):  # adamw(nesterov=True): optax's decay inside
                p, m, v = _nadam._optax(param, grad, m, v, learning_rate, self.beta_1,
                                        self.beta_2, self.epsilon, step, self.eps_root,
                                        weight_decay, jit=conv.optax_jit)
            return np.asarray(p), {"m": np.asarray(m), "v": np.asarray(v)}
        if lazy_rows and conv.lazy_update == "torch_sparse":
            p, m, v = _variants.lazy_rows_torch(
                param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
                beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, step=step,
                convention=conv)
            return np.asarray(p), {"m": np.asarray(m), "v": np.asarray(v)}
        if lazy_rows and conv.lazy_update == "ema_rows":
            conv = conv.replace(moment_update="ema")
        if weight_decay is not None and self._decay_mode() == "l2":
            grad = _variants.l2_torch(grad, param, weight_decay)
            weight_decay = None
        sparse_other = isinstance(grad, IndexedSlices) and conv.sparse_adam != "tf_keras"
        if sparse_other or weight_decay is not None or not _variants.is_tf_keras_adam(conv):
            with np.errstate(all="ignore"):
                p, m, v, vhat = _variants.adam_variant(
                    param, grad, slots["m"], slots["v"], slots.get("vhat"),
                    learning_rate=learning_rate, beta_1=self.beta_1, beta_2=self.beta_2,
                    epsilon=self.epsilon, step=step, convention=conv,
                    weight_decay=weight_decay, eps_root=self.eps_root)
            new_slots = {"m": np.asarray(m), "v": np.asarray(v)}
            if self.amsgrad:
                new_slots["vhat"] = np.asarray(vhat)
            return np.asarray(p), new_slots
        r = self._kernels.adam_update(
            param,
            grad,
            slots["m"],
            slots["v"],
            slots.get("vhat"),
            learning_rate=learning_rate,
            beta_1=self.beta_1,
            beta_2=self.beta_2,
            epsilon=self.epsilon,
            step=step,
        )
        new_slots = {"m": r.m, "v": r.v}
        if self.amsgrad:
            new_slots["vhat"] = r.vhat
        return r.param, new_slots

    def _sparse_update_kind(self):
        from refopt.reference.variants import is_tf_keras_adam

        conv = self.convention
        if conv.sparse_adam == "tf_keras" and is_tf_keras_adam(conv):
            return "adam_table"
        if conv.sparse_adam in ("tf_keras", "densify"):
            return "densify"
        return None

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.adam import adam_call

        conv = self.convention
        if lazy_rows and conv.lazy_update == "torch_sparse" and self.amsgrad:
            return None  # SparseAdam has no AMSGrad: the reference raises
        if self.nesterov:  # optax's adam(nesterov=True): Nadam's optax rule
            from refopt.rules.nadam import nadam_call

            return nadam_call(dtype, conv, learning_rate=learning_rate, beta_1=self.beta_1,
                              beta_2=self.beta_2, epsilon=self.epsilon, step=step,
                              eps_root=self.eps_root, optax_weight_decay=optax_weight_decay)
        return adam_call(dtype, conv, learning_rate=learning_rate, beta_1=self.beta_1,
                         beta_2=self.beta_2, epsilon=self.epsilon, step=step,
                         amsgrad=self.amsgrad, optax_weight_decay=optax_weight_decay,
                         lazy_rows=lazy_rows, eps_root=self.eps_root)

    def get_config(self):
        config = super().get_config()
        config.update(
            beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, amsgrad=self.amsgrad
        )
        if self.nesterov:  # optax's options: only in the config where they are used
            config["nesterov"] = True
        if self.eps_root:
            config["eps_root"] = self.eps_root
        return config


def _check_eps_root(conv, eps_root):
    """``eps_root`` as a float (None: 0), refused where the Adam form is not optax's."""
    if eps_root is None:
        return None
    eps_root = check_real("eps_root", eps_root, low=0)
    optax_form = conv.epsilon_placement != "hat" and conv.bias_correction != "float64"
    if eps_root and not optax_form:
        raise ValueError(
            f"`eps_root` is optax's term inside the square root; convention={conv.name!r} "
            f"({conv.framework}) has none. Received: eps_root={eps_root!r}")
    return eps_root or None


def _check_nesterov(conv, amsgrad):
    """Refuse ``nesterov=True`` where optax's ``adam(nesterov=True)`` is not what is asked."""
    if conv.nadam_form != "optax":
        raise ValueError(
            f"Adam(nesterov=True) is optax's adam(nesterov=True); convention={conv.name!r} "
            f"({conv.framework}) has no such option (nadam_form={conv.nadam_form!r}). Use "
            "refopt.Nadam for that framework's Nadam, or convention='optax'. "
            "Received: nesterov=True")
    if amsgrad:
        raise ValueError("optax's amsgrad has no `nesterov`. Received: nesterov=True, "
                         f"amsgrad={amsgrad!r}")


class AdamW(Adam):
    r"""Adam with decoupled weight decay (Loshchilov & Hutter), tf.keras 2.11+ numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 0.001
        Step size.
    weight_decay : float, optional
        Decay per unit of learning rate, applied before the Adam step as
        ``w <- w - w * weight_decay * lr`` (the learning rate of this step, not the
        bias-corrected one) under tf-keras' convention. Default: the convention's
        ``default_adamw_weight_decay`` (0.004 Keras, 0.01 PyTorch, 1e-4 optax). PyTorch's
        ``AdamW`` multiplies by ``1 - lr*wd``; optax's ``adamw`` adds ``wd*w`` to the Adam
        direction before scaling by ``-lr`` (see :mod:`refopt.conventions`). Under
        ``convention="keras2"`` this is TF-Addons' ``tfa.optimizers.AdamW``: ``w <- w -
        weight_decay * w``, **not** multiplied by the learning rate, before Keras 2's Adam
        step (only the rows present for an ``IndexedSlices``); there ``weight_decay`` is
        required (``TypeError`` without it, as TF-Addons).
    beta_1, beta_2, epsilon, amsgrad
        As :class:`Adam`.
    {base_kwargs}

    Notes
    -----
    Same update as :class:`Adam`; only the default ``weight_decay`` differs. Like PyTorch's
    ``AdamW`` (and unlike TF-Addons' ``AdamW``, ``convention="keras2"``) the decay is
    multiplied by the learning rate. TF-Addons: ``tensorflow_addons/optimizers/
    weight_decay_optimizers.py`` (0.23; ``DecoupledWeightDecayExtension`` over Keras 2's
    legacy Adam), whose ``var -= wd_t * var`` runs before the Adam update of the same
    variable.
    PyTorch's default ``weight_decay`` is 0.01, Keras' 0.004.
    """

    def __init__(
        self,
        learning_rate=0.001,
        weight_decay=_CONVENTION_DEFAULT,
        beta_1=0.9,
        beta_2=0.999,
        epsilon=None,
        amsgrad=False,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="AdamW",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        if weight_decay is None:
            raise ValueError(
                "AdamW requires a `weight_decay` (a float >= 0). Received: weight_decay=None"
            )
        if weight_decay is _CONVENTION_DEFAULT:
            conv = _check_convention(convention)
            if conv.adamw_weight_decay == "tfa":
                raise TypeError(
                    f"AdamW under convention={conv.name!r} is TF-Addons' AdamW, which requires "
                    "a `weight_decay` (no default; it is not multiplied by the learning rate). "
                    "Received: no weight_decay")
            if conv.adamw_weight_decay == "none":
                raise ValueError(
                    f"AdamW does not exist under convention={conv.name!r} ({conv.framework} "
                    "has no decoupled weight decay); use Adam."
                )
            weight_decay = conv.default_adamw_weight_decay
        super().__init__(
            learning_rate=learning_rate,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            jit_compile=jit_compile,
            name=name,
            backend=backend,
            convention=convention,
            **kwargs,
        )

    def _decay_mode(self):
        return self.convention.adamw_weight_decay


class LazyAdam(Adam):
    r"""Lazy Adam for sparse gradients: only the rows present in an IndexedSlices move.

    Parameters
    ----------
    learning_rate, beta_1, beta_2, epsilon, amsgrad
        As :class:`Adam` (same defaults; ``epsilon=1e-7``).
    {base_kwargs}

    Notes
    -----
    For an :class:`~refopt.IndexedSlices` gradient, duplicates are summed and then
    :func:`refopt.reference.lazy_adam_update` updates ``m``, ``v`` (``vhat``) and the weights
    of the present rows only; absent rows stay bit-for-bit unchanged. Bias correction uses the
    global ``iterations``, as TF1's ``LazyAdamOptimizer``. A dense gradient gets the dense Adam
    update, except under the torch conventions (``torch.optim.SparseAdam``, whose rows take
    SparseAdam's own formula), where it raises ``TypeError`` as torch raises. Weight decay (if
    set) is lazy too: for a sparse gradient only the present rows decay (tf-keras' base class
    would decay every row). The EMA of the weights, if used, still averages every row. Under
    tf_keras and Keras 3, when a gradient covers every row exactly once the result is
    bit-identical to :class:`Adam` on the dense gradient.

    Lazy Adam is not Adam: rows seen rarely keep stale moments (tensorflow/tensorflow#23668).
    Sources: ``tensorflow/contrib/opt/python/training/lazy_adam_optimizer.py`` (rows, global
    step); ``tf_keras/optimizers/adam.py`` (scalars and moment formula).
    """

    _lazy_sparse = True

    def _grads_checked_against_state(self):
        """True under torch's SparseAdam (no quick path: a dense gradient is refused)."""
        return self.convention.lazy_update == "torch_sparse"

    def _check_grads_against_state(self, pairs):
        """Under the torch conventions (``torch.optim.SparseAdam``) a dense gradient raises
        ``TypeError``, as torch raises (``"SparseAdam does not support dense gradients"``);
        nothing has changed then."""
        if self.convention.lazy_update != "torch_sparse":
            return
        for k, (grad, _, (shape, _dt)) in enumerate(pairs):
            if grad is not None and not isinstance(grad, IndexedSlices):
                raise TypeError(
                    f"LazyAdam under convention={self.convention.name!r} is "
                    "torch.optim.SparseAdam, which does not support dense gradients (torch "
                    "raises; use Adam). Received a dense gradient of shape "
                    f"{tuple(np.shape(grad))} for the variable at position {k}")

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=None,
                 amsgrad=False, name="LazyAdam", **kwargs):
        conv = _check_convention(kwargs.get("convention", "tf_keras"))
        if conv.lazy_update == "torch_sparse":
            for key, value in (("amsgrad", amsgrad),
                               ("weight_decay", kwargs.get("weight_decay"))):
                if value not in (None, False):
                    raise ValueError(
                        f"LazyAdam under convention={conv.name!r} is torch.optim.SparseAdam, "
                        f"which has no `{key}`. Received: {key}={value!r}"
                    )
        super().__init__(
            learning_rate=learning_rate,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            name=name,
            **kwargs,
        )


for _cls in (Adam, AdamW, LazyAdam):
    _cls.__doc__ = _cls.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
