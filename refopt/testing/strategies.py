"""Public Hypothesis strategies for optimizer inputs: hyperparameters, gradients, trajectories.

Every strategy takes keyword-only arguments and has small defaults (a few variables of at most
4 elements per side, a few steps), so that tests run fast and failures shrink to something
readable. The values reach the corners that ports get wrong: zero and tiny learning rates,
betas near 1, duplicate, unsorted and absent ``IndexedSlices`` rows, empty gradients, full row
cover, and on request non-finite values and the extreme magnitudes of the dtype.

Examples
--------
>>> import refopt
>>> from hypothesis import given
>>> from refopt.testing import strategies as rst
>>> @given(rst.problems(dtype="float32"))
... def test_adam_keeps_shapes(pairs):
...     refopt.Adam().apply_gradients(pairs)
...     for _, var in pairs:
...         assert var.dtype == "float32"
>>> test_adam_keeps_shapes()

Requires Hypothesis (``pip install hypothesis``, or refopt's ``test`` extra).
"""

from __future__ import annotations

import numpy as np

from refopt.testing._hypothesis import missing_hypothesis

try:
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp
except ImportError as _exc:
    raise missing_hypothesis("refopt.testing.strategies", _exc) from _exc

from refopt import conventions as _conventions
from refopt import optimizers as _optimizers
from refopt import schedules as _schedules
from refopt.indexed_slices import IndexedSlices
from refopt.testing.trajectory import (
    OPTIMIZERS,
    Trajectory,
    default_convention,
    optimizer_class,
)

__all__ = [
    "DEFAULT_MAX_MAGNITUDE",
    "dense_gradients",
    "float_arrays",
    "float_dtypes",
    "hyperparameters",
    "indexed_slices",
    "learning_rate_schedules",
    "problems",
    "shapes",
    "trajectories",
]

#: Default bound on the magnitude of drawn variables and gradient elements. float16 stays at 16
#: so that Adam's squared gradient, even of a few duplicate rows summed, does not overflow
#: (65504 is float16's largest value); the others at 1024, a "large but ordinary" gradient.
DEFAULT_MAX_MAGNITUDE = {"float16": 16.0, "float32": 1024.0, "float64": 1024.0}

_DTYPES = ("float16", "float32", "float64")


def _dtype(dtype):
    try:
        d = np.dtype(dtype)
    except TypeError:
        d = None
    if d is None or d.name not in _DTYPES:
        raise ValueError(f"`dtype` must be one of {_DTYPES}. Received: dtype={dtype!r}")
    return d


def _check_optimizer(optimizer):
    if isinstance(optimizer, type):  # your own refopt.Optimizer subclass
        return optimizer_class(optimizer)
    if optimizer not in OPTIMIZERS:
        raise ValueError(
            f"`optimizer` must be one of {OPTIMIZERS} (the optimizers with hyperparameter "
            f"strategies). Received: optimizer={optimizer!r}"
        )
    return optimizer_class(optimizer)


def float_dtypes():
    """The float dtypes refopt computes in: float16, float32, float64 (as ``numpy.dtype``).

    Returns
    -------
    SearchStrategy of numpy.dtype
        Shrinks towards float16.
    """
    return st.sampled_from([np.dtype(d) for d in _DTYPES])


def shapes(*, min_dims=0, max_dims=2, min_side=1, max_side=4):
    """Array shapes, as ``hypothesis.extra.numpy.array_shapes`` (including 0-d with the defaults).

    Parameters
    ----------
    min_dims, max_dims : int, default 0, 2
        Number of dimensions.
    min_side, max_side : int, default 1, 4
        Length of each dimension (``min_side=0`` also draws empty arrays).

    Returns
    -------
    SearchStrategy of tuple of int
    """
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=min_side,
                            max_side=max_side)


def _elements(dtype, *, max_magnitude, allow_nonfinite, extreme):
    width = 8 * dtype.itemsize
    if extreme:
        # The whole finite range of the dtype: subnormals, the largest values, and +-0.
        finite = st.floats(width=width, allow_nan=False, allow_infinity=False)
    else:
        bound = DEFAULT_MAX_MAGNITUDE[dtype.name] if max_magnitude is None else max_magnitude
        if not bound >= 0:
            raise ValueError(f"`max_magnitude` must be >= 0. Received: max_magnitude={bound!r}")
        finite = st.floats(-bound, bound, width=width, allow_nan=False, allow_infinity=False)
    if allow_nonfinite:
        return finite | st.sampled_from([np.nan, np.inf, -np.inf])
    return finite


def float_arrays(*, shape, dtype="float32", max_magnitude=None, allow_nonfinite=False,
                 extreme=False):
    """Float arrays of one shape and dtype (variables, dense gradients, optimizer state).

    Parameters
    ----------
    shape : tuple of int or SearchStrategy of tuple of int
        The array shape.
    dtype : str or numpy.dtype, default "float32"
        float16, float32 or float64.
    max_magnitude : float, optional
        Bound on ``|x|``; default :data:`DEFAULT_MAX_MAGNITUDE` of the dtype. Ignored when
        ``extreme``.
    allow_nonfinite : bool, default False
        Also draw NaN, +inf and -inf elements.
    extreme : bool, default False
        Draw from the whole finite range of the dtype (subnormals and the largest values).

    Returns
    -------
    SearchStrategy of ndarray of ``dtype``, shape ``shape``
        C-contiguous and writeable (usable as refopt variables).

    Raises
    ------
    ValueError
        If ``dtype`` is not a float dtype or ``max_magnitude`` is negative.
    """
    dtype = _dtype(dtype)
    elements = _elements(dtype, max_magnitude=max_magnitude, allow_nonfinite=allow_nonfinite,
                         extreme=extreme)
    return hnp.arrays(dtype, shape, elements=elements)


def dense_gradients(*, shape, dtype="float32", max_magnitude=None, allow_nonfinite=False,
                    extreme=False):
    """Dense gradients: :func:`float_arrays` under the name of what they are used for.

    Parameters
    ----------
    shape, dtype, max_magnitude, allow_nonfinite, extreme
        As :func:`float_arrays`.

    Returns
    -------
    SearchStrategy of ndarray of ``dtype``, shape ``shape``
    """
    return float_arrays(shape=shape, dtype=dtype, max_magnitude=max_magnitude,
                        allow_nonfinite=allow_nonfinite, extreme=extreme)


def indexed_slices(*, dense_shape, dtype="float32", max_rows=None, duplicates=True,
                   allow_empty=True, full_cover=False, index_dtypes=(np.int64, np.int32),
                   max_magnitude=None, allow_nonfinite=False, extreme=False):
    """Sparse gradients (:class:`refopt.IndexedSlices`) for a table of shape ``dense_shape``.

    Parameters
    ----------
    dense_shape : tuple of int
        The variable's shape, at least 1-D.
    dtype : str or numpy.dtype, default "float32"
        dtype of the values.
    max_rows : int, optional
        Most rows (indices) drawn, duplicates included; default ``dense_shape[0] + 3``.
    duplicates : bool, default True
        Allow an index several times (their rows are summed by the optimizer).
    allow_empty : bool, default True
        Allow a gradient with no rows at all (forced when ``dense_shape[0] == 0``).
    full_cover : bool, default False
        Every row appears (in a random order); with ``duplicates`` some may appear again.
    index_dtypes : sequence of integer dtypes, default (int64, int32)
        The dtype of ``indices`` is drawn from these.
    max_magnitude, allow_nonfinite, extreme
        For the values, as :func:`float_arrays`.

    Returns
    -------
    SearchStrategy of IndexedSlices
        Indices unsorted, in ``[0, dense_shape[0])``.

    Raises
    ------
    ValueError
        If ``dense_shape`` is 0-d or ``max_rows`` is negative.
    """
    dense_shape = tuple(int(d) for d in dense_shape)
    if not dense_shape:
        raise ValueError(
            f"`dense_shape` must have at least one dimension. Received: dense_shape={dense_shape}"
        )
    max_rows = dense_shape[0] + 3 if max_rows is None else max_rows
    if max_rows < 0:
        raise ValueError(f"`max_rows` must be >= 0. Received: max_rows={max_rows}")
    values = dict(dtype=_dtype(dtype), max_magnitude=max_magnitude,
                  allow_nonfinite=allow_nonfinite, extreme=extreme)
    float_arrays(shape=(0,), **values)  # validate now, not at the first draw
    return _indexed_slices(dense_shape, max_rows, duplicates, allow_empty, full_cover,
                           tuple(index_dtypes), values)


@st.composite
def _indexed_slices(draw, dense_shape, max_rows, duplicates, allow_empty, full_cover,
                    index_dtypes, values_kw):
    n = dense_shape[0]
    if n == 0:
        idx = []
    elif full_cover:
        idx = list(draw(st.permutations(range(n))))
        if duplicates:
            extra = draw(st.lists(st.integers(0, n - 1), max_size=max(0, max_rows - n)))
            idx = draw(st.permutations(idx + extra))
    else:
        min_size = 0 if allow_empty else 1
        if duplicates:
            idx = draw(st.lists(st.integers(0, n - 1), min_size=min_size, max_size=max_rows))
        else:
            idx = draw(st.lists(st.integers(0, n - 1), min_size=min_size,
                                max_size=min(max_rows, n), unique=True))
    index_dtype = draw(st.sampled_from(list(index_dtypes)))
    values = draw(float_arrays(shape=(len(idx),) + dense_shape[1:], **values_kw))
    return IndexedSlices(values, np.array(idx, dtype=index_dtype), dense_shape)


@st.composite
def learning_rate_schedules(draw, *, max_learning_rate=1.0):
    """refopt learning-rate schedules with hyperparameters in valid ranges.

    Parameters
    ----------
    max_learning_rate : float, default 1.0
        Bound on the initial (and any) learning rate of the schedule.

    Returns
    -------
    SearchStrategy of refopt.schedules.LearningRateSchedule
        ExponentialDecay, PiecewiseConstantDecay, PolynomialDecay, InverseTimeDecay,
        CosineDecay (with and without warmup) or CosineDecayRestarts, with decay periods of a
        few steps so that short trajectories see the schedule move.
    """
    lr = st.floats(0.0, max_learning_rate)
    steps = st.integers(1, 5)
    kind = draw(st.sampled_from(["exponential", "piecewise", "polynomial", "inverse_time",
                                 "cosine", "cosine_restarts"]))
    if kind == "exponential":
        return _schedules.ExponentialDecay(draw(lr), draw(steps), draw(st.floats(0.1, 1.0)),
                                           staircase=draw(st.booleans()))
    if kind == "piecewise":
        boundaries = sorted(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3, unique=True)))
        values = draw(st.lists(lr, min_size=len(boundaries) + 1, max_size=len(boundaries) + 1))
        return _schedules.PiecewiseConstantDecay(boundaries, values)
    if kind == "polynomial":
        return _schedules.PolynomialDecay(draw(lr), draw(steps), draw(lr),
                                          power=draw(st.floats(0.5, 2.0)),
                                          cycle=draw(st.booleans()))
    if kind == "inverse_time":
        return _schedules.InverseTimeDecay(draw(lr), draw(steps), draw(st.floats(0.0, 2.0)),
                                           staircase=draw(st.booleans()))
    if kind == "cosine":
        warmup = draw(st.integers(0, 3))
        return _schedules.CosineDecay(draw(lr), draw(steps), alpha=draw(st.floats(0.0, 1.0)),
                                      warmup_target=draw(lr) if warmup else None,
                                      warmup_steps=warmup)
    return _schedules.CosineDecayRestarts(draw(lr), draw(steps), t_mul=draw(st.floats(1.0, 2.0)),
                                          m_mul=draw(st.floats(0.5, 1.0)),
                                          alpha=draw(st.floats(0.0, 1.0)))


def hyperparameters(*, optimizer="Adam", dtype="float32", weight_decay=True,
                    clipping=True, ema=True, schedules=False, fixed=None, convention=None):
    """Constructor keyword arguments for a refopt optimizer, every value in its valid range.

    Parameters
    ----------
    optimizer : {"Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad"} or type, default "Adam"
        Which optimizer's arguments: Adam family ``learning_rate``, ``beta_1``, ``beta_2``,
        ``epsilon``, ``amsgrad``; SGD ``learning_rate``, ``momentum``, ``nesterov`` (and
        ``dampening`` under PyTorch's SGD, never with Nesterov); RMSprop
        ``learning_rate``, ``rho``, ``momentum``, ``epsilon``, ``centered``; Adagrad
        ``learning_rate``, ``initial_accumulator_value``, ``epsilon``; Adamax ``learning_rate``,
        ``beta_1``, ``beta_2``, ``epsilon``. A subclass of
        :class:`refopt.Optimizer` (your own) gets ``learning_rate`` and the pipeline options;
        fix its own arguments with ``fixed``.
    dtype : str or numpy.dtype, default "float32"
        The variables' dtype. For float16, betas stay <= 0.999 (0.9999 rounds to 1.0 in float16)
        and epsilon >= 1e-7 (smaller values round to 0).
    weight_decay : bool, default True
        Also draw ``weight_decay`` (None or in [0, 1]; AdamW always has one).
    clipping : bool, default True
        Also draw at most one of ``clipnorm``, ``global_clipnorm``, ``clipvalue`` (in
        [1e-3, 1e3]).
    ema : bool, default True
        Also draw ``use_ema`` with ``ema_momentum`` in [0, 1] and ``ema_overwrite_frequency``
        None or 1-3.
    schedules : bool, default False
        Sometimes draw a :func:`learning_rate_schedules` instead of a float learning rate.
    fixed : dict, optional
        Arguments to use as given instead of drawing them (they override the drawn ones).
    convention : str, refopt.conventions.Convention or None
        Draw only what this convention accepts: no ``use_ema`` where the framework has no
        moving average (Keras 2, TF1, optax), no ``weight_decay`` where the optimizer has none
        there, TF1's Adagrad without ``epsilon`` and with a starting accumulator > 0. None:
        the optimizer's default convention (``"tf_keras"``; ``"torch"`` for the optimizers
        only PyTorch has, RAdam, ASGD, Rprop). Under PyTorch's conventions ``maximize=True``
        is drawn too (every optimizer).

    Returns
    -------
    SearchStrategy of dict
        Keyword arguments accepted by ``refopt.<optimizer>(**kwargs)``; the pipeline options
        appear only when drawn (a key that is absent takes refopt's default).

    Raises
    ------
    ValueError
        If ``optimizer`` or ``dtype`` is unknown.
    """
    cls = _check_optimizer(optimizer)
    if fixed is not None and not isinstance(fixed, dict):
        raise TypeError(f"`fixed` must be a dict or None. Received: fixed={fixed!r}")
    conv = _conventions.get_convention(
        default_convention(cls) if convention is None else convention)
    return _hyperparameters(cls, optimizer, _dtype(dtype), weight_decay, clipping, ema,
                            schedules, dict(fixed or {}), conv)


def _has_weight_decay(cls, conv):
    """Whether ``cls`` has a weight decay under ``conv`` (its ``_decay_mode`` reads only the
    convention); True when that cannot be told."""
    class _Probe:
        convention = conv

    try:
        return cls._decay_mode(_Probe()) != "none"
    except Exception:  # a user's optimizer with its own rule: let refopt decide
        return True


def _float_learning_rates():
    """Rates in [0, 1]; one that is 0 in float32 (below float32's smallest subnormal) is drawn as
    0.0 itself: the optimizers accept such a rate only with a warning (a degenerate case)."""
    return st.floats(0.0, 1.0).map(lambda x: 0.0 if np.float32(x) == 0 else x)


@st.composite
def _hyperparameters(draw, cls, optimizer, dtype, weight_decay, clipping, ema, schedules, fixed,
                     conv):
    lr = _float_learning_rates()
    if schedules:
        lr = lr | learning_rate_schedules()
    out = {"learning_rate": draw(lr)}
    if issubclass(cls, _optimizers.Adam):
        beta = st.floats(0.0, 0.999 if dtype.name == "float16" else 0.9999)
        out["beta_1"] = draw(beta)
        out["beta_2"] = draw(beta)
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
        # torch's SparseAdam (LazyAdam under the torch conventions) has no amsgrad
        sparse_adam = (issubclass(cls, _optimizers.LazyAdam)
                       and conv.lazy_update == "torch_sparse")
        out["amsgrad"] = False if sparse_adam else draw(st.booleans())
    elif issubclass(cls, _optimizers.RMSprop):
        out["rho"] = draw(st.floats(0.0, 0.999))
        out["momentum"] = draw(st.sampled_from([0.0, 0.5, 0.9]))
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
        out["centered"] = draw(st.booleans())
    elif issubclass(cls, _optimizers.Adagrad):
        if conv.adagrad_form == "tf1":  # TF1: no epsilon, a start > 0
            out["initial_accumulator_value"] = draw(st.floats(0.01, 1.0))
        else:
            out["initial_accumulator_value"] = draw(st.floats(0.0, 1.0))
            out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-10,
                                            1e-3))
    elif issubclass(cls, _optimizers.RowWiseAdagrad):  # FBGEMM's: its own decay modes
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-10, 1e-3))
        out["exact"] = draw(st.booleans())
        out["weight_decay_mode"] = draw(st.sampled_from(["none", "l2", "decoupled"]))
        if weight_decay and out["weight_decay_mode"] != "none":
            out["weight_decay"] = draw(st.floats(0.0, 1.0))
    elif issubclass(cls, _optimizers.PartialRowWiseAdam):  # FBGEMM's: float32 tables only
        out["beta_1"] = draw(st.floats(0.0, 0.9999))
        out["beta_2"] = draw(st.floats(0.0, 0.9999))
        out["epsilon"] = draw(st.floats(1e-10, 1e-3))
    elif issubclass(cls, _optimizers.Adamax):
        beta = st.floats(0.0, 0.999 if dtype.name == "float16" else 0.9999)
        out["beta_1"] = draw(beta)
        out["beta_2"] = draw(beta)
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
    elif issubclass(cls, _optimizers.Adadelta):
        out["rho"] = draw(st.floats(0.0, 0.999))
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
    elif issubclass(cls, _optimizers.Ftrl):
        if isinstance(out["learning_rate"], float) and out["learning_rate"] < 1e-3:
            out["learning_rate"] = 1e-3  # FTRL divides by the learning rate
        out["learning_rate_power"] = draw(st.sampled_from([-0.5, 0.0, -0.3, -1.0]))
        out["initial_accumulator_value"] = draw(st.floats(0.0, 1.0))
        out["l1_regularization_strength"] = draw(st.sampled_from([0.0, 0.01]))
        out["l2_regularization_strength"] = draw(st.floats(0.0, 0.1))
        out["l2_shrinkage_regularization_strength"] = draw(st.sampled_from([0.0, 0.1]))
        out["beta"] = draw(st.floats(0.0, 1.0))
    elif issubclass(cls, _optimizers.Nadam):
        if conv.nadam_form == "keras2" and not isinstance(out["learning_rate"], float):
            out["learning_rate"] = draw(_float_learning_rates())  # Keras 2's Nadam: no schedule
        beta = st.floats(0.0, 0.999 if dtype.name == "float16" else 0.9999)
        out["beta_1"] = draw(beta)
        out["beta_2"] = draw(beta)
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
        if conv.nadam_form == "torch":
            out["momentum_decay"] = draw(st.sampled_from([0.004, 0.0, 0.05]))
    elif issubclass(cls, _optimizers.Lion):
        out["beta_1"] = draw(st.floats(0.0, 1.0, exclude_min=True))  # Keras: (0, 1]
        out["beta_2"] = draw(st.floats(0.0, 1.0))
    elif issubclass(cls, _optimizers.RAdam):
        beta = st.floats(0.0, 0.999)
        out["beta_1"] = draw(beta)
        out["beta_2"] = draw(beta)
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
    elif issubclass(cls, _optimizers.Lamb):
        beta = st.floats(0.0, 0.999 if dtype.name == "float16" else 0.9999)
        out["beta_1"] = draw(beta)
        out["beta_2"] = draw(beta)
        out["epsilon"] = draw(st.floats(1e-7 if dtype.name == "float16" else 1e-8, 1e-3))
    elif issubclass(cls, _optimizers.Adafactor):
        out["beta_2_decay"] = draw(st.sampled_from([-0.8, -0.5, -1.0]))
        out["epsilon_1"] = draw(st.sampled_from([1e-30, 1e-20]))
        out["epsilon_2"] = draw(st.floats(1e-4, 1e-2))
        out["clip_threshold"] = draw(st.floats(0.5, 2.0))
    elif issubclass(cls, _optimizers.ASGD):
        out["lambd"] = draw(st.floats(0.0, 1e-2))
        out["alpha"] = draw(st.floats(0.0, 1.0))
        out["t0"] = draw(st.sampled_from([0.0, 1.0, 2.0, 1e6]))
    elif issubclass(cls, _optimizers.Rprop):
        out["etas"] = (draw(st.floats(0.1, 0.9)), draw(st.floats(1.1, 2.0)))
        out["step_sizes"] = (draw(st.floats(0.0, 1e-3)), draw(st.floats(1.0, 50.0)))
    elif issubclass(cls, (_optimizers.ProximalAdagrad, _optimizers.ProximalGradientDescent)):
        if issubclass(cls, _optimizers.ProximalAdagrad):  # TF1: a start > 0
            out["initial_accumulator_value"] = draw(st.floats(0.01, 1.0))
        out["l1_regularization_strength"] = draw(st.sampled_from([0.0, 0.01, 0.1]))
        out["l2_regularization_strength"] = draw(st.sampled_from([0.0, 0.05]))
    elif issubclass(cls, _optimizers.SGD):
        out["momentum"] = draw(st.floats(0.0, 1.0))
        out["nesterov"] = draw(st.booleans())
        if conv.sgd_momentum in ("torch", "torch_fused") and not out["nesterov"] and draw(st.booleans()):
            out["dampening"] = draw(st.floats(0.0, 1.0))  # PyTorch's (not with Nesterov)
    if conv.maximize != "none" and draw(st.booleans()):
        out["maximize"] = True  # PyTorch's, on every optimizer of its family
    if optimizer == "AdamW":
        out["weight_decay"] = draw(st.floats(0.0, 1.0))
    elif weight_decay and _has_weight_decay(cls, conv) and not issubclass(
            cls, _optimizers.RowWiseAdagrad) and not (
            issubclass(cls, _optimizers.LazyAdam) and conv.lazy_update == "torch_sparse"):
        wd = draw(st.none() | st.floats(0.0, 1.0))
        if wd is not None:
            out["weight_decay"] = wd
    if clipping:
        kind = draw(st.sampled_from([None, "clipnorm", "global_clipnorm", "clipvalue"]))
        if kind is not None:
            out[kind] = draw(st.floats(1e-3, 1e3))
    if ema and conv.ema != "none" and draw(st.booleans()):
        out["use_ema"] = True
        out["ema_momentum"] = draw(st.floats(0.0, 1.0))
        out["ema_overwrite_frequency"] = draw(st.none() | st.integers(1, 3))
    out.update(fixed)
    return out


def problems(*, dtype="float32", min_variables=1, max_variables=3, sparse=True,
             max_side=4, max_magnitude=None, allow_nonfinite=False, extreme=False):
    """Multi-variable problems: a list of ``(gradient, variable)`` pairs for ``apply_gradients``.

    Parameters
    ----------
    dtype : str or numpy.dtype, default "float32"
    min_variables, max_variables : int, default 1, 3
        Number of variables.
    sparse : bool, default True
        Let variables of at least one dimension get an :func:`indexed_slices` gradient
        (duplicates, empty, full cover) instead of a dense one.
    max_side : int, default 4
        Longest dimension of a variable (0-d variables are drawn too).
    max_magnitude, allow_nonfinite, extreme
        For the gradients, as :func:`float_arrays`. Variables are always finite and bounded by
        :data:`DEFAULT_MAX_MAGNITUDE`.

    Returns
    -------
    SearchStrategy of list of (ndarray or IndexedSlices, ndarray)
        Each variable a distinct, C-contiguous, writeable array.
    """
    dtype = _dtype(dtype)
    gradient_kw = dict(max_magnitude=max_magnitude, allow_nonfinite=allow_nonfinite,
                       extreme=extreme)
    float_arrays(shape=(0,), dtype=dtype, **gradient_kw)  # validate now
    var_shapes = st.lists(shapes(max_side=max_side), min_size=min_variables,
                          max_size=max_variables)
    return _problems(dtype, var_shapes, sparse, gradient_kw)


@st.composite
def _problems(draw, dtype, var_shapes, sparse, gradient_kw):
    pairs = []
    for shape in draw(var_shapes):
        var = draw(float_arrays(shape=shape, dtype=dtype))
        is_sparse = sparse and bool(shape) and draw(st.booleans())
        grad = draw(_gradient(shape, dtype, is_sparse, **gradient_kw))
        pairs.append((grad, var))
    return pairs


def _gradient(shape, dtype, sparse, *, max_magnitude, allow_nonfinite, extreme):
    kw = dict(dtype=dtype, max_magnitude=max_magnitude, allow_nonfinite=allow_nonfinite,
              extreme=extreme)
    if sparse:
        return (indexed_slices(dense_shape=shape, **kw)
                | indexed_slices(dense_shape=shape, full_cover=True, **kw))
    return dense_gradients(shape=shape, **kw)


def trajectories(*, optimizer="Adam", dtype="float32", min_steps=1, max_steps=3,
                 min_variables=1, max_variables=2, max_side=4, sparse=None, config=None,
                 weight_decay=True, clipping=True, ema=True, schedules=False,
                 max_magnitude=None, allow_nonfinite=False, extreme=False,
                 convention=None):
    """Whole optimization runs: hyperparameters, initial variables and T steps of gradients.

    Parameters
    ----------
    optimizer : {"Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad"} or type, default "Adam"
    dtype : str or numpy.dtype, default "float32"
    min_steps, max_steps : int, default 1, 3
        Number of steps T (shrinks towards ``min_steps``).
    min_variables, max_variables : int, default 1, 2
        Number of variables; shapes as :func:`shapes` with ``max_side``.
    max_side : int, default 4
    sparse : bool, optional
        Whether variables of at least one dimension may get :class:`~refopt.IndexedSlices`
        gradients (each such variable is drawn sparse or dense once, for all steps).
        Default: True for LazyAdam, False otherwise. LazyAdam under the torch conventions
        (``torch.optim.SparseAdam``, which refuses dense gradients) gets sparse gradients
        only, on variables of at least one dimension.
    config : dict, optional
        Hyperparameters to fix (``hyperparameters(fixed=config)``).
    weight_decay, clipping, ema, schedules
        Which options :func:`hyperparameters` draws.
    max_magnitude, allow_nonfinite, extreme
        For the gradients, as :func:`float_arrays` (initial variables are always finite and
        within :data:`DEFAULT_MAX_MAGNITUDE`).
    convention : str, optional
        Stored in the trajectory and passed to refopt. Default: the optimizer's own
        (:func:`default_convention`: ``"tf_keras"``, ``"torch"`` for RAdam, ASGD, Rprop).

    Returns
    -------
    SearchStrategy of refopt.testing.Trajectory

    Raises
    ------
    ValueError
        If ``optimizer`` or ``dtype`` is unknown, or ``min_steps > max_steps``;
        ``PartialRowWiseAdam`` with a dtype other than float32 (FBGEMM's tables).
    """
    dtype = _dtype(dtype)
    if optimizer == "PartialRowWiseAdam" and dtype.name != "float32":
        raise ValueError("PartialRowWiseAdam takes float32 variables only (FBGEMM's tables). "
                         f"Received: dtype={dtype.name!r}")
    if convention is None:
        convention = default_convention(optimizer)
    if not 0 <= min_steps <= max_steps:
        raise ValueError(
            f"Need 0 <= min_steps <= max_steps. Received: min_steps={min_steps}, "
            f"max_steps={max_steps}"
        )
    hp = hyperparameters(optimizer=optimizer, dtype=dtype, weight_decay=weight_decay,
                         clipping=clipping, ema=ema, schedules=schedules, fixed=config,
                         convention=convention)
    gradient_kw = dict(max_magnitude=max_magnitude, allow_nonfinite=allow_nonfinite,
                       extreme=extreme)
    float_arrays(shape=(0,), dtype=dtype, **gradient_kw)  # validate now
    if optimizer == "LazyAdam" and (sparse is None or sparse) and _conventions.get_convention(
            convention).lazy_update == "torch_sparse":
        sparse = "only"  # SparseAdam: every gradient sparse
    return _trajectories(optimizer, dtype, min_steps, max_steps, min_variables, max_variables,
                         max_side, optimizer == "LazyAdam" if sparse is None else sparse, hp,
                         gradient_kw, convention)


@st.composite
def _trajectories(draw, optimizer, dtype, min_steps, max_steps, min_variables, max_variables,
                  max_side, sparse, hp, gradient_kw, convention):
    hp = draw(hp)
    only = sparse == "only"
    var_shapes = draw(st.lists(shapes(min_dims=1 if only else 0, max_side=max_side),
                               min_size=min_variables, max_size=max_variables))
    initial = [draw(float_arrays(shape=s, dtype=dtype)) for s in var_shapes]
    kinds = [only or (sparse and bool(s) and draw(st.booleans())) for s in var_shapes]
    n_steps = draw(st.integers(min_steps, max_steps))
    grads = [
        [draw(_gradient(s, dtype, k, **gradient_kw)) for s, k in zip(var_shapes, kinds)]
        for _ in range(n_steps)
    ]
    return Trajectory(optimizer, hp, dtype, initial, grads, convention)
