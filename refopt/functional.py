"""Every optimizer as a pair of pure functions over lists or dicts of arrays.

``fo = functional(refopt.Adam, learning_rate=1e-3)`` (or the shortcut
``refopt.functional.adam(learning_rate=1e-3)``) gives

- ``state = fo.init(params)``;
- ``new_params, state = fo.step(grads, state, params)``;
- ``updates, state = fo.update(grads, state, params)`` (optax's naming: ``new - params``);

with the numbers of the stateful class built with the same arguments, on every backend, bit
for bit: a step loads ``state`` into an optimizer of that class (``load_state_dict``), applies
the gradients to private copies of ``params`` and reads the state back (``state_dict``). Inputs
are never modified; every array returned is new.

Params
------
A *tree*: an ndarray (float16/32/64), or a list, tuple or dict of trees (nested to any depth,
as in JAX; dict keys must be sortable). Its leaves, in tree order (lists in order, dict keys
sorted, as ``jax.tree_util`` orders them), are the variables of the class, in that order (the
order matters where a step mixes variables: ``global_clipnorm`` sums over them in order).
Gradients have the same structure; a gradient may be ``None`` (that variable is skipped, with
the class's warning) or a :class:`refopt.IndexedSlices`. With ``backend="cuda"`` a param or a
dense gradient may be a host ndarray or a device array; each returned param or update is of
its param's kind (``IndexedSlices`` values are host arrays, as the class takes them).

State
-----
A plain dict of NumPy arrays, mirroring params (hence a pytree, and a checkpoint format)::

    {"iterations":     0-d int64 array,   # steps applied (the class's `iterations`)
     "learning_rate":  0-d float64 array, # the current learning rate (see below)
     "slots":          {slot_name: tree like params},  # e.g. "m", "v"; "average" with use_ema
     "variable_steps": tree like params of 0-d int64}  # each variable's own step count
                                                       # (the torch convention counts them)

Slot arrays have the optimizer's slot dtype and shape (``slot_dtype``, ``slot_shape``: the
variable's, except Adafactor's factored moments, RowWiseAdagrad's per-row accumulator and the
8-bit optimizers' uint8 codes and float32 block maxima). ``learning_rate`` is the class's ``learning_rate``: with
a float, the rate the next step uses (replacing it changes the step size, as optax's
``inject_hyperparams`` does; rounded to float32 under the Keras and TF conventions, as the
class's setter rounds it);
with a schedule, the value the last step used (the next one evaluates the schedule at
``iterations``). The class and configuration are not in the state: loading a state made by
another optimizer raises only where its slots, shapes or dtypes differ.

Weight-decay exclusions (the class's ``exclude_from_weight_decay``) have no functional form:
every param is decayed when ``weight_decay`` is set. Use the class where some variables must
not decay (its :meth:`~refopt.Optimizer.state_dict` and checkpoints keep the exclusions).

A :class:`Functional` pickles and deep-copies (its configuration; the cached optimizer is
rebuilt on the next step, from the state given).

The arrays of a returned state are read-only: a step whose state is the one returned by the
previous step of the same functional object reuses that object's optimizer as it is (no load);
any other state (a copy, a file read back, one made by hand) is loaded in full. Replacing an
entry of a returned state is safe; writing into its arrays is refused.

Examples
--------
>>> import numpy as np, refopt
>>> fo = refopt.functional.adam(learning_rate=0.1, backend="reference")
>>> params = {"w": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}
>>> state = fo.init(params)
>>> sorted(state), sorted(state["slots"])
(['iterations', 'learning_rate', 'slots', 'variable_steps'], ['m', 'v'])
>>> grads = {"w": np.full(3, 0.5, np.float32), "b": np.ones(2, np.float32)}
>>> new, state = fo.step(grads, state, params)
>>> new["w"], params["w"]            # params are not modified
(array([0.9000013, 0.9000013, 0.9000013], dtype=float32),
 array([1., 1., 1.], dtype=float32))
>>> int(state["iterations"])
1

The state as a checkpoint: flatten it into ``numpy.savez`` and read it back.

>>> import io
>>> buf = io.BytesIO()
>>> np.savez(buf, **refopt.functional.flatten_state(state))
>>> _ = buf.seek(0)
>>> with np.load(buf) as z:
...     restored = refopt.functional.unflatten_state(dict(z), params)
>>> a, _ = fo.step(grads, state, new)
>>> b, _ = fo.step(grads, restored, new)
>>> all(np.array_equal(a[k], b[k]) for k in a)
True
"""

from __future__ import annotations

import re
import threading
import warnings
from collections.abc import Mapping

import numpy as np

from refopt import optimizers as _optimizers
from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import Optimizer

__all__ = ["Functional", "flatten_state", "functional", "unflatten_state"]

_STATE_KEYS = ("iterations", "slots", "variable_steps")


# --------------------------------------------------------------------------- trees
def _is_node(x):
    return isinstance(x, (dict, list, tuple))


def _children(node, where):
    """``(key, child)`` pairs of a node, dict keys sorted (``jax.tree_util``'s order)."""
    if isinstance(node, dict):
        try:
            keys = sorted(node)
        except TypeError:
            raise TypeError(f"The keys of the dict at {where or 'the root'} must be sortable "
                            f"(as in JAX). Received: {list(node)!r}") from None
        return [(k, node[k]) for k in keys]
    return list(enumerate(node))


def _flatten(tree, name, where=""):
    """The leaves of ``tree`` and their paths (``name[...]...``), in tree order."""
    leaves, paths = [], []

    def walk(node, path):
        if _is_node(node):
            for key, child in _children(node, path):
                walk(child, f"{path}[{key!r}]")
        else:
            leaves.append(node)
            paths.append(path)

    walk(tree, name)
    return leaves, paths


def _structure(tree):
    """A hashable description of a tree's nodes (lists and tuples alike: files give lists)."""
    if isinstance(tree, dict):
        return ("dict", tuple((k, _structure(v)) for k, v in _children(tree, "")))
    if isinstance(tree, (list, tuple)):
        return ("seq", tuple(_structure(v) for v in tree))
    return None


def _rebuild(like, leaves):
    """A tree of ``like``'s structure and container types holding ``leaves`` (in order)."""
    it = iter(leaves)

    def walk(node):
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in _children(node, "")}
            return {k: out[k] for k in node}  # the caller's key order
        if isinstance(node, (list, tuple)):
            items = [walk(v) for v in node]
            if isinstance(node, list):
                return items
            return type(node)(*items) if hasattr(node, "_fields") else type(node)(items)
        return next(it)

    return walk(like)


def _same_structure(tree, params, name, what="params"):
    if _structure(tree) != _structure(params):
        raise ValueError(f"`{name}` must have the structure of `{what}` (the same lists, tuples "
                         f"and dict keys). Received: {_shape_of(tree)} for {_shape_of(params)}")


def _shape_of(tree):
    """A short picture of a tree for messages: containers with their leaves' shapes."""
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k!r}: {_shape_of(v)}" for k, v in tree.items()) + "}"
    if isinstance(tree, (list, tuple)):
        return "[" + ", ".join(_shape_of(v) for v in tree) + "]"
    if tree is None:
        return "None"
    if isinstance(tree, IndexedSlices):
        return f"IndexedSlices{tuple(tree.dense_shape)}"
    shape = getattr(tree, "shape", None)
    return type(tree).__name__ if shape is None else f"{tuple(shape)}"


def flatten_state(state):
    """A functional state as a flat dict of arrays, ready for ``numpy.savez``.

    Keys are paths joined with ``/``: ``"iterations"``, ``"learning_rate"``,
    ``"slots/m/w"`` (slot ``m`` of ``params["w"]``), ``"slots/v/0/bias"``,
    ``"variable_steps/w"``; list positions are written as numbers.

    Parameters
    ----------
    state : dict
        A state of :meth:`Functional.init` or :meth:`Functional.step`.

    Returns
    -------
    dict of str -> ndarray

    Raises
    ------
    TypeError
        If ``state`` is not a dict.
    ValueError
        If two paths give the same key (a dict key containing ``/``).
    """
    if not isinstance(state, dict):
        raise TypeError(f"`state` must be a dict. Received: {type(state).__name__}")
    flat = {}

    def walk(node, key):
        if _is_node(node):
            for k, child in _children(node, key):
                walk(child, f"{key}/{k}" if key else str(k))
        else:
            if key in flat:
                raise ValueError(f"Two entries of the state flatten to the key {key!r}; rename "
                                 "the dict keys that contain '/'.")
            flat[key] = np.asarray(node)

    walk(state, "")
    return flat


def unflatten_state(flat, params):
    """The state that :func:`flatten_state` flattened, rebuilt in the structure of ``params``.

    Parameters
    ----------
    flat : mapping of str -> ndarray
        E.g. ``dict(numpy.load(path))``.
    params : tree
        The params the state belongs to (only their structure is read).

    Returns
    -------
    dict
        The state, ready for :meth:`Functional.step`.

    Raises
    ------
    TypeError
        If ``flat`` is not a mapping (a dict, or what ``numpy.load`` gives for an ``.npz``).
    KeyError
        If an entry is missing (the message names it).
    """
    if not isinstance(flat, Mapping):
        raise TypeError("`flat` must be a mapping of keys to arrays (a dict, or numpy.load of "
                        f"an .npz). Received: {type(flat).__name__}")

    def entry(key):
        if key not in flat:
            raise KeyError(f"The flattened state has no entry {key!r}.")
        return np.asarray(flat[key])

    def keys_under(node, key):
        if _is_node(node):
            return [k for child_key, child in _children(node, key)
                    for k in keys_under(child, f"{key}/{child_key}")]
        return [key]

    def tree_under(prefix):
        return _rebuild(params, [entry(k) for k in keys_under(params, prefix)])

    state = {"iterations": entry("iterations")}
    if "learning_rate" in flat:
        state["learning_rate"] = entry("learning_rate")
    names = sorted({k.split("/")[1] for k in flat if k.startswith("slots/")})
    state["slots"] = {name: tree_under(f"slots/{name}") for name in names}
    state["variable_steps"] = tree_under("variable_steps")
    for key in ("sparse_momentum",):  # SGD's sparse momentum under "torch", when present
        if any(k == key or k.startswith(key + "/") for k in flat):
            state[key] = tree_under(key)
    return state


# --------------------------------------------------------------------------- the functions
def _readonly(a):
    """A read-only copy of ``a`` (a view of a read-only base: its flag cannot be set back)."""
    base = np.array(a, copy=True)
    base.flags.writeable = False
    return base.view()


class Functional:
    """An optimizer class as pure functions: :meth:`init`, :meth:`step`, :meth:`update`.

    Create it with :func:`functional` or a shortcut (``refopt.functional.adam(...)``); see
    the module docstring for the structures of params and state.

    Parameters
    ----------
    optimizer_class : type
        A subclass of :class:`refopt.Optimizer` (refopt's or yours).
    *args, **kwargs
        Its constructor arguments (``learning_rate``, ``convention``, ``backend``...),
        checked now: a bad one raises here what the class raises.

    Attributes
    ----------
    optimizer_class : type
    config : dict
        ``get_config()`` of an optimizer built with these arguments.
    """

    def __init__(self, optimizer_class, *args, **kwargs):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError("`optimizer_class` must be a refopt optimizer class (e.g. "
                            f"refopt.Adam). Received: {optimizer_class!r}")
        self.optimizer_class = optimizer_class
        self._args, self._kwargs = args, dict(kwargs)
        proto = optimizer_class(*args, **kwargs)  # the class's own checks and warnings, once
        self.config = proto.get_config()
        self._backend = proto.backend
        # the rate a state without "learning_rate" gets (a schedule: evaluated at iterations)
        self._default_lr = None if isinstance(
            self.config["learning_rate"], dict) else proto.learning_rate
        self._lock = threading.RLock()
        self._cache = None  # (signature, optimizer, private variables)
        self._last = None   # ids of the leaves of the state the cached optimizer holds

    def __repr__(self):
        return f"Functional({self.optimizer_class.__name__}, {self.config!r})"

    def __getstate__(self):  # the lock cannot be pickled; the cache is rebuilt on demand
        state = dict(self.__dict__)
        del state["_lock"]
        state["_cache"] = state["_last"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- helpers
    def _new_optimizer(self):
        with warnings.catch_warnings():  # already said once, at construction
            warnings.simplefilter("ignore", UserWarning)
            return self.optimizer_class(*self._args, **self._kwargs)

    def _kc(self):
        from refopt.kernels import cuda as kc

        return kc

    def _is_device(self, a):
        return self._backend == "cuda" and not isinstance(a, np.ndarray) and (
            hasattr(a, "__cuda_array_interface__") or self._kc().is_device_array(a))

    def _check_params(self, params):
        """The leaves of ``params`` (objects with ``__array__`` as ndarrays) and paths."""
        leaves, paths = _flatten(params, "params")
        for i, (leaf, path) in enumerate(zip(leaves, paths)):
            if self._is_device(leaf):
                dtype = np.dtype(leaf.dtype)
            elif isinstance(leaf, np.ndarray) or hasattr(leaf, "__array__"):
                leaves[i] = leaf = np.asarray(leaf)  # a JAX array, a CPU torch tensor: read
                dtype = leaf.dtype
            else:
                raise TypeError(f"`{path}` must be an ndarray"
                                + (" or a device array" if self._backend == "cuda" else "")
                                + f". Received: {type(leaf).__name__}")
            if dtype not in (np.float16, np.float32, np.float64):
                raise TypeError(f"`{path}` must be float16, float32 or float64. Received: "
                                f"dtype={dtype}")
        return leaves, paths

    def _signature(self, params, leaves):
        return (_structure(params),
                tuple((tuple(a.shape), np.dtype(a.dtype).str) for a in leaves))

    def _optimizer_for(self, params, leaves):
        """The cached optimizer built on private copies of ``leaves`` (or a new one)."""
        sig = self._signature(params, leaves)
        if self._cache is not None and self._cache[0] == sig:
            return self._cache[1], self._cache[2], True
        if self._backend == "cuda":
            kc = self._kc()
            private = [kc.to_device(np.zeros(tuple(a.shape), np.dtype(a.dtype))) for a in leaves]
        else:
            private = [np.zeros(a.shape, a.dtype) for a in leaves]
        self._load_params(private, leaves)
        opt = self._new_optimizer()
        opt.build(private)
        self._cache, self._last = (sig, opt, private), None
        return opt, private, False

    def _load_params(self, private, leaves):
        for target, value in zip(private, leaves):
            if not (isinstance(value, np.ndarray) or self._is_device(value)):
                value = np.asarray(value)
            if isinstance(target, np.ndarray):
                np.copyto(target, value)
            elif value.size:
                target.copy_to_device(value if self._is_device(value)
                                      else np.ascontiguousarray(value))

    def _out(self, private, like):
        """A new array holding ``private``, of ``like``'s kind (host or device)."""
        if isinstance(private, np.ndarray):
            return private.copy()
        host = private.copy_to_host()
        return self._kc().to_device(host) if self._is_device(like) else host

    def _state_from(self, opt, params):
        sd = opt.state_dict()
        names = sd["slot_names"]
        state = {"iterations": _readonly(np.int64(sd["iterations"]))}
        if sd["learning_rate"] is not None:
            state["learning_rate"] = _readonly(np.float64(sd["learning_rate"]))
        state["slots"] = {name: _rebuild(params, [_readonly(a) for a in sd["slots"][name]])
                          for name in names}
        state["variable_steps"] = _rebuild(
            params, [_readonly(np.int64(k)) for k in sd["variable_steps"]])
        # an optimizer's state outside its slots (SGD's sparse momentum under "torch")
        extra = getattr(opt, "_extra_state_arrays", None)
        for key, arrays in (extra(sd) if extra else {}).items():
            state[key] = _rebuild(params, [_readonly(a) for a in arrays])
        return state

    def _state_ids(self, state):
        leaves, _ = _flatten(state, "state")
        return [id(a) for a in leaves], leaves

    def _load_state(self, opt, state, params, leaves, private):
        """``load_state_dict`` of ``state`` (checked here first, naming state paths)."""
        if not isinstance(state, dict):
            raise TypeError("`state` must be the dict that init() or step() returned. "
                            f"Received: {type(state).__name__}")
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(f"`state` lacks the keys {missing}; it must be what init() or "
                             "step() returned.")
        names = list(opt.slot_names)
        slots = state["slots"]
        if not isinstance(slots, dict) or sorted(slots) != sorted(names):
            raise ValueError(
                f"`state['slots']` must hold the slots {names} of "
                f"{self.optimizer_class.__name__} with this configuration. Received: "
                f"{sorted(slots) if isinstance(slots, dict) else type(slots).__name__}")
        flat_slots = {}
        for name in names:
            _same_structure(slots[name], params, f"state['slots'][{name!r}]")
            values, paths = _flatten(slots[name], f"state['slots'][{name!r}]")
            live = opt._averages if name == "average" else opt._slots[name]
            for value, path, target, var in zip(values, paths, live, leaves):
                value = np.asarray(value)
                shape, dtype = tuple(target.shape), np.dtype(target.dtype)
                if value.shape != shape or value.dtype != dtype:
                    raise ValueError(
                        f"`{path}` must be {dtype} of shape {shape} (slot {name!r} of a "
                        f"variable of shape {tuple(var.shape)}). Received: {value.dtype} of "
                        f"shape {value.shape}")
            flat_slots[name] = [np.asarray(v) for v in values]
        _same_structure(state["variable_steps"], params, "state['variable_steps']")
        steps = []
        for value, path in zip(*_flatten(state["variable_steps"], "state['variable_steps']")):
            steps.append(_integer(value, path))
        iterations = _integer(state["iterations"], "state['iterations']")
        lr = state.get("learning_rate")
        lr = self._default_lr if lr is None else _real(lr, "state['learning_rate']")
        sd = {"class": type(opt).__name__, "config": opt.get_config(),
              "iterations": iterations, "learning_rate": lr, "built": True,
              "slot_names": names, "slots": flat_slots, "variable_steps": steps}
        for key in getattr(opt, "_EXTRA_STATE_KEYS", ()):
            if key in state and hasattr(opt, "_extra_state_from_arrays"):
                _same_structure(state[key], params, f"state[{key!r}]")
                values, _ = _flatten(state[key], f"state[{key!r}]")
                sd[key] = opt._extra_state_from_arrays(key, values)
        try:
            opt.load_state_dict(sd)
        except (TypeError, ValueError) as exc:  # name the state's keys, not the class's
            raise _renamed(exc, str(exc).replace("`state_dict[", "`state[")) from None

    # ----------------------------------------------------------------- the API
    def init(self, params):
        """The initial state for ``params``.

        Parameters
        ----------
        params : tree of ndarray
            Float16/32/64 arrays (device arrays too with ``backend="cuda"``), in a list,
            tuple or dict, nested as you like. Read, never modified.

        Returns
        -------
        dict
            The state (module docstring): ``iterations`` 0, slots at the class's initial
            values, the EMA ``average`` a copy of ``params`` (zeros under Keras 3).

        Raises
        ------
        TypeError
            A leaf that is not a float array, or an unsortable dict key.
        """
        with self._lock:
            leaves, _ = self._check_params(params)
            self._cache = None  # a fresh optimizer, at iterations 0
            opt, _, _ = self._optimizer_for(params, leaves)
            state = self._state_from(opt, params)
            self._last = self._state_ids(state)
            return state

    def step(self, grads, state, params):
        """One step: the new params and the new state; the inputs are not modified.

        Parameters
        ----------
        grads : tree
            The structure of ``params``; each leaf an ndarray of its param's shape and dtype
            (a device array too with ``backend="cuda"``), a :class:`refopt.IndexedSlices`,
            or ``None`` (that param is not updated; the class's warning).
        state : dict
            From :meth:`init` or a previous :meth:`step` (or the same structure read back
            from a file, see :func:`unflatten_state`).
        params : tree of ndarray

        Returns
        -------
        new_params : tree
            New arrays (of ``params``' structure, container types and kinds).
        state : dict
            The new state (read-only arrays).

        Raises
        ------
        TypeError, ValueError
            ``grads`` or ``state`` of another structure than ``params`` (the message names
            the path), a slot of another shape or dtype, a missing key; plus what the class's
            ``apply_gradients`` raises (a gradient's shape or dtype, every gradient ``None``).
            Nothing is modified.
        """
        with self._lock:
            leaves, _ = self._check_params(params)
            _same_structure(grads, params, "grads")
            g_leaves, _ = _flatten(grads, "grads")
            opt, private, cached = self._optimizer_for(params, leaves)
            last, self._last = self._last, None  # until this step has completed
            if not (cached and last is not None and self._state_ids(state)[0] == last[0]):
                self._load_state(opt, state, params, leaves, private)
            self._load_params(private, leaves)
            pairs = [(self._gradient(g), v) for g, v in zip(g_leaves, private)]
            if pairs:
                self._apply(opt, pairs, params)
            new_params = _rebuild(params, [self._out(p, like)
                                           for p, like in zip(private, leaves)])
            new_state = self._state_from(opt, params)
            self._last = self._state_ids(new_state)
            return new_params, new_state

    def update(self, grads, state, params):
        """:meth:`step` as optax names it: ``updates = new_params - params``.

        Returns
        -------
        updates : tree
            ``new_params - params`` per leaf, in the param's dtype. Floating-point
            subtraction rounds: ``params + updates`` may differ from :meth:`step`'s
            ``new_params`` in the last bit; use :meth:`step` where bits matter.
        state : dict

        Raises
        ------
        As :meth:`step`.
        """
        new_params, state = self.step(grads, state, params)
        new_leaves, _ = _flatten(new_params, "")
        old_leaves, _ = self._check_params(params)
        out = []
        for new, old in zip(new_leaves, old_leaves):
            if isinstance(new, np.ndarray):
                with np.errstate(all="ignore"):
                    out.append(new - old)
            else:
                with np.errstate(all="ignore"):
                    diff = new.copy_to_host() - old.copy_to_host()
                out.append(self._kc().to_device(diff))
        return _rebuild(params, out), state

    def _apply(self, opt, pairs, params):
        """``opt.apply_gradients(pairs)``, its errors and warnings naming tree paths
        (``grads['w']``, ``params['w']``) instead of positions in the sorted leaves."""
        _, gpaths = _flatten(params, "grads")
        _, ppaths = _flatten(params, "params")

        def paths(text):
            text = re.sub(r"Gradient at position (\d+)",
                          lambda m: f"Gradient `{gpaths[int(m[1])]}`", text)
            text = re.sub(r"variables at positions \[([\d, ]*)\]", lambda m: "variables " + ", ".join(
                f"`{ppaths[int(k)]}`" for k in m[1].split(",") if k.strip()), text)
            return re.sub(r"variable at position (\d+)",
                          lambda m: f"variable `{ppaths[int(m[1])]}`", text)

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                opt.apply_gradients(pairs)
        except (TypeError, ValueError) as exc:
            text = str(exc)
            if paths(text) == text:
                raise
            raise _renamed(exc, paths(text)) from None
        for w in caught:  # again, through the caller's filters, at the caller's line
            warnings.warn(paths(str(w.message)), w.category,
                          stacklevel=Optimizer._user_stacklevel())

    def _gradient(self, g):
        if not (g is None or isinstance(g, (np.ndarray, IndexedSlices)) or self._is_device(g)):
            g = np.asarray(g)  # an object with __array__ (a JAX array, a CPU torch tensor)
        if self._backend == "cuda" and isinstance(g, np.ndarray):
            return self._kc().to_device(g)  # the class takes device gradients (a copy)
        return g


def _renamed(exc, text):
    """An exception of ``exc``'s type with the message ``text`` (``exc`` itself when its
    type cannot be made from a message)."""
    try:
        return type(exc)(text)
    except Exception:  # noqa: BLE001 - an exception type with another constructor
        return exc


def _real(value, path):
    """A 0-d real array (or number) as a float, if it converts exactly."""
    a = np.asarray(value)
    if a.shape != () or a.dtype.kind not in "fiu":
        raise ValueError(f"`{path}` must be a 0-d float array (or a number). Received: "
                         f"{a.dtype} of shape {a.shape}")
    if a.dtype.kind == "f":
        out = float(a)
        if np.isfinite(a) and out != a:  # a longdouble beyond float64
            raise ValueError(f"`{path}` must convert to a float exactly. Received: {a!r}")
        return out
    out = float(int(a))
    if int(out) != int(a):
        raise ValueError(f"`{path}` must convert to a float exactly. Received: {int(a)}")
    return out


def _integer(value, path):
    a = np.asarray(value)
    if a.shape != () or a.dtype.kind not in "iu":
        raise ValueError(f"`{path}` must be a 0-d integer array. Received: {a.dtype} of shape "
                         f"{a.shape}")
    return int(a)


def functional(optimizer_class, *args, **kwargs):
    """``optimizer_class(*args, **kwargs)`` as pure functions (:class:`Functional`).

    Parameters
    ----------
    optimizer_class : type
        A :class:`refopt.Optimizer` subclass (``refopt.Adam``, ``refopt.Ftrl``, yours...).
    *args, **kwargs
        Its constructor arguments, checked now.

    Returns
    -------
    Functional

    Raises
    ------
    TypeError
        ``optimizer_class`` is not an optimizer class; plus what its constructor raises.
    """
    return Functional(optimizer_class, *args, **kwargs)


def _shortcut(cls):
    def make(*args, **kwargs):
        return Functional(cls, *args, **kwargs)

    make.__name__ = make.__qualname__ = cls.__name__.lower()
    make.__doc__ = (f"``functional(refopt.{cls.__name__}, *args, **kwargs)``: "
                    f":class:`refopt.{cls.__name__}` as pure functions (see "
                    ":mod:`refopt.functional`).")
    return make


for _name in _optimizers.__all__:
    if _name != "Optimizer":
        globals()[_name.lower()] = _shortcut(getattr(_optimizers, _name))
        __all__.append(_name.lower())
del _name
