"""optax's ``MultiSteps``: gradient accumulation by a running mean, around a refopt optimizer.

Followed: ``optax/transforms/_accumulation.py`` (``MultiSteps``, ``skip_not_finite``; optax
0.2.8). See :class:`MultiSteps`.
"""

from __future__ import annotations

import numbers

import numpy as np

from refopt import _foreign
from refopt.accumulation import _device_like
from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import check_bool
from refopt.optimizers.loss_scale import _conv_name, _deserialize_inner, _Wrapper
from refopt.reference.variants import fma as _fma

__all__ = ["MultiSteps", "skip_not_finite"]


def skip_not_finite(grads, gradient_step, params):
    """optax's ``skip_not_finite``: True when any gradient holds an inf or a NaN."""
    return any(not np.isfinite(np.asarray(g)).all() for g in grads)


_SKIP_FUNCTIONS = {"skip_not_finite": skip_not_finite}


def _host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


class MultiSteps(_Wrapper):
    r"""optax's ``MultiSteps(opt, every_k_schedule)`` around a refopt optimizer (``"optax"``).

    Each :meth:`apply_gradients` adds the gradients to a running mean; every
    ``k``-th call the inner optimizer steps with that mean, and the calls in between leave
    the variables and the inner optimizer as they are (optax emits zero updates).

    Parameters
    ----------
    inner_optimizer : refopt.Optimizer or dict
        An optimizer under ``convention="optax"`` (or its ``{"class_name", "config"}``).
    every_k_schedule : int or callable
        ``k >= 1``, or a function of the number of emitted updates returning it.
    use_grad_mean : bool, default True
        True: the running mean ``acc + (g - acc) / (n + 1)`` (optax's Welford form); False:
        the sum ``g + acc``.
    should_skip_update_fn : None, "skip_not_finite" or callable, default None
        ``f(grads, gradient_step, params) -> bool``; True skips the call entirely (nothing
        changes). ``"skip_not_finite"`` is optax's ``skip_not_finite``.
    accumulator_dtype : str or None, default "float32"
        The accumulators' dtype (optax's default float32); None: each variable's dtype.
    name : str, default "multi_steps"
    convention, backend : optional
        Only with a dict ``inner_optimizer`` (see :class:`LossScaleOptimizer`).

    Raises
    ------
    TypeError
        ``inner_optimizer`` is not a refopt optimizer; ``every_k_schedule`` or
        ``should_skip_update_fn`` of the wrong type.
    ValueError
        The inner convention is not ``"optax"``; ``every_k_schedule`` < 1 (also when a
        schedule returns it: the step raises, nothing changed); an ``IndexedSlices`` or
        ``None`` gradient (optax takes a dense gradient for every leaf).

    Notes
    -----
    With ``n`` the mini-step (0-based, reset on every emitted update) and ``k`` the
    schedule's value at the number of emitted updates::

        acc' = acc + (g - acc) / (n + 1)         # in the promoted dtype, stored as
        if n == k - 1:                           # accumulator_dtype
            inner.apply_gradients(fma(g - acc, 1/(n + 1), acc)); acc = 0 * acc'
        else:
            acc = acc';  w = w + 0 * acc'
        n = (n + 1) % k

    The mean the inner optimizer gets is the one XLA computes under ``jit`` when it fuses
    the accumulation into the inner update (a reciprocal and one fused multiply-add,
    measured on optax 0.2.8 / jax 0.10.2); the stored accumulator keeps the division.
    With ``use_grad_mean=False`` the sum ``g + acc``. XLA's contraction of the inner
    optimizer's own products also changes in that fusion (Adam's ``m``: up to 17 ulp per
    step from the second update on; not modelled).

    optax multiplies the inner update by 0 on the calls in between, so an inf or NaN
    gradient poisons the accumulator (``0 * NaN``) and every later variable; refopt
    reproduces that element by element (``w + 0 * acc'``), which is what optax gives for
    elementwise optimizers (an update that mixes elements, global-norm clipping, spreads
    the NaN further in optax). Use ``should_skip_update_fn="skip_not_finite"`` to avoid
    it. ``iterations`` (the inner optimizer's) counts the emitted updates.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.zeros(1, np.float32)
    >>> opt = refopt.MultiSteps(refopt.SGD(learning_rate=1.0, convention="optax"), 3)
    >>> for g in (1.0, 2.0, 4.0):
    ...     _ = opt.apply_gradients([(np.float32([g]), w)])
    >>> w.tolist(), opt.iterations   # optax: -7/3 through the running mean
    ([-2.3333332538604736], 1)
    """

    _OWN_STATE_KEYS = ("multi_steps",)

    def __init__(self, inner_optimizer, every_k_schedule, use_grad_mean=True,
                 should_skip_update_fn=None, accumulator_dtype="float32", name="multi_steps",
                 convention=None, backend=None):
        from refopt.optimizers.base import Optimizer

        if isinstance(inner_optimizer, dict):
            inner_optimizer = _deserialize_inner(inner_optimizer, convention, backend)
        elif convention is not None or backend is not None:
            raise ValueError("`convention` and `backend` are the inner optimizer's; pass them "
                             f"to it. Received: convention={_conv_name(convention)!r}, "
                             f"backend={backend!r}")
        if not isinstance(inner_optimizer, Optimizer) or isinstance(inner_optimizer, _Wrapper):
            raise TypeError("`inner_optimizer` must be a refopt optimizer (not a wrapper). "
                            f"Received: inner_optimizer={type(inner_optimizer).__name__}")
        if inner_optimizer.convention.name != "optax":
            raise ValueError(
                "MultiSteps is optax's; its inner optimizer must use convention='optax' "
                "(Keras 3: gradient_accumulation_steps=; torch: "
                "refopt.accumulation.torch_accumulate). Received: inner_optimizer with "
                f"convention={inner_optimizer.convention.name!r}")
        if not callable(every_k_schedule):
            self._check_k(every_k_schedule)
        if isinstance(should_skip_update_fn, str):
            if should_skip_update_fn not in _SKIP_FUNCTIONS:
                raise ValueError("`should_skip_update_fn` must be None, 'skip_not_finite' or a "
                                 "callable. Received: "
                                 f"should_skip_update_fn={should_skip_update_fn!r}")
        elif should_skip_update_fn is not None and not callable(should_skip_update_fn):
            raise TypeError("`should_skip_update_fn` must be None, 'skip_not_finite' or a "
                            f"callable. Received: {type(should_skip_update_fn).__name__}")
        if accumulator_dtype is not None:
            accumulator_dtype = np.dtype(accumulator_dtype).name
            if accumulator_dtype not in ("float16", "float32", "float64"):
                raise ValueError("`accumulator_dtype` must be float16, float32, float64 or "
                                 f"None. Received: accumulator_dtype={accumulator_dtype!r}")
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str. Received: name={name!r}")
        self.inner_optimizer = inner_optimizer
        self.name = name
        self.every_k_schedule = every_k_schedule
        self.use_grad_mean = check_bool("use_grad_mean", use_grad_mean)
        self.should_skip_update_fn = should_skip_update_fn
        self.accumulator_dtype = accumulator_dtype
        self.mini_step = 0
        self.gradient_step = 0
        self._acc = []

    @staticmethod
    def _check_k(k):
        if not isinstance(k, numbers.Integral) or isinstance(k, (bool, np.bool_)) or k < 1:
            raise ValueError("`every_k_schedule` must be an integer >= 1 (or a function of the "
                             f"gradient step returning one). Received: every_k_schedule={k!r}")
        return int(k)

    def _accumulators(self):
        if len(self._acc) != len(self.inner_optimizer._vars):
            self._acc = [np.zeros(tuple(s), self.accumulator_dtype or d)
                         for s, d in self.inner_optimizer._var_specs]
        return self._acc

    def build(self, var_list):
        """Build the inner optimizer for ``var_list`` and create the zero accumulators (one
        per variable, its shape and the ``accumulator_dtype``); see
        :meth:`refopt.Optimizer.build` for the arguments and errors."""
        self.inner_optimizer.build(var_list)
        self._accumulators()

    def apply_gradients(self, grads_and_vars):
        """One mini-step (see the class Notes). Returns the inner ``iterations``.

        Raises
        ------
        TypeError, ValueError, KeyError
            What the inner optimizer raises for these pairs; an ``IndexedSlices`` or
            ``None`` gradient; a schedule value < 1. Nothing has changed then.
        """
        inner = self.inner_optimizer
        pairs = _foreign.pairs(inner, list(grads_and_vars))
        checked = inner._executor.check_pairs(pairs)
        if not checked:
            return inner.iterations
        for j, (g, _, _) in enumerate(checked):
            if g is None or isinstance(g, IndexedSlices):
                raise ValueError(f"MultiSteps (optax) takes a dense gradient for every "
                                 f"variable. Received: {type(g).__name__} at position {j}")
        if inner.built:
            positions = [inner._position(v) for _, v, _ in checked]
            if sorted(positions) != list(range(len(inner._vars))):
                raise ValueError("MultiSteps (optax) needs a gradient for every variable it was "
                                 f"built with ({len(inner._vars)}). Received: {len(positions)}")
        k = self.every_k_schedule
        k = self._check_k(k(self.gradient_step) if callable(k) else k)
        grads = [_host(g) for g, _, _ in checked]
        skip = self.should_skip_update_fn
        skip = _SKIP_FUNCTIONS.get(skip, skip) if isinstance(skip, str) else skip
        if skip is not None and bool(skip(grads, self.gradient_step,
                                          [_host(v) for _, v, _ in checked])):
            return inner.iterations
        building = not inner.built
        if building:
            inner.build([v for _, v, _ in checked])
        try:
            accs = self._accumulators()
            positions = [inner._position(v) for _, v, _ in checked]
            new = []
            with np.errstate(all="ignore"):
                for g, i in zip(grads, positions):
                    acc = accs[i]
                    wide = np.result_type(g.dtype, acc.dtype)
                    if self.use_grad_mean:
                        a = (acc.astype(wide) + (g.astype(wide) - acc.astype(wide))
                             / wide.type(self.mini_step + 1))
                    else:
                        a = g.astype(wide) + acc.astype(wide)
                    new.append(a)
            emit = self.mini_step == k - 1
            if emit:
                fed = new
                if self.use_grad_mean:  # what XLA feeds the inner update under jit
                    fed = [_fma(g.astype(a.dtype) - accs[i].astype(a.dtype),
                                a.dtype.type(1) / a.dtype.type(self.mini_step + 1),
                                accs[i].astype(a.dtype))
                           for a, g, i in zip(new, grads, positions)]
                inner.apply_gradients([(_device_like(v, a.astype(g.dtype)), v)
                                       for a, g, (_, v, _) in zip(fed, grads, checked)])
        except BaseException:
            if building:
                inner._reset_state()
                self._acc = []
            raise
        with np.errstate(all="ignore"):
            for a, i, (_, v, _) in zip(new, positions, checked):
                accs[i][...] = (a * a.dtype.type(0)) if emit else a
                if not emit:  # optax's w + 0 * u: NaN where the accumulator is not finite
                    poisoned = ~np.isfinite(a)
                    if poisoned.any():
                        host = _host(v).copy()
                        host[poisoned] = np.nan
                        if isinstance(v, np.ndarray):
                            np.copyto(v, host)
                        else:
                            v.copy_to_device(host)
        self.mini_step = (self.mini_step + 1) % k
        if emit:
            self.gradient_step += 1
        return inner.iterations

    # ------------------------------------------------------------------ state and config
    def state_dict(self):
        """The inner optimizer's state under this class and config, plus
        ``"gradient_accumulation"`` (``micro_steps``: the mini-step; ``accumulators``) and
        ``"multi_steps"`` (``{"gradient_step": int}``)."""
        sd = self.inner_optimizer.state_dict()
        sd["class"] = type(self).__name__
        sd["config"] = self.get_config()
        accs = [a.copy() for a in self._accumulators()] if self.built else []
        sd["gradient_accumulation"] = {"micro_steps": int(self.mini_step), "accumulators": accs}
        sd["multi_steps"] = {"gradient_step": int(self.gradient_step)}
        return sd

    def load_state_dict(self, state_dict, var_list=None):
        """Restore :meth:`state_dict` (all or nothing)."""
        if not isinstance(state_dict, dict) or state_dict.get("class") != type(self).__name__:
            raise ValueError("`state_dict` must be a MultiSteps state_dict(). Received the "
                             "state of class "
                             f"{state_dict.get('class') if isinstance(state_dict, dict) else None}")
        diffs = self._config_differences(state_dict.get("config"))
        if diffs:
            raise ValueError("`state_dict` was saved from an optimizer with another "
                             "configuration. Differences: " + "; ".join(diffs))
        ga, ms = state_dict.get("gradient_accumulation"), state_dict.get("multi_steps")
        if not isinstance(ga, dict) or not isinstance(ms, dict):
            raise TypeError("`state_dict['gradient_accumulation']` and "
                            "`state_dict['multi_steps']` must be dicts. Received: "
                            f"{type(ga).__name__}, {type(ms).__name__}")
        mini, gstep = ga.get("micro_steps"), ms.get("gradient_step")
        for what, v in (("gradient_accumulation']['micro_steps", mini),
                        ("multi_steps']['gradient_step", gstep)):
            if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or v < 0:
                raise ValueError(f"`state_dict['{what}']` must be an integer >= 0. "
                                 f"Received: {v!r}")
        accs = [np.asarray(a) for a in ga.get("accumulators", [])]
        inner_sd = {k: v for k, v in state_dict.items()
                    if k not in ("gradient_accumulation", "multi_steps")}
        inner_sd["class"] = type(self.inner_optimizer).__name__
        inner_sd["config"] = state_dict["config"]["inner_optimizer"]["config"]
        if state_dict.get("built"):
            specs = ([(tuple(np.shape(var_list[i])), None) for i in range(len(var_list))]
                     if var_list is not None else
                     [(tuple(s), None) for s, _ in self.inner_optimizer._var_specs])
            if len(accs) != len(specs) or any(
                    a.shape != s for a, (s, _) in zip(accs, specs)):
                raise ValueError("`state_dict['gradient_accumulation']['accumulators']` must "
                                 "hold one array of each variable's shape.")
        self.inner_optimizer.load_state_dict(inner_sd, var_list=var_list)
        self.mini_step, self.gradient_step = int(mini), int(gstep)
        self._acc = []
        if self.built:
            self._acc = [a.astype(self.accumulator_dtype or a.dtype) for a in accs]

    def _config_differences(self, config):
        mine = self.get_config()
        return self._wrapper_config_differences(config, "inner_optimizer", {
            k: mine[k] for k in ("every_k_schedule", "use_grad_mean", "should_skip_update_fn",
                                 "accumulator_dtype")})

    def get_config(self):
        """The constructor arguments (a callable schedule or skip function as given: such a
        config does not serialize, so checkpoints need an int and a named skip function)."""
        return {
            "name": self.name,
            "inner_optimizer": {"class_name": type(self.inner_optimizer).__name__,
                                "config": self.inner_optimizer.get_config()},
            "every_k_schedule": self.every_k_schedule,
            "use_grad_mean": self.use_grad_mean,
            "should_skip_update_fn": self.should_skip_update_fn,
            "accumulator_dtype": self.accumulator_dtype,
            "backend": self.inner_optimizer.backend,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        backend = config.pop("backend", None)
        inner = dict(config.pop("inner_optimizer"))
        inner["config"] = dict(inner.get("config", {}), backend=backend)
        return cls(_deserialize_inner(inner, None, None, custom_objects), **config)

    def __repr__(self):
        return (f"MultiSteps(name={self.name!r}, inner={self.inner_optimizer!r}, "
                f"mini_step={self.mini_step}, gradient_step={self.gradient_step})")
