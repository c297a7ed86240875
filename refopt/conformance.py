"""Replay the golden trajectories recorded from TensorFlow/Keras, PyTorch and optax.

The cases ship inside the package (``refopt/conformance_data/``; in the repository
``conformance/data/`` points there): one ``.npz`` per case and ``manifest.json``. Each was
recorded by a generator in ``conformance/generators/`` running the real framework (pinned
versions, listed per case). A replay builds the refopt optimizer the manifest names with the
case's convention preset and knob overrides, feeds the recorded gradients, and compares the
variables and every recorded state slot after every step with the framework's, in ulp.

Tolerance: each case states its own, in ulp per step. 0 means bit-identical over the whole
trajectory (the replay runs free). Above 0 the replay is resynchronised to the recorded state
before every step, so the bound holds per step and errors cannot accumulate. The reasons
(reductions summed in another order, a framework's sqrt that is not correctly rounded, XLA's
pow and FMA contraction) are in the manifest's ``tolerance_reason``.

Examples
--------
>>> from refopt import conformance
>>> results = conformance.replay_all(filter="tf_keras/adam_f32")
>>> [(r.case, r.passed, r.max_ulp) for r in results]
[('tf_keras/adam_f32', True, 0.0)]
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from importlib import resources

import numpy as np

from refopt.conventions import get_convention
from refopt.indexed_slices import IndexedSlices

__all__ = ["ReplayResult", "framework_versions", "load_case", "load_manifest", "replay",
           "replay_all"]


def _data():
    return resources.files("refopt") / "conformance_data"


def load_manifest():
    """The bundled cases' manifest entries (a list of dicts, sorted by ``id``).

    Each entry has ``id``, ``file``, ``framework``, ``framework_version`` (package ->
    version), ``api``, ``convention``, ``knobs``, ``optimizer``, ``hyperparameters`` (refopt's
    keyword arguments), ``dtype``, ``shapes``, ``steps``, ``seed``, ``grads`` (the kind of
    gradients), ``slots`` (the state recorded), ``tolerance_ulp``, ``tolerance_reason`` and
    ``emulated``.
    """
    with (_data() / "manifest.json").open() as f:
        return json.load(f)["cases"]


def framework_versions(entry):
    """The framework packages a case was recorded with, as ``ReplayResult.version`` shows them.

    Parameters
    ----------
    entry : dict
        A manifest entry (:func:`load_manifest`).

    Returns
    -------
    str
        ``"package version"`` pairs in name order, NumPy and Python left out
        (``"keras 2.15.0, tensorflow 2.15.1, tensorflow_addons 0.23.0"``).
    """
    return ", ".join(f"{k} {v}" for k, v in sorted(entry["framework_version"].items())
                     if k not in ("numpy", "python"))


def load_case(entry):
    """The arrays of one case: ``(init, grads, params, slots)``.

    Returns
    -------
    init : list of ndarray
        The variables before the first step.
    grads : list (steps) of list (variables)
        ndarray, :class:`~refopt.IndexedSlices`, or ``None``.
    params : list (steps) of list of ndarray
        The framework's variables after each step.
    slots : dict name -> list (steps) of list of (ndarray or None)
        The framework's state after each step, under refopt's slot names.
    """
    with (_data() / entry["file"]).open("rb") as f:
        z = dict(np.load(f))
    if entry["dtype"] == "bfloat16":  # stored as the uint16 bits (.npz has no bfloat16)
        from refopt.precision import BFLOAT16

        z = {k: (a.view(BFLOAT16) if a.dtype == np.uint16 else a) for k, a in z.items()}
    n, steps = len(entry["shapes"]), entry["steps"]
    init = [z[f"init/{i}"] for i in range(n)]
    grads = []
    for k in range(1, steps + 1):
        row = []
        for i in range(n):
            if f"grad/{k}/{i}" in z:
                row.append(z[f"grad/{k}/{i}"])
            elif f"grad/{k}/{i}/indices" in z:
                row.append(IndexedSlices(z[f"grad/{k}/{i}/values"], z[f"grad/{k}/{i}/indices"],
                                         tuple(entry["shapes"][i])))
            else:
                row.append(None)
        grads.append(row)
    params = [[z[f"param/{k}/{i}"] for i in range(n)] for k in range(1, steps + 1)]
    slots = {
        name: [[z.get(f"slot/{name}/{k}/{i}") for i in range(n)] for k in range(1, steps + 1)]
        for name in entry["slots"]
    }
    return init, grads, params, slots


@dataclass(frozen=True)
class ReplayResult:
    """The outcome of replaying one case.

    Attributes
    ----------
    case, framework, version, optimizer, convention, backend : str
        What was replayed (``version``: "tensorflow 2.21.0, tf_keras 2.21.0", ...).
    steps : int
    max_ulp : float
        The largest distance, in ulp, over every step, variable and recorded slot
        (``inf`` when NaN positions differ).
    tolerance_ulp : int
    passed : bool
    detail : str
        Where the largest distance was (or the error raised), for the report.
    """

    case: str
    framework: str
    version: str
    optimizer: str
    convention: str
    backend: str
    steps: int
    max_ulp: float
    tolerance_ulp: int
    passed: bool
    detail: str


def _optimizer(entry, backend):
    import refopt
    from refopt import schedules

    cls = getattr(refopt, entry["optimizer"])
    hyper = dict(entry["hyperparameters"])
    if isinstance(hyper.get("learning_rate"), dict):
        hyper["learning_rate"] = schedules.deserialize(hyper["learning_rate"])
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    return cls(**hyper, convention=conv, backend=backend)


class _Host:
    """Variables as NumPy arrays (backends "reference" and "cpu")."""

    def make(self, a):
        return a.copy()

    def grad(self, g):
        return g

    def get(self, a):
        return np.array(a)

    def put(self, dst, src):
        np.copyto(dst, src)


class _Device:
    """Variables as numba device arrays (backend "cuda")."""

    def __init__(self):
        from refopt.kernels import cuda as kc

        self.kc = kc

    def make(self, a):
        return self.kc.to_device(a)

    def grad(self, g):
        return g if g is None or isinstance(g, IndexedSlices) else self.kc.to_device(g)

    def get(self, a):
        return a.copy_to_host()

    def put(self, dst, src):
        dst.copy_to_device(np.ascontiguousarray(src))


def replay(entry, backend="reference"):
    """Replay one manifest entry through refopt; return a :class:`ReplayResult`.

    Parameters
    ----------
    entry : dict
        One entry of :func:`load_manifest`.
    backend : {"reference", "cpu", "cuda"}
        The refopt backend. ``"cuda"`` needs a GPU or numba's simulator (every convention).

    Returns
    -------
    ReplayResult
        ``passed`` is False (with the error in ``detail``) when refopt raises.
    """
    from refopt.testing.conformance import ulp_distance

    tol = entry["tolerance_ulp"]
    version = framework_versions(entry)
    init, grads, params, slots = load_case(entry)
    io = _Device() if backend == "cuda" else _Host()
    worst, where = 0.0, "all equal"
    try:
        opt = _optimizer(entry, backend)
        sched = None
        if entry.get("lr_scheduler"):  # torch.optim.lr_scheduler, stepped after each step
            from refopt.lr_scheduler import from_config

            sched = from_config(opt, entry["lr_scheduler"])
        variables = [io.make(a) for a in init]
        for k in range(entry["steps"]):
            if tol > 0 and k > 0:  # resync: the bound is per step
                for i, var in enumerate(variables):
                    io.put(var, params[k - 1][i])
                    for name, per_step in slots.items():
                        if per_step[k - 1][i] is not None and name in opt.slot_names:
                            io.put(opt.get_slot(var, name), per_step[k - 1][i])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # None gradients warn, as in Keras
                opt.apply_gradients([(io.grad(g), v) for g, v in zip(grads[k], variables)])
                if sched is not None:
                    sched.step()
            checks = [("param", i, io.get(v), params[k][i]) for i, v in enumerate(variables)]
            for name, per_step in slots.items():
                for i, var in enumerate(variables):
                    want = per_step[k][i]
                    if want is not None:
                        checks.append((name, i, io.get(opt.get_slot(var, name)), want))
            for name, i, got, want in checks:
                d = ulp_distance(got, want)
                m = float(d.max()) if d.size else 0.0
                if m > worst:
                    j = int(np.argmax(d))
                    worst = m
                    where = (f"step {k + 1}, {name} of variable {i}, element {j}: refopt "
                             f"{got.flat[j]!r}, {entry['framework']} {want.flat[j]!r}")
    except Exception as exc:  # reported, not raised: one failing case must not hide others
        return ReplayResult(entry["id"], entry["framework"], version, entry["optimizer"],
                            entry["convention"], backend, entry["steps"], float("inf"), tol,
                            False, f"{type(exc).__name__}: {exc}")
    return ReplayResult(entry["id"], entry["framework"], version, entry["optimizer"],
                        entry["convention"], backend, entry["steps"], worst, tol,
                        worst <= tol, where)


def replay_all(backend="reference", filter=None):
    """Replay every bundled case whose id contains ``filter`` (all when None).

    Returns
    -------
    list of ReplayResult
        In manifest order.
    """
    entries = [e for e in load_manifest() if filter is None or filter in e["id"]]
    return [replay(e, backend=backend) for e in entries]
