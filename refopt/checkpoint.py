"""Save and restore an optimizer's complete state in one ``.npz`` file, atomically.

:func:`save_checkpoint` writes the configuration (``get_config()``), ``iterations``, the current
learning rate, every slot (``m``, ``v``, ``vhat``, the EMA ``average``) of every variable and,
by default, the variables themselves. :func:`load_checkpoint` restores them into a *new*
optimizer of the same class and configuration (yours, or one it creates from the file alone:
``optimizer, variables = load_checkpoint(path)``), so that the resumed run is bit-identical to
the one that was not interrupted (schedules, EMA, AMSGrad and LazyAdam included).

The state is defined once, by :meth:`refopt.Optimizer.state_dict` and
:meth:`~refopt.Optimizer.load_state_dict` (all or nothing); this module flattens it into the
file below and back, and adds the variables, the checks of the file and the atomic write.

``backend="cuda"``: the variables are device arrays (numba's, or objects with
``__cuda_array_interface__``); saving copies them and every slot to the host, loading copies the
saved values into the device slots and variables in place, after every check has passed. The
file is the same, so a checkpoint moves between backends (``backend`` is not compared).
An optimizer created from the file alone gets the ``backend=`` argument of
:func:`load_checkpoint`, else the default backend (:func:`refopt.executors.default_backend`,
``$REFOPT_BACKEND``), never the saved one: every backend gives the same bits, and a
checkpoint saved on a GPU must load on a machine without one.

File layout (``format_version`` 1)
----------------------------------
An uncompressed ``.npz`` (``numpy.load``) with

- ``meta``: 0-d string array, a JSON object: ``format`` (``"refopt-checkpoint"``),
  ``format_version``, ``refopt_version``, ``class`` (e.g. ``"Adam"``), ``config``
  (``get_config()``, a schedule as ``{"class_name", "config"}``), ``iterations``,
  ``learning_rate`` (the current value, ``float.hex``), ``built``, ``shapes``, ``dtypes``,
  ``slots`` (names), ``has_variables``, ``variable_steps`` and ``excluded_from_weight_decay``
  (the positions, in the saved order, of the variables excluded from weight decay; absent
  in files written before refopt saved it, which load as excluding nothing);
- ``slot_{name}_{i}``: slot ``name`` of variable ``i`` (when built);
- ``variable_{i}``: variable ``i`` (when saved);
- ``gradient_accumulator_{i}``: the gradient accumulator of variable ``i`` (Keras 3's
  ``gradient_accumulation_steps``, optax's ``MultiSteps``; ``meta`` then has
  ``gradient_accumulation_micro_steps``); a wrapper's own scalars (``LossScaleOptimizer``'s
  ``loss_scale``, ``MultiSteps``' ``multi_steps``) are keys of ``meta``;
- ``{key}_{i}_{field}``: an optimizer's per-variable state outside its slots
  (``_PER_VARIABLE_STATE_KEYS``: SGD's ``sparse_momentum``, torch's sparse buffer, fields
  ``indices`` and ``values``), the meta's ``{key}`` listing each variable's fields (None: no
  entry);
- bfloat16 arrays (``ml_dtypes.bfloat16`` variables and slots) are stored as their uint16
  bits, and named in the meta's ``bfloat16_arrays`` (absent when there are none);
- a :class:`~refopt.MasterWeights` saves its inner optimizer's checkpoint written on the
  float32 masters (``variable_{i}`` is the master of a float16/bfloat16 variable; a
  float32/float64 variable is its own master, and is saved even with
  ``include_variables=False``), plus ``low_variable_{i}`` (the low-precision variable, when
  variables are saved; else loading writes the rounded master, as ``sync()`` does), with
  ``class`` ``"MasterWeights"``, its ``get_config()`` as ``config`` and
  ``meta["master_weights"]`` (``inner_class``, the variables' ``dtypes``,
  ``low_precision`` positions, ``has_variables``, and per variable its ``build_positions``
  and ``written_at_step``, which stochastic rounding's bits depend on);
- ``sha256``: hex digest of every other entry (name, dtype, shape and bytes, in sorted name
  order), checked on load on top of the zip format's CRC-32.

Writing goes to a temporary file in the destination's folder, which is flushed, ``fsync``-ed
and renamed over the destination with ``os.replace`` (atomic on POSIX and Windows): a crash
mid-write leaves the previous checkpoint, or none, never a partial one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import tempfile
from typing import NamedTuple

import numpy as np

from refopt import _foreign
from refopt import precision as _precision
from refopt.optimizers.base import Optimizer

__all__ = ["FORMAT_VERSION", "CheckpointError", "Restored", "load_checkpoint", "save_checkpoint"]

#: The checkpoint layout written by this version; files of a newer version are refused.
FORMAT_VERSION = 1
_FORMAT = "refopt-checkpoint"


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


def _check_optimizer(optimizer):
    if not isinstance(optimizer, Optimizer):
        raise TypeError(
            f"`optimizer` must be a refopt optimizer. Received: {type(optimizer).__name__}"
        )


def _check_variables(variables, optimizer):
    """The variables as a list, and their arrays (numba views for ``backend="cuda"``); torch
    tensors and other foreign arrays become the views the optimizer holds for them."""
    if isinstance(variables, (list, tuple)):  # else the executor says what it takes
        variables = _foreign.variables(optimizer, variables, "variables")
    variables, arrays = optimizer._executor.checkpoint_arrays(variables)
    if len({id(v) for v in variables}) != len(variables):
        raise ValueError("`variables` lists the same array twice.")
    return variables, arrays


def _digest(arrays):
    h = hashlib.sha256()
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(f"{key}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _check_path(path, what):
    """``path`` as a str, or a clear error naming it (``what`` names the argument)."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"`{what}` must be a file path (str or os.PathLike). Received: "
                        f"{what}={path!r}")
    path = os.fsdecode(os.fspath(path))
    if not path:
        raise ValueError(f"`{what}` must name a file. Received: {what}=''")
    if os.path.isdir(path):
        raise IsADirectoryError(
            errno.EISDIR, f"The checkpoint path {path!r} is a directory; name a file in it "
            f"(e.g. {os.path.join(path, 'checkpoint.npz')!r})", path)
    return path


def _write_atomic(path, arrays):
    """np.savez into a temporary file beside ``path``, fsync, then os.replace onto ``path``."""
    path = os.fsdecode(os.fspath(path))
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            errno.ENOENT, f"Cannot write the checkpoint {path!r}: the folder {directory!r} does "
            "not exist (create it first, e.g. os.makedirs)", path)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                                   dir=directory)
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        if isinstance(exc, OSError) and exc.errno is not None:
            # tempfile's and os.replace's errors name the temporary file: name the checkpoint
            raise type(exc)(exc.errno, f"Cannot write the checkpoint {path!r} (in "
                            f"{directory!r}): {exc.strerror}", path) from None
        raise
    with contextlib.suppress(OSError):  # make the rename durable (POSIX; no-op elsewhere)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _slot_shape(optimizer, name, shape):
    """The shape of slot ``name`` of a variable of ``shape``: the EMA ``average`` has the
    variable's shape whatever the optimizer's :meth:`~refopt.Optimizer.slot_shape` says."""
    if name == "average" and optimizer.use_ema:
        return tuple(shape)
    return tuple(optimizer.slot_shape(name, shape))


def _slot_dtype(optimizer, name, shape, dtype):
    """The dtype of slot ``name`` of a variable of ``shape`` and ``dtype``
    (:meth:`~refopt.Optimizer.slot_dtype`: Adam8bit's codes are uint8); the EMA ``average``
    has the variable's."""
    if name == "average" and optimizer.use_ema:
        return np.dtype(dtype)
    return np.dtype(optimizer.slot_dtype(name, shape, dtype))


def _write_file(path, meta, arrays):
    # .npz has no bfloat16: its arrays are stored as their uint16 bits, named in the meta
    bf16 = sorted(k for k, a in arrays.items() if a.dtype == _precision.BFLOAT16)
    if bf16:
        meta = dict(meta, bfloat16_arrays=bf16)
        arrays = {k: (a.view(np.uint16) if k in bf16 else a) for k, a in arrays.items()}
    arrays = dict(arrays, meta=np.array(json.dumps(meta)))
    arrays["sha256"] = np.array(_digest(arrays))
    _write_atomic(path, arrays)


def save_checkpoint(path, optimizer, variables, *, include_variables=True):
    """Save an optimizer's full state (and, by default, its variables) to one ``.npz`` file.

    The state is :meth:`Optimizer.state_dict() <refopt.Optimizer.state_dict>`, flattened
    into the layout of the module docstring.

    Parameters
    ----------
    path : str or os.PathLike
        The file to write, used as given (no suffix is added). Replaced atomically if it exists.
    optimizer : refopt.Optimizer or refopt.MasterWeights
        Built or not yet built.
    variables : list of ndarray (device arrays for ``backend="cuda"``)
        The variables, in a fixed order (the same order :func:`load_checkpoint` will get). Once
        the optimizer is built, exactly the variables it was built with (in any order). Device
        arrays and slots are copied to the host.
    include_variables : bool, default True
        Also save the variables' values (then ``load_checkpoint(path)`` alone can restore
        everything).

    Returns
    -------
    dict
        The metadata written (see the module docstring).

    Raises
    ------
    TypeError
        If ``optimizer`` is not a refopt optimizer, ``variables`` not a list of ndarrays
        (of device arrays for ``backend="cuda"``: a host ndarray is refused, naming
        ``to_device``), or ``path`` not a path.
    ValueError
        If ``variables`` is not the list the optimizer was built with (count, or an unknown
        array), or ``path`` is empty.
    IsADirectoryError
        If ``path`` is a directory (the message names it and suggests a file in it).
    FileNotFoundError
        If ``path``'s folder does not exist.
    OSError
        If the file cannot be written (the message names ``path``; the previous file, if any,
        is untouched).
    """
    from refopt.master_weights import MasterWeights

    if isinstance(optimizer, MasterWeights):
        path = _check_path(path, "path")
        meta, arrays = _collect_master_weights(optimizer, variables, include_variables)
    else:
        _check_optimizer(optimizer)
        path = _check_path(path, "path")
        meta, arrays = _collect(optimizer, variables, include_variables)
    _write_file(path, meta, arrays)
    return meta


def _collect(optimizer, variables, include_variables):
    """The checkpoint of ``optimizer`` and ``variables``: ``(meta, arrays)`` (the module
    docstring's layout, before the bfloat16 arrays are stored as bits)."""
    from refopt import __version__

    variables, views = _check_variables(variables, optimizer)
    sd = optimizer.state_dict()
    built = sd["built"]
    names = sd["slot_names"]
    arrays = {}
    steps = []
    order = []  # the build position of each variable of the file
    excluded = []  # positions in `variables` (the file's order), not in build order
    if built:
        n_built = len(optimizer._vars)
        if len(variables) != n_built:
            raise ValueError(
                f"`variables` must be the {n_built} variables the optimizer was built with. "
                f"Received: {len(variables)} arrays"
            )
        for i, var in enumerate(variables):
            try:
                pos = optimizer._position(var)
            except KeyError:
                raise ValueError(
                    f"`variables[{i}]` (shape {tuple(views[i].shape)}, {views[i].dtype}) is "
                    "not a variable the optimizer was built with."
                ) from None
            for name in names:
                arrays[f"slot_{name}_{i}"] = sd["slots"][name][pos]
            steps.append(sd["variable_steps"][pos])
            order.append(pos)
            if "gradient_accumulation" in sd:  # Keras 3's accumulators, in the file's order
                arrays[f"gradient_accumulator_{i}"] = (
                    sd["gradient_accumulation"]["accumulators"][pos])
            if pos in sd["excluded_from_weight_decay"]:
                excluded.append(i)
    else:  # not built: the exclusions name arrays; record those among `variables`
        excluded = optimizer._excluded_positions(variables)
    if include_variables:
        for i, view in enumerate(views):
            arrays[f"variable_{i}"] = view if isinstance(view, np.ndarray) else view.copy_to_host()
    lr = sd["learning_rate"]
    meta = {
        "format": _FORMAT,
        "format_version": FORMAT_VERSION,
        "refopt_version": __version__,
        "class": sd["class"],
        "config": _jsonable(sd["config"]),
        "iterations": sd["iterations"],
        "learning_rate": None if lr is None else float(lr).hex(),
        "built": built,
        "shapes": [list(v.shape) for v in views],
        "dtypes": [np.dtype(v.dtype).name for v in views],
        "slots": list(names) if built else [],
        "has_variables": bool(include_variables),
        # convention step_counter="per_variable" (torch): each variable's own step count
        "variable_steps": steps,
        "excluded_from_weight_decay": excluded,
    }
    per_variable = getattr(optimizer, "_PER_VARIABLE_STATE_KEYS", ())
    for key in getattr(optimizer, "_EXTRA_STATE_KEYS", ()):  # a wrapper's own state (JSON)
        if key not in per_variable:
            meta[key] = _jsonable(sd[key])
            continue
        # one entry per variable (None or a dict of arrays), in the file's order: the arrays
        # go to ``{key}_{i}_{field}``, the meta lists each entry's fields
        entries = [sd[key][pos] for pos in order] if built else []
        meta[key] = [None if e is None else sorted(e) for e in entries]
        for i, e in enumerate(entries):
            for field, value in (e or {}).items():
                arrays[f"{key}_{i}_{field}"] = np.asarray(value)
    if "gradient_accumulation" in sd:  # gradient_accumulation_steps: Keras 3's raw counter
        meta["gradient_accumulation_micro_steps"] = sd["gradient_accumulation"]["micro_steps"]
    return meta, arrays


#: How a zip archive (an ``.npz``) starts: a local file header, or the end record of an
#: empty archive.
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def _read(path):
    path = _check_path(path, "path")
    with open(path, "rb") as f:  # FileNotFoundError, PermissionError: as they are
        head = f.read(4)
    if head not in _ZIP_MAGICS:  # np.load would take it for a pickle and say so
        raise CheckpointError(
            f"Cannot read the checkpoint {path}: it is truncated, corrupted or not a refopt "
            "checkpoint (not an .npz archive: "
            f"{'an empty file' if not head else f'it starts with {head!r}'})")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {key: z[key] for key in z.files}  # reads (and CRC-checks) every member
        meta = json.loads(str(arrays.pop("meta")))
        digest = str(arrays.pop("sha256"))
    except FileNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - zip, npy and JSON errors all mean a bad file
        raise CheckpointError(
            f"Cannot read the checkpoint {path}: it is truncated, corrupted or not a "
            f"refopt checkpoint ({type(exc).__name__}: {exc})"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
        raise CheckpointError(f"{path} is not a refopt checkpoint (format "
                              f"{meta.get('format') if isinstance(meta, dict) else None!r}).")
    if _digest(dict(arrays, meta=np.array(json.dumps(meta)))) != digest:
        raise CheckpointError(
            f"The checkpoint {path} is corrupted: its SHA-256 does not match its contents."
        )
    version = meta.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{path} has an invalid format_version={version!r}.")
    if version > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by refopt {meta.get('refopt_version')} in checkpoint "
            f"format {version}; this refopt reads format {FORMAT_VERSION} and older. Upgrade "
            "refopt to load it."
        )
    _check_meta(meta, path)
    bf16 = meta.get("bfloat16_arrays", [])
    if not isinstance(bf16, list) or not all(
            isinstance(arrays.get(k), np.ndarray) and arrays[k].dtype == np.uint16
            for k in bf16):
        raise CheckpointError(
            f"The checkpoint {path} has damaged metadata: 'bfloat16_arrays' must name its "
            f"uint16 arrays that hold bfloat16 bits. Received: {bf16!r}.")
    for k in bf16:
        arrays[k] = arrays[k].view(_precision.BFLOAT16)
    return meta, arrays


def _check_meta(meta, path):
    """CheckpointError unless the metadata has every entry, of the right type: a file whose
    hash matches but whose metadata was written by hand or by another program."""
    def bad(key, expected):
        got = meta.get(key, "(absent)")
        return CheckpointError(
            f"The checkpoint {path} has damaged metadata: {key!r} must be {expected}. "
            f"Received: {got!r}. Re-save it with save_checkpoint, or restore it from a copy.")

    def is_int(x):
        return isinstance(x, int) and not isinstance(x, bool)

    if not isinstance(meta.get("class"), str):
        raise bad("class", "the optimizer's class name (a string)")
    if not isinstance(meta.get("config"), dict):
        raise bad("config", "the optimizer's get_config() (a JSON object)")
    for key in ("built", "has_variables"):
        if not isinstance(meta.get(key), bool):
            raise bad(key, "true or false")
    shapes = meta.get("shapes")
    if not isinstance(shapes, list) or not all(
            isinstance(s, list) and all(is_int(d) and d >= 0 for d in s) for s in shapes):
        raise bad("shapes", "a list of shapes (lists of integers >= 0)")
    dtypes = meta.get("dtypes")
    if not isinstance(dtypes, list) or len(dtypes) != len(shapes) or not all(
            d in ("float16", "bfloat16", "float32", "float64") for d in dtypes):
        raise bad("dtypes", f"a list of {len(shapes)} names among float16, bfloat16, "
                  "float32, float64 "
                  "(one per shape)")
    if not isinstance(meta.get("slots"), list) or not all(
            isinstance(n, str) for n in meta["slots"]):
        raise bad("slots", "a list of slot names")
    if not isinstance(meta.get("variable_steps", []), list):
        raise bad("variable_steps", "a list of integers")
    excluded = meta.get("excluded_from_weight_decay", [])
    if not isinstance(excluded, list) or not all(
            is_int(k) and 0 <= k < len(shapes) for k in excluded) or len(set(excluded)) != len(
            excluded):
        raise bad("excluded_from_weight_decay",
                  f"a list of distinct variable positions in [0, {len(shapes)})")


def _expect(arrays, key, shape, dtype, path):
    a = arrays.get(key)
    if a is None or a.shape != shape or a.dtype != dtype:
        raise CheckpointError(
            f"The checkpoint {os.fspath(path)} is inconsistent: entry {key!r} should be "
            f"{dtype} of shape {shape}, found "
            f"{'nothing' if a is None else f'{a.dtype} of shape {a.shape}'}."
        )
    return a


class Restored(NamedTuple):
    """What :func:`load_checkpoint` returns when it rebuilds the optimizer from the file.

    Unpack it as a pair: ``optimizer, variables = refopt.load_checkpoint(path)``.

    Attributes
    ----------
    optimizer : refopt.Optimizer
        A new optimizer of the saved class and configuration (``from_config``), built with
        ``variables`` and holding the saved state.
    variables : list of ndarray (device arrays for ``backend="cuda"``)
        The variables in the saved order: new arrays holding the saved values, or the arrays
        passed as ``variables=``. Pass these same objects to ``apply_gradients``.
    """

    optimizer: Optimizer
    variables: list


def _stored(arrays, key, path):
    """The array ``key`` of the file, or CheckpointError naming it."""
    if key not in arrays:
        raise CheckpointError(f"{path} lacks the array {key!r}.")
    return arrays[key]


def _optimizer_class(name, custom_objects, path):
    import refopt.optimizers as _optimizers

    cls = (custom_objects or {}).get(name)
    if cls is None and (name in _optimizers.__all__ or name in _optimizers.WRAPPERS):
        cls = getattr(_optimizers, name)
    if not (isinstance(cls, type) and issubclass(cls, Optimizer)) or cls is Optimizer:
        raise CheckpointError(
            f"{path} holds the state of an optimizer of class {name!r}, which is not one of "
            f"refopt's optimizers; pass your class as custom_objects={{{name!r}: YourClass}}, "
            "or create the optimizer yourself and call load_checkpoint(path, optimizer, "
            "variables).")
    return cls


def _rebuild(path, meta, arrays, variables, backend, custom_objects):
    """The optimizer (from the file's class and config) and the variables to load into."""
    cls = _optimizer_class(meta.get("class"), custom_objects, path)
    config = dict(meta["config"])
    # backend= if given, else the default (None): never the saved one (module docstring)
    config["backend"] = backend
    try:
        optimizer = cls.from_config(config, custom_objects=custom_objects)
    except Exception as exc:  # noqa: BLE001 - whatever the class raises: the file's config
        if isinstance(exc, (RuntimeError, ImportError)):  # the backend is not usable here
            fix = (f"pass another backend (backend='cpu' or 'reference'; this call used "
                   f"backend={backend!r})")
        else:
            fix = ("pass your own classes as custom_objects=, or create the optimizer "
                   "yourself and call load_checkpoint(path, optimizer, variables)")
        raise CheckpointError(
            f"Cannot recreate the {cls.__name__} saved in {path} from its config "
            f"({type(exc).__name__}: {exc}); {fix}."
        ) from None
    if variables is not None:
        return optimizer, variables
    shapes = [tuple(s) for s in meta["shapes"]]
    dtypes = [np.dtype(d) for d in meta["dtypes"]]
    if not meta["has_variables"]:
        if meta["built"]:
            raise CheckpointError(
                f"{path} was saved without its variables (include_variables=False): pass the "
                "variables to load the state into, load_checkpoint(path, variables=[...]).")
        return optimizer, []
    if optimizer.backend == "cuda":
        from refopt.kernels.cuda import to_device

        variables = [to_device(np.zeros(s, d)) for s, d in zip(shapes, dtypes)]
    else:
        variables = [np.zeros(s, d) for s, d in zip(shapes, dtypes)]
    return optimizer, variables


def load_checkpoint(path, optimizer=None, variables=None, *, restore_variables=True,
                    backend=None, custom_objects=None):
    """Restore a checkpoint: into a new optimizer you made, or into one made from the file.

    Two forms:

    - ``load_checkpoint(path, optimizer, variables)``: restore into ``optimizer``, a new one
      of the saved class and configuration, built with ``variables``; returns the metadata.
    - ``load_checkpoint(path)`` (or ``load_checkpoint(path, variables=params)``): the
      optimizer is created from the file alone (its class among refopt's optimizers or
      ``custom_objects``, then ``from_config`` of the saved config, as Keras'
      ``load_model`` does) and returned with its variables, as the pair
      :class:`Restored` ``(optimizer, variables)``: new arrays holding the saved values
      (like ``torch.load`` giving tensors back), or ``params`` filled with them. A refopt
      optimizer is tied to its variables by identity (like ``tf.Variable``), so it is
      returned together with the arrays it was built on.

    Parameters
    ----------
    path : str or os.PathLike
        A file written by :func:`save_checkpoint`.
    optimizer : refopt.Optimizer or refopt.MasterWeights, optional
        A new, **not yet built** optimizer of the saved class and configuration (create it as
        the saved one was; ``name``, ``backend`` and ``jit_compile`` may differ; a float
        ``learning_rate`` is restored from the file). The saved
        ``exclude_from_weight_decay`` positions are applied to it; if you called its
        ``exclude_from_weight_decay`` yourself, it must name the variables at the same
        positions. ``None``: create it from the file.
    variables : list of ndarray (device arrays for ``backend="cuda"``), optional
        The variables, in the order given to :func:`save_checkpoint`, each of the saved shape
        and dtype, C-contiguous and writeable. The optimizer is built with them; on the GPU the
        saved values are copied into the device slots and variables in place. Required with
        ``optimizer``; without it, new arrays are made (the file must hold the variables,
        unless the saved optimizer was never built).
    restore_variables : bool, default True
        Copy the saved values into ``variables`` (when the checkpoint has them).
    backend : {"reference", "cpu", "cuda"}, optional
        Only when the optimizer is created from the file: its backend. Default: the default
        backend (:func:`refopt.executors.default_backend`, ``$REFOPT_BACKEND``), **not** the
        saved one: every backend gives the same bits, and a checkpoint saved with
        ``backend="cuda"`` loads on a machine without a GPU. ``"cuda"``: the new variables
        are device arrays.
    custom_objects : dict, optional
        Only when the optimizer is created from the file: class names mapped to your own
        optimizer or schedule classes (as Keras' ``custom_objects``).

    Returns
    -------
    dict or Restored
        With ``optimizer``: the checkpoint's metadata. Without: ``Restored(optimizer,
        variables)``, a named pair.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    IsADirectoryError
        If ``path`` is a directory.
    CheckpointError
        (a ``ValueError``) if the file is truncated, corrupted or not a checkpoint, was written
        in a newer format version, or does not match: another optimizer class or
        configuration, another number of variables, or a variable of another shape or dtype;
        other weight-decay exclusions than ``optimizer``'s own; damaged metadata; an
        unknown class without ``custom_objects``; a saved configuration the class refuses
        (or a ``backend`` this machine lacks) when creating the optimizer from the file; a
        file without variables and no ``variables``. The message names the file and what
        differs.
    ValueError
        If the optimizer is already built, or a variable is not C-contiguous and writeable.
    TypeError
        If ``optimizer`` is not a refopt optimizer, ``variables`` not a list of ndarrays
        (of device arrays for ``backend="cuda"``: a host ndarray is refused, naming
        ``to_device``), or ``variables`` is missing with ``optimizer``.

    Notes
    -----
    Nothing is modified unless every check passes. Then the state is restored with
    :meth:`Optimizer.load_state_dict <refopt.Optimizer.load_state_dict>` (``iterations``,
    every slot and EMA average, the per-variable step counts; with a schedule,
    ``optimizer.learning_rate`` is the saved value, the one the last step before the save
    used) and the variables are overwritten with the saved values.

    Examples
    --------
    >>> import os, tempfile, numpy as np, refopt
    >>> w = np.ones(3, np.float32)
    >>> opt = refopt.Adam(learning_rate=0.1, backend="reference")
    >>> _ = opt.apply_gradients([(np.full(3, 0.5, np.float32), w)])
    >>> path = os.path.join(tempfile.mkdtemp(), "run.npz")
    >>> _ = refopt.save_checkpoint(path, opt, [w])
    >>> opt2, (w2,) = refopt.load_checkpoint(path)
    >>> type(opt2).__name__, opt2.iterations, np.array_equal(w2, w)
    ('Adam', 1, True)
    """
    if optimizer is None:
        if not (isinstance(custom_objects, dict) or custom_objects is None):
            raise TypeError("`custom_objects` must be a dict of class names to classes. "
                            f"Received: custom_objects={custom_objects!r}")
        meta, arrays = _read(path)
        if meta.get("class") == "MasterWeights":
            return _rebuild_master_weights(path, meta, arrays, variables, restore_variables,
                                           backend, custom_objects)
        optimizer, variables = _rebuild(os.fspath(path), meta, arrays, variables, backend,
                                        custom_objects)
        _load(path, optimizer, variables, restore_variables, meta, arrays)
        return Restored(optimizer, variables)
    if backend is not None or custom_objects is not None:
        raise TypeError("`backend` and `custom_objects` apply only when load_checkpoint "
                        "creates the optimizer (optimizer=None). Received: "
                        f"backend={backend!r}, custom_objects={custom_objects!r}")
    from refopt.master_weights import MasterWeights

    if not isinstance(optimizer, MasterWeights):
        _check_optimizer(optimizer)
    if variables is None:
        raise TypeError("`variables` is required with `optimizer`: the list of variables to "
                        "build it with, in the saved order (or call load_checkpoint(path) to "
                        "get new ones).")
    if isinstance(optimizer, MasterWeights):
        meta, arrays = _read(path)
        return _load_master_weights(path, optimizer, variables, restore_variables, meta,
                                    arrays)
    return _load(path, optimizer, variables, restore_variables)


def _rebuild_master_weights(path, meta, arrays, variables, restore_variables, backend,
                            custom_objects):
    """``load_checkpoint(path)`` of a MasterWeights file: the inner optimizer from its
    class and config, the wrapper with the saved options, new variables of the saved
    dtypes (or ``variables``)."""
    from refopt.master_weights import MasterWeights

    p = os.fspath(path)
    mw, dtypes, inner_meta = _master_weights_meta(meta, p)
    inner, _ = _rebuild(p, inner_meta, arrays, [], backend, custom_objects)
    config = meta["config"]
    try:
        wrapper = MasterWeights(inner, stochastic_rounding=config.get("stochastic_rounding"),
                                seed=config.get("seed"))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"Cannot recreate the MasterWeights saved in {p} from its "
                              f"config ({type(exc).__name__}: {exc}).") from None
    if variables is None:
        variables = [np.zeros(tuple(s), d) for s, d in zip(meta["shapes"], dtypes)]
    _load_master_weights(path, wrapper, variables, restore_variables, meta, arrays)
    return Restored(wrapper, variables)


def _load(path, optimizer, variables, restore_variables, meta=None, arrays=None):
    _check_optimizer(optimizer)
    variables, views = _check_variables(variables, optimizer)
    if meta is None:
        meta, arrays = _read(path)
    p = os.fspath(path)
    if meta.get("class") != type(optimizer).__name__:
        raise CheckpointError(
            f"{p} holds the state of an optimizer of class {meta.get('class')}; cannot load "
            f"it into one of class {type(optimizer).__name__}."
        )
    diffs = optimizer._config_differences(meta["config"])
    if diffs:
        raise CheckpointError(
            f"{p} was saved from an optimizer with another configuration; create the optimizer "
            "with the saved one (optimizer.from_config). Differences: " + "; ".join(diffs)
        )
    if optimizer.built:
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
    names = optimizer.slot_names
    if meta["built"] and list(names) != meta["slots"]:
        raise CheckpointError(f"{p} has slots {meta['slots']}; this optimizer has {list(names)}.")
    slots = {name: [] for name in names} if meta["built"] else {}
    if meta["built"]:
        for i, (shape, dtype) in enumerate(zip(shapes, dtypes)):
            for name in names:
                slots[name].append(_expect(arrays, f"slot_{name}_{i}",
                                           _slot_shape(optimizer, name, shape),
                                           _slot_dtype(optimizer, name, shape, dtype), p))
    values = []
    if restore_variables and meta["has_variables"]:
        values = [_expect(arrays, f"variable_{i}", s, d, p)
                  for i, (s, d) in enumerate(zip(shapes, dtypes))]
    steps = meta.get("variable_steps", [])
    lr = meta.get("learning_rate")
    try:
        lr = None if lr is None else float.fromhex(lr)
    except (TypeError, ValueError):
        raise CheckpointError(f"{p} has an invalid learning_rate={lr!r}.") from None
    state = {"class": meta["class"], "config": meta["config"], "iterations": meta.get("iterations"),
             "learning_rate": lr, "built": bool(meta["built"]), "slot_names": list(names),
             "slots": slots, "variable_steps": steps if isinstance(steps, list) else [steps]}
    per_variable = getattr(optimizer, "_PER_VARIABLE_STATE_KEYS", ())
    for key in getattr(optimizer, "_EXTRA_STATE_KEYS", ()):  # a wrapper's own state
        state[key] = meta.get(key)
        if key in per_variable and state[key] is not None:  # entries of arrays, by field
            fields = state[key]
            if not isinstance(fields, list) or not all(
                    f is None or (isinstance(f, list) and all(isinstance(x, str) for x in f))
                    for f in fields):
                raise CheckpointError(f"{p} has an invalid {key!r} entry in its metadata.")
            state[key] = [None if f is None else {
                x: _stored(arrays, f"{key}_{i}_{x}", p) for x in f}
                for i, f in enumerate(fields)]
    if "gradient_accumulation_micro_steps" in meta:  # and the accumulators, when built
        state["gradient_accumulation"] = {
            "micro_steps": meta["gradient_accumulation_micro_steps"],
            "accumulators": [_expect(arrays, f"gradient_accumulator_{i}", s,
                                     getattr(arrays.get(f"gradient_accumulator_{i}"), "dtype",
                                             d), p)  # MultiSteps' may be float32
                             for i, (s, d) in enumerate(zip(shapes, dtypes))]
            if meta["built"] else []}
    excluded = meta.get("excluded_from_weight_decay")  # absent in older files: none saved
    unbuilt_exclusions = None
    try:  # all or nothing: it checks everything, then builds and writes the slots
        if meta["built"]:
            state["excluded_from_weight_decay"] = excluded
        elif excluded:  # positions in `variables`: set before any build, as the saved one
            unbuilt_exclusions = optimizer._check_excluded(
                excluded, len(variables), variables, False, "excluded_from_weight_decay")
        optimizer.load_state_dict(state, var_list=variables if meta["built"] else None)
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{p} does not match the optimizer: {exc}") from None
    if unbuilt_exclusions is not None:
        optimizer.exclude_from_weight_decay(unbuilt_exclusions[1])
    for var, value in zip(views, values):  # checked above: cannot fail
        if isinstance(var, np.ndarray):
            np.copyto(var, value)
        elif value.size:
            var.copy_to_device(np.ascontiguousarray(value))
    if values:
        _foreign.touched(optimizer)  # torch tensors written in place: autograd must know
    return meta


# ----------------------------------------------------------------- MasterWeights
def _collect_master_weights(wrapper, variables, include_variables):
    """The checkpoint of a :class:`~refopt.MasterWeights`: its inner optimizer's, written on
    the float32 masters (``variable_{i}`` holds the master of a low-precision variable, and
    a float32/float64 variable, its own master, itself), plus ``low_variable_{i}`` (the
    float16/bfloat16 variable, when ``include_variables``) and ``meta["master_weights"]``."""
    if not isinstance(variables, (list, tuple)):
        raise TypeError("`variables` must be a list of the arrays the MasterWeights was built "
                        f"with. Received: {type(variables).__name__}")
    variables = list(variables)
    if len({id(v) for v in variables}) != len(variables):
        raise ValueError("`variables` lists the same array twice.")
    if wrapper.built:
        if len(variables) != len(wrapper._vars):
            raise ValueError(f"`variables` must be the {len(wrapper._vars)} variables the "
                             f"optimizer was built with. Received: {len(variables)} arrays")
        positions = []
        for i, v in enumerate(variables):
            try:
                positions.append(wrapper._position(v))
            except KeyError:
                raise ValueError(f"`variables[{i}]` is not a variable the optimizer was "
                                 "built with.") from None
        masters = [wrapper._masters[k] for k in positions]
        written = [wrapper._written[k] for k in positions]
    else:
        from refopt.executors.checks import check_host_variable

        for i, v in enumerate(variables):
            check_host_variable(v, f"variables[{i}]")
        masters = [v.astype(np.float32) if _precision.is_low_precision(v.dtype) else v
                   for v in variables]
        positions, written = list(range(len(variables))), [0] * len(variables)
    meta, arrays = _collect(wrapper.inner_optimizer, masters, True)
    low = []
    for i, v in enumerate(variables):
        if _precision.is_low_precision(v.dtype):
            low.append(i)
            if include_variables:
                arrays[f"low_variable_{i}"] = v
    meta.update(
        {"class": "MasterWeights", "config": _jsonable(wrapper.get_config()),
         "master_weights": {"inner_class": type(wrapper.inner_optimizer).__name__,
                            "dtypes": [np.dtype(v.dtype).name for v in variables],
                            "low_precision": low,
                            "has_variables": bool(include_variables),
                            # stochastic rounding draws its bits by build position and step
                            "build_positions": positions,
                            "written_at_step": written}})
    return meta, arrays


def _master_weights_meta(meta, p):
    mw = meta.get("master_weights")
    config = meta.get("config")
    if not (isinstance(mw, dict) and isinstance(config, dict)
            and isinstance(config.get("optimizer"), dict)
            and isinstance(mw.get("dtypes"), list)
            and len(mw["dtypes"]) == len(meta.get("shapes", []))):
        raise CheckpointError(f"{p} has damaged MasterWeights metadata.")
    try:
        dtypes = [np.dtype(d) for d in mw["dtypes"]]
    except TypeError:
        raise CheckpointError(f"{p} has damaged MasterWeights metadata.") from None
    inner_meta = dict(meta, **{"class": mw.get("inner_class"),
                               "config": config["optimizer"].get("config", {})})
    return mw, dtypes, inner_meta


def _load_master_weights(path, wrapper, variables, restore_variables, meta, arrays):
    """Restore a MasterWeights checkpoint into ``wrapper`` (new, not built) and
    ``variables`` (all checks first: nothing changes unless they pass)."""
    p = os.fspath(path)
    if meta.get("class") != "MasterWeights":
        raise CheckpointError(f"{p} holds the state of an optimizer of class "
                              f"{meta.get('class')}; cannot load it into one of class "
                              "MasterWeights.")
    if wrapper.built:
        raise ValueError("load_checkpoint needs a new MasterWeights that has not been built "
                         "yet (no build() or apply_gradients() call).")
    mw, dtypes, inner_meta = _master_weights_meta(meta, p)
    config = meta["config"]
    diffs = [f"{k}: saved {config.get(k)!r}, this optimizer {getattr(wrapper, k)!r}"
             for k in ("stochastic_rounding", "seed") if config.get(k) != getattr(wrapper, k)]
    inner = wrapper.inner_optimizer
    if config["optimizer"].get("class_name") != type(inner).__name__:
        diffs.append(f"optimizer: saved {config['optimizer'].get('class_name')!r}, this "
                     f"optimizer {type(inner).__name__!r}")
    if diffs:
        raise CheckpointError(f"{p} was saved from an optimizer with another configuration. "
                              "Differences: " + "; ".join(diffs))
    if not isinstance(variables, (list, tuple)):
        raise TypeError("`variables` must be a list of arrays. Received: "
                        f"{type(variables).__name__}")
    variables = list(variables)
    from refopt.executors.checks import check_host_variable

    shapes = [tuple(s) for s in meta["shapes"]]
    if len(variables) != len(shapes):
        raise CheckpointError(f"{p} holds {len(shapes)} variables; `variables` has "
                              f"{len(variables)}.")
    for i, (v, shape, dtype) in enumerate(zip(variables, shapes, dtypes)):
        check_host_variable(v, f"variables[{i}]")
        if tuple(v.shape) != shape or v.dtype != dtype:
            raise CheckpointError(f"`variables[{i}]` has shape {tuple(v.shape)} and dtype "
                                  f"{v.dtype}; the checkpoint {p} saved shape {shape} and "
                                  f"dtype {dtype}.")
        if not (v.flags.c_contiguous and v.flags.writeable):
            raise ValueError(f"`variables[{i}]` must be C-contiguous and writeable.")
    if len({id(v) for v in variables}) != len(variables):
        raise ValueError("`variables` lists the same array twice.")
    low = [_precision.is_low_precision(v.dtype) for v in variables]
    saved_low = {}
    if restore_variables and mw.get("has_variables"):
        saved_low = {i: _expect(arrays, f"low_variable_{i}", shapes[i], dtypes[i], p)
                     for i in range(len(variables)) if low[i]}
    n = len(variables)
    positions = mw.get("build_positions", list(range(n)))  # absent: the file's order
    written = mw.get("written_at_step", [None] * n)
    if (not isinstance(positions, list) or sorted(positions) != list(range(n))
            or not isinstance(written, list) or len(written) != n):
        raise CheckpointError(f"{p} has damaged MasterWeights metadata.")
    masters = [v.astype(np.float32) if lo else v for v, lo in zip(variables, low)]
    kept = [] if restore_variables else [(v, v.copy()) for v, lo in zip(variables, low)
                                         if not lo]
    _load(path, inner, masters, True, inner_meta, arrays)  # the masters and the inner state
    for v, value in kept:  # restore_variables=False: float32/float64 variables keep theirs
        np.copyto(v, value)
    order = sorted(range(n), key=lambda i: positions[i])  # file entries in build order
    wrapper._vars = [variables[i] for i in order]
    wrapper._masters = [masters[i] for i in order]
    wrapper._index = {id(v): k for k, v in enumerate(wrapper._vars)}
    wrapper._written = [int(written[i] or 0) for i in order]
    if restore_variables:
        for i, lo in enumerate(low):
            if not lo:
                continue
            if i in saved_low:
                np.copyto(variables[i], saved_low[i])
            else:  # saved without variables: its master rounded as at its last write
                k = positions[i]
                step = wrapper._written[k] if written[i] is not None else wrapper.iterations
                wrapper._write(k, step)
    return meta
