# The ASGD reference (refopt/reference/asgd.py) and class (torch only).
#
# (a) Small cases whose expected values come from torch's _single_tensor_asgd (read in
#     torch/optim/asgd.py, torch 2.13), evaluated here by hand with exact arithmetic; never from
#     asgd_update itself.
# (b) Every recorded ASGD golden case (conformance/data/torch__asgd*), replayed step by step
#     through asgd_update (bit-identical: every case has tolerance 0), including torch's scalar
#     state eta and mu recorded per parameter and step (state/eta, state/mu).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.asgd as asgd_class_module
import refopt.reference.asgd as asgd_module
from refopt import IndexedSlices
from refopt.conformance import _data, load_case, load_manifest
from refopt.reference import ASGDResult, asgd_initial_state, asgd_update
from refopt.reference.asgd import asgd_defaults, asgd_scalars
from refopt.reference.variants import l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
HP = dict(learning_rate=0.01, lambd=1e-4, alpha=0.75, t0=1e6)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_and_only_torch():
    assert asgd_defaults() == asgd_defaults("torch") == HP
    opt = refopt.ASGD()
    assert opt.convention.name == "torch"
    assert (opt.learning_rate, opt.lambd, opt.alpha, opt.t0) == (0.01, 1e-4, 0.75, 1e6)
    assert opt.weight_decay is None and opt.slot_names == ("ax",)
    for conv in ("tf_keras", "keras3", "keras2", "tf1", "optax"):
        with pytest.raises(ValueError, match=rf"ASGD does not exist under convention='{conv}'"):
            refopt.ASGD(convention=conv)
        with pytest.raises(ValueError, match=rf"ASGD.*convention='{conv}'"):
            asgd_update(np.ones(2, F32), np.ones(2, F32), np.zeros(2, F32), step=1,
                        convention=conv, **HP)


def test_scalars_are_float32_of_python_floats():
    # step 1: eta = lr (the state's start), mu = 1; step t: the values stored at the end of t-1
    assert asgd_scalars(0.01, 1e-4, 0.75, 1e6, 1) == (float(F32(0.01)), 1.0)
    for t in (2, 3, 50):
        eta, mu = asgd_scalars(0.01, 1e-4, 0.75, 1e6, t)
        assert eta == float(F32(0.01 / (1 + 1e-4 * 0.01 * (t - 1)) ** 0.75)) and mu == 1.0
    # t0 = 5: mu = 1 / max(1, (t - 1) - 5), averaging from step 8 on
    mus = [asgd_scalars(0.05, 0.01, 0.6, 5.0, t)[1] for t in range(1, 11)]
    assert mus == [1.0] * 7 + [0.5, float(F32(1 / 3)), 0.25]
    # torch's step counter is a float32 tensor: it stops at 2**24
    assert asgd_scalars(0.01, 1e-4, 0.75, 0.0, 2 ** 24 + 1) == asgd_scalars(
        0.01, 1e-4, 0.75, 0.0, 2 ** 24 + 1000)
    assert asgd_scalars(0.01, 1e-4, 0.75, 0.0, 2 ** 24) != asgd_scalars(
        0.01, 1e-4, 0.75, 0.0, 2 ** 24 + 1)
    # a power too large for a float: the limit, a zero step (Python's ** would raise)
    assert asgd_scalars(1.0, 1.0, 1e6, 0.0, 3)[0] == 0.0


@pytest.mark.parametrize("dtype", [F32, F64])
def test_first_step_by_hand(dtype):
    w, g = np.array([1.0, -3.0], dtype), np.array([0.5, 2.0], dtype)
    r = asgd_update(w, g, asgd_initial_state(w), step=1, **HP)
    eta = float(F32(0.01))
    c = dtype(1 - 1e-4 * eta)  # 1 - lambd*eta in Python floats, rounded once
    # fma(-eta, g, w*c): the products are exact in float64 here, then one rounding
    want = np.array([np.float64(w[0] * c) - eta * 0.5, np.float64(w[1] * c) - eta * 2.0])
    if dtype is F32:
        want = want.astype(F32)
    np.testing.assert_array_equal(r.param, want.astype(dtype))
    np.testing.assert_array_equal(r.ax, r.param)  # mu == 1: a copy
    assert (r.eta, r.mu) == asgd_scalars(0.01, 1e-4, 0.75, 1e6, 2)


def test_add_alpha_is_one_fma():
    # w*c - eta*g where the separate product rounds: torch's vectorised add(alpha=) fuses it
    w, g = np.array([1.5942448], F32), np.array([1.4099537], F32)
    hp = dict(HP, learning_rate=float(F32(1 / 3)), lambd=0.0)  # w * (1 - 0) = w
    r = asgd_update(w, g, np.zeros(1, F32), step=1, **hp)
    eta = F32(1 / 3)
    exact = np.float64(w[0]) - np.float64(eta) * np.float64(g[0])  # exact product
    assert r.param[0] == F32(exact)
    assert r.param[0] != w[0] - eta * g[0]  # two roundings differ here


def test_averaging_starts_after_t0():
    w = np.array([2.0], F32)
    ax = np.array([1.0], F32)
    g = np.zeros(1, F32)
    hp = dict(learning_rate=0.1, lambd=0.0, alpha=0.75, t0=1.0)
    r = asgd_update(w, g, ax, step=3, **hp)  # mu = 1/max(1, 2 - 1) = 1: copy
    assert r.ax[0] == 2.0 and r.mu == 0.5  # stored for step 4: 1/(3 - 1)
    r = asgd_update(w, g, ax, step=4, **hp)  # mu = 0.5: ax + (w - ax)*mu
    assert r.ax[0] == 1.5
    r = asgd_update(w, g, ax, step=4, eta=0.1, mu=1.0, **hp)  # torch's state, given
    assert r.ax[0] == 2.0


def test_explicit_eta_follows_a_changing_learning_rate():
    # torch computes eta for step t at the end of step t - 1, with that step's lr
    w, g = np.ones(3, F32), np.full(3, 0.5, F32)
    r1 = asgd_update(w, g, np.zeros(3, F32), step=1, **dict(HP, learning_rate=0.1))
    r2 = asgd_update(r1.param, g, r1.ax, step=2, eta=r1.eta, mu=r1.mu,
                     **dict(HP, learning_rate=0.5))
    eta = float(F32(0.1 / (1 + 1e-4 * 0.1 * 1) ** 0.75))
    assert r1.eta == eta
    c = F32(1 - 1e-4 * eta)
    want = F32(np.float64(r1.param[0] * c) - np.float64(F32(eta)) * 0.5)
    assert r2.param[0] == want


def test_returns_new_arrays_and_errors():
    w = np.ones(3, F32)
    ax = np.zeros(3, F32)
    r = asgd_update(w, w, ax, step=1, **HP)
    assert isinstance(r, ASGDResult)
    assert not np.shares_memory(r.param, w) and not np.shares_memory(r.ax, ax)
    assert w.tolist() == [1, 1, 1] and ax.tolist() == [0, 0, 0]
    with pytest.raises(TypeError, match="sparse"):
        asgd_update(w, IndexedSlices(w[:1], [0], (3,)), ax, step=1, **HP)
    with pytest.raises(ValueError, match=r"`ax` must have the shape"):
        asgd_update(w, w, np.zeros(2, F32), step=1, **HP)
    with pytest.raises(ValueError, match=r"`lambd` must be >= 0. Received: lambd=-1"):
        asgd_update(w, w, ax, step=1, **dict(HP, lambd=-1))
    with pytest.raises(ValueError, match=r"`t0` must be finite"):
        asgd_update(w, w, ax, step=1, **dict(HP, t0=float("inf")))
    with pytest.raises(TypeError, match=r"`alpha` must be a real number"):
        asgd_update(w, w, ax, step=1, **dict(HP, alpha="1"))
    with pytest.raises(ValueError, match=r"`step` must be an integer >= 1"):
        asgd_update(w, w, ax, step=0, **HP)
    assert asgd_update(w.astype(F16), w.astype(F16), ax.astype(F16), step=1,
                       **HP).param.dtype == F16


def test_class_weight_decay_is_torch_l2_and_sparse_is_refused():
    w0 = np.array([1.0, -2.0], F32)
    g = np.array([0.5, 0.25], F32)
    w = w0.copy()
    opt = refopt.ASGD(learning_rate=0.1, weight_decay=0.1)
    opt.apply_gradients([(g, w)])
    want = asgd_update(w0, l2_torch(g, w0, 0.1), np.zeros(2, F32), step=1,
                       **dict(HP, learning_rate=0.1))
    np.testing.assert_array_equal(w, want.param)
    t = np.ones((3, 2), F32)
    opt = refopt.ASGD()
    with pytest.raises(TypeError, match="sparse"):
        opt.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [0], (3, 2)), t)])
    assert np.all(t == 1) and not opt.built


def test_class_uses_each_variables_own_step():
    a, b = np.ones(2, F32), np.ones(2, F32)
    opt = refopt.ASGD(learning_rate=0.5, lambd=0.1, alpha=1.0, t0=0.0)
    g = np.full(2, 0.25, F32)
    opt.apply_gradients([(g, a), (g, b)])
    with pytest.warns(UserWarning):
        opt.apply_gradients([(g, a), (None, b)])
    opt.apply_gradients([(g, a), (g, b)])
    # b had two steps: its second used step 2's scalars
    ref_b = asgd_update(np.ones(2, F32), g, np.zeros(2, F32), step=1, learning_rate=0.5,
                        lambd=0.1, alpha=1.0, t0=0.0)
    ref_b = asgd_update(ref_b.param, g, ref_b.ax, step=2, learning_rate=0.5, lambd=0.1,
                        alpha=1.0, t0=0.0)
    np.testing.assert_array_equal(b, ref_b.param)
    np.testing.assert_array_equal(opt.get_slot(b, "ax"), ref_b.ax)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"lambd": -0.1}, ValueError, r"lambd.*>= 0.*Received: lambd=-0\.1"),
    ({"alpha": float("nan")}, ValueError, r"alpha.*finite"),
    ({"t0": "5"}, TypeError, r"t0.*Received: t0='5'"),
    ({"convention": "optax"}, ValueError, r"ASGD does not exist under convention='optax'"),
])
def test_class_errors_name_the_argument_and_value(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        refopt.ASGD(**kwargs)


def test_config_round_trip():
    opt = refopt.ASGD(learning_rate=0.05, lambd=0.01, alpha=0.6, t0=5.0, weight_decay=0.1)
    config = opt.get_config()
    assert (config["lambd"], config["alpha"], config["t0"]) == (0.01, 0.6, 5.0)
    assert config["convention"] == "torch"
    assert refopt.ASGD.from_config(config).get_config() == config


def test_docstring_examples_run():
    for mod in (asgd_module, asgd_class_module):
        failures, _ = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert failures == 0, mod.__name__


# ----------------------------------------------------------------------------- (b) golden
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "ASGD"
            and replayed_by_functions(e)]


def _state(entry):
    with (_data() / entry["file"]).open("rb") as f:
        z = dict(np.load(f))
    return {k: v for k, v in z.items() if k.startswith("state/")}


def test_golden_cases_cover_defaults_options_and_dtypes():
    ids = {e["id"] for e in _ENTRIES}
    assert {"torch/asgd_f32", "torch/asgd_f64", "torch/asgd_t0_f32", "torch/asgd_t0_f64",
            "torch/asgd_wide_l2_f32", "torch/asgd_none_grads_f32"} <= ids
    assert all(e["tolerance_ulp"] == 0 for e in _ENTRIES)


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_asgd_replay_bit_identical_with_torchs_scalars(entry):
    hyper = dict(asgd_defaults(), **entry["hyperparameters"])
    wd = hyper.pop("weight_decay", None)
    init, grads, params, slots = load_case(entry)
    state = _state(entry)
    averaged = False
    for i, w0 in enumerate(init):
        w, ax, step = w0.copy(), asgd_initial_state(w0), 0
        for k in range(entry["steps"]):
            g = grads[k][i]
            if g is None:
                continue
            step += 1
            if wd:
                g = l2_torch(g, w, wd)
            r = asgd_update(w, g, ax, step=step, **hyper)
            w, ax = r.param, r.ax
            assert ulp_distance(w, params[k][i]).max(initial=0) == 0, (entry["id"], k, i)
            assert ulp_distance(ax, slots["ax"][k][i]).max(initial=0) == 0, (entry["id"], k, i)
            eta, mu = state[f"state/eta/{k + 1}/{i}"], state[f"state/mu/{k + 1}/{i}"]
            assert eta.dtype == mu.dtype == F32  # torch's default dtype, any parameter dtype
            assert (r.eta, r.mu) == (float(eta), float(mu)), (entry["id"], k, i)
            averaged |= r.mu != 1
    assert averaged == (hyper["t0"] < entry["steps"] - 2), entry["id"]
