"""Lamb with the Keras 3 API, in Keras 3's and optax's numerics.

Follows ``keras/src/optimizers/lamb.py`` for the API and keyword names (plus optax's
``eps_root`` under its convention); the update of each convention is
:func:`refopt.reference.lamb_update` (readable NumPy).
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

__all__ = ["Lamb"]


class Lamb(Optimizer):
    r"""Lamb (You et al., 2019): Adam rescaled per tensor by the trust ratio ``||w||/||u||``.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: 0.001 (Keras 3); optax's ``lamb`` has none, so it is required
        under ``"optax"``.
    beta_1, beta_2 : float, optional
        The moments' decay rates, in [0, 1). Default 0.9 and 0.999.
    epsilon : float, optional
        Added to the bias-corrected root. Default: **1e-7** Keras 3, **1e-6** optax.
    eps_root : float, optional
        optax's epsilon inside the root (``sqrt(v_hat + eps_root)``), default 0; accepted
        under ``convention="optax"`` only.
    {base_kwargs}

    Notes
    -----
    Slots: ``m`` and ``v`` (Keras' "momentum" and "velocity", optax's ``mu`` and ``nu``).
    Conventions: ``"keras3"`` (the default: tf_keras, Keras 2, TF1 and PyTorch have no
    Lamb, so those conventions are refused) and ``"optax"``. ``weight_decay`` is Keras 3's
    decoupled decay before the step (``w -= w*wd*lr``; the trust ratio sees the decayed
    ``w``) or optax's ``add_decayed_weights``, inside the direction (``u + wd*w``, so it
    enters the trust ratio). The trust ratio is 1 when either norm is 0 (and, Keras 3, when
    one is NaN). Dense gradients; an IndexedSlices gradient is summed into a dense one under
    Keras 3 (as TensorFlow converts it) and refused under optax. The update rules are
    written out in :func:`refopt.reference.lamb_update`.

    ``backend="cpu"`` computes Lamb in phases, one tensor at a time, in place
    (:func:`refopt.kernels.cpu.lamb.prepare_in_place`: one parallel pass updates the moments
    and writes the direction ``u`` into a scratch array, the two trust-ratio norms are
    summed at once on two threads, each serially in the framework's order, and a second
    parallel pass updates the variable; the scratch, one array the size of the largest
    variable of each dtype, is kept between steps); with clipping, EMA or a float16
    variable it takes the staged step (:mod:`refopt.rules.lamb`'s phases into new arrays,
    committed at the end). ``backend="cuda"``
    takes the CUDA executor's host step (``HostStepWarning``; the device phases are
    ``refopt.kernels.cuda.lamb_update``). The numbers are the reference's, bit for bit.
    Lamb is not in the fused multi-tensor kernels (those take single-phase rules).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, -2.0], np.float32)
    >>> opt = refopt.Lamb(learning_rate=0.1)
    >>> opt.apply_gradients([(np.array([0.5, 0.5], np.float32), w)])
    1
    """

    slot_variables = ("m", "v")

    def __init__(
        self,
        learning_rate=None,
        beta_1=None,
        beta_2=None,
        epsilon=None,
        eps_root=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Lamb",
        backend=None,
        convention="keras3",
        **kwargs,
    ):
        from refopt.reference.lamb import lamb_defaults

        conv = _check_convention(convention)
        optimizer_form(conv, "Lamb")
        defaults = lamb_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "Lamb")
        self.beta_1 = check_real("beta_1", defaults["beta_1"] if beta_1 is None else beta_1,
                                 low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", defaults["beta_2"] if beta_2 is None else beta_2,
                                 low=0, high=1, high_open=True)
        self.epsilon = check_real("epsilon", defaults["epsilon"] if epsilon is None else epsilon,
                                  low=0)
        if eps_root is not None:
            eps_root = check_real("eps_root", eps_root, low=0)
            if conv.lamb_form != "optax":
                raise ValueError(
                    f"`eps_root` is optax's option; convention={conv.name!r} has no epsilon "
                    f"inside the root for Lamb. Received: eps_root={eps_root!r}"
                )
        elif conv.lamb_form == "optax":
            eps_root = defaults["eps_root"]
        self.eps_root = eps_root
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
        # Keras 3: the base optimizer's decoupled decay; optax: add_decayed_weights, inside
        return "optax" if self.convention.lamb_form == "optax" else "decoupled"

    def _sparse_update_kind(self):
        return None  # the host path: _update_step densifies (Keras 3) or raises (optax)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
        if isinstance(grad, IndexedSlices):
            if conv.lamb_form == "optax":
                raise TypeError(
                    f"convention={conv.name!r}: optax's lamb takes dense gradients only. "
                    "Received an IndexedSlices gradient")
            grad = grad.to_dense()  # TensorFlow converts it for Keras 3's dense ops
        r = self._kernels.lamb_update(
            param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
            beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, step=step,
            convention=conv, eps_root=self.eps_root, weight_decay=weight_decay)
        return r.param, {"m": r.m, "v": r.v}

    def _in_place_step(self, items, lr_value):
        """``backend="cpu"``'s in-place step (:func:`refopt.executors.cpu.try_in_place_step`):
        every variable checked and prepared first, then each run; False, nothing written,
        when one is not for it (float16, a non-contiguous array, a rewritten update)."""
        if self._uses_update_step():
            return False
        from refopt.kernels.cpu.lamb import prepare_in_place

        conv = self.convention
        runs = []
        for param, grad, slots, step, decays in items:
            source, wd = None, None
            if decays and conv.lamb_form == "optax":
                wd = self.weight_decay  # add_decayed_weights, inside the direction
            elif decays:  # Keras 3's decoupled decay before the update: the decayed copy
                source = self._kernels.apply_weight_decay(
                    param, learning_rate=lr_value, weight_decay=self.weight_decay)
            run = prepare_in_place(
                param, grad, slots["m"], slots["v"], learning_rate=lr_value,
                beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon, step=step,
                convention=conv, eps_root=self.eps_root, weight_decay=wd, source=source,
                scratch=self._lamb_scratch(param))
            if run is None:
                return False
            runs.append(run)
        for run in runs:  # from here on nothing can fail
            run()
        return True

    def _lamb_scratch(self, param):
        """The direction's scratch for ``param`` (float32/float64; else None): one array
        per dtype, grown to the largest variable, kept between steps."""
        import numpy as np

        dt = getattr(param, "dtype", None)
        if dt not in (np.float32, np.float64):
            return None
        pool = self.__dict__.setdefault("_scratch", {})
        buf = pool.get(dt)
        if buf is None or buf.size < param.size:
            buf = pool[dt] = np.empty(param.size, dt)
        return buf

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        if self.eps_root is not None:
            config["eps_root"] = self.eps_root
        return config


Lamb.__doc__ = Lamb.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
