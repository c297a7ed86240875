r"""optax's learning-rate schedules, with optax's float32 numerics under ``jax.jit``.

The nine schedules of ``optax/schedules/_schedule.py`` and ``optax/schedules/_join.py``
(optax 0.2.8), under optax's function names and keywords: :func:`constant_schedule`,
:func:`linear_schedule`, :func:`polynomial_schedule`, :func:`exponential_decay`,
:func:`cosine_decay_schedule`, :func:`warmup_cosine_decay_schedule`,
:func:`warmup_exponential_decay_schedule`, :func:`piecewise_constant_schedule` and
:func:`join_schedules`. Each returns a :class:`refopt.schedules.LearningRateSchedule`, so it is
usable as ``learning_rate=`` of every refopt optimizer (whatever the convention), callable on a
step count, and serializable (``get_config``, :func:`refopt.schedules.serialize` /
:func:`~refopt.schedules.deserialize`, checkpoints).

A schedule is evaluated at the optimizer's pre-increment ``iterations`` (0 on the first update),
which is the ``count`` that optax's ``scale_by_schedule`` passes (its own int32 counter, starting
at 0). optax's counter saturates at :math:`2^{31} - 1` (``safe_increment``); so does the step here.

Numerics
--------
optax computes a schedule with ``jax.numpy`` on an int32 ``count`` and Python-number
hyperparameters; with ``jax_enable_x64`` off (the default) every array is float32, and refopt's
``"optax"`` convention is the update under ``jax.jit``. What XLA:CPU then computes, and what this
module reproduces (measured on jax 0.10.2 / optax 0.2.8, CPU):

* arithmetic between Python numbers happens in Python (float64) before JAX sees it
  (``init_value - end_value`` in the polynomial schedules, ``end_value / peak_value`` and
  ``1 - alpha`` in the cosine ones); the result is rounded to float32 once;
* a division by a constant becomes a multiplication by the float32 reciprocal (XLA's algebraic
  simplifier: ``count / transition_steps`` is ``count * f32(1/transition_steps)``), and a
  constant multiplied twice is folded (``pi * count / decay_steps`` is
  ``count * f32(f32(pi) * f32(1/decay_steps))``);
* a product followed by an addition is one fused multiply-add (``1 - c*r`` is
  ``fma(-c, r, 1)``, ``(init - end) * frac + end`` is ``fma(init - end, frac, end)``);
* ``x ** p`` with a constant float ``p`` is XLA's ``pow``, simplified for ``p`` in
  {0, 1, 2, -1} (``1``, ``x``, ``x*x``, ``1/x``); a Python ``int`` power is JAX's
  ``integer_pow`` (square-and-multiply); other powers and ``decay_rate ** p`` call the C
  library's ``powf`` (bit-identical to XLA's on 20,000 random inputs with a normal result), and
  ``cos`` the C library's ``cosf`` (bit-identical on 20,000 inputs in [0, pi]);
* XLA:CPU flushes subnormal float32 results to zero; so does this module (on ``pow`` and on
  the schedule's value).

Checked bit for bit against optax's schedules under ``jax.jit`` (``conformance/schedules/
optax.json``, ``tests/test_optax_schedules.py``). Eager optax (no ``jit``) computes other bits
(``c / T`` divides, no FMA): not reproduced. With ``jax_enable_x64`` optax's schedules compute in
float64; refopt evaluates a schedule in float32 for every convention, so float64 variables under
``"optax"`` with a schedule get the float32 value (a float learning rate is exact there).

Examples
--------
>>> from refopt.optax_schedules import warmup_cosine_decay_schedule
>>> schedule = warmup_cosine_decay_schedule(0.0, 1e-3, warmup_steps=10, decay_steps=100)
>>> float(schedule(5)), float(schedule(10)), float(schedule(100))
(0.0005000000237487257, 0.0010000000474974513, 0.0)
"""

from __future__ import annotations

import abc
import math
import numbers

import numpy as np

from refopt import _libm
from refopt.schedules import (
    LearningRateSchedule,
    _check_bool,
    _check_finite,
    _check_real,
)

__all__ = [
    "OptaxSchedule",
    "constant_schedule",
    "cosine_decay_schedule",
    "exponential_decay",
    "join_schedules",
    "linear_schedule",
    "piecewise_constant_schedule",
    "polynomial_schedule",
    "warmup_cosine_decay_schedule",
    "warmup_exponential_decay_schedule",
]

_F32 = np.float32
_ZERO = _F32(0.0)
_ONE = _F32(1.0)
_HALF = _F32(0.5)
_PI = _F32(math.pi)  # jnp.pi as a weakly typed float32
_TINY = float(np.finfo(np.float32).tiny)  # XLA:CPU flushes float32 results below it to zero
_INT32_MAX = 2**31 - 1  # optax's count is an int32 that saturates (numerics.safe_increment)


# --------------------------------------------------------------------------------------------
# float32 arithmetic as XLA:CPU does it
# --------------------------------------------------------------------------------------------


def _ftz(x):
    """Flush a float32 subnormal to (signed) zero, as XLA:CPU does."""
    x = _F32(x)
    return x * _ZERO if abs(float(x)) < _TINY else x


def _fma32(a, b, c):
    """``a*b + c`` rounded once to float32 (scalars), as XLA's fused multiply-add.

    The float32 product is exact in float64; Knuth's two-sum gives the float64 sum and its
    error exactly, which decides the only case where rounding the float64 sum to float32 could
    differ from rounding the exact value: a float64 sum exactly halfway between two float32.
    """
    a, b, c = float(a), float(b), float(c)
    p = a * b
    s = p + c
    if not math.isfinite(s):
        return _F32(s)
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    r = _F32(s)
    if err != 0.0 and math.isfinite(float(r)):
        up = np.nextafter(r, _F32(np.inf))
        down = np.nextafter(r, _F32(-np.inf))
        for lo, hi in ((down, r), (r, up)):
            if (float(lo) + float(hi)) / 2.0 == s:  # s is a tie: the error decides
                return hi if err > 0 else lo
    return r


def _pow32(x, p):
    """XLA's float32 ``pow(x, p)`` for a runtime ``p``: the C library's ``powf``, FTZ."""
    return _ftz(_libm.powf(x, p))


def _const_pow32(x, power):
    """``x ** power`` with a constant Python ``power`` as JAX and XLA compile it (see module)."""
    if isinstance(power, numbers.Integral):  # jnp.power -> lax.integer_pow
        y = abs(int(power))
        acc = None
        base = _F32(x)
        while y:
            if y & 1:
                acc = base if acc is None else _F32(acc * base)
            y >>= 1
            if y:
                base = _F32(base * base)
        acc = _ONE if acc is None else acc
        return _ftz(_ONE / acc) if power < 0 else _ftz(acc)
    p = _F32(power)
    if p == 0:
        return _ONE
    if p == 1:
        return _F32(x)
    if p == 2:
        return _ftz(_F32(x) * _F32(x))
    if p == -1:
        return _ftz(_ONE / _F32(x))
    if p == 0.5 and x < 0:  # measured: +NaN here (powf and XLA's other powers give -NaN)
        return _F32(np.nan)
    return _pow32(x, p)


def _recip32(n):
    """XLA's folded constant ``1 / n`` in float32."""
    with np.errstate(divide="ignore"):
        return _ONE / _F32(n)


# --------------------------------------------------------------------------------------------
# Argument checks
# --------------------------------------------------------------------------------------------


def _check_int(name, value, low=None):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(
            f"Argument `{name}` must be an int. "
            f"Received: {name}={value!r} of type {type(value).__name__}"
        )
    value = int(value)
    lo = -_INT32_MAX - 1 if low is None else low
    if not lo <= value <= _INT32_MAX:
        raise ValueError(
            f"Argument `{name}` must be an integer in [{lo}, {_INT32_MAX}] (optax compares it "
            f"with an int32 count). Received: {name}={value}"
        )
    return value


def _count(step):
    """optax's int32 ``count`` for ``step``: an integer >= 0, saturated at 2**31 - 1.

    Accepts Python and NumPy integers, floats with an integral value and 0-d arrays of these.
    """
    if isinstance(step, np.ndarray):
        if step.ndim != 0:
            raise ValueError(
                f"Argument `step` must be a scalar. Received: step with shape {step.shape}")
        step = step[()]
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, numbers.Real):
        raise TypeError(
            "Argument `step` must be an integer. "
            f"Received: step={step!r} of type {type(step).__name__}"
        )
    if not isinstance(step, numbers.Integral):
        x = float(step)
        if not (math.isfinite(x) and x == math.floor(x)):
            raise ValueError(
                f"Argument `step` must be an integer (optax's count is an int32). "
                f"Received: step={step}")
    k = int(step)
    if k < 0:
        raise ValueError(f"Argument `step` must be >= 0. Received: step={step}")
    return min(k, _INT32_MAX)  # numerics.safe_increment stops at the int32 maximum


def _number(value):
    """A JSON-friendly copy of a real hyperparameter (NumPy scalars become Python numbers)."""
    return value.item() if isinstance(value, np.generic) else value


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------


class OptaxSchedule(LearningRateSchedule):
    """Base class of the optax schedules: ``step -> numpy.float32`` with optax's numerics.

    Subclasses implement ``_at(count)`` (``count`` an int in the int32 range, the value optax's
    schedule function receives) and ``get_config()``; :meth:`__call__` validates the step,
    saturates it at :math:`2^{31} - 1` as optax's int32 counter does, and flushes a subnormal
    value to zero as XLA:CPU does.
    """

    #: optimizers step with any value it gives (a hair below 0 at the end of a linear decay
    #: to 0, NaN past the end of a fractional power), as optax does
    optax_numerics = True

    def __call__(self, step):
        """Return the schedule's value at ``step``.

        Parameters
        ----------
        step : int
            The optimizer's pre-increment ``iterations`` (>= 0): optax's ``count``.

        Returns
        -------
        numpy.float32
            The value optax computes under ``jax.jit`` at ``min(step, 2**31 - 1)``.

        Raises
        ------
        TypeError
            If ``step`` is not a number.
        ValueError
            If ``step`` is negative or not a whole number.
        """
        count = _count(step)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                return _ftz(self._at(count))

    @abc.abstractmethod
    def _at(self, count):
        """The value at ``count`` (an int in the int32 range), as ``numpy.float32``."""


class _Constant(OptaxSchedule):
    def __init__(self, value):
        self.value = _number(_check_finite("value", value))
        self._value = _F32(value)

    def _at(self, count):
        return self._value

    def get_config(self):
        return {"value": self.value}


class _Polynomial(OptaxSchedule):
    def __init__(self, init_value, end_value, power, transition_steps, transition_begin=0):
        self.init_value = _number(_check_finite("init_value", init_value))
        self.end_value = _number(_check_finite("end_value", end_value))
        _check_real("power", power)
        if not math.isfinite(float(power)):
            raise ValueError(f"Argument `power` must be finite. Received: power={power}")
        self.power = _number(power)
        self.transition_steps = _check_int("transition_steps", transition_steps)
        self.transition_begin = _check_int("transition_begin", transition_begin)
        # optax: transition_steps <= 0 gives the constant init_value; a negative begin is 0
        self._constant = self.transition_steps <= 0
        self._begin = max(self.transition_begin, 0)
        self._init32 = _F32(init_value)
        self._end32 = _F32(end_value)
        self._diff32 = _F32(float(init_value) - float(end_value))  # Python arithmetic first
        self._recip = _recip32(max(self.transition_steps, 1))

    def _at(self, count):
        if self._constant:
            return self._init32
        c = min(max(count - self._begin, 0), self.transition_steps)  # jnp.clip on int32
        frac = _fma32(-_F32(c), self._recip, _ONE)  # 1 - c/T: 1 - c*f32(1/T), fused
        return _fma32(self._diff32, _const_pow32(frac, self.power), self._end32)

    def get_config(self):
        return {"init_value": self.init_value, "end_value": self.end_value,
                "power": self.power, "transition_steps": self.transition_steps,
                "transition_begin": self.transition_begin}


class _Linear(_Polynomial):
    def __init__(self, init_value, end_value, transition_steps, transition_begin=0):
        super().__init__(init_value, end_value, 1, transition_steps, transition_begin)

    def get_config(self):
        config = super().get_config()
        del config["power"]
        return config


class _Exponential(OptaxSchedule):
    def __init__(self, init_value, transition_steps, decay_rate, transition_begin=0,
                 staircase=False, end_value=None):
        self.init_value = _number(_check_finite("init_value", init_value))
        self.transition_steps = _check_int("transition_steps", transition_steps)
        self.decay_rate = _number(_check_finite("decay_rate", decay_rate))
        self.transition_begin = _check_int("transition_begin", transition_begin)
        self.staircase = _check_bool("staircase", staircase)
        if end_value is not None:
            end_value = _number(_check_finite("end_value", end_value))
        self.end_value = end_value
        # optax: transition_steps <= 0 or decay_rate == 0 give the constant init_value
        self._constant = self.transition_steps <= 0 or self.decay_rate == 0
        self._begin = max(self.transition_begin, 0)
        self._init32 = _F32(init_value)
        self._rate32 = _F32(decay_rate)
        self._recip = _recip32(max(self.transition_steps, 1))
        self._end32 = None if end_value is None else _F32(end_value)

    def _at(self, count):
        if self._constant:
            return self._init32
        decreased = count - self._begin  # int32, no overflow: both in [0, 2**31 - 1]
        if decreased <= 0:
            value = self._init32
        else:
            p = _F32(decreased) * self._recip  # decreased / T, XLA's reciprocal
            if self.staircase:
                p = np.floor(p)
            value = self._init32 * _pow32(self._rate32, p)
        if self._end32 is not None:  # a lower bound when decaying, else an upper bound
            clip = max if self.decay_rate < 1.0 else min
            value = _F32(clip(value, self._end32)) if not np.isnan(value) else value
        return value

    def get_config(self):
        return {"init_value": self.init_value, "transition_steps": self.transition_steps,
                "decay_rate": self.decay_rate, "transition_begin": self.transition_begin,
                "staircase": self.staircase, "end_value": self.end_value}


class _Cosine(OptaxSchedule):
    def __init__(self, init_value, decay_steps, alpha=0.0, exponent=1.0):
        self.init_value = _number(_check_finite("init_value", init_value))
        _check_real("decay_steps", decay_steps)
        if isinstance(decay_steps, (bool, np.bool_)) or not decay_steps > 0:
            raise ValueError(
                "The cosine_decay_schedule requires positive decay_steps. "
                f"Received: decay_steps={decay_steps!r}"
            )
        self.decay_steps = _number(_check_finite("decay_steps", decay_steps))
        self.alpha = _number(_check_finite("alpha", alpha))
        _check_real("exponent", exponent)
        if not math.isfinite(float(exponent)):
            raise ValueError(f"Argument `exponent` must be finite. Received: exponent={exponent}")
        self.exponent = _number(exponent)
        self._init32 = _F32(init_value)
        self._steps32 = _F32(float(decay_steps))
        # pi * count / decay_steps: XLA folds pi * (1/decay_steps) into one constant
        self._scale = _PI * _recip32(self._steps32)
        self._one_minus_alpha = _F32(1.0 - float(alpha))  # Python arithmetic first
        self._alpha32 = _F32(alpha)

    def _at(self, count):
        c = min(_F32(count), self._steps32)  # jnp.minimum(float32(count), decay_steps)
        cosine = _HALF * (_ONE + _libm.cosf(c * self._scale))
        decayed = _fma32(self._one_minus_alpha, _const_pow32(cosine, self.exponent),
                         self._alpha32)
        return self._init32 * decayed

    def get_config(self):
        return {"init_value": self.init_value, "decay_steps": self.decay_steps,
                "alpha": self.alpha, "exponent": self.exponent}


class _Join(OptaxSchedule):
    def __init__(self, schedules, boundaries):
        schedules = list(schedules)
        boundaries = list(boundaries)
        for i, s in enumerate(schedules):
            if not isinstance(s, OptaxSchedule):
                raise TypeError(
                    f"Argument `schedules` must hold refopt.optax_schedules schedules. "
                    f"Received: schedules[{i}]={s!r} of type {type(s).__name__}"
                )
        if not schedules:
            raise ValueError("Argument `schedules` must hold at least one schedule. "
                             "Received: schedules=[]")
        if len(boundaries) != len(schedules) - 1:
            raise ValueError(
                "Argument `boundaries` must have one entry fewer than `schedules`. Received: "
                f"{len(boundaries)} boundaries for {len(schedules)} schedules"
            )
        self.schedules = schedules
        self.boundaries = [_check_int(f"boundaries[{i}]", b, low=0)
                           for i, b in enumerate(boundaries)]

    def _at(self, count):
        value = self.schedules[0]._at(count)
        for boundary, schedule in zip(self.boundaries, self.schedules[1:]):
            if count >= boundary:  # jnp.where(step < boundary, output, schedule(step - b))
                value = schedule._at(count - boundary)
        return value

    def get_config(self):
        from refopt.schedules import serialize

        return {"schedules": [serialize(s) for s in self.schedules],
                "boundaries": list(self.boundaries)}

    @classmethod
    def from_config(cls, config):
        from refopt.schedules import deserialize

        config = dict(config)
        config["schedules"] = [s if isinstance(s, LearningRateSchedule) else deserialize(s)
                               for s in config.get("schedules", [])]
        return cls(**config)


class _WarmupCosine(_Join):
    def __init__(self, init_value, peak_value, warmup_steps, decay_steps, end_value=0.0,
                 exponent=1.0):
        _check_finite("peak_value", peak_value)
        _check_finite("end_value", end_value)
        warmup_steps = _check_int("warmup_steps", warmup_steps)
        decay_steps = _check_int("decay_steps", decay_steps)
        alpha = 0.0 if peak_value == 0.0 else float(end_value) / float(peak_value)
        super().__init__(
            [_Linear(init_value, peak_value, warmup_steps),
             _Cosine(peak_value, decay_steps - warmup_steps, alpha, exponent)],
            [warmup_steps])
        self._config = {"init_value": _number(init_value), "peak_value": _number(peak_value),
                        "warmup_steps": warmup_steps, "decay_steps": decay_steps,
                        "end_value": _number(end_value), "exponent": _number(exponent)}

    def get_config(self):
        return dict(self._config)

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class _WarmupExponential(_Join):
    def __init__(self, init_value, peak_value, warmup_steps, transition_steps, decay_rate,
                 transition_begin=0, staircase=False, end_value=None):
        warmup_steps = _check_int("warmup_steps", warmup_steps)
        super().__init__(
            [_Linear(init_value, peak_value, warmup_steps),
             _Exponential(peak_value, transition_steps, decay_rate, transition_begin,
                          staircase, end_value)],
            [warmup_steps])
        self._config = {"init_value": _number(init_value), "peak_value": _number(peak_value),
                        "warmup_steps": warmup_steps, "transition_steps": transition_steps,
                        "decay_rate": _number(decay_rate), "transition_begin": transition_begin,
                        "staircase": staircase, "end_value": _number(end_value)}

    def get_config(self):
        return dict(self._config)

    @classmethod
    def from_config(cls, config):
        return cls(**config)


class _PiecewiseConstant(OptaxSchedule):
    def __init__(self, init_value, boundaries_and_scales=None):
        self.init_value = _number(_check_finite("init_value", init_value))
        pairs = []
        if boundaries_and_scales is not None:
            items = (boundaries_and_scales.items() if isinstance(boundaries_and_scales, dict)
                     else boundaries_and_scales)
            for item in items:
                try:
                    threshold, scale = item
                except (TypeError, ValueError):
                    raise TypeError(
                        "Argument `boundaries_and_scales` must be a dict {step: scale} or a "
                        f"sequence of (step, scale) pairs. Received: "
                        f"boundaries_and_scales={boundaries_and_scales!r}") from None
                threshold = _check_int("boundaries_and_scales step", threshold, low=0)
                _check_finite("boundaries_and_scales scale", scale)
                if not scale >= 0.0:
                    raise ValueError(
                        "`piecewise_constant_schedule` expects non-negative scale factors. "
                        f"Received: boundaries_and_scales={boundaries_and_scales!r}")
                pairs.append((threshold, _number(scale)))
            if len({t for t, _ in pairs}) != len(pairs):
                raise ValueError("Argument `boundaries_and_scales` has a repeated step. "
                                 f"Received: boundaries_and_scales={boundaries_and_scales!r}")
        self.boundaries_and_scales = None if boundaries_and_scales is None else sorted(pairs)
        self._init32 = _F32(init_value)

    def _at(self, count):
        v = self._init32
        for threshold, scale in self.boundaries_and_scales or ():
            if count >= threshold:  # indicator 0: v*0 + (1*scale)*v, exact but for scale*v
                v = _F32(scale) * v
        return v

    def get_config(self):
        pairs = self.boundaries_and_scales
        return {"init_value": self.init_value,
                "boundaries_and_scales": None if pairs is None else [list(p) for p in pairs]}


# Names the serialized dicts carry (``class_name``): refopt.schedules.deserialize finds them.
_Constant.__name__ = _Constant.__qualname__ = "OptaxConstantSchedule"
_Polynomial.__name__ = _Polynomial.__qualname__ = "OptaxPolynomialSchedule"
_Linear.__name__ = _Linear.__qualname__ = "OptaxLinearSchedule"
_Exponential.__name__ = _Exponential.__qualname__ = "OptaxExponentialDecay"
_Cosine.__name__ = _Cosine.__qualname__ = "OptaxCosineDecaySchedule"
_WarmupCosine.__name__ = _WarmupCosine.__qualname__ = "OptaxWarmupCosineDecaySchedule"
_WarmupExponential.__name__ = _WarmupExponential.__qualname__ = (
    "OptaxWarmupExponentialDecaySchedule")
_PiecewiseConstant.__name__ = _PiecewiseConstant.__qualname__ = "OptaxPiecewiseConstantSchedule"
_Join.__name__ = _Join.__qualname__ = "OptaxJoinSchedules"

#: class name -> class, for :func:`refopt.schedules.deserialize`.
SCHEDULES = {cls.__name__: cls for cls in (
    _Constant, _Polynomial, _Linear, _Exponential, _Cosine, _WarmupCosine, _WarmupExponential,
    _PiecewiseConstant, _Join)}


# --------------------------------------------------------------------------------------------
# Public constructors: optax's names and keywords
# --------------------------------------------------------------------------------------------


def constant_schedule(value):
    r"""A constant schedule, as ``optax.constant_schedule``.

    Parameters
    ----------
    value : float
        The value at every step (finite in float32).

    Returns
    -------
    OptaxSchedule
        :math:`\eta(t) = \mathrm{f32}(v)`.

    Raises
    ------
    TypeError
        If ``value`` is not a real number.
    ValueError
        If ``value`` is not finite in float32.

    Examples
    --------
    >>> float(constant_schedule(0.01)(123))
    0.009999999776482582
    """
    return _Constant(value)


def polynomial_schedule(init_value, end_value, power, transition_steps, transition_begin=0):
    r"""Polynomial transition from ``init_value`` to ``end_value``, as ``optax.polynomial_schedule``.

    Parameters
    ----------
    init_value, end_value : float
        :math:`I` and :math:`E` (finite in float32).
    power : int or float
        :math:`P`. A Python ``int`` is JAX's ``integer_pow`` (repeated multiplication), a float
        XLA's ``pow`` (simplified for 0, 1, 2, -1), as ``frac ** power`` is in optax.
    transition_steps : int
        :math:`T`; ``<= 0`` gives the constant ``init_value`` (optax's rule).
    transition_begin : int, default 0
        :math:`B`; a negative value counts as 0 (optax's rule).

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError
        If a value is not a real number or a step count not an int.
    ValueError
        If a value is not finite in float32 or a step count outside the int32 range.

    Notes
    -----
    With :math:`c = \mathrm{clip}(t - B, 0, T)` (int32) and float32 operations:

    .. math::

        f = \mathrm{fma}(-c, \mathrm{f32}(1/T), 1), \qquad
        \eta(t) = \mathrm{fma}(\mathrm{f32}(I - E), f^{P}, E).

    ``I - E`` is computed in Python (float64) before the rounding, as in optax.

    Examples
    --------
    >>> s = polynomial_schedule(1.0, 0.01, power=2, transition_steps=100)
    >>> float(s(0)), float(s(100)), float(s(1000))
    (1.0, 0.009999999776482582, 0.009999999776482582)
    """
    return _Polynomial(init_value, end_value, power, transition_steps, transition_begin)


def linear_schedule(init_value, end_value, transition_steps, transition_begin=0):
    r"""Linear transition from ``init_value`` to ``end_value``, as ``optax.linear_schedule``.

    :func:`polynomial_schedule` with ``power=1``:
    :math:`\eta(t) = \mathrm{fma}(\mathrm{f32}(I - E), \mathrm{fma}(-c, \mathrm{f32}(1/T), 1), E)`
    with :math:`c = \mathrm{clip}(t - B, 0, T)`.

    Parameters
    ----------
    init_value, end_value : float
        Finite in float32.
    transition_steps : int
        ``<= 0`` gives the constant ``init_value``.
    transition_begin : int, default 0
        Steps held at ``init_value`` first (negative counts as 0).

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError, ValueError
        As :func:`polynomial_schedule`.

    Examples
    --------
    >>> s = linear_schedule(0.0, 1.0, transition_steps=4)
    >>> [float(s(t)) for t in range(6)]
    [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    """
    return _Linear(init_value, end_value, transition_steps, transition_begin)


def exponential_decay(init_value, transition_steps, decay_rate, transition_begin=0,
                      staircase=False, end_value=None):
    r"""Exponential decay, as ``optax.exponential_decay``.

    Parameters
    ----------
    init_value : float
        :math:`I` (finite in float32).
    transition_steps : int
        :math:`T`; ``<= 0`` gives the constant ``init_value`` (optax's rule).
    decay_rate : float
        :math:`r`; 0 gives the constant ``init_value`` (optax's rule).
    transition_begin : int, default 0
        :math:`B`, steps held at ``init_value`` (negative counts as 0).
    staircase : bool, default False
        Floor :math:`p` (the value changes every ``transition_steps`` steps).
    end_value : float or None
        A lower bound when ``decay_rate < 1``, else an upper bound.

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError
        If a value is not a real number, a step count not an int, ``staircase`` not a bool.
    ValueError
        If a value is not finite in float32 or a step count outside the int32 range.

    Notes
    -----
    With :math:`d = t - B` (int32) and float32 operations:

    .. math::

        p = d \cdot \mathrm{f32}(1/T)\ (\lfloor p \rfloor \text{ if staircase}), \qquad
        \eta(t) = \begin{cases} I & d \le 0 \\ I \cdot \mathrm{powf}(r, p) & d > 0 \end{cases}

    then clipped by ``end_value``. ``powf`` is the C library's, flushed to zero below the
    smallest normal float32, as XLA:CPU computes it.

    Examples
    --------
    >>> s = exponential_decay(0.1, transition_steps=10, decay_rate=0.5)
    >>> float(s(0)), float(s(10)), float(s(20))
    (0.10000000149011612, 0.05000000074505806, 0.02500000037252903)
    """
    return _Exponential(init_value, transition_steps, decay_rate, transition_begin, staircase,
                        end_value)


def cosine_decay_schedule(init_value, decay_steps, alpha=0.0, exponent=1.0):
    r"""Cosine decay, as ``optax.cosine_decay_schedule``.

    Parameters
    ----------
    init_value : float
        :math:`I` (finite in float32).
    decay_steps : int or float
        :math:`T` > 0 (``ValueError`` otherwise, as optax).
    alpha : float, default 0.0
        The final value as a fraction of ``init_value``.
    exponent : float, default 1.0
        :math:`p`, the power of the cosine factor.

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError
        If a value is not a real number.
    ValueError
        If ``decay_steps <= 0`` or a value is not finite in float32.

    Notes
    -----
    With :math:`c = \min(\mathrm{f32}(t), T)` and float32 operations:

    .. math::

        k = \tfrac12 (1 + \mathrm{cosf}(c \cdot \mathrm{f32}(\pi \cdot \mathrm{f32}(1/T)))),
        \qquad \eta(t) = I \cdot \mathrm{fma}(\mathrm{f32}(1 - \alpha), k^{p}, \alpha).

    Examples
    --------
    >>> s = cosine_decay_schedule(1.0, decay_steps=10, alpha=0.1)
    >>> float(s(0)), float(s(10)), float(s(50))
    (1.0, 0.10000000149011612, 0.10000000149011612)
    """
    return _Cosine(init_value, decay_steps, alpha, exponent)


def warmup_cosine_decay_schedule(init_value, peak_value, warmup_steps, decay_steps,
                                 end_value=0.0, exponent=1.0):
    r"""Linear warmup then cosine decay, as ``optax.warmup_cosine_decay_schedule``.

    ``join_schedules([linear_schedule(init_value, peak_value, warmup_steps),
    cosine_decay_schedule(peak_value, decay_steps - warmup_steps, alpha, exponent)],
    [warmup_steps])`` with ``alpha = end_value / peak_value`` computed in Python (0 when
    ``peak_value`` is 0).

    Parameters
    ----------
    init_value, peak_value, end_value : float
        Finite in float32.
    warmup_steps : int
        Length of the linear warmup.
    decay_steps : int
        Total length, warmup included; must exceed ``warmup_steps``.
    exponent : float, default 1.0
        Power of the cosine factor.

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError, ValueError
        As :func:`linear_schedule` and :func:`cosine_decay_schedule` (``decay_steps -
        warmup_steps <= 0`` raises).

    Examples
    --------
    >>> s = warmup_cosine_decay_schedule(0.0, 1.0, warmup_steps=2, decay_steps=4)
    >>> [float(s(t)) for t in range(6)]
    [0.0, 0.5, 1.0, 0.4999999701976776, 0.0, 0.0]
    """
    return _WarmupCosine(init_value, peak_value, warmup_steps, decay_steps, end_value, exponent)


def warmup_exponential_decay_schedule(init_value, peak_value, warmup_steps, transition_steps,
                                      decay_rate, transition_begin=0, staircase=False,
                                      end_value=None):
    r"""Linear warmup then exponential decay, as ``optax.warmup_exponential_decay_schedule``.

    ``join_schedules([linear_schedule(init_value, peak_value, warmup_steps),
    exponential_decay(peak_value, transition_steps, decay_rate, transition_begin, staircase,
    end_value)], [warmup_steps])``.

    Parameters
    ----------
    init_value, peak_value : float
        Finite in float32.
    warmup_steps, transition_steps, transition_begin : int
        See :func:`linear_schedule` and :func:`exponential_decay`.
    decay_rate : float
    staircase : bool, default False
    end_value : float or None

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError, ValueError
        As :func:`linear_schedule` and :func:`exponential_decay`.

    Examples
    --------
    >>> s = warmup_exponential_decay_schedule(0.0, 1.0, 2, transition_steps=1, decay_rate=0.5)
    >>> [float(s(t)) for t in range(5)]
    [0.0, 0.5, 1.0, 0.5, 0.25]
    """
    return _WarmupExponential(init_value, peak_value, warmup_steps, transition_steps,
                              decay_rate, transition_begin, staircase, end_value)


def piecewise_constant_schedule(init_value, boundaries_and_scales=None):
    r"""Piecewise constant, scaled at boundaries, as ``optax.piecewise_constant_schedule``.

    Parameters
    ----------
    init_value : float
        The value before the first boundary (finite in float32).
    boundaries_and_scales : dict of int to float, or sequence of (int, float), optional
        ``{step: scale}``: from ``step`` on, the value is multiplied by ``scale`` (>= 0); the
        sequence form is what :meth:`get_config` writes (JSON has no integer keys).

    Returns
    -------
    OptaxSchedule
        :math:`\eta(t) = s_k \cdot (\dots (s_1 \cdot \mathrm{f32}(I)))` in float32, over the
        boundaries :math:`b_1 < \dots < b_k \le t` in increasing order.

    Raises
    ------
    TypeError
        If a step is not an int or the argument has the wrong form.
    ValueError
        If a scale is negative or not finite, or a step repeats or is outside [0, 2**31 - 1].

    Examples
    --------
    >>> s = piecewise_constant_schedule(1.0, {100: 0.1, 200: 0.01})
    >>> float(s(99)), float(s(100)), float(s(250))
    (1.0, 0.10000000149011612, 0.0010000000474974513)
    """
    return _PiecewiseConstant(init_value, boundaries_and_scales)


def join_schedules(schedules, boundaries):
    r"""Apply schedules one after the other, as ``optax.join_schedules``.

    Parameters
    ----------
    schedules : sequence of OptaxSchedule
        Each gets the steps since the boundary where it starts.
    boundaries : sequence of int
        One fewer than ``schedules``; at step ``t >= boundaries[i]`` the value is
        ``schedules[i + 1](t - boundaries[i])`` (later entries win, as in optax).

    Returns
    -------
    OptaxSchedule

    Raises
    ------
    TypeError
        If a schedule is not one of this module's or a boundary not an int.
    ValueError
        If the lengths do not match or a boundary is outside [0, 2**31 - 1].

    Examples
    --------
    >>> s = join_schedules([constant_schedule(1.0), linear_schedule(1.0, 0.0, 2)], [3])
    >>> [float(s(t)) for t in range(6)]
    [1.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    """
    return _Join(schedules, boundaries)
