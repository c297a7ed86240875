"""PyTorch's learning-rate schedulers (``torch.optim.lr_scheduler``) driving refopt optimizers.

Each class has torch's name, keywords and protocol: built on an optimizer, it sets the
learning rate at once (epoch 0), and every ``sched.step()`` after ``opt.apply_gradients`` (or
a torch-style ``opt.step()``) moves it on; ``get_last_lr()``, ``last_epoch``,
``state_dict()`` / ``load_state_dict()`` as torch's. The learning rate is computed in Python
floats **as torch computes it**: by torch's recursive ("chainable") ``get_lr``, which
multiplies the *current* learning rate by a factor each step, not by the closed form of the
documentation. The two differ in the last bits after a few steps (``ExponentialLR``:
``((lr g) g) g`` against ``lr g**3``) and, for ``CosineAnnealingLR``, by much more when
anything else touched the learning rate; torch's numbers are the recursive ones, so refopt's
are too. ``step(epoch)`` (deprecated in torch) takes the closed form where torch does.

The optimizer may be

* a :class:`refopt.Optimizer`: one parameter group whose ``"lr"`` is
  ``opt.learning_rate`` (read back at each step, as torch reads ``group["lr"]``); under the
  ``"torch"`` and ``"fbgemm"`` conventions it is the Python float itself, bit for bit. Under
  a convention that stores the learning rate in float32 (the TensorFlow ones) the recursion
  reads that float32 value back. An optimizer created with a
  :class:`refopt.schedules.LearningRateSchedule` is refused (``TypeError``);
  ``"momentum"`` is ``opt.momentum`` and ``"betas"`` is ``(opt.beta_1, opt.beta_2)`` where
  the optimizer has them (``OneCycleLR(cycle_momentum=True)``), other keys
  (``"initial_lr"``, ``"max_lr"``, ``"min_lr"``) are kept beside it;
* anything with torch's ``param_groups`` (the :mod:`refopt.torch` adapters, a
  ``torch.optim.Optimizer``): its groups' ``"lr"`` entries.

Follows ``torch/optim/lr_scheduler.py`` of PyTorch 2.13 (read for its formulas and order of
operations; the golden sequences in ``conformance/lr_scheduler/torch.json`` are recorded
from it by ``conformance/generators/gen_torch.py --lr-sequences``). Not here: ``CyclicLR``,
and torch's warning when ``sched.step()`` is called before the optimizer's step.

Examples
--------
>>> import numpy as np, refopt
>>> from refopt.lr_scheduler import StepLR
>>> w = np.ones(2, np.float32)
>>> opt = refopt.SGD(learning_rate=0.1, convention="torch")
>>> sched = StepLR(opt, step_size=2, gamma=0.5)
>>> lrs = []
>>> for _ in range(5):
...     _ = opt.apply_gradients([(np.ones(2, np.float32), w)])
...     lrs.append(sched.get_last_lr()[0])
...     sched.step()
>>> lrs
[0.1, 0.1, 0.05, 0.05, 0.025]
"""

from __future__ import annotations

import math
import numbers
import types
import warnings
import weakref
from bisect import bisect_right
from collections import Counter
from collections.abc import MutableMapping

__all__ = [
    "SWALR",
    "ChainedScheduler",
    "ConstantLR",
    "CosineAnnealingLR",
    "CosineAnnealingWarmRestarts",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "LinearLR",
    "MultiStepLR",
    "MultiplicativeLR",
    "OneCycleLR",
    "PolynomialLR",
    "ReduceLROnPlateau",
    "SequentialLR",
    "StepLR",
    "from_config",
]

_EPOCH_WARNING = (
    "Passing `epoch` to `scheduler.step()` is deprecated in PyTorch; with it the closed form "
    "is used where the scheduler has one, instead of the chainable form."
)


# ----------------------------------------------------------------------------- groups
class _OptimizerGroup(MutableMapping):
    """torch's ``param_group`` dict seen on a :class:`refopt.Optimizer` (one group)."""

    def __init__(self, opt):
        self._opt = weakref.ref(opt)
        self._extra = {}

    def _keys(self):
        opt = self._opt()
        keys = ["lr"]
        if hasattr(opt, "momentum"):
            keys.append("momentum")
        if hasattr(opt, "beta_1") and hasattr(opt, "beta_2"):
            keys.append("betas")
        return keys

    def __getitem__(self, key):
        opt = self._opt()
        if key == "lr":
            return opt.learning_rate
        if key == "momentum" and "momentum" in self._keys():
            return opt.momentum
        if key == "betas" and "betas" in self._keys():
            return (opt.beta_1, opt.beta_2)
        return self._extra[key]

    def __setitem__(self, key, value):
        opt = self._opt()
        if key == "lr":
            opt.learning_rate = value
        elif key == "momentum" and "momentum" in self._keys():
            opt.momentum = value
        elif key == "betas" and "betas" in self._keys():
            opt.beta_1, opt.beta_2 = value
        else:
            self._extra[key] = value

    def __delitem__(self, key):
        del self._extra[key]

    def __iter__(self):
        return iter(self._keys() + list(self._extra))

    def __len__(self):
        return len(self._keys()) + len(self._extra)


_GROUPS = weakref.WeakKeyDictionary()  # refopt optimizer -> [its _OptimizerGroup]


def _param_groups(optimizer):
    groups = getattr(optimizer, "param_groups", None)
    if groups is not None:
        return groups
    if optimizer not in _GROUPS:
        _GROUPS[optimizer] = [_OptimizerGroup(optimizer)]
    return _GROUPS[optimizer]


def _defaults(optimizer):
    """The keys torch's ``optimizer.defaults`` would have that OneCycleLR looks at."""
    defaults = getattr(optimizer, "defaults", None)
    if defaults is not None:
        return defaults
    return dict.fromkeys(_param_groups(optimizer)[0])


def _check_optimizer(optimizer, who):
    from refopt import schedules
    from refopt.optimizers.base import Optimizer

    if isinstance(optimizer, Optimizer):
        if isinstance(optimizer._learning_rate, schedules.LearningRateSchedule):
            raise TypeError(
                f"{who} drives the optimizer's learning rate as a float; this optimizer was "
                f"created with a LearningRateSchedule. Received: learning_rate="
                f"{optimizer._learning_rate!r}")
        return
    if not isinstance(getattr(optimizer, "param_groups", None), list):
        raise TypeError(
            f"{who} takes a refopt.Optimizer or an optimizer with torch's `param_groups`. "
            f"Received: optimizer={optimizer!r}")


def _check_int(name, value, low):
    if (not isinstance(value, numbers.Integral) or isinstance(value, bool)
            or value < low):
        raise ValueError(f"`{name}` must be an integer >= {low}. Received: {name}={value!r}")
    return int(value)


def _check_real(name, value, low=None, high=None):
    if not isinstance(value, numbers.Real) or isinstance(value, bool) or not math.isfinite(
            value) or (low is not None and value < low) or (high is not None and value > high):
        where = "" if low is None and high is None else f" in [{low}, {high}]"
        raise ValueError(f"`{name}` must be a finite real number{where}. "
                         f"Received: {name}={value!r}")
    return value


def _per_group(name, optimizer, value):
    n = len(_param_groups(optimizer))
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise ValueError(f"`{name}` must have one value per parameter group ({n}). "
                             f"Received: {name}={value!r}")
        return list(value)
    return [value] * n


# ----------------------------------------------------------------------------- base
def _snapshot(sched):
    """Shallow copies of a scheduler's attributes (lists and dicts copied one level), its
    children's (SequentialLR, ChainedScheduler) and its groups' values."""
    state = {k: (list(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
             for k, v in sched.__dict__.items()}
    children = [_snapshot(c) for c in sched.__dict__.get("_schedulers", ())]
    groups = []
    for g in sched.__dict__.get("_groups", ()):
        try:
            groups.append((g, {k: g[k] for k in ("lr", "momentum", "betas") if k in g}))
        except (KeyError, TypeError):
            pass
    return sched, state, children, groups


def _restore(snap):
    sched, state, children, groups = snap
    sched.__dict__.clear()
    sched.__dict__.update(state)
    for child in children:
        _restore(child)
    for g, values in groups:
        for k, v in values.items():
            try:
                g[k] = v
            except (ValueError, TypeError):  # pragma: no cover - the values were accepted
                pass


def _atomic_step(step):
    """Make a scheduler's ``step`` all or nothing: a value the optimizer refuses (a negative
    learning rate past the end of a schedule, say) leaves the scheduler, its children and the
    optimizer as they were, and the error names the scheduler."""
    def wrapped(self, *args, **kwargs):
        snap = _snapshot(self)
        try:
            return step(self, *args, **kwargs)
        except (ValueError, TypeError) as exc:
            _restore(snap)
            raise type(exc)(f"{type(self).__name__}.step(): {exc} (nothing changed)") from exc

    wrapped.__name__, wrapped.__qualname__ = step.__name__, step.__qualname__
    wrapped.__doc__ = step.__doc__
    return wrapped


class LRScheduler:
    """Base class: torch's ``LRScheduler`` protocol on a refopt (or torch-style) optimizer.

    Parameters
    ----------
    optimizer : refopt.Optimizer or an object with ``param_groups``
        Whose learning rate to drive (see the module's notes).
    last_epoch : int, default -1
        -1 starts afresh: each group's ``"initial_lr"`` is set to its ``"lr"`` (unless
        present) and the first ``step`` (epoch 0) runs at once. ``>= 0`` resumes, and needs
        ``"initial_lr"`` in every group (``KeyError``, as torch).

    Raises
    ------
    TypeError
        ``optimizer`` is neither a refopt optimizer nor has ``param_groups``, or was created
        with a refopt ``LearningRateSchedule``.
    KeyError
        ``last_epoch >= 0`` and a group has no ``"initial_lr"``.

    Notes
    -----
    ``step()``: ``last_epoch += 1``, each group's ``"lr"`` set to :meth:`get_lr`'s value
    (torch's recursive form, reading the groups' current ``"lr"``); ``step(epoch)``:
    ``last_epoch = epoch`` and the closed form where the scheduler has one (a
    deprecation warning, as torch). :meth:`get_last_lr` is the groups' ``"lr"`` after the
    last step.
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = _atomic_step(cls.__dict__["step"])


    _is_initial = False
    _in_step = False

    def __init__(self, optimizer, last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        if not isinstance(last_epoch, numbers.Integral) or isinstance(last_epoch, bool) or (
                last_epoch < -1):
            raise ValueError(f"`last_epoch` must be an integer >= -1. "
                             f"Received: last_epoch={last_epoch!r}")
        self.optimizer = optimizer
        groups = _param_groups(optimizer)
        if last_epoch == -1:
            for group in groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(groups):
                if "initial_lr" not in group:
                    raise KeyError(f"param 'initial_lr' is not specified in param_groups[{i}] "
                                   f"when resuming a scheduler with last_epoch={last_epoch}")
        self.base_lrs = [group["initial_lr"] for group in groups]
        self.last_epoch = int(last_epoch)
        self._initial_step()

    @property
    def _groups(self):
        return _param_groups(self.optimizer)

    def _initial_step(self):
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def _current_lrs(self):
        return [group["lr"] for group in self._groups]

    def get_lr(self):
        """The groups' next learning rates, torch's recursive form (list of float)."""
        raise NotImplementedError

    def get_last_lr(self):
        """list of float: each group's learning rate after the last :meth:`step`."""
        return self._last_lr

    def step(self, epoch=None):
        """Advance one epoch (or, deprecated, jump to ``epoch`` by the closed form)."""
        self._step_count += 1
        if epoch is not None:
            warnings.warn(_EPOCH_WARNING, UserWarning, stacklevel=2)
        self._update_lr(epoch)

    def _update_lr(self, epoch=None):
        self._in_step = True
        try:
            if epoch is None:
                self.last_epoch += 1
                values = self.get_lr()
            else:
                self.last_epoch = epoch
                closed = getattr(self, "_get_closed_form_lr", None)
                values = closed() if closed is not None else self.get_lr()
        finally:
            self._in_step = False
        for group, lr in zip(self._groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = self._current_lrs()

    def _warn_outside_step(self):
        if not self._in_step:
            warnings.warn("To get the last learning rate computed by the scheduler, please "
                          "use `get_last_lr()`.", UserWarning, stacklevel=3)

    def state_dict(self):
        """The scheduler's state (every attribute but the optimizer), as torch's."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict`'s values (the optimizer's learning rate is not set:
        load the optimizer's own state, as in torch)."""
        self.__dict__.update(state_dict)


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)`` (torch's ``LambdaLR``; one function or one per
    group). Only the plain attributes of a callable object are saved by ``state_dict``."""

    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        self.lr_lambdas = _per_group("lr_lambda", optimizer, lr_lambda)
        for f in self.lr_lambdas:
            if not callable(f):
                raise TypeError(f"`lr_lambda` must be callable. Received: lr_lambda={f!r}")
        super().__init__(optimizer, last_epoch)

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(f, types.FunctionType) else dict(vars(f))
                               for f in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        lambdas = state.pop("lr_lambdas")
        self.__dict__.update(state)
        for f, saved in zip(self.lr_lambdas, lambdas):
            if saved is not None:
                vars(f).update(saved)

    def get_lr(self):
        self._warn_outside_step()
        return [base * f(self.last_epoch) for f, base in zip(self.lr_lambdas, self.base_lrs)]


class MultiplicativeLR(LambdaLR):
    """``lr *= lr_lambda(epoch)`` each step after the first (torch's ``MultiplicativeLR``)."""

    def get_lr(self):
        self._warn_outside_step()
        if self._is_initial:
            return self._current_lrs()
        return [g["lr"] * f(self.last_epoch) for f, g in zip(self.lr_lambdas, self._groups)]


class StepLR(LRScheduler):
    r"""Multiply the learning rate by ``gamma`` every ``step_size`` epochs (torch's ``StepLR``).

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    step_size : int
        >= 1.
    gamma : float, default 0.1

    Raises
    ------
    ValueError
        ``step_size`` not an integer >= 1, ``gamma`` not a finite real.

    Notes
    -----
    Recursive: ``lr <- lr * gamma`` at the epochs ``e > 0`` with ``e % step_size == 0``
    (closed form, ``step(epoch)``: ``initial_lr * gamma ** (e // step_size)``).
    """

    def __init__(self, optimizer, step_size, gamma=0.1, last_epoch=-1):
        self.step_size = _check_int("step_size", step_size, 1)
        self.gamma = _check_real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        e = self.last_epoch
        if e == 0 or e % self.step_size != 0:
            return self._current_lrs()
        return [g["lr"] * self.gamma for g in self._groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """Multiply by ``gamma`` at each milestone epoch (``gamma ** k`` where a milestone is
    listed ``k`` times; torch's ``MultiStepLR``)."""

    def __init__(self, optimizer, milestones, gamma=0.1, last_epoch=-1):
        milestones = list(milestones)
        for m in milestones:
            _check_int("milestones", m, 0)
        self.milestones = Counter(milestones)
        self.gamma = _check_real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        if self.last_epoch not in self.milestones:
            return self._current_lrs()
        k = self.milestones[self.last_epoch]
        return [g["lr"] * self.gamma ** k for g in self._groups]

    def _get_closed_form_lr(self):
        ms = sorted(self.milestones.elements())
        return [base * self.gamma ** bisect_right(ms, self.last_epoch) for base in self.base_lrs]


class ConstantLR(LRScheduler):
    """``lr * factor`` until ``total_iters``, then back (times ``1.0 / factor``; torch's
    ``ConstantLR``)."""

    def __init__(self, optimizer, factor=1.0 / 3, total_iters=5, last_epoch=-1):
        self.factor = _check_real("factor", factor, 0, 1)
        self.total_iters = _check_int("total_iters", total_iters, 0)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        if self.last_epoch == 0:
            return [g["lr"] * self.factor for g in self._groups]
        if self.last_epoch != self.total_iters:
            return self._current_lrs()
        return [g["lr"] * (1.0 / self.factor) for g in self._groups]

    def _get_closed_form_lr(self):
        up = self.last_epoch >= self.total_iters
        return [base * (self.factor + up * (1 - self.factor)) for base in self.base_lrs]


class LinearLR(LRScheduler):
    r"""Linear change of the factor from ``start_factor`` to ``end_factor`` over
    ``total_iters`` epochs (torch's ``LinearLR``).

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    start_factor : float, default 1/3
        In (0, 1].
    end_factor : float, default 1.0
        In [0, 1].
    total_iters : int, default 5
        >= 1.

    Notes
    -----
    Epoch 0: ``lr * s``; epochs ``1 <= e <= T``: ``lr * (1 + (f - s) / (T s + (e - 1)(f - s)))``
    (the ratio of consecutive factors, applied to the current ``lr``); later: unchanged.
    """

    def __init__(self, optimizer, start_factor=1.0 / 3, end_factor=1.0, total_iters=5,
                 last_epoch=-1):
        _check_real("start_factor", start_factor, 0, 1)
        if start_factor <= 0:
            raise ValueError("`start_factor` must be in (0, 1]. "
                             f"Received: start_factor={start_factor!r}")
        self.start_factor = start_factor
        self.end_factor = _check_real("end_factor", end_factor, 0, 1)
        self.total_iters = _check_int("total_iters", total_iters, 1)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        s, f, t, e = self.start_factor, self.end_factor, self.total_iters, self.last_epoch
        if e == 0:
            return [g["lr"] * s for g in self._groups]
        if self._is_initial or e > t:
            return self._current_lrs()
        ratio = 1.0 + (f - s) / (t * s + (e - 1) * (f - s))
        return [g["lr"] * ratio for g in self._groups]

    def _get_closed_form_lr(self):
        s, f, t = self.start_factor, self.end_factor, self.total_iters
        return [base * (s + (f - s) * min(t, self.last_epoch) / t) for base in self.base_lrs]


class ExponentialLR(LRScheduler):
    """``lr <- lr * gamma`` every epoch (torch's ``ExponentialLR``; recursive: after ``n``
    steps ``((lr g) g)...``, not ``lr * g**n``)."""

    def __init__(self, optimizer, gamma, last_epoch=-1):
        self.gamma = _check_real("gamma", gamma)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        if self._is_initial:
            return self._current_lrs()
        return [g["lr"] * self.gamma for g in self._groups]

    def _get_closed_form_lr(self):
        return [base * self.gamma ** self.last_epoch for base in self.base_lrs]


class PolynomialLR(LRScheduler):
    """Polynomial decay to 0 over ``total_iters`` epochs (torch's ``PolynomialLR``)."""

    def __init__(self, optimizer, total_iters=5, power=1.0, last_epoch=-1):
        self.total_iters = _check_int("total_iters", total_iters, 1)
        self.power = _check_real("power", power)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        e, t = self.last_epoch, self.total_iters
        if self._is_initial or e > t:
            return self._current_lrs()
        factor = ((1.0 - e / t) / (1.0 - (e - 1) / t)) ** self.power
        return [g["lr"] * factor for g in self._groups]

    def _get_closed_form_lr(self):
        t = self.total_iters
        return [base * (1.0 - min(t, self.last_epoch) / t) ** self.power
                for base in self.base_lrs]


class CosineAnnealingLR(LRScheduler):
    r"""Cosine annealing from ``initial_lr`` to ``eta_min`` over ``T_max`` epochs (and back:
    torch's schedule is periodic, period ``2 T_max``), torch's ``CosineAnnealingLR``.

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    T_max : int
        >= 1.
    eta_min : float, default 0.0

    Notes
    -----
    Recursive, as torch: ``lr <- (1 + cos(pi e / T)) / (1 + cos(pi (e - 1) / T)) (lr -
    eta_min) + eta_min``; at ``(e - 1 - T) % 2T == 0`` (the bottom) ``lr <- lr + (base -
    eta_min)(1 - cos(pi / T)) / 2``; on the first step of a resumed scheduler the closed form
    ``eta_min + (base - eta_min)(1 + cos(e pi / T)) / 2``. The recursion drifts from that
    closed form in the last bits; if anything else changes ``lr`` it follows from there.
    """

    def __init__(self, optimizer, T_max, eta_min=0.0, last_epoch=-1):
        self.T_max = _check_int("T_max", T_max, 1)
        self.eta_min = _check_real("eta_min", eta_min)
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        e, t, lo = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current_lrs()
        if self._step_count == 1 and e > 0:
            return [lo + (base - lo) * (1 + math.cos(e * math.pi / t)) / 2
                    for base in self.base_lrs]
        if (e - 1 - t) % (2 * t) == 0:
            return [g["lr"] + (base - lo) * (1 - math.cos(math.pi / t)) / 2
                    for base, g in zip(self.base_lrs, self._groups)]
        ratio = (1 + math.cos(math.pi * e / t)) / (1 + math.cos(math.pi * (e - 1) / t))
        return [ratio * (g["lr"] - lo) + lo for g in self._groups]

    def _get_closed_form_lr(self):
        e, t, lo = self.last_epoch, self.T_max, self.eta_min
        return [lo + (base - lo) * (1 + math.cos(math.pi * e / t)) / 2 for base in self.base_lrs]


class CosineAnnealingWarmRestarts(LRScheduler):
    r"""Cosine annealing restarted every ``T_i`` epochs, ``T_i`` growing by ``T_mult``
    (SGDR; torch's ``CosineAnnealingWarmRestarts``).

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    T_0 : int
        Epochs of the first period, >= 1.
    T_mult : int, default 1
        >= 1.
    eta_min : float, default 0.0

    Notes
    -----
    ``lr = eta_min + (base - eta_min)(1 + cos(pi T_cur / T_i)) / 2`` from the base learning
    rate (no recursion on ``lr``), ``T_cur`` counted up and wrapped at ``T_i`` by ``step()``;
    ``step(epoch)`` takes a fractional epoch (within-epoch restarts), as torch.
    """

    def __init__(self, optimizer, T_0, T_mult=1, eta_min=0.0, last_epoch=-1):
        self.T_0 = _check_int("T_0", T_0, 1)
        self.T_i = self.T_0
        self.T_mult = _check_int("T_mult", T_mult, 1)
        self.eta_min = _check_real("eta_min", eta_min)
        self.T_cur = last_epoch
        super().__init__(optimizer, last_epoch)

    def get_lr(self):
        self._warn_outside_step()
        lo = self.eta_min
        return [lo + (base - lo) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2
                for base in self.base_lrs]

    def step(self, epoch=None):
        """Advance one epoch, or (a float) go to ``epoch`` (restarts computed from it)."""
        if epoch is None and self.last_epoch < 0:
            epoch = 0
        if epoch is None:
            epoch = self.last_epoch + 1
            self.T_cur = self.T_cur + 1
            if self.T_cur >= self.T_i:
                self.T_cur = self.T_cur % self.T_i
                self.T_i = self.T_i * self.T_mult
        else:
            if not isinstance(epoch, numbers.Real) or epoch < 0:
                raise ValueError(f"`epoch` must be a number >= 0. Received: epoch={epoch!r}")
            if epoch >= self.T_0:
                if self.T_mult == 1:
                    self.T_cur = epoch % self.T_0
                else:
                    n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
                    self.T_cur = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1)
                    self.T_i = self.T_0 * self.T_mult ** n
            else:
                self.T_i = self.T_0
                self.T_cur = epoch
        self.last_epoch = math.floor(epoch)
        self._in_step = True
        try:
            values = self.get_lr()
        finally:
            self._in_step = False
        for group, lr in zip(self._groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = self._current_lrs()


LRScheduler.step = _atomic_step(LRScheduler.step)


class OneCycleLR(LRScheduler):
    r"""The 1cycle policy (torch's ``OneCycleLR``): up from ``max_lr / div_factor`` to
    ``max_lr`` over ``pct_start`` of the steps, then down to ``initial_lr /
    final_div_factor`` (three phases with ``three_phase``); the momentum (``momentum``, or
    ``beta_1`` of an Adam-like optimizer) cycles inversely with ``cycle_momentum``.

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    max_lr : float or list of float
    total_steps : int, optional
        Or ``epochs * steps_per_epoch``.
    epochs, steps_per_epoch : int, optional
    pct_start : float, default 0.3
        A float in [0, 1].
    anneal_strategy : {"cos", "linear"}, default "cos"
    cycle_momentum : bool, default True
        Needs an optimizer with ``momentum`` or ``beta_1``/``beta_2``.
    base_momentum, max_momentum : float or list of float, default 0.85, 0.95
    div_factor, final_div_factor : float, default 25.0, 1e4
    three_phase : bool, default False

    Raises
    ------
    ValueError
        Invalid arguments (torch's checks, naming the argument and value); ``step()`` past
        ``total_steps``.

    Notes
    -----
    Within a phase from ``a`` to ``b`` over steps ``s0..s1``: ``pct = (e - s0) / (s1 - s0)``,
    ``cos``: ``b + (a - b) / 2 (cos(pi pct) + 1)``; ``linear``: ``(b - a) pct + a``. Computed
    from the phase ends, not recursively.
    """

    def __init__(self, optimizer, max_lr, total_steps=None, epochs=None, steps_per_epoch=None,
                 pct_start=0.3, anneal_strategy="cos", cycle_momentum=True, base_momentum=0.85,
                 max_momentum=0.95, div_factor=25.0, final_div_factor=1e4, three_phase=False,
                 last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        if total_steps is not None:
            self.total_steps = _check_int("total_steps", total_steps, 1)
        elif epochs is not None and steps_per_epoch is not None:
            self.total_steps = (_check_int("epochs", epochs, 1)
                                * _check_int("steps_per_epoch", steps_per_epoch, 1))
        else:
            raise ValueError("Give `total_steps`, or `epochs` and `steps_per_epoch`. Received: "
                             f"total_steps={total_steps!r}, epochs={epochs!r}, "
                             f"steps_per_epoch={steps_per_epoch!r}")
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError("`pct_start` must be a float in [0, 1]. "
                             f"Received: pct_start={pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError("`anneal_strategy` must be 'cos' or 'linear'. "
                             f"Received: anneal_strategy={anneal_strategy!r}")
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                {"end_step": float(pct_start * n) - 1, "start_lr": "initial_lr",
                 "end_lr": "max_lr", "start_momentum": "max_momentum",
                 "end_momentum": "base_momentum"},
                {"end_step": float(2 * pct_start * n) - 2, "start_lr": "max_lr",
                 "end_lr": "initial_lr", "start_momentum": "base_momentum",
                 "end_momentum": "max_momentum"},
                {"end_step": n - 1, "start_lr": "initial_lr", "end_lr": "min_lr",
                 "start_momentum": "max_momentum", "end_momentum": "max_momentum"},
            ]
        else:
            self._schedule_phases = [
                {"end_step": float(pct_start * n) - 1, "start_lr": "initial_lr",
                 "end_lr": "max_lr", "start_momentum": "max_momentum",
                 "end_momentum": "base_momentum"},
                {"end_step": n - 1, "start_lr": "max_lr", "end_lr": "min_lr",
                 "start_momentum": "base_momentum", "end_momentum": "max_momentum"},
            ]
        self._anneal_func_type = anneal_strategy
        groups = _param_groups(optimizer)
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for group, m in zip(groups, max_lrs):
                group["initial_lr"] = m / div_factor
                group["max_lr"] = m
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = bool(cycle_momentum)
        if self.cycle_momentum:
            defaults = _defaults(optimizer)
            if "momentum" not in defaults and "betas" not in defaults:
                raise ValueError("`cycle_momentum=True` needs an optimizer with `momentum` or "
                                 f"beta_1 (betas). Received: optimizer={optimizer!r}")
            self.use_beta1 = "betas" in defaults
            highs = _per_group("max_momentum", optimizer, max_momentum)
            lows = _per_group("base_momentum", optimizer, base_momentum)
            if last_epoch == -1:
                for hi, lo, group in zip(highs, lows, groups):
                    if self.use_beta1:
                        group["betas"] = (hi, *group["betas"][1:])
                    else:
                        group["momentum"] = hi
                    group["max_momentum"] = hi
                    group["base_momentum"] = lo
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self):
        self._warn_outside_step()
        e = self.last_epoch
        if e > self.total_steps:
            raise ValueError(f"Tried to step {e} times; total_steps is {self.total_steps}.")
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self._groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if e <= end or i == last:
                    pct = (e - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        mom = self._anneal(group[phase["start_momentum"]],
                                           group[phase["end_momentum"]], pct)
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (mom, *group["betas"][1:])
                else:
                    group["momentum"] = mom
        return lrs


class SequentialLR(LRScheduler):
    """Run ``schedulers`` one after another, switching at ``milestones`` (torch's
    ``SequentialLR``: the learning rate is reset to ``initial_lr`` and the schedulers' epochs
    moved back by one at construction; at a milestone the next scheduler restarts at epoch 0
    by its closed form where it has one)."""

    def __init__(self, optimizer, schedulers, milestones, last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("SequentialLR needs at least one scheduler. Received: "
                             "schedulers=[]")
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(  # noqa: TRY004 (torch's error type)
                    "SequentialLR cannot run ReduceLROnPlateau (its step takes a "
                                 f"metric). Received: schedulers[{i}]={s!r}")
            if not isinstance(s, LRScheduler):
                raise TypeError(f"schedulers[{i}] must be a refopt.lr_scheduler scheduler. "
                                f"Received: {s!r}")
            if s.optimizer is not optimizer:
                raise ValueError(f"schedulers[{i}] drives another optimizer than "
                                 "SequentialLR's.")
        milestones = list(milestones)
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(f"SequentialLR needs one milestone fewer than schedulers "
                             f"({len(schedulers)}). Received: milestones={milestones!r}")
        self._schedulers = schedulers
        self._milestones = milestones
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in _param_groups(optimizer):
            group["lr"] = group["initial_lr"]
        self._undo(self)
        idx = bisect_right(self._milestones, 0)
        self._schedulers[idx]._initial_step()
        self._last_lr = self._schedulers[idx].get_last_lr()

    def _undo(self, sched):
        if hasattr(sched, "_schedulers"):
            for s in sched._schedulers:
                self._undo(s)
        elif hasattr(sched, "last_epoch"):
            sched.last_epoch -= 1

    def step(self):
        """Advance the scheduler in charge at the new epoch (restarting it at a milestone)."""
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        sched = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            sched._update_lr(0)
        else:
            sched.step()
        self._last_lr = sched.get_last_lr()

    def state_dict(self):
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return state

    def load_state_dict(self, state_dict):
        state = dict(state_dict)
        subs = state.pop("_schedulers")
        self.__dict__.update(state)
        for s, sub in zip(self._schedulers, subs):
            s.load_state_dict(sub)


class ChainedScheduler(LRScheduler):
    """Step every scheduler of ``schedulers`` at each step (torch's ``ChainedScheduler``:
    their recursive factors multiply)."""

    def __init__(self, schedulers, optimizer=None):
        schedulers = list(schedulers)
        if not schedulers:
            raise ValueError("ChainedScheduler needs at least one scheduler. Received: "
                             "schedulers=[]")
        optimizer = optimizer or schedulers[0].optimizer
        for i, s in enumerate(schedulers):
            if isinstance(s, ReduceLROnPlateau):
                raise ValueError(  # noqa: TRY004 (torch's error type)
                    "ChainedScheduler cannot run ReduceLROnPlateau (its step "
                                 f"takes a metric). Received: schedulers[{i}]={s!r}")
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(f"schedulers[{i}] drives another optimizer.")
        self._schedulers = schedulers
        self.optimizer = optimizer
        self._last_lr = self._current_lrs()

    def step(self):
        """Step each scheduler in order."""
        for s in self._schedulers:
            s.step()
        self._last_lr = self._current_lrs()

    state_dict = SequentialLR.state_dict
    load_state_dict = SequentialLR.load_state_dict


class ReduceLROnPlateau(LRScheduler):
    r"""Multiply the learning rate by ``factor`` when a metric stops improving (torch's
    ``ReduceLROnPlateau``); ``step(metrics)`` takes the metric.

    Parameters
    ----------
    optimizer : refopt.Optimizer or an object with ``param_groups``
    mode : {"min", "max"}, default "min"
    factor : float, default 0.1
        < 1.
    patience : int, default 10
        Bad epochs tolerated before a reduction.
    threshold : float, default 1e-4
    threshold_mode : {"rel", "abs"}, default "rel"
        Better means ``a < best (1 - threshold)`` (``rel``, mode ``min``), ``a < best -
        threshold`` (``abs``); mirrored for ``max``.
    cooldown : int, default 0
        Epochs after a reduction during which bad epochs are not counted.
    min_lr : float or list of float, default 0
    eps : float, default 1e-8
        A reduction smaller than this is skipped.

    Raises
    ------
    ValueError
        ``factor >= 1``, an unknown ``mode`` or ``threshold_mode``, a ``min_lr`` list of the
        wrong length.

    Notes
    -----
    A reduction sets ``lr <- max(lr * factor, min_lr)`` where ``lr - new > eps``.
    """

    def __init__(self, optimizer, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0, eps=1e-8):
        _check_optimizer(optimizer, type(self).__name__)
        if not isinstance(factor, numbers.Real) or factor >= 1.0:
            raise ValueError(f"`factor` must be < 1.0. Received: factor={factor!r}")
        self.factor = factor
        self.optimizer = optimizer
        n = len(_param_groups(optimizer))
        if isinstance(min_lr, (list, tuple)):
            if len(min_lr) != n:
                raise ValueError(f"`min_lr` must have one value per parameter group ({n}). "
                                 f"Received: min_lr={min_lr!r}")
            self.default_min_lr = None
            self.min_lrs = list(min_lr)
        else:
            self.default_min_lr = min_lr
            self.min_lrs = [min_lr] * n
        self.patience = _check_int("patience", patience, 0)
        self.cooldown = _check_int("cooldown", cooldown, 0)
        self.eps = eps
        self.last_epoch = 0
        self._last_lr = self._current_lrs()
        self._init_is_better(mode, threshold, threshold_mode)
        self._reset()

    def _reset(self):
        self.best = self.mode_worse
        self.cooldown_counter = 0
        self.num_bad_epochs = 0

    def _init_is_better(self, mode, threshold, threshold_mode):
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max'. Received: mode={mode!r}")
        if threshold_mode not in ("rel", "abs"):
            raise ValueError("`threshold_mode` must be 'rel' or 'abs'. "
                             f"Received: threshold_mode={threshold_mode!r}")
        self.mode_worse = math.inf if mode == "min" else -math.inf
        self.mode, self.threshold, self.threshold_mode = mode, threshold, threshold_mode

    def _is_better(self, a, best):
        if self.mode == "min":
            if self.threshold_mode == "rel":
                return a < best * (1.0 - self.threshold)
            return a < best - self.threshold
        if self.threshold_mode == "rel":
            return a > best * (self.threshold + 1.0)
        return a > best + self.threshold

    @property
    def in_cooldown(self):
        """bool: within ``cooldown`` epochs of the last reduction."""
        return self.cooldown_counter > 0

    def step(self, metrics, epoch=None):
        """Record ``metrics`` (a number) for the next epoch; reduce on a plateau."""
        current = float(metrics)
        if epoch is None:
            epoch = self.last_epoch + 1
        else:
            warnings.warn(_EPOCH_WARNING, UserWarning, stacklevel=2)
        self.last_epoch = epoch
        if self._is_better(current, self.best):
            self.best = current
            self.num_bad_epochs = 0
        else:
            self.num_bad_epochs += 1
        if self.in_cooldown:
            self.cooldown_counter -= 1
            self.num_bad_epochs = 0
        if self.num_bad_epochs > self.patience:
            self._reduce_lr()
            self.cooldown_counter = self.cooldown
            self.num_bad_epochs = 0
        self._last_lr = self._current_lrs()

    def _reduce_lr(self):
        groups = self._groups
        if len(groups) != len(self.min_lrs):
            if self.default_min_lr is None:
                raise RuntimeError("The optimizer now has a different number of parameter "
                                   "groups than when ReduceLROnPlateau was built; set "
                                   "`min_lrs` to match.")
            self.min_lrs = [self.default_min_lr] * len(groups)
        for i, group in enumerate(groups):
            old = float(group["lr"])
            new = max(old * self.factor, self.min_lrs[i])
            if old - new > self.eps:
                group["lr"] = new

    def load_state_dict(self, state_dict):
        """Restore :meth:`state_dict`'s values."""
        self.__dict__.update(state_dict)
        self._init_is_better(self.mode, self.threshold, self.threshold_mode)


class SWALR(LRScheduler):
    r"""Anneal the learning rate to ``swa_lr`` over ``anneal_epochs`` epochs, then hold it
    (``torch.optim.swa_utils.SWALR``, kept here with the other schedulers).

    Parameters
    ----------
    optimizer, last_epoch
        See :class:`LRScheduler`.
    swa_lr : float or list of float
        The learning rate to reach (per group).
    anneal_epochs : int, default 10
        >= 0.
    anneal_strategy : {"cos", "linear"}, default "cos"

    Notes
    -----
    torch's recursive form: with ``a(t) = (1 - cos(pi t)) / 2`` (``cos``) or ``t``, ``s`` the
    steps taken and ``A = anneal_epochs``, the previous step's starting learning rate is
    recovered from the current one, ``l0 = (lr - a_prev swa_lr) / (1 - a_prev)`` (``swa_lr``
    when ``a_prev = 1``), and ``lr <- swa_lr a + l0 (1 - a)`` with ``a = a(clip(s / A))``,
    ``a_prev = a(clip((s - 1) / A))``.
    """

    def __init__(self, optimizer, swa_lr, anneal_epochs=10, anneal_strategy="cos",
                 last_epoch=-1):
        _check_optimizer(optimizer, type(self).__name__)
        for group, target in zip(_param_groups(optimizer),
                                 _per_group("swa_lr", optimizer, swa_lr)):
            group["swa_lr"] = target
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError("`anneal_strategy` must be 'cos' or 'linear'. "
                             f"Received: anneal_strategy={anneal_strategy!r}")
        self._anneal_strategy = anneal_strategy
        self.anneal_epochs = _check_int("anneal_epochs", anneal_epochs, 0)
        super().__init__(optimizer, last_epoch)

    def _anneal(self, t):
        if self._anneal_strategy == "cos":
            return (1 - math.cos(math.pi * t)) / 2
        return t

    def get_lr(self):
        self._warn_outside_step()
        step = self._step_count - 1
        if self.anneal_epochs == 0:
            step = max(1, step)
        span = max(1, self.anneal_epochs)
        prev_alpha = self._anneal(max(0, min(1, (step - 1) / span)))
        alpha = self._anneal(max(0, min(1, step / span)))
        out = []
        for group in self._groups:
            target = group["swa_lr"]
            if prev_alpha == 1:
                start = target
            else:
                start = (group["lr"] - prev_alpha * target) / (1 - prev_alpha)
            out.append(target * alpha + start * (1 - alpha))
        return out


def from_config(optimizer, config):
    """A scheduler on ``optimizer`` from ``{"class_name": name, "config": keywords}``.

    ``name`` is a class of this module (torch's name); for ``SequentialLR`` and
    ``ChainedScheduler`` ``config["schedulers"]`` is a list of such dicts, built in order on
    the same optimizer (as torch's code would build them). This is how golden cases name
    their scheduler (``lr_scheduler`` in the manifest).

    Raises
    ------
    ValueError
        An unknown ``class_name``, or what the class raises.
    """
    name = config.get("class_name") if isinstance(config, dict) else None
    cls = globals().get(name) if name in __all__ else None
    if cls is None or cls is LRScheduler:
        raise ValueError(f"`class_name` must be a scheduler of refopt.lr_scheduler. "
                         f"Received: {config!r}")
    kwargs = dict(config.get("config", {}))
    if "schedulers" in kwargs:
        kwargs["schedulers"] = [from_config(optimizer, c) for c in kwargs["schedulers"]]
    if cls is ChainedScheduler:
        return cls(optimizer=optimizer, **kwargs)
    return cls(optimizer, **kwargs)
