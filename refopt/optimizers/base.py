"""The optimizer API's base class: hyperparameters, slots, building, config, the extension point.

This is the top layer (``api``). The order of a step is :mod:`refopt.pipeline`'s
(:func:`refopt.pipeline.apply_gradients`); where the state lives and how a step is computed
is the executor's (:mod:`refopt.executors`: reference, cpu, cuda), which this class holds as
``self._executor`` without asking which one it is. Each optimizer (a subclass) names its slots
and writes its update: :meth:`Optimizer.update_step` in NumPy, and optionally a rule
(:meth:`Optimizer.update_rule`) that the fused executors run.
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from refopt import _foreign
from refopt import precision as _precision
from refopt import accumulation as _accumulation
from refopt import schedules as _schedules
from refopt.conventions import PRESETS, Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt import pipeline as _pipeline
from refopt.executors import BACKENDS, get_executor, resolve_backend
from refopt.executors.checks import _INT64_MAX
from refopt.executors.checks import describe as _describe
from refopt.reference import variants as _variants
from refopt.reference._common import check_real  # shared with the reference functions
from refopt.reference._common import DecayedRate as _DecayedRate
from refopt.reference._common import FrameworkRate as _FrameworkRate

__all__ = ["Optimizer", "BACKENDS", "CONVENTIONS"]

#: The convention presets (see :mod:`refopt.conventions`).
CONVENTIONS = tuple(PRESETS)

# Keyword arguments the legacy Keras optimizer took and tf-keras 2.11+ refuses with ValueError.
_LEGACY_KWARGS = ("decay", "gradient_aggregator", "gradient_transformers")

BASE_KWARGS_DOC = """weight_decay : float or None, default None
        Decoupled weight decay per unit of learning rate: before the update,
        ``w <- w - w * weight_decay * lr``. ``None`` disables it. Must be finite and >= 0.
    clipnorm : float or None
        Clip each gradient tensor to this L2 norm (``tf.clip_by_norm``). A value <= 0 means no
        clipping (as tf-keras). Cannot be combined with ``global_clipnorm``. Under the TF
        conventions a non-finite value is taken as TensorFlow takes it, with a warning
        (``inf``: every gradient NaN; NaN: no clipping, or NaN under ``"keras2"``); the
        PyTorch and optax conventions refuse it.
    clipvalue : float or None
        Clip each gradient element to ``[-clipvalue, clipvalue]``. Ignored (with a warning at
        construction) when ``clipnorm`` or ``global_clipnorm`` is also set, as tf-keras does.
    global_clipnorm : float or None
        Clip all gradients together to this global L2 norm (``tf.clip_by_global_norm``; a
        non-finite global norm makes every gradient NaN).
    use_ema : bool, default False
        Keep an exponential moving average of the weights (initialised with a copy of each
        variable at build time).
    ema_momentum : float or None, default 0.99
        ``avg <- ema_momentum * avg + (1 - ema_momentum) * w``, in [0, 1]. ``None`` (the
        ``"torch"`` and ``"fbgemm"`` conventions only): ``torch.optim.swa_utils.AveragedModel``'s
        default equal-weight (SWA) average, ``avg <- avg + (w - avg) / (n + 1)`` after ``n``
        averages (the first copies); computed by the staged step on every backend.
    ema_overwrite_frequency : int or None
        With ``use_ema``, overwrite the weights with their averages every this many steps
        (an int >= 1). ``None``: only :meth:`finalize_variable_values` does.
    gradient_accumulation_steps : int or None
        Keras 3's gradient accumulation (``convention="keras3"`` only; an int >= 2, ``None``
        or 0 for none): the mean of this many calls' gradients is applied on every such
        call, in Keras 3's order (:mod:`refopt.accumulation`); ``iterations`` counts those
        updates.
    jit_compile : bool, default True
        Accepted for compatibility with tf-keras configs; has no effect.
    name : str
        The optimizer's name.
    backend : {"reference", "cpu", "cuda"} or None, default None
        Which executor computes the steps (:mod:`refopt.executors`): ``"reference"`` (pure
        NumPy), ``"cpu"`` (Numba kernels built from the optimizer's rule, bit-identical to
        the reference: slots kept in one flat buffer per dtype, every dense variable of a
        dtype updated in place by one fused kernel call; float16 is computed by the
        reference's staged step) or ``"cuda"`` (numba-cuda kernels from the same rules;
        variables are device arrays, see :mod:`refopt.executors.cuda`; needs an NVIDIA GPU
        or the CUDA simulator, else ``RuntimeError``). Every backend gives the reference's
        numbers under every convention. ``None``: ``$REFOPT_BACKEND`` if set, else
        ``"cpu"`` (:func:`refopt.executors.default_backend`; the first such optimizer of a
        process logs once that the kernels compile on first use). ``get_config`` records
        the backend chosen.
    convention : str, dict or refopt.conventions.Convention, default "tf_keras"
        Which framework's numerics to reproduce: ``"tf_keras"`` (tf.keras 2.11+),
        ``"keras3"``, ``"keras2"`` (legacy ``OptimizerV2``, TF-Addons ``LazyAdam``),
        ``"tf1"`` (``tf.compat.v1.train``), ``"torch"`` (``torch.optim``'s default CPU
        for-loop), ``"torch_fused"`` (``fused=True``), ``"optax"``, or a
        :class:`~refopt.conventions.Convention` with knobs overridden
        (:func:`refopt.conventions.get_convention`); a dict is a Convention's knobs, as
        :meth:`get_config` writes them.
    maximize : bool, default False
        Maximise the objective: every gradient is negated at the start of the step, before
        clipping, weight decay and the update (PyTorch's ``maximize``; exact). Conventions
        ``"torch"`` and ``"fbgemm"`` only (knob ``maximize``); ``ValueError`` under the
        others. ``get_config`` records it when True."""


def _is_real(x):
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def check_bool(name, value):
    """Validate a boolean flag; return it as a Python bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"`{name}` must be a bool. Received: {name}={value!r}")
    return bool(value)


def _check_clip(conv, name, value):
    """A clip threshold as ``conv``'s framework takes it (issue 12 item 6).

    Under TF's clipping formula (tf_keras, Keras 3, Keras 2, TF1) a non-finite threshold is
    accepted, as TensorFlow accepts it, with a warning where the result is degenerate:
    ``clipnorm``/``global_clipnorm`` ``inf`` make every gradient NaN (``g*inf/inf``; TF 2.21),
    a NaN threshold means no clipping where tf-keras and Keras 3 test ``c > 0`` and NaN
    gradients where Keras 2 clips with any value; ``clipvalue=inf`` clips nothing. Elsewhere
    (PyTorch, optax conventions) the threshold must be finite (``ValueError``).
    """
    if conv.clip_formula != "tf" or value is None or not _is_real(value):
        return check_real(name, value, allow_none=True)
    try:
        finite = math.isfinite(float(value))
    except OverflowError:
        finite = False
    if finite:
        return value
    v = float(value)
    legacy = conv.clip_selection == "legacy"
    if v == -math.inf:
        return value  # tf-keras and Keras 3: no clipping; Keras 2 refuses it (checked below)
    if name == "clipvalue":
        if math.isnan(v) and legacy:
            raise ValueError(
                f"`clipvalue` must not be NaN under convention={conv.name!r}. Received: "
                f"clipvalue={value!r}")
        if math.isnan(v):
            warnings.warn(f"clipvalue={value!r} under convention={conv.name!r}: no clipping "
                          f"({conv.framework} tests clipvalue > 0).", UserWarning, stacklevel=4)
        return value
    if math.isnan(v) and not legacy:
        what = f"no clipping ({conv.framework} tests {name} > 0, which NaN fails)"
    else:
        what = ("every gradient becomes NaN (TensorFlow's clip computes g*c/max(norm, c), "
                "inf/inf), so every variable it updates becomes NaN, as in TF 2.21")
    warnings.warn(f"{name}={value!r} under convention={conv.name!r}: {what}.", UserWarning,
                  stacklevel=4)
    return value


def _pop_legacy_decay(convention, kwargs):
    """Take Keras 2's legacy ``decay`` out of ``kwargs`` where the convention has it.

    Returns the value to keep (``None``: no decay). Under ``legacy_decay="keras2"`` (convention
    ``"keras2"``: ``tf.keras.optimizers.legacy``, which is also what
    ``tf.compat.v1.keras.optimizers`` names) the rate of step ``k`` is
    ``lr / (1 + decay*k)``; ``decay`` must be >= 0 (Keras 2's ``ValueError``); ``inf`` is
    taken with a warning (the first rate is ``lr/(1 + inf*0)``, NaN), NaN with a warning (no
    decay: Keras 2 tests ``decay > 0``). Under ``"keras3"`` the argument is ignored with
    Keras 3's warning. Elsewhere it stays in ``kwargs`` and the caller refuses it.
    """
    if "decay" not in kwargs:
        return None
    if isinstance(convention, str) and convention in PRESETS:
        conv = PRESETS[convention]
    else:
        try:
            conv = _check_convention(convention)
        except (TypeError, ValueError):
            return None  # the constructor reports the convention itself
    if conv.legacy_decay == "keras3":
        value = kwargs.pop("decay")
        if value is not None:
            warnings.warn(f"Argument `decay` is no longer supported and will be ignored "
                          f"(Keras 3; convention={conv.name!r}). Received: decay={value!r}",
                          UserWarning, stacklevel=4)
        return None
    if conv.legacy_decay != "keras2":
        return None
    value = kwargs.pop("decay")
    if value is None:
        return None
    if not _is_real(value):
        raise TypeError(f"`decay` must be a real number. Received: decay={value!r}")
    v = float(value)
    if v < 0:
        raise ValueError(f"Expected decay >= 0 (convention={conv.name!r}, Keras 2's rule). "
                         f"Received: decay={value!r}")
    if math.isnan(v) or math.isinf(v):
        what = ("no decay (Keras 2 applies it when decay > 0, which NaN fails)" if math.isnan(v)
                else "the learning rate becomes lr/(1 + inf*k): NaN at step 0, then 0")
        warnings.warn(f"decay={value!r} under convention={conv.name!r}: {what}.",
                      UserWarning, stacklevel=4)
    return value


def _check_convention(convention):
    if isinstance(convention, dict):
        try:
            return Convention(**convention)
        except TypeError as exc:
            raise ValueError(
                f"`convention` as a dict must hold a Convention's knobs ({exc}). Received: "
                f"convention={convention!r}"
            ) from None
    return get_convention(convention)


def optimizer_form(conv, optimizer, knob=None):
    """The form of ``optimizer`` under ``conv`` (its ``<optimizer>_form`` knob, e.g.
    ``conv.adamax_form``).

    Parameters
    ----------
    conv : refopt.conventions.Convention
    optimizer : str
        The class name (``"Adamax"``); the knob is its lower case plus ``_form``.
    knob : str, optional
        The knob's name where it is not that (``"rowwise_adagrad_form"``).

    Returns
    -------
    str
        The framework family whose step the optimizer takes (``"tf_keras"``, ``"torch"``...).

    Raises
    ------
    ValueError
        Where the convention's framework has no such optimizer (the knob is ``"none"``),
        naming both and the conventions that have it.
    """
    from refopt.conventions import PRESETS

    knob = knob or f"{optimizer.lower()}_form"
    form = getattr(conv, knob)
    if form == "none":
        having = [name for name, preset in PRESETS.items() if getattr(preset, knob) != "none"]
        raise ValueError(
            f"{optimizer} does not exist under convention={conv.name!r} (its `{knob}` is "
            f"'none': {conv.framework} has no {optimizer}; the presets that have it: "
            f"{', '.join(having)}). Received: convention={conv.name!r}")
    return form


def default_learning_rate(learning_rate, defaults, conv, optimizer, why=None):
    """``learning_rate``, or the convention's default (``defaults["learning_rate"]``).

    Parameters
    ----------
    learning_rate : float, LearningRateSchedule or None
    defaults : dict
        The optimizer's defaults under ``conv`` (its ``"learning_rate"`` None where the
        framework has none).
    conv : refopt.conventions.Convention
    optimizer : str
        The class name, for the message.
    why : str, optional
        What the message says instead of "that framework's <optimizer> has no default".

    Returns
    -------
    float or LearningRateSchedule

    Raises
    ------
    TypeError
        Where neither is given (the framework's optimizer has no default learning rate);
        ``why`` says more where that matters.
    """
    if learning_rate is None:
        learning_rate = defaults["learning_rate"]
        if learning_rate is None:
            raise TypeError(
                f"{optimizer} under convention={conv.name!r} needs a `learning_rate` ("
                + (why or f"that framework's {optimizer} has no default")
                + "). Received: learning_rate=None")
    return learning_rate


#: class -> whether its update_rule computes its NumPy update (see Optimizer._rule)
_HAS_RULE = {}


class Optimizer:
    """Base class of the stateful optimizers, with the tf.keras 2.11+ pipeline and API.

    Subclasses write only ``_slot_names``, ``_update_step`` and ``get_config``; this class owns
    validation, building, clipping, de-duplication, weight decay, EMA, the step counter and the
    all-or-nothing commit. See the module docstring for the order of one step.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule
        The step size, >= 0 and finite. A float is stored rounded to float32 (tf-keras keeps it
        in a float32 variable), then cast to each variable's dtype. A schedule is evaluated in
        float32 at the pre-increment ``iterations`` at the start of every step.
    {base_kwargs}

    Raises
    ------
    TypeError
        Unknown keyword argument, or a hyperparameter of the wrong type.
    ValueError
        A hyperparameter out of range or not finite; ``clipnorm`` together with
        ``global_clipnorm``; a legacy keyword (``decay``, ``gradient_aggregator``,
        ``gradient_transformers``). ``decay`` is Keras 2's ``lr / (1 + decay*iterations)``
        under ``"keras2"`` (>= 0) and ignored with Keras 3's warning under ``"keras3"``.
    NotImplementedError
        A convention planned but not built in this version.
    RuntimeError
        ``backend="cuda"`` without numba-cuda, or without a GPU and the CUDA simulator.

    Notes
    -----
    Variables are NumPy arrays (float16, float32 or float64, C-contiguous, writeable), updated
    in place and identified by object identity, like ``tf.Variable``: pass the same array
    objects to every call (a new view of the same memory is a different variable).
    float16 and ``ml_dtypes.bfloat16`` variables are computed as the convention's
    ``low_precision_compute`` says (:mod:`refopt.precision`; bfloat16 only where that is
    float32, else a ``TypeError``); :class:`refopt.MasterWeights` keeps float32 masters.
    A torch CPU tensor (``nn.Parameter`` included), or an object with ``__dlpack__`` or
    ``__array__`` that can be viewed writeably, is taken too, through a cached no-copy NumPy
    view (updated in place; gradients may be torch tensors, a sparse COO one becoming an
    :class:`~refopt.IndexedSlices`); a read-only one raises ``ValueError`` pointing to
    :mod:`refopt.functional`. Under ``backend="cuda"``, torch CUDA tensors (see
    :mod:`refopt._foreign`; ``refopt.torch`` wraps all this as ``torch.optim`` optimizers).
    """

    def __init__(
        self,
        name,
        learning_rate,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        backend=None,
        convention="tf_keras",
        maximize=False,
        **kwargs,
    ):
        kwargs.pop("is_legacy_optimizer", None)  # present in tf-keras configs, no meaning here
        accumulation_steps = kwargs.pop("gradient_accumulation_steps", None)  # Keras 3's
        decay = _pop_legacy_decay(convention, kwargs)
        for key in kwargs:
            if key == "decay" and _check_convention(convention).name == "tf1":
                raise ValueError(
                    "`decay` is Keras 2's legacy argument; convention='tf1' follows "
                    "tf.compat.v1.train, whose optimizers have no `decay` (TypeError there). "
                    "tf.compat.v1.keras.optimizers are Keras 2's legacy optimizers: use "
                    f"convention='keras2'. Received: decay={kwargs[key]!r}")
            if key in _LEGACY_KWARGS:
                raise ValueError(
                    f"`{key}` is a legacy Keras optimizer argument, not accepted by the tf.keras "
                    f"2.11+ optimizers that refopt follows. Received: {key}={kwargs[key]!r}"
                )
            hint = " Use `learning_rate`." if key == "lr" else ""
            raise TypeError(
                f"{type(self).__name__}() got an unexpected keyword argument {key!r}.{hint}"
            )
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str. Received: name={name!r}")
        self.name = name
        conv = _check_convention(convention)
        backend = resolve_backend(backend)
        self._executor = get_executor(backend)
        self._kernels = self._executor.kernels  # the staged step's pure functions
        self.backend = backend
        self.convention = conv
        self.maximize = check_bool("maximize", maximize)
        if self.maximize and conv.maximize == "none":
            raise ValueError(
                f"convention={conv.name!r} has no `maximize` ({conv.framework}); it is "
                "PyTorch's option (conventions 'torch', 'fbgemm'). Received: maximize=True"
            )
        self.weight_decay = check_real("weight_decay", weight_decay, low=0, allow_none=True)
        if self.weight_decay is not None and self._decay_mode() == "none":
            raise ValueError(
                f"convention={conv.name!r} has no weight decay for {type(self).__name__} "
                f"({conv.framework}). Received: weight_decay={weight_decay!r}"
            )
        self.clipnorm = _check_clip(conv, "clipnorm", clipnorm)
        self.clipvalue = _check_clip(conv, "clipvalue", clipvalue)
        self.global_clipnorm = _check_clip(conv, "global_clipnorm", global_clipnorm)
        if clipnorm is not None and global_clipnorm is not None:
            raise ValueError(
                "At most one of `clipnorm` and `global_clipnorm` can be set. "
                f"Received: clipnorm={clipnorm!r}, global_clipnorm={global_clipnorm!r}"
            )
        given = [k for k, v in (("clipnorm", clipnorm), ("clipvalue", clipvalue),
                                ("global_clipnorm", global_clipnorm)) if v is not None]
        if conv.clip_selection == "one_only" and len(given) > 1:
            raise ValueError(
                f"Only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set with "
                f"convention={conv.name!r}. Received: {', '.join(given)}"
            )
        if conv.clip_selection == "legacy":
            for key in given:
                if getattr(self, key) < 0:
                    raise ValueError(
                        f"Expected {key} >= 0 (convention={conv.name!r}, Keras 2's rule). "
                        f"Received: {key}={getattr(self, key)!r}"
                    )
        if conv.clip_selection == "tf_keras" and self.clipvalue and self.clipvalue > 0 and (
            (self.clipnorm and self.clipnorm > 0)
            or (self.global_clipnorm and self.global_clipnorm > 0)
        ):
            warnings.warn(
                f"clipvalue={clipvalue!r} is ignored because "
                f"{'clipnorm' if self.clipnorm else 'global_clipnorm'} is set (tf-keras applies "
                "only one clipping: clipnorm, else global_clipnorm, else clipvalue).",
                UserWarning,
                stacklevel=3,
            )
        self.decay = decay
        if decay is not None and getattr(self, "_legacy_decay_ignored", False):
            warnings.warn(
                f"{type(self).__name__} under convention={conv.name!r} ignores decay={decay!r}, "
                f"as {conv.framework.split(' (')[0]}'s {type(self).__name__} does (it never "
                "applies its `decay`).", UserWarning, stacklevel=3)
        self.use_ema = check_bool("use_ema", use_ema)
        if self.use_ema and conv.ema == "none":
            raise ValueError(
                f"convention={conv.name!r} has no moving average of the weights "
                f"({conv.framework}). Received: use_ema=True"
            )
        if ema_momentum is None and conv.ema == "torch":  # AveragedModel's default average
            self.ema_momentum = None
        else:
            self.ema_momentum = check_real("ema_momentum", ema_momentum, low=0, high=1)
        if ema_overwrite_frequency is not None and (
            not isinstance(ema_overwrite_frequency, numbers.Integral)
            or isinstance(ema_overwrite_frequency, (bool, np.bool_))
            or ema_overwrite_frequency < 1
        ):
            raise ValueError(
                "`ema_overwrite_frequency` must be an integer >= 1 or None. "
                f"Received: ema_overwrite_frequency={ema_overwrite_frequency!r}"
            )
        self.ema_overwrite_frequency = (
            None if ema_overwrite_frequency is None else int(ema_overwrite_frequency)
        )
        self.jit_compile = check_bool("jit_compile", jit_compile)
        self.gradient_accumulation_steps = _accumulation.check_steps(conv, accumulation_steps)
        self._micro_steps = 0  # with gradient_accumulation_steps: Keras 3's raw counter
        self._iterations = 0
        self._learning_rate = None
        self._current_learning_rate = None
        self.learning_rate = learning_rate
        self._reset_state()
        self._exclude_ids = set()
        self._exclude_refs = []

    def _reset_state(self):
        """Forget every variable and slot: the state of an optimizer never built."""
        self._built = False
        self._vars = []
        self._index = {}
        self._var_specs = []
        self._slots = {}
        self._averages = []
        self._var_steps = []  # convention step_counter="per_variable": steps per variable
        self._grad_accumulators = []  # gradient_accumulation_steps: host arrays, build order
        self._state = None  # the executor's state (slots and averages live in it)

    # ----------------------------------------------------------------- properties
    @property
    def iterations(self):
        """int: the number of steps applied (``apply_gradients`` calls with a gradient).

        Settable (to an int >= 0) only before the optimizer is built, as in tf-keras.
        """
        return self._iterations

    @iterations.setter
    def iterations(self, value):
        if self._built:
            raise RuntimeError(
                "Cannot set `iterations` after the optimizer has been built (after the first "
                f"apply_gradients or build). Received: iterations={value!r}"
            )
        if (
            not isinstance(value, numbers.Integral)
            or isinstance(value, (bool, np.bool_))
            or not 0 <= value <= _INT64_MAX
        ):
            raise ValueError(
                "`iterations` must be an integer in [0, 2**63 - 1] (tf-keras' counter is an "
                f"int64). Received: iterations={value!r}"
            )
        value = int(value)
        if isinstance(self._learning_rate, _schedules.LearningRateSchedule):
            current = self._evaluate_schedule(self._learning_rate, value)
            self._current_learning_rate = current
        self._iterations = value
        self._micro_steps = value * (self.gradient_accumulation_steps or 1)

    @property
    def learning_rate(self):
        """float: the learning rate, rounded to float32.

        With a float learning rate, its value. With a schedule, as tf-keras: the value the
        schedule gave for the most recent step (evaluated at that step's pre-increment
        ``iterations``), or, before any step, its value at the current ``iterations``. Setting
        a float is refused with ``TypeError`` when the optimizer was created with a schedule
        (tf-keras' rule); setting a schedule is always allowed.
        """
        if isinstance(self._learning_rate, _schedules.LearningRateSchedule):
            return self._current_learning_rate
        return self._learning_rate

    @learning_rate.setter
    def learning_rate(self, value):
        if isinstance(value, _schedules.LearningRateSchedule):
            lax = getattr(value, "convention", None)
            if lax is not None and lax != self.convention.name and (
                    self.convention.name not in _schedules._LAX_STEPS):
                raise ValueError(
                    f"This schedule was built under convention={lax!r} (which takes its "
                    "`decay_steps` as given); the optimizer's convention="
                    f"{self.convention.name!r} builds its schedules with Keras 3's checks. "
                    f"Received: learning_rate={value!r}")
            self._current_learning_rate = self._evaluate_schedule(value)
            self._learning_rate = value
            return
        if isinstance(self._learning_rate, _schedules.LearningRateSchedule):
            raise TypeError(
                "This optimizer was created with a `LearningRateSchedule` as its "
                "`learning_rate`, hence its learning rate is not settable to a number. "
                f"Received: learning_rate={value!r}"
            )
        if not _is_real(value):
            raise TypeError(
                "`learning_rate` must be a float or a refopt.schedules.LearningRateSchedule. "
                f"Received: learning_rate={value!r}"
            )
        check_real("learning_rate", value, low=0)
        with np.errstate(over="ignore"):
            rounded = float(np.float32(value))
        if not math.isfinite(rounded):
            raise ValueError(
                "`learning_rate` must be finite in float32 (it is stored as float32). "
                f"Received: learning_rate={value!r}"
            )
        if rounded == 0 and value > 0:
            which = ("it is stored as float32 here, as the framework does: no variable will move"
                     if self.convention.learning_rate_cast == "float32" else
                     "float32 and float16 variables will not move; float64 ones keep it")
            warnings.warn(
                f"learning_rate={value!r} underflows to 0 in float32 "
                f"(convention={self.convention.name!r}: {which}).",
                UserWarning, stacklevel=self._user_stacklevel())
        if self.convention.learning_rate_cast != "float32":  # a Python float (torch, optax)
            rounded = float(value)
        self._learning_rate = rounded

    @staticmethod
    def _user_stacklevel():
        """The ``stacklevel`` that makes a warning raised by the caller of this function
        point at the first frame outside the refopt package: the user's line, however many
        refopt frames (a subclass's ``__init__``, ``from_config``, a setter) lie between."""
        import os
        import sys

        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
        frame, level = sys._getframe(1), 1  # the function that warns is stacklevel 1
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
                package):
            frame, level = frame.f_back, level + 1
        return level

    def _step_rate(self, lr_value):
        """The rate this step's update takes: ``lr_value``, or with Keras 2's legacy
        ``decay`` > 0, ``lr / (1 + decay*iterations)`` in each variable's dtype (a
        :class:`~refopt.reference._common.DecayedRate`)."""
        decay = getattr(self, "decay", None)
        if decay is None or not decay > 0 or getattr(self, "_legacy_decay_ignored", False):
            return lr_value
        return _DecayedRate(lr_value, decay, self._iterations)

    def _evaluate_schedule(self, schedule, step=None):
        step = self._iterations if step is None else step
        with np.errstate(over="ignore"):
            value = float(np.float32(schedule(step)))
        if (not math.isfinite(value) or value < 0) and getattr(schedule, "convention", None):
            # a schedule built under a framework's convention (tf-keras' decay_steps=0):
            # that framework steps with this rate, so does refopt, with a warning
            warnings.warn(
                f"The learning-rate schedule {type(schedule).__name__} returned {value!r} at "
                f"step {step} (convention={schedule.convention!r} accepts it); the variables "
                "it updates become degenerate (NaN or moving uphill).", UserWarning,
                stacklevel=self._user_stacklevel())
            return _FrameworkRate(value)
        elif (not math.isfinite(value) or value < 0) and getattr(schedule, "optax_numerics",
                                                                  False):
            # optax's schedules step with whatever their float32 arithmetic gives: a linear
            # decay to 0 ends a hair below 0 under jit (T*f32(1/T) != 1), and optax goes on
            if not math.isfinite(value):
                warnings.warn(
                    f"The optax schedule {type(schedule).__name__} returned {value!r} at step "
                    f"{step}, as optax does under jax.jit; the variables it updates become "
                    "NaN.", UserWarning, stacklevel=self._user_stacklevel())
            return _FrameworkRate(value)
        elif not math.isfinite(value) or value < 0:
            raise ValueError(
                f"The learning-rate schedule {type(schedule).__name__} returned "
                f"{value!r} at step {step}; a learning rate must be finite and >= 0."
            )
        return value

    @property
    def variables(self):
        """list: the optimizer's state, in the order of tf-keras' ``optimizer.variables``.

        ``[iterations, *ema_averages, *slots]``: ``iterations`` is a snapshot
        (``numpy.int64``); the averages (one per built variable, in build order) and slots are
        the live arrays. Slots come in the groups of :meth:`_slot_groups`, interleaved per
        variable within a group as tf-keras creates them: Adam gives ``m_a, v_a, m_b, v_b``,
        then ``vhat_a, vhat_b``; SGD ``m_a, m_b``.
        """
        out = [np.int64(self._iterations)]
        out.extend(self._averages)
        if self._built:
            for group in self._slot_groups():
                for i in range(len(self._vars)):
                    out.extend(self._slots[name][i] for name in group)
        return out

    @property
    def slot_names(self):
        """tuple of str: the names :meth:`get_slot` accepts, in creation order.

        ``("m", "v")`` for Adam, ``("m", "v", "vhat")`` with AMSGrad, ``("m",)`` for SGD,
        followed by ``"average"`` with ``use_ema``.
        """
        names = self._slot_names()
        return names + ("average",) if self.use_ema else names

    @property
    def built(self):
        """bool: whether the state exists (after :meth:`build` or the first step)."""
        return self._built

    def get_slot(self, var, slot_name):
        """Return the live state array ``slot_name`` (e.g. ``"m"``, ``"average"``) of ``var``.

        Raises
        ------
        KeyError
            If ``var`` is not a variable the optimizer was built with, or the slot is unknown.
        """
        i = self._position(var)
        if slot_name == "average" and self.use_ema:
            return self._averages[i]
        if slot_name not in self._slots:
            raise KeyError(
                f"Unknown slot {slot_name!r}; this optimizer has {list(self._slots)}"
                + (" and 'average'" if self.use_ema else "")
            )
        return self._slots[slot_name][i]

    # ----------------------------------------------------------------- subclass API
    #: The extension point. A new optimizer is a subclass that names its slots here and
    #: writes :meth:`update_step` in NumPy; it gets the whole pipeline (schedules, clipping,
    #: weight decay, EMA, sparse gradients, checkpoints, the conventions' shared knobs) on
    #: every backend, computed by :meth:`update_step`; adding :meth:`update_rule` makes it
    #: fast on ``"cpu"`` and ``"cuda"``. See the README's "Writing an optimizer".
    slot_variables = ()

    def update_step(self, gradient, variable, slots, learning_rate, step):
        """One step of this optimizer for one variable, in NumPy (override it).

        Parameters
        ----------
        gradient : ndarray
            The gradient, already clipped (and, under PyTorch's convention with
            ``weight_decay``, with its L2 term added), same shape and dtype as ``variable``.
            For a lazy sparse step, the summed rows of the gradient.
        variable : ndarray
            The variable after the convention's decoupled weight decay (or its present rows).
        slots : dict of str -> ndarray
            The current value of each slot of :attr:`slot_variables`, like ``variable``.
        learning_rate : float
            This step's learning rate (a schedule already evaluated).
        step : int
            The 1-based step ``t``.

        Returns
        -------
        (ndarray, dict of str -> ndarray)
            The new variable and the new value of every slot. Must not modify its inputs
            (the pipeline commits everything at the end, so a step that raises changes
            nothing).
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override update_step (or _update_step).")

    def _owner_index(self, name):
        mro = type(self).__mro__
        return next(i for i, k in enumerate(mro) if name in vars(k))

    def _uses_update_step(self):
        """Whether a subclass's :meth:`update_step` overrides the class's own NumPy update."""
        return self._owner_index("update_step") < self._owner_index("_update_step")

    def _rule(self, dtype, learning_rate, step, **kwargs):
        """:meth:`update_rule`, or None when a subclass rewrote the NumPy update below the
        class that defines the rule (the rule would then compute something else): the
        executors call this, never :meth:`update_rule` directly."""
        cls = type(self)
        has_rule = _HAS_RULE.get(cls)
        if has_rule is None:  # a property of the class: decided once
            numpy_owner = min(self._owner_index("update_step"),
                              self._owner_index("_update_step"))
            has_rule = _HAS_RULE[cls] = self._owner_index("update_rule") <= numpy_owner
        if not has_rule:
            return None
        return self.update_rule(dtype, learning_rate, step, **kwargs)

    def _sparse_update_kind(self):
        """How a non-lazy IndexedSlices gradient is applied, for the fused backends:
        ``"densify"`` (the dense update on ``to_dense()``, as :meth:`_update_step` does for a
        user's :meth:`update_step`), ``"adam_table"``/``"sgd_table"`` (tf-keras' whole-table
        sparse updates) or None (the host path: the optimizer's own sparse update)."""
        return "densify" if type(self)._update_step is Optimizer._update_step else None

    def slot_initial_value(self, name, dtype):
        """The value every element of slot ``name`` starts with (override it; default 0)."""
        return np.dtype(dtype).type(0)

    def slot_shape(self, name, shape):
        """The shape of slot ``name`` of a variable of ``shape`` (override it; default the
        variable's own). Adafactor's factored moments are smaller than their variable; a slot
        of another shape is kept outside the fused backends' flat buffers, so an optimizer
        with one takes the staged step there unless its rule says otherwise."""
        return tuple(shape)

    def slot_dtype(self, name, shape, dtype):
        """The dtype of slot ``name`` of a variable of ``shape`` and ``dtype`` (override it;
        default the variable's own). bitsandbytes' 8-bit optimizers keep uint8 codes and
        float32 block maxima (:class:`refopt.Adam8bit`); like a slot of another shape, a
        slot of another dtype is kept outside the fused backends' flat buffers."""
        return np.dtype(dtype)

    def _slot_groups(self):
        """Slot names in tf-keras creation order: a tuple of groups, each interleaved per variable."""
        return (tuple(self.slot_variables),) if self.slot_variables else ()

    def _slot_names(self):
        """Names of the per-variable state arrays."""
        return tuple(name for group in self._slot_groups() for name in group)

    def _slot_initial_value(self, name, dtype):
        """The value slot ``name`` starts with (0; TF1's RMSprop ``velocity`` starts at 1)."""
        return self.slot_initial_value(name, dtype)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        """Return ``(new_param, {slot: new_array})`` for one variable; must not mutate.

        The built-in optimizers override this; a user's optimizer overrides
        :meth:`update_step`, which this calls (after PyTorch's L2 term, if any).
        """
        if isinstance(grad, IndexedSlices):  # a non-lazy optimizer sees the dense sum
            grad = grad.to_dense()
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            grad = _variants.l2_torch(grad, param, weight_decay)
        with np.errstate(all="ignore"):
            new_param, new_slots = self.update_step(grad, param, dict(slots), learning_rate,
                                                    step)
        new_param = np.asarray(new_param)
        if new_param.shape != param.shape or new_param.dtype != param.dtype:
            raise TypeError(
                f"{type(self).__name__}.update_step must return the variable with its shape "
                f"and dtype. Received: shape={new_param.shape}, dtype={new_param.dtype} for "
                f"shape={param.shape}, dtype={param.dtype}")
        out = {}
        for name in slots:
            if name not in new_slots:
                raise KeyError(
                    f"{type(self).__name__}.update_step must return every slot; missing "
                    f"{name!r}")
            out[name] = np.asarray(new_slots[name])
        return new_param, out

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The rule the fast backends run for one step of variables of ``dtype``, or ``None``.

        Override it, together with :meth:`update_step`, to make an optimizer fast on
        ``backend="cpu"`` and ``"cuda"``: return a :class:`refopt.rules.RuleCall` (the rule,
        whose element is written with :mod:`refopt.rules.ops`, and this step's scalars and
        flags, rounded as the framework rounds them). ``None`` (the default): the step runs
        :meth:`update_step` in NumPy on every backend.

        Parameters
        ----------
        dtype : numpy.dtype
        learning_rate : float
            This step's learning rate (a schedule already evaluated).
        step : int
            The 1-based step ``t`` of these variables.
        lazy_rows : bool
            The call is for the present rows of a lazy sparse step.
        row_width : int or None
            With ``lazy_rows``: the elements per row of that step's variable (TF1's
            Adagrad computes rows of one element differently).
        optax_weight_decay : float or None
            optax ``adamw``'s decay, inside the update.
        """
        return None

    #: Lazy optimizers update only the rows present in an IndexedSlices gradient.
    _lazy_sparse = False

    #: The update squares (or otherwise combines) each gradient element on its own, so that
    #: Keras 3's raw duplicate slices (knob ``keras3_sparse_square``) change its numbers;
    #: False where the update is linear in the gradient (SGD and its kind).
    _raw_slices_matter = True

    def _decay_mode(self):
        """What ``weight_decay`` means here: the convention's ``adam_weight_decay`` knob."""
        return self.convention.adam_weight_decay

    def _weight_decay_acts(self):
        """Whether a step applies weight decay: ``weight_decay`` is set, and not PyTorch's L2
        term with a zero rate (torch's optimizers skip it when ``weight_decay == 0``, their
        default, so it neither touches an inf weight nor refuses a sparse gradient)."""
        return self.weight_decay is not None and not (
            self.weight_decay == 0 and self._decay_mode() == "l2")

    # ----------------------------------------------------------------- building
    def _check_var_list(self, var_list, what="var_list"):
        # foreign arrays (torch tensors, __dlpack__/__array__ objects) -> their cached views
        var_list = _foreign.variables(self, var_list, what)
        var_list = self._executor.check_var_list(var_list, what)
        _precision.check_supported(self, var_list, what)  # bfloat16
        return var_list

    def build(self, var_list):
        """Create the state for ``var_list``: zero slots and, with EMA, copies of the variables.

        Calling it again once built does nothing (tf-keras' rule), so every variable the
        optimizer will update must be in the first ``build`` or ``apply_gradients`` call.

        Parameters
        ----------
        var_list : list of ndarray
            The variables (float16/32/64, C-contiguous, writeable), each listed once.

        Raises
        ------
        TypeError, ValueError
            If a variable is not a valid array or is listed twice; nothing is built then.
        """
        if self._built:
            self._warn_if_other_variables(var_list)
            return
        var_list = self._check_var_list(var_list)
        try:
            self._build_state(var_list)
        except BaseException:  # e.g. device variables that overlap: nothing is kept
            self._reset_state()
            raise
        self._built = True

    def _warn_if_other_variables(self, var_list):
        """A second ``build`` does nothing (tf-keras); say so when its list differs."""
        try:
            given = list(var_list)
        except TypeError:
            return
        known = {id(v) for v in self._vars}
        new = [v for v in given if id(_foreign.lookup(self, v)) not in known]
        if new:
            warnings.warn(
                f"build() was called again with {len(given)} variables ({len(new)} not in the "
                f"first list); the optimizer is already built with {len(self._vars)} variables "
                "and a second build does nothing (tf-keras' rule). Pass every variable to the "
                "first build(), or create a new optimizer.",
                UserWarning, stacklevel=3)

    def _build_state(self, var_list):
        state = self._executor.allocate(self, var_list)
        self._vars = var_list
        self._index = {id(v): i for i, v in enumerate(var_list)}
        self._var_specs = state.specs
        self._var_steps = [self._iterations] * len(var_list)
        self._state = state
        self._slots = state.slots
        self._averages = state.averages

    def _position(self, var):
        var = _foreign.lookup(self, var)  # a torch tensor -> the view the optimizer holds
        i = self._index.get(id(var))
        if i is None or self._vars[i] is not var:
            raise KeyError(
                f"The optimizer cannot recognize variable {_describe(var)}: it was not in the "
                "variable list the optimizer was built with. Call `optimizer.build(variables)` "
                "with the full list of variables before the training loop."
            )
        return i

    def exclude_from_weight_decay(self, var_list=None):
        """Exclude these variables from weight decay; must be called before the optimizer is built.

        Parameters
        ----------
        var_list : list of ndarray
            Variables (by identity) not to decay.

        Raises
        ------
        ValueError
            If the optimizer is already built.
        """
        if self._built:
            raise ValueError(
                "`exclude_from_weight_decay()` can only be configured before the optimizer is built."
            )
        var_list = [] if var_list is None else self._check_var_list(var_list)
        self._exclude_ids = {id(v) for v in var_list}
        self._exclude_refs = var_list  # keeps the ids alive

    # ----------------------------------------------------------------- the step
    def apply_gradients(self, grads_and_vars):
        """Apply one step of gradients to their variables, in place.

        Parameters
        ----------
        grads_and_vars : iterable of (gradient, variable)
            ``gradient`` is an ndarray with the variable's shape and dtype, an
            :class:`~refopt.IndexedSlices` with ``dense_shape == variable.shape`` and the
            variable's dtype, or ``None`` (skipped, with a warning). ``variable`` is a
            float16/32/64 ndarray, C-contiguous and writeable; each may appear once.

        Returns
        -------
        int
            ``iterations`` after the step. An empty ``grads_and_vars`` is a no-op (the counter
            does not move).

        Raises
        ------
        TypeError
            A malformed pair, a gradient of another type or dtype than its variable, a variable
            that is not a float ndarray.
        ValueError
            A shape mismatch, a non-contiguous or read-only variable, the same variable twice,
            or every gradient ``None``.
        KeyError
            A variable the optimizer was not built with (tf-keras' error).

        Notes
        -----
        When it raises, no variable, slot, average, learning rate or counter has changed.
        The order of a step is :mod:`refopt.pipeline`'s.
        """
        return _pipeline.apply_gradients(self, grads_and_vars)

    def _grads_checked_against_state(self):
        """Whether this step's gradients must be checked against the optimizer's state
        (:meth:`_check_grads_against_state`) before any backend runs it; False here, so the
        backends' quick paths are taken."""
        return False

    def _check_grads_against_state(self, pairs):
        """Raise for a gradient the state cannot take (``pairs``: the executor's checked
        ``(gradient, variable, (shape, dtype))`` triples); nothing has changed then. Called
        on every step that does not take a backend's quick path, before the optimizer is
        built too."""

    def _is_lazy(self):
        """Whether an IndexedSlices gradient updates only its rows (LazyAdam; TF1 momentum)."""
        return self._lazy_sparse

    def minimize(self, loss_and_grads_fn, var_list):
        """Compute ``(loss, grads) = loss_and_grads_fn()`` and apply the gradients.

        Parameters
        ----------
        loss_and_grads_fn : callable
            Takes no argument and returns ``(loss, grads)``, ``grads`` a sequence with one
            gradient (ndarray, IndexedSlices or None) per entry of ``var_list``.
        var_list : list of ndarray
            The variables, in the order of ``grads``.

        Returns
        -------
        object
            The ``loss`` returned by the callable.

        Raises
        ------
        TypeError
            If ``loss_and_grads_fn`` is not callable or does not return a pair.
        ValueError
            If the number of gradients differs from ``len(var_list)``; plus everything
            :meth:`apply_gradients` raises.
        """
        if not callable(loss_and_grads_fn):
            raise TypeError(
                "`loss_and_grads_fn` must be a callable returning (loss, grads). "
                f"Received: {type(loss_and_grads_fn).__name__}"
            )
        var_list = self._check_var_list(var_list)
        result = loss_and_grads_fn()
        try:
            loss, grads = result
        except (TypeError, ValueError):
            raise TypeError(
                "`loss_and_grads_fn` must return a pair (loss, grads). "
                f"Received: {type(result).__name__}"
            ) from None
        grads = list(grads)
        if len(grads) != len(var_list):
            raise ValueError(
                f"`loss_and_grads_fn` returned {len(grads)} gradients for {len(var_list)} "
                "variables."
            )
        self.apply_gradients(zip(grads, var_list))
        return loss

    def finalize_variable_values(self, var_list):
        """With ``use_ema``, overwrite each variable with its moving average (else do nothing).

        Parameters
        ----------
        var_list : list of ndarray
            Variables the optimizer was built with.

        Raises
        ------
        KeyError
            If a variable is unknown to the optimizer (then nothing is overwritten).
        """
        if not self.use_ema:
            return
        positions = [self._position(v) for v in var_list]
        self._executor.finalize(self, positions)
        _foreign.touched(self, positions)  # torch tensors written in place: bump versions

    # ----------------------------------------------------------------- state in memory
    #: ``get_config`` keys that do not change the numbers: a state loads across them.
    _STATE_FREE_CONFIG_KEYS = ("name", "backend", "jit_compile")
    _STATE_DICT_KEYS = ("class", "config", "iterations", "learning_rate", "built",
                        "slot_names", "slots", "variable_steps")

    def state_dict(self):
        """The optimizer's complete state, as plain Python and NumPy values (copies).

        Like ``torch.optim.Optimizer.state_dict`` and Keras 3's ``optimizer.variables``: what
        a resumed run needs to continue bit for bit. Nothing in it is shared with the
        optimizer (device slots are copied to the host), and nothing needs pickling: the
        arrays can be saved with ``numpy.savez`` once the dict is flattened
        (:func:`refopt.save_checkpoint` does so).

        Returns
        -------
        dict
            ``"class"`` (str, e.g. ``"Adam"``); ``"config"`` (:meth:`get_config`);
            ``"iterations"`` (int); ``"learning_rate"`` (float: the current value, as
            :attr:`learning_rate`); ``"built"`` (bool); ``"slot_names"`` (list of str,
            :attr:`slot_names`, ``"average"`` last with ``use_ema``); ``"slots"`` (dict:
            slot name -> list with one ndarray per built variable, in build order, of the
            slot's shape (:meth:`slot_shape`: Adafactor's factored moments are smaller)
            and dtype (:meth:`slot_dtype`: the variable's, except e.g. ``Adam8bit``'s
            uint8 codes); empty when not built); ``"variable_steps"`` (list of
            int, one per built variable: PyTorch's per-variable step counts, see the
            ``step_counter`` knob; empty when not built); ``"excluded_from_weight_decay"``
            (list of int: the build-order positions of the variables given to
            :meth:`exclude_from_weight_decay`, ascending; empty when not built, since the
            exclusions of an optimizer not built name arrays, not positions).

        Notes
        -----
        The variables themselves are not part of the state (as in torch and Keras):
        they are the caller's arrays.

        Examples
        --------
        >>> import numpy as np, refopt
        >>> w = np.ones(3, np.float32)
        >>> opt = refopt.Adam(learning_rate=0.1)
        >>> _ = opt.apply_gradients([(np.full(3, 0.5, np.float32), w)])
        >>> sd = opt.state_dict()
        >>> sd["iterations"], sd["slot_names"], sd["slots"]["m"][0].dtype
        (1, ['m', 'v'], dtype('float32'))
        >>> other = refopt.Adam(learning_rate=0.1)
        >>> other.load_state_dict(sd, var_list=[w])
        >>> other.iterations
        1
        """
        lr = self.learning_rate
        names = list(self.slot_names)
        slots = {}
        if self._built:
            for name in names:
                live = self._averages if name == "average" else self._slots[name]
                slots[name] = [a.copy() if isinstance(a, np.ndarray) else a.copy_to_host()
                               for a in live]
        return {
            "class": type(self).__name__,
            "config": self.get_config(),
            "iterations": int(self._iterations),
            "learning_rate": None if lr is None else float(lr),
            "built": bool(self._built),
            "slot_names": names,
            "slots": slots,
            "variable_steps": [int(k) for k in self._var_steps] if self._built else [],
            "excluded_from_weight_decay": self._excluded_positions(self._vars),
            **_accumulation.state(self),
        }

    def _excluded_positions(self, var_list):
        """The positions in ``var_list`` of the variables excluded from weight decay."""
        return [i for i, v in enumerate(var_list) if id(v) in self._exclude_ids]

    def _check_excluded(self, excluded, n, var_list, in_place, where):
        """Saved exclusions (positions) against ``var_list``, the variables the state is
        loaded for: the ``(ids, refs)`` to set, or None to keep this optimizer's; ValueError
        naming ``where`` when they are malformed or disagree with exclusions already set.

        ``in_place``: ``var_list`` is what this optimizer is built with (its exclusions are
        fixed then); otherwise exclusions set before building must equal the saved ones, and
        an optimizer without any takes the saved ones."""
        if excluded is None:  # absent (a state written before exclusions were saved)
            return None
        if isinstance(excluded, np.ndarray):
            excluded = excluded.tolist()
        if not isinstance(excluded, (list, tuple)) or not all(
                isinstance(k, numbers.Integral) and not isinstance(k, (bool, np.bool_))
                for k in excluded):
            raise ValueError(f"`{where}` must be a list of variable positions (integers). "
                             f"Received: {excluded!r}")
        saved = sorted(int(k) for k in excluded)
        if len(set(saved)) != len(saved) or any(not 0 <= k < n for k in saved):
            raise ValueError(f"`{where}` must hold distinct positions in [0, {n}) (the state "
                             f"has {n} variables). Received: {list(excluded)!r}")
        current = self._excluded_positions(var_list)
        if (in_place or self._exclude_ids) and current != saved:
            fix = ("load the state into a new optimizer" if in_place else
                   "call exclude_from_weight_decay with the same variables, or not at all "
                   "(the saved exclusions are then applied)")
            raise ValueError(
                f"`{where}` excludes the variables at positions {saved} from weight decay; "
                f"this optimizer excludes those at positions {current} of the variables given "
                f"(exclude_from_weight_decay); {fix}.")
        if in_place or self._exclude_ids:
            return None
        refs = [var_list[k] for k in saved]
        return {id(v) for v in refs}, refs

    def _config_differences(self, config):
        """The numbers-relevant differences between ``config`` (a saved :meth:`get_config`)
        and this optimizer's, as ``"key: saved X, this optimizer Y"`` strings.

        ``name``, ``backend`` and ``jit_compile`` are ignored (every backend gives the same
        numbers), and so is a float ``learning_rate`` on both sides: it is state (restored
        from the saved current value, as torch's ``param_groups`` and Keras 3's
        ``learning_rate`` variable are), not structure. A schedule must match.
        """
        import json

        def plain(x):
            if isinstance(x, dict):
                return {str(k): plain(v) for k, v in x.items()}
            if isinstance(x, (list, tuple)):
                return [plain(v) for v in x]
            if isinstance(x, np.generic):
                return x.item()
            return x

        def normalized(c):
            c = json.loads(json.dumps(plain(c)))
            return {k: v for k, v in c.items() if k not in self._STATE_FREE_CONFIG_KEYS}

        try:
            saved = normalized(config)
        except (TypeError, ValueError, AttributeError):
            raise TypeError("The saved `config` must be a dict of plain values, as get_config() "
                            f"returns. Received: {type(config).__name__}") from None
        current = normalized(self.get_config())
        if _is_real(saved.get("learning_rate")) and _is_real(current.get("learning_rate")):
            saved.pop("learning_rate")
            current.pop("learning_rate")
        for key in self._param_group_state_keys(saved, current):
            saved.pop(key)
            current.pop(key)
        return [f"{k}: saved {saved.get(k, '(absent)')!r}, this optimizer "
                f"{current.get(k, '(absent)')!r}"
                for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]

    #: Hyperparameters torch's schedulers change in ``param_groups`` (``OneCycleLR``'s
    #: momentum cycling): under the torch conventions state, restored like the learning rate.
    _PARAM_GROUP_KEYS = ("momentum", "beta_1", "beta_2")

    def _param_group_state_keys(self, saved, current):
        """The :data:`_PARAM_GROUP_KEYS` that are state here: under the PyTorch conventions
        (whose ``param_groups`` a ``load_state_dict`` restores whole), a real number on both
        sides, both zero or both non-zero (SGD's momentum buffer exists or not)."""
        if self.convention.maximize == "none":  # not torch's family
            return []
        return [k for k in self._PARAM_GROUP_KEYS
                if _is_real(saved.get(k)) and _is_real(current.get(k))
                and (saved[k] == 0) == (current[k] == 0)]

    def load_state_dict(self, state_dict, var_list=None):
        """Restore a :meth:`state_dict`: all or nothing.

        Parameters
        ----------
        state_dict : dict
            What :meth:`state_dict` returned (on any backend), or the same structure read back
            from a file (lists may be tuples, numbers NumPy scalars).
        var_list : list of ndarray (device arrays for ``backend="cuda"``), optional
            The variables the state belongs to, in the saved build order. Required when this
            optimizer is not built and the state is; the optimizer is then built with them.
            When this optimizer is built, omit it or pass exactly the variables it was built
            with: its slots are overwritten in place.

        Raises
        ------
        TypeError
            ``state_dict`` is not a dict, or a value in it has the wrong type.
        ValueError
            A key is missing; the class differs; the numbers-relevant configuration differs
            (the message names each difference; ``name``, ``backend`` and ``jit_compile`` may
            differ, and a float ``learning_rate`` is restored, not compared); the slot names,
            the number of variables or a slot's shape or dtype differ (the message names the
            slot and the variable); ``var_list`` is missing or is not the list this optimizer
            was built with; an invalid ``iterations``, ``variable_steps`` or
            ``learning_rate``; ``"excluded_from_weight_decay"`` not distinct positions of
            the variables, or other positions than this optimizer's own exclusions. Plus what
            :meth:`build` raises for a bad ``var_list``.

        Notes
        -----
        Every check runs before anything is written: when it raises, the optimizer (its
        build, slots, counters and learning rate) is unchanged. Then ``iterations``, the
        per-variable step counts, every slot and EMA average and the learning rate are the
        saved ones (with a schedule, :attr:`learning_rate` reports the saved current value,
        the one the last saved step used; a float is stored as the :attr:`learning_rate`
        setter stores it, rounded to float32 under the Keras and TF conventions). A state saved before building, loaded into a
        built optimizer, un-builds it (as torch's ``load_state_dict`` with an empty state
        forgets the per-parameter state), or rebuilds it on ``var_list`` if given.

        ``"excluded_from_weight_decay"`` (optional: absent in states saved before it existed,
        which then keep this optimizer's own exclusions): an optimizer built here takes the
        saved exclusions, unless :meth:`exclude_from_weight_decay` was called on it, and then
        the two must name the same positions; a built optimizer's must equal them.
        """
        sd = state_dict
        if not isinstance(sd, dict):
            raise TypeError("`state_dict` must be a dict, as Optimizer.state_dict() returns. "
                            f"Received: {type(sd).__name__}")
        missing = [k for k in self._STATE_DICT_KEYS if k not in sd]
        if missing:
            raise ValueError(f"`state_dict` lacks the keys {missing}; it must be what "
                             "Optimizer.state_dict() returns.")
        me = type(self).__name__
        if sd["class"] != me:
            raise ValueError(f"`state_dict` holds the state of an optimizer of class "
                             f"{sd['class']}; cannot load it into one of class {me}.")
        diffs = self._config_differences(sd["config"])
        group_state = {}
        if not diffs and isinstance(sd["config"], dict):
            saved_cfg = sd["config"]
            group_state = {k: float(saved_cfg[k]) for k in self._param_group_state_keys(
                saved_cfg, self.get_config())}
        if diffs:
            raise ValueError(
                "`state_dict` was saved from an optimizer with another configuration; create "
                f"the optimizer with the saved one ({me}.from_config(state_dict['config'])). "
                "Differences: " + "; ".join(diffs))
        iterations = sd["iterations"]
        if (not isinstance(iterations, numbers.Integral) or isinstance(iterations, (bool, np.bool_))
                or not 0 <= iterations <= _INT64_MAX):
            raise ValueError("`state_dict['iterations']` must be an integer in [0, 2**63 - 1]. "
                             f"Received: {iterations!r}")
        iterations = int(iterations)
        lr = sd["learning_rate"]
        if lr is not None:
            if not _is_real(lr) or not math.isfinite(float(lr)) or float(lr) < 0:
                raise ValueError("`state_dict['learning_rate']` must be a finite float >= 0 or "
                                 f"None. Received: {lr!r}")
            lr = float(lr)
            if self.convention.learning_rate_cast == "float32":
                with np.errstate(over="ignore"):
                    lr = float(np.float32(lr))  # stored as float32, as the setter does
                if not math.isfinite(lr):
                    raise ValueError("`state_dict['learning_rate']` must be finite in float32. "
                                     f"Received: {sd['learning_rate']!r}")
        built = sd["built"]
        if not isinstance(built, (bool, np.bool_)):
            raise TypeError(f"`state_dict['built']` must be a bool. Received: {built!r}")
        names = list(self.slot_names)
        if built and list(sd["slot_names"]) != names:
            raise ValueError(f"`state_dict` has the slots {list(sd['slot_names'])}; this "
                             f"optimizer has {names}.")
        slots = sd["slots"] if built else {}
        n = 0
        if built:
            if not isinstance(slots, dict) or sorted(slots) != sorted(names):
                raise ValueError(
                    f"`state_dict['slots']` must map each of {names} to a list of arrays. "
                    f"Received: {sorted(slots) if isinstance(slots, dict) else type(slots).__name__}")
            counts = {name: len(slots[name]) for name in names}
            if len(set(counts.values())) > 1:
                raise ValueError(f"`state_dict['slots']` has lists of different lengths: {counts}")
        steps = sd["variable_steps"]
        if built:
            steps = list(steps)
            # the number of variables: from the slots, else (no slot) from the step counts
            n = len(slots[names[0]]) if names else (len(steps) if steps else None)
            if steps and (len(steps) != n or not all(
                    isinstance(k, numbers.Integral) and not isinstance(k, (bool, np.bool_))
                    and 0 <= k <= iterations for k in steps)):
                raise ValueError(
                    f"`state_dict['variable_steps']` must hold {n} integers in [0, iterations="
                    f"{iterations}]. Received: {steps!r}")
            steps = [int(k) for k in steps] if steps else None
        if var_list is not None:
            var_list = self._check_var_list(var_list)
        if self._built and built:
            if var_list is not None and [id(v) for v in var_list] != [id(v) for v in self._vars]:
                raise ValueError(
                    f"This optimizer is built with {len(self._vars)} other variables; pass "
                    "var_list=None (or the variables it was built with, in order) to overwrite "
                    "its slots, or load the state into a new optimizer.")
        elif built and var_list is None:
            raise ValueError(
                "`var_list` is required: the state belongs to built variables and this "
                "optimizer is not built yet. Pass the variables, in the saved order.")
        if built and n is not None and var_list is not None and len(var_list) != n:
            raise ValueError(f"`state_dict` holds the state of {n} variables; `var_list` has "
                             f"{len(var_list)}.")
        if built and n is not None and self._built and len(self._vars) != n:
            raise ValueError(f"`state_dict` holds the state of {n} variables; this optimizer "
                             f"is built with {len(self._vars)}.")
        excluded = sd.get("excluded_from_weight_decay")
        exclusions = None
        if built:
            in_place = self._built and (var_list is None or [id(v) for v in var_list]
                                        == [id(v) for v in self._vars])
            targets = self._vars if in_place else var_list
            exclusions = self._check_excluded(
                excluded, len(targets) if n is None else n, targets, in_place,
                "state_dict['excluded_from_weight_decay']")
        elif excluded is not None and (not isinstance(excluded, (list, tuple, np.ndarray))
                                       or len(excluded)):
            raise ValueError("`state_dict['excluded_from_weight_decay']` must be empty when "
                             f"`built` is False. Received: {excluded!r}")

        schedule = isinstance(self._learning_rate, _schedules.LearningRateSchedule)
        if lr is None and schedule:  # a hand-made state: the schedule's value at `iterations`
            lr = self._evaluate_schedule(self._learning_rate, iterations)
        before = dict(self.__dict__)  # every attribute a (re)build assigns, to undo it
        try:
            if self._built and (not built or var_list is not None
                                and [id(v) for v in var_list] != [id(v) for v in self._vars]):
                self._reset_state()  # a state saved before building: forget the variables
            if exclusions is not None:  # before the build: nothing may depend on it earlier
                self._exclude_ids, self._exclude_refs = exclusions
            if not self._built and var_list is not None:
                self.build(var_list)
            values = []
            for name in names if built else ():
                live = self._averages if name == "average" else self._slots[name]
                for i, target in enumerate(live):
                    value = slots[name][i]
                    if not isinstance(value, np.ndarray):
                        value = np.asarray(value)
                    shape, dtype = tuple(target.shape), np.dtype(target.dtype)
                    if value.shape != shape or value.dtype != dtype:
                        raise ValueError(
                            f"`state_dict['slots'][{name!r}][{i}]` has shape {value.shape} and "
                            f"dtype {value.dtype}; slot {name!r} of variable {i} "
                            f"({_describe(self._vars[i])}) is {dtype} of shape {shape}.")
                    values.append((target, value))
            accumulation = _accumulation.load_values(self, sd, built, iterations)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(before)
            raise
        # Every check passed: write (nothing below can fail on the values checked above).
        for target, value in values:
            if isinstance(target, np.ndarray):
                np.copyto(target, value)
            elif value.size:
                target.copy_to_device(np.ascontiguousarray(value))
        self._iterations = iterations
        for key, value in group_state.items():  # torch's param_groups: momentum, betas
            setattr(self, key, value)
        _accumulation.restore(self, accumulation)
        if self._built:
            self._var_steps = list(steps) if built and steps else [iterations] * len(self._vars)
        if lr is not None:
            if schedule:
                self._current_learning_rate = lr
            else:
                self._learning_rate = lr

    # ----------------------------------------------------------------- config
    def get_config(self):
        """The constructor arguments as a dict (tf-keras keys plus ``backend``, ``convention``).

        ``learning_rate`` is the float32-rounded float, or ``{"class_name", "config"}`` of the
        schedule. ``from_config(get_config())`` rebuilds an equivalent optimizer without state.
        """
        lr = self._learning_rate
        if isinstance(lr, _schedules.LearningRateSchedule):
            lr = _schedules.serialize(lr)
        conv = self.convention
        return {
            "name": self.name,
            "learning_rate": lr,
            "weight_decay": self.weight_decay,
            "clipnorm": self.clipnorm,
            "global_clipnorm": self.global_clipnorm,
            "clipvalue": self.clipvalue,
            "use_ema": self.use_ema,
            "ema_momentum": self.ema_momentum,
            "ema_overwrite_frequency": self.ema_overwrite_frequency,
            **({"gradient_accumulation_steps": self.gradient_accumulation_steps}
               if self.gradient_accumulation_steps else {}),
            "jit_compile": self.jit_compile,
            "is_legacy_optimizer": False,
            "backend": self.backend,
            "convention": conv.name if conv == PRESETS.get(conv.name) else conv.knobs(),
            **({} if self.decay is None else {"decay": self.decay}),
            **({"maximize": True} if self.maximize else {}),
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        """Create an optimizer from :meth:`get_config`'s dict.

        A schedule dict under ``learning_rate`` is deserialized with
        :func:`refopt.schedules.deserialize`; ``custom_objects`` maps class names to your own
        schedule classes, as in Keras.
        """
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = _schedules.deserialize(
                config["learning_rate"], custom_objects=custom_objects
            )
        return cls(**config)

    def __repr__(self):
        return f"{type(self).__name__}(name={self.name!r}, iterations={self._iterations})"


Optimizer.__doc__ = Optimizer.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
