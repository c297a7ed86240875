"""Writing one recorded case: the ``.npz`` layout and the manifest entry (used by every generator).

``.npz`` keys (``k`` is the 1-based step, ``i`` the variable's position):

``init/{i}``                      the variable before the first step
``grad/{k}/{i}``                  a dense gradient of step ``k``
``grad/{k}/{i}/indices``, ``grad/{k}/{i}/values``   an IndexedSlices gradient
                                  (no key at all: the variable had no gradient, ``None``)
``param/{k}/{i}``                 the variable after step ``k``
``slot/{name}/{k}/{i}``           state after step ``k`` under refopt's slot name
                                  (``m``, ``v``, ``vhat``, ``average``; RMSprop: ``velocity``,
                                  ``momentum``, ``average_gradient``; Adagrad:
                                  ``accumulator``)
``state/{name}/{k}``, ``state/{name}/{k}/{i}``   optimizer state that is not a slot: Nadam's
                                  ``u_product`` (Keras' ``_u_product``, Keras 2's
                                  ``momentum_cache``: one scalar per step) and torch's
                                  ``mu_product`` (one float32 scalar per parameter)

``manifest.json``: ``{"format": 1, "cases": [entry, ...]}``, entries sorted by id; an entry is the
case of ``cases.py`` plus ``file``, ``framework``, ``framework_version`` (a dict of package
versions), ``slots`` (the names recorded) and ``emulated`` (true when the framework's optimizer
no longer exists and the generator rebuilt it from the framework's ops).
"""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data")


def storage_dtype(name):
    """The dtype the arrays of a case of dtype ``name`` are stored in: bfloat16 as its uint16
    bits (``.npz`` has no bfloat16; refopt's ``load_case`` views them back), others as such."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def file_name(case_id):
    return case_id.replace("/", "__") + ".npz"


def save_case(case, *, framework, versions, init, grads, params, slots, emulated=False,
              state=None):
    """Write ``data/<id>.npz`` and put the case's entry into ``data/manifest.json``.

    Parameters
    ----------
    case : dict
        The entry of ``cases.CASES``.
    framework : str
        "tensorflow", "torch" or "optax".
    versions : dict
        Package name -> version string, e.g. ``{"tensorflow": "2.21.0", "tf_keras": "2.21.0"}``.
    init, grads
        What :func:`cases.make_inputs` returned (the inputs actually fed).
    params : list (steps) of list (variables) of ndarray
        The variables after each step.
    slots : dict name -> list (steps) of list (variables) of ndarray
        Recorded state after each step (refopt's slot names).
    emulated : bool
        True when the framework's optimizer was rebuilt from its ops.
    state : dict name -> list (steps) of ndarray or of list (variables), optional
        Optimizer state that is not a slot of refopt's optimizer, written as
        ``state/{name}/{k}`` (one array per step: Keras' Nadam ``u_product``, shared by every
        variable) or ``state/{name}/{k}/{i}`` (one per variable: torch's NAdam
        ``mu_product``); refopt derives it from the step count, the replay does not read it,
        the optimizer's own tests do.
    """
    dtype = storage_dtype(case["dtype"])
    arrays = {}
    for i, a in enumerate(init):
        arrays[f"init/{i}"] = np.asarray(a, dtype)
    for k, row in enumerate(grads, start=1):
        for i, g in enumerate(row):
            if g is None:
                continue
            if isinstance(g, tuple):
                arrays[f"grad/{k}/{i}/indices"] = np.asarray(g[1], np.int64)
                arrays[f"grad/{k}/{i}/values"] = np.asarray(g[2], dtype)
            else:
                arrays[f"grad/{k}/{i}"] = np.asarray(g, dtype)
    assert len(params) == case["steps"], "one list of variables per step"
    for k, row in enumerate(params, start=1):
        for i, p in enumerate(row):
            p = np.asarray(p)
            assert p.dtype == dtype and p.shape == tuple(case["shapes"][i]), (case["id"], k, i)
            arrays[f"param/{k}/{i}"] = p
    for name, per_step in slots.items():
        assert name in ("m", "v", "vhat", "average", "velocity", "momentum",
                        "accumulated_grad", "accumulated_delta",
                        "average_gradient", "accumulator", "u", "linear",
                        "velocity_row", "velocity_col",
                        "ax", "prev", "step_size"), name
        for k, row in enumerate(per_step, start=1):
            for i, s in enumerate(row):
                if s is None:
                    continue
                s = np.asarray(s)
                # Adafactor's factored moments have shapes of their own (the framework's)
                free = name in ("velocity_row", "velocity_col")
                # RowWiseAdagrad's accumulator: one value per row
                free = free or case["optimizer"] == "RowWiseAdagrad"
                assert s.dtype == dtype and (free or s.shape == tuple(case["shapes"][i])), (
                    name, k, i)
                arrays[f"slot/{name}/{k}/{i}"] = s
    for name, per_step in (state or {}).items():
        for k, row in enumerate(per_step, start=1):
            if isinstance(row, list):
                for i, s in enumerate(row):
                    if s is not None:
                        arrays[f"state/{name}/{k}/{i}"] = np.asarray(s)
            else:
                arrays[f"state/{name}/{k}"] = np.asarray(row)
    os.makedirs(DATA, exist_ok=True)
    fname = file_name(case["id"])
    np.savez_compressed(os.path.join(DATA, fname), **arrays)
    entry = dict(case)
    entry.update(file=fname, framework=framework, framework_version=dict(versions),
                 slots=sorted(slots), emulated=bool(emulated))
    path = os.path.join(DATA, "manifest.json")
    with open(os.path.join(DATA, ".manifest.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # generators may run at the same time
        _update_manifest(path, entry)


def _update_manifest(path, entry):
    manifest = {"format": 1, "cases": []}
    if os.path.exists(path):
        with open(path) as f:
            manifest = json.load(f)
    manifest["cases"] = [c for c in manifest["cases"] if c["id"] != entry["id"]] + [entry]
    manifest["cases"].sort(key=lambda c: c["id"])
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
