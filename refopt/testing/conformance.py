r"""Check that another implementation of an optimizer computes what refopt computes.

:func:`assert_conforms` draws trajectories with Hypothesis (:mod:`refopt.testing.strategies`)
and hands each to :func:`check_trajectory`, which replays it through the *candidate* and through
refopt's reference backend, compares the variables and every state slot after each step in
units in the last place (:func:`ulp_distance`), and **resyncs** the candidate to the reference
after each step, so that every step is checked from the same state and an error of step 2 does
not show up again, amplified, in step 3. On failure Hypothesis shrinks the input, and a
:class:`ConformanceError` (an ``AssertionError``) names the first diverging step, the variable
and slot, the error in ulp, the values, the state before the step and the shrunk input.

The candidate
-------------
Two shapes are accepted (``kind="auto"`` tells them apart: a class, or a callable with a
``**kwargs`` parameter, is a factory; any other callable is a step function).

**(a) A factory of stateful optimizers**, ``candidate(**config) -> optimizer``, called with the
drawn constructor arguments under refopt's names (``learning_rate``, ``beta_1``, ``beta_2``,
``epsilon``, ``amsgrad``, ``momentum``, ``nesterov``, ``weight_decay``, ``clipnorm``, ...; only
those drawn or fixed by ``config``). The optimizer must have

- ``apply_gradients(grads_and_vars)``: a list of ``(gradient, variable)`` pairs, where each
  variable is a NumPy array owned by the checker (the same objects at every step) that the
  candidate updates **in place**, and each gradient an ndarray or :class:`refopt.IndexedSlices`.
  The checker writes the reference's values into these arrays between steps, so a candidate
  that keeps its own copy of the weights must read them back at every call.
- ``get_slot(variable, name) -> array``: the state array ``name`` of a variable, after a step.
- either ``set_slot(variable, name, value)``, or ``get_slot`` returning *live* arrays that the
  checker overwrites with ``np.copyto`` (refopt's and tf-keras' optimizers do). The checker
  verifies that the write took.

Every refopt optimizer class is such a factory: ``assert_conforms(refopt.Adam)`` passes.

**(b) A pure step function**, ``step(params, grads, state, hyper, t) -> (params, state)``:

- ``params``: list of ndarray, the variables before the step (copies; may be modified);
- ``grads``: list of ndarray or IndexedSlices, one per variable;
- ``state``: list (one per variable) of dicts ``{name: ndarray}`` holding the slots of the
  candidate's names (zeros before step 1; EMA averages start as copies of the variables);
- ``hyper``: every hyperparameter of the refopt optimizer (its ``get_config()`` without
  ``name``, ``backend``, ``convention``, ``jit_compile``, ``is_legacy_optimizer``: refopt's
  defaults included, e.g. ``weight_decay=None``, ``use_ema=False``), except that
  ``learning_rate`` is the float that this step uses (a schedule already evaluated at
  ``t - 1``, rounded to float32);
- ``t``: the 1-based step number (refopt's ``iterations + 1``);

and returns the new variables (list of arrays) and the new state (same structure).

Slot names
----------
refopt's slots are ``m``, ``v`` and, with AMSGrad, ``vhat`` (Adam family), ``m`` (SGD, a
velocity that includes ``-lr``), and ``average`` with ``use_ema``. ``slot_map`` maps them to the
candidate's names, e.g. for ``torch.optim.Adam``
``{"m": "exp_avg", "v": "exp_avg_sq", "vhat": "max_exp_avg_sq"}``; a name missing from the map
is used as is, and a name mapped to ``None`` is neither compared nor resynced (for state the
candidate does not have). The default is the candidate's ``slot_map`` attribute, if any.

Comparison
----------
Arrays must have the reference's shape and dtype. Elements are compared with
:func:`ulp_distance`: ``+0.0`` and ``-0.0`` are 0 ulp apart, NaN matches NaN (whatever the
payload) and is infinitely far from any number, and ``inf`` is 1 ulp above the largest finite
value. An element fails when its distance exceeds ``tolerance_ulp`` (0: bit for bit).
"""

from __future__ import annotations

import inspect
import numbers
import re

import numpy as np

from refopt.testing._hypothesis import missing_hypothesis
from refopt.testing.trajectory import (
    OPTIMIZERS,
    Trajectory,
    copy_gradient,
    default_convention,
    format_array,
    format_trajectory,
    optimizer_class,
    slot_names,
    snapshot,
)

__all__ = ["ConformanceError", "assert_conforms", "check_trajectory", "ulp_distance"]

_INT_VIEW = {2: np.int16, 4: np.int32, 8: np.int64}
_VARY = ("weight_decay", "clipping", "ema", "schedules")
_NOT_HYPERPARAMETERS = ("name", "jit_compile", "is_legacy_optimizer", "backend", "convention")


class ConformanceError(AssertionError):
    """A candidate diverged from refopt, or failed while being checked.

    Attributes
    ----------
    step : int
        The first diverging step (1-based).
    mismatches : list of dict
        One per array that failed at that step, with keys ``variable`` (index), ``array``
        (``"params"`` or a refopt slot name), ``candidate_name`` (the candidate's slot name),
        ``max_ulp`` (float; ``inf`` for a NaN mismatch, ``nan`` for a shape or dtype mismatch),
        ``count`` (elements over tolerance), ``index``, ``actual`` and ``expected`` (values at
        the worst element) and ``problem`` (a shape or dtype mismatch, else ``None``). Empty
        when the candidate raised.
    trajectory : refopt.testing.Trajectory
        The input that shows the divergence (shrunk, when it comes from :func:`assert_conforms`).
    report : str
        The readable report, also the exception's message.
    """

    def __init__(self, report, *, step=None, mismatches=(), trajectory=None):
        super().__init__(report)
        self.report = report
        self.step = step
        self.mismatches = list(mismatches)
        self.trajectory = trajectory


# --------------------------------------------------------------------------------- ulp
def _ordered(a):
    """Map floats to int64 so that consecutive floats are consecutive integers (+-0 -> 0)."""
    bits = a.view(_INT_VIEW[a.dtype.itemsize]).astype(np.int64)
    magnitude = bits & np.int64(np.iinfo(_INT_VIEW[a.dtype.itemsize]).max)
    return np.where(bits < 0, -magnitude, magnitude)


def ulp_distance(actual, desired):
    """Element-wise distance between two float arrays in units in the last place.

    Parameters
    ----------
    actual, desired : ndarray of float16, float32 or float64 (or ml_dtypes.bfloat16)
        Same shape and dtype.

    Returns
    -------
    ndarray of float64, same shape
        The number of representable values of the dtype between the two elements, plus one
        (0 for equal values, 1 for neighbours). ``+0.0`` and ``-0.0`` are 0 apart; two NaNs are
        0 apart; a NaN and a number are ``inf`` apart; ``inf`` is 1 above the largest finite
        value. Exact up to 2**53.

    Raises
    ------
    TypeError
        If an input is not a float16/32/64 array or the dtypes differ.
    ValueError
        If the shapes differ.

    Examples
    --------
    >>> import numpy as np
    >>> one = np.float32(1)
    >>> ulp_distance(np.array([one, np.nextafter(one, 2), -0.0, np.nan], np.float32),
    ...              np.array([one, one, 0.0, 1.0], np.float32))
    array([ 0.,  1.,  0., inf])
    """
    a, d = np.asarray(actual), np.asarray(desired)
    for name, x in (("actual", a), ("desired", d)):
        if x.dtype not in (np.float16, np.float32, np.float64) and x.dtype.name != "bfloat16":
            raise TypeError(f"`{name}` must be a float16/32/64 array. Received: dtype={x.dtype}")
    if a.dtype != d.dtype:
        raise TypeError(f"The dtypes differ. Received: actual {a.dtype}, desired {d.dtype}")
    if a.shape != d.shape:
        raise ValueError(f"The shapes differ. Received: actual {a.shape}, desired {d.shape}")
    oa, od = _ordered(a), _ordered(d)
    same_side = (oa >= 0) == (od >= 0)
    # Opposite signs can need 64 bits for float64 (|oa| + |od| < 2**64): add as uint64.
    across = np.abs(oa).astype(np.uint64) + np.abs(od).astype(np.uint64)
    dist = np.where(same_side, np.abs(oa - od).astype(np.uint64), across).astype(np.float64)
    na, nd = np.isnan(a), np.isnan(d)
    dist[na & nd] = 0.0
    dist[na ^ nd] = np.inf
    return dist


# --------------------------------------------------------------------------------- candidates
def _candidate_kind(candidate, kind):
    if kind not in ("auto", "stateful", "step"):
        raise ValueError(f"`kind` must be 'auto', 'stateful' or 'step'. Received: kind={kind!r}")
    if not callable(candidate):
        raise TypeError(
            "`candidate` must be a factory of optimizers or a step function. "
            f"Received: candidate={candidate!r} of type {type(candidate).__name__}"
        )
    if kind != "auto":
        return kind
    if isinstance(candidate, type):
        return "stateful"
    try:
        params = inspect.signature(candidate).parameters.values()
    except (TypeError, ValueError):  # some builtins have no signature
        return "stateful"
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return "stateful"
    return "step"


#: Every slot name of refopt's optimizers (Adam: m, v, vhat; SGD: m; with EMA: average).
_ALL_SLOTS = ("m", "v", "vhat", "average")


def _slot_map(candidate, slot_map):
    slot_map = getattr(candidate, "slot_map", None) if slot_map is None else slot_map
    if slot_map is None:
        return {}
    if not isinstance(slot_map, dict):
        raise TypeError(
            f"`slot_map` must be a dict of refopt slot names to the candidate's. "
            f"Received: slot_map={slot_map!r}"
        )
    return slot_map


def _check_tolerance(tolerance_ulp):
    if isinstance(tolerance_ulp, bool) or not isinstance(tolerance_ulp, numbers.Real) \
            or not tolerance_ulp >= 0:
        raise ValueError(
            f"`tolerance_ulp` must be a number >= 0. Received: tolerance_ulp={tolerance_ulp!r}"
        )


def _name(candidate):
    return getattr(candidate, "__qualname__", None) or type(candidate).__name__


def _value(x):
    x = np.asarray(x)[()]
    hexa = re.sub(r"\.?0*p", "p", float(x).hex()) if np.isfinite(x) else str(x)
    return f"{str(x)} ({hexa})"


def _compare(got, want, tolerance_ulp):
    """None when within tolerance, else a dict describing the failure."""
    try:
        got = np.asarray(got)
    except Exception as exc:  # noqa: BLE001 - anything that is not array-like
        return {"problem": f"not an array ({type(got).__name__}: {exc})", "max_ulp": np.nan,
                "count": want.size}
    if got.shape != want.shape:
        return {"problem": f"shape {got.shape}, expected {want.shape}", "max_ulp": np.nan,
                "count": want.size}
    if got.dtype != want.dtype:
        return {"problem": f"dtype {got.dtype}, expected {want.dtype}", "max_ulp": np.nan,
                "count": want.size}
    dist = ulp_distance(got, want)
    bad = dist > tolerance_ulp
    if not bad.any():
        return None
    worst = np.unravel_index(int(np.argmax(dist)), dist.shape)
    return {"problem": None, "max_ulp": float(dist[worst]), "count": int(bad.sum()),
            "size": dist.size, "index": tuple(int(i) for i in worst),
            "actual": got[worst], "expected": want[worst]}


def _describe_mismatch(m, shape, tolerance_ulp):
    what = "params" if m["array"] == "params" else f"slot {m['array']!r}"
    if m["array"] != "params" and m["candidate_name"] != m["array"]:
        what += f" (candidate: {m['candidate_name']!r})"
    head = f"variable {m['variable']} (shape {shape}), {what}: "
    if m["problem"]:
        return head + m["problem"]
    err = "NaN on one side only" if m["max_ulp"] == np.inf else f"{m['max_ulp']:.0f} ulp"
    return (head + f"{m['count']} of {m['size']} element(s) off by more than {tolerance_ulp} "
            f"ulp; worst at index {m['index']}: {err}, candidate {_value(m['actual'])}, "
            f"reference {_value(m['expected'])}")


def _state_lines(state, compared):
    lines = []
    for i, p in enumerate(state.params):
        lines.append(f"    variable {i}: {format_array(p, '      ')}")
        for ref_name, _ in compared:
            lines.append(f"      {ref_name}: {format_array(state.slots[ref_name][i], '        ')}")
    return lines


def check_trajectory(candidate, trajectory, *, tolerance_ulp=0, slot_map=None, kind="auto"):
    """Replay one trajectory through a candidate and refopt, step by step, with resync.

    Parameters
    ----------
    candidate : callable
        A factory of stateful optimizers or a step function (see the module docstring).
    trajectory : refopt.testing.Trajectory
        The configuration, initial variables and gradients; e.g. from
        :func:`refopt.testing.strategies.trajectories` or
        :func:`refopt.testing.golden.make_trajectory`.
    tolerance_ulp : int or float, default 0
        Largest accepted :func:`ulp_distance` per element (0: bit for bit).
    slot_map : dict of str to (str or None), optional
        refopt slot name -> candidate slot name (``None``: not compared). Default: the
        candidate's ``slot_map`` attribute, else the identity.
    kind : {"auto", "stateful", "step"}, default "auto"
        How to call the candidate.

    Raises
    ------
    ConformanceError
        At the first step where a variable or slot differs by more than ``tolerance_ulp``, or
        where the candidate raises (chained as ``__cause__``), returns something malformed or
        does not accept the resync.
    TypeError, ValueError
        For arguments that cannot work (not callable, unknown ``kind``, negative tolerance);
        ``ValueError`` too when the candidate has no slot that refopt keeps (``get_slot`` or
        the returned state raises ``KeyError``), with how to map it or leave it out.
    NotImplementedError
        From refopt, for a convention or backend it does not have.
    """
    _check_tolerance(tolerance_ulp)
    kind = _candidate_kind(candidate, kind)
    smap = _slot_map(candidate, slot_map)
    ref = trajectory.make_optimizer()
    known = list(dict.fromkeys(_ALL_SLOTS + tuple(ref._slot_names()) + ("average",)))
    unknown = sorted(set(smap) - set(known))
    if unknown:  # a typo would otherwise silently compare nothing under that name
        raise ValueError(
            f"`slot_map` names slots no refopt optimizer has: {unknown}; refopt's slots are "
            f"{known}. Received: slot_map={smap!r}"
        )
    ref_vars = [a.copy() for a in trajectory.initial]
    ref.build(ref_vars)
    compared = [(n, smap.get(n, n)) for n in slot_names(ref) if smap.get(n, n) is not None]
    n_vars = len(ref_vars)
    # Every hyperparameter for step functions (learning_rate is replaced by each step's value).
    full_config = {k: v for k, v in ref.get_config().items() if k not in _NOT_HYPERPARAMETERS}
    opt_name = getattr(trajectory.optimizer, "__name__", trajectory.optimizer)
    title = (f"candidate {_name(candidate)} does not conform to refopt {opt_name} "
             f"(convention {trajectory.convention!r}, {trajectory.dtype.name}, tolerance "
             f"{tolerance_ulp} ulp)")

    def fail(step, lines, before=None, hyper=None, mismatches=(), cause=None):
        text = [title, f"first divergence at step {step} of {trajectory.steps}", *lines]
        if hyper is not None:
            text.append(f"hyperparameters of this step: {hyper}")
        if before is not None:
            text.append(f"state before step {step} (the reference's; the candidate started from "
                        "it too):")
            text += _state_lines(before, compared)
        text.append("input:")
        text.append("  " + format_trajectory(trajectory, upto=step).replace("\n", "\n  "))
        err = ConformanceError("\n".join(text), step=step, mismatches=mismatches,
                               trajectory=trajectory)
        if cause is not None:
            raise err from cause
        raise err

    cand = None
    cand_vars = [a.copy() for a in trajectory.initial]
    if kind == "stateful":
        try:
            cand = candidate(**trajectory.config)
        except Exception as exc:  # noqa: BLE001 - reported as a failure of the candidate
            fail(1, [f"the candidate factory raised {exc!r} for config {trajectory.config}"],
                 cause=exc)

    for k, grads in enumerate(trajectory.gradients, 1):
        before = snapshot(ref, ref_vars)
        ref.apply_gradients(zip([copy_gradient(g) for g in grads], ref_vars))
        after = snapshot(ref, ref_vars)
        hyper = dict(full_config, learning_rate=ref.learning_rate)
        try:
            if kind == "stateful":
                cand.apply_gradients([(copy_gradient(g), v) for g, v in zip(grads, cand_vars)])
                got_params = cand_vars
            else:
                state_in = [{c: before.slots[r][i].copy() for r, c in compared}
                            for i in range(n_vars)]
                result = candidate([p.copy() for p in before.params],
                                   [copy_gradient(g) for g in grads], state_in, dict(hyper), k)
                got_params, got_state = _unpack_step_result(result, n_vars)
        except Exception as exc:  # noqa: BLE001 - reported as a failure of the candidate
            fail(k, [f"the candidate raised {exc!r}"], before, hyper, cause=exc)
        got_slots = {}
        for r, c in compared:
            try:
                if kind == "stateful":
                    got_slots[r] = [cand.get_slot(v, c) for v in cand_vars]
                else:
                    got_slots[r] = [got_state[i][c] for i in range(n_vars)]
            except KeyError as exc:  # a slot the candidate does not keep: a usage problem
                raise _MissingSlotError(_missing_slot_hint(candidate, opt_name, ref, r, c, kind,
                                                           exc, smap)) from exc
            except Exception as exc:  # noqa: BLE001 - reported as a failure of the candidate
                fail(k, [f"reading slot {c!r} of the candidate raised {exc!r}"], before, hyper,
                     cause=exc)

        mismatches = []
        arrays = [("params", "params", got_params, after.params)]
        arrays += [(r, c, got_slots[r], after.slots[r]) for r, c in compared]
        for i in range(n_vars):
            for ref_name, cand_name, got, want in arrays:
                m = _compare(got[i], want[i], tolerance_ulp)
                if m is not None:
                    m.update(variable=i, array=ref_name, candidate_name=cand_name)
                    mismatches.append(m)
        if mismatches:
            lines = [_describe_mismatch(m, ref_vars[m["variable"]].shape, tolerance_ulp)
                     for m in mismatches]
            fail(k, lines, before, hyper, mismatches)

        if kind == "stateful" and k < trajectory.steps:
            _resync(cand, cand_vars, after, compared, fail, k)


class _MissingSlotError(ValueError):
    """The candidate has no slot refopt keeps: a usage problem, not a divergence."""


def _missing_slot_hint(candidate, opt_name, ref, ref_name, cand_name, kind, exc, smap):
    how = (f"get_slot(variable, {cand_name!r})" if kind == "stateful"
           else f"the returned state[i][{cand_name!r}]")
    renamed = "" if cand_name == ref_name else f" (refopt's {ref_name!r}, by slot_map)"
    example = _TORCH_NAMES.get(ref_name)
    whose = " (torch.optim's name)" if example else ""
    example = example or "its_name"
    return (
        f"candidate {_name(candidate)} has no slot {cand_name!r}{renamed}: {how} raised "
        f"{exc!r}. refopt's {opt_name} with this configuration keeps {list(slot_names(ref))}. "
        f"Name the candidate's own slot with slot_map={{{ref_name!r}: {example!r}}}{whose}, "
        f"or slot_map={{{ref_name!r}: None}} "
        f"if it keeps no such state (then it is neither compared nor resynced)"
        + (", or config={'amsgrad': False} if it has no AMSGrad" if ref_name == "vhat" else "")
        + f". Received: slot_map={smap!r}"
    )


#: torch.optim's names of refopt's slots, for the hint above.
_TORCH_NAMES = {"v": "exp_avg_sq", "vhat": "max_exp_avg_sq", "velocity": "square_avg",
                "average_gradient": "grad_avg"}


def _unpack_step_result(result, n_vars):
    try:
        params, state = result
        params, state = list(params), list(state)
    except (TypeError, ValueError):
        raise TypeError(
            f"the step function must return (params, state). Received: {type(result).__name__}"
        ) from None
    if len(params) != n_vars or len(state) != n_vars:
        raise ValueError(
            f"the step function returned {len(params)} params and {len(state)} states for "
            f"{n_vars} variables"
        )
    return params, state


def _resync(cand, cand_vars, after, compared, fail, k):
    for i, var in enumerate(cand_vars):
        np.copyto(var, after.params[i])
        for ref_name, cand_name in compared:
            value = after.slots[ref_name][i]
            try:
                if hasattr(cand, "set_slot"):
                    cand.set_slot(var, cand_name, value.copy())
                else:
                    np.copyto(cand.get_slot(var, cand_name), value)
                back = np.asarray(cand.get_slot(var, cand_name))
            except Exception as exc:  # noqa: BLE001 - reported as a failure of the candidate
                fail(k, [f"resyncing slot {cand_name!r} of variable {i} after step {k} raised "
                         f"{exc!r}"], cause=exc)
            took = back.shape == value.shape and (
                ulp_distance(back.astype(value.dtype), value) == 0).all()
            if not took:
                fail(k, [f"resyncing slot {cand_name!r} of variable {i} after step {k} did not "
                         "take: get_slot() returned a copy, so the candidate needs "
                         "set_slot(variable, name, value)"])


def assert_conforms(candidate, *, optimizer="Adam", config=None, dtype="float32",
                    convention=None, steps=3, max_examples=50, tolerance_ulp=0, seed=0,
                    sparse=None, vary=(), slot_map=None, kind="auto", max_variables=2,
                    allow_nonfinite=False, extreme=False):
    """Assert that a candidate implementation computes refopt's trajectories.

    Draws up to ``max_examples`` trajectories with
    :func:`refopt.testing.strategies.trajectories` and runs :func:`check_trajectory` on each.
    On the first failure Hypothesis shrinks the input (fewer steps, fewer and smaller
    variables, simpler numbers) and the error reports the minimal example.

    Parameters
    ----------
    candidate : callable
        A factory of stateful optimizers or a pure step function; see the module docstring of
        :mod:`refopt.testing.conformance` for both interfaces.
    optimizer : {"Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad"} or type, default "Adam"
        The refopt optimizer to compare with, or your own subclass of ``refopt.Optimizer``.
    config : dict, optional
        Constructor arguments to fix (refopt names; e.g. ``{"amsgrad": True}``); the optimizer's
        other own hyperparameters are drawn in their valid ranges.
    dtype : {"float16", "float32", "float64"}, default "float32"
    convention : str, optional
        Passed to refopt (an optimizer a convention lacks raises ``ValueError``). Default: the
        optimizer's own (``"tf_keras"``; ``"torch"`` for RAdam, ASGD, Rprop).
    steps : int, default 3
        Most steps per trajectory (Hypothesis draws 1 to ``steps``).
    max_examples : int, default 50
        Most trajectories tried.
    tolerance_ulp : int or float, default 0
        Largest accepted distance per element, in ulp (0: bit for bit).
    seed : int or None, default 0
        Hypothesis seed, for a reproducible run; ``None`` draws new examples every run.
    sparse : bool, optional
        Draw :class:`~refopt.IndexedSlices` gradients too; default True for LazyAdam only.
    vary : sequence of str, default ()
        Pipeline options to draw as well: any of ``"weight_decay"``, ``"clipping"``, ``"ema"``,
        ``"schedules"`` (a foreign optimizer usually has none of them; refopt backends have all).
    slot_map : dict, optional
        refopt slot name -> candidate slot name, ``None`` to skip a slot; default the
        candidate's ``slot_map`` attribute, else the identity.
    kind : {"auto", "stateful", "step"}, default "auto"
        How to call the candidate.
    max_variables : int, default 2
        Most variables per trajectory.
    allow_nonfinite, extreme : bool, default False
        Gradients with NaN/inf elements; gradients over the whole finite range of the dtype.

    Raises
    ------
    ConformanceError
        (an ``AssertionError``) on divergence, with the report described in
        :class:`ConformanceError`, plus the settings to reproduce it.
    TypeError, ValueError
        For invalid arguments (named in the message), including a ``config`` refopt refuses.
    NotImplementedError
        From refopt, for a convention it does not have.
    ModuleNotFoundError
        If Hypothesis is not installed (the message names ``pip install "refopt[testing]"``).

    Examples
    --------
    >>> import refopt
    >>> from refopt.testing import assert_conforms
    >>> assert_conforms(refopt.Adam, config={"amsgrad": True}, max_examples=5)
    """
    try:
        from hypothesis import HealthCheck, Verbosity, given, settings
        from hypothesis import seed as hypothesis_seed
    except ImportError as exc:
        raise missing_hypothesis("refopt.testing.assert_conforms", exc) from exc

    from refopt.testing import strategies

    if not isinstance(optimizer, type) and optimizer not in OPTIMIZERS:
        raise ValueError(
            f"`optimizer` must be one of {OPTIMIZERS} or a refopt.Optimizer subclass. "
            f"Received: optimizer={optimizer!r}"
        )
    for name, value, low in (("steps", steps, 1), ("max_examples", max_examples, 1),
                             ("max_variables", max_variables, 1)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}. Received: {name}={value!r}")
    _check_tolerance(tolerance_ulp)
    vary = (vary,) if isinstance(vary, str) else tuple(vary)
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
        raise ValueError(f"`seed` must be an integer or None. Received: seed={seed!r}")
    unknown = [v for v in vary if v not in _VARY]
    if unknown:
        raise ValueError(f"`vary` may hold {_VARY}. Received: vary={vary!r}")
    kind = _candidate_kind(candidate, kind)
    _slot_map(candidate, slot_map)
    if convention is None:
        convention = default_convention(optimizer)
    # Fail now, with refopt's own message, for a config or convention refopt refuses (on the
    # reference backend: this only validates, and must not need a GPU $REFOPT_BACKEND names).
    checked = optimizer_class(optimizer)(**{"learning_rate": 0.01, **(config or {})},
                                         convention=convention, backend="reference")

    # A slot the candidate does not keep shows on any input: say so now, on a one-step probe,
    # rather than after Hypothesis has shrunk the error for nothing.
    try:
        full = {k: v for k, v in checked.get_config().items() if k not in _NOT_HYPERPARAMETERS}
        probe = Trajectory(optimizer, full, dtype, [np.zeros(2, dtype)], [[np.zeros(2, dtype)]],
                           convention=convention)
        check_trajectory(candidate, probe, tolerance_ulp=tolerance_ulp, slot_map=slot_map,
                         kind=kind)
    except _MissingSlotError:
        raise
    except (ConformanceError, TypeError, ValueError, NotImplementedError):
        pass  # a divergence (or a probe this optimizer refuses): Hypothesis finds and shrinks it

    trajectories = strategies.trajectories(
        optimizer=optimizer, dtype=dtype, max_steps=steps, max_variables=max_variables,
        sparse=sparse, config=config, weight_decay="weight_decay" in vary,
        clipping="clipping" in vary, ema="ema" in vary, schedules="schedules" in vary,
        allow_nonfinite=allow_nonfinite, extreme=extreme, convention=convention,
    )

    @settings(max_examples=max_examples, deadline=None, database=None, derandomize=False,
              report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
              verbosity=Verbosity.quiet, print_blob=False)
    @given(trajectories)
    def run(trajectory):
        check_trajectory(candidate, trajectory, tolerance_ulp=tolerance_ulp,
                         slot_map=slot_map, kind=kind)

    if seed is not None:
        run = hypothesis_seed(seed)(run)
    try:
        run()
    except ConformanceError as err:
        how = (f"(found by assert_conforms with optimizer={optimizer!r}, "
               f"dtype={np.dtype(dtype).name!r}, steps={steps}, max_examples={max_examples}, "
               f"seed={seed!r}; the input above is the one Hypothesis shrank it to)")
        raise ConformanceError(f"{err.report}\n{how}", step=err.step,
                               mismatches=err.mismatches,
                               trajectory=err.trajectory) from err.__cause__
