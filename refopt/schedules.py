r"""Learning-rate schedules with the tf-keras formulas, evaluated in float32.

The six schedules of ``tf_keras/optimizers/schedules/learning_rate_schedule.py`` (tf-keras 2.11+,
the semantics this project follows) with the same constructor arguments, the same ``get_config``
keys and the same order of floating-point operations. Where Keras 3
(``keras/src/optimizers/schedules/learning_rate_schedule.py``) differs, the class docstring says so.

A schedule is a callable ``schedule(step) -> numpy.float32``. ``step`` is the optimizer's
``iterations`` counter *before* the current update is counted (0 on the first update), exactly the
value Keras passes to a schedule.

Numerics
--------
Keras computes a schedule in the dtype of ``initial_learning_rate`` converted to a tensor; a Python
float becomes ``float32``. Every schedule here therefore:

* rounds each hyperparameter once to float32 (``tf.cast`` of a Python number), and the integer
  ``step`` once to float32 (``tf.cast(int64 -> float32)``, round to nearest even, so steps above
  :math:`2^{24}` lose integer precision exactly as in Keras);
* does every ``+ - * /``, ``floor``, ``ceil`` and ``min`` in float32, in the order Keras does them,
  so these steps are bit-identical to TensorFlow's;
* evaluates the transcendental functions with the C library's float32 ``powf``, ``cosf`` and
  ``logf`` (:mod:`refopt._libm`), which is what TensorFlow's CPU kernels call on these scalars
  (where the C library cannot be loaded, the correctly rounded value is used instead, which can
  differ from TensorFlow by one ulp);
* flushes float32 subnormal results of ``pow`` and of the schedule to zero, as TensorFlow's CPU
  kernels do (``ExponentialDecay`` far out in its tail returns 0.0, not a subnormal).

Checked against tf-keras 2.21 and Keras 3.15 (TensorFlow 2.21 CPU with glibc, eager, int64
step): with the C library's functions, bit-identical in every one of 120 random schedules at
steps 0-199; with correctly rounded float64 functions instead, 4 of 20,000 random draws differed
by one ulp.

Inside a ``tf.function`` (how ``model.fit`` runs the optimizer) TensorFlow's graph optimizer
(Grappler constant folding) rewrites ``step / decay_steps`` into ``step * (1 / decay_steps)``,
which is not always the same float32 number: ``PolynomialDecay(0.4809, 318, 0.26996,
power=0.4145)`` at ``step >= 318`` gives ``end_learning_rate`` eagerly and here, but
``end + (lr0 - end) * (2**-24) ** power`` (about 0.08% higher) in graph mode, because
``318 * f32(1/318) = 1 - 2**-24``. This module follows the eager, op-by-op semantics.

Examples
--------
>>> from refopt.schedules import ExponentialDecay, serialize, deserialize
>>> schedule = ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
>>> schedule(10)
np.float32(0.05)
>>> deserialize(serialize(schedule))(10)
np.float32(0.05)
"""

from __future__ import annotations

import abc
import bisect
import math
import numbers

import numpy as np

from refopt import _libm

__all__ = [
    "LearningRateSchedule",
    "ExponentialDecay",
    "PiecewiseConstantDecay",
    "PolynomialDecay",
    "InverseTimeDecay",
    "CosineDecay",
    "CosineDecayRestarts",
    "serialize",
    "deserialize",
]

_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_HALF = _F32(0.5)
_PI = _F32(math.pi)  # tf.constant(math.pi, dtype=float32)
_TINY = np.finfo(np.float32).tiny  # smallest normal float32; TF's CPU kernels flush below it
_INT64_MAX = int(np.iinfo(np.int64).max)  # the optimizer's `iterations` is an int64 variable


# --------------------------------------------------------------------------------------------
# Argument checks (messages follow the Keras style: name the argument, show the value received)
# --------------------------------------------------------------------------------------------


def _check_real(name, value):
    """Return ``value`` unchanged if it is a real number (not a bool), else raise TypeError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"Argument `{name}` must be a real number. "
            f"Received: {name}={value!r} of type {type(value).__name__}"
        )
    return value


def _finite_in_f32(value):
    with np.errstate(over="ignore"):  # 1e39 rounds to inf in float32: report it, do not warn
        return bool(np.isfinite(_F32(value)))


def _check_finite(name, value):
    """Check that ``value`` is a real number that stays finite when rounded to float32."""
    _check_real(name, value)
    if not _finite_in_f32(value):
        raise ValueError(f"Argument `{name}` must be finite in float32. Received: {name}={value}")
    return value


def _check_learning_rate(name, value):
    """Check a learning-rate hyperparameter: finite in float32 and >= 0."""
    _check_real(name, value)
    if not (_finite_in_f32(value) and value >= 0):
        raise ValueError(
            f"Argument `{name}` must be a finite number >= 0. Received: {name}={value}"
        )
    return value


_LAX_STEPS = ("tf_keras", "keras2")  # frameworks whose schedules take decay_steps <= 0


def _check_convention(convention):
    """``None`` (refopt's checks, Keras 3's) or a convention name whose schedules differ."""
    if convention is None:
        return None
    from refopt.conventions import PRESETS

    if not isinstance(convention, str) or convention not in PRESETS:
        raise ValueError(
            f"Argument `convention` must be None or one of {sorted(PRESETS)}. "
            f"Received: convention={convention!r}")
    return convention


def _check_positive(name, value, convention=None):
    """Check a step-count hyperparameter (``decay_steps``): > 0 and finite in float32.

    Under ``convention="tf_keras"`` or ``"keras2"`` (whose schedules have no such check) any
    finite value is taken; one <= 0 with a warning (the rate becomes NaN or inf, as there).
    """
    _check_real(name, value)
    if convention in _LAX_STEPS and _finite_in_f32(value) and not value > 0:
        import warnings

        warnings.warn(
            f"Argument `{name}`={value} under convention={convention!r}: accepted as that "
            "framework does; the schedule divides by it, so its rate is NaN or inf at most "
            "steps (Keras 3 refuses it).", UserWarning, stacklevel=3)
        return value
    if not value > 0 or _F32(value) == 0:  # also catches NaN and values that underflow float32
        raise ValueError(f"Argument `{name}` must be > 0. Received: {name}={value}")
    return _check_finite(name, value)


def _check_bool(name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"Argument `{name}` must be a bool. "
            f"Received: {name}={value!r} of type {type(value).__name__}"
        )
    return bool(value)


def _check_name(name, default):
    """``None`` (the tf-keras default) becomes the Keras 3 default string."""
    if name is None:
        return default
    if not isinstance(name, str):
        raise TypeError(
            f"Argument `name` must be a str or None. "
            f"Received: name={name!r} of type {type(name).__name__}"
        )
    return name


def _validate_step(step):
    """Return ``step`` as a Python int in ``[-2**63, 2**63 - 1]``, or a finite Python float
    where it is not a whole number.

    Accepts Python and NumPy integers, finite floats and 0-d arrays of these. Keras evaluates
    a schedule at any step, negative and fractional ones included (issue 12 item 6), and so
    do these schedules; an optimizer only ever passes its ``iterations`` (>= 0).
    """
    if isinstance(step, np.ndarray):
        if step.ndim != 0:
            raise ValueError(
                f"Argument `step` must be a scalar. Received: step with shape {step.shape}"
            )
        step = step[()]
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Real):
        raise TypeError(
            "Argument `step` must be an integer. "
            f"Received: step={step!r} of type {type(step).__name__}"
        )
    if isinstance(step, numbers.Integral):
        k = int(step)
    else:
        x = float(step)
        if not math.isfinite(x):
            raise ValueError(f"Argument `step` must be finite. Received: step={step}")
        if x != math.floor(x):
            return x  # fractional: cast to float32 as Keras casts a float step
        k = int(x)
    if not -_INT64_MAX - 1 <= k <= _INT64_MAX:
        raise ValueError(
            "Argument `step` must fit in an int64 (the optimizer's `iterations`). "
            f"Received: step={step}"
        )
    return k


def _step_to_f32(k):
    """``tf.cast(step, float32)`` of the int64 counter: one correct rounding, no double rounding
    (a fractional float step: its own rounding to float32)."""
    if isinstance(k, float):
        return _F32(k)
    return np.int64(k).astype(np.float32)


# --------------------------------------------------------------------------------------------
# float32 transcendental functions as TensorFlow calls them (see the module docstring)
# --------------------------------------------------------------------------------------------


def _ftz(x):
    """Flush a float32 subnormal to (signed) zero, as TensorFlow's CPU kernels do."""
    return x * _ZERO if abs(x) < _TINY else x


def _pow32(x, y):
    return _ftz(_libm.powf(x, y))


def _cos32(x):
    return _libm.cosf(x)


def _log32(x):
    return _libm.logf(x)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------


class LearningRateSchedule(abc.ABC):
    """Base class of the learning-rate schedules: a serializable callable ``step -> float32``.

    Subclasses implement ``__call__(step)`` and ``get_config()``; ``from_config`` rebuilds an
    instance from the ``get_config()`` dict. Follows the base class of
    ``tf_keras/optimizers/schedules/learning_rate_schedule.py``.

    Notes
    -----
    Every built-in schedule validates ``step`` the same way: a Python or NumPy integer (or a float
    with an integral value, or a 0-d array of one) in ``[0, 2**63 - 1]``; anything else raises.
    Keras accepts any tensor, including negative and fractional steps.
    """

    @abc.abstractmethod
    def __call__(self, step):
        """Return the learning rate for ``step``.

        Parameters
        ----------
        step : int
            The optimizer's pre-increment ``iterations`` counter (>= 0).

        Returns
        -------
        numpy.float32
            The learning rate.

        Raises
        ------
        TypeError
            If ``step`` is not a number.
        ValueError
            If ``step`` is negative, not a whole number, or beyond int64.
        """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None and not getattr(call, "_quiet", False):
            def __call__(self, step):  # Keras' steps < 0 and decay_steps=0 divide by zero
                with np.errstate(all="ignore"):
                    return call(self, step)

            __call__._quiet = True
            __call__.__doc__ = call.__doc__
            cls.__call__ = __call__
        own = cls.__dict__.get("get_config")
        if own is None or getattr(own, "_adds_convention", False):
            return

        def get_config(self):  # the convention a schedule was built under, when one was
            config = own(self)
            if getattr(self, "convention", None) is not None:
                config = dict(config, convention=self.convention)
            return config

        get_config._adds_convention = True
        get_config.__doc__ = own.__doc__
        cls.get_config = get_config

    @abc.abstractmethod
    def get_config(self):
        """Return the constructor arguments as a dict (``cls(**config)`` rebuilds the schedule).

        Returns
        -------
        dict
            The hyperparameters as they were passed (not rounded to float32) and ``name``.
        """

    @classmethod
    def from_config(cls, config):
        """Instantiate a schedule from the output of :meth:`get_config`.

        Parameters
        ----------
        config : dict
            Keyword arguments of the constructor.

        Returns
        -------
        LearningRateSchedule
            ``cls(**config)``.

        Raises
        ------
        TypeError, ValueError
            As the constructor does for invalid arguments.
        """
        return cls(**config)

    def __repr__(self):
        args = ", ".join(f"{key}={value!r}" for key, value in self.get_config().items())
        return f"{type(self).__name__}({args})"


class ExponentialDecay(LearningRateSchedule):
    r"""Exponential decay: :math:`\eta_0 \cdot r^{s / D}`, optionally in whole steps of ``D``.

    Parameters
    ----------
    initial_learning_rate : float
        :math:`\eta_0`, the learning rate at step 0 (finite, >= 0).
    decay_steps : float
        :math:`D`, the number of optimizer steps over which the rate is multiplied by ``decay_rate``
        once (finite, > 0; usually an int).
    decay_rate : float
        :math:`r`, the factor per ``decay_steps`` steps (dimensionless, finite).
    staircase : bool
        If True, :math:`s / D` is floored, so the rate changes only every ``decay_steps`` steps.
    name : str or None
        Name stored in the config; ``None`` becomes ``"ExponentialDecay"``.

    Raises
    ------
    ValueError
        If ``decay_steps <= 0`` (Keras 3 message ``Argument `decay_steps` must be > 0. Received:
        decay_steps=0``), if ``initial_learning_rate`` is negative or not finite, or if a
        hyperparameter is not finite in float32.
    TypeError
        If a hyperparameter is not a real number, ``staircase`` is not a bool or ``name`` is not
        a str.

    Notes
    -----
    With :math:`s` the step, every quantity rounded to float32 and each operation in float32:

    .. math::

        p = s / D \quad(\text{then } p \leftarrow \lfloor p \rfloor \text{ if staircase}), \qquad
        \eta(s) = \eta_0 \cdot r^{p}.

    Follows ``ExponentialDecay`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py``.
    tf-keras has ``name=None`` and no check of ``decay_steps`` (0 gives ``inf``/``NaN``); Keras 3
    adds the ``decay_steps > 0`` check and the string default name, both used here. The formula is
    the same in both.

    Examples
    --------
    >>> ExponentialDecay(0.1, 10, 0.5)(20)
    np.float32(0.025)
    >>> ExponentialDecay(0.1, 10, 0.5, staircase=True)(19)
    np.float32(0.05)
    """

    def __init__(
        self,
        initial_learning_rate,
        decay_steps,
        decay_rate,
        staircase=False,
        name="ExponentialDecay",
        *,
        convention=None,
    ):
        self.initial_learning_rate = _check_learning_rate(
            "initial_learning_rate", initial_learning_rate
        )
        self.convention = _check_convention(convention)
        self.decay_steps = _check_positive("decay_steps", decay_steps, self.convention)
        self.decay_rate = _check_finite("decay_rate", decay_rate)
        self.staircase = _check_bool("staircase", staircase)
        self.name = _check_name(name, "ExponentialDecay")
        self._lr0 = _F32(initial_learning_rate)
        self._decay_steps = _F32(decay_steps)
        self._decay_rate = _F32(decay_rate)

    def __call__(self, step):
        s = _step_to_f32(_validate_step(step))
        p = s / self._decay_steps
        if self.staircase:
            p = np.floor(p)
        return _ftz(self._lr0 * _pow32(self._decay_rate, p))

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "name": self.name,
        }


def _boundary_to_int(index, b):
    """The boundary as Keras compares it with the integer step.

    tf-keras converts the boundary to a tensor (a Python float becomes float32, a NumPy float keeps
    its dtype) and casts it to the step's integer dtype, which truncates toward zero.
    """
    _check_finite(f"boundaries[{index}]", b)
    if isinstance(b, numbers.Integral):
        return int(b)
    if isinstance(b, float):  # a Python float is converted to float32 first
        return math.trunc(float(_F32(b)))
    return math.trunc(float(b))


class PiecewiseConstantDecay(LearningRateSchedule):
    r"""Piecewise constant learning rate on right-closed intervals of the step.

    Parameters
    ----------
    boundaries : sequence of int or float
        :math:`b_0 < b_1 < \dots < b_{n-1}`, in optimizer steps, strictly increasing, finite,
        at least one. Float boundaries are truncated toward zero (see Notes).
    values : sequence of float
        :math:`v_0, \dots, v_n`, the learning rate on each interval; ``len(values)`` must be
        ``len(boundaries) + 1``. ``inf`` and ``NaN`` are allowed and only affect their own interval.
    name : str or None
        Name stored in the config; ``None`` becomes ``"PiecewiseConstant"``.

    Raises
    ------
    ValueError
        If ``len(values) != len(boundaries) + 1`` (Keras message: "The length of boundaries should
        be 1 less than the length of values. ..."), if ``boundaries`` is empty, not strictly
        increasing or has a non-finite entry.
    TypeError
        If ``boundaries`` or ``values`` is not a sequence of real numbers.

    Notes
    -----
    .. math::

        \eta(s) = \begin{cases}
            v_0 & s \le b_0 \\
            v_i & b_{i-1} < s \le b_i \\
            v_n & s > b_{n-1}
        \end{cases}

    The intervals are closed on the right: with ``boundaries=[10, 20]`` steps 0..10 give
    ``values[0]``, 11..20 give ``values[1]`` and 21.. give ``values[2]``. Inside an optimizer with
    ``boundaries=[1]`` the first two updates (steps 0 and 1) use ``values[0]``.

    Keras casts the boundaries to the dtype of the step; the step is the int64 ``iterations``
    counter, so a float boundary is truncated toward zero (a Python float after rounding to float32
    first, as ``tf.convert_to_tensor`` does). For integral steps this gives the same intervals as
    comparing with the untruncated boundaries whenever they are >= 0.

    The value is returned as ``numpy.float32``; tf-keras returns the values' own dtype.

    Follows ``PiecewiseConstantDecay`` in
    ``tf_keras/optimizers/schedules/learning_rate_schedule.py``, which *selects* the value with
    ``tf.case``. Keras 3 instead computes
    :math:`\sum_i [\text{step in interval } i] \cdot v_i`, so an infinite value poisons the other
    intervals with ``0 * inf = NaN`` (``values=[1, inf]`` gives ``NaN`` at step 0 in Keras 3, 1.0
    here and in tf-keras). Keras documents but does not check that the boundaries increase (with
    unsorted boundaries tf-keras' exclusive ``tf.case`` fails at run time); this class checks it.

    Examples
    --------
    >>> schedule = PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1])
    >>> [float(schedule(s)) for s in (10, 11, 20, 21)]
    [1.0, 0.5, 0.5, 0.10000000149011612]
    """

    def __init__(self, boundaries, values, name="PiecewiseConstant"):
        for arg_name, arg in (("boundaries", boundaries), ("values", values)):
            if isinstance(arg, (str, bytes)) or not hasattr(arg, "__len__"):
                raise TypeError(
                    f"Argument `{arg_name}` must be a list of numbers. "
                    f"Received: {arg_name}={arg!r} of type {type(arg).__name__}"
                )
        if len(boundaries) != len(values) - 1:
            raise ValueError(
                "The length of boundaries should be 1 less than the length of values. "
                f"Received: boundaries={boundaries} of length {len(boundaries)}, "
                f"and values={values} of length {len(values)}."
            )
        if len(boundaries) == 0:
            raise ValueError("Argument `boundaries` must not be empty. Received: boundaries=[]")
        self._boundaries = [_boundary_to_int(i, b) for i, b in enumerate(boundaries)]
        if any(not b0 < b1 for b0, b1 in zip(boundaries[:-1], boundaries[1:], strict=True)):
            raise ValueError(
                "Argument `boundaries` must be strictly increasing. "
                f"Received: boundaries={boundaries}"
            )
        self._values = [_F32(_check_real(f"values[{i}]", v)) for i, v in enumerate(values)]
        self.boundaries = list(boundaries)
        self.values = list(values)
        self.name = _check_name(name, "PiecewiseConstant")

    def __call__(self, step):
        k = _validate_step(step)
        # Number of boundaries strictly below k = index of the right-closed interval holding k.
        return self._values[bisect.bisect_left(self._boundaries, k)]

    def get_config(self):
        return {
            "boundaries": list(self.boundaries),
            "values": list(self.values),
            "name": self.name,
        }


class PolynomialDecay(LearningRateSchedule):
    r"""Polynomial decay from ``initial_learning_rate`` to ``end_learning_rate`` in ``decay_steps``.

    Parameters
    ----------
    initial_learning_rate : float
        :math:`\eta_0`, the learning rate at step 0 (finite, >= 0).
    decay_steps : float
        :math:`D`, the number of optimizer steps of one decay (finite, > 0; usually an int).
    end_learning_rate : float
        :math:`\eta_e`, the learning rate reached at step :math:`D` (finite). It is *not* checked to
        be below :math:`\eta_0` (keras-team/keras#18747): a larger value makes the schedule
        increase.
    power : float
        :math:`k`, the exponent of the polynomial (dimensionless, finite).
    cycle : bool
        If True, restart the decay at every multiple of ``decay_steps`` (see Notes).
    name : str or None
        Name stored in the config; ``None`` becomes ``"PolynomialDecay"``.

    Raises
    ------
    ValueError
        If ``decay_steps <= 0``, if ``initial_learning_rate`` is negative or not finite, or if a
        hyperparameter is not finite in float32.
    TypeError
        If a hyperparameter is not a real number, ``cycle`` is not a bool or ``name`` is not a str.

    Notes
    -----
    Each operation in float32:

    .. math::

        \text{no cycle: } s' = \min(s, D),\ D' = D; \qquad
        \text{cycle: } s' = s,\ D' = D \cdot \begin{cases} 1 & s = 0 \\
            \lceil s / D \rceil & s > 0 \end{cases}

        p = s' / D', \qquad \eta(s) = (\eta_0 - \eta_e)\,(1 - p)^{k} + \eta_e.

    With ``cycle=True`` a new cycle does *not* start at :math:`\eta_0`: the step just after a
    multiple of :math:`D` is measured against the next, longer multiple (e.g. ``(0.1, 10, 0.01)`` at
    step 11 gives 0.0505, not 0.091).

    Follows ``PolynomialDecay`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py``;
    Keras 3 has the same formula and adds the ``decay_steps > 0`` check (used here) and the string
    default name.

    Examples
    --------
    >>> PolynomialDecay(0.1, 10, 0.01, power=2.0)(5)
    np.float32(0.0325)
    """

    def __init__(
        self,
        initial_learning_rate,
        decay_steps,
        end_learning_rate=0.0001,
        power=1.0,
        cycle=False,
        name="PolynomialDecay",
        *,
        convention=None,
    ):
        self.initial_learning_rate = _check_learning_rate(
            "initial_learning_rate", initial_learning_rate
        )
        self.convention = _check_convention(convention)
        self.decay_steps = _check_positive("decay_steps", decay_steps, self.convention)
        self.end_learning_rate = _check_finite("end_learning_rate", end_learning_rate)
        self.power = _check_finite("power", power)
        self.cycle = _check_bool("cycle", cycle)
        self.name = _check_name(name, "PolynomialDecay")
        self._lr0 = _F32(initial_learning_rate)
        self._decay_steps = _F32(decay_steps)
        self._end = _F32(end_learning_rate)
        self._power = _F32(power)

    def __call__(self, step):
        s = _step_to_f32(_validate_step(step))
        decay_steps = self._decay_steps
        if self.cycle:
            multiplier = _ONE if s == _ZERO else np.ceil(s / decay_steps)
            decay_steps = decay_steps * multiplier
        else:
            s = min(s, decay_steps)
        p = s / decay_steps
        return _ftz((self._lr0 - self._end) * _pow32(_ONE - p, self._power) + self._end)

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "end_learning_rate": self.end_learning_rate,
            "power": self.power,
            "cycle": self.cycle,
            "name": self.name,
        }


class InverseTimeDecay(LearningRateSchedule):
    r"""Inverse time decay :math:`\eta_0 / (1 + r \cdot s / D)`, optionally in whole steps of D.

    Parameters
    ----------
    initial_learning_rate : float
        :math:`\eta_0`, the learning rate at step 0 (finite, >= 0).
    decay_steps : float
        :math:`D`, in optimizer steps (finite, > 0; Keras' own example uses ``1.0``).
    decay_rate : float
        :math:`r`, dimensionless (finite).
    staircase : bool
        If True, :math:`s / D` is floored.
    name : str or None
        Name stored in the config; ``None`` becomes ``"InverseTimeDecay"``.

    Raises
    ------
    ValueError
        If ``decay_steps <= 0``, if ``initial_learning_rate`` is negative or not finite, or if a
        hyperparameter is not finite in float32.
    TypeError
        If a hyperparameter is not a real number, ``staircase`` is not a bool or ``name`` is not
        a str.

    Notes
    -----
    Each operation in float32:

    .. math::

        p = s / D \quad(\lfloor p \rfloor \text{ if staircase}), \qquad
        \eta(s) = \frac{\eta_0}{1 + r\,p}.

    Follows ``InverseTimeDecay`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py``;
    Keras 3 has the same formula and adds the ``decay_steps > 0`` check (used here) and the string
    default name.

    Examples
    --------
    >>> InverseTimeDecay(0.1, 10, 0.5)(5)
    np.float32(0.08)
    """

    def __init__(
        self,
        initial_learning_rate,
        decay_steps,
        decay_rate,
        staircase=False,
        name="InverseTimeDecay",
        *,
        convention=None,
    ):
        self.initial_learning_rate = _check_learning_rate(
            "initial_learning_rate", initial_learning_rate
        )
        self.convention = _check_convention(convention)
        self.decay_steps = _check_positive("decay_steps", decay_steps, self.convention)
        self.decay_rate = _check_finite("decay_rate", decay_rate)
        self.staircase = _check_bool("staircase", staircase)
        self.name = _check_name(name, "InverseTimeDecay")
        self._lr0 = _F32(initial_learning_rate)
        self._decay_steps = _F32(decay_steps)
        self._decay_rate = _F32(decay_rate)

    def __call__(self, step):
        s = _step_to_f32(_validate_step(step))
        p = s / self._decay_steps
        if self.staircase:
            p = np.floor(p)
        return _ftz(self._lr0 / (_ONE + self._decay_rate * p))

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "staircase": self.staircase,
            "name": self.name,
        }


class CosineDecay(LearningRateSchedule):
    r"""Cosine decay to ``alpha`` times its start value, with an optional linear warmup.

    Parameters
    ----------
    initial_learning_rate : float
        :math:`\eta_0`, the learning rate at step 0 (finite, >= 0).
    decay_steps : float
        :math:`D`, the length of the cosine decay in optimizer steps (finite, > 0).
    alpha : float
        :math:`\alpha`, the final learning rate as a *fraction* of the decay's start value
        (dimensionless, finite). The schedule ends at :math:`\alpha\eta_0` (or :math:`\alpha W`),
        not at :math:`\alpha` (keras-team/keras#21772: the docs used to say "to alpha").
    name : str or None
        Name stored in the config; ``None`` becomes ``"CosineDecay"``.
    warmup_target : float or None
        :math:`W`, the learning rate reached at the end of the warmup (finite). ``None`` disables
        the warmup. Not checked to be above :math:`\eta_0` (keras-team/keras#18747).
    warmup_steps : float
        :math:`T`, the warmup length in optimizer steps (finite, >= 0). Only used when
        ``warmup_target`` is given.

    Raises
    ------
    ValueError
        If ``decay_steps <= 0``, ``warmup_steps < 0``, if ``initial_learning_rate`` is negative or
        not finite, or if a hyperparameter is not finite in float32.
    TypeError
        If a hyperparameter is not a real number or ``name`` is not a str.

    Notes
    -----
    The decay from a start value :math:`a`, each operation in float32:

    .. math::

        d(u, a) = a\left((1-\alpha)\cdot\tfrac12\left(1 + \cos(\pi u / D)\right) + \alpha\right).

    Without a warmup target, :math:`\eta(s) = d(\min(s, D), \eta_0)`. With one, let
    :math:`s' = \min(s, D + T)`:

    .. math::

        \eta(s) = \begin{cases}
            (W - \eta_0)\cdot(s' / T) + \eta_0 & s' < T \\
            d(s' - T, W) & \text{otherwise.}
        \end{cases}

    So with ``warmup_steps=0`` the schedule starts at :math:`W`, not at :math:`\eta_0`.

    Rounding detail: :math:`1-\alpha` is computed in float64 from the Python number and rounded
    once to float32 (tf-keras multiplies the float32 tensor by the Python expression
    ``1 - alpha``), while :class:`CosineDecayRestarts` rounds :math:`\alpha` first and subtracts
    in float32.

    Follows ``CosineDecay`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py``. Keras 3
    has the same formula and adds the ``decay_steps > 0`` check and the string default name; its
    docstring's warmup pseudo-code omits the final ``+ initial_learning_rate`` that both codes have.
    Keras with an *int* ``initial_learning_rate`` (e.g. ``0``) computes in int32; here always in
    float32.

    Examples
    --------
    >>> CosineDecay(0.1, 10, alpha=0.1)(5)  # float32(pi) / 2 is just above pi / 2
    np.float32(0.054999996)
    >>> CosineDecay(0.0, 10, alpha=0.1, warmup_target=0.2, warmup_steps=4)(2)
    np.float32(0.1)
    """

    def __init__(
        self,
        initial_learning_rate,
        decay_steps,
        alpha=0.0,
        name="CosineDecay",
        warmup_target=None,
        warmup_steps=0,
        *,
        convention=None,
    ):
        self.initial_learning_rate = _check_learning_rate(
            "initial_learning_rate", initial_learning_rate
        )
        self.convention = _check_convention(convention)
        self.decay_steps = _check_positive("decay_steps", decay_steps, self.convention)
        self.alpha = _check_finite("alpha", alpha)
        self.name = _check_name(name, "CosineDecay")
        self.warmup_target = (
            None if warmup_target is None else _check_finite("warmup_target", warmup_target)
        )
        self.warmup_steps = _check_finite("warmup_steps", warmup_steps)
        if warmup_steps < 0:
            raise ValueError(
                f"Argument `warmup_steps` must be >= 0. Received: warmup_steps={warmup_steps}"
            )
        self._lr0 = _F32(initial_learning_rate)
        self._decay_steps = _F32(decay_steps)
        self._one_minus_alpha = _F32(1.0 - float(alpha))
        self._alpha = _F32(alpha)
        self._warmup_steps = _F32(warmup_steps)
        self._warmup_target = None if warmup_target is None else _F32(warmup_target)

    def _decay(self, u, start):
        fraction = u / self._decay_steps
        cosine = _HALF * (_ONE + _cos32(_PI * fraction))
        return _ftz(start * (self._one_minus_alpha * cosine + self._alpha))

    def __call__(self, step):
        s = _step_to_f32(_validate_step(step))
        if self._warmup_target is None:
            return self._decay(min(s, self._decay_steps), self._lr0)
        s = min(s, self._decay_steps + self._warmup_steps)
        if s < self._warmup_steps:
            fraction = s / self._warmup_steps
            return _ftz((self._warmup_target - self._lr0) * fraction + self._lr0)
        return self._decay(s - self._warmup_steps, self._warmup_target)

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay_steps": self.decay_steps,
            "alpha": self.alpha,
            "name": self.name,
            "warmup_target": self.warmup_target,
            "warmup_steps": self.warmup_steps,
        }


class CosineDecayRestarts(LearningRateSchedule):
    r"""Cosine decay with warm restarts (SGDR, Loshchilov & Hutter 2017).

    Parameters
    ----------
    initial_learning_rate : float
        :math:`\eta_0`, the learning rate at step 0 (finite, >= 0).
    first_decay_steps : float
        :math:`F`, the length of the first period in optimizer steps (finite, > 0).
    t_mul : float
        :math:`t`, each period is ``t_mul`` times longer than the previous one (finite; > 0 for a
        meaningful schedule: with :math:`t < 1` the periods sum to :math:`F/(1-t)` and the
        schedule becomes ``NaN`` after that, as in Keras).
    m_mul : float
        :math:`m`, each period starts at ``m_mul`` times the previous period's start (finite).
    alpha : float
        :math:`\alpha`, the floor of every period as a fraction of :math:`\eta_0` (finite).
    name : str or None
        Name stored in the config; ``None`` becomes ``"SGDRDecay"``.

    Raises
    ------
    ValueError
        If ``first_decay_steps <= 0`` (``Argument `first_decay_steps` must be > 0. Received:
        first_decay_steps=0``), if ``initial_learning_rate`` is negative or not finite, or if a
        hyperparameter is not finite in float32.
    TypeError
        If a hyperparameter is not a real number or ``name`` is not a str.

    Notes
    -----
    With :math:`f = s / F`, the restart index :math:`i` and the fraction :math:`f'` of period
    :math:`i` are, each operation in float32,

    .. math::

        t = 1:&\quad i = \lfloor f \rfloor,\quad f' = f - i \\
        t \ne 1:&\quad i = \left\lfloor \frac{\log(1 - f(1 - t))}{\log t} \right\rfloor,\quad
            f' = \left(f - \frac{1 - t^i}{1 - t}\right) / t^i

    and

    .. math::

        \eta(s) = \eta_0\left((1 - \alpha)\cdot\left(\tfrac12\, m^i\right)
            \left(1 + \cos(\pi f')\right) + \alpha\right).

    The floor :math:`\alpha\eta_0` is *not* scaled by :math:`m^i`. The branch on :math:`t = 1`
    compares ``t_mul`` after rounding to float32.

    At an exact restart step the float32 logarithms decide the index, and they can land one
    period early: the step then gets the previous period's last value (:math:`\alpha\eta_0`)
    instead of the new period's first. Keras does the same: with :math:`F = 1`, :math:`t = 2`,
    step :math:`8191 = 2^{13} - 1` gives :math:`\alpha\eta_0` in TensorFlow 2.21 and here, and about
    one exact restart step in nine does so for :math:`t = 2`, :math:`F < 120`. Because TensorFlow's
    float32 ``log`` is not correctly rounded, the side chosen differs from TensorFlow's at about
    0.3% of exact restart steps (e.g. :math:`F = 41`, :math:`t = 3`, step 533: a restart here, the
    end of the previous period in TensorFlow). Away from restart steps, 4,000 random draws agreed
    with TensorFlow bit for bit.

    Follows ``CosineDecayRestarts`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py``.
    Keras 3 has the same formula, adds the ``first_decay_steps > 0`` check and the string default
    name, and casts the logarithm's argument to the compute dtype (a no-op for float32 on the
    TensorFlow backend). ``get_config`` keys are ``t_mul`` and ``m_mul`` in both.

    Examples
    --------
    >>> schedule = CosineDecayRestarts(0.1, 10, t_mul=2.0, m_mul=0.5, alpha=0.1)
    >>> schedule(5), schedule(10), schedule(30)
    (np.float32(0.054999996), np.float32(0.055000003), np.float32(0.0325))
    """

    def __init__(
        self,
        initial_learning_rate,
        first_decay_steps,
        t_mul=2.0,
        m_mul=1.0,
        alpha=0.0,
        name="SGDRDecay",
        *,
        convention=None,
    ):
        self.initial_learning_rate = _check_learning_rate(
            "initial_learning_rate", initial_learning_rate
        )
        self.convention = _check_convention(convention)
        self.first_decay_steps = _check_positive("first_decay_steps", first_decay_steps,
                                                 self.convention)
        self.t_mul = _check_finite("t_mul", t_mul)
        self.m_mul = _check_finite("m_mul", m_mul)
        self.alpha = _check_finite("alpha", alpha)
        self.name = _check_name(name, "SGDRDecay")
        self._lr0 = _F32(initial_learning_rate)
        self._first_decay_steps = _F32(first_decay_steps)
        self._t_mul = _F32(t_mul)
        self._m_mul = _F32(m_mul)
        self._alpha = _F32(alpha)

    def __call__(self, step):
        s = _step_to_f32(_validate_step(step))
        fraction = s / self._first_decay_steps
        t = self._t_mul
        if t == _ONE:
            restart = np.floor(fraction)
            fraction = fraction - restart
        else:
            restart = np.floor(_log32(_ONE - fraction * (_ONE - t)) / _log32(t))
            t_pow = _pow32(t, restart)
            completed = (_ONE - t_pow) / (_ONE - t)
            fraction = (fraction - completed) / t_pow
        cosine = _HALF * _pow32(self._m_mul, restart) * (_ONE + _cos32(_PI * fraction))
        return _ftz(self._lr0 * ((_ONE - self._alpha) * cosine + self._alpha))

    def get_config(self):
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "first_decay_steps": self.first_decay_steps,
            "t_mul": self.t_mul,
            "m_mul": self.m_mul,
            "alpha": self.alpha,
            "name": self.name,
        }


# --------------------------------------------------------------------------------------------
# Serialization
# --------------------------------------------------------------------------------------------

_SCHEDULES = {
    cls.__name__: cls
    for cls in (
        ExponentialDecay,
        PiecewiseConstantDecay,
        PolynomialDecay,
        InverseTimeDecay,
        CosineDecay,
        CosineDecayRestarts,
    )
}


def serialize(schedule):
    """Return a JSON-compatible dict describing ``schedule``.

    Parameters
    ----------
    schedule : LearningRateSchedule
        The schedule to describe.

    Returns
    -------
    dict
        ``{"class_name": <class name>, "config": schedule.get_config()}``.

    Raises
    ------
    TypeError
        If ``schedule`` is not a :class:`LearningRateSchedule`.

    Notes
    -----
    Keras' ``serialize`` (``tf_keras/optimizers/schedules/learning_rate_schedule.py``, through
    ``serialization_lib``) also writes ``"module"`` and ``"registered_name"``; :func:`deserialize`
    accepts and ignores those keys, so Keras dicts of the six built-in schedules load here.
    """
    if not isinstance(schedule, LearningRateSchedule):
        raise TypeError(
            "Argument `schedule` must be a LearningRateSchedule. "
            f"Received: schedule={schedule!r} of type {type(schedule).__name__}"
        )
    return {"class_name": type(schedule).__name__, "config": schedule.get_config()}


def deserialize(config, custom_objects=None):
    """Rebuild a schedule from the output of :func:`serialize`.

    Parameters
    ----------
    config : dict
        ``{"class_name": str, "config": dict}``; other keys are ignored.
    custom_objects : dict of str to type, optional
        Your own :class:`LearningRateSchedule` subclasses by class name, as in Keras.

    Returns
    -------
    LearningRateSchedule
        A new instance of the named class, built with ``from_config(config["config"])``.

    Raises
    ------
    ValueError
        If ``config`` is not such a dict or ``class_name`` is neither one of the six schedules
        nor in ``custom_objects``.
    TypeError, ValueError
        As the schedule's constructor does for invalid arguments.

    Notes
    -----
    Follows ``deserialize`` in ``tf_keras/optimizers/schedules/learning_rate_schedule.py`` for the
    built-in schedules and ``custom_objects``.
    """
    if not (
        isinstance(config, dict)
        and "class_name" in config
        and isinstance(config.get("config"), dict)
    ):
        raise ValueError(
            "Argument `config` must be a dict with keys 'class_name' and 'config' (a dict). "
            f"Received: config={config!r}"
        )
    class_name = config["class_name"]
    cls = (custom_objects or {}).get(class_name) or _SCHEDULES.get(class_name)
    if cls is None and isinstance(class_name, str) and class_name.startswith("Optax"):
        from refopt.optax_schedules import SCHEDULES as optax_schedules  # optax's (issue 12)

        cls = optax_schedules.get(class_name)
    if cls is None:
        raise ValueError(
            f"Unknown learning rate schedule: class_name={class_name!r}. "
            f"Known schedules: {', '.join(sorted(_SCHEDULES))}"
        )
    return cls.from_config(config["config"])
