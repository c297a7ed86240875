"""Shared argument checks and scalar rounding for the reference functions."""

from __future__ import annotations

import contextvars
import math
import numbers

import numpy as np

from refopt.indexed_slices import IndexedSlices

FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))

#: dtypes :func:`as_float_array` takes beyond :data:`FLOAT_DTYPES` while a step computes
#: bfloat16 in its dtype (:func:`refopt.reference.bf16_generic.computing_in`); empty otherwise.
_EXTRA_DTYPES = contextvars.ContextVar("refopt_extra_float_dtypes", default=())


def as_float_array(name, a):
    """Return ``a`` as a base-class ndarray of float16/32/64, or raise naming ``name``.

    Subclasses are viewed as plain ndarrays (``np.asarray``, no copy): ``np.matrix`` overrides
    ``*`` with a matrix product, which would silently change the math.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"`{name}` must be a numpy.ndarray. Received: {name} of type {type(a).__name__}"
        )
    if a.dtype not in FLOAT_DTYPES and a.dtype not in _EXTRA_DTYPES.get():
        raise TypeError(
            f"`{name}` must have dtype float16, float32 or float64. "
            f"Received: {name} with dtype={a.dtype}"
        )
    return np.asarray(a)


def check_like(param, name, a):
    """Check that state or gradient ``a`` has the shape and dtype of ``param``."""
    a = as_float_array(name, a)
    if a.shape != param.shape or a.dtype != param.dtype:
        raise ValueError(
            f"`{name}` must have the shape and dtype of the variable, {param.shape} "
            f"{param.dtype}. Received: {name} with shape={a.shape}, dtype={a.dtype}"
        )
    return a


def check_grad(param, grad):
    """Check a dense or sparse gradient against its variable; return it unchanged."""
    if isinstance(grad, IndexedSlices):
        if grad.dense_shape != param.shape or grad.dtype != param.dtype:
            raise ValueError(
                "`grad` (IndexedSlices) must have dense_shape and dtype equal to the "
                f"variable's, {param.shape} {param.dtype}. Received: "
                f"dense_shape={grad.dense_shape}, dtype={grad.dtype}"
            )
        return grad
    return check_like(param, "grad", grad)


def _is_real(x):
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def check_real(name, value, *, low=None, high=None, low_open=False, high_open=False, allow_none=False):
    """Validate a finite real hyperparameter in a range; return it unchanged.

    The one check of the optimizer classes (:mod:`refopt.optimizers`) and the reference
    functions, so both refuse the same values with the same exception types.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    value : object
        A Python or NumPy real number (not a bool, not an array); ``None`` when
        ``allow_none``.
    low, high : float, optional
        The bounds, closed unless ``low_open``/``high_open``.

    Returns
    -------
    object
        ``value`` itself.

    Raises
    ------
    TypeError
        ``value`` is not a real number (a string, a bool, an array, ``None`` unless allowed).
    ValueError
        ``value`` is not finite or is out of range; the message names the argument, the range
        and the value received.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, FrameworkRate):
        return value  # a framework's own (possibly degenerate) rate, see FrameworkRate
    if not _is_real(value):
        raise TypeError(f"`{name}` must be a real number. Received: {name}={value!r}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise ValueError(f"`{name}` must be finite. Received: {name}={value!r}")
    v = float(value)
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "" if low is None else ("(" if low_open else "[") + repr(low)
        hi = "" if high is None else repr(high) + (")" if high_open else "]")
        if low is not None and high is not None:
            rng = f"in {lo}, {hi}"
        elif low is not None:
            rng = f"> {low}" if low_open else f">= {low}"
        else:
            rng = f"< {high}" if high_open else f"<= {high}"
        raise ValueError(f"`{name}` must be {rng}. Received: {name}={value!r}")
    return value


#: The ranges the optimizer classes accept for the hyperparameters most reference functions
#: share (Lion's betas, SGD's and RMSprop's momentum and the rest are checked where used).
HYPER_RANGES = {
    "learning_rate": {"low": 0},
    "epsilon": {"low": 0},
    "beta_1": {"low": 0, "high": 1, "high_open": True},
    "beta_2": {"low": 0, "high": 1, "high_open": True},
    "rho": {"low": 0, "high": 1},
}


def check_hyper(name, value):
    """:func:`check_real` with the optimizer classes' range for ``name`` (:data:`HYPER_RANGES`;
    any finite real number for a name not listed). Raises TypeError or ValueError."""
    return check_real(name, value, **HYPER_RANGES.get(name, {}))


def check_scalar(name, x):
    """Check that hyperparameter ``x`` is a real number (Python or NumPy scalar, not bool)."""
    if (
        not isinstance(x, numbers.Real)
        or isinstance(x, (bool, np.bool_))
        or (isinstance(x, np.ndarray))
    ):
        raise TypeError(f"`{name}` must be a real number. Received: {name}={x!r}")
    return x


def check_step(step):
    """Check the 1-based time step: an integer >= 1 (int or NumPy integer)."""
    if (
        not isinstance(step, numbers.Integral)
        or isinstance(step, (bool, np.bool_))
        or step < 1
    ):
        raise ValueError(f"`step` must be an integer >= 1. Received: step={step!r}")
    return step


def check_flag(name, x):
    """Check a boolean flag (Python or NumPy bool)."""
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool. Received: {name}={x!r}")
    return bool(x)


def scalar(dtype, x):
    """Convert the number ``x`` to ``dtype`` with one rounding.

    What TensorFlow does when a Python float meets a tensor in an operation (``eps + sqrt(v)``,
    ``g * (1 - beta_1)``, ``ema_momentum * average``): the number is converted straight to the
    tensor's dtype. Overflow gives inf silently, as in TensorFlow.
    """
    with np.errstate(over="ignore"):
        return np.dtype(dtype).type(x)


def tf_cast(dtype, x):
    """Convert the number ``x`` to ``dtype`` as ``tf.cast(x, dtype)`` does.

    ``tf.cast`` first makes a tensor of ``x``. A Python float becomes a float32 tensor, so for
    float64 the value is ``float64(float32(x))`` (``tf.cast(0.9, tf.float64)`` is
    0.8999999761581421) and for float16 it is rounded twice. A NumPy scalar keeps its own
    dtype (``tf.cast(np.float64(0.9), tf.float64)`` is exactly 0.9). tf-keras uses ``tf.cast``
    for ``beta_1``/``beta_2`` inside the bias-correction powers, for SGD's ``momentum`` and
    for ``weight_decay``. Note that a configuration saved to JSON turns NumPy floats into
    Python floats, which changes float64 results here as it does in tf-keras.
    """
    with np.errstate(over="ignore"):
        if isinstance(x, np.generic):
            return np.dtype(dtype).type(x)
        if isinstance(x, numbers.Integral):  # a Python int becomes an int32 tensor: exact
            return np.dtype(dtype).type(x)
        return np.dtype(dtype).type(np.float32(x))


class FrameworkRate(float):
    """A learning rate a framework computed and steps with, degenerate or not.

    The optimizers pass one where a convention's framework accepts what refopt's own API
    refuses (issue 12 item 6: a tf-keras schedule with ``decay_steps=0`` gives NaN, Keras 2's
    ``decay=inf`` NaN then 0): :func:`check_real` lets it through, so the reference step
    computes what the framework computes (the optimizer has warned).
    """


class DecayedRate(FrameworkRate):
    """Keras 2's learning rate after its legacy ``decay``, one value per variable dtype.

    ``tf.keras.optimizers.legacy`` computes ``lr_t = lr / (1 + decay * iterations)`` in each
    variable's dtype (``lr`` and ``decay`` float32 hyperparameters cast to it, ``iterations``
    cast to it), so a float64 variable sees a rate no float32 holds. The float value is the
    float32 one; :func:`lr_cast` returns the dtype's own value.
    """

    def __new__(cls, learning_rate, decay, iterations):
        values = {}
        with np.errstate(all="ignore"):
            for dt in (np.float16, np.float32, np.float64):
                one = dt(1.0)
                values[np.dtype(dt)] = dt(np.float32(learning_rate)) / (
                    one + dt(np.float32(decay)) * dt(iterations))
        self = super().__new__(cls, float(values[np.dtype(np.float32)]))
        self.values = values
        return self

    def in_dtype(self, dtype):
        """The rate as a scalar of ``dtype``."""
        return self.values[np.dtype(dtype)]

    def _key(self):
        return tuple(v.tobytes() for v in self.values.values())

    def __eq__(self, other):
        if isinstance(other, DecayedRate):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self):
        return hash(self._key())


def lr_cast(dtype, learning_rate, name="learning_rate"):
    """The learning rate as tf-keras sees it: a float32 variable cast to ``dtype``.

    Raises
    ------
    ValueError
        A finite ``learning_rate`` that overflows float32 (``1e40``): the framework's float32
        variable would hold inf, and the optimizer classes refuse such a rate ("must be
        finite in float32"); so does every reference function of a convention that stores
        the rate in float32 (``Convention.learning_rate_cast == "float32"``). ``name`` is
        the argument named in the message.
    """
    if isinstance(learning_rate, DecayedRate):
        return learning_rate.in_dtype(dtype)
    with np.errstate(over="ignore"):
        rate = np.float32(learning_rate)
    if not np.isfinite(rate) and np.isfinite(learning_rate):
        raise ValueError(f"`{name}` must be finite in float32 (it is stored as float32, as "
                         f"the framework does). Received: {name}={learning_rate!r}")
    return np.dtype(dtype).type(rate)
