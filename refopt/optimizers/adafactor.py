"""Adafactor with the Keras 3 API, in tf_keras', Keras 3's, PyTorch's and optax's numerics.

Follows ``keras/src/optimizers/adafactor.py`` and ``tf_keras/optimizers/adafactor.py`` for the
API and keyword names (plus optax's own options under its convention); the update of each
convention is :func:`refopt.reference.adafactor_update` (readable NumPy).
"""

from __future__ import annotations

import math
import numbers

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_bool,
    check_real,
    optimizer_form,
)

__all__ = ["Adafactor"]

_GIVEN_NOTHING = object()  # clip_threshold's default: None is optax's "no clipping"


class Adafactor(Optimizer):
    r"""Adafactor (Shazeer & Stern, 2018) in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Default: 0.001 Keras, **0.01** PyTorch; under optax None (optax's default: no
        learning-rate scaling, the same bits as 1.0).
    beta_2_decay : float, optional
        The exponent of the second moment's decay ``1 - t**beta_2_decay``, <= 0. Default
        -0.8 (optax's ``decay_rate=0.8``).
    epsilon_1 : float, optional
        Added to ``g^2`` (Keras, optax; default 1e-30) or a clamp of the estimate (PyTorch;
        default None: the variable dtype's machine epsilon).
    epsilon_2 : float, optional
        The least scale of a step (``max(epsilon_2, RMS(w))``), default 1e-3.
    clip_threshold : float or None, optional
        The update's RMS is clipped to this (PyTorch's ``d``, optax's
        ``clipping_threshold``), default 1.0; None (optax only): no clipping.
    relative_step : bool, optional
        Keras' ``relative_step`` (default True), accepted under tf_keras and Keras 3 only.
        It changes no number there: the step is ``min(lr, 1/sqrt(t))`` either way.
    min_dim_size_to_factor, decay_offset, multiply_by_parameter_scale, factored
        optax's options (defaults 128, 0, True, True); accepted under ``"optax"`` only.
    momentum : None
        optax's ``momentum`` is not reproduced: only None is accepted.
    {base_kwargs}

    Notes
    -----
    Slots: ``velocity_row`` and ``velocity_col`` (the factored second moment: Keras' ``r``,
    ``c``; torch's ``row_var``, ``col_var``; optax's ``v_row``, ``v_col``) and ``velocity``
    (the full one: Keras' ``v``, torch's ``variance``, optax's ``v``), each in the
    framework's own shape (:func:`refopt.reference.adafactor.adafactor_slot_shapes`):
    Keras factors the last two axes of every variable of rank >= 2 (and keeps the full
    estimate too), PyTorch likewise with the reduced axes kept as 1, optax the two largest
    axes from ``min_dim_size_to_factor`` on. A moment a variable does not use is a
    placeholder (a 0-d zero; optax's ``zeros((1,))``). ``get_slot`` returns these shapes.

    ``weight_decay``: Keras' decoupled decay before the step (tf_keras, Keras 3), PyTorch's
    ``w *= 1 - lr*wd`` inside the step after the scale was taken from ``w``, optax's
    ``weight_decay_rate`` (``u + wd*w``, not multiplied by the learning rate). Dense
    gradients only (an IndexedSlices gradient is refused). Under ``"torch"`` each variable
    counts its own steps.

    ``backend="cpu"`` computes Adafactor in phases, one tensor at a time
    (:mod:`refopt.rules.adafactor`: the estimate with the update and the step are rule
    kernels; the means and the factored moments between them are computed on the host in
    the framework's order), in place (:func:`refopt.kernels.cpu.adafactor.prepare_in_place`:
    the moment of the variable's size and the variable overwritten, the update in a scratch
    array of the largest variable's size per dtype, kept between steps; under ``"torch"``
    the two norms summed at once on two threads); with clipping, EMA or a float16 variable
    it takes the staged step (new arrays, committed at the end). ``backend="cuda"`` takes the CUDA executor's host step
    (``HostStepWarning``; the device phases are ``refopt.kernels.cuda.adafactor_update``).
    The numbers are the reference's, bit for bit. Adafactor is not in the fused
    multi-tensor kernels (those take single-phase rules).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones((2, 3), np.float32)
    >>> opt = refopt.Adafactor(convention="keras3")
    >>> opt.apply_gradients([(np.full((2, 3), 0.5, np.float32), w)])
    1
    >>> opt.get_slot(w, "velocity_row").shape, opt.get_slot(w, "velocity_col").shape
    ((2,), (3,))
    """

    slot_variables = ("velocity_row", "velocity_col", "velocity")

    def __init__(
        self,
        learning_rate=None,
        beta_2_decay=None,
        epsilon_1=None,
        epsilon_2=None,
        clip_threshold=_GIVEN_NOTHING,
        relative_step=None,
        min_dim_size_to_factor=None,
        decay_offset=None,
        multiply_by_parameter_scale=None,
        factored=None,
        momentum=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Adafactor",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        from refopt.reference.adafactor import OPTAX_ONLY, adafactor_defaults

        conv = _check_convention(convention)
        form = optimizer_form(conv, "Adafactor")
        defaults = adafactor_defaults(conv)
        if learning_rate is None:
            learning_rate = 1.0 if form == "optax" else defaults["learning_rate"]
        self.beta_2_decay = check_real(
            "beta_2_decay", defaults["beta_2_decay"] if beta_2_decay is None else beta_2_decay,
            high=0)
        if epsilon_1 is None:
            epsilon_1 = defaults["epsilon_1"]
        self.epsilon_1 = check_real("epsilon_1", epsilon_1, low=0, allow_none=True)
        self.epsilon_2 = check_real(
            "epsilon_2", defaults["epsilon_2"] if epsilon_2 is None else epsilon_2, low=0)
        if clip_threshold is _GIVEN_NOTHING:
            clip_threshold = defaults["clip_threshold"]
        elif clip_threshold is None and form != "optax":
            raise ValueError(
                f"`clip_threshold=None` (no clipping) is optax's; convention={conv.name!r} "
                "always clips. Received: clip_threshold=None")
        low = 1 if form == "torch" else 0  # torch: "Clipping threshold d should be >= 1"
        self.clip_threshold = check_real("clip_threshold", clip_threshold, low=low,
                                         low_open=form != "torch", allow_none=True)
        if relative_step is not None:
            relative_step = check_bool("relative_step", relative_step)
            if form not in ("tf_keras", "keras3"):
                raise ValueError(
                    f"`relative_step` is Keras' option; convention={conv.name!r} has none for "
                    f"Adafactor. Received: relative_step={relative_step!r}")
        elif form in ("tf_keras", "keras3"):
            relative_step = True
        self.relative_step = relative_step
        given = dict(min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset,
                     multiply_by_parameter_scale=multiply_by_parameter_scale,
                     factored=factored)
        for key in OPTAX_ONLY:
            value = given[key]
            if value is not None and form != "optax":
                raise ValueError(
                    f"`{key}` is optax's option; convention={conv.name!r} has none for "
                    f"Adafactor. Received: {key}={value!r}")
            if form != "optax":
                continue
            if value is None:
                value = defaults[key]
            if key in ("min_dim_size_to_factor", "decay_offset"):
                if not isinstance(value, numbers.Integral) or isinstance(value, bool) or (
                        key == "min_dim_size_to_factor" and value < 0):
                    raise ValueError(f"`{key}` must be an integer"
                                     f"{' >= 0' if key == 'min_dim_size_to_factor' else ''}. "
                                     f"Received: {key}={value!r}")
                value = int(value)
            else:
                value = check_bool(key, value)
            given[key] = value
        for key in OPTAX_ONLY:
            setattr(self, key, given[key] if form == "optax" else None)
        if momentum is not None:
            raise NotImplementedError(
                "optax's Adafactor `momentum` is not reproduced by refopt (only momentum=None). "
                f"Received: momentum={momentum!r}")
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

    def _optax_options(self):
        if self.convention.adafactor_form != "optax":
            return {}
        return dict(factored=self.factored, min_dim_size_to_factor=self.min_dim_size_to_factor)

    def slot_shape(self, name, shape):
        """The framework's shape of slot ``name`` (:func:`adafactor_slot_shapes
        <refopt.reference.adafactor.adafactor_slot_shapes>`); ``"average"`` (the EMA of the
        weights, with ``use_ema``) has the variable's own shape.

        Raises
        ------
        KeyError
            If ``name`` is not one of :attr:`slot_names`.
        """
        from refopt.reference.adafactor import adafactor_slot_shapes

        if name == "average" and self.use_ema:
            return tuple(shape)
        shapes = adafactor_slot_shapes(shape, self.convention, **self._optax_options())
        if name not in shapes:
            raise KeyError(f"Adafactor has no slot {name!r}; its slots are "
                           f"{list(self.slot_names)}.")
        return shapes[name]

    def _decay_mode(self):
        form = self.convention.adafactor_form
        if form == "torch":
            return "l2"  # inside the step (after alpha is taken); torch skips a zero rate
        if form == "optax":
            return "optax"  # weight_decay_rate: u + wd*w
        return "decoupled"

    def _sparse_update_kind(self):
        return None

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
        if isinstance(grad, IndexedSlices) or lazy_rows:
            raise TypeError(
                f"convention={conv.name!r}: refopt's Adafactor takes dense gradients only. "
                "Received an IndexedSlices gradient")
        form = conv.adafactor_form
        clip = self.clip_threshold
        if clip is None:  # optax's clipping_threshold=None: the reference's math.inf
            clip = math.inf
        kw = dict(beta_2_decay=self.beta_2_decay, epsilon_1=self.epsilon_1,
                  epsilon_2=self.epsilon_2, clip_threshold=clip, weight_decay=weight_decay)
        if form == "optax":
            kw.update(min_dim_size_to_factor=self.min_dim_size_to_factor,
                      decay_offset=self.decay_offset, factored=self.factored,
                      multiply_by_parameter_scale=self.multiply_by_parameter_scale)
        r = self._kernels.adafactor_update(
            param, grad, slots["velocity_row"], slots["velocity_col"], slots["velocity"],
            learning_rate=learning_rate, step=step, convention=conv, **kw)
        return r.param, {"velocity_row": r.velocity_row, "velocity_col": r.velocity_col,
                         "velocity": r.velocity}

    def _in_place_step(self, items, lr_value):
        """``backend="cpu"``'s in-place step (:func:`refopt.executors.cpu.try_in_place_step`,
        :func:`refopt.kernels.cpu.adafactor.prepare_in_place`): every variable checked and
        prepared first, then each run; False, nothing written, when one is not for it
        (float16, a non-contiguous array, a rewritten update)."""
        if self._uses_update_step():
            return False
        import numpy as np

        from refopt.kernels.cpu.adafactor import prepare_in_place

        conv = self.convention
        clip = math.inf if self.clip_threshold is None else self.clip_threshold
        runs = []
        for param, grad, slots, step, decays in items:
            source, wd = None, None
            if decays and self._decay_mode() in ("l2", "optax"):
                wd = self.weight_decay  # inside the step
            elif decays:  # Keras' decoupled decay before the update: the decayed copy
                source = self._kernels.apply_weight_decay(
                    param, learning_rate=lr_value, weight_decay=self.weight_decay)
            kw = {"beta_2_decay": self.beta_2_decay, "epsilon_1": self.epsilon_1,
                  "epsilon_2": self.epsilon_2, "clip_threshold": clip, "weight_decay": wd}
            if conv.adafactor_form == "optax":
                kw.update(min_dim_size_to_factor=self.min_dim_size_to_factor,
                          decay_offset=self.decay_offset, factored=self.factored,
                          multiply_by_parameter_scale=self.multiply_by_parameter_scale)
            dt = param.dtype
            pool = self.__dict__.setdefault("_scratch", {})
            if dt in (np.float32, np.float64) and (
                    dt not in pool or pool[dt].size < param.size):
                pool[dt] = np.empty(param.size, dt)  # the direction's, kept between steps
            run = prepare_in_place(
                param, grad, slots["velocity_row"], slots["velocity_col"], slots["velocity"],
                learning_rate=lr_value, step=step, convention=conv, source=source,
                scratch=pool.get(dt), **kw)
            if run is None:
                return False
            runs.append(run)
        for run in runs:  # from here on nothing can fail
            run()
        return True

    def get_config(self):
        config = super().get_config()
        config.update(beta_2_decay=self.beta_2_decay, epsilon_1=self.epsilon_1,
                      epsilon_2=self.epsilon_2, clip_threshold=self.clip_threshold)
        if self.relative_step is not None:
            config["relative_step"] = self.relative_step
        if self.convention.adafactor_form == "optax":
            for key in ("min_dim_size_to_factor", "decay_offset", "multiply_by_parameter_scale",
                        "factored"):
                config[key] = getattr(self, key)
        return config


Adafactor.__doc__ = Adafactor.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
