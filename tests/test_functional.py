import doctest
import io
import warnings

import numpy as np
import pytest
from optimizer_db import OPTIMIZERS
from test_properties import cuda_or_skip

import refopt
from refopt import IndexedSlices, schedules
from refopt import functional as F


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}").tolist()


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def leaves(tree):
    """Leaves in jax.tree_util's order (dict keys sorted), written out naively."""
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in leaves(tree[k])]
    if isinstance(tree, (list, tuple)):
        return [x for v in tree for x in leaves(v)]
    return [tree]


def tree_bits(tree):
    return [None if x is None else bits(host(x)) for x in leaves(tree)]


def copy_grad(g):
    if isinstance(g, IndexedSlices):
        return IndexedSlices(g.values.copy(), g.indices.copy(), g.dense_shape)
    return None if g is None else g.copy()


def class_run(cls, kwargs, params, grads_per_step, to_device=None):
    """The stateful class over the leaves of params, in the functional API's order."""
    variables = [to_device(x) if to_device else x.copy() for x in leaves(params)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        opt = cls(**kwargs)
        for grads in grads_per_step:
            gs = [copy_grad(g) for g in leaves(grads)]
            if to_device:
                gs = [to_device(g) if isinstance(g, np.ndarray) else g for g in gs]
            opt.apply_gradients(zip(gs, variables))
    state = {name: [host(opt.get_slot(v, name)) for v in variables] for name in opt.slot_names}
    return [host(v) for v in variables], state, opt


def functional_run(fo, params, grads_per_step):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        state = fo.init(params)
        for grads in grads_per_step:
            params, state = fo.step(grads, state, params)
    return params, state


def nested(rng, dtype=np.float32):
    return {"dense": {"w": rng.standard_normal((3, 4)).astype(dtype),
                      "b": rng.standard_normal(4).astype(dtype)},
            "emb": [rng.standard_normal((6, 2)).astype(dtype)]}


def nested_grads(rng, steps, dtype=np.float32, sparse=False, skip=False):
    out = []
    for t in range(steps):
        emb = rng.standard_normal((6, 2)).astype(dtype)
        if sparse:
            emb = IndexedSlices(rng.standard_normal((3, 2)).astype(dtype),
                                rng.integers(0, 6, 3), (6, 2))
        b = None if skip and t == 1 else rng.standard_normal(4).astype(dtype)
        out.append({"dense": {"w": rng.standard_normal((3, 4)).astype(dtype), "b": b},
                    "emb": [emb]})
    return out


CASES = {
    "adam_amsgrad_ema": (refopt.Adam, {"learning_rate": 0.05, "amsgrad": True, "use_ema": True,
                                       "ema_overwrite_frequency": 2, "global_clipnorm": 1.0}),
    "lazy_adam_sparse": (refopt.LazyAdam, {"learning_rate": 0.05}),
    "adafactor": (refopt.Adafactor, {"learning_rate": 0.1}),
    "ftrl": (refopt.Ftrl, {"learning_rate": 0.1, "l1_regularization_strength": 0.01}),
    "sgd_momentum": (refopt.SGD, {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    "schedule": (refopt.SGD, {"learning_rate": schedules.ExponentialDecay(0.5, 1, 0.5)}),
    "torch_steps": (refopt.Adam, {"learning_rate": 0.05, "convention": "torch",
                                  "weight_decay": 0.01}),
}


def _grads_for(case, rng, steps=3):
    return nested_grads(rng, steps, sparse=case == "lazy_adam_sparse",
                        skip=case == "torch_steps")


@pytest.mark.parametrize("case", sorted(CASES))
def test_functional_matches_the_class_bit_for_bit(case):
    cls, kwargs = CASES[case]
    kwargs = dict(kwargs, backend="reference")
    rng = np.random.default_rng(0)
    params = nested(rng)
    grads = _grads_for(case, rng)
    new, state = functional_run(F.functional(cls, **kwargs), params, grads)
    expected, slots, opt = class_run(cls, kwargs, params, grads)
    assert tree_bits(new) == [bits(x) for x in expected]
    assert sorted(state["slots"]) == sorted(opt.slot_names)
    for name, arrays in slots.items():
        assert tree_bits(state["slots"][name]) == [bits(x) for x in arrays]
    assert int(state["iterations"]) == opt.iterations
    assert [int(k) for k in leaves(state["variable_steps"])] == opt._var_steps
    assert float(state["learning_rate"]) == opt.learning_rate
    if case == "torch_steps":
        assert [int(k) for k in leaves(state["variable_steps"])] == [2, 3, 3]


@pytest.mark.parametrize("info", OPTIMIZERS, ids=lambda info: info.cls.__name__)
def test_every_optimizer_matches_its_class(info):
    config = dict(info.configs[-1], backend="reference")
    rng = np.random.default_rng(1)
    params = [rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    grads = [[rng.standard_normal(p.shape).astype(np.float32) for p in params] for _ in range(3)]
    shortcut = getattr(F, info.cls.__name__.lower())
    new, state = functional_run(shortcut(**config), params, grads)
    expected, slots, _ = class_run(info.cls, config, params, grads)
    assert tree_bits(new) == [bits(x) for x in expected]
    for name, arrays in slots.items():
        assert tree_bits(state["slots"][name]) == [bits(x) for x in arrays]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("case", ["adam_amsgrad_ema", "lazy_adam_sparse", "torch_steps"])
def test_functional_on_fast_backends_matches_the_reference_class(backend, case):
    to_device = None
    if backend == "cuda":
        kc = cuda_or_skip()
        to_device = kc.to_device
    cls, kwargs = CASES[case]
    rng = np.random.default_rng(2)
    params = nested(rng)
    grads = _grads_for(case, rng)
    new, state = functional_run(F.functional(cls, **dict(kwargs, backend=backend)), params,
                                grads)
    assert all(isinstance(x, np.ndarray) for x in leaves(new))  # host in, host out
    expected, slots, _ = class_run(cls, dict(kwargs, backend="reference"), params, grads)
    assert tree_bits(new) == [bits(x) for x in expected]
    for name, arrays in slots.items():
        assert tree_bits(state["slots"][name]) == [bits(x) for x in arrays]
    if backend == "cuda":  # device params in, device params out, same numbers
        dev = [to_device(x) for x in leaves(params)]
        fo = F.functional(cls, **dict(kwargs, backend=backend))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            s = fo.init(dev)
            for g in grads:
                dev, s = fo.step(leaves(g), s, dev)
        assert not any(isinstance(x, np.ndarray) for x in dev)
        assert [bits(host(x)) for x in dev] == [bits(x) for x in expected]


# --------------------------------------------------------------------------- purity and cache
def test_step_is_pure_and_returns_new_arrays():
    rng = np.random.default_rng(3)
    params = nested(rng)
    grads = nested_grads(rng, 1, sparse=True)[0]
    fo = F.adam(learning_rate=0.1, use_ema=True, backend="reference")
    state = fo.init(params)
    before = (tree_bits(params), tree_bits(state), tree_bits(grads["dense"]),
              bits(grads["emb"][0].values))
    new, new_state = fo.step(grads, state, params)
    assert before == (tree_bits(params), tree_bits(state), tree_bits(grads["dense"]),
                      bits(grads["emb"][0].values))
    for a, b in zip(leaves(new), leaves(params)):
        assert not np.shares_memory(a, b) and a.flags.writeable
    assert set(new) == set(params) and isinstance(new["emb"], list)
    assert not any(np.shares_memory(a, b) for a in leaves(new_state) for b in leaves(state))
    with pytest.raises(ValueError, match="read-only"):
        new_state["slots"]["m"]["dense"]["w"][0, 0] = 1.0
    with pytest.raises(ValueError):
        new_state["slots"]["m"]["dense"]["w"].flags.writeable = True


def test_cached_optimizer_never_changes_results():
    rng = np.random.default_rng(4)
    params = nested(rng)
    grads = nested_grads(rng, 4)
    kwargs = {"learning_rate": 0.1, "amsgrad": True, "backend": "reference"}
    fo = F.adam(**kwargs)
    s0 = fo.init(params)
    p1, s1 = fo.step(grads[0], s0, params)
    p2, s2 = fo.step(grads[1], s1, p1)
    # An older state (not the last one), from another object: the same result as a fresh one.
    q2, t2 = F.adam(**kwargs).step(grads[1], s1, p1)
    assert tree_bits(q2) == tree_bits(p2) and tree_bits(t2) == tree_bits(s2)
    again, again_state = fo.step(grads[1], s1, p1)  # s1 is no longer fo's last state
    assert tree_bits(again) == tree_bits(p2) and tree_bits(again_state) == tree_bits(s2)
    # Two trajectories interleaved through one object: as two separate objects.
    other = F.adam(**kwargs)
    o = other.init(params)
    x, _sx = fo.step(grads[2], s2, p2)
    y, sy = fo.step(grads[3], s0, params)
    assert tree_bits(y) == tree_bits(other.step(grads[3], o, params)[0])
    assert tree_bits(x) == tree_bits(F.adam(**kwargs).step(grads[2], s2, p2)[0])
    # A replaced entry of the last returned state is read, not the cached optimizer's.
    edited = dict(sy, slots=dict(sy["slots"], m={"dense": {"w": np.zeros((3, 4), np.float32),
                                                           "b": np.zeros(4, np.float32)},
                                                  "emb": [np.zeros((6, 2), np.float32)]}))
    z, _ = fo.step(grads[0], edited, y)
    assert tree_bits(z) == tree_bits(F.adam(**kwargs).step(grads[0], edited, y)[0])
    # A float learning rate in the state is the one the step uses.
    fast = dict(sy, learning_rate=np.float64(np.float32(0.5)))
    assert tree_bits(fo.step(grads[0], fast, y)[0]) == tree_bits(
        F.adam(**dict(kwargs, learning_rate=0.5)).step(
            grads[0], {k: v for k, v in sy.items() if k != "learning_rate"}, y)[0])


def test_the_last_returned_state_is_not_loaded_again(monkeypatch):
    loads = []
    original = F.Functional._load_state
    monkeypatch.setattr(F.Functional, "_load_state",
                        lambda self, *args: loads.append(1) or original(self, *args))
    rng = np.random.default_rng(8)
    params = nested(rng)
    grads = nested_grads(rng, 3)
    fo = F.adam(learning_rate=0.1, backend="reference")
    s0 = fo.init(params)
    p1, s1 = fo.step(grads[0], s0, params)
    p2, s2 = fo.step(grads[1], s1, p1)
    assert loads == []  # each step got the state the previous one returned
    fo.step(grads[2], dict(s2), p2)  # a new dict holding the same arrays: still the same state
    assert loads == []
    fo.step(grads[2], s1, p2)
    assert loads == [1]


def test_update_is_new_params_minus_params():
    rng = np.random.default_rng(5)
    params = nested(rng)
    grads = nested_grads(rng, 1)[0]
    fo = F.sgd(learning_rate=0.1, momentum=0.9, backend="reference")
    state = fo.init(params)
    new, s_step = fo.step(grads, state, params)
    updates, s_update = fo.update(grads, state, params)
    for u, n, p in zip(leaves(updates), leaves(new), leaves(params)):
        assert bits(u) == bits(n - p) and u.dtype == p.dtype
    assert tree_bits(s_step) == tree_bits(s_update)


def test_state_round_trips_through_savez():
    rng = np.random.default_rng(6)
    params = nested(rng)
    grads = nested_grads(rng, 3, skip=True)
    fo = F.adam(learning_rate=0.1, convention="torch", use_ema=False, backend="reference")
    p, s = functional_run(fo, params, grads[:2])
    flat = F.flatten_state(s)
    assert "slots/m/dense/w" in flat and "variable_steps/emb/0" in flat
    buf = io.BytesIO()
    np.savez(buf, **flat)
    buf.seek(0)
    with np.load(buf) as z:
        restored = F.unflatten_state(dict(z), params)
    a, sa = fo.step(grads[2], s, p)
    b, sb = F.adam(learning_rate=0.1, convention="torch", backend="reference").step(
        grads[2], restored, p)
    assert tree_bits(a) == tree_bits(b) and tree_bits(sa) == tree_bits(sb)
    with pytest.raises(KeyError, match="no entry 'slots/v/emb/0'"):
        F.unflatten_state({k: v for k, v in flat.items() if k != "slots/v/emb/0"}, params)


def test_read_only_and_array_like_params_are_accepted():
    class ArrayLike:  # what a JAX array offers NumPy: __array__, read-only memory
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    frozen = np.arange(4, dtype=np.float32)
    frozen.flags.writeable = False
    fo = F.sgd(learning_rate=0.5, backend="reference")
    params = [ArrayLike(frozen), frozen]
    grads = [ArrayLike(np.ones(4, np.float32)), np.ones(4, np.float32)]
    new, _ = fo.step(grads, fo.init(params), params)
    assert all(isinstance(x, np.ndarray) and bits(x) == bits(frozen - 0.5) for x in new)
    updates, _ = fo.update(grads, fo.init(params), params)
    assert bits(updates[0]) == bits(np.full(4, -0.5, np.float32))


def test_tuples_namedtuples_and_single_arrays_keep_their_structure():
    from collections import namedtuple

    Pair = namedtuple("Pair", "a b")
    params = (Pair(np.ones(2), np.zeros(3)), np.ones(1))
    grads = (Pair(np.ones(2), np.ones(3)), np.ones(1))
    fo = F.sgd(learning_rate=0.5, backend="reference")
    new, _state = fo.step(grads, fo.init(params), params)
    assert isinstance(new, tuple) and isinstance(new[0], Pair)
    assert (new[0].a == 0.5).all() and (new[0].b == -0.5).all()
    single, _ = fo.step(np.ones(2), fo.init(np.ones(2)), np.ones(2))
    assert isinstance(single, np.ndarray) and (single == 0.5).all()


# --------------------------------------------------------------------------- errors
def test_bad_inputs_raise_change_nothing_and_leave_the_object_usable():
    rng = np.random.default_rng(7)
    params = nested(rng)
    grads = nested_grads(rng, 2)
    fo = F.adam(learning_rate=0.1, backend="reference")
    state = fo.init(params)
    p1, s1 = fo.step(grads[0], state, params)
    snap = (tree_bits(p1), tree_bits(s1))
    bad_grads = {"dense": grads[1]["dense"], "emb": grads[1]["emb"] * 2}
    with pytest.raises(ValueError, match="`grads` must have the structure of `params`"):
        fo.step(bad_grads, s1, p1)
    wrong_shape = dict(s1, slots=dict(s1["slots"], v=dict(s1["slots"]["v"], emb=[np.zeros(3, np.float32)])))
    with pytest.raises(ValueError, match=r"`state\['slots'\]\['v'\]\['emb'\]\[0\]` must be "
                                         r"float32 of shape \(6, 2\).*Received: float32 of shape \(3,\)"):
        fo.step(grads[1], wrong_shape, p1)
    sgd_state = F.sgd(learning_rate=0.1, momentum=0.9, backend="reference").init(params)
    with pytest.raises(ValueError, match=r"must hold the slots \['m', 'v'\] of Adam.*\['m'\]"):
        fo.step(grads[1], sgd_state, p1)
    with pytest.raises(ValueError, match=r"lacks the keys \['iterations'\]"):
        fo.step(grads[1], {k: v for k, v in s1.items() if k != "iterations"}, p1)
    with pytest.raises(ValueError, match=r"state\['iterations'\]` must be a 0-d integer"):
        fo.step(grads[1], dict(s1, iterations=np.float64(1)), p1)
    with pytest.raises(TypeError, match=r"`params\['dense'\]\['b'\]` must be an ndarray"):
        fo.step(grads[1], s1, {"dense": {"w": p1["dense"]["w"], "b": 1.0}, "emb": p1["emb"]})
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        fo.init([np.ones(2, np.int32)])
    all_none = {"dense": {"w": None, "b": None}, "emb": [None]}
    with pytest.raises(ValueError):
        fo.step(all_none, s1, p1)
    assert snap == (tree_bits(p1), tree_bits(s1))
    # still usable, and still the same numbers as a fresh object
    p2, s2 = fo.step(grads[1], s1, p1)
    q2, t2 = F.adam(learning_rate=0.1, backend="reference").step(grads[1], s1, p1)
    assert tree_bits(p2) == tree_bits(q2) and tree_bits(s2) == tree_bits(t2)


def test_construction_checks_the_class_and_its_arguments():
    with pytest.raises(TypeError, match="refopt optimizer class"):
        F.functional(np.ndarray)
    with pytest.raises(ValueError, match=r"learning_rate.*>= 0"):
        F.adam(learning_rate=-1.0)
    names = {info.cls.__name__.lower() for info in OPTIMIZERS}
    assert len(names) >= 16 and names <= set(F.__all__)
    assert refopt.functional is F and "functional" in refopt.__all__


def test_module_docstring_examples():
    result = doctest.testmod(F, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_functional_objects_pickle_and_deepcopy_and_give_the_same_numbers():
    import copy
    import pickle

    params = {"w": np.ones(3, np.float32), "b": np.zeros(2, np.float64)}
    grads = {"w": np.full(3, 0.5, np.float32), "b": np.ones(2)}
    fo = F.adam(learning_rate=schedules.ExponentialDecay(0.1, 2, 0.5), backend="reference")
    p1, s1 = fo.step(grads, fo.init(params), params)  # the cache is filled
    for clone in (pickle.loads(pickle.dumps(fo)), copy.deepcopy(fo)):
        assert clone.config == fo.config and clone._cache is None
        a, sa = clone.step(grads, s1, p1)
        b, sb = F.adam(learning_rate=schedules.ExponentialDecay(0.1, 2, 0.5),
                       backend="reference").step(grads, s1, p1)
        assert tree_bits(a) == tree_bits(b) and tree_bits(sa) == tree_bits(sb)
    assert fo._cache is not None  # the original keeps its optimizer


def test_errors_and_warnings_name_tree_paths_not_sorted_positions():
    fo = F.adam(learning_rate=0.1, backend="reference")
    params = {"w": np.ones(3, np.float32), "b": np.zeros(2, np.float32)}  # sorted: b, w
    state = fo.init(params)
    with pytest.raises(ValueError, match=r"Gradient `grads\['w'\]` has shape=\(4,\)"):
        fo.step({"w": np.ones(4, np.float32), "b": np.ones(2, np.float32)}, state, params)
    with pytest.raises(TypeError, match=r"Gradient `grads\['b'\]` has dtype=float64"):
        fo.step({"w": np.ones(3, np.float32), "b": np.ones(2)}, state, params)
    with pytest.warns(UserWarning, match=r"variables `params\['b'\]`; they are skipped") as rec:
        fo.step({"w": np.ones(3, np.float32), "b": None}, state, params)
    assert rec[0].filename == __file__  # the caller's line, not refopt's
    with pytest.raises(ValueError, match=r"`state\['iterations'\]` must be an integer in"):
        fo.step({"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)},
                dict(state, iterations=np.int64(-5)), params)
    with pytest.raises(ValueError, match=r"`state\['learning_rate'\]` must be a finite"):
        fo.step({"w": np.ones(3, np.float32), "b": np.ones(2, np.float32)},
                dict(state, learning_rate=np.float64(np.nan)), params)


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), (np.int32(2), 2.0), (np.array(3, np.int64), 3.0), (0.25, 0.25),
    (np.float32(0.5), 0.5), (np.array(0.125, np.float16), 0.125),
])
def test_a_0d_or_integer_learning_rate_in_the_state_is_accepted_when_exact(value, expected):
    fo = F.sgd(learning_rate=0.1, convention="torch", backend="reference")
    params = [np.ones(2)]
    _, state = fo.step([np.ones(2)], dict(fo.init(params), learning_rate=value), params)
    assert float(state["learning_rate"]) == expected


@pytest.mark.parametrize("value, match", [
    (np.array([0.1]), "0-d float array"), (True, "0-d float array"), ("0.1", "0-d float array"),
    (2**53 + 1, "convert to a float exactly"),
])
def test_a_learning_rate_in_the_state_that_is_not_a_0d_real_is_refused(value, match):
    fo = F.sgd(learning_rate=0.1, backend="reference")
    params = [np.ones(2)]
    with pytest.raises(ValueError, match=rf"`state\['learning_rate'\]` must .*{match}"):
        fo.step([np.ones(2)], dict(fo.init(params), learning_rate=value), params)


def test_unflatten_state_of_a_non_mapping_is_a_type_error():
    with pytest.raises(TypeError, match=r"`flat` must be a mapping.*Received: list"):
        F.unflatten_state([1, 2], {"w": np.ones(1, np.float32)})
