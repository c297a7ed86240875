# The Rprop reference (refopt/reference/rprop.py) and class (torch only).
#
# (a) Small cases whose expected values come from torch's _single_tensor_rprop (read in
#     torch/optim/rprop.py, torch 2.13), worked out by hand; the two rounding corner cases
#     (an etaminus that rounds to 1 or to 0 in float32) were also printed by torch 2.13.
# (b) Every recorded Rprop golden case (conformance/data/torch__rprop*), replayed step by step
#     through rprop_update: bit-identical (every case has tolerance 0).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.rprop as rprop_class_module
import refopt.reference.rprop as rprop_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.reference import RpropResult, rprop_initial_state, rprop_update
from refopt.reference.rprop import rprop_defaults, torch_sign
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64


def _fresh(w, lr=0.1):
    return rprop_initial_state(w, learning_rate=lr)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_and_only_torch():
    assert rprop_defaults() == dict(learning_rate=0.01, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0))
    opt = refopt.Rprop()
    assert opt.convention.name == "torch" and opt.slot_names == ("prev", "step_size")
    assert (opt.learning_rate, opt.etas, opt.step_sizes) == (0.01, (0.5, 1.2), (1e-6, 50.0))
    for conv in ("tf_keras", "keras3", "keras2", "tf1", "optax"):
        with pytest.raises(ValueError, match=rf"Rprop does not exist under convention='{conv}'"):
            refopt.Rprop(convention=conv)
        with pytest.raises(ValueError, match=rf"Rprop.*convention='{conv}'"):
            rprop_update(np.ones(2, F32), np.ones(2, F32), *_fresh(np.ones(2, F32)),
                         convention=conv)


def test_torch_sign_of_nan_and_negative_zero_is_plus_zero():
    s = torch_sign(np.array([np.nan, -0.0, 0.0, -np.inf, 3.0], F32))
    assert s.tolist() == [0.0, 0.0, 0.0, -1.0, 1.0] and not np.signbit(s[:3]).any()


@pytest.mark.parametrize("dtype", [F32, F64])
def test_one_step_by_hand(dtype):
    w = np.array([1.0, -2.0, 0.5, 4.0, 3.0], dtype)
    prev = np.array([1.0, 1.0, 0.0, 1.0, -2.0], dtype)
    s = np.array([0.25, 0.25, 0.25, 0.25, 40.0], dtype)
    g = np.array([2.0, -3.0, 5.0, 0.0, -1.0], dtype)
    r = rprop_update(w, g, prev, s, etas=(0.5, 1.5), step_sizes=(0.2, 50.0))
    # factors: same sign 1.5, flipped 0.5 (step skipped, g zeroed), zero product 1
    np.testing.assert_array_equal(r.step_size, np.array([0.375, 0.2, 0.25, 0.25, 50.0], dtype))
    np.testing.assert_array_equal(r.prev, np.array([2.0, 0.0, 5.0, 0.0, -1.0], dtype))
    np.testing.assert_array_equal(r.param, np.array([0.625, -2.0, 0.25, 4.0, 53.0], dtype))


def test_first_step_is_lr_times_sign_and_nan_gradients_do_not_move():
    w = np.array([1.0, -2.0, 0.3], F32)
    r = rprop_update(w, np.array([1.0, 2.0, 0.0], F32), *_fresh(w, 0.15))
    np.testing.assert_array_equal(r.param, [F32(1.0) - F32(0.15), F32(-2.0) - F32(0.15),
                                            F32(0.3)])
    r2 = rprop_update(r.param, np.array([np.nan, -1.0, 1.0], F32), r.prev, r.step_size)
    assert r2.param[0] == r.param[0] and np.isnan(r2.prev[0])
    assert r2.step_size[0] == r.step_size[0]  # factor 1
    r3 = rprop_update(r2.param, np.array([1.0, 1.0, 1.0], F32), r2.prev, r2.step_size)
    assert r3.param[0] == r2.param[0] - r2.step_size[0]  # NaN product: factor 1 again


def test_etaminus_rounding_corner_cases_as_torch_prints_them():
    w = np.array([1.0, -2.0, 0.5], F32)
    # 1 - 1e-9 is 1.0 in float32: the zero-sign elements of step 1 equal etaminus, masked
    r = rprop_update(w, np.array([1.0, -1.0, 0.0], F32), *_fresh(w), etas=(1 - 1e-9, 1.5))
    np.testing.assert_array_equal(r.param, w)
    np.testing.assert_array_equal(r.prev, np.zeros(3, F32))
    w64 = w.astype(F64)  # exact in float64: torch moves
    r = rprop_update(w64, np.array([1.0, -1.0, 0.0]), *_fresh(w64), etas=(1 - 1e-9, 1.5))
    assert r.param.tolist() == [0.9, -1.9, 0.5]
    # 1e-50 is 0 in float32: the flipped elements get 0, then "== 0" makes them 1: no flip
    r = rprop_update(w, np.array([1.0, -1.0, 2.0], F32), *_fresh(w), etas=(1e-50, 1.5))
    r = rprop_update(r.param, np.array([-1.0, -1.0, np.nan], F32), r.prev, r.step_size,
                     etas=(1e-50, 1.5))
    assert r.param.tolist() == [1.0, -1.75, F32(0.4)]  # torch 2.13 printed the same
    assert r.step_size.tolist() == [F32(0.1), F32(0.15), F32(0.1)]


def test_returns_new_arrays_and_errors():
    w = np.ones(3, F32)
    prev, s = _fresh(w)
    r = rprop_update(w, w, prev, s)
    assert isinstance(r, RpropResult)
    for out, inp in ((r.param, w), (r.prev, prev), (r.step_size, s)):
        assert not np.shares_memory(out, inp)
    assert prev.tolist() == [0, 0, 0] and s.tolist() == [F32(0.1)] * 3
    with pytest.raises(TypeError, match="sparse"):
        rprop_update(w, IndexedSlices(w[:1], [0], (3,)), prev, s)
    with pytest.raises(ValueError, match=r"etas.*0 < etaminus < 1 < etaplus.*\(1\.2, 0\.5\)"):
        rprop_update(w, w, prev, s, etas=(1.2, 0.5))
    with pytest.raises(ValueError, match=r"step_sizes.*0 <= min <= max"):
        rprop_update(w, w, prev, s, step_sizes=(1.0, 0.5))
    with pytest.raises(TypeError, match=r"step_sizes.*pair"):
        rprop_update(w, w, prev, s, step_sizes=1.0)
    with pytest.raises(ValueError, match=r"`prev` must have the shape"):
        rprop_update(w, w, prev[:2], s)
    assert rprop_update(w.astype(F16), w.astype(F16), *_fresh(w.astype(F16))).param.dtype == F16


def test_class_step_sizes_start_at_the_learning_rate_and_no_weight_decay():
    w = np.array([1.0, -1.0], F64)
    opt = refopt.Rprop(learning_rate=0.3)
    opt.apply_gradients([(np.array([1.0, 1.0]), w)])
    assert w.tolist() == [0.7, -1.3]
    assert opt.get_slot(w, "step_size").tolist() == [0.3, 0.3]
    with pytest.raises(ValueError, match=r"no weight decay for Rprop"):
        refopt.Rprop(weight_decay=0.1)
    t = np.ones((3, 2), F32)
    opt = refopt.Rprop()
    with pytest.raises(TypeError, match="sparse"):
        opt.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [0], (3, 2)), t)])
    assert np.all(t == 1) and not opt.built


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"etas": (0.5, 1.0)}, ValueError, r"etas.*Received: etas=\(0\.5, 1\.0\)"),
    ({"etas": "ab"}, TypeError, r"etas.*pair"),
    ({"step_sizes": (-1.0, 1.0)}, ValueError, r"step_sizes.*Received: step_sizes=\(-1\.0, 1\.0\)"),
    ({"step_sizes": (0.0, float("inf"))}, ValueError, r"step_sizes.*finite"),
    ({"convention": "keras3"}, ValueError, r"Rprop does not exist under convention='keras3'"),
])
def test_class_errors_name_the_argument_and_value(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        refopt.Rprop(**kwargs)


def test_config_round_trip():
    opt = refopt.Rprop(learning_rate=0.02, etas=[0.3, 1.5], step_sizes=(1e-3, 0.05))
    config = opt.get_config()
    assert config["etas"] == (0.3, 1.5) and config["step_sizes"] == (1e-3, 0.05)
    assert refopt.Rprop.from_config(dict(config, etas=[0.3, 1.5])).get_config() == config


def test_docstring_examples_run():
    for mod in (rprop_module, rprop_class_module):
        failures, _ = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert failures == 0, mod.__name__


# ----------------------------------------------------------------------------- (b) golden
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Rprop"
            and replayed_by_functions(e)]


def test_golden_cases_cover_defaults_options_and_dtypes():
    ids = {e["id"] for e in _ENTRIES}
    assert {"torch/rprop_f32", "torch/rprop_f64", "torch/rprop_opts_f32", "torch/rprop_opts_f64",
            "torch/rprop_wide_f32", "torch/rprop_nonfinite_f32",
            "torch/rprop_none_grads_f32"} <= ids
    assert all(e["tolerance_ulp"] == 0 for e in _ENTRIES)


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_rprop_replay_bit_identical(entry):
    hyper = dict(rprop_defaults(), **entry["hyperparameters"])
    lr = hyper.pop("learning_rate")
    init, grads, params, slots = load_case(entry)
    for i, w0 in enumerate(init):
        w, (prev, s) = w0.copy(), _fresh(w0, lr)
        for k in range(entry["steps"]):
            g = grads[k][i]
            if g is None:
                continue
            w, prev, s = rprop_update(w, g, prev, s, **hyper)
            for name, got, want in (("param", w, params[k][i]), ("prev", prev, slots["prev"][k][i]),
                                    ("step_size", s, slots["step_size"][k][i])):
                assert ulp_distance(got, want).max(initial=0) == 0, (entry["id"], k, i, name)
