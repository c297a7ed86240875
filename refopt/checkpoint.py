"""Save and restore an optimizer's complete state in one ``.npz`` file, atomically.

:func:`save_checkpoint` writes the configuration (``get_config()``), ``iterations``, the current
learning rate, every slot (``m``, ``v``, ``vhat``, the EMA ``average``) of every variable and,
by default, the variables themselves. :func:`load_checkpoint` restores them into a *new*
optimizer of the same class and configuration, so that the resumed run is bit-identical to the
one that was not interrupted (schedules, EMA, AMSGrad and LazyAdam included).

Only the optimizer's public API is used: ``get_config``, ``iterations`` (set before building, as
tf-keras allows), ``build``, ``variables`` and ``get_slot`` (whose live arrays are written with
``np.copyto``, or ``copy_to_device`` on the GPU).

``backend="cuda"``: the variables are device arrays (numba's, or objects with
``__cuda_array_interface__``); saving copies them and every slot to the host, loading copies the
saved values into the device slots and variables in place, after every check has passed. The
file is the same, so a checkpoint moves between backends (``backend`` is not compared).

File layout (``format_version`` 1)
----------------------------------
An uncompressed ``.npz`` (``numpy.load``) with

- ``meta``: 0-d string array, a JSON object: ``format`` (``"refopt-checkpoint"``),
  ``format_version``, ``refopt_version``, ``class`` (e.g. ``"Adam"``), ``config``
  (``get_config()``, a schedule as ``{"class_name", "config"}``), ``iterations``,
  ``learning_rate`` (the current value, ``float.hex``), ``built``, ``shapes``, ``dtypes``,
  ``slots`` (names) and ``has_variables``;
- ``slot_{name}_{i}``: slot ``name`` of variable ``i`` (when built);
- ``variable_{i}``: variable ``i`` (when saved);
- ``sha256``: hex digest of every other entry (name, dtype, shape and bytes, in sorted name
  order), checked on load on top of the zip format's CRC-32.

Writing goes to a temporary file in the destination's folder, which is flushed, ``fsync``-ed
and renamed over the destination with ``os.replace`` (atomic on POSIX and Windows): a crash
mid-write leaves the previous checkpoint, or none, never a partial one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import numbers
import os
import tempfile

import numpy as np

from refopt.optimizers.base import Optimizer

__all__ = ["FORMAT_VERSION", "CheckpointError", "load_checkpoint", "save_checkpoint"]

#: The checkpoint layout written by this version; files of a newer version are refused.
FORMAT_VERSION = 1
_FORMAT = "refopt-checkpoint"
# Config keys that do not change the numbers (names, and the backends, which all match the
# reference bit for bit); a checkpoint may be resumed with other values of these.
_IGNORED_CONFIG_KEYS = ("name", "backend", "jit_compile")


class CheckpointError(ValueError):
    """A checkpoint file cannot be read, is corrupted, or does not match the optimizer."""


def _jsonable(x):
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.generic):
        return x.item()
    return x


def _normalized_config(optimizer):
    config = json.loads(json.dumps(_jsonable(optimizer.get_config())))
    return {k: v for k, v in config.items() if k not in _IGNORED_CONFIG_KEYS}


def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"`optimizer` must be a refopt optimizer. Received: {type(optimizer).__name__}"
        )


def _check_variables(variables, optimizer):
    """The variables as a list, and their arrays (numba views for ``backend="cuda"``)."""
    variables, arrays = optimizer._executor.checkpoint_arrays(variables)
    if len({id(v) for v in variables}) != len(variables):
        raise ValueError("`variables` lists the same array twice.")
    return variables, arrays


def _to_host(a):
    """``a`` itself if it is a host ndarray, else a host copy of the device array."""
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def _write_into(target, value):
    """Copy ``value`` (host) into the live array ``target`` (host or device) in place."""
    if isinstance(target, np.ndarray):
        np.copyto(target, value)
    elif value.size:
        target.copy_to_device(np.ascontiguousarray(value))


def _built_count(optimizer):
    """Number of variables the optimizer was built with (0 when not built)."""
    if not optimizer.built:
        return 0
    return (len(optimizer.variables) - 1) // max(len(optimizer.slot_names), 1)


def _digest(arrays):
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _write_atomic(path, arrays):
    """np.savez into a temporary file beside ``path``, fsync, then os.replace onto ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"Cannot write the checkpoint {os.fspath(path)}: the folder {directory} does not exist."
        )
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable (POSIX; no-op elsewhere)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _write_file(path, meta, arrays):
    arrays = dict(arrays, meta=np.array(json.dumps(meta)))
    arrays["sha256"] = np.array(_digest(arrays))
    _write_atomic(path, arrays)


def save_checkpoint(path, optimizer, variables, *, include_variables=True):
    """Save an optimizer's full state (and, by default, its variables) to one ``.npz`` file.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write, used as given (no suffix is added). Replaced atomically if it exists.
    optimizer : refopt.Optimizer
        Built or not yet built.
    variables : list of ndarray (device arrays for ``backend="cuda"``)
        The variables, in a fixed order (the same order :func:`load_checkpoint` will get). Once
        the optimizer is built, exactly the variables it was built with. Device arrays and
        slots are copied to the host.
    include_variables : bool, default True
        Also save the variables' values.

    Returns
    -------
    dict
        The metadata written (see the module docstring).

    Raises
    ------
    TypeError
        If ``optimizer`` is not a refopt optimizer or ``variables`` not a list of ndarrays
        (of device arrays for ``backend="cuda"``: a host ndarray is refused, naming
        ``to_device``).
    ValueError
        If ``variables`` is not the list the optimizer was built with (count, or an unknown
        array).
    OSError
        If the file cannot be written (then the previous file, if any, is untouched).
    """
    from refopt import __version__

    _check_optimizer(optimizer)
    variables, views = _check_variables(variables, optimizer)
    built = _built_count(optimizer) > 0
    names = optimizer.slot_names
    arrays = {}
    if built:
        n_built = _built_count(optimizer)
        if len(variables) != n_built:
            raise ValueError(
                f"`variables` must be the {n_built} variables the optimizer was built with. "
                f"Received: {len(variables)} arrays"
            )
        for i, var in enumerate(variables):
            for name in names:
                try:
                    arrays[f"slot_{name}_{i}"] = _to_host(optimizer.get_slot(var, name))
                except KeyError:
                    raise ValueError(
                        f"`variables[{i}]` (shape {tuple(views[i].shape)}, {views[i].dtype}) is "
                        "not a variable the optimizer was built with."
                    ) from None
    if include_variables:
        for i, view in enumerate(views):
            arrays[f"variable_{i}"] = _to_host(view)
    lr = optimizer.learning_rate
    meta = {
        "format": _FORMAT,
        "format_version": FORMAT_VERSION,
        "refopt_version": __version__,
        "class": type(optimizer).__name__,
        "config": _jsonable(optimizer.get_config()),
        "iterations": int(optimizer.iterations),
        "learning_rate": None if lr is None else float(lr).hex(),
        "built": built,
        "shapes": [list(v.shape) for v in views],
        "dtypes": [np.dtype(v.dtype).name for v in views],
        "slots": list(names) if built else [],
        "has_variables": bool(include_variables),
        # convention step_counter="per_variable" (torch): each variable's own step count
        "variable_steps": list(map(int, optimizer._var_steps)) if built else [],
    }
    _write_file(path, meta, arrays)
    return meta


def _read(path):
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}  # reads (and CRC-checks) every member
        meta = json.loads(str(arrays.pop("meta")))
        digest = str(arrays.pop("sha256"))
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - zip, npy and JSON errors all mean a bad file
        raise CheckpointError(
            f"Cannot read the checkpoint {os.fspath(path)}: it is truncated, corrupted or not a "
            f"refopt checkpoint ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise CheckpointError(f"{os.fspath(path)} is not a refopt checkpoint (format "
                              f"{meta.get('format') if isinstance(meta, dict) else None!r}).")
    if _digest(dict(arrays, meta=np.array(json.dumps(meta)))) != digest:
        raise CheckpointError(
            f"The checkpoint {os.fspath(path)} is corrupted: its SHA-256 does not match its "
            "contents."
        )
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{os.fspath(path)} has an invalid format_version={version!r}.")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{os.fspath(path)} was written by refopt {meta.get('refopt_version')} in checkpoint "
            f"format {version}; this refopt reads format {FORMAT_VERSION} and older. Upgrade "
            "refopt to load it."
        )
    return meta, arrays


def _expect(arrays, key, shape, dtype, path):
    a = arrays.get(key)
    if a is None or a.shape != shape or a.dtype != dtype:
        raise CheckpointError(
            f"The checkpoint {os.fspath(path)} is inconsistent: entry {key!r} should be "
            f"{dtype} of shape {shape}, found "
            f"{'nothing' if a is None else f'{a.dtype} of shape {a.shape}'}."
        )
    return a


def load_checkpoint(path, optimizer, variables, *, restore_variables=True):
    """Restore a checkpoint into a new optimizer (and its variables); all or nothing.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_checkpoint`.
    optimizer : refopt.Optimizer
        A new, **not yet built** optimizer of the saved class and configuration (create it as
        the saved one was; ``name``, ``backend`` and ``jit_compile`` may differ). Call its
        ``exclude_from_weight_decay`` before loading if the saved one used it: that setting is
        not part of ``get_config`` and is not saved.
    variables : list of ndarray (device arrays for ``backend="cuda"``)
        The variables, in the order given to :func:`save_checkpoint`, each of the saved shape
        and dtype, C-contiguous and writeable. The optimizer is built with them; on the GPU the
        saved values are copied into the device slots and variables in place.
    restore_variables : bool, default True
        Copy the saved values into ``variables`` (when the checkpoint has them).

    Returns
    -------
    dict
        The checkpoint's metadata.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    CheckpointError
        (a ``ValueError``) if the file is truncated, corrupted or not a checkpoint, was written
        in a newer format version, or does not match: another optimizer class or
        configuration, another number of variables, or a variable of another shape or dtype.
        The message names what differs.
    ValueError
        If the optimizer is already built, or a variable is not C-contiguous and writeable.
    TypeError
        If ``optimizer`` is not a refopt optimizer or ``variables`` not a list of ndarrays
        (of device arrays for ``backend="cuda"``: a host ndarray is refused, naming
        ``to_device``).

    Notes
    -----
    Nothing is modified unless every check passes. Then ``iterations`` is set, the optimizer is
    built with ``variables``, and every slot and EMA average is overwritten with the saved one.
    With a learning-rate schedule, ``optimizer.learning_rate`` is the saved value (the one the
    last step before the save used), as it was before saving.
    """
    _check_optimizer(optimizer)
    variables, views = _check_variables(variables, optimizer)
    meta, arrays = _read(path)
    p = os.fspath(path)
    if meta.get("class") != type(optimizer).__name__:
        raise CheckpointError(
            f"{p} holds the state of an optimizer of class {meta.get('class')}; cannot load "
            f"it into one of class {type(optimizer).__name__}."
        )
    saved = {k: v for k, v in meta["config"].items() if k not in _IGNORED_CONFIG_KEYS}
    current = _normalized_config(optimizer)
    diffs = [f"{k}: saved {saved.get(k, '(absent)')!r}, "
             f"this optimizer {current.get(k, '(absent)')!r}"
             for k in sorted(set(saved) | set(current)) if saved.get(k) != current.get(k)]
    if diffs:
        raise CheckpointError(
            f"{p} was saved from an optimizer with another configuration; create the optimizer "
            "with the saved one (optimizer.from_config). Differences: " + "; ".join(diffs)
        )
    if _built_count(optimizer) > 0:
        raise ValueError(
            "load_checkpoint needs a new optimizer that has not been built yet (no build() or "
            "apply_gradients() call): `iterations` can only be set before building."
        )
    shapes = [tuple(s) for s in meta["shapes"]]
    dtypes = [np.dtype(d) for d in meta["dtypes"]]
    if len(variables) != len(shapes):
        raise CheckpointError(
            f"{p} holds {len(shapes)} variables; `variables` has {len(variables)}."
        )
    for i, (var, shape, dtype) in enumerate(zip(views, shapes, dtypes)):
        if tuple(var.shape) != shape or np.dtype(var.dtype) != dtype:
            raise CheckpointError(
                f"`variables[{i}]` has shape {tuple(var.shape)} and dtype {var.dtype}; the "
                f"checkpoint {p} saved shape {shape} and dtype {dtype}."
            )
        if isinstance(var, np.ndarray) and not (var.flags.c_contiguous and var.flags.writeable):
            raise ValueError(f"`variables[{i}]` must be C-contiguous and writeable.")
    iterations = meta.get("iterations")
    if not isinstance(iterations, numbers.Integral) or isinstance(iterations, bool) \
            or not 0 <= iterations < 2**63:
        raise CheckpointError(f"{p} has an invalid iterations={iterations!r}.")
    names = optimizer.slot_names
    if meta["built"] and list(names) != meta["slots"]:
        raise CheckpointError(f"{p} has slots {meta['slots']}; this optimizer has {list(names)}.")
    slots = {}
    if meta["built"]:
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            for name in names:
                slots[name, i] = _expect(arrays, f"slot_{name}_{i}",
                                         tuple(optimizer.slot_shape(name, shape)), dtype, p)
    values = []
    if restore_variables and meta["has_variables"]:
        values = [_expect(arrays, f"variable_{i}", s, d, p)
                  for i, (s, d) in enumerate(zip(shapes, dtypes))]

    steps = meta.get("variable_steps", [])
    if not isinstance(steps, list) or not all(
            isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= iterations
            for k in steps):
        raise CheckpointError(f"{p} has an invalid variable_steps={steps!r}.")
    # Every check passed: now change things (none of the calls below can fail on valid input).
    optimizer.iterations = int(iterations)
    if meta.get("learning_rate") is not None and not isinstance(
        optimizer.get_config()["learning_rate"], numbers.Real
    ):
        # A schedule: show the value the last saved step used, as before the save.
        optimizer._current_learning_rate = float.fromhex(meta["learning_rate"])
    if meta["built"]:
        optimizer.build(variables)
        if len(steps) == len(variables):
            optimizer._var_steps = list(steps)
        for (name, i), value in slots.items():
            _write_into(optimizer.get_slot(variables[i], name), value)
    for var, value in zip(views, values):
        _write_into(var, value)
    return meta
