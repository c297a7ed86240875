"""Dynamic loss scaling: Keras' ``LossScaleOptimizer`` and torch's ``GradScaler``.

:class:`LossScaleOptimizer` wraps a refopt optimizer and takes **scaled** gradients (the
gradients of ``loss * scale``); each step it unscales them, checks them for inf and NaN, skips
the step on a non-finite one and moves the scale, with the numbers of the inner optimizer's
convention:

==========  ====================  =========================  ===============  ===================
convention  unscale               finiteness checked on      skipped step     scale: backoff/growth
==========  ====================  =========================  ===============  ===================
keras3      ``g / scale``         the scaled gradients       inner untouched  ``s/2`` (no floor) /
                                                                              ``2s`` (unguarded)
tf_keras,   ``g * f32(1/scale)``  the unscaled gradients     inner           ``max(s/2, 1)`` /
keras2                                                       ``iterations``  ``2s`` if finite
                                                             + 1
tf1         ``g * f32(1/scale)``  the unscaled gradients     inner untouched  as tf_keras
torch       ``g * f32(1/f64 s)``  the scaled gradients       inner untouched  ``f32(s*backoff)`` /
            (Adam, AdamW: fused                                               ``f32(s*growth)`` if
            kernel, ``g / s``)                                                finite
==========  ====================  =========================  ===============  ===================

Followed: ``keras/src/optimizers/loss_scale_optimizer.py`` (Keras 3.15),
``tf_keras/src/mixed_precision/loss_scale_optimizer.py`` (``LossScaleOptimizerV3`` and
``_DynamicLossScaleState``, tf_keras 2.21), ``tensorflow/python/training/experimental/
{loss_scale,loss_scale_optimizer}.py`` (TF 2.15's ``tf.compat.v1.mixed_precision``
``DynamicLossScale`` and ``MixedPrecisionLossScaleOptimizer``), ``torch/amp/grad_scaler.py``
(torch 2.13; CPU kernels ``_amp_foreach_non_finite_check_and_unscale_`` and
``_amp_update_scale_``). Measured on each (``conformance/README.md``, loss scaling).

:class:`GradScaler` has torch's API (``scale``, ``unscale_``, ``step``, ``update``) on top of
any refopt optimizer.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from refopt import _foreign
from refopt import precision as _precision
from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import Optimizer, check_bool, check_real

__all__ = ["GradScaler", "LossScaleOptimizer"]

_FLAVOURS = {"keras3": "keras3", "tf_keras": "tf_keras", "keras2": "tf_keras", "tf1": "tf1",
             "torch": "torch", "torch_fused": "torch"}
_DEFAULT_SCALE = {"keras3": 2.0 ** 15, "tf_keras": 2.0 ** 15, "tf1": 2.0 ** 15,
                  "torch": 2.0 ** 16}  # each framework's default initial scale
_DEFAULT_GROWTH_STEPS = 2000  # Keras, TF1 and torch alike
# under "torch_fused" (moment_update "torch_fma") refopt's Adam/AdamW are torch's fused kernels
_TORCH_FUSED = ("Adam", "AdamW")


def _fused_kernel_divides(optimizer):
    """Whether torch unscales ``optimizer``'s gradients in its step by dividing by the scale:
    the optimizers torch runs on a fused kernel (``_step_supports_amp_scaling``: Adam, AdamW,
    SGD and Adagrad with ``fused=True``, i.e. refopt's under ``"torch_fused"``) take the
    scale into the kernel, which divides; every other torch optimizer gets ``unscale_``'s
    multiplication by ``f32(1/s)``. A :class:`~refopt.MasterWeights` answers for its inner
    optimizer."""
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is not None and type(optimizer).__name__ == "MasterWeights":
        optimizer = inner
    if not isinstance(optimizer, Optimizer):
        return False
    conv = optimizer.convention
    names = {k.__name__ for k in type(optimizer).__mro__
             if k.__module__.startswith("refopt.optimizers.")}
    if names & set(_TORCH_FUSED):  # not LazyAdam (torch's SparseAdam has no fused kernel)
        return conv.moment_update == "torch_fma" and not optimizer._is_lazy()
    if "SGD" in names:
        return conv.sgd_momentum == "torch_fused"
    if "Adagrad" in names:
        return conv.sqrt == "torch_fused"
    return False


def _to_host(g):
    """A gradient as host values: ``(kind, values)``; kind says how to give it back."""
    if g is None:
        return None, None
    if isinstance(g, IndexedSlices):
        return "slices", np.asarray(g.values)
    if hasattr(g, "copy_to_host") and not isinstance(g, np.ndarray):
        return "device", g.copy_to_host()
    return "host", np.asarray(g)


def _from_host(kind, original, values):
    if kind == "slices":
        return IndexedSlices(values, original.indices, original.dense_shape)
    if kind == "device":
        from refopt.kernels import cuda as _kc

        return _kc.to_device(values)
    return values


def _all_finite(values):
    return all(bool(np.isfinite(v).all()) for v in values if v is not None)


class _ScaleRule:
    """The scale's arithmetic of one framework: state ``(scale float32, counter int)``."""

    def __init__(self, flavour, growth_steps, growth_factor=2.0, backoff_factor=0.5,
                 dynamic=True):
        self.flavour = flavour
        self.growth_steps = growth_steps
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.dynamic = dynamic

    def unscale(self, values, scale, divide):
        """Unscaled copies of the host gradient values, in each gradient's dtype."""
        out = []
        s32 = np.float32(scale)
        with np.errstate(all="ignore"):
            for v in values:
                if v is None:
                    out.append(None)
                    continue
                dt = v.dtype
                if self.flavour == "keras3" or divide:
                    # Keras 3 ``ops.divide(g, scale)`` (float16 promotes to float32 with the
                    # float32 scale); torch's fused Adam divides by the scale in its kernel
                    wide = np.dtype(np.float32) if dt == np.float16 else dt
                    out.append((v.astype(wide) / wide.type(s32)).astype(dt))
                elif self.flavour == "torch":
                    inv = np.float32(1.0 / float(s32))  # computed in double, stored as float
                    out.append((v.astype(np.float32) * inv).astype(dt) if dt == np.float16
                               else v * dt.type(inv))
                else:  # TF: the float32 reciprocal, cast to the gradient's dtype
                    inv = np.float32(1.0) / s32
                    out.append(v * dt.type(inv))
        return out

    def update(self, scale, counter, finite):
        """``(new_scale, new_counter)`` after a step whose gradients were ``finite``."""
        if not self.dynamic:
            return scale, counter
        s = np.float32(scale)
        with np.errstate(all="ignore"):
            if not finite:
                if self.flavour == "keras3":
                    new = s * np.float32(0.5)
                elif self.flavour == "torch":
                    new = np.float32(float(s) * self.backoff_factor)
                else:
                    new = max(s / np.float32(2.0), np.float32(1.0))
                return float(new), 0
            if counter + 1 < self.growth_steps:
                return float(s), counter + 1
            if self.flavour == "keras3":
                new = s * np.float32(2.0)
            elif self.flavour == "torch":
                new = np.float32(float(s) * self.growth_factor)
            else:
                new = s * np.float32(2.0)
            if self.flavour != "keras3" and not math.isfinite(float(new)):
                new = s  # TF's _assign_if_finite, torch's isfinite check: keep the scale
            return float(new), 0


def _check_scale(what, value):
    with np.errstate(over="ignore"):
        s = float(np.float32(value))
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"`{what}` must be > 0 and finite in float32 (the scale is a float32 "
                         f"variable). Received: {what}={value!r}")
    return s


def _check_steps(what, value):
    if (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
            or value < 1):
        raise ValueError(f"`{what}` must be an integer >= 1. Received: {what}={value!r}")
    return int(value)


def _new_scale_or_raise(rule, scale, counter, finite, what):
    new_scale, new_counter = rule.update(scale, counter, finite)
    if not (math.isfinite(new_scale) and new_scale > 0):
        raise ValueError(
            f"The loss scale would {'overflow to inf' if new_scale > 0 else 'underflow to 0'} "
            f"in float32 at this step (it is {scale!r}; {what}); the framework would go on "
            "with a useless scale. Nothing was changed: lower or raise the scale "
            "(load a state with another one, or create the optimizer with another "
            "initial scale).")
    return new_scale, new_counter


class _Wrapper(Optimizer):
    """An optimizer around ``self.inner_optimizer``: everything not its own is the inner one's.

    ``Optimizer.__init__`` is not called; attribute reads the wrapper does not define go to
    the inner optimizer, and the public methods that write delegate explicitly."""

    #: the wrapper's own keys of its state_dict, saved in checkpoints' meta (JSON)
    _OWN_STATE_KEYS = ()

    @property
    def _EXTRA_STATE_KEYS(self):
        """The wrapper's own state keys, then the inner optimizer's (torch's sparse momentum
        buffers of an inner SGD travel in the checkpoint too)."""
        return self._OWN_STATE_KEYS + tuple(getattr(self.inner_optimizer,
                                                    "_EXTRA_STATE_KEYS", ()))

    def __getattr__(self, name):  # reads of the inner optimizer's state (not called for ours)
        if name == "inner_optimizer":
            raise AttributeError(name)
        return getattr(self.inner_optimizer, name)

    def _check_wrapper_state(self, state_dict):
        """Refuse (``TypeError``/``ValueError``) a state that is not a dict, of another class
        or saved with another configuration; before anything is loaded."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"`state_dict` must be a dict, as {type(self).__name__}."
                            f"state_dict() returns. Received: {type(state_dict).__name__}")
        if state_dict.get("class") != type(self).__name__:
            raise ValueError(f"`state_dict` holds the state of an optimizer of class "
                             f"{state_dict.get('class')}; cannot load it into one of class "
                             f"{type(self).__name__}.")
        diffs = self._config_differences(state_dict.get("config"))
        if diffs:
            raise ValueError("`state_dict` was saved from an optimizer with another "
                             "configuration. Differences: " + "; ".join(diffs))

    def _wrapper_config_differences(self, config, inner_key, own):
        """What differs between a saved ``get_config()`` and this wrapper (lines of text):
        ``own`` maps the wrapper's own keys to this optimizer's values; then the inner
        optimizer's class and configuration, saved under ``inner_key``."""
        if not isinstance(config, dict) or not isinstance(config.get(inner_key), dict):
            raise TypeError(f"The saved `config` must be a {type(self).__name__}'s get_config() "
                            f"dict. Received: {type(config).__name__}")
        out = [f"{k}: saved {config.get(k, '(absent)')!r}, this optimizer {v!r}"
               for k, v in own.items() if config.get(k) != v]
        saved, name = config[inner_key], type(self.inner_optimizer).__name__
        if saved.get("class_name") != name:
            out.append(f"{inner_key}: saved {saved.get('class_name')!r}, this optimizer {name!r}")
        else:
            out += [f"{inner_key}." + d for d in
                    self.inner_optimizer._config_differences(saved.get("config", {}))]
        return out

    # -------------------------------------------------------------- delegated API
    convention = property(lambda self: self.inner_optimizer.convention)
    backend = property(lambda self: self.inner_optimizer.backend)
    variables = property(lambda self: self.inner_optimizer.variables)
    slot_names = property(lambda self: self.inner_optimizer.slot_names)
    built = property(lambda self: self.inner_optimizer.built)

    @property
    def iterations(self):
        """int: the inner optimizer's ``iterations`` (Keras delegates it too)."""
        return self.inner_optimizer.iterations

    @iterations.setter
    def iterations(self, value):
        self.inner_optimizer.iterations = value

    @property
    def learning_rate(self):
        """The inner optimizer's learning rate (settable)."""
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        self.inner_optimizer.learning_rate = value

    def get_slot(self, var, slot_name):
        return self.inner_optimizer.get_slot(var, slot_name)

    def slot_shape(self, name, shape):
        return self.inner_optimizer.slot_shape(name, shape)

    def slot_dtype(self, name, shape, dtype):
        return self.inner_optimizer.slot_dtype(name, shape, dtype)

    def build(self, var_list):
        return self.inner_optimizer.build(var_list)

    def exclude_from_weight_decay(self, var_list=None):
        return self.inner_optimizer.exclude_from_weight_decay(var_list)

    def finalize_variable_values(self, var_list):
        return self.inner_optimizer.finalize_variable_values(var_list)


class LossScaleOptimizer(_Wrapper):
    r"""Dynamic loss scaling around a refopt optimizer, as Keras, TF1 and torch do it.

    Feed it the gradients of the **scaled** loss (``loss * opt.dynamic_scale``, see
    :meth:`scale_loss`). Each :meth:`apply_gradients` unscales them, checks them for inf and
    NaN, and then either applies them with the inner optimizer and counts a good step (after
    ``dynamic_growth_steps`` good steps in a row the scale doubles), or skips the step and
    halves the scale.

    Parameters
    ----------
    inner_optimizer : refopt.Optimizer or dict
        The optimizer to wrap (not another ``LossScaleOptimizer``), or its serialized form
        ``{"class_name": ..., "config": ...}``. Its convention chooses the framework's numbers
        (the module docstring's table): ``"keras3"``, ``"tf_keras"``, ``"keras2"``,
        ``"tf1"`` (``tf.compat.v1.mixed_precision.DynamicLossScale``) or ``"torch"``
        (``torch.amp.GradScaler`` with its default factors; :class:`GradScaler` takes others).
        ``"optax"`` and ``"fbgemm"`` have no loss scaling and are refused.
    dynamic : bool, default True
        ``False``: a fixed scale (tf_keras, Keras 2 and TF1's ``FixedLossScale``): gradients
        are unscaled and always applied, non-finite or not. Keras 3 and torch refuse it.
    initial_scale : float, optional
        The starting scale, > 0 and finite in float32. Default 2**15 (Keras, TF1) or 2**16
        (torch). Required when ``dynamic=False``.
    dynamic_growth_steps : int, optional
        Good steps in a row before the scale doubles, >= 1. Default 2000. Must be None when
        ``dynamic=False``.
    name : str, default "loss_scale_optimizer"
    convention, backend : optional
        Only with a dict ``inner_optimizer``: passed to it (the conformance replay and
        :func:`refopt.load_checkpoint` use this). With an optimizer instance they must be
        None or equal to its own.

    Attributes
    ----------
    inner_optimizer : refopt.Optimizer
    dynamic_scale : float
        The current scale (a float32 value).
    step_counter : int
        Good steps since the scale last changed (Keras 3's ``step_counter``, tf_keras'
        ``dynamic_counter``, torch's ``_growth_tracker``).

    Raises
    ------
    TypeError
        ``inner_optimizer`` is not a refopt optimizer (or is a ``LossScaleOptimizer``).
    ValueError
        A convention without loss scaling; ``dynamic=False`` under Keras 3 or torch, or
        without ``initial_scale``, or with ``dynamic_growth_steps``; ``initial_scale`` not
        > 0 and finite in float32; ``dynamic_growth_steps`` not an integer >= 1;
        ``convention``/``backend`` that contradict the inner optimizer's.

    Notes
    -----
    One step, with ``s`` the scale, ``c`` the counter and ``G`` ``dynamic_growth_steps``::

        u = unscale(g, s)                       # per convention (module docstring)
        finite = all(isfinite(g or u))
        if finite: inner.apply_gradients(u); c = c + 1; if c == G: s = grow(s); c = 0
        else:      s = backoff(s); c = 0        # tf_keras/keras2: inner iterations += 1

    Keras 3 lets the scale overflow to inf (then every step is skipped forever) and halve to
    0; torch halves to 0; refopt refuses such a step instead (``ValueError``, nothing
    changed). A step that raises changes nothing: not the scale, the counter, the inner
    optimizer nor the variables. :meth:`state_dict` and checkpoints carry the scale and the
    counter (``"loss_scale"``).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones(2, np.float32)
    >>> opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="keras3"),
    ...                                 initial_scale=4.0, dynamic_growth_steps=2)
    >>> for g in (np.inf, 1.0, 1.0):   # gradients of the scaled loss
    ...     _ = opt.apply_gradients([(np.full(2, g * opt.dynamic_scale, np.float32), w)])
    >>> w.tolist(), opt.dynamic_scale, opt.iterations
    ([-1.0, -1.0], 4.0, 2)
    """

    def __init__(self, inner_optimizer, dynamic=True, initial_scale=None,
                 dynamic_growth_steps=None, name="loss_scale_optimizer", convention=None,
                 backend=None):
        # Optimizer.__init__ is not called: everything not defined here is the inner one's.
        if isinstance(inner_optimizer, dict):
            inner_optimizer = _deserialize_inner(inner_optimizer, convention, backend)
        elif isinstance(inner_optimizer, Optimizer):
            if convention is not None and _conv_name(convention) != inner_optimizer.convention.name:
                raise ValueError(
                    f"`convention` is the inner optimizer's ({inner_optimizer.convention.name!r}). "
                    f"Received: convention={_conv_name(convention)!r}")
            if backend not in (None, inner_optimizer.backend):  # a consistency check only
                raise ValueError(f"`backend` is the inner optimizer's "
                                 f"({inner_optimizer.backend!r}). Received: backend={backend!r}")
        if not isinstance(inner_optimizer, Optimizer) or isinstance(
                inner_optimizer, LossScaleOptimizer):
            raise TypeError("`inner_optimizer` must be a refopt optimizer (not a "
                            "LossScaleOptimizer). Received: "
                            f"inner_optimizer={type(inner_optimizer).__name__}")
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str. Received: name={name!r}")
        conv = inner_optimizer.convention
        flavour = _FLAVOURS.get(conv.name)
        if flavour is None:
            raise ValueError(
                f"convention={conv.name!r} ({conv.framework}) has no loss scaling; "
                f"LossScaleOptimizer takes an inner optimizer under {sorted(_FLAVOURS)}. "
                f"Received: inner_optimizer with convention={conv.name!r}")
        dynamic = check_bool("dynamic", dynamic)
        if not dynamic:
            if flavour in ("keras3", "torch"):
                raise ValueError(
                    f"convention={conv.name!r} has no fixed loss scale "
                    + ("(Keras 3 refuses dynamic=False: set the inner optimizer's "
                       "loss_scale_factor)" if flavour == "keras3" else
                       "(GradScaler is dynamic)") + ". Received: dynamic=False")
            if initial_scale is None:
                raise ValueError("`initial_scale` must be given when dynamic=False. "
                                 "Received: initial_scale=None")
            if dynamic_growth_steps is not None:
                raise ValueError("`dynamic_growth_steps` must be None when dynamic=False. "
                                 f"Received: dynamic_growth_steps={dynamic_growth_steps!r}")
        self.inner_optimizer = inner_optimizer
        self.name = name
        self.dynamic = dynamic
        self.initial_scale = _check_scale(
            "initial_scale", _DEFAULT_SCALE[flavour] if initial_scale is None else initial_scale)
        self.dynamic_growth_steps = (
            None if not dynamic else _check_steps(
                "dynamic_growth_steps", _DEFAULT_GROWTH_STEPS if dynamic_growth_steps is None
                else dynamic_growth_steps))
        self._rule = _ScaleRule(flavour, self.dynamic_growth_steps, dynamic=dynamic)
        self.dynamic_scale = self.initial_scale
        self.step_counter = 0

    def scale_loss(self, loss):
        """``loss * dynamic_scale`` (Keras 3's ``scale_loss``, tf_keras' ``get_scaled_loss``)."""
        return loss * self.dynamic_scale

    # -------------------------------------------------------------- the step
    def apply_gradients(self, grads_and_vars):
        """Unscale, check, apply or skip, and move the scale (see the class docstring).

        Parameters
        ----------
        grads_and_vars : iterable of (gradient, variable)
            The gradients of the **scaled** loss, as the inner optimizer takes them.

        Returns
        -------
        int
            The inner optimizer's ``iterations`` after the step.

        Raises
        ------
        TypeError, ValueError, KeyError
            What the inner optimizer's ``apply_gradients`` raises for these pairs;
            ``ValueError`` when the scale would overflow or underflow (see Notes of the
            class). Nothing has changed then.
        """
        inner = self.inner_optimizer
        pairs = _foreign.pairs(inner, list(grads_and_vars))  # torch tensors -> views
        checked = inner._executor.check_pairs(pairs)
        if not checked:
            return inner.iterations
        if self._rule.flavour == "torch" and any(
                dtype == np.float16 for g, _, (_, dtype) in checked if g is not None):
            raise ValueError(
                "Attempting to unscale FP16 gradients: torch's GradScaler refuses them (keep "
                "float32 master weights); with its fused Adam/AdamW torch accepts them and "
                "divides by the scale in float32 inside the kernel, which refopt does not "
                "reproduce yet. Received: a float16 gradient")
        if inner.built:
            for _, v, _ in checked:
                inner._position(v)  # KeyError for a variable it was not built with
        kinds, values = zip(*[_to_host(g) for g, _ in pairs])
        divide = self._rule.flavour == "torch" and _fused_kernel_divides(inner)
        unscaled = self._rule.unscale(values, self.dynamic_scale, divide)
        if not self.dynamic:
            finite = True
        elif self._rule.flavour in ("tf_keras", "tf1"):
            finite = _all_finite(unscaled)
        else:
            finite = _all_finite(values)
        scale, counter = _new_scale_or_raise(
            self._rule, self.dynamic_scale, self.step_counter, finite,
            f"initial_scale={self.initial_scale!r}, "
            f"dynamic_growth_steps={self.dynamic_growth_steps!r}")
        if finite:
            grads = [_from_host(k, g, u) for k, g, u in zip(kinds, (g for g, _ in pairs),
                                                           unscaled)]
            inner.apply_gradients([(g, v) for g, (_, v) in zip(grads, pairs)])
        else:
            if not inner.built:  # the frameworks build before the check
                inner.build([v for _, v, _ in checked])
            if self._rule.flavour == "tf_keras":  # do_not_apply_fn: iterations += 1
                inner._iterations += 1
        self.dynamic_scale, self.step_counter = scale, counter
        return inner.iterations

    # -------------------------------------------------------------- state and config
    #: state_dict keys beyond the inner optimizer's, saved by :func:`refopt.save_checkpoint`
    _OWN_STATE_KEYS = ("loss_scale",)

    def state_dict(self):
        """The inner optimizer's :meth:`~refopt.Optimizer.state_dict` under this class and
        config, plus ``"loss_scale"``: ``{"scale": float, "counter": int}``."""
        sd = self.inner_optimizer.state_dict()
        sd["class"] = type(self).__name__
        sd["config"] = self.get_config()
        sd["loss_scale"] = {"scale": float(self.dynamic_scale), "counter": int(self.step_counter)}
        return sd

    def load_state_dict(self, state_dict, var_list=None):
        """Restore :meth:`state_dict` (all or nothing); ``"loss_scale"`` is required.

        Raises
        ------
        TypeError, ValueError
            As :meth:`refopt.Optimizer.load_state_dict`; a missing or invalid
            ``"loss_scale"`` (a scale not > 0 and finite, a counter not an integer in
            [0, dynamic_growth_steps)).
        """
        self._check_wrapper_state(state_dict)
        ls = state_dict.get("loss_scale")
        if not isinstance(ls, dict) or "scale" not in ls or "counter" not in ls:
            raise ValueError("`state_dict['loss_scale']` must be a dict with 'scale' and "
                             f"'counter'. Received: {ls!r}")
        scale = _check_scale("state_dict['loss_scale']['scale']", ls["scale"])
        counter = ls["counter"]
        limit = self.dynamic_growth_steps or 1
        if (not isinstance(counter, numbers.Integral) or isinstance(counter, (bool, np.bool_))
                or not 0 <= counter < limit):
            raise ValueError(f"`state_dict['loss_scale']['counter']` must be an integer in "
                             f"[0, {limit}). Received: {counter!r}")
        inner_sd = dict(state_dict)
        inner_sd.pop("loss_scale")
        inner_sd["class"] = type(self.inner_optimizer).__name__
        inner_sd["config"] = state_dict["config"]["inner_optimizer"]["config"]
        self.inner_optimizer.load_state_dict(inner_sd, var_list=var_list)
        self.dynamic_scale, self.step_counter = scale, int(counter)

    def _config_differences(self, config):
        mine = self.get_config()
        return self._wrapper_config_differences(config, "inner_optimizer", {
            k: mine[k] for k in ("dynamic", "initial_scale", "dynamic_growth_steps")})

    def get_config(self):
        """``{"name", "inner_optimizer": {"class_name", "config"}, "dynamic",
        "initial_scale", "dynamic_growth_steps", "backend"}`` (Keras' keys plus backend)."""
        return {
            "name": self.name,
            "inner_optimizer": {"class_name": type(self.inner_optimizer).__name__,
                                "config": self.inner_optimizer.get_config()},
            "dynamic": self.dynamic,
            "initial_scale": self.initial_scale,
            "dynamic_growth_steps": self.dynamic_growth_steps,
            "backend": self.inner_optimizer.backend,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuild from :meth:`get_config` (``backend``, when not None, overrides the inner
        optimizer's; ``custom_objects`` maps class names to your classes)."""
        config = dict(config)
        backend = config.pop("backend", None)
        inner = dict(config.pop("inner_optimizer"))
        inner_config = dict(inner.get("config", {}))
        inner_config["backend"] = backend  # None: the default backend, as checkpoints want
        inner["config"] = inner_config
        inner_opt = _deserialize_inner(inner, None, None, custom_objects)
        return cls(inner_opt, **config)

    def __repr__(self):
        return (f"LossScaleOptimizer(name={self.name!r}, inner={self.inner_optimizer!r}, "
                f"dynamic_scale={self.dynamic_scale!r}, step_counter={self.step_counter})")


def _conv_name(convention):
    return getattr(convention, "name", convention)


def _deserialize_inner(spec, convention, backend, custom_objects=None):
    import refopt.optimizers as _optimizers

    name = spec.get("class_name")
    cls = (custom_objects or {}).get(name)
    if cls is None and name in _optimizers.__all__:
        cls = getattr(_optimizers, name)
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)) or cls is Optimizer:
        raise TypeError("`inner_optimizer` must be a refopt optimizer or {'class_name': <a "
                        "refopt optimizer class>, 'config': {...}}. Received: "
                        f"inner_optimizer={spec!r}")
    config = dict(spec.get("config", {}))
    if convention is not None:
        config["convention"] = convention
    if backend is not None:
        config["backend"] = backend
    return cls.from_config(config, custom_objects=custom_objects)


class GradScaler:
    r"""torch's ``torch.amp.GradScaler`` numbers and API, around refopt optimizers.

    Parameters
    ----------
    init_scale : float, default 2**16
        > 0 and finite in float32.
    growth_factor : float, default 2.0
        > 1.
    backoff_factor : float, default 0.5
        In (0, 1).
    growth_interval : int, default 2000
        >= 1.
    enabled : bool, default True
        False: :meth:`scale` returns its input, :meth:`step` applies the gradients as given.

    Notes
    -----
    ``scale(loss) = loss * s`` (``s`` float32). :meth:`unscale_` multiplies every gradient by
    ``inv = f32(1 / f64(s))`` (torch's reciprocal, computed in double) and records whether
    any **scaled** gradient held an inf or NaN (a finite gradient that overflows when
    unscaled is not detected, as in torch). When :meth:`step` unscales for refopt's ``Adam``,
    ``AdamW``, ``SGD`` or ``Adagrad`` under ``"torch_fused"`` (torch's ``fused=True``
    kernels, which take the scale), the gradient is divided by ``s`` instead, as the fused
    kernel does; an explicit :meth:`unscale_` multiplies for every optimizer, as torch's.
    :meth:`scale` multiplies a float16/bfloat16 array in float32 and rounds once (torch's
    opmath). :meth:`step` applies unless an inf was found (then the optimizer, its counters
    included, is untouched). :meth:`update`::

        found: s = f32(s * backoff_factor); tracker = 0
        else:  tracker + 1 == growth_interval ? (s' = f32(s * growth_factor);
               s = s' if finite; tracker = 0) : tracker += 1

    float16 gradients are refused, as torch refuses them (``ValueError``).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones(2, np.float32)
    >>> opt = refopt.SGD(learning_rate=1.0, convention="torch")
    >>> scaler = refopt.GradScaler(init_scale=4.0, growth_interval=2)
    >>> for g in (np.inf, 1.0, 1.0):
    ...     _ = scaler.step(opt, [(np.full(2, g * scaler.get_scale(), np.float32), w)])
    ...     scaler.update()
    >>> w.tolist(), scaler.get_scale()
    ([-1.0, -1.0], 4.0)
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True):
        self._enabled = check_bool("enabled", enabled)
        self._scale = _check_scale("init_scale", init_scale)
        self._init_scale = float(init_scale)
        self._growth_factor = float(check_real("growth_factor", growth_factor, low=1,
                                               low_open=True))
        self._backoff_factor = float(check_real("backoff_factor", backoff_factor, low=0,
                                                high=1, low_open=True, high_open=True))
        self._growth_interval = _check_steps("growth_interval", growth_interval)
        self._growth_tracker = 0
        self._rule = _ScaleRule("torch", self._growth_interval, self._growth_factor,
                                self._backoff_factor)
        self._pending = {}  # id(optimizer) -> (optimizer, unscaled grads or None, found_inf)

    def is_enabled(self):
        """bool: whether scaling is on (torch's ``enabled``)."""
        return self._enabled

    def get_scale(self):
        """float: the current scale (1.0 when disabled, as torch)."""
        return self._scale if self._enabled else 1.0

    def get_growth_factor(self):
        """float: the factor the scale grows by (torch's default 2.0)."""
        return self._growth_factor

    def get_backoff_factor(self):
        """float: the factor the scale backs off by (torch's default 0.5)."""
        return self._backoff_factor

    def get_growth_interval(self):
        """int: finite steps between growths (torch's default 2000)."""
        return self._growth_interval

    def scale(self, outputs):
        """``outputs * scale`` (an ndarray in its dtype, or a Python float)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, np.ndarray):
            if _precision.is_low_precision(outputs.dtype):  # opmath: float32, one rounding
                with np.errstate(over="ignore"):  # overflows to inf, as torch's
                    return (outputs.astype(np.float32) * np.float32(self._scale)).astype(
                        outputs.dtype)
            return outputs * outputs.dtype.type(np.float32(self._scale))
        return outputs * self._scale

    def _unscale(self, optimizer, grads_and_vars, in_step):
        pairs = list(grads_and_vars)
        kinds, values = zip(*[_to_host(g) for g, _ in pairs]) if pairs else ((), ())
        for i, v in enumerate(values):
            if v is not None and v.dtype == np.float16:
                raise ValueError(
                    "Attempting to unscale FP16 gradients (torch refuses them: keep float32 "
                    "master weights; with its fused Adam/AdamW torch accepts them and divides "
                    "by the scale in float32 inside the kernel, which refopt does not "
                    f"reproduce yet). Received: gradient {i} of dtype float16")
        # in step(), a fused kernel takes the scale and divides; unscale_ (torch's for-each
        # unscale, which the fused step then skips) multiplies by f32(1/s) for every optimizer
        divide = in_step and _fused_kernel_divides(optimizer)
        unscaled = self._rule.unscale(values, self._scale, divide)
        found = not _all_finite(values)
        grads = [(_from_host(k, g, u), v) for k, (g, v), u in zip(kinds, pairs, unscaled)]
        return grads, found

    def unscale_(self, optimizer, grads_and_vars):
        """Unscale a step's gradients for ``optimizer`` once, ahead of :meth:`step` (to clip
        them yourself, say); returns the unscaled ``(gradient, variable)`` pairs.

        Raises
        ------
        RuntimeError
            ``unscale_`` was already called for this optimizer since the last
            :meth:`update` (torch's error).
        ValueError
            A float16 gradient.
        """
        if not self._enabled:
            return list(grads_and_vars)
        if id(optimizer) in self._pending:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        grads, found = self._unscale(optimizer, grads_and_vars, in_step=False)
        self._pending[id(optimizer)] = (optimizer, "unscaled", found)
        return grads

    def step(self, optimizer, grads_and_vars):
        """Apply the (scaled) gradients with ``optimizer`` unless one is inf or NaN.

        ``grads_and_vars`` are unscaled here, unless :meth:`unscale_` returned them (pass
        those). Returns the optimizer's ``iterations``, or None when the step was skipped.
        """
        if not self._enabled:
            return optimizer.apply_gradients(grads_and_vars)
        entry = self._pending.get(id(optimizer))
        if entry is None:
            grads, found = self._unscale(optimizer, grads_and_vars, in_step=True)
        elif entry[1] == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        else:
            grads, found = list(grads_and_vars), entry[2]
        result = None
        if not found:
            result = optimizer.apply_gradients(grads)
        self._pending[id(optimizer)] = (optimizer, "stepped", found)
        return result

    def update(self, new_scale=None):
        """Move the scale after this iteration's :meth:`step` calls (see Notes), or set it to
        ``new_scale`` (> 0 and finite in float32)."""
        if not self._enabled:
            return
        if new_scale is not None:
            self._scale = _check_scale("new_scale", new_scale)
        else:
            if not self._pending:
                raise RuntimeError("update() without a step() or unscale_() since the last "
                                   "update() (torch asserts found_inf was recorded).")
            found = any(entry[2] for entry in self._pending.values())
            self._scale, self._growth_tracker = _new_scale_or_raise(
                self._rule, self._scale, self._growth_tracker, not found,
                f"init_scale={self._init_scale!r}")
        self._pending = {}

    def state_dict(self):
        """torch's keys: ``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker`` (empty when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict` (all or nothing; ``ValueError`` naming a bad entry)."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict) or not state_dict:
            raise ValueError("The state_dict passed to load_state_dict() is empty or not a "
                             f"dict (a disabled scaler saved it?). Received: {state_dict!r}")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval",
                               "_growth_tracker") if k not in state_dict]
        if missing:
            raise ValueError(f"`state_dict` lacks {missing}.")
        other = GradScaler(state_dict["scale"], state_dict["growth_factor"],
                           state_dict["backoff_factor"], state_dict["growth_interval"])
        tracker = state_dict["_growth_tracker"]
        if (not isinstance(tracker, numbers.Integral) or isinstance(tracker, (bool, np.bool_))
                or not 0 <= tracker < other._growth_interval):
            raise ValueError("`state_dict['_growth_tracker']` must be an integer in "
                             f"[0, growth_interval). Received: {tracker!r}")
        self.__dict__.update(other.__dict__)
        self._growth_tracker = int(tracker)
