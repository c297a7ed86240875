"""refopt's numbers as optax ``GradientTransformation`` objects.

``refopt.optax.transform(refopt.Adam, learning_rate=1e-3, convention="tf_keras")`` is an
:class:`optax.GradientTransformation` whose ``update`` computes exactly what
``refopt.Adam(learning_rate=1e-3, convention="tf_keras")`` computes (any refopt optimizer
class, any convention and keyword), usable on its own, inside :func:`optax.chain` and under
:func:`jax.jit`. The shortcuts ``refopt.optax.adam(...)``, ``sgd(...)``, ``rmsprop(...)``, ...
(one per optimizer class, lowercase) are the same with the class filled in.

How: the step runs on the host, in refopt, through :func:`jax.pure_callback` (the arrays go
to the CPU and back; jit compiles the call, not the arithmetic). The optimizer state is an
:class:`RefoptState` pytree of JAX arrays of fixed shapes and dtypes, so ``init``/``update``
jit, and one ``update`` is one call of refopt's pure step (:mod:`refopt.functional`'s
``step``; its state format is the one :func:`host_state` returns).

Exactness of ``optax.apply_updates``
------------------------------------
optax applies an update as ``params + updates``. refopt computes the new parameters ``n``;
``update`` returns ``u = n - p`` (rounded in the parameter's dtype), and
``optax.apply_updates(p, u) == n`` bit for bit when:

* ``n - p`` is exact: always when ``p/2 <= n <= 2p`` (Sterbenz' lemma), i.e. a weight that
  moves by less than its own size; and also, beyond that, whenever refopt's step is *one*
  rounded addition of a float to the weight, ``n = fl(p - d)`` (Adam, RMSprop, SGD under the
  Keras, TF1 and optax conventions): then ``fl(n - p)`` rounds back to ``-d`` and
  ``p + u`` is ``fl(p - d) = n`` again, even where the weight crosses zero. It fails where
  the weight is updated by more than one rounding (decoupled weight decay then the step:
  ``AdamW`` under ``"tf_keras"``/``"torch"``; torch's ``SGD`` with momentum, ``p + (-lr)*buf``
  with one rounding of an unrounded product) *and* ``|n|`` is smaller than the step (a
  weight crossing zero, or moved by more than half its size): there ``p + u`` can be off by
  an ulp of ``u``.
* no subnormal number is involved: XLA on the CPU flushes subnormals to zero (``p``, ``u``
  or ``p + u`` below ``numpy.finfo(dtype).tiny``), which refopt (IEEE arithmetic) does not;
  a subnormal weight with a zero update becomes ``0`` in ``apply_updates``. (XLA also runs
  the callback itself with subnormals flushed; the host step turns IEEE arithmetic back on
  for its duration, ``fesetenv(FE_DFL_ENV)``, so refopt's own numbers, a subnormal Adam ``v``
  included, are the stateful class's; where the C library cannot do this a
  ``RuntimeWarning`` says so once);
* ``p`` is finite: ``p = inf`` gives ``u = inf - inf = nan``.

Measured (a 1,153-weight tanh MLP, float32, 300 steps, ``jax.jit``): 0 elements differ for
``Adam`` (learning rate 1e-3 and 1e-2), ``RMSprop``, and ``SGD`` with momentum 0.9 under
``"tf_keras"`` and ``"optax"``, and ``AdamW`` under ``"optax"``; ``AdamW`` under
``"tf_keras"`` and ``"torch"`` about 1.3e-4 of the element-steps (one step in ten has one);
``SGD`` with momentum under ``"torch"`` about 2% of them (every step has some). Where you
need refopt's bits always, create the transform with ``keep_params=True`` and apply the
update with :func:`apply_updates` (it takes refopt's ``n`` from the state wherever the update
is this transform's own). ``Ftrl`` needs it too: its new weight is computed from its
accumulators, not added to the old one, so ``params + updates`` misses ``n`` in about 1.7% of
the element-steps (measured under ``"tf_keras"``, learning rate 0.1, 100 steps).

refopt's ``"optax"`` convention versus optax itself
---------------------------------------------------
The transform computes what refopt's class computes under the convention (bit for bit,
every dtype); ``convention="optax"`` reproduces ``optax.adam`` etc. under ``jax.jit`` for
float32 and float64 parameter trees of **two or more leaves** (the conformance cases). Two
things it does not reproduce (measured lock-step: at each of 100 steps optax's own state
and parameters given to refopt's step, 1,000 weights, Adam, learning rate 1e-3 / 1e-2):

* **float16 parameters**: optax's float16 arithmetic is not modelled; 0.7% / 4.5% of the
  element-steps differ (on the first step up to a third of the weights), and the
  trajectories then drift apart;
* **a single-leaf parameter tree** (one array, not a dict or list of several): XLA compiles
  optax's update for one leaf with other operations (reciprocal multiplies; see
  ``conformance/README.md`` §3); 0.09% / 0.6% of the element-steps differ (float32). refopt
  follows the several-leaf form.

64-bit values without ``jax_enable_x64``
----------------------------------------
JAX has no float64 arrays unless ``jax_enable_x64`` is set: ``jnp.asarray`` of a float64 array
gives float32 (with a warning), so float64 parameters reach the transform as float32 and are
computed as float32 by refopt, as JAX would. A NumPy float64 leaf given eagerly to ``init`` or
``update`` is refused with a ``TypeError`` naming ``jax_enable_x64``. The 64-bit scalars of
the state itself (the step counters, a float64 learning rate) are kept bit for bit without
x64 too: they are stored as pairs of uint32 words (``view(np.uint32)``); :func:`host_state`
decodes them.

vmap and autodiff
-----------------
Under :func:`jax.vmap`, ``init`` and ``update`` run one refopt step per batch element, in
turn (``pure_callback(vmap_method="sequential")``): a batch of independent optimizers, each
with refopt's numbers. ``update`` has no derivative (meta-gradients through it raise JAX's
error for ``pure_callback``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax

import refopt
from refopt.functional import functional as _functional
from refopt.optimizers.base import Optimizer

__all__ = [
    "RefoptState",
    "apply_updates",
    "host_state",
    "transform",
]

_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: the keys of the functional state whose values hold one entry per parameter leaf
_PER_LEAF_KEYS = ("variable_steps", "params")


# ----------------------------------------------------------------- IEEE arithmetic on the host
class _IEEE:
    """Run the host step with subnormals honoured: XLA calls a callback on its own CPU threads,
    whose floating-point environment flushes subnormals to zero (MXCSR's FTZ and DAZ on x86),
    which would change refopt's numbers (an Adam ``v`` below ``finfo.tiny``, a tiny weight).
    C99's ``fesetenv(FE_DFL_ENV)`` (glibc and musl: ``(const fenv_t *) -1``) restores IEEE
    arithmetic for the call; the thread's environment is put back after it."""

    _libm = None
    _warned = False

    @classmethod
    def _lib(cls):
        if cls._libm is None:
            cls._libm = False
            for name in (ctypes.util.find_library("m"), "libm.so.6"):
                try:
                    lib = ctypes.CDLL(name) if name else None
                    if lib is not None and hasattr(lib, "fegetenv") and hasattr(lib, "fesetenv"):
                        cls._libm = lib
                        break
                except OSError:
                    continue
        return cls._libm

    @staticmethod
    def _flushes():
        with np.errstate(all="ignore"):
            return np.float32(1e-39) + np.float32(0) == 0  # 1e-39: a float32 subnormal

    def __enter__(self):
        self._saved = None
        if not self._flushes():
            return self
        lib = self._lib()
        if lib:
            saved = ctypes.create_string_buffer(256)  # larger than any platform's fenv_t
            if lib.fegetenv(saved) == 0 and lib.fesetenv(ctypes.c_void_p(-1)) == 0:
                self._saved = saved
        if self._flushes() and not _IEEE._warned:
            _IEEE._warned = True
            warnings.warn(
                "refopt.optax: the thread running the host step flushes subnormal numbers to "
                "zero and refopt could not turn this off; where a subnormal value appears the "
                "numbers differ from refopt's stateful classes.", RuntimeWarning, stacklevel=2)
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            self._lib().fesetenv(self._saved)
        return False


# ----------------------------------------------------------------- the state pytree
def _needs_words(dtype):
    """Whether JAX cannot hold ``dtype`` now (64-bit without ``jax_enable_x64``)."""
    return jax.dtypes.canonicalize_dtype(dtype) != dtype


def _encode(a, words):
    a = np.asarray(a, order="C")  # (np.ascontiguousarray makes 0-d arrays 1-d)
    return a.reshape(-1).view(np.uint32).reshape(a.shape + (2,)) if words else a


def _decode(a, dtype, shape, words, batch=()):
    """A stored leaf back to ``dtype``; ``batch``: leading dimensions added by ``jax.vmap``."""
    a = np.asarray(a, order="C")
    return a.reshape(-1).view(dtype).reshape(batch + shape) if words else a


def _batch_shape(leaves, specs):
    """The leading dimensions ``jax.vmap`` added to every leaf of a state (``()`` for an
    unbatched state), or a clear error when the leaves do not fit the transform's layout."""
    batch = None
    for a, (dt, shape, words) in zip(leaves, specs):
        stored = shape + (2,) if words else shape
        lead = a.shape[:a.ndim - len(stored)]
        if a.ndim < len(stored) or a.shape[a.ndim - len(stored):] != stored or (
                batch is not None and lead != batch):
            raise ValueError(
                "`state` has a leaf of shape "
                f"{a.shape} where the transform stores {stored} ({np.dtype(dt)}"
                f"{', as uint32 pairs' if words else ''}), after the same leading (batch) "
                f"dimensions {batch if batch is not None else '(any)'} as the other leaves: a "
                "state batched by jax.vmap must have its batch dimensions first (vmap's "
                "default out_axes=0); index one element (jax.tree_util.tree_map(lambda x: "
                "x[i], state)) otherwise.")
        batch = lead
    return batch or ()


class _Meta:
    """The static part of a :class:`RefoptState` (hashable, compared by value under jit)."""

    __slots__ = ("_key", "host_treedef", "keep_params", "params_treedef", "specs")

    def __init__(self, host_treedef, params_treedef, specs, keep_params):
        self.host_treedef = host_treedef  # the functional state, per-leaf parts as lists
        self.params_treedef = params_treedef
        self.specs = specs  # per host leaf: (dtype str, shape, stored as uint32 words)
        self.keep_params = keep_params
        self._key = (host_treedef, params_treedef, specs, keep_params)

    def __eq__(self, other):
        return isinstance(other, _Meta) and self._key == other._key

    def __hash__(self):
        return hash(self._key)

    def jax_specs(self):
        return tuple(jax.ShapeDtypeStruct(shape + (2,), np.uint32) if words
                     else jax.ShapeDtypeStruct(shape, np.dtype(dt))
                     for dt, shape, words in self.specs)


class RefoptState:
    """The optax state of a :func:`transform`: refopt's functional state as JAX arrays.

    A pytree (registered with :mod:`jax.tree_util`) whose leaves are JAX arrays of fixed shape
    and dtype; ``state["slots"]["m"]`` etc. read it. Its layout is the functional state's
    (:mod:`refopt.functional`): ``"iterations"`` (0-d int64), ``"learning_rate"`` (0-d
    float64, absent for an optimizer without one), ``"slots"`` (slot name -> a tree like the
    parameters: e.g. ``"m"``, ``"v"``, ``"average"`` with ``use_ema``), ``"variable_steps"``
    (a tree like the parameters of 0-d int64: torch's per-parameter step counts) and, with
    ``keep_params=True``, ``"params"`` (refopt's new parameters of the last step). Without
    ``jax_enable_x64`` the 64-bit leaves are stored as uint32 pairs of shape ``shape + (2,)``;
    :func:`host_state` returns the decoded NumPy state.
    """

    __slots__ = ("_meta", "tree")

    def __init__(self, tree, meta):
        self.tree = tree
        self._meta = meta

    def __getitem__(self, key):
        return self.tree[key]

    def keys(self):
        return self.tree.keys()

    def __repr__(self):
        return f"RefoptState({self.tree!r})"


jax.tree_util.register_pytree_node(
    RefoptState, lambda s: ((s.tree,), s._meta), lambda meta, children: RefoptState(children[0], meta))


def _to_tree(host_leaves, meta):
    """Host-order leaves -> the readable tree: per-leaf lists become trees like the params."""
    state = jax.tree_util.tree_unflatten(meta.host_treedef, list(host_leaves))
    unflatten = meta.params_treedef.unflatten
    tree = {}
    for key, value in state.items():
        if key == "slots":
            value = {name: unflatten(arrays) for name, arrays in value.items()}
        elif key in _PER_LEAF_KEYS:
            value = unflatten(value)
        tree[key] = value
    return tree


def _host_leaves(np_state, meta, what):
    leaves, treedef = jax.tree_util.tree_flatten(np_state)
    if treedef != meta.host_treedef:
        raise RuntimeError(f"refopt's {what} returned a state of another structure "
                           f"({treedef}) than expected ({meta.host_treedef}).")
    return [_encode(np.asarray(a, np.dtype(dt)), words)
            for a, (dt, _, words) in zip(leaves, meta.specs)]


def host_state(state):
    """The NumPy functional state held by a :class:`RefoptState` (64-bit leaves decoded).

    Parameters
    ----------
    state : RefoptState
        A state from ``init`` or ``update`` of a :func:`transform` (concrete: not under
        ``jit``). Find it inside a chain's state with ``state[i]`` (``optax.chain`` keeps a
        tuple, one state per transformation).

    Returns
    -------
    dict
        ``{"iterations": 0-d int64, "learning_rate": 0-d float64 (when the optimizer has one),
        "slots": {name: list of ndarray, one per parameter leaf in
        ``jax.tree_util.tree_leaves`` order}, "variable_steps": list of 0-d int64}`` (plus
        ``"params"`` with ``keep_params=True``), new NumPy arrays: the state of
        :mod:`refopt.functional`, and of :meth:`refopt.Optimizer.state_dict` by its parts.
        A state batched by :func:`jax.vmap` gives every array with the batch dimensions in
        front (``"iterations"`` of shape ``(B,)``...): element ``i`` of each is optimizer
        ``i``'s.

    Raises
    ------
    TypeError
        If ``state`` is not a :class:`RefoptState`, or holds tracers (under ``jit``).
    ValueError
        If its leaves do not have the transform's shapes after one common set of leading
        (batch) dimensions (e.g. a state vmapped with ``out_axes`` other than 0).
    """
    if not isinstance(state, RefoptState):
        raise TypeError("`state` must be the RefoptState of a refopt.optax transform. "
                        f"Received: {type(state).__name__}")
    meta = state._meta
    leaves = jax.tree_util.tree_leaves(state.tree)
    if any(isinstance(a, jax.core.Tracer) for a in leaves):
        raise TypeError("host_state() reads concrete arrays; it cannot run under jit.")
    leaves = [np.asarray(a) for a in leaves]
    batch = _batch_shape(leaves, meta.specs)
    out = [_decode(a, np.dtype(dt), shape, words, batch).copy()
           for a, (dt, shape, words) in zip(leaves, meta.specs)]
    return jax.tree_util.tree_unflatten(meta.host_treedef, out)


# ----------------------------------------------------------------- checks
def _leaves_with_names(tree):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return [jax.tree_util.keystr(path) or "(root)" for path, _ in flat], \
        [leaf for _, leaf in flat], treedef


def _check_leaves(names, leaves, what):
    """Dtypes refopt computes, and no float64 JAX cannot hold; returns the (shape, dtype)s."""
    specs = []
    for name, leaf in zip(names, leaves):
        dtype = getattr(leaf, "dtype", None)
        shape = getattr(leaf, "shape", None)
        if dtype is None or shape is None:
            where = what if name == "(root)" else f"{what}{name}"
            raise TypeError(
                f"`{what}` leaves must be float16/32/64 arrays (refopt computes in the "
                f"leaf's dtype, which a Python number does not have). Received: {where} = "
                f"{leaf!r} ({type(leaf).__name__}); pass jnp.asarray(x, jnp.float32) (or "
                "the dtype you train in).")
        dtype = np.dtype(dtype)
        if dtype not in _FLOATS:
            raise TypeError(f"refopt computes float16, float32 and float64 arrays; `{what}` "
                            f"leaf {name} has dtype {dtype}.")
        if _needs_words(dtype):
            raise TypeError(
                f"`{what}` leaf {name} is {dtype}, which JAX holds only with "
                "jax.config.update('jax_enable_x64', True) (without it JAX would compute it in "
                "float32). Enable x64, or pass float32 arrays.")
        specs.append((tuple(shape), dtype))
    return specs


# ----------------------------------------------------------------- the transformation
def transform(optimizer, /, *args, keep_params=False, **kwargs):
    """An optax ``GradientTransformation`` computing refopt's ``optimizer`` step.

    ``update(grads, state, params)`` returns ``updates = n - params``, ``n`` the parameters
    that ``optimizer(*args, **kwargs).apply_gradients`` computes from ``params`` and
    ``grads`` with the state in ``state``, and the new state; every hyperparameter,
    convention (``"tf_keras"``, ``"keras3"``, ``"keras2"``, ``"tf1"``, ``"torch"``,
    ``"optax"``), clipping, weight decay and EMA option of the class applies.

    Parameters
    ----------
    optimizer : type
        A refopt optimizer class (:class:`refopt.Adam`, :class:`refopt.SGD`, your own
        subclass of :class:`refopt.Optimizer`), not an instance.
    *args, **kwargs
        Its constructor's arguments (Keras' names whatever the convention), e.g.
        ``learning_rate=1e-3, convention="torch", backend="cpu"``. ``learning_rate`` is a
        float or a :mod:`refopt.schedules` schedule (an optax schedule is refused: the
        schedule must give refopt's numbers too).
    keep_params : bool, default False
        Also keep refopt's new parameters in the state (``state["params"]``, the parameters'
        size again), so that :func:`apply_updates` returns refopt's bits even where
        ``params + updates`` rounds (see the module notes).

    Returns
    -------
    optax.GradientTransformation
        ``init(params) -> RefoptState`` and ``update(updates, state, params) ->
        (updates, state)``; both jit. ``params`` is any pytree of float16/float32/float64
        JAX (or NumPy) arrays; ``update`` needs ``params`` and gradients of the same tree,
        shapes and dtypes.

    Raises
    ------
    TypeError
        ``optimizer`` is not a refopt optimizer class; the constructor's own errors (an
        unknown keyword, a hyperparameter of the wrong type) are raised here, at once; a
        keyword named ``kwargs`` (``optax.inject_hyperparams``, not supported).
        From ``init``/``update``: a leaf that is not a float16/32/64 array; a float64 NumPy
        leaf without ``jax_enable_x64``; a ``state`` that is not this transform's.
    ValueError
        The constructor's (out of range, a convention without the option); from ``update``:
        ``params`` missing, or gradients whose tree, shapes or dtypes differ from the
        parameters' or from those ``init`` saw.

    Notes
    -----
    One ``update`` moves every leaf (a JAX gradient cannot be ``None``: a zero gradient is an
    ordinary step, as in optax). Sparse gradients (:class:`refopt.IndexedSlices`) are not
    expressible here; ``LazyAdam`` receives dense gradients. An empty parameter tree is a
    no-op (the counter does not move), as refopt's ``apply_gradients([])``. The
    hyperparameters are fixed when the transform is made (they are the class's, checked and
    rounded as the class does): a changing learning rate is a :mod:`refopt.schedules`
    schedule; ``optax.inject_hyperparams`` is not supported (it passes traced values; on a
    shortcut it raises a ``TypeError`` saying so, on ``transform`` itself optax calls the
    class as a schedule and refopt refuses the resulting learning rate).

    Examples
    --------
    >>> import jax, jax.numpy as jnp, optax, refopt, refopt.optax
    >>> params = {"w": jnp.ones(3)}
    >>> tx = optax.chain(optax.clip_by_global_norm(1.0),
    ...                  refopt.optax.adam(learning_rate=0.1, convention="tf_keras"))
    >>> state = tx.init(params)
    >>> grads = {"w": jnp.array([0.5, -0.5, 2.0])}
    >>> updates, state = jax.jit(tx.update)(grads, state, params)
    >>> optax.apply_updates(params, updates)["w"].tolist()
    [0.9000020027160645, 1.0999979972839355, 0.9000009894371033]
    """
    if not (isinstance(optimizer, type) and issubclass(optimizer, Optimizer)):
        hint = (" Pass the class and its arguments: transform(refopt.Adam, learning_rate=...)."
                if isinstance(optimizer, Optimizer) else "")
        raise TypeError("`optimizer` must be a refopt optimizer class (a subclass of "
                        f"refopt.Optimizer). Received: optimizer={optimizer!r}.{hint}")
    if not isinstance(keep_params, (bool, np.bool_)):
        raise TypeError(f"`keep_params` must be a bool. Received: keep_params={keep_params!r}")
    if "kwargs" in kwargs:  # optax.inject_hyperparams passes `**kwargs` by its name
        raise TypeError(
            f"refopt.optax's {optimizer.__name__} got a keyword argument named 'kwargs': "
            "optax.inject_hyperparams is not supported (it passes the hyperparameters as "
            "JAX arrays, traced under jit, at every init/update; refopt's are fixed, checked "
            "and rounded as the class does when the transform is made). For a changing "
            "learning rate pass a refopt.schedules schedule, e.g. learning_rate="
            "refopt.schedules.ExponentialDecay(1e-3, 1000, 0.9); host_state(state)"
            "['learning_rate'] reads the current value.")
    for key, value in list(kwargs.items()):
        if isinstance(value, jax.core.Tracer):
            raise TypeError(
                f"`{key}` is a traced JAX value (from optax.inject_hyperparams or a jitted "
                "factory); refopt's hyperparameters are fixed when the transform is made (a "
                f"changing learning rate is a refopt.schedules schedule). Received: {key}={value!r}")
        if isinstance(value, jax.Array) and value.shape == ():
            kwargs[key] = value.item()  # a concrete JAX scalar: its Python value
    fo = _functional(optimizer, *args, **kwargs)  # the class's checks, now
    keep_params = bool(keep_params)
    label = optimizer.__name__

    metas = {}  # (specs, tree, x64) -> _Meta: the state's layout, from a template init

    def meta_for(specs, params_treedef):
        key = (tuple(specs), params_treedef, bool(jax.config.read("jax_enable_x64")))
        if key not in metas:
            metas[key] = new_meta(specs, params_treedef)
        return metas[key]

    def new_meta(specs, params_treedef):
        template = fo.init([np.zeros(shape, dtype) for shape, dtype in specs])
        if keep_params:
            template["params"] = [np.zeros(shape, dtype) for shape, dtype in specs]
        leaves, host_treedef = jax.tree_util.tree_flatten(template)
        leaf_specs = []
        for a in leaves:
            a = np.asarray(a)
            words = _needs_words(a.dtype)
            if words and a.dtype.itemsize != 8:
                raise TypeError(f"refopt's {label} state has a {a.dtype} array, which JAX "
                                "cannot hold here.")
            leaf_specs.append((a.dtype.str, a.shape, words))
        return _Meta(host_treedef, params_treedef, tuple(leaf_specs), keep_params)

    def init_fn(params):
        names, leaves, params_treedef = _leaves_with_names(params)
        specs = _check_leaves(names, leaves, "params")
        meta = meta_for(specs, params_treedef)
        if not leaves:  # nothing to call back for: the state of no parameters
            host = _host_leaves(fo.init([]), meta, "init")
            return RefoptState(_to_tree([jnp.asarray(a) for a in host], meta), meta)

        def host_init(*param_leaves):
            param_leaves = [np.asarray(p) for p in param_leaves]
            with _IEEE():
                state = fo.init(param_leaves)
            if keep_params:
                state["params"] = [p.copy() for p in param_leaves]
            return tuple(_host_leaves(state, meta, "init"))

        out = jax.pure_callback(host_init, meta.jax_specs(), *leaves,
                                vmap_method="sequential")
        return RefoptState(_to_tree(out, meta), meta)

    def update_fn(updates, state, params=None):
        if params is None:
            raise ValueError(
                f"refopt.optax's {label} needs `params` in update(updates, state, params): "
                "refopt computes the new parameters and returns their difference.")
        if not isinstance(state, RefoptState):
            raise TypeError(f"`state` must be the RefoptState this transform's init returned. "
                            f"Received: {type(state).__name__}")
        meta = state._meta
        names, leaves, params_treedef = _leaves_with_names(params)
        gnames, grads, grads_treedef = _leaves_with_names(updates)
        if grads_treedef != params_treedef:
            raise ValueError(
                "`updates` (the gradients) and `params` must be trees of the same structure "
                "(no None where a parameter is). Received: "
                f"updates {grads_treedef}, params {params_treedef}")
        if params_treedef != meta.params_treedef:
            raise ValueError(
                f"`params` has the structure {params_treedef}, but `state` was created by "
                f"init() on {meta.params_treedef}.")
        specs = _check_leaves(names, leaves, "params")
        gspecs = _check_leaves(gnames, grads, "updates")
        for name, (shape, dtype), (gshape, gdtype) in zip(names, specs, gspecs):
            if (shape, dtype) != (gshape, gdtype):
                raise ValueError(
                    f"The gradient of {name} has shape {gshape} and dtype {gdtype}; the "
                    f"parameter has shape {shape} and dtype {dtype}.")
        if meta_for(specs, params_treedef) != meta:
            raise ValueError(
                "`params` has other shapes or dtypes than the ones `state` was created for by "
                "init().")
        if not leaves:
            return updates, state
        n = len(leaves)

        def host_update(*flat):
            grads_np = [np.asarray(g) for g in flat[:n]]
            params_np = [np.asarray(p) for p in flat[n + len(meta.specs):]]
            host = [_decode(a, np.dtype(dt), shape, words)
                    for a, (dt, shape, words) in zip(flat[n:n + len(meta.specs)], meta.specs)]
            np_state = jax.tree_util.tree_unflatten(meta.host_treedef, host)
            np_state.pop("params", None)
            with _IEEE():
                new_params, new_state = fo.step(grads_np, np_state, params_np)
                new_params = [np.asarray(a) for a in new_params]
                with np.errstate(all="ignore"):
                    deltas = [np.asarray(a - p, dtype=p.dtype)
                              for a, p in zip(new_params, params_np)]
            if keep_params:
                new_state["params"] = new_params
            return (*deltas, *_host_leaves(new_state, meta, "step"))

        result_specs = (*(jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs),
                        *meta.jax_specs())
        state_leaves = jax.tree_util.tree_leaves(state.tree)
        out = jax.pure_callback(host_update, result_specs, *grads, *state_leaves, *leaves,
                                vmap_method="sequential")
        new_updates = params_treedef.unflatten(out[:n])
        return new_updates, RefoptState(_to_tree(out[n:], meta), meta)

    return optax.GradientTransformation(init_fn, update_fn)


def apply_updates(params, updates, state):
    """``optax.apply_updates`` that returns refopt's new parameters bit for bit.

    Where an element of ``updates`` is the one a ``keep_params=True`` transform produced
    (``u == n - p``, ``n`` its kept parameters), the result is ``n``; elsewhere (another
    transformation changed the update after it) ``params + updates``, as optax. Use it where
    ``params + updates`` may round (a step that nearly cancels a weight, subnormals; see the
    module notes). Jits.

    Parameters
    ----------
    params : pytree of arrays
        The parameters ``updates`` was computed for.
    updates : pytree of arrays
        The output of the chain's ``update``.
    state : pytree
        The chain's state after that ``update``: exactly one :class:`RefoptState` inside it
        (the top level, or in a tuple such as ``optax.chain``'s) must have been made with
        ``keep_params=True``.

    Returns
    -------
    pytree of arrays
        The new parameters, with the structure and dtypes of ``params``.

    Raises
    ------
    ValueError
        If ``state`` holds no :class:`RefoptState` with ``keep_params=True``, or more than
        one, or one for another tree of parameters.
    """
    found = [s for s in jax.tree_util.tree_leaves(
        state, is_leaf=lambda x: isinstance(x, RefoptState)) if isinstance(s, RefoptState)
        and s._meta.keep_params]
    if len(found) != 1:
        raise ValueError(
            "`state` must hold exactly one RefoptState made with keep_params=True (pass "
            f"refopt.optax.transform(..., keep_params=True)); found {len(found)}.")
    kept = found[0]["params"]
    if jax.tree_util.tree_structure(params) != jax.tree_util.tree_structure(kept):
        raise ValueError("`params` is not the tree of parameters the kept state belongs to.")

    def one(p, u, n):
        p = jnp.asarray(p)
        u = jnp.asarray(u).astype(p.dtype)
        d = n - p
        ours = (u == d) | (jnp.isnan(u) & jnp.isnan(d))
        return jnp.where(ours, n, p + u).astype(p.dtype)

    return jax.tree_util.tree_map(one, params, updates, kept)


# ----------------------------------------------------------------- shortcuts
_DEFAULT = object()  # the class's own default learning rate (it differs per convention)

def _shortcut(cls):
    def make(learning_rate=_DEFAULT, *, keep_params=False, **kwargs):
        if learning_rate is not _DEFAULT:  # else the class's default
            kwargs["learning_rate"] = learning_rate
        return transform(cls, keep_params=keep_params, **kwargs)

    make.__name__ = make.__qualname__ = cls.__name__.lower()
    make.__doc__ = (
        f"``refopt.optax.transform(refopt.{cls.__name__}, learning_rate, **kwargs)``: refopt's "
        f"{cls.__name__} as an optax ``GradientTransformation`` (see :func:`transform`).")
    return make


for _name in refopt.__all__:
    _cls = getattr(refopt, _name)
    if isinstance(_cls, type) and issubclass(_cls, Optimizer) and _cls is not Optimizer:
        globals()[_name.lower()] = _shortcut(_cls)
        __all__.append(_name.lower())
del _name, _cls

