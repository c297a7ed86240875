import json
import os
import warnings

import numpy as np
import pytest
from optimizer_db import OPTIMIZERS
from test_properties import cuda_or_skip

import refopt
from refopt import IndexedSlices, schedules
from refopt.checkpoint import (
    CheckpointError,
    Restored,
    load_checkpoint,
    save_checkpoint,
)

SHAPES = [(3, 2), (4,)]


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def grads_for(rng, shapes, steps, dtype=np.float32):
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]


def run(opt, variables, gradients, to_device=None):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for grads in gradients:
            grads = [None if g is None else to_device(g) if to_device else g.copy()
                     for g in grads]
            opt.apply_gradients(zip(grads, variables))


def snapshot(opt, variables):
    """Bits of iterations, learning rate, step counts, variables and every slot."""
    out = {"iterations": opt.iterations, "lr": opt.learning_rate, "built": opt.built,
           "steps": list(opt._var_steps)}
    for i, v in enumerate(variables):
        out[f"var{i}"] = bits(host(v)).tolist()
        if opt.built:
            for name in opt.slot_names:
                out[f"{name}{i}"] = bits(host(opt.get_slot(v, name))).tolist()
    return out


def make(cls, config, backend="reference"):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return cls(**dict(config, backend=backend))


CASES = [(info.cls, config) for info in OPTIMIZERS for config in info.configs]


# --------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("cls, config", CASES,
                         ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CASES)])
def test_state_dict_round_trip_resumes_bit_identically(cls, config):
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    grads = grads_for(rng, SHAPES, 4)
    straight, w_straight = make(cls, config), [a.copy() for a in init]
    run(straight, w_straight, grads)

    first, w_first = make(cls, config), [a.copy() for a in init]
    run(first, w_first, grads[:2])
    sd = first.state_dict()
    assert sd["class"] == cls.__name__ and sd["iterations"] == 2 and sd["built"]
    assert sd["slot_names"] == list(first.slot_names) and set(sd["slots"]) == set(sd["slot_names"])
    # plain values only: JSON takes everything but the arrays, np.savez takes the arrays
    json.dumps({k: v for k, v in sd.items() if k != "slots"})
    resumed = make(cls, config)
    w_resumed = [a.copy() for a in w_first]
    resumed.load_state_dict(sd, var_list=w_resumed)
    assert snapshot(resumed, w_resumed) == snapshot(first, w_first)
    run(resumed, w_resumed, grads[2:])
    assert snapshot(resumed, w_resumed) == snapshot(straight, w_straight)


def test_state_dict_holds_copies():
    w = [np.ones(3, np.float32)]
    opt = refopt.Adam(0.1, backend="reference")
    run(opt, w, [[np.ones(3, np.float32)]])
    sd = opt.state_dict()
    before = snapshot(opt, w)
    for arrays in sd["slots"].values():
        arrays[0][...] = 123.0
    assert snapshot(opt, w) == before
    assert not np.shares_memory(sd["slots"]["m"][0], opt.get_slot(w[0], "m"))


def test_loading_into_a_built_optimizer_overwrites_its_slots_in_place():
    rng = np.random.default_rng(1)
    w = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    a = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    run(a, w, grads_for(rng, SHAPES, 3))
    w2 = [x.copy() for x in w]
    b = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    run(b, w2, grads_for(rng, SHAPES, 1))
    live = [b.get_slot(w2[0], name) for name in b.slot_names]
    b.load_state_dict(a.state_dict())  # var_list omitted: the built variables
    assert all(b.get_slot(w2[0], n) is s for n, s in zip(b.slot_names, live))
    for x, y in zip(w2, w):  # the variables are the caller's: not part of the state
        np.copyto(x, y)
    assert snapshot(b, w2) == snapshot(a, w)
    b.load_state_dict(a.state_dict(), var_list=w2)  # the built list itself is accepted
    assert snapshot(b, w2) == snapshot(a, w)


def test_float_learning_rate_is_restored_and_a_schedule_reports_the_saved_value():
    w = [np.ones(2, np.float32)]
    a = refopt.SGD(0.25, backend="reference")
    run(a, w, [[np.ones(2, np.float32)]])
    b = refopt.SGD(0.5, backend="reference")
    b.load_state_dict(a.state_dict(), var_list=[w[0].copy()])
    assert b.learning_rate == 0.25 and b.get_config()["learning_rate"] == 0.25
    b.load_state_dict(dict(a.state_dict(), learning_rate=0.1))  # stored as the setter does
    assert b.learning_rate == float(np.float32(0.1))

    sched = schedules.ExponentialDecay(1.0, 1, 0.5)
    a = refopt.SGD(sched, backend="reference")
    run(a, w, [[np.ones(2, np.float32)]] * 3)
    assert a.learning_rate == 0.25  # the value step 2 used
    b = refopt.SGD(sched, backend="reference")
    b.load_state_dict(a.state_dict(), var_list=[w[0].copy()])
    assert b.learning_rate == 0.25 and b.iterations == 3


def test_torch_per_variable_steps_are_restored():
    rng = np.random.default_rng(2)
    w = [rng.standard_normal(s) for s in SHAPES]
    grads = [[np.ones(SHAPES[0]), None], [np.ones(SHAPES[0]), np.ones(SHAPES[1])]]
    a = refopt.Adam(0.1, convention="torch", backend="reference")
    run(a, w, grads)
    sd = a.state_dict()
    assert sd["variable_steps"] == [2, 1]
    b = refopt.Adam(0.1, convention="torch", backend="reference")
    w2 = [x.copy() for x in w]
    b.load_state_dict(sd, var_list=w2)
    more = grads_for(rng, SHAPES, 2, np.float64)
    run(a, w, more)
    run(b, w2, more)
    assert snapshot(b, w2) == snapshot(a, w)


def test_a_state_saved_before_building_unbuilds_a_built_optimizer():
    fresh = refopt.Adam(0.1, backend="reference")
    fresh.iterations = 5
    sd = fresh.state_dict()
    assert not sd["built"] and sd["slots"] == {} and sd["variable_steps"] == []
    w = [np.ones(3, np.float32)]
    opt = refopt.Adam(0.1, backend="reference")
    run(opt, w, [[np.ones(3, np.float32)]])
    opt.load_state_dict(sd)
    assert not opt.built and opt.iterations == 5
    w2 = [np.ones(3, np.float32)]
    opt.load_state_dict(sd, var_list=w2)  # built on var_list at iterations 5
    assert opt.built and opt.iterations == 5 and (opt.get_slot(w2[0], "m") == 0).all()


# --------------------------------------------------------------------------- backends
def _backend_cases():
    return [
        (refopt.Adam, {"learning_rate": 0.05, "amsgrad": True, "weight_decay": 0.1, "use_ema": True,
                           "ema_overwrite_frequency": 3, "clipvalue": 0.9}),
        (refopt.Adafactor, {"learning_rate": 0.1}),
        (refopt.SGD, {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
        (refopt.Adam, {"learning_rate": 0.05, "convention": "torch"}),
    ]


@pytest.mark.parametrize("src, dst", [("cpu", "reference"), ("reference", "cpu"),
                                      ("cuda", "reference"), ("reference", "cuda")])
@pytest.mark.parametrize("case", range(4))
def test_state_moves_between_backends_bit_identically(src, dst, case):
    if "cuda" in (src, dst):
        kc = cuda_or_skip()
        if case == 1:
            pytest.skip("Adafactor's cuda path is covered by the cpu/reference cases")
    cls, config = _backend_cases()[case]
    shapes = [(3, 4), (5,)]
    rng = np.random.default_rng(10 + case)
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = grads_for(rng, shapes, 4)
    grads[1][1] = None  # a skipped variable: per-variable steps differ under torch

    def arrays(backend, values):
        return [kc.to_device(x) if backend == "cuda" else x.copy() for x in values]

    def dev(backend):
        return kc.to_device if backend == "cuda" else None

    ref, w_ref = make(cls, config), [x.copy() for x in init]
    run(ref, w_ref, grads)
    a, w_a = make(cls, config, src), arrays(src, init)
    run(a, w_a, grads[:2], dev(src))
    sd = a.state_dict()
    assert all(isinstance(x, np.ndarray) for xs in sd["slots"].values() for x in xs)
    b = make(cls, config, dst)
    w_b = arrays(dst, [host(x) for x in w_a])
    b.load_state_dict(sd, var_list=w_b)
    run(b, w_b, grads[2:], dev(dst))
    assert snapshot(b, w_b) == snapshot(ref, w_ref)


def test_cuda_load_state_dict_errors_change_nothing():
    kc = cuda_or_skip()
    w = [kc.to_device(np.ones(4, np.float32))]
    a = refopt.Adam(0.1, backend="cuda")
    run(a, w, [[np.ones(4, np.float32)]], kc.to_device)
    sd = a.state_dict()
    bad = dict(sd, slots=dict(sd["slots"], v=[np.zeros(5, np.float32)]))
    b = refopt.Adam(0.1, backend="cuda")
    w2 = [kc.to_device(np.full(4, 3.0, np.float32))]
    with pytest.raises(ValueError, match=r"\['v'\]\[0\]` has shape \(5,\)"):
        b.load_state_dict(bad, var_list=w2)
    assert not b.built and b.iterations == 0 and (host(w2[0]) == 3.0).all()


# --------------------------------------------------------------------------- errors
@pytest.fixture
def trained():
    rng = np.random.default_rng(3)
    w = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    opt = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    run(opt, w, grads_for(rng, SHAPES, 2))
    return opt, w


def _changed(sd, **changes):
    out = dict(sd, slots={k: list(v) for k, v in sd["slots"].items()})
    for key, value in changes.items():
        if key.startswith("slot_") and key != "slot_names":
            name, i = key[5:].rsplit("_", 1)
            out["slots"][name][int(i)] = value
        else:
            out[key] = value
    return out


@pytest.mark.parametrize("change, err, match", [
    (dict(**{"class": "SGD"}), ValueError,
     "state of an optimizer of class SGD; cannot load it into one of class Adam"),
    ({"config": "amsgrad"}, ValueError, r"Differences: amsgrad: saved False, this optimizer True"),
    ({"slot_m_1": np.zeros(5, np.float32)}, ValueError,
     r"`state_dict\['slots'\]\['m'\]\[1\]` has shape \(5,\).*slot 'm' of variable 1"),
    ({"slot_v_0": np.zeros((3, 2))}, ValueError, (r"\['v'\]\[0\]` has shape \(3, 2\) and dtype "
     r"float64.*float32")),
    ({"slot_names": ["m", "v"]}, ValueError, r"has the slots \['m', 'v'\]"),
    ({"iterations": -1}, ValueError, r"iterations.*Received: -1"),
    ({"variable_steps": [9, 9]}, ValueError, r"variable_steps.*\[0, iterations=2\]"),
    ({"learning_rate": 1e39}, ValueError, r"finite in float32.*Received: 1e\+39"),
    ({"learning_rate": float("nan")}, ValueError, r"learning_rate.*finite"),
    ({"built": "yes"}, TypeError, r"built.*bool"),
])
def test_bad_states_raise_and_change_nothing(trained, change, err, match):
    source, _w_source = trained
    sd = source.state_dict()
    if change.get("config") == "amsgrad":
        change = {"config": dict(sd["config"], amsgrad=False)}
    bad = _changed(sd, **change)
    # into a new optimizer (nothing built), and into a built one (nothing overwritten)
    fresh = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    w = [np.full(s, 7.0, np.float32) for s in SHAPES]
    with pytest.raises(err, match=match):
        fresh.load_state_dict(bad, var_list=w)
    assert not fresh.built and fresh.iterations == 0 and all((x == 7.0).all() for x in w)
    built = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    run(built, w, [[np.ones(s, np.float32) for s in SHAPES]])
    before = snapshot(built, w)
    with pytest.raises(err, match=match):
        built.load_state_dict(bad)
    assert snapshot(built, w) == before


def test_var_list_errors_change_nothing(trained):
    source, w_source = trained
    sd = source.state_dict()
    fresh = refopt.Adam(0.1, amsgrad=True, use_ema=True, backend="reference")
    with pytest.raises(ValueError, match="`var_list` is required"):
        fresh.load_state_dict(sd)
    with pytest.raises(ValueError, match="holds the state of 2 variables; `var_list` has 1"):
        fresh.load_state_dict(sd, var_list=[np.zeros(SHAPES[0], np.float32)])
    with pytest.raises(TypeError, match="must be a dict"):
        fresh.load_state_dict([sd])
    with pytest.raises(ValueError, match=r"lacks the keys \['slots'\]"):
        fresh.load_state_dict({k: v for k, v in sd.items() if k != "slots"})
    assert not fresh.built and fresh.iterations == 0
    other = [x.copy() for x in w_source]
    with pytest.raises(ValueError, match="built with 2 other variables"):
        source.load_state_dict(sd, var_list=other)
    assert source.get_slot(w_source[0], "m") is not None


# --------------------------------------------------------------------------- checkpoints
def _saved(tmp_path, include_variables=True, cls=refopt.Adam, **config):
    rng = np.random.default_rng(4)
    w = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    opt = cls(**dict({"learning_rate": 0.1, "use_ema": True, "backend": "reference"}, **config))
    grads = grads_for(rng, SHAPES, 4)
    run(opt, w, grads[:2])
    path = tmp_path / "c.npz"
    save_checkpoint(path, opt, w, include_variables=include_variables)
    return path, opt, w, grads[2:]


def test_load_checkpoint_from_the_file_alone_resumes_bit_identically(tmp_path):
    path, opt, w, more = _saved(tmp_path)
    restored = load_checkpoint(path)
    assert isinstance(restored, Restored)
    opt2, w2 = restored
    assert type(opt2) is refopt.Adam and opt2.get_config() == opt.get_config()
    assert snapshot(opt2, w2) == snapshot(opt, w)
    run(opt, w, more)
    run(opt2, w2, more)
    assert snapshot(opt2, w2) == snapshot(opt, w)


def test_load_checkpoint_without_optimizer_into_given_variables_and_another_backend(tmp_path):
    path, opt, w, more = _saved(tmp_path, include_variables=False)
    with pytest.raises(CheckpointError, match="saved without its variables"):
        load_checkpoint(path)
    mine = [x.copy() for x in w]
    opt2, w2 = load_checkpoint(path, variables=mine, backend="cpu")
    assert w2 is mine and opt2.backend == "cpu"
    run(opt, w, more)
    run(opt2, w2, more)
    assert snapshot(opt2, w2) == snapshot(opt, w)


class MyAdam(refopt.Adam):
    pass


def test_load_checkpoint_of_a_user_class_needs_custom_objects(tmp_path):
    path, opt, w, _ = _saved(tmp_path, cls=MyAdam)
    with pytest.raises(CheckpointError, match=r"class 'MyAdam'.*custom_objects=\{'MyAdam'"):
        load_checkpoint(path)
    opt2, w2 = load_checkpoint(path, custom_objects={"MyAdam": MyAdam})
    assert type(opt2) is MyAdam and snapshot(opt2, w2) == snapshot(opt, w)
    with pytest.raises(TypeError, match="apply only when load_checkpoint creates"):
        load_checkpoint(path, MyAdam(), w2, backend="cpu")
    with pytest.raises(TypeError, match="`variables` is required with `optimizer`"):
        load_checkpoint(path, MyAdam())


def test_checkpoint_paths_that_are_not_files_get_clear_errors(tmp_path, monkeypatch):
    opt, w = refopt.SGD(0.1, backend="reference"), [np.ones(2, np.float32)]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(IsADirectoryError, match=r"The checkpoint path '\.' is a directory.*"
                                                r"checkpoint\.npz"):
        save_checkpoint(".", opt, w)
    with pytest.raises(IsADirectoryError, match="is a directory"):
        load_checkpoint(tmp_path, opt, w)
    with pytest.raises(FileNotFoundError, match=r"the folder .*nowhere.* does not exist"):
        save_checkpoint(tmp_path / "nowhere" / "c.npz", opt, w)
    with pytest.raises(TypeError, match="`path` must be a file path"):
        save_checkpoint(3, opt, w)
    with pytest.raises(ValueError, match="`path` must name a file"):
        save_checkpoint("", opt, w)
    assert os.listdir(tmp_path) == []


def test_checkpoint_os_errors_name_the_checkpoint_not_the_temporary_file(tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", "/x/.c.npz.abc.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    opt, w = refopt.SGD(0.1, backend="reference"), [np.ones(2, np.float32)]
    with pytest.raises(PermissionError, match=r"Cannot write the checkpoint '.*c\.npz'.*"
                                              "Permission denied") as info:
        save_checkpoint(tmp_path / "c.npz", opt, w)
    assert ".tmp" not in str(info.value)


def test_save_checkpoint_in_another_variable_order_keeps_slots_with_their_variables(tmp_path):
    rng = np.random.default_rng(6)
    w = [rng.standard_normal(s) for s in SHAPES]
    opt = refopt.Adam(0.1, convention="torch", backend="reference")
    run(opt, w, [[np.ones(SHAPES[0]), None], [np.ones(SHAPES[0]), np.ones(SHAPES[1])]])
    save_checkpoint(tmp_path / "c.npz", opt, w[::-1])
    opt2, w2 = load_checkpoint(tmp_path / "c.npz")
    assert opt2._var_steps == [1, 2]  # in the saved (reversed) order
    assert opt._var_steps == [2, 1]
    assert (dict(snapshot(opt2, w2), steps=None)
            == dict(snapshot(opt, w[::-1]), steps=None))


def test_sparse_lazy_adam_state_round_trip():
    rng = np.random.default_rng(7)
    table = rng.standard_normal((6, 2)).astype(np.float32)
    grads = [IndexedSlices(rng.standard_normal((3, 2)).astype(np.float32), np.array(idx), (6, 2))
             for idx in ([1, 4, 1], [0, 5, 5], [2, 1, 3])]
    a, ta = refopt.LazyAdam(0.1, backend="reference"), table.copy()
    a.apply_gradients([(grads[0], ta)])
    b, tb = refopt.LazyAdam(0.1, backend="reference"), ta.copy()
    b.load_state_dict(a.state_dict(), var_list=[tb])
    for g in grads[1:]:
        a.apply_gradients([(g, ta)])
        b.apply_gradients([(g, tb)])
    assert snapshot(b, [tb]) == snapshot(a, [ta])


def test_docstring_examples():
    import doctest

    import refopt.checkpoint
    import refopt.optimizers.base

    for module in (refopt.optimizers.base, refopt.checkpoint):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0


# --------------------------------------------------------------------------- EMA for every optimizer
def _ema_config(info):
    """The first configuration of ``info`` with ``use_ema``, or None where no convention of the
    class keeps a moving average (the constructor refuses it)."""
    for config in info.configs:
        try:
            make(info.cls, dict(config, use_ema=True))
        except (ValueError, TypeError):
            continue
        return dict(config, use_ema=True)
    return None


EMA_CASES = [(info.cls, _ema_config(info)) for info in OPTIMIZERS if _ema_config(info) is not None]


def test_the_ema_cases_include_the_optimizers_with_their_own_slot_shapes():
    assert {c.__name__ for c, _ in EMA_CASES} >= {"Adam", "Adafactor", "Lamb", "SGD"}


@pytest.mark.parametrize("cls, config", EMA_CASES, ids=[c.__name__ for c, _ in EMA_CASES])
def test_slot_shape_of_the_ema_average_is_the_variables_shape(cls, config):
    opt = make(cls, config)
    for shape in [(4, 6), (3,), ()]:
        assert tuple(opt.slot_shape("average", shape)) == shape


@pytest.mark.parametrize("cls, config", EMA_CASES, ids=[c.__name__ for c, _ in EMA_CASES])
def test_checkpoint_with_ema_round_trips_from_the_file_alone(tmp_path, cls, config):
    shapes = [(4, 6), (5,)]  # (4, 6): Adafactor factors it; its moments are smaller
    rng = np.random.default_rng(11)
    w = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = grads_for(rng, shapes, 3)
    opt = make(cls, config)
    run(opt, w, grads[:2])
    save_checkpoint(tmp_path / "ema.npz", opt, w)
    opt2, w2 = load_checkpoint(tmp_path / "ema.npz", backend="reference")
    assert "average" in opt2.slot_names
    assert snapshot(opt2, w2) == snapshot(opt, w)
    run(opt, w, grads[2:])
    run(opt2, w2, grads[2:])
    assert snapshot(opt2, w2) == snapshot(opt, w)


@pytest.mark.parametrize("convention", ["keras3", "torch", "optax"])
def test_adafactor_slot_shape_of_an_unknown_slot_names_the_slots(convention):
    opt = make(refopt.Adafactor, {"convention": convention, "learning_rate": 0.1})
    with pytest.raises(KeyError, match=r"no slot 'average'; its slots are \['velocity_row'"):
        opt.slot_shape("average", (4, 6))  # no use_ema: no average


# --------------------------------------------------------------------------- weight-decay exclusions
def _decaying(excluded=(), **config):
    """An AdamW that decays strongly, with the variables at ``excluded`` excluded."""
    rng = np.random.default_rng(5)
    w = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    opt = make(refopt.AdamW, dict({"learning_rate": 0.1, "weight_decay": 0.5}, **config))
    if excluded:
        opt.exclude_from_weight_decay([w[i] for i in excluded])
    return opt, w, grads_for(rng, SHAPES, 4)


def test_state_dict_holds_the_excluded_positions_in_build_order():
    opt, w, _ = _decaying(excluded=[1])
    assert opt.state_dict()["excluded_from_weight_decay"] == []  # not built: no positions
    opt.build([w[1], w[0]])  # w[1] is built first
    assert opt.state_dict()["excluded_from_weight_decay"] == [0]


def test_loading_a_state_applies_its_exclusions_to_a_new_optimizer():
    opt, w, grads = _decaying(excluded=[1])
    run(opt, w, grads[:2])
    fresh, w2 = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5}), [
        x.copy() for x in w]
    fresh.load_state_dict(opt.state_dict(), var_list=w2)
    run(opt, w, grads[2:])
    run(fresh, w2, grads[2:])
    assert snapshot(fresh, w2) == snapshot(opt, w)
    # an AdamW excluding nothing moves w[1] differently: the exclusion matters here
    plain, w3 = _decaying()[:2]
    plain.load_state_dict(dict(opt.state_dict(), excluded_from_weight_decay=[]), var_list=w3)
    run(plain, w3, grads[2:])
    assert bits(w3[1]).tolist() != bits(w[1]).tolist()


def test_exclusions_set_by_the_user_must_agree_with_the_saved_ones():
    opt, w, grads = _decaying(excluded=[1])
    run(opt, w, grads[:1])
    sd = opt.state_dict()
    other = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5})
    w2 = [x.copy() for x in w]
    other.exclude_from_weight_decay([w2[0]])
    with pytest.raises(ValueError, match=r"excludes the variables at positions \[1\].*"
                                         r"this optimizer excludes those at positions \[0\]"):
        other.load_state_dict(sd, var_list=w2)
    assert not other.built and other.iterations == 0
    same = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5})
    same.exclude_from_weight_decay([w2[1]])
    same.load_state_dict(sd, var_list=w2)
    assert same.state_dict()["excluded_from_weight_decay"] == [1]
    built, w3, _ = _decaying()  # built without exclusions: they cannot change any more
    built.build(w3)
    with pytest.raises(ValueError, match="load the state into a new optimizer"):
        built.load_state_dict(sd)
    assert built.iterations == 0


@pytest.mark.parametrize("value, match", [
    ([2], r"distinct positions in \[0, 2\)"), ([1, 1], "distinct positions"),
    (["0"], "list of variable positions"), ([True], "list of variable positions"),
    ("0", "list of variable positions"),
])
def test_bad_excluded_positions_raise_and_change_nothing(value, match):
    opt, w, grads = _decaying()
    run(opt, w, grads[:1])
    fresh = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5})
    with pytest.raises(ValueError, match=match):
        fresh.load_state_dict(dict(opt.state_dict(), excluded_from_weight_decay=value),
                              var_list=[x.copy() for x in w])
    assert not fresh.built and fresh.iterations == 0 and not fresh._exclude_ids


def test_a_state_without_the_exclusions_key_keeps_the_optimizers_own():
    opt, w, grads = _decaying(excluded=[0])
    run(opt, w, grads[:2])
    sd = {k: v for k, v in opt.state_dict().items() if k != "excluded_from_weight_decay"}
    mine = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5})
    w2 = [x.copy() for x in w]
    mine.exclude_from_weight_decay([w2[0]])
    mine.load_state_dict(sd, var_list=w2)
    assert mine.state_dict()["excluded_from_weight_decay"] == [0]


def test_checkpoint_from_the_file_alone_keeps_the_exclusions(tmp_path):
    opt, w, grads = _decaying(excluded=[1])
    run(opt, w, grads[:2])
    meta = save_checkpoint(tmp_path / "wd.npz", opt, [w[1], w[0]])  # the file's own order
    assert meta["excluded_from_weight_decay"] == [0]
    opt2, (b, a) = load_checkpoint(tmp_path / "wd.npz")
    run(opt, w, grads[2:])
    run(opt2, [a, b], grads[2:])
    assert snapshot(opt2, [a, b]) == snapshot(opt, w)


def test_checkpoint_of_an_unbuilt_optimizer_keeps_the_exclusions(tmp_path):
    opt, w, grads = _decaying(excluded=[1])
    save_checkpoint(tmp_path / "wd.npz", opt, w)
    opt2, w2 = load_checkpoint(tmp_path / "wd.npz")
    assert not opt2.built
    run(opt, w, grads)
    run(opt2, w2, grads)
    assert snapshot(opt2, w2) == snapshot(opt, w)
    other = make(refopt.AdamW, {"learning_rate": 0.1, "weight_decay": 0.5})
    w3 = [x.copy() for x in w]
    other.exclude_from_weight_decay([w3[0]])
    with pytest.raises(CheckpointError, match="excludes the variables at positions"):
        load_checkpoint(tmp_path / "wd.npz", other, w3)


def test_checkpoint_written_before_exclusions_were_saved_loads_excluding_nothing(tmp_path):
    from refopt.checkpoint import _write_file

    opt, w, grads = _decaying()
    run(opt, w, grads[:2])
    save_checkpoint(tmp_path / "new.npz", opt, w)
    with np.load(tmp_path / "new.npz") as z:  # the same file without the new key
        arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
        meta = json.loads(str(z["meta"]))
    del meta["excluded_from_weight_decay"]
    _write_file(tmp_path / "old.npz", meta, arrays)
    opt2, w2 = load_checkpoint(tmp_path / "old.npz")
    run(opt, w, grads[2:])
    run(opt2, w2, grads[2:])
    assert snapshot(opt2, w2) == snapshot(opt, w)


# --------------------------------------------------------------------------- backend of the file-only form
def _with_saved_backend(tmp_path, backend):
    """A checkpoint whose config says ``backend`` (as if saved there)."""
    from refopt.checkpoint import _write_file

    path, opt, w, more = _saved(tmp_path)
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
        meta = json.loads(str(z["meta"]))
    meta["config"]["backend"] = backend
    _write_file(path, meta, arrays)
    return path, opt, w, more


def test_load_checkpoint_from_the_file_alone_takes_the_default_backend(tmp_path, monkeypatch):
    path, opt, w, more = _with_saved_backend(tmp_path, "cuda")
    monkeypatch.setenv("REFOPT_BACKEND", "reference")
    opt2, w2 = load_checkpoint(path)
    assert opt2.backend == "reference" and isinstance(w2[0], np.ndarray)
    monkeypatch.setenv("REFOPT_BACKEND", "cpu")
    assert load_checkpoint(path).optimizer.backend == "cpu"
    assert load_checkpoint(path, backend="reference").optimizer.backend == "reference"
    run(opt, w, more)
    run(opt2, w2, more)
    assert snapshot(opt2, w2) == snapshot(opt, w)


def test_load_checkpoint_errors_of_the_saved_config_are_checkpoint_errors(tmp_path, monkeypatch):
    from refopt.checkpoint import _write_file

    path = _saved(tmp_path)[0]
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
        meta = json.loads(str(z["meta"]))
    _write_file(tmp_path / "bad.npz", dict(meta, config=dict(meta["config"], beta_1=2.0)), arrays)
    with pytest.raises(CheckpointError, match=r"bad\.npz from its config \(ValueError: `beta_1`"
                                              r".*create the optimizer yourself"):
        load_checkpoint(tmp_path / "bad.npz")

    from refopt.optimizers import base

    real = base.get_executor

    def get_executor(backend):  # a machine without a GPU
        if backend == "cuda":
            raise RuntimeError("backend='cuda' needs an NVIDIA GPU (test stand-in)")
        return real(backend)

    monkeypatch.setattr(base, "get_executor", get_executor)
    with pytest.raises(CheckpointError, match=r"c\.npz from its config \(RuntimeError: .*"
                                              r"pass another backend.*backend='cuda'"):
        load_checkpoint(path, backend="cuda")
