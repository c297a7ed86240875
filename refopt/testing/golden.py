r"""Golden trajectory files: refopt's exact results, for test suites in other languages.

``refopt golden`` (and :func:`write_golden`) replays a :class:`~refopt.testing.Trajectory`
through refopt's reference backend and writes the inputs and the state after every step to a
``.npz`` file and to a JSON file. Both hold the same numbers; JSON is for languages without an
``.npy`` reader.

JSON format (``format_version`` 1)
----------------------------------
One object::

    {
      "format": "refopt-golden",   "format_version": 1,   "refopt_version": "0.1.0",
      "optimizer": "Adam",         "convention": "tf_keras",   "dtype": "float32",
      "config": {...},             # the optimizer's get_config(): every hyperparameter
      "seed": 0,                   # of the generated inputs (null when not generated)
      "shapes": [[3, 4], [5]],     # one per variable
      "gradient_kinds": ["dense", "sparse"],
      "slots": ["m", "v"],         # state arrays per variable ("average" with EMA)
      "steps": 2,
      "initial": {"params": [P0, P1], "slots": {"m": [M0, M1], "v": [V0, V1]}},
      "trajectory": [              # one entry per step, in order
        {"step": 1, "learning_rate": "0x1.47ae14p-7",
         "gradients": [{"values": G0}, {"indices": [4, 0, 4], "values": G1}],
         "params": [P0, P1], "slots": {"m": [M0, M1], "v": [V0, V1]}},
        ...
      ]
    }

- Every array is a flat list in C (row-major) order, of ``prod(shape)`` elements.
- Every floating-point number (array elements and ``learning_rate``) is a string written by
  Python's ``float.hex``: ``"0x1.99999a0000000p-4"``, ``"-0x0.0p+0"``, ``"inf"``, ``"-inf"``,
  ``"nan"``. The value is exact: parse it as a double (C/C++ ``strtod``, Java
  ``Double.parseDouble``, Go ``strconv.ParseFloat``; in Rust the ``hexf-parse`` crate) and
  convert it to ``dtype``; the conversion is exact because the number is a ``dtype`` value.
  NaN payloads are not kept.
- A dense gradient is ``{"values": [...]}`` with the variable's shape. A sparse gradient
  (``IndexedSlices``) is ``{"indices": [...], "values": [...]}``: ``len(indices)`` rows of
  ``prod(shape[1:])`` elements; indices may repeat (their rows are summed) and are unsorted.
- ``initial`` is the state after building the optimizer (zero slots; ``average`` equals the
  initial variables); ``trajectory[k]`` the state after step ``k + 1`` and the learning rate it
  used (a schedule evaluated at ``k``, rounded to float32).
- ``config`` values are JSON numbers (Python's shortest round-trip decimals), booleans, null,
  or a ``{"class_name", "config"}`` object for a learning-rate schedule. Apply them as refopt
  does: ``learning_rate`` is rounded to float32 first; see the README's numerics notes.

NPZ layout (``numpy.load``)
---------------------------
``meta``: 0-d string array, the JSON object above without ``initial`` and ``trajectory``;
``params_{i}``: shape ``(steps + 1, *shape_i)``, index 0 the initial variable, ``k`` after step
``k``; ``slot_{name}_{i}``: likewise for each slot; ``learning_rate``: float32, ``(steps,)``;
a dense gradient ``grad_{i}``: ``(steps, *shape_i)``; a sparse one ``grad_{i}_indices`` (int64),
``grad_{i}_values`` (rows of all steps, concatenated) and ``grad_{i}_offsets`` (``steps + 1``
int64: step ``k``'s rows are ``offsets[k-1]:offsets[k]``).

:func:`read_golden` reads either file back into a trajectory and the recorded states.
"""

from __future__ import annotations

import inspect
import json
import numbers
import os

import numpy as np

from refopt.checkpoint import _jsonable  # one JSON-safe conversion for both file formats
from refopt.indexed_slices import IndexedSlices
from refopt.testing.trajectory import (
    State,
    Trajectory,
    optimizer_class,
    run_reference,
    slot_names,
)

__all__ = ["FORMAT_VERSION", "Golden", "make_trajectory", "read_golden", "write_golden"]

#: The version of the file layout written by this module; readers refuse newer versions.
FORMAT_VERSION = 1
_FORMAT = "refopt-golden"


def make_trajectory(*, optimizer="Adam", config=None, dtype="float32", shapes=((3,),), steps=3,
                    seed=0, sparse=False, convention=None):
    """A reproducible trajectory from a seed (NumPy's PCG64), for golden files.

    Parameters
    ----------
    optimizer : str, default "Adam"
        A refopt optimizer class name.
    config : dict, optional
        Its constructor arguments (refopt's defaults for the others).
    dtype : {"float16", "float32", "float64"}, default "float32"
    shapes : sequence of tuple of int, default ((3,),)
        One shape per variable.
    steps : int, default 3
        Number of steps (>= 0).
    seed : int, default 0
        Seed of ``numpy.random.default_rng``.
    sparse : bool, default False
        Give every variable of at least one non-empty dimension an
        :class:`~refopt.IndexedSlices` gradient: ``0`` to ``rows + 2`` indices drawn with
        replacement (so duplicates and absent rows occur), in random order.
    convention : str, optional
        Default: the optimizer's own (``"tf_keras"``; ``"torch"`` for RAdam, ASGD, Rprop).

    Returns
    -------
    refopt.testing.Trajectory
        Initial variables ~ N(0, 1) and gradient elements ~ N(0, 0.1), rounded to ``dtype``.

    Raises
    ------
    ValueError, TypeError
        For an unknown optimizer or dtype, a negative ``steps`` or a bad shape.
    """
    if not isinstance(steps, numbers.Integral) or isinstance(steps, bool) or steps < 0:
        raise ValueError(f"`steps` must be an integer >= 0. Received: steps={steps!r}")
    shapes = [tuple(int(d) for d in s) for s in shapes]
    for s in shapes:
        if any(d < 0 for d in s):
            raise ValueError(f"`shapes` must hold non-negative sizes. Received: shape {s}")
    dtype = np.dtype(dtype)
    rng = np.random.default_rng(seed)
    initial = [np.array(rng.standard_normal(s), dtype=dtype) for s in shapes]
    kinds = [sparse and len(s) >= 1 and s[0] > 0 for s in shapes]
    grads = []
    for _ in range(steps):
        step = []
        for s, is_sparse in zip(shapes, kinds):
            if is_sparse:
                idx = rng.integers(0, s[0], size=int(rng.integers(0, s[0] + 3)))
                values = (0.1 * rng.standard_normal((idx.size,) + s[1:])).astype(dtype)
                step.append(IndexedSlices(values, idx.astype(np.int64), s))
            else:
                step.append(np.array(0.1 * rng.standard_normal(s), dtype=dtype))
        grads.append(step)
    return Trajectory(optimizer, config or {}, dtype, initial, grads, convention)


def _kinds(trajectory):
    kinds = []
    for i in range(len(trajectory.initial)):
        sparse = {isinstance(step[i], IndexedSlices) for step in trajectory.gradients}
        if len(sparse) > 1:
            raise ValueError(
                f"Variable {i} has dense gradients at some steps and sparse ones at others; a "
                "golden file keeps one kind per variable."
            )
        kinds.append("sparse" if sparse == {True} else "dense")
    return kinds


def _hex(x):
    return float(x).hex()


def _hexes(a):
    return [float(x).hex() for x in np.asarray(a, dtype=np.float64).reshape(-1)]


def _header(trajectory, optimizer, seed):
    from refopt import __version__

    return {
        "format": _FORMAT,
        "format_version": FORMAT_VERSION,
        "refopt_version": __version__,
        "optimizer": trajectory.optimizer,
        "convention": trajectory.convention,
        "dtype": trajectory.dtype.name,
        "config": _jsonable(optimizer.get_config()),
        "seed": seed,
        "shapes": [list(a.shape) for a in trajectory.initial],
        "gradient_kinds": _kinds(trajectory),
        "slots": list(slot_names(optimizer)),
        "steps": trajectory.steps,
    }


def write_golden(trajectory, *, npz_path=None, json_path=None, seed=None):
    """Replay a trajectory through refopt and write the golden file(s).

    Parameters
    ----------
    trajectory : refopt.testing.Trajectory
        A variable's gradients must be all dense or all sparse.
    npz_path, json_path : str or os.PathLike, optional
        Where to write each format (used as given: no suffix is added). At least one.
    seed : int, optional
        Recorded as ``seed`` in the metadata (the seed that generated the inputs).

    Returns
    -------
    dict
        The JSON document (also when only the ``.npz`` is written).

    Raises
    ------
    ValueError
        If no path is given or a variable mixes dense and sparse gradients.
    OSError
        If a file cannot be written.
    TypeError, ValueError, NotImplementedError
        From refopt, for a configuration it refuses.
    """
    if npz_path is None and json_path is None:
        raise ValueError("Give `npz_path`, `json_path` or both.")
    optimizer = trajectory.make_optimizer()
    header = _header(trajectory, optimizer, seed)
    states = run_reference(trajectory)
    names = header["slots"]
    n = len(trajectory.initial)

    doc = dict(header)
    doc["initial"] = {
        "params": [_hexes(p) for p in states[0].params],
        "slots": {name: [_hexes(a) for a in states[0].slots[name]] for name in names},
    }
    doc["trajectory"] = []
    for k, (grads, state) in enumerate(zip(trajectory.gradients, states[1:]), 1):
        gradients = []
        for g in grads:
            if isinstance(g, IndexedSlices):
                gradients.append({"indices": [int(i) for i in g.indices],
                                  "values": _hexes(g.values)})
            else:
                gradients.append({"values": _hexes(g)})
        doc["trajectory"].append({
            "step": k,
            "learning_rate": _hex(state.learning_rate),
            "gradients": gradients,
            "params": [_hexes(p) for p in state.params],
            "slots": {name: [_hexes(a) for a in state.slots[name]] for name in names},
        })

    if json_path is not None:
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(_dumps(doc))
    if npz_path is not None:
        arrays = {"meta": np.array(json.dumps(header)),
                  "learning_rate": np.array([s.learning_rate for s in states[1:]], np.float32)}
        for i in range(n):
            arrays[f"params_{i}"] = np.stack([s.params[i] for s in states])
            for name in names:
                arrays[f"slot_{name}_{i}"] = np.stack([s.slots[name][i] for s in states])
            steps = [grads[i] for grads in trajectory.gradients]
            shape = trajectory.initial[i].shape
            if header["gradient_kinds"][i] == "sparse":
                arrays[f"grad_{i}_indices"] = np.concatenate(
                    [np.zeros(0, np.int64)] + [g.indices.astype(np.int64) for g in steps])
                arrays[f"grad_{i}_values"] = np.concatenate(
                    [np.zeros((0,) + shape[1:], trajectory.dtype)] + [g.values for g in steps])
                arrays[f"grad_{i}_offsets"] = np.cumsum([0] + [len(g.indices) for g in steps],
                                                        dtype=np.int64)
            else:
                arrays[f"grad_{i}"] = np.stack(steps) if steps else \
                    np.zeros((0,) + shape, trajectory.dtype)
        with open(npz_path, "wb") as f:
            np.savez(f, **arrays)
    return doc


def _dumps(doc):
    """JSON text with one line per header key and per step (diff-friendly, still json.load-able)."""
    lines = []
    for key, value in doc.items():
        if key == "trajectory":
            steps = ",\n".join("  " + json.dumps(entry) for entry in value)
            lines.append(f'"trajectory": [\n{steps}\n]' if value else '"trajectory": []')
        else:
            lines.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


class Golden:
    """A golden file read back: its metadata, its trajectory and the recorded states.

    Attributes
    ----------
    meta : dict
        The header (format, versions, optimizer, config, convention, dtype, shapes, slots, ...).
    trajectory : refopt.testing.Trajectory
        The inputs, with the recorded ``config`` less the arguments left at refopt's defaults
        (so :func:`refopt.testing.check_trajectory` can replay them through a candidate).
    states : list of refopt.testing.State
        ``steps + 1`` states: the initial one and the one after each step.
    """

    def __init__(self, meta, trajectory, states):
        self.meta = meta
        self.trajectory = trajectory
        self.states = states


def _check_header(meta, path):
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise ValueError(f"{os.fspath(path)} is not a refopt golden file (no format "
                         f"{_FORMAT!r} in its header)")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{os.fspath(path)} has format_version={version!r}; this refopt reads golden files "
            f"up to version {FORMAT_VERSION}. Upgrade refopt."
        )


def _config_for_trajectory(optimizer, config):
    """The recorded config without bookkeeping keys and without arguments left at their
    defaults, so that a candidate factory gets only what matters (as from the strategies)."""
    drop = ("name", "backend", "convention", "jit_compile", "is_legacy_optimizer")
    defaults = {k: p.default for k, p in
                inspect.signature(optimizer_class(optimizer)).parameters.items()}
    return {k: v for k, v in config.items()
            if k not in drop and not (k in defaults and type(v) is type(defaults[k])
                                      and v == defaults[k])}


def read_golden(path):
    """Read a golden ``.json`` or ``.npz`` file (chosen by content, not by suffix).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    Golden

    Raises
    ------
    ValueError
        If the file is not a refopt golden file, or was written by a newer format version.
    OSError
        If it cannot be read.
    """
    with open(path, "rb") as f:
        is_zip = f.read(4) == b"PK\x03\x04"
    if is_zip:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            _check_header(meta, path)
            return _from_npz(meta, {k: z[k] for k in z.files})
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    _check_header(doc, path)
    return _from_json(doc)


def _from_json(doc):
    dtype = np.dtype(doc["dtype"])
    shapes = [tuple(s) for s in doc["shapes"]]

    def arr(values, shape):
        return np.array([float.fromhex(v) for v in values], np.float64).astype(dtype).reshape(shape)

    def state(entry, lr):
        params = tuple(arr(p, s) for p, s in zip(entry["params"], shapes))
        slots = {name: tuple(arr(a, s) for a, s in zip(arrays, shapes))
                 for name, arrays in entry["slots"].items()}
        return State(params, slots, lr)

    states = [state(doc["initial"], None)]
    grads = []
    for entry in doc["trajectory"]:
        step = []
        for g, s in zip(entry["gradients"], shapes):
            if "indices" in g:
                idx = np.array(g["indices"], np.int64)
                step.append(IndexedSlices(arr(g["values"], (idx.size,) + s[1:]), idx, s))
            else:
                step.append(arr(g["values"], s))
        grads.append(step)
        states.append(state(entry, float.fromhex(entry["learning_rate"])))
    meta = {k: v for k, v in doc.items() if k not in ("initial", "trajectory")}
    config = _config_for_trajectory(doc["optimizer"], doc["config"])
    trajectory = Trajectory(doc["optimizer"], config, dtype, states[0].params, grads,
                            doc["convention"])
    return Golden(meta, trajectory, states)


def _from_npz(meta, z):
    dtype = np.dtype(meta["dtype"])
    n, steps, names = len(meta["shapes"]), meta["steps"], meta["slots"]
    states = []
    for k in range(steps + 1):
        lr = None if k == 0 else float(z["learning_rate"][k - 1])
        states.append(State(tuple(np.asarray(z[f"params_{i}"][k]) for i in range(n)),
                            {name: tuple(np.asarray(z[f"slot_{name}_{i}"][k]) for i in range(n))
                             for name in names}, lr))
    grads = [[None] * n for _ in range(steps)]
    for i, kind in enumerate(meta["gradient_kinds"]):
        shape = tuple(meta["shapes"][i])
        for k in range(steps):
            if kind == "sparse":
                lo, hi = z[f"grad_{i}_offsets"][k], z[f"grad_{i}_offsets"][k + 1]
                grads[k][i] = IndexedSlices(z[f"grad_{i}_values"][lo:hi],
                                            z[f"grad_{i}_indices"][lo:hi], shape)
            else:
                grads[k][i] = z[f"grad_{i}"][k]
    config = _config_for_trajectory(meta["optimizer"], meta["config"])
    trajectory = Trajectory(meta["optimizer"], config, dtype, states[0].params, grads,
                            meta["convention"])
    return Golden(meta, trajectory, states)
