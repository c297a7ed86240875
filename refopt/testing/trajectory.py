"""Trajectories: an optimizer configuration, initial variables and T steps of gradients.

A :class:`Trajectory` is the unit that the porting toolkit works with: the Hypothesis
strategies draw them (:func:`refopt.testing.strategies.trajectories`), the conformance check
replays them through a candidate and through refopt (:func:`refopt.testing.check_trajectory`),
and the golden files record them with refopt's results (:mod:`refopt.testing.golden`).
:func:`run_reference` replays one through refopt (the reference backend by default, or
``"cpu"``/``"cuda"``, which give the same bits) and returns the state after every step. A
trajectory carries its convention (``"tf_keras"``, ``"keras3"``, ``"keras2"``, ``"tf1"``,
``"torch"``, ``"optax"`` or a :class:`~refopt.conventions.Convention`). Nothing here needs
Hypothesis.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from refopt import optimizers as _optimizers
from refopt import schedules as _schedules
from refopt.indexed_slices import IndexedSlices

__all__ = ["OPTIMIZERS", "State", "Trajectory", "default_convention", "optimizer_class",
           "run_reference", "slot_names"]

#: The optimizers the toolkit draws hyperparameters for (any refopt optimizer class name works
#: for :class:`Trajectory` and :func:`run_reference`).
OPTIMIZERS = ("Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax",
              "Nadam", "Adafactor", "Lion", "Lamb", "Ftrl", "RAdam", "ASGD", "Rprop",
              "ProximalAdagrad", "ProximalGradientDescent")
OPTIMIZERS += ("RowWiseAdagrad", "PartialRowWiseAdam")
_FLOAT_DTYPES = ("float16", "float32", "float64")


def optimizer_class(name):
    """The refopt optimizer class called ``name`` (e.g. ``"Adam"``).

    Parameters
    ----------
    name : str or type
        A class name exported by :mod:`refopt.optimizers` (``"Adam"``, ``"AdamW"``,
        ``"LazyAdam"``, ``"SGD"``, ``"RMSprop"``, ``"Adagrad"``, ...), or a subclass of
        :class:`refopt.Optimizer` (your own optimizer), returned as is.

    Returns
    -------
    type
        A subclass of :class:`refopt.Optimizer`.

    Raises
    ------
    ValueError
        If ``name`` is not such a class; the message lists the known names.
    """
    if isinstance(name, type) and issubclass(name, _optimizers.Optimizer) \
            and name is not _optimizers.Optimizer:
        return name
    cls = getattr(_optimizers, name, None) if isinstance(name, str) else None
    if not (isinstance(cls, type) and issubclass(cls, _optimizers.Optimizer)
            and cls is not _optimizers.Optimizer):
        known = sorted(
            n for n in _optimizers.__all__
            if n != "Optimizer" and issubclass(getattr(_optimizers, n), _optimizers.Optimizer)
        )
        raise ValueError(
            f"`optimizer` must be the name of a refopt optimizer, one of {known}. "
            f"Received: optimizer={name!r}"
        )
    return cls


def default_convention(optimizer):
    """The convention an optimizer takes when none is given: its constructor's default
    (``"tf_keras"``; ``"torch"`` for the optimizers only PyTorch has: RAdam, ASGD, Rprop).

    Parameters
    ----------
    optimizer : str or type
        As :func:`optimizer_class`.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        As :func:`optimizer_class`.
    """
    import inspect

    param = inspect.signature(optimizer_class(optimizer).__init__).parameters.get("convention")
    default = param.default if param is not None else None
    return default if isinstance(default, str) else "tf_keras"


def _check_config(config):
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise TypeError(
            f"`config` must be a dict of constructor arguments. Received: config={config!r}"
        )
    for key in ("convention", "backend"):
        if key in config:
            raise ValueError(
                f"`config` must not contain {key!r}; pass `{key}=` on its own. "
                f"Received: config[{key!r}]={config[key]!r}"
            )
    config = dict(config)
    if isinstance(config.get("learning_rate"), dict):  # a serialized schedule (JSON, CLI)
        config["learning_rate"] = _schedules.deserialize(config["learning_rate"])
    return config


def slot_names(optimizer):
    """The names of the per-variable state arrays of a refopt optimizer, in creation order.

    Parameters
    ----------
    optimizer : refopt.Optimizer

    Returns
    -------
    tuple of str
        ``("m", "v")`` for Adam, ``("m", "v", "vhat")`` with AMSGrad, ``("m",)`` for SGD, followed
        by ``"average"`` when the optimizer keeps an EMA of the weights. Each name works with
        ``optimizer.get_slot(var, name)``.
    """
    return tuple(optimizer.slot_names)


class State(NamedTuple):
    """The reference state after some number of steps.

    Attributes
    ----------
    params : tuple of ndarray
        The variables, one per variable of the trajectory.
    slots : dict of str to tuple of ndarray
        For each slot name (:func:`slot_names`), one array per variable.
    learning_rate : float or None
        The learning rate the last step used (float32-rounded, as a Python float); ``None``
        for the initial state.
    """

    params: tuple
    slots: dict
    learning_rate: object


@dataclasses.dataclass(frozen=True, eq=False)
class Trajectory:
    """An optimizer configuration, initial variables and the gradients of each step.

    Parameters
    ----------
    optimizer : str or type
        A refopt optimizer class name or a subclass of :class:`refopt.Optimizer`
        (:func:`optimizer_class`).
    config : dict
        Constructor keyword arguments of that class (``learning_rate`` may be a
        :class:`refopt.schedules.LearningRateSchedule` or its serialized dict, which is
        deserialized). Must not contain ``convention`` or ``backend``.
    dtype : str or numpy.dtype
        float16, float32 or float64: the dtype of every variable and gradient.
    initial : sequence of ndarray
        The initial variables (copied).
    gradients : sequence of sequence
        ``gradients[k][i]`` is the gradient of variable ``i`` at step ``k + 1``: an ndarray of
        the variable's shape or an :class:`~refopt.IndexedSlices` with
        ``dense_shape == variable.shape``, in ``dtype``.
    convention : str or refopt.conventions.Convention, optional
        Whose numerics: ``"tf_keras"``, ``"keras3"``, ``"keras2"``, ``"tf1"``, ``"torch"``,
        ``"optax"`` (:data:`refopt.conventions.PRESETS`) or a Convention with knobs
        overridden; passed to the optimizer. Default: the optimizer's own
        (:func:`default_convention`: ``"tf_keras"``, ``"torch"`` for RAdam, ASGD, Rprop).

    Raises
    ------
    TypeError, ValueError
        If ``dtype`` is not a float dtype, an array has another dtype or shape than its
        variable, a step has another number of gradients than there are variables, or
        ``config`` is not a dict or holds ``convention``/``backend``.
    """

    optimizer: str
    config: dict
    dtype: np.dtype
    initial: tuple
    gradients: tuple
    convention: str = None

    def __post_init__(self):
        optimizer_class(self.optimizer)
        if self.convention is None:
            object.__setattr__(self, "convention", default_convention(self.optimizer))
        dtype = np.dtype(self.dtype)
        if dtype.name not in _FLOAT_DTYPES:
            raise TypeError(
                f"`dtype` must be one of {_FLOAT_DTYPES}. Received: dtype={self.dtype!r}"
            )
        initial = tuple(np.array(a, copy=True) for a in self.initial)
        for i, a in enumerate(initial):
            if a.dtype != dtype:
                raise TypeError(
                    f"`initial[{i}]` must have dtype {dtype}. Received: dtype={a.dtype}"
                )
        gradients = tuple(
            tuple(np.asarray(g) if isinstance(g, np.generic) else g for g in step)  # 0-d
            for step in self.gradients
        )
        for k, step in enumerate(gradients):
            if len(step) != len(initial):
                raise ValueError(
                    f"`gradients[{k}]` must hold one gradient per variable ({len(initial)}). "
                    f"Received: {len(step)} gradients"
                )
            for i, (g, a) in enumerate(zip(step, initial)):
                shape = g.dense_shape if isinstance(g, IndexedSlices) else np.shape(g)
                if not isinstance(g, (np.ndarray, IndexedSlices)) or shape != a.shape \
                        or g.dtype != dtype:
                    raise ValueError(
                        f"`gradients[{k}][{i}]` must be an ndarray or IndexedSlices of shape "
                        f"{a.shape} and dtype {dtype}. Received: {type(g).__name__} of shape "
                        f"{shape}, dtype {getattr(g, 'dtype', None)}"
                    )
        object.__setattr__(self, "dtype", dtype)
        object.__setattr__(self, "config", _check_config(self.config))
        object.__setattr__(self, "initial", initial)
        object.__setattr__(self, "gradients", gradients)

    @property
    def steps(self):
        """int: the number of steps."""
        return len(self.gradients)

    def make_optimizer(self, backend="reference"):
        """A new refopt optimizer with this configuration and convention.

        Parameters
        ----------
        backend : str, default "reference"
            Passed to the optimizer.

        Returns
        -------
        refopt.Optimizer
            Not built yet.

        Raises
        ------
        TypeError, ValueError, NotImplementedError
            As the optimizer's constructor (invalid hyperparameters, an unbuilt convention or
            backend).
        """
        cls = optimizer_class(self.optimizer)
        return cls(**self.config, convention=self.convention, backend=backend)

    def __repr__(self):
        return format_trajectory(self)


def copy_gradient(g):
    """A copy of a dense or sparse gradient (so a candidate cannot alter the reference's)."""
    if isinstance(g, IndexedSlices):
        return IndexedSlices(g.values.copy(), g.indices.copy(), g.dense_shape)
    return g.copy()


def snapshot(optimizer, variables):
    """A :class:`State` of copies of ``variables`` and every slot of ``optimizer``."""
    names = slot_names(optimizer)
    slots = {n: tuple(optimizer.get_slot(v, n).copy() for v in variables) for n in names}
    return State(tuple(v.copy() for v in variables), slots, None)


def run_reference(trajectory, *, backend="reference"):
    """Replay a trajectory through refopt and return the state before and after every step.

    Parameters
    ----------
    trajectory : Trajectory
    backend : {"reference", "cpu", "cuda"}, default "reference"
        The refopt backend. Every backend gives the same bits under every convention;
        ``"cuda"`` needs numba-cuda and a GPU (or its simulator). The states are host
        copies whatever the backend.

    Returns
    -------
    list of State
        ``trajectory.steps + 1`` states: index 0 is the state right after building (zero slots;
        EMA averages equal to the initial variables), index ``k`` the state after step ``k``,
        with the learning rate that step used.

    Raises
    ------
    TypeError, ValueError, NotImplementedError
        As :meth:`Trajectory.make_optimizer` and ``apply_gradients``.
    """
    opt = trajectory.make_optimizer(backend)
    variables = [a.copy() for a in trajectory.initial]
    opt.build(variables)
    states = [snapshot(opt, variables)]
    for grads in trajectory.gradients:
        opt.apply_gradients(zip([copy_gradient(g) for g in grads], variables))
        states.append(snapshot(opt, variables)._replace(learning_rate=opt.learning_rate))
    return states


def format_array(a, indent="    "):
    """``repr`` of an array (or IndexedSlices) with every digit needed to round-trip."""
    if isinstance(a, IndexedSlices):
        return (f"IndexedSlices(values={format_array(a.values, indent)}, "
                f"indices={a.indices.tolist()}, dense_shape={a.dense_shape})")
    with np.printoptions(floatmode="unique", threshold=200, linewidth=96):
        return repr(np.asarray(a)).replace("\n", "\n" + indent)


def format_trajectory(t, upto=None):
    """A readable description of a trajectory (its first ``upto`` steps when given)."""
    steps = t.gradients if upto is None else t.gradients[:upto]
    lines = [
        f"Trajectory(optimizer={t.optimizer!r}, convention={t.convention!r}, "
        f"dtype={t.dtype.name!r},",
        f"  config={t.config!r},",
        "  initial variables:",
    ]
    lines += [f"    [{i}] {format_array(a, '        ')}" for i, a in enumerate(t.initial)]
    for k, grads in enumerate(steps, 1):
        lines.append(f"  gradients of step {k}:")
        lines += [f"    [{i}] {format_array(g, '        ')}" for i, g in enumerate(grads)]
    if upto is not None and upto < t.steps:
        lines.append(f"  ({t.steps - upto} later step(s) not shown)")
    return "\n".join(lines) + ")"
