"""TF-Addons' weight-averaging wrappers, ``MovingAverage`` and ``SWA``, around a Keras 2 optimizer.

Followed (facts only): ``tensorflow_addons/optimizers/average_wrapper.py``
(``AveragedOptimizerWrapper``), ``moving_average.py`` and ``stochastic_weight_averaging.py``
(TF-Addons 0.23 on TF 2.15 / Keras 2.15), and ``keras/src/backend.py``
(``moving_average_update``). Both wrap a legacy Keras 2 optimizer, so both take an inner
optimizer under ``convention="keras2"`` and refuse any other.

What the wrappers do around the inner step (one :meth:`apply_gradients`, ``t`` the
pre-increment ``iterations``, shared by the wrapper and the inner optimizer as TF-Addons
shares it):

1. on the first call, create one ``average`` slot per variable: a **copy** of the variable
   (``MovingAverage``) or **zeros** (``SWA``);
2. the wrapper's own clipping (``clipnorm``, ``clipvalue``, ``global_clipnorm``: TF-Addons
   never calls the inner optimizer's ``apply_gradients``, so an inner optimizer's clipping
   would be ignored there; refopt refuses one);
3. the inner optimizer's step (its schedule, Keras 2 ``decay``, sparse rules, update);
4. for each variable that had a gradient, the average of its **new** value (dense, also
   for an ``IndexedSlices`` gradient), as the classes' Notes say;
5. ``iterations += 1``.

The averaging is elementwise NumPy on the host in the variable's dtype (device arrays are
read and written back under ``backend="cuda"``), so every backend gives the same bits.
"""

from __future__ import annotations

import numbers

import numpy as np

from refopt import _foreign
from refopt.optimizers.base import Optimizer, check_bool
from refopt.optimizers.loss_scale import _conv_name, _deserialize_inner, _Wrapper

__all__ = ["SWA", "MovingAverage"]

_F32 = np.float32


def _host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def _put(dst, value):
    if isinstance(dst, np.ndarray):
        np.copyto(dst, value)
    else:
        dst.copy_to_device(np.ascontiguousarray(value))


def _check_int(name, value, low):
    if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)) \
            or value < low:
        raise ValueError(f"`{name}` must be an integer >= {low}. Received: {name}={value!r}")
    return int(value)


class _AveragedWrapper(_Wrapper):
    """TF-Addons' ``AveragedOptimizerWrapper``: the inner step, then an average per variable."""

    _tfa_name = ""

    def _init_inner(self, optimizer, name, convention, backend, clip):
        if isinstance(optimizer, dict):
            optimizer = _deserialize_inner(optimizer, convention, backend)
        elif isinstance(optimizer, Optimizer):
            if convention is not None and _conv_name(convention) != optimizer.convention.name:
                raise ValueError(
                    f"`convention` is the inner optimizer's ({optimizer.convention.name!r}). "
                    f"Received: convention={_conv_name(convention)!r}")
            if backend not in (None, optimizer.backend):
                raise ValueError(f"`backend` is the inner optimizer's ({optimizer.backend!r}). "
                                 f"Received: backend={backend!r}")
        if not isinstance(optimizer, Optimizer) or isinstance(optimizer, _Wrapper):
            raise TypeError("`optimizer` must be a refopt optimizer (not a wrapper). Received: "
                            f"optimizer={type(optimizer).__name__}")
        conv = optimizer.convention.name
        if conv != "keras2":
            raise ValueError(
                f"{type(self).__name__} is TF-Addons' ({self._tfa_name}), which wraps a Keras 2 "
                "legacy optimizer: its inner optimizer must use convention='keras2' (tf_keras "
                "and Keras 3: use_ema=True, ema_momentum=...; torch's AveragedModel: "
                "use_ema=True, ema_momentum=None under 'torch'). Received: optimizer with "
                f"convention={conv!r}")
        clips = [f"{k}={getattr(optimizer, k)!r}" for k in ("clipnorm", "clipvalue",
                                                           "global_clipnorm")
                 if getattr(optimizer, k) is not None]
        if clips:
            raise ValueError(
                f"TF-Addons' {type(self).__name__} never calls the inner optimizer's "
                "apply_gradients, so the inner optimizer's clipping is ignored there; refopt "
                "refuses it rather than apply what TF-Addons does not (give the wrapper "
                f"{', '.join(c.split('=')[0] + '=' for c in clips)} instead). Received: "
                f"optimizer with {', '.join(clips)}")
        if optimizer.gradient_accumulation_steps:
            raise ValueError("`optimizer` must not accumulate gradients (Keras 3's option). "
                             "Received: gradient_accumulation_steps="
                             f"{optimizer.gradient_accumulation_steps!r}")
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str. Received: name={name!r}")
        # the wrapper's own clipping (TF-Addons' **kwargs): Keras 2's rules and numbers, by an
        # optimizer of the inner convention that only clips (it validates as Keras 2 does)
        self.clipnorm, self.clipvalue, self.global_clipnorm = (
            clip["clipnorm"], clip["clipvalue"], clip["global_clipnorm"])
        self._clipper = None
        if any(v is not None for v in clip.values()):
            from refopt.optimizers.sgd import SGD

            self._clipper = SGD(learning_rate=0.0, convention=optimizer.convention,
                                backend="reference", **clip)
        self.inner_optimizer = optimizer
        self.name = name
        self._avg = []

    def _clipped(self, pairs, checked):
        """``pairs`` with the wrapper's clipping applied to the gradients (new objects)."""
        from refopt.accumulation import _device_like
        from refopt.executors import staged

        if self._clipper is None:
            return pairs
        present = [j for j, (g, _, _) in enumerate(checked) if g is not None]
        grads = [checked[j][0] for j in present]
        host = [g if not hasattr(g, "copy_to_host") else g.copy_to_host() for g in grads]
        clipped = staged.clip(self._clipper, host)
        out = [(None, v) for _, v, _ in checked]
        for j, g, c in zip(present, grads, clipped):
            out[j] = (c if not hasattr(g, "copy_to_host") else _device_like(checked[j][1], c),
                      checked[j][1])
        return out

    # ------------------------------------------------------------------ slots
    @property
    def slot_names(self):
        """tuple of str: the inner optimizer's slot names, then ``"average"``."""
        return tuple(self.inner_optimizer.slot_names) + ("average",)

    @property
    def variables(self):
        """list: the inner optimizer's :attr:`~refopt.Optimizer.variables`, then the averages
        (TF-Addons' ``weights`` lists the wrapper's own first; the order is refopt's)."""
        return list(self.inner_optimizer.variables) + list(self._averages_built())

    def slot_shape(self, name, shape):
        """The shape of slot ``name`` for a variable of ``shape`` (``"average"``: ``shape``)."""
        if name == "average":
            return tuple(shape)
        return self.inner_optimizer.slot_shape(name, shape)

    def slot_dtype(self, name, shape, dtype):
        """The dtype of slot ``name`` (``"average"``: the variable's ``dtype``)."""
        if name == "average":
            return np.dtype(dtype)
        return self.inner_optimizer.slot_dtype(name, shape, dtype)

    def get_slot(self, var, slot_name):
        """The live array ``slot_name`` of ``var``: ``"average"`` or an inner slot.

        Raises
        ------
        KeyError
            ``var`` is not a variable the optimizer was built with, or the slot is unknown.
        """
        if slot_name == "average":
            return self._averages_built()[self.inner_optimizer._position(var)]
        return self.inner_optimizer.get_slot(var, slot_name)

    def _initial_average(self, value):
        raise NotImplementedError

    def _averages_built(self):
        """The averages, created for the inner optimizer's variables if it was built
        without them (``build`` on the inner optimizer itself)."""
        inner = self.inner_optimizer
        if not inner.built:
            return []
        if len(self._avg) != len(inner._vars):
            avg = []
            for v in inner._vars:
                a = self._initial_average(_host(v))
                if not isinstance(v, np.ndarray):
                    from refopt.kernels import cuda as _kc

                    a = _kc.to_device(a)
                avg.append(a)
            self._avg = avg
        return self._avg

    def build(self, var_list):
        """Build the inner optimizer for ``var_list`` and create the averages (see
        :meth:`refopt.Optimizer.build` for the arguments and errors)."""
        self._check_dtypes([_host_dtype(v) for v in var_list])
        self.inner_optimizer.build(var_list)
        self._averages_built()

    def _check_dtypes(self, dtypes):
        """Refuse what TF-Addons refuses (``SWA``: variables that are not float32)."""

    # ------------------------------------------------------------------ the step
    def apply_gradients(self, grads_and_vars):
        """The inner optimizer's step, then the average of each updated variable.

        Parameters
        ----------
        grads_and_vars : iterable of (gradient, variable)
            As the inner optimizer's :meth:`~refopt.Optimizer.apply_gradients` takes them.

        Returns
        -------
        int
            ``iterations`` after the step.

        Raises
        ------
        TypeError, ValueError, KeyError
            What the inner optimizer raises for these pairs (``SWA``: also a variable that is
            not float32). Nothing has changed then: no variable, slot, average or counter.
        """
        inner = self.inner_optimizer
        pairs = _foreign.pairs(inner, list(grads_and_vars))
        checked = inner._executor.check_pairs(pairs)
        if not checked:
            return inner.iterations
        self._check_dtypes([spec[1] for _, _, spec in checked])
        step = inner.iterations  # TF-Addons: the pre-increment count, shared with the inner
        pairs = self._clipped(pairs, checked)
        building = not inner.built
        if building and any(g is not None for g, _, _ in checked):
            inner.build([v for _, v, _ in checked])
        try:
            averages = self._averages_built()
            inner.apply_gradients(pairs)
        except BaseException:
            if building:
                inner._reset_state()
                self._avg = []
            raise
        done = set()
        with np.errstate(all="ignore"):
            for g, v, _ in checked:
                if g is None:
                    continue
                i = inner._position(v)
                if i in done:
                    continue
                done.add(i)
                new = self._average(_host(averages[i]), _host(inner._vars[i]), step)
                if new is not None:
                    _put(averages[i], new)
        return inner.iterations

    def _average(self, avg, w, step):
        """The new average of one variable (None: unchanged)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the averages
    def assign_average_vars(self, var_list):
        """Overwrite each variable of ``var_list`` with its ``average`` (TF-Addons' name).

        Parameters
        ----------
        var_list : list of ndarray
            Variables the optimizer was built with.

        Raises
        ------
        KeyError
            A variable unknown to the optimizer (then nothing is overwritten). TF-Addons
            warns and skips such a variable instead.
        """
        inner = self.inner_optimizer
        positions = [inner._position(v) for v in var_list]
        averages = self._averages_built()
        for i in positions:
            _put(inner._vars[i], _host(averages[i]))
        _foreign.touched(inner, positions)

    def finalize_variable_values(self, var_list):
        """Keras' name for :meth:`assign_average_vars` (the same)."""
        self.assign_average_vars(var_list)

    # ------------------------------------------------------------------ state and config
    def state_dict(self):
        """The inner optimizer's :meth:`~refopt.Optimizer.state_dict` under this class and
        config, with ``"average"`` last in ``slot_names`` and ``slots`` (one array per built
        variable, build order)."""
        sd = self.inner_optimizer.state_dict()
        sd["class"] = type(self).__name__
        sd["config"] = self.get_config()
        sd["slot_names"] = list(sd["slot_names"]) + ["average"]
        if sd["built"]:
            sd["slots"] = dict(sd["slots"])
            sd["slots"]["average"] = [_host(a).copy() for a in self._averages_built()]
        return sd

    def load_state_dict(self, state_dict, var_list=None):
        """Restore :meth:`state_dict` (all or nothing).

        Raises
        ------
        TypeError, ValueError
            As :meth:`refopt.Optimizer.load_state_dict`; a state of another class or
            configuration; averages missing or not of the variables' shapes and dtypes.
        """
        self._check_wrapper_state(state_dict)
        inner_sd = dict(state_dict)
        inner_sd["class"] = type(self.inner_optimizer).__name__
        inner_sd["config"] = state_dict["config"]["optimizer"]["config"]
        names = list(state_dict.get("slot_names", []))
        if not names or names[-1] != "average":
            raise ValueError("`state_dict['slot_names']` must end with 'average'. Received: "
                             f"{names!r}")
        inner_sd["slot_names"] = names[:-1]
        averages = []
        if state_dict.get("built"):
            slots = dict(state_dict.get("slots") or {})
            averages = [np.asarray(a) for a in slots.pop("average", None) or []]
            inner_sd["slots"] = slots
            specs = ([(tuple(np.shape(v)), _host_dtype(v)) for v in var_list]
                     if var_list is not None else
                     [(tuple(s), np.dtype(d)) for s, d in self.inner_optimizer._var_specs])
            if len(averages) != len(specs) or any(
                    a.shape != s or (d is not None and a.dtype != d)
                    for a, (s, d) in zip(averages, specs)):
                raise ValueError("`state_dict['slots']['average']` must hold one array of each "
                                 "variable's shape and dtype. Received: "
                                 f"{[(a.shape, a.dtype.name) for a in averages]}")
        self.inner_optimizer.load_state_dict(inner_sd, var_list=var_list)
        self._avg = []
        if self.inner_optimizer.built:
            self._averages_built()
            for dst, a in zip(self._avg, averages):
                _put(dst, a)

    def _own_config(self):
        raise NotImplementedError

    def _clip_config(self):
        return {"clipnorm": self.clipnorm, "clipvalue": self.clipvalue,
                "global_clipnorm": self.global_clipnorm}

    def _config_differences(self, config):
        return self._wrapper_config_differences(config, "optimizer", self._own_config())

    def get_config(self):
        """``{"name", "optimizer": {"class_name", "config"}, <the wrapper's arguments>,
        "backend"}`` (TF-Addons' keys plus backend)."""
        return {"name": self.name,
                "optimizer": {"class_name": type(self.inner_optimizer).__name__,
                              "config": self.inner_optimizer.get_config()},
                **self._own_config(),
                "backend": self.inner_optimizer.backend}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Rebuild from :meth:`get_config` (``backend``, when not None, overrides the inner
        optimizer's; ``custom_objects`` maps class names to your classes)."""
        config = dict(config)
        backend = config.pop("backend", None)
        inner = dict(config.pop("optimizer"))
        inner["config"] = dict(inner.get("config", {}), backend=backend)
        return cls(_deserialize_inner(inner, None, None, custom_objects), **config)

    def __repr__(self):
        own = ", ".join(f"{k}={v!r}" for k, v in self._own_config().items())
        return (f"{type(self).__name__}({own}, inner={self.inner_optimizer!r}, "
                f"iterations={self.iterations})")


def _host_dtype(v):
    try:
        return np.dtype(v.dtype)
    except TypeError:  # a torch tensor: its dtype's NumPy name, where NumPy has one
        try:
            return np.dtype(str(getattr(v, "dtype", "")).replace("torch.", ""))
        except TypeError:
            return None


class MovingAverage(_AveragedWrapper):
    r"""TF-Addons' ``MovingAverage(optimizer, average_decay, num_updates, start_step,
    dynamic_decay)``: an exponential moving average of the weights, under ``"keras2"``.

    Parameters
    ----------
    optimizer : refopt.Optimizer or dict
        The optimizer that steps, under ``convention="keras2"`` (or its ``{"class_name",
        "config"}``), without clipping of its own (TF-Addons ignores it) and not a wrapper.
    average_decay : float, default 0.99
        The decay ``mu``, in [0, 1]; used as ``float32(average_decay)``.
    num_updates : int or None, default None
        TF-Addons' fixed count: ``mu = min(mu, (1 + n) / (10 + n))`` once, in float32, at
        construction (an integer >= 0).
    start_step : int, default 0
        Before ``iterations`` reaches it, the decay is 0 (the average follows the weights).
        An integer >= 0.
    dynamic_decay : bool, default False
        ``mu_t = min(mu, (1 + s) / (10 + s))`` with ``s = t - start_step`` (0.1 at first).
    name : str, default "MovingAverage"
    convention, backend : optional
        Only with a dict ``optimizer`` (the conformance replay and
        :func:`refopt.load_checkpoint` use them); with an instance, None or its own.
    clipnorm, clipvalue, global_clipnorm : float or None
        The wrapper's clipping (TF-Addons' ``**kwargs``), as Keras 2 clips: ``clipvalue``,
        then ``clipnorm`` per tensor, then ``global_clipnorm`` (not both norms), on the raw
        gradients (``IndexedSlices`` rows before duplicates are summed); thresholds >= 0.

    Raises
    ------
    TypeError
        ``optimizer`` is not a refopt optimizer (or is a wrapper); ``name`` not a str.
    ValueError
        The inner convention is not ``"keras2"``; the inner optimizer clips (TF-Addons
        ignores that: give the wrapper the threshold) or accumulates; ``average_decay`` not in
        [0, 1]; ``num_updates`` or ``start_step`` not an integer >= 0; ``dynamic_decay`` not a
        bool; a clip threshold < 0 or NaN, or both ``clipnorm`` and ``global_clipnorm``.

    Notes
    -----
    With ``t`` the pre-increment ``iterations`` and ``mu = float32(average_decay)``
    (``min(mu, (1 + n)/(10 + n))`` with ``num_updates``), all in float32 (TF's casts)::

        d = 0                                          if float32(t) < start_step
            min(mu, (1 + s) / (10 + s)), s = t - start_step   with dynamic_decay
            mu                                         otherwise
        avg <- avg - (avg - w_new) * (1 - d)           # in the variable's dtype, d cast to it

    (``tf.keras.backend.moving_average_update`` under TF 2; ``w_new`` is the variable after
    the inner update; the average starts as a copy of the variable when the state is built.)
    This is neither tf-keras' EMA ``mu*avg + (1 - mu)*w`` nor Keras 3's: the roundings
    differ. A variable with a ``None`` gradient keeps its average, as in TF-Addons.

    :meth:`swap_weights` is TF-Addons' swap (``a += b; b = a - b; a -= b``), which is not an
    exact exchange in floating point; TF-Addons runs it only under a
    ``tf.distribute.Strategy`` (else ``ValueError``). :meth:`assign_average_vars` (or
    :meth:`finalize_variable_values`) copies the averages into the variables.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 2.0], np.float32)
    >>> opt = refopt.MovingAverage(refopt.SGD(learning_rate=0.1, convention="keras2"),
    ...                            average_decay=0.9)
    >>> for _ in range(3):
    ...     _ = opt.apply_gradients([(np.float32([1.0, -1.0]), w)])
    >>> opt.get_slot(w, "average").tolist()     # TF-Addons 0.23's values
    [0.9438999891281128, 2.0561001300811768]
    """

    _tfa_name = "tfa.optimizers.MovingAverage"

    def __init__(self, optimizer, average_decay=0.99, num_updates=None, start_step=0,
                 dynamic_decay=False, name="MovingAverage", convention=None, backend=None,
                 clipnorm=None, clipvalue=None, global_clipnorm=None):
        if isinstance(average_decay, (bool, np.bool_)) or not isinstance(
                average_decay, numbers.Real) or not 0 <= float(average_decay) <= 1:
            raise ValueError("`average_decay` must be a float in [0, 1]. Received: "
                             f"average_decay={average_decay!r}")
        if num_updates is not None:
            num_updates = _check_int("num_updates", num_updates, 0)
        start_step = _check_int("start_step", start_step, 0)
        dynamic_decay = check_bool("dynamic_decay", dynamic_decay)
        self._init_inner(optimizer, name, convention, backend,
                         {"clipnorm": clipnorm, "clipvalue": clipvalue,
                          "global_clipnorm": global_clipnorm})
        self.average_decay = float(average_decay)
        self.num_updates = num_updates
        self.start_step = start_step
        self.dynamic_decay = dynamic_decay
        mu = _F32(average_decay)
        if num_updates is not None:  # tf.minimum(average_decay, (1 + n)/(10 + n)), float32
            n = _F32(num_updates)
            mu = min(mu, (_F32(1) + n) / (_F32(10) + n))
        self._mu = _F32(mu)

    def _own_config(self):
        return {"average_decay": self.average_decay, "num_updates": self.num_updates,
                "start_step": self.start_step, "dynamic_decay": self.dynamic_decay,
                **self._clip_config()}

    def decay(self, step=None):
        """The float32 decay TF-Addons uses at pre-increment ``iterations`` ``step`` (default:
        the current ``iterations``, i.e. the next step's)."""
        t = _F32(self.iterations if step is None else step)  # tf.cast(int64, float32)
        start = _F32(self.start_step)
        if t < start:
            return _F32(0)
        if self.dynamic_decay:
            s = t - start
            return _F32(min(self._mu, (_F32(1) + s) / (_F32(10) + s)))
        return self._mu

    def _initial_average(self, value):
        return value.copy()  # add_slot(var, "average", var.read_value())

    def _average(self, avg, w, step):
        dt = avg.dtype.type
        one_minus = dt(1) - dt(self.decay(step))
        return avg - (avg - w) * one_minus

    def swap_weights(self, var_list):
        """TF-Addons' ``swap_weights``: for each average ``a`` and its variable ``b``,
        ``a = a + b; b = a - b; a = a - b`` in the variable's dtype (not an exact exchange:
        each line rounds, and the variable takes the rounding: it may get its average within
        an ulp or so, the average gets the old weights back). Swapping twice does not always
        give the weights back exactly.

        Parameters
        ----------
        var_list : list of ndarray
            Variables the optimizer was built with.

        Raises
        ------
        KeyError
            A variable unknown to the optimizer (then nothing changes).
        """
        inner = self.inner_optimizer
        positions = [inner._position(v) for v in var_list]
        averages = self._averages_built()
        with np.errstate(all="ignore"):
            for i in positions:
                a, b = _host(averages[i]), _host(inner._vars[i])  # TF-Addons' order
                a = a + b
                b = a - b
                a = a - b
                _put(averages[i], a)
                _put(inner._vars[i], b)
        _foreign.touched(inner, positions)


class SWA(_AveragedWrapper):
    r"""TF-Addons' ``SWA(optimizer, start_averaging, average_period)``: stochastic weight
    averaging, an equal-weight running mean of snapshots, under ``"keras2"``.

    Parameters
    ----------
    optimizer : refopt.Optimizer or dict
        The optimizer that steps, under ``convention="keras2"`` (as :class:`MovingAverage`).
    start_averaging : int, default 0
        The pre-increment ``iterations`` of the first snapshot, >= 0.
    average_period : int, default 10
        Steps between snapshots, >= 1.
    name : str, default "SWA"
    convention, backend, clipnorm, clipvalue, global_clipnorm : optional
        As :class:`MovingAverage`.

    Raises
    ------
    TypeError
        As :class:`MovingAverage`.
    ValueError
        The inner convention is not ``"keras2"``; inner clipping; ``start_averaging`` < 0 or
        ``average_period`` < 1 (TF-Addons' checks), or not integers; a variable that is not
        float32 (TF-Addons' ``SWA`` multiplies the average by a float32 count, which TF
        refuses for float64 and float16 variables: ``TypeError`` at the first step there).

    Notes
    -----
    With ``t`` the pre-increment ``iterations``, ``m = start_averaging``, ``k =
    average_period`` and ``n = max(0, (t - m) // k)`` (int64)::

        if t >= m and t == m + n*k:                      # a snapshot
            avg <- (avg * float32(n) + w_new) / (float32(n) + 1)    # float32, 3 roundings

    The average starts at zeros (the first snapshot makes it ``w``, as ``0*0 + w``), so
    before ``m`` it is zero. The snapshot after ``n`` earlier ones weighs them as ``n``
    equal models. Compare torch's ``AveragedModel`` (``use_ema=True, ema_momentum=None``
    under ``"torch"``), ``avg + (w - avg)/(n + 1)``, which rounds differently.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 2.0], np.float32)
    >>> opt = refopt.SWA(refopt.SGD(learning_rate=0.1, convention="keras2"),
    ...                  start_averaging=1, average_period=2)
    >>> for _ in range(4):
    ...     _ = opt.apply_gradients([(np.float32([1.0, -1.0]), w)])
    >>> opt.get_slot(w, "average").tolist()     # snapshots at steps 2 and 4, TF-Addons 0.23's
    [0.6999999284744263, 2.299999713897705]
    """

    _tfa_name = "tfa.optimizers.SWA"

    def __init__(self, optimizer, start_averaging=0, average_period=10, name="SWA",
                 convention=None, backend=None, clipnorm=None, clipvalue=None,
                 global_clipnorm=None):
        if isinstance(average_period, numbers.Integral) and not isinstance(
                average_period, (bool, np.bool_)) and average_period < 1:
            raise ValueError(f"average_period must be >= 1. Received: "
                             f"average_period={average_period!r}")
        average_period = _check_int("average_period", average_period, 1)
        start_averaging = _check_int("start_averaging", start_averaging, 0)
        self._init_inner(optimizer, name, convention, backend,
                         {"clipnorm": clipnorm, "clipvalue": clipvalue,
                          "global_clipnorm": global_clipnorm})
        self.start_averaging = start_averaging
        self.average_period = average_period

    def _own_config(self):
        return {"start_averaging": self.start_averaging, "average_period": self.average_period,
                **self._clip_config()}

    def _check_dtypes(self, dtypes):
        for j, dtype in enumerate(dtypes):
            if dtype is not None and np.dtype(dtype) != np.float32:
                raise ValueError(
                    "SWA takes float32 variables only: TF-Addons' SWA multiplies the average "
                    "by a float32 snapshot count, which TF refuses for other dtypes (TypeError "
                    f"in Mul). Received: a {dtype} variable at position {j}")

    def snapshots(self, step=None):
        """``(is_snapshot, n)`` at pre-increment ``iterations`` ``step`` (default: the
        current ``iterations``, i.e. the next step's): whether that step takes a snapshot
        and how many came before it."""
        t = self.iterations if step is None else int(step)
        m, k = self.start_averaging, self.average_period
        n = max(0, (t - m) // k)
        return (t >= m and t == m + n * k), n

    def _initial_average(self, value):
        return np.zeros_like(value)  # AveragedOptimizerWrapper's add_slot(var, "average")

    def _average(self, avg, w, step):
        take, n = self.snapshots(step)
        if not take:
            return None
        nf = _F32(n)
        return (avg * nf + w) / (nf + _F32(1))

