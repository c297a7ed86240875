r"""Explain a divergence: which convention knobs, or which classic slip, reproduce a trajectory.

``refopt check`` says *that* an implementation diverges and by how much; :func:`explain` says
*why*. Given a foreign trajectory (the inputs and the state after every step), it replays the
same inputs through refopt under many settings and ranks them by how close they come:

1. every convention preset (:data:`refopt.conventions.PRESETS`);
2. each preset with one knob changed to each of its other values, for the knobs that the
   optimizer consults with this configuration (Adam's epsilon placement, ``beta**t``,
   ``1 - beta`` rounding, moment form, AMSGrad maximum, ...; SGD's momentum buffer; the other
   optimizers' ``*_form``; clipping, EMA, weight decay and step-counter knobs where the
   configuration uses them);
3. each preset with one *classic slip* (:data:`SLIPS`): mistakes that are no framework's
   convention, such as epsilon inside the square root or a missing bias correction, written
   as small wrappers around refopt's reference;
4. when nothing matches, pairs: each of the three nearest single changes combined with every
   other single change of its preset (a port with two slips).

Distance
--------
Each setting is replayed step by step from the *recorded* state: before step ``k`` the
variables and every recorded slot are set to the trajectory's values after step ``k - 1``
(as ``refopt conformance`` does for cases with a tolerance), so an error of one step is
measured where it happens and is not amplified by the next ones. The distance of a step is
the largest :func:`~refopt.testing.ulp_distance` over the variables and recorded slots; the
distance of a setting is the largest over the steps. A setting *matches* when it is at most
the tolerance (0 unless the trajectory states one, as each bundled golden case does).
Settings that do not match are ranked by the order of magnitude of their distance (its power
of two), then by how many values they get wrong, then by simplicity: a port that doubles the
learning rate is as far from every setting in its variables, and nearest to the simplest one
that gets its moments right. Two settings that compute bit-identical states at every step
are the same explanation and are reported together (``same_as``: e.g. ``tf_keras`` and
``keras3`` on dense Adam). To keep the search fast, a setting is abandoned as soon as its
distance is a power of two beyond the ``max(top, 8)``-th best one found so far; its distance
is then a lower bound (``complete=False``).

Sources
-------
- a golden file in refopt's format (``.npz`` or ``.json``, :mod:`refopt.testing.golden`),
  e.g. written by your own implementation in another language;
- a bundled golden case recorded from a framework, by id (``"torch/adam_fused_f32"``, see
  ``refopt conformance --list``) or by the path of its ``.npz`` in
  ``refopt/conformance_data/``, or its manifest entry (:func:`refopt.conformance.load_manifest`);
- a candidate implementation, as ``refopt check`` takes it (a factory of stateful optimizers
  or a step function, see :mod:`refopt.testing.conformance`): it is run freely on inputs
  generated from a seed (:func:`refopt.testing.golden.make_trajectory`) and its own
  trajectory is explained (:func:`record_candidate`);
- a :class:`Recording` you build from arrays.

Examples
--------
>>> from refopt.testing import explain
>>> explain("keras2/adam_f32").summary()
'matches keras2 (0 ulp over 20 steps)'
"""

from __future__ import annotations

import hashlib
import math
import numbers
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from refopt import _libm
from refopt.conventions import KNOB_VALUES, PRESETS, Convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference import variants as _variants
from refopt.reference._common import scalar
from refopt.testing.conformance import ulp_distance
from refopt.testing.trajectory import copy_gradient, optimizer_class

__all__ = [
    "SLIPS",
    "Candidate",
    "Divergence",
    "Explanation",
    "Recording",
    "Slip",
    "adam_step_with_slips",
    "explain",
    "load_recording",
    "record_candidate",
]

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

#: Settings kept exactly ranked; a setting farther than the KEEP-th best is abandoned early.
_MIN_KEEP = 8
#: When nothing matches, the settings of the nearest this many single changes are each
#: combined with every other single change of their preset.
_PAIR_ANCHORS = 3


# =============================================================================== recordings
@dataclass(frozen=True, eq=False)
class Recording:
    """A trajectory to explain: inputs and the recorded state after every step.

    Parameters
    ----------
    optimizer : str
        The refopt optimizer class name whose settings are searched (``"Adam"``, ``"SGD"``,
        ...).
    config : dict
        Its constructor arguments under refopt's names (a learning-rate schedule as a
        :class:`refopt.schedules.LearningRateSchedule` or its serialized dict). Arguments
        left out take each convention's default (e.g. Adam's epsilon: 1e-7 Keras, 1e-8
        PyTorch), so leaving one out lets the search tell the defaults apart.
    dtype : str or numpy.dtype
        float16, float32 or float64.
    initial : sequence of ndarray
        The variables before step 1.
    gradients : sequence (steps) of sequence (variables)
        ndarray, :class:`~refopt.IndexedSlices` or None (no gradient for that variable).
    params : sequence (steps) of sequence (variables) of ndarray
        The recorded variables after each step.
    slots : dict of str to sequence (steps) of sequence (variables) of (ndarray or None)
        The recorded state after each step under refopt's slot names (``m``, ``v``,
        ``vhat``, ``average``, ...); None where not recorded. May be empty.
    tolerance_ulp : float, default 0
        Largest distance per step that still counts as a match.
    source : str
        What the trajectory is, for the report.
    declared : str, optional
        The convention the source says it follows (reported, never used by the search).
    notes : tuple of str
        Remarks for the report (e.g. a slot the candidate does not have).

    Raises
    ------
    ValueError
        If the number of steps or variables disagree, or the optimizer is unknown.
    """

    optimizer: str
    config: dict
    dtype: np.dtype
    initial: tuple
    gradients: tuple
    params: tuple
    slots: dict = field(default_factory=dict)
    tolerance_ulp: float = 0
    source: str = "recording"
    declared: str | None = None
    notes: tuple = ()

    def __post_init__(self):
        optimizer_class(self.optimizer)
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        n = len(self.initial)
        if len(self.gradients) != len(self.params):
            raise ValueError(
                f"`gradients` and `params` must have one entry per step. Received: "
                f"{len(self.gradients)} and {len(self.params)} steps")
        for what, per_step in [("gradients", self.gradients), ("params", self.params)] + [
                (f"slots[{name!r}]", s) for name, s in self.slots.items()]:
            if len(per_step) != len(self.params):
                raise ValueError(f"`{what}` must have {len(self.params)} steps. Received: "
                                 f"{len(per_step)}")
            for k, row in enumerate(per_step):
                if len(row) != n:
                    raise ValueError(f"`{what}[{k}]` must have one entry per variable ({n}). "
                                     f"Received: {len(row)}")
        if isinstance(self.tolerance_ulp, bool) or not isinstance(
                self.tolerance_ulp, numbers.Real) or not self.tolerance_ulp >= 0:
            raise ValueError(f"`tolerance_ulp` must be a number >= 0. Received: "
                             f"tolerance_ulp={self.tolerance_ulp!r}")

    @property
    def steps(self):
        """int: the number of recorded steps."""
        return len(self.params)


def _deserialize_config(config):
    from refopt import schedules

    config = dict(config)
    if isinstance(config.get("learning_rate"), dict):
        config["learning_rate"] = schedules.deserialize(config["learning_rate"])
    return config


def _from_golden(g, source):
    names = g.meta.get("slots", [])
    return Recording(
        optimizer=g.meta["optimizer"], config=g.trajectory.config, dtype=g.trajectory.dtype,
        initial=g.trajectory.initial, gradients=g.trajectory.gradients,
        params=tuple(s.params for s in g.states[1:]),
        slots={n: tuple(s.slots[n] for s in g.states[1:]) for n in names},
        source=source, declared=g.meta.get("convention"),
    )


def _from_case(entry):
    from refopt import conformance

    init, grads, params, slots = conformance.load_case(entry)
    knobs = entry.get("knobs") or {}
    declared = entry["convention"] + (
        " with " + ", ".join(f"{k}={v!r}" for k, v in sorted(knobs.items())) if knobs else "")
    version = ", ".join(f"{k} {v}" for k, v in sorted(entry["framework_version"].items())
                        if k not in ("numpy", "python"))
    return Recording(
        optimizer=entry["optimizer"], config=_deserialize_config(entry["hyperparameters"]),
        dtype=entry["dtype"], initial=init, gradients=grads, params=params, slots=slots,
        tolerance_ulp=entry["tolerance_ulp"],
        source=f"{entry['id']} (golden case recorded from {entry['api']}, {version})",
        declared=declared,
    )


def _bundled_entry(path):
    """The manifest entry of a bundled case file, or None."""
    from refopt import conformance

    folder = os.path.dirname(os.path.realpath(path))
    bundled = os.path.realpath(str(conformance._data()))
    if folder != bundled:
        return None
    name = os.path.basename(path)
    return next((e for e in conformance.load_manifest() if e["file"] == name), None)


def load_recording(source):
    """Read a trajectory to explain.

    Parameters
    ----------
    source : str, os.PathLike, dict, Golden or Recording
        A golden file in refopt's format (``.npz`` or ``.json``, chosen by content), the
        ``.npz`` of a bundled golden case (in ``refopt/conformance_data/``), a bundled case
        id such as ``"torch/adam_fused_f32"``, a manifest entry
        (:func:`refopt.conformance.load_manifest`), a :class:`refopt.testing.golden.Golden`
        or a :class:`Recording` (returned as is).

    Returns
    -------
    Recording

    Raises
    ------
    FileNotFoundError
        If ``source`` is neither an existing file nor a bundled case id.
    ValueError
        If the file is neither a refopt golden file nor a bundled case.
    TypeError
        For another type of ``source``.
    """
    from refopt import conformance
    from refopt.testing import golden

    if isinstance(source, Recording):
        return source
    if isinstance(source, golden.Golden):
        return _from_golden(source, "golden trajectory")
    if isinstance(source, dict):
        return _from_case(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            "`source` must be a golden file path, a bundled case id, a manifest entry, a "
            f"Golden, a Recording or a candidate. Received: source={source!r} of type "
            f"{type(source).__name__}")
    path = os.fspath(source)
    if not os.path.isfile(path):
        entry = next((e for e in conformance.load_manifest() if e["id"] == path), None)
        if entry is None:
            raise FileNotFoundError(
                f"`source` is neither a file nor a bundled golden case id (see `refopt "
                f"conformance --list`). Received: source={path!r}")
        return _from_case(entry)
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        with np.load(path, allow_pickle=False) as z:
            has_meta = "meta" in z.files
        if not has_meta:
            entry = _bundled_entry(path)
            if entry is None:
                raise ValueError(
                    f"{path} is neither a refopt golden file (no 'meta') nor a golden case of "
                    "refopt/conformance_data/ listed in its manifest.json")
            return _from_case(entry)
    return _from_golden(golden.read_golden(path), path)


def record_candidate(candidate, *, optimizer="Adam", config=None, dtype="float32",
                     convention=None, steps=20, seed=0, shapes=((5,), (4, 3)), sparse=False,
                     slot_map=None, kind="auto"):
    """Run a candidate implementation freely on generated inputs and record its trajectory.

    The inputs are :func:`refopt.testing.golden.make_trajectory`'s (initial variables
    ~ N(0, 1), gradients ~ N(0, 0.1)). Unlike :func:`refopt.testing.check_trajectory` the
    candidate is *not* resynced to refopt: its own trajectory is recorded.

    Parameters
    ----------
    candidate : callable
        A factory of stateful optimizers or a step function, as :func:`refopt.testing.
        assert_conforms` takes (see :mod:`refopt.testing.conformance`).
    optimizer : str, default "Adam"
        The refopt optimizer it implements (its settings are what :func:`explain` searches).
    config : dict, optional
        Constructor arguments under refopt's names, given to a factory as keywords (a step
        function gets every hyperparameter, as ``refopt check`` gives them).
    dtype : {"float16", "float32", "float64"}, default "float32"
    convention : str, optional
        The convention whose defaults fill the ``hyper`` dict of a step function (default:
        the optimizer's own). Not used for a factory.
    steps : int, default 20
    seed : int, default 0
    shapes : sequence of tuple of int, default ((5,), (4, 3))
    sparse : bool, default False
        IndexedSlices gradients (random rows with duplicates).
    slot_map : dict, optional
        refopt slot name -> the candidate's (None: not recorded); default the candidate's
        ``slot_map`` attribute, else the same names.
    kind : {"auto", "stateful", "step"}, default "auto"

    Returns
    -------
    Recording
        With the candidate's variables and the slots it has after every step. A slot the
        candidate does not have is left out (with a note), not an error.

    Raises
    ------
    TypeError, ValueError
        For invalid arguments, or a configuration refopt refuses.
    RuntimeError
        If the candidate raises or returns something malformed (the candidate's exception
        chained).
    """
    from refopt.testing import conformance as _conf
    from refopt.testing.golden import make_trajectory
    from refopt.testing.trajectory import run_reference, slot_names

    kind = _conf._candidate_kind(candidate, kind)
    smap = _conf._slot_map(candidate, slot_map)
    trajectory = make_trajectory(optimizer=optimizer, config=config, dtype=dtype,
                                 shapes=shapes, steps=steps, seed=seed, sparse=sparse,
                                 convention=convention)
    ref = trajectory.make_optimizer()
    ref.build([a.copy() for a in trajectory.initial])
    names = [(r, smap.get(r, r)) for r in slot_names(ref) if smap.get(r, r) is not None]
    hyper_base = {k: v for k, v in ref.get_config().items()
                  if k not in _conf._NOT_HYPERPARAMETERS}
    learning_rates = [s.learning_rate for s in run_reference(trajectory)[1:]]
    variables = [a.copy() for a in trajectory.initial]
    n = len(variables)
    params, slots, missing = [], {r: [] for r, _ in names}, {}
    what = getattr(candidate, "__qualname__", None) or type(candidate).__name__
    try:
        if kind == "stateful":
            cand = candidate(**trajectory.config)
        else:
            state = [{c: (v.copy() if r == "average" else np.zeros_like(v)) for r, c in names}
                     for v in variables]
        for k, grads in enumerate(trajectory.gradients, 1):
            grads = [copy_gradient(g) for g in grads]
            if kind == "stateful":
                cand.apply_gradients(list(zip(grads, variables)))
                got = {}
                for r, c in names:
                    if r in missing:
                        continue
                    try:
                        got[r] = [np.array(cand.get_slot(v, c)) for v in variables]
                    except Exception as exc:  # noqa: BLE001 - a slot it lacks: not recorded
                        missing[r] = f"{type(exc).__name__}: {exc}"
            else:
                hyper = dict(hyper_base, learning_rate=learning_rates[k - 1])
                result = candidate([v.copy() for v in variables], grads, state, hyper, k)
                new_params, state = _conf._unpack_step_result(result, n)
                variables = [np.array(p) for p in new_params]
                got = {}
                for r, c in names:
                    if r in missing:
                        continue
                    try:
                        got[r] = [np.array(state[i][c]) for i in range(n)]
                    except KeyError as exc:
                        missing[r] = f"KeyError: {exc}"
            params.append(tuple(np.array(v) for v in variables))
            for r in got:
                slots[r].append(tuple(got[r]))
    except Exception as exc:
        raise RuntimeError(f"the candidate {what} raised at step {len(params) + 1}: "
                           f"{type(exc).__name__}: {exc}") from exc
    for i, (p, a) in enumerate(zip(params[0] if params else (), trajectory.initial)):
        if p.shape != a.shape or p.dtype != a.dtype:
            raise RuntimeError(f"the candidate {what} returned variable {i} with shape "
                               f"{p.shape}, dtype {p.dtype}; expected {a.shape}, {a.dtype}")
    notes = tuple(f"the candidate has no slot {r!r} ({missing[r]}): compared without it"
                  for r in missing)
    slots = {r: tuple(v) for r, v in slots.items() if r not in missing}
    source = (f"candidate {what} on {steps} generated steps (seed {seed}, shapes "
              f"{', '.join(str(tuple(s)) for s in shapes)}"
              + (", sparse" if sparse else "") + ")")
    return Recording(optimizer=trajectory.optimizer if isinstance(trajectory.optimizer, str)
                     else trajectory.optimizer.__name__,
                     config=dict(trajectory.config), dtype=trajectory.dtype,
                     initial=trajectory.initial, gradients=trajectory.gradients,
                     params=tuple(params), slots=slots, source=source, notes=notes)


# =============================================================================== Adam with slips
def adam_step_with_slips(param, grad, m, v, vhat, *, learning_rate, beta_1, beta_2, epsilon,
                         step, convention, weight_decay=None, slips=frozenset()):
    r"""One dense Adam step under ``convention``, with classic slips switched on by name.

    Without slips this is :func:`refopt.reference.variants.adam_variant` (and, for the
    tf-keras convention, :func:`refopt.reference.adam_update`) on a dense gradient, written
    with the points where a port goes wrong made explicit. Inputs are never modified.

    Parameters
    ----------
    param, grad, m, v : ndarray of float16, float32 or float64, same shape
    vhat : ndarray like ``param`` or None
        AMSGrad's maximum; None for plain Adam.
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        ``t`` (may be 0 for the off-by-one slip: ``beta**0 = 1`` divides by zero, as the
        port would).
    convention : refopt.conventions.Convention
    weight_decay : float, optional
        optax ``adamw``'s decay inside the update (as ``adam_variant``).
    slips : set of str
        Any of ``"epsilon_inside_root"`` (``sqrt(v + eps)``, with ``v`` bias-corrected where
        the convention corrects it), ``"no_bias_correction"`` (``beta**t`` taken as 0, so
        ``1 - beta**t = 1``), ``"float32_powers"`` (``beta**t`` by ``powf`` in float32, then
        widened: a float64 run with float32 powers), ``"amsgrad_max_unused"`` (``vhat`` kept
        but ``v`` in the denominator).

    Returns
    -------
    tuple
        ``(param, m, v, vhat)``, new arrays (``vhat`` None when it was None).
    """
    conv = convention
    dtype = param.dtype
    b1, b2, t = beta_1, beta_2, step
    in_root = "epsilon_inside_root" in slips
    one = scalar(dtype, 1)

    # PyTorch's float64 scalars take b**t as a Python float; the others in the dtype
    torch_scalars = conv.epsilon_placement == "corrected" and conv.bias_correction == "float64"

    def power(b):
        """``b**t`` as the convention computes it, or as the slip does."""
        if "no_bias_correction" in slips:
            p = 0.0
        elif "float32_powers" in slips:
            p = float(_libm.power(_F32, np.float32(b), np.float32(t)))
        else:
            return _variants.beta_power(dtype, b, t, conv)
        return p if torch_scalars else scalar(dtype, p)

    with np.errstate(all="ignore"):
        eps = _variants.eps_value(dtype, epsilon, conv)
        lr = _variants.lr_value(dtype, learning_rate, conv)
        # the convention's moment form (the "moment_update" knob); private helper of the
        # reference, so that the moments are the reference's to the bit
        m_new, v_new = _variants._moments(m, v, grad, dtype, b1, b2, conv)
        vhat_new = None
        if conv.epsilon_placement == "hat":
            p1, p2 = power(b1), power(b2)
            p1, p2 = scalar(dtype, p1), scalar(dtype, p2)
            alpha = scalar(dtype, lr) * np.sqrt(one - p2) / (one - p1)
            if vhat is not None:
                vhat_new = np.maximum(vhat, v_new)
            denom_v = vhat_new if vhat is not None and "amsgrad_max_unused" not in slips \
                else v_new
            denom = np.sqrt(denom_v + eps) if in_root else np.sqrt(denom_v) + eps
            return param - (m_new * alpha) / denom, m_new, v_new, vhat_new
        if conv.bias_correction == "float64":
            # PyTorch's fused kernel: float64 scalars, each rounded once to the dtype
            bc1 = 1.0 - power(b1)
            bc2 = 1.0 - power(b2)
            bc2_sqrt = math.sqrt(bc2)
            step_size = float(lr) / bc1
            if vhat is not None and conv.amsgrad_maximum == "raw":
                vhat_new = np.maximum(vhat, v_new)
                denom_v = vhat_new
            elif vhat is not None:
                vhat_new = np.maximum(vhat, v_new / scalar(dtype, bc2))
                denom_v = vhat_new * scalar(dtype, bc2)
            if vhat is None or "amsgrad_max_unused" in slips:
                denom_v = v_new
            if in_root:  # sqrt(v / bc2 + eps)
                denom = np.sqrt(denom_v / scalar(dtype, bc2) + eps)
            else:
                denom = np.sqrt(denom_v) / scalar(dtype, bc2_sqrt) + eps
            return (param + (scalar(dtype, -step_size) * m_new) / denom, m_new, v_new,
                    vhat_new)
        # optax under jit: mu / (bc1 * (sqrt(nu / bc2) + eps))
        bc1 = one - scalar(dtype, power(b1))
        bc2 = one - scalar(dtype, power(b2))
        v_hat = v_new / bc2
        if vhat is not None and conv.amsgrad_maximum == "corrected":
            vhat_new = np.maximum(vhat, v_hat)
            denom_v = vhat_new
        elif vhat is not None:
            vhat_new = np.maximum(vhat, v_new)
            denom_v = vhat_new / bc2
        if vhat is None or "amsgrad_max_unused" in slips:
            denom_v = v_hat
        root = np.sqrt(denom_v + eps) if in_root else np.sqrt(denom_v) + eps
        if conv.optax_jit == "eager":  # nothing jitted: (m/bc1) / root, u + wd*w, each rounded
            u = (m_new / bc1) / root
            if weight_decay is not None:
                u = u + scalar(dtype, weight_decay) * param
            return param + scalar(dtype, -float(lr)) * u, m_new, v_new, vhat_new
        u = m_new / (bc1 * root)
        if weight_decay is not None:
            u = _variants.fma(param, scalar(dtype, weight_decay), u)
        # apply_updates: w + u*(-lr), one FMA when the whole step is jitted
        return (_variants.optax_apply(param, u, scalar(dtype, -float(lr)), conv.optax_jit),
                m_new, v_new, vhat_new)


# =============================================================================== slips
@dataclass(frozen=True)
class _Problem:
    """What the search needs to know about the recording."""

    optimizer: str
    cls: type
    config: dict
    dtype: np.dtype
    sparse: bool
    none_grads: bool
    variables: int

    @property
    def adam_family(self):
        from refopt.optimizers import Adam

        return issubclass(self.cls, Adam)

    @property
    def lazy(self):
        from refopt.optimizers import LazyAdam

        return issubclass(self.cls, LazyAdam)

    def clip(self, key):
        value = self.config.get(key)
        return value is not None and value > 0

    @property
    def decays(self):
        from refopt.optimizers import AdamW

        return issubclass(self.cls, AdamW) or bool(self.config.get("weight_decay"))


def _adam_applies(p, conv):
    """The Adam slips replace the dense update: not for a non-lazy sparse gradient or
    PyTorch's SparseAdam rows."""
    if not p.adam_family:
        return False
    if p.sparse:
        return p.lazy and conv.lazy_update != "torch_sparse"
    return True


def _decay_mode(p, conv):
    """What weight decay means for this optimizer under ``conv`` (the class's own rule)."""
    from refopt.optimizers import AdamW

    return conv.adamw_weight_decay if issubclass(p.cls, AdamW) else conv.adam_weight_decay


def _rescale_always(grads, config, conv):
    """Norm clipping that rescales even below the threshold: every gradient times
    ``c / N`` (TF's ``g*c/N``, PyTorch's ``g*(c/(N + 1e-6))``, optax's ``(g/N)*c``), the
    norm summed in NumPy's order (so only close to a framework's, not bit-identical)."""
    per_tensor = config.get("clipnorm") is not None and config["clipnorm"] > 0
    c = config["clipnorm"] if per_tensor else config["global_clipnorm"]

    def values(g):
        return g.values if isinstance(g, IndexedSlices) else g

    def rewrap(g, vals):
        return IndexedSlices(vals, g.indices, g.dense_shape) if isinstance(
            g, IndexedSlices) else np.asarray(vals)

    def scale(group):
        present = [values(g) for g in group if g is not None]
        if not present:
            return list(group)
        dtype = present[0].dtype
        n = np.sqrt(sum(np.sum(x * x, dtype=dtype) for x in present))
        cc = dtype.type(c)
        out = []
        for g in group:
            if g is None:
                out.append(None)
                continue
            x = values(g)
            if conv.clip_formula == "torch":
                out.append(rewrap(g, x * (cc / (n + dtype.type(1e-6)))))
            elif conv.clip_formula == "optax":
                out.append(rewrap(g, (x / n) * cc))
            else:
                out.append(rewrap(g, x * cc / n))
        return out

    with np.errstate(all="ignore"):
        if per_tensor:
            return [scale([g])[0] for g in grads]
        return scale(grads)


def _swap_clip_scope(config):
    config = dict(config)
    config["clipnorm"], config["global_clipnorm"] = (config.get("global_clipnorm"),
                                                     config.get("clipnorm"))
    return config


def _flip_nesterov(config):
    return dict(config, nesterov=not config.get("nesterov", False))


def _no_clip(config):
    return {k: v for k, v in config.items() if k not in ("clipnorm", "global_clipnorm")}


@dataclass(frozen=True)
class Slip:
    """A classic mistake that is no framework's convention, as a wrapper around refopt.

    Attributes
    ----------
    name : str
        Its key in :data:`SLIPS`.
    text : str
        What the port did, in words (the report prints it).
    applies : callable
        ``applies(problem, convention) -> bool``: whether the slip can change anything for
        this optimizer, configuration and convention.
    adam : frozenset of str
        Flags of :func:`adam_step_with_slips` (Adam, AdamW, LazyAdam).
    step_offset : int
        Added to ``t`` before the optimizer's update.
    coupled_decay : bool
        Weight decay as an L2 term ``g + wd*w`` (two roundings) instead of the convention's.
    zero_average : bool
        The EMA of the weights starts at zero (with the convention's formula).
    edit_config : callable or None
        ``config -> config`` (e.g. Nesterov switched).
    edit_grads : callable or None
        ``(grads, config, convention) -> grads`` applied to each step's raw gradients (the
        clipping it replaces is removed from the config).
    """

    name: str
    text: str
    applies: Callable
    adam: frozenset = frozenset()
    step_offset: int = 0
    coupled_decay: bool = False
    zero_average: bool = False
    edit_config: Callable | None = None
    edit_grads: Callable | None = None


#: The classic slips searched, by name (see :class:`Slip`).
SLIPS = {s.name: s for s in (
    Slip("epsilon_inside_root",
         "epsilon inside the square root: sqrt(v + eps) instead of sqrt(v) + eps",
         _adam_applies, adam=frozenset({"epsilon_inside_root"})),
    Slip("no_bias_correction", "no bias correction (1 - beta**t taken as 1)",
         _adam_applies, adam=frozenset({"no_bias_correction"})),
    Slip("float32_powers", "beta**t computed in float32 in a float64 run",
         lambda p, c: _adam_applies(p, c) and p.dtype == _F64,
         adam=frozenset({"float32_powers"})),
    Slip("amsgrad_max_unused", "AMSGrad maximum kept but v (not vhat) in the denominator",
         lambda p, c: _adam_applies(p, c) and bool(p.config.get("amsgrad")),
         adam=frozenset({"amsgrad_max_unused"})),
    Slip("step_plus_one", "step counter off by one: t = iterations + 2",
         lambda p, c: True, step_offset=1),
    Slip("step_minus_one", "step counter off by one: t = iterations (starts at 0)",
         lambda p, c: True, step_offset=-1),
    Slip("coupled_weight_decay",
         "weight decay coupled: g + wd*w fed to the update instead of the decoupled decay",
         lambda p, c: p.decays and not p.sparse and _decay_mode(p, c) != "l2",
         coupled_decay=True),
    Slip("clip_always_rescales",
         "norm clipping rescales even when the norm is below the threshold",
         lambda p, c: p.clip("clipnorm") or p.clip("global_clipnorm"),
         edit_config=_no_clip, edit_grads=_rescale_always),
    Slip("clip_scope_swapped",
         "clipnorm (per tensor) and global_clipnorm (all tensors) swapped",
         lambda p, c: p.variables > 1 and (p.clip("clipnorm") != p.clip("global_clipnorm")),
         edit_config=_swap_clip_scope),
    Slip("ema_starts_at_zero", "the weight average starts at zero instead of a copy",
         lambda p, c: bool(p.config.get("use_ema")) and c.ema == "copy", zero_average=True),
    Slip("nesterov_flipped", "Nesterov momentum switched (on where off, or off where on)",
         lambda p, c: p.optimizer == "SGD" and bool(p.config.get("momentum")),
         edit_config=_flip_nesterov),
)}

#: Slips that cannot be combined (they undo each other).
_EXCLUSIVE = ({"step_plus_one", "step_minus_one"},)


@dataclass(frozen=True)
class _Effects:
    """The class-level effects of a set of slips (the key of the slipped class)."""

    adam: frozenset = frozenset()
    step_offset: int = 0
    coupled_decay: bool = False


_SLIPPED_CLASSES = {}


def _slipped_class(cls, effects):
    """A subclass of refopt's ``cls`` whose update carries the slips (cached per key)."""
    key = (cls, effects)
    if key in _SLIPPED_CLASSES:
        return _SLIPPED_CLASSES[key]
    from refopt.optimizers import Adam

    adam_family = issubclass(cls, Adam)

    class Slipped(cls):
        def _decay_mode(self):
            # "l2" makes the pipeline hand weight_decay to _update_step instead of decaying
            return "l2" if effects.coupled_decay else super()._decay_mode()

        def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                         lazy_rows=False):
            if effects.coupled_decay and weight_decay is not None:
                grad = np.asarray(grad + param * scalar(param.dtype, weight_decay))
                weight_decay = None
            step = step + effects.step_offset
            if not (adam_family and (effects.adam or effects.step_offset)):
                return super()._update_step(param, grad, slots, learning_rate, step,
                                            weight_decay, lazy_rows)
            conv = self.convention
            if lazy_rows and conv.lazy_update == "ema_rows":
                conv = conv.replace(moment_update="ema")
            if weight_decay is not None and self._decay_mode() == "l2":
                grad = _variants.l2_torch(grad, param, weight_decay)
                weight_decay = None
            p, m, v, vhat = adam_step_with_slips(
                param, grad, slots["m"], slots["v"], slots.get("vhat"),
                learning_rate=learning_rate, beta_1=self.beta_1, beta_2=self.beta_2,
                epsilon=self.epsilon, step=step, convention=conv, weight_decay=weight_decay,
                slips=effects.adam)
            new = {"m": np.asarray(m), "v": np.asarray(v)}
            if vhat is not None:
                new["vhat"] = np.asarray(vhat)
            return np.asarray(p), new

    Slipped.__name__ = Slipped.__qualname__ = cls.__name__
    _SLIPPED_CLASSES[key] = Slipped
    return Slipped


# =============================================================================== settings
def _relevant_knobs(p):
    """The knobs this optimizer consults with this configuration and these gradients (read
    from the optimizers and the reference; a knob with no effect on the data is caught
    anyway, as a setting computing the same numbers as a simpler one)."""
    knobs = ["learning_rate_cast"]
    config = p.config
    if p.adam_family:
        knobs += ["epsilon_placement", "bias_correction", "one_minus_beta", "moment_update",
                  "epsilon_cast"]
        if config.get("amsgrad"):
            knobs.append("amsgrad_maximum")
        if config.get("epsilon") is None:
            knobs.append("default_epsilon")
        if p.sparse:
            knobs += ["lazy_update"] if p.lazy else ["sparse_adam", "keras3_sparse_square"]
    elif p.optimizer == "SGD":
        knobs.append("sgd_momentum")
    else:
        form = _form_knob(p.cls)
        if form is not None:
            knobs.append(form)
        if p.sparse:
            knobs.append("keras3_sparse_square")
    if config.get("epsilon") == 0:
        knobs.append("epsilon_zero_is_default")
    if p.decays:
        from refopt.optimizers import AdamW

        if issubclass(p.cls, AdamW):
            knobs.append("adamw_weight_decay")
            if "weight_decay" not in config:
                knobs.append("default_adamw_weight_decay")
        else:
            knobs.append("adam_weight_decay")
    if p.none_grads:
        knobs.append("step_counter")
    if any(config.get(k) is not None for k in ("clipnorm", "global_clipnorm", "clipvalue")):
        knobs += ["clip_formula", "clip_selection"]
    if config.get("use_ema"):
        knobs.append("ema")
    return knobs


def _form_knob(cls):
    for klass in cls.__mro__:
        knob = f"{klass.__name__.lower()}_form"
        if knob in KNOB_VALUES:
            return knob
    return None


_FLOAT_KNOB_VALUES = {
    "default_epsilon": (1e-7, 1e-8),
    "default_adamw_weight_decay": (0.004, 0.01, 1e-4),
}


def _alternatives(knob, current):
    if knob in KNOB_VALUES:
        values = KNOB_VALUES[knob]
    elif knob in _FLOAT_KNOB_VALUES:
        values = _FLOAT_KNOB_VALUES[knob]
    else:  # a boolean knob
        values = (False, True)
    return [v for v in values if v != current]


@dataclass(frozen=True)
class _Setting:
    preset: str
    knobs: tuple  # ((knob, value), ...) in the order they were changed
    slips: tuple  # slip names

    @property
    def changes(self):
        return len(self.knobs) + len(self.slips)

    def convention(self):
        conv = PRESETS[self.preset]
        return conv.replace(**dict(self.knobs)) if self.knobs else conv

    def key(self):
        knobs = self.convention().knobs()
        del knobs["name"], knobs["framework"]
        return tuple(sorted(knobs.items())), tuple(sorted(self.slips))

    def describe(self):
        text = self.preset
        if self.knobs:
            text += " except " + ", ".join(f"{k}={v!r}" for k, v in sorted(self.knobs))
        if self.slips:
            slips = sorted(self.slips, key=list(SLIPS).index)
            text += (", " if self.knobs else " ") + "with slip " + " + ".join(slips)
        return text

    def combine(self, other):
        """Both settings' changes on the same preset, or None if they conflict."""
        if other.preset != self.preset:
            return None
        knobs = dict(self.knobs)
        for k, v in other.knobs:
            if k in knobs and knobs[k] != v:
                return None
            knobs[k] = v
        slips = tuple(dict.fromkeys(self.slips + other.slips))
        if any(len(group & set(slips)) > 1 for group in _EXCLUSIVE):
            return None
        combined = _Setting(self.preset, tuple(knobs.items()), slips)
        return combined if combined.changes == self.changes + other.changes else None


# =============================================================================== results
@dataclass(frozen=True)
class Divergence:
    """Where a setting first leaves the recorded trajectory (beyond the tolerance).

    Attributes
    ----------
    step : int
        1-based.
    array : str
        ``"params"`` or a slot name.
    variable : int
    index : tuple of int
        The element with the largest distance in that array.
    got, recorded : float
        The setting's value and the recorded one there.
    ulp : float
        Their distance (``inf``: NaN on one side only; ``nan``: shapes or dtypes differ).
    """

    step: int
    array: str
    variable: int
    index: tuple
    got: float
    recorded: float
    ulp: float

    def __str__(self):
        what = "variable" if self.array == "params" else f"slot {self.array} of variable"
        return (f"step {self.step}, {what} {self.variable}, element "
                f"{self.index}: {self.got!r} vs recorded {self.recorded!r} "
                f"({_fmt_ulp(self.ulp)})")


@dataclass(frozen=True)
class Candidate:
    """One searched setting and how close it comes to the recording.

    Attributes
    ----------
    description : str
        E.g. ``"tf_keras except epsilon_placement='corrected'"`` or
        ``"torch with slip epsilon_inside_root"``.
    preset : str
        The convention preset it starts from.
    knobs : dict
        Knobs changed from the preset (knob -> value).
    slips : tuple of str
        Names of :data:`SLIPS` applied.
    convention : refopt.conventions.Convention
        The preset with the knobs changed (pass it as ``convention=`` to reproduce it, when
        there is no slip).
    max_ulp : float
        The largest per-step distance over the steps evaluated (a lower bound when
        ``complete`` is False; ``inf`` when the setting raised).
    per_step : tuple of float
        The distance of each evaluated step.
    first_divergence : Divergence or None
        The first step over the tolerance; None when it matches.
    complete : bool
        Every step was evaluated (False: abandoned once farther than the best ones).
    matches : bool
        Complete and within the tolerance at every step.
    error : str or None
        What the setting raised (refopt refuses it for this input), if it did.
    same_as : tuple of str
        Other settings that compute bit-identical states at every step evaluated.
    mismatched : int
        How many values (elements of the variables and recorded slots, summed over the steps
        evaluated) are farther than the tolerance.
    """

    description: str
    preset: str
    knobs: dict
    slips: tuple
    convention: Convention
    max_ulp: float
    per_step: tuple
    first_divergence: Divergence | None
    complete: bool
    matches: bool
    error: str | None = None
    same_as: tuple = ()
    mismatched: int = 0

    @property
    def changes(self):
        """int: knobs changed plus slips applied."""
        return len(self.knobs) + len(self.slips)

    @property
    def presets(self):
        """tuple of str: the presets of this setting and of the ``same_as`` ones that have
        no change (each reproduces the recording as well as this one)."""
        plain = [d for d in (self.description,) + self.same_as if d in PRESETS]
        return tuple(plain)

    def distance_text(self, steps):
        if self.error is not None and not self.per_step:
            return f"raises: {self.error}"
        bound = "" if self.complete else ">= "
        text = f"{bound}{_fmt_ulp(self.max_ulp)}"
        if self.complete and self.first_divergence is None:
            return text + f" over {steps} steps"
        if self.mismatched:
            text += f", {self.mismatched} value(s) off"
            text += f" over {steps} steps" if self.complete else \
                f" in the {len(self.per_step)} step(s) evaluated"
        if self.first_divergence is not None:
            text += f"; first diverges at {self.first_divergence}"
        if self.error is not None:
            text += f"; then raises: {self.error}"
        return text


def _fmt_ulp(x):
    if math.isnan(x):
        return "shape/dtype differs"
    if math.isinf(x):
        return "NaN where the recording has a number (inf ulp)"
    return f"{x:g} ulp"


@dataclass(frozen=True)
class Explanation:
    """The result of :func:`explain`: the settings searched, nearest first.

    Attributes
    ----------
    source : str
    optimizer : str
    dtype : str
    shapes : tuple of tuple of int
    steps : int
    tolerance_ulp : float
    declared : str or None
        The convention the source says it follows (not used by the search).
    candidates : tuple of Candidate
        Ranked: matches first (fewest changes first); then by the order of magnitude of the
        distance (its power of two), how many values are off, changes, and the distance.
    searched : dict
        How many settings of each kind were evaluated (``presets``, ``knobs``, ``slips``,
        ``pairs``; ``same`` counts those found to compute the same numbers as another).
    notes : tuple of str
    """

    source: str
    optimizer: str
    dtype: str
    shapes: tuple
    steps: int
    tolerance_ulp: float
    declared: str | None
    candidates: tuple
    searched: dict
    notes: tuple = ()

    @property
    def match(self):
        """Candidate or None: the simplest setting that reproduces the recording."""
        best = self.candidates[0] if self.candidates else None
        return best if best is not None and best.matches else None

    @property
    def best(self):
        """Candidate or None: the nearest setting."""
        return self.candidates[0] if self.candidates else None

    def _within(self):
        return ("" if self.tolerance_ulp == 0 else
                f", within the stated tolerance of {self.tolerance_ulp:g} ulp per step")

    def summary(self):
        """One line: what reproduces the recording, or the nearest setting."""
        if self.match is not None:
            c = self.match
            text = (f"matches {c.description} ({_fmt_ulp(c.max_ulp)} over {self.steps} "
                    f"steps{self._within()})")
            others = [o for o in self.candidates[1:] if o.matches and o.changes == c.changes]
            if others:
                text += "; matches as well: " + ", ".join(
                    f"{o.description} ({_fmt_ulp(o.max_ulp)})" for o in others[:3])
            return text
        if self.best is None:
            return "no setting of refopt could be evaluated on this trajectory"
        return (f"no exact match; nearest: {self.best.description} "
                f"({self.best.distance_text(self.steps)})")

    def report(self, top=5):
        """Plain-text report: the summary and the ``top`` nearest settings."""
        shapes = ", ".join(str(tuple(s)) for s in self.shapes)
        lines = [
            f"source    {self.source}",
            (f"trajectory {self.optimizer}, {self.dtype}, {len(self.shapes)} variable(s) of "
             f"shape {shapes}, {self.steps} steps; tolerance {self.tolerance_ulp:g} ulp per "
             "step"),
        ]
        if self.declared:
            lines.append(f"declared  {self.declared} (not used by the search)")
        s = self.searched
        lines.append(f"searched  {s['total']} settings: {s['presets']} presets, {s['knobs']} "
                     f"single knob changes, {s['slips']} slips, {s['pairs']} pairs "
                     f"({s['same']} computing the same numbers as a simpler one)")
        lines += [f"note      {n}" for n in self.notes]
        lines.append(("MATCH     " if self.match is not None else "NO MATCH  ")
                     + self.summary())
        lines.append("nearest settings (distance: largest ulp over the variables and recorded "
                     "slots, each step replayed from the recorded state):")
        for rank, c in enumerate(self.candidates[:top], 1):
            lines.append(f"  {rank:2d}. {c.description}")
            lines.append(f"      {c.distance_text(self.steps)}")
            if c.slips:
                lines += [f"      slip {n}: {SLIPS[n].text}" for n in c.slips]
            if c.same_as:
                more = len(c.same_as) - 4
                lines.append("      same numbers here: " + "; ".join(c.same_as[:4])
                             + (f"; and {more} more" if more > 0 else ""))
        return "\n".join(lines)

    def __str__(self):
        return self.report()


# =============================================================================== the search
@dataclass
class _Outcome:
    setting: _Setting
    order: int
    max_ulp: float = 0.0
    per_step: list = field(default_factory=list)
    first: Divergence | None = None
    complete: bool = False
    error: str | None = None
    hashes: list = field(default_factory=list)
    same_as: list = field(default_factory=list)
    alias_of: _Outcome | None = None
    mismatched: int = 0  # values over the tolerance, summed over the steps


def _magnitude(ulp):
    """The order of magnitude of a distance (0, then 1 + floor(log2)): settings within the
    same power of two are ranked by how many values they get wrong."""
    if ulp == 0:
        return 0.0
    return math.inf if math.isinf(ulp) else float(math.floor(math.log2(ulp)) + 1)


def _config_for(rec_config, setting):
    config = dict(rec_config)
    for name in setting.slips:
        if SLIPS[name].edit_config is not None:
            config = SLIPS[name].edit_config(config)
    return config


class _Runner:
    """Replays settings against one recording, with resync to the recorded state."""

    def __init__(self, rec, tolerance):
        self.rec = rec
        self.tol = tolerance
        self.cls = optimizer_class(rec.optimizer)

    def make(self, setting):
        """The optimizer of a setting, or None when refopt refuses the setting here."""
        slips = [SLIPS[n] for n in setting.slips]
        effects = _Effects(
            adam=frozenset().union(*[s.adam for s in slips]),
            step_offset=sum(s.step_offset for s in slips),
            coupled_decay=any(s.coupled_decay for s in slips),
        )
        cls = self.cls if effects == _Effects() else _slipped_class(self.cls, effects)
        conv = setting.convention()
        try:
            return cls(**_config_for(self.rec.config, setting), convention=conv,
                       backend="reference")
        except (TypeError, ValueError, NotImplementedError):
            return None

    def run(self, out, bound):
        rec, setting = self.rec, out.setting
        opt = self.make(setting)
        if opt is None:
            return False
        conv = setting.convention()
        slips = [SLIPS[n] for n in setting.slips]
        edit = [s.edit_grads for s in slips if s.edit_grads is not None]
        variables = [a.copy() for a in rec.initial]
        names = opt.slot_names
        try:
            opt.build(variables)
        except (TypeError, ValueError, NotImplementedError):
            return False
        if any(s.zero_average for s in slips):
            for var in variables:
                opt.get_slot(var, "average")[...] = 0
        for k in range(rec.steps):
            if k > 0:
                self._resync(opt, variables, names, k - 1)
            grads = [None if g is None else copy_gradient(g) for g in rec.gradients[k]]
            for e in edit:
                grads = e(grads, rec.config, conv)
            try:
                opt.apply_gradients(list(zip(grads, variables)))
            except Exception as exc:  # noqa: BLE001 - a setting refopt cannot run here
                out.error = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:200]
                out.max_ulp = math.inf
                if out.first is None:
                    out.first = Divergence(k + 1, "params", 0, (), math.nan, math.nan,
                                           math.inf)
                return True
            d, worst, digest, bad = self._compare(opt, variables, names, k)
            out.mismatched += bad
            out.per_step.append(d)
            out.hashes.append(digest)
            out.max_ulp = max(out.max_ulp, d)
            if out.first is None and not d <= self.tol:
                out.first = worst
            if out.max_ulp > self.tol and (_magnitude(out.max_ulp) > bound
                                           or math.isinf(out.max_ulp)):
                return True  # abandoned (never while it matches): the distance is a lower bound
        out.complete = True
        return True

    def _resync(self, opt, variables, names, k):
        rec = self.rec
        for i, var in enumerate(variables):
            np.copyto(var, rec.params[k][i])
            for name, per_step in rec.slots.items():
                value = per_step[k][i]
                if value is not None and name in names:
                    slot = opt.get_slot(var, name)
                    if slot.shape == value.shape:
                        np.copyto(slot, value)

    def _compare(self, opt, variables, names, k):
        """The step's distance, where it is largest, a digest of the whole state and how many
        values are over the tolerance."""
        rec = self.rec
        digest = hashlib.blake2b(digest_size=16)
        worst, worst_d, bad = None, -1.0, 0
        checks = []
        for i, var in enumerate(variables):
            digest.update(var.tobytes())
            checks.append(("params", i, var, rec.params[k][i]))
            for name in names:
                slot = np.asarray(opt.get_slot(var, name))
                digest.update(np.ascontiguousarray(slot).tobytes())
                per_step = rec.slots.get(name)
                if per_step is not None and per_step[k][i] is not None:
                    checks.append((name, i, slot, per_step[k][i]))
        for name, i, got, want in checks:
            if got.shape == want.shape and got.dtype == want.dtype and \
                    got.tobytes() == want.tobytes():
                continue  # bit-identical: 0 ulp (the common case, checked cheaply)
            if got.shape != want.shape or got.dtype != want.dtype:
                where = Divergence(k + 1, name, i, (), math.nan, math.nan, math.nan)
                dist = math.inf
                bad += want.size
            else:
                dd = ulp_distance(got, want)
                if dd.size == 0:
                    continue
                bad += int(np.count_nonzero(dd > self.tol))
                flat = int(np.argmax(dd))
                dist = float(dd.reshape(-1)[flat])
                where = Divergence(k + 1, name, i,
                                   tuple(int(j) for j in np.unravel_index(flat, dd.shape)),
                                   float(got.reshape(-1)[flat]), float(want.reshape(-1)[flat]),
                                   dist)
            if dist > worst_d:
                worst_d, worst = dist, where
        return max(worst_d, 0.0), worst, digest.digest(), bad


def _same_numbers(new, old):
    """Whether ``new`` computed bit-identical states to ``old`` (evaluated earlier) at every
    step it ran (it may have been abandoned earlier), and raised the same way if it raised."""
    n = len(new.hashes)
    if (n == 0 and new.error is None) or len(old.hashes) < n or old.hashes[:n] != new.hashes:
        return False
    if new.error is not None:
        return old.error == new.error and len(old.hashes) == n
    return True


class _Search:
    def __init__(self, rec, tolerance, keep):
        self.rec = rec
        self.tol = tolerance
        self.keep = keep
        self.runner = _Runner(rec, tolerance)
        self.outcomes = []  # evaluated, in order
        self.seen = {}  # setting key -> outcome
        self.counts = {"presets": 0, "knobs": 0, "slips": 0, "pairs": 0, "same": 0}

    def bound(self):
        """The order of magnitude beyond which a setting cannot be among the ``keep`` best."""
        done = sorted(_magnitude(o.max_ulp) for o in self.outcomes
                      if o.complete and o.alias_of is None and o.error is None)
        return done[self.keep - 1] if len(done) >= self.keep else math.inf

    def add(self, setting, kind):
        key = setting.key()
        if key in self.seen:
            known = self.seen[key]
            text = setting.describe()
            if text != known.setting.describe() and text not in known.same_as:
                known.same_as.append(text)
            return known
        out = _Outcome(setting, len(self.outcomes))
        if not self.runner.run(out, self.bound()):
            return None
        self.seen[key] = out
        self.counts[kind] += 1
        # the same numbers as a simpler setting already evaluated: one explanation
        for other in self.outcomes:
            if other.alias_of is None and _same_numbers(out, other):
                out.alias_of = other
                other.same_as.append(setting.describe())
                self.counts["same"] += 1
                break
        self.outcomes.append(out)
        return out

    def matched(self):
        return any(o.alias_of is None and o.complete and o.error is None
                   and o.max_ulp <= self.tol for o in self.outcomes)

    def ranked(self, outcomes=None):
        outcomes = [o for o in (self.outcomes if outcomes is None else outcomes)
                    if o.alias_of is None]

        def key(o):
            matches = o.complete and o.error is None and o.max_ulp <= self.tol
            if matches:
                return (0, o.setting.changes, o.max_ulp, o.order)
            later = -(o.first.step if o.first is not None else self.rec.steps + 1)
            return (1, _magnitude(o.max_ulp), not o.complete, o.mismatched,
                    o.setting.changes, o.max_ulp, later, o.order)

        return sorted(outcomes, key=key)


def _problem(rec):
    cls = optimizer_class(rec.optimizer)
    return _Problem(
        optimizer=rec.optimizer, cls=cls, config=dict(rec.config), dtype=rec.dtype,
        sparse=any(isinstance(g, IndexedSlices) for row in rec.gradients for g in row),
        none_grads=any(g is None for row in rec.gradients for g in row),
        variables=len(rec.initial),
    )


def _rep(out):
    """The outcome that stands for ``out`` (itself, or the simpler one it computes the same
    numbers as)."""
    return out.alias_of or out


def _search(rec, tolerance, keep, pairs):
    prob = _problem(rec)
    s = _Search(rec, tolerance, keep)
    bases = {}
    for name in PRESETS:
        out = s.add(_Setting(name, (), ()), "presets")
        if out is not None:
            bases[name] = out
    # nearest presets first, so that the bound on the distance tightens early
    position = {id(o): i for i, o in enumerate(s.ranked())}
    order = sorted(bases, key=lambda n: position[id(_rep(bases[n]))])
    knobs = _relevant_knobs(prob)
    singles = []  # (setting, outcome) of every single change that changes something
    for name in order:
        conv = PRESETS[name]
        settings = [_Setting(name, ((knob, value),), ()) for knob in knobs
                    for value in _alternatives(knob, getattr(conv, knob))]
        settings += [_Setting(name, (), (slip.name,)) for slip in SLIPS.values()
                     if slip.applies(prob, conv)]
        for setting in settings:
            out = s.add(setting, "slips" if setting.slips else "knobs")
            if out is not None and _rep(out) is not _rep(bases[name]):
                singles.append((setting, _rep(out)))
    if pairs and not s.matched():
        # a port with two slips: the nearest single changes, each combined with every other
        # single change of its preset
        position = {id(o): i for i, o in enumerate(s.ranked())}
        singles = [(st, o) for st, o in singles if o.error is None]
        singles.sort(key=lambda so: position[id(so[1])])
        best = list(dict.fromkeys(id(o) for _, o in singles))[:_PAIR_ANCHORS]
        for anchor, o in singles:
            if id(o) not in best:
                continue
            for other, _ in singles:
                both = anchor.combine(other)
                if both is not None:
                    s.add(both, "pairs")
    return s


def _finish(s):
    out = []
    for o in s.ranked():
        setting = o.setting
        conv = setting.convention()
        matches = o.complete and o.error is None and o.max_ulp <= s.tol
        out.append(Candidate(
            description=setting.describe(), preset=setting.preset, knobs=dict(setting.knobs),
            slips=tuple(setting.slips), convention=conv, max_ulp=o.max_ulp,
            per_step=tuple(o.per_step), first_divergence=None if matches else o.first,
            complete=o.complete, matches=matches, error=o.error,
            same_as=tuple(dict.fromkeys(o.same_as)), mismatched=o.mismatched,
        ))
    return out


def explain(source, *, top=5, tolerance_ulp=None, pairs=True, **candidate_options):
    """Find the refopt settings (convention knobs, classic slips) that reproduce a trajectory.

    Parameters
    ----------
    source : str, os.PathLike, dict, Golden, Recording or callable
        A golden file (refopt's ``.npz``/``.json`` format), a bundled golden case (its id,
        e.g. ``"torch/adam_fused_f32"``, its ``.npz`` path or its manifest entry), a
        :class:`Recording`, or a candidate implementation (a factory of stateful optimizers
        or a step function, as ``refopt check`` takes), run by :func:`record_candidate`.
    top : int, default 5
        How many settings the report shows; at least ``max(top, 8)`` are ranked exactly.
    tolerance_ulp : float, optional
        Largest per-step distance that counts as a match. Default: the source's (a bundled
        case's stated tolerance; 0 otherwise).
    pairs : bool, default True
        When nothing matches, also try pairs of changes (two knobs, a knob and a slip, two
        slips): each of the three nearest single changes with every other single change of
        its preset.
    **candidate_options
        For a candidate only: ``optimizer``, ``config``, ``dtype``, ``convention``,
        ``steps``, ``seed``, ``shapes``, ``sparse``, ``slot_map``, ``kind`` (see
        :func:`record_candidate`).

    Returns
    -------
    Explanation
        ``.match`` is the simplest matching setting (None if none), ``.candidates`` every
        setting evaluated, ranked, ``.summary()`` one line and ``.report()`` the text that
        ``refopt explain`` prints.

    Raises
    ------
    FileNotFoundError, ValueError, TypeError
        For a source that cannot be read (named in the message), candidate options given
        with a non-candidate source, or an invalid ``top`` or ``tolerance_ulp``.
    RuntimeError
        When a candidate raises while it is recorded (chained).

    Examples
    --------
    >>> from refopt.testing import explain
    >>> explain("torch/adam_fused_f32").summary()
    'matches torch (0 ulp over 20 steps)'
    """
    if isinstance(top, bool) or not isinstance(top, numbers.Integral) or top < 1:
        raise ValueError(f"`top` must be an integer >= 1. Received: top={top!r}")
    if tolerance_ulp is not None and (isinstance(tolerance_ulp, bool) or not isinstance(
            tolerance_ulp, numbers.Real) or not tolerance_ulp >= 0):
        raise ValueError(f"`tolerance_ulp` must be a number >= 0. Received: "
                         f"tolerance_ulp={tolerance_ulp!r}")
    if callable(source):
        rec = record_candidate(source, **candidate_options)
    else:
        if candidate_options:
            raise TypeError(
                f"{sorted(candidate_options)} apply to a candidate implementation only; "
                f"`source` is a recorded trajectory. Received: source={source!r}")
        rec = load_recording(source)
    tol = rec.tolerance_ulp if tolerance_ulp is None else tolerance_ulp
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # None gradients and ignored clip options warn
        s = _search(rec, tol, max(top, _MIN_KEEP), pairs)
    candidates = _finish(s)
    counts = dict(s.counts)
    counts["total"] = sum(counts[k] for k in ("presets", "knobs", "slips", "pairs"))
    return Explanation(
        source=rec.source, optimizer=rec.optimizer, dtype=rec.dtype.name,
        shapes=tuple(tuple(a.shape) for a in rec.initial), steps=rec.steps,
        tolerance_ulp=tol, declared=rec.declared, candidates=tuple(candidates),
        searched=counts, notes=tuple(rec.notes),
    )

