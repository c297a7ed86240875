# The RAdam reference (refopt/reference/radam.py) and class under both radam_forms.
#
# (a) Small cases whose expected values come from the update rules in the frameworks' sources
#     (catalogue section 10), evaluated here by hand, or from numbers the frameworks printed
#     (the catalogue appendix, the recorded golden trajectories); never from radam_update.
# (b) Every recorded RAdam golden case (conformance/data/*radam*), replayed step by step
#     through radam_update with a resync to the recorded state before each step.
import doctest
import math

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.radam as radam_class_module
import refopt.reference.radam as radam_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import RAdamResult, radam_initial_state, radam_update
from refopt.reference.radam import radam_defaults, radam_scalars
from refopt.reference.variants import decay_torch, l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("torch", "optax")

W0 = [1.0, -2.0, 0.5]
GRADS = [[0.3, -0.2, 0.7], [-0.1, 0.4, 0.2], [0.05, 0.05, -0.3]]


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    assert radam_defaults("torch") == dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999,
                                           epsilon=1e-8, epsilon_root=0.0, threshold=5.0)
    assert radam_defaults("optax")["learning_rate"] is None
    for conv in ("tf_keras", "keras3", "keras2", "tf1"):
        with pytest.raises(ValueError, match=f"RAdam does not exist under convention='{conv}'"):
            radam_defaults(conv)


def test_catalogue_appendix_values():
    # three un-rectified steps at lr 0.1: torch [0.953561902, -2.00073028, 0.36982134],
    # optax [..., 0.36982137] (its moments are FMAs, torch's a lerp and addcmul)
    out = {}
    for conv in FORMS:
        w = np.array(W0, F32)
        m, v = radam_initial_state(w)
        for t, g in enumerate(GRADS, 1):
            w, m, v = radam_update(w, np.array(g, F32), m, v, learning_rate=0.1, step=t,
                                   convention=conv)
        out[conv] = w
    np.testing.assert_array_equal(out["torch"],
                                  np.array([0.953561902, -2.00073028, 0.36982134], F32))
    assert out["optax"][2] == F32(0.36982137)
    np.testing.assert_array_equal(out["optax"][:2], out["torch"][:2])


def test_rectification_starts_at_step_6_with_the_defaults():
    # rho_inf = 2/(1 - 0.999) - 1 = 1999; rho_5 = 4.996, rho_6 = 5.994 (catalogue)
    t = {k: radam_scalars(F32, beta_1=0.9, beta_2=0.999, step=k, convention="torch")
         for k in (1, 5, 6)}
    assert math.isclose(t[5]["rho"], 4.996, abs_tol=1e-3) and not t[5]["rectified"]
    assert math.isclose(t[6]["rho"], 5.994, abs_tol=1e-3) and t[6]["rectified"]
    rho = t[6]["rho"]
    rho_inf = 2 / (1 - 0.999) - 1
    assert t[6]["rect"] == ((rho - 4) * (rho - 2) * rho_inf
                            / ((rho_inf - 4) * (rho_inf - 2) * rho)) ** 0.5
    # optax computes rho in float32: at step 1 a cancellation of ~1999 - ~1998
    o = radam_scalars(F32, beta_1=0.9, beta_2=0.999, step=1, convention="optax")
    assert isinstance(o["rho"], np.float32) and o["rho"] != F32(t[1]["rho"])
    assert abs(float(o["rho"]) - t[1]["rho"]) < 0.1


def test_threshold_tests_differ():
    # torch: rho > 5 (fixed); optax: rho >= threshold. With beta_2 = 0.99 (rho_inf = 199)
    # rho_3 = 2.9..., rho_4 = 3.9...: threshold 3.0 rectifies step 4 under optax only
    o = radam_scalars(F64, beta_1=0.9, beta_2=0.99, step=4, convention="optax", threshold=3.0)
    assert o["rectified"] and 3.0 <= o["rho"] < 5.0
    t = radam_scalars(F64, beta_1=0.9, beta_2=0.99, step=4, convention="torch")
    assert not t["rectified"]
    same = radam_scalars(F64, beta_1=0.9, beta_2=0.99, step=4, convention="optax",
                         threshold=float(o["rho"]))
    assert same["rectified"]  # >=, not >


def test_unrectified_step_is_sgd_with_bias_corrected_momentum():
    # torch: m = lerp(0, g, 0.1) = 0.1*g rounded once; w - (m / (1 - 0.9)) * lr
    g = np.array([0.5, -3.0], F64)
    r = radam_update(np.zeros(2), g, np.zeros(2), np.zeros(2), learning_rate=0.25,
                     convention="torch")
    m = (1 - 0.9) * g  # 1 - 0.9 = 0.09999999999999998 in Python; lerp from 0 is exact
    np.testing.assert_array_equal(r.m, m)
    np.testing.assert_array_equal(r.param, -((m / (1 - 0.9)) * 0.25))
    np.testing.assert_array_equal(r.v, (1 - 0.999) * g * g)


def test_torch_epsilon_on_the_raw_root():
    # a rectified step with v = 0 and m != 0: torch divides by eps and multiplies by
    # sqrt(bc2) (its reciprocal form); optax divides by sqrt(0/bc2 + 0) + eps = eps
    t = 10
    s = radam_scalars(F64, beta_1=0.9, beta_2=0.999, step=t, convention="torch")
    m0 = np.array([1e-3])
    g = np.zeros(1)  # g = 0 keeps v = 0 and moves m by lerp(m, 0, 0.1)
    r = radam_update(np.zeros(1), g, m0, np.zeros(1), learning_rate=0.5, step=t,
                     epsilon=1e-3, convention="torch")
    m = m0 + 0.09999999999999998 * (0 - m0)
    mh = m / s["bc1"]
    want = -(((mh * 0.5) * ((1 / (0 + 1e-3)) * s["bc2"] ** 0.5)) * s["rect"])
    np.testing.assert_array_equal(r.param, want)


@pytest.mark.parametrize("form", FORMS)
def test_pure_and_float16(form):
    rng = np.random.default_rng(0)
    w, g, m = (rng.standard_normal(4).astype(F16) for _ in range(3))
    v = np.abs(rng.standard_normal(4)).astype(F16)
    copies = [a.copy() for a in (w, g, m, v)]
    r = radam_update(w, g, m, v, learning_rate=0.125, step=8, convention=form)
    assert isinstance(r, RAdamResult) and all(a.dtype == F16 for a in r)
    for a, b in zip((w, g, m, v), copies):
        np.testing.assert_array_equal(a, b)


def test_errors_name_the_argument():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="RAdam does not exist under convention='keras3'"):
        radam_update(p, p, p, p, learning_rate=0.1, convention="keras3")
    with pytest.raises(TypeError, match="RAdam takes no sparse gradient"):
        radam_update(p, IndexedSlices(p[:1], [0], (3,)), p, p, learning_rate=0.1)
    with pytest.raises(ValueError, match="threshold.*Received: threshold=4.0"):
        radam_update(p, p, p, p, learning_rate=0.1, threshold=4.0)
    with pytest.raises(ValueError, match="epsilon_root.*Received: epsilon_root=1e-08"):
        radam_update(p, p, p, p, learning_rate=0.1, epsilon_root=1e-8)
    with pytest.raises(ValueError, match="`epsilon` must be >= 0"):
        radam_update(p, p, p, p, learning_rate=0.1, epsilon=-1.0, convention="optax")
    with pytest.raises(ValueError, match="`v` must have the shape"):
        radam_update(p, p, p, np.ones(2, F32), learning_rate=0.1)
    with pytest.raises(ValueError, match="step.*>= 1"):
        radam_update(p, p, p, p, learning_rate=0.1, step=0)


def test_class_defaults_weight_decay_and_config_round_trip():
    opt = refopt.RAdam()
    assert opt.convention.name == "torch" and opt.decoupled_weight_decay is False
    assert opt._decay_mode() == "l2"
    assert refopt.RAdam(weight_decay=0.1, decoupled_weight_decay=True)._decay_mode() == "torch"
    ox = refopt.RAdam(learning_rate=0.1, convention="optax", threshold=4.0, epsilon_root=1e-8)
    again = refopt.RAdam.from_config(ox.get_config())
    assert again.threshold == 4.0 and again.epsilon_root == 1e-8
    t = refopt.RAdam.from_config(refopt.RAdam(decoupled_weight_decay=True).get_config())
    assert t.decoupled_weight_decay is True
    w = np.ones((2, 2), F32)
    with pytest.raises(TypeError, match="RAdam takes no sparse gradient"):
        opt.apply_gradients([(IndexedSlices(w[:1], [0], (2, 2)), w)])
    np.testing.assert_array_equal(w, 1.0)


def test_docstring_examples_run():
    for module in (radam_module, radam_class_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ----------------------------------------------------------------------------- (b) golden
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "RAdam"
            and replayed_by_functions(e)]


def replay_max_ulp(entry):
    """Replay one golden case through radam_update (torch's weight decay by hand, its
    per-parameter steps), resyncing to the recorded state before every step."""
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = dict(radam_defaults(conv), **entry["hyperparameters"])
    init, grads, params, slots = load_case(entry)
    worst, where = 0.0, "all equal"
    kw = {k: hyper[k] for k in ("learning_rate", "beta_1", "beta_2", "epsilon",
                                "epsilon_root", "threshold")}
    for i, w0 in enumerate(init):
        w = w0.copy()
        m, v = radam_initial_state(w)
        step = 0
        for k in range(entry["steps"]):
            if k > 0 and slots["m"][k - 1][i] is not None:
                w, m, v = (params[k - 1][i].copy(), slots["m"][k - 1][i].copy(),
                           slots["v"][k - 1][i].copy())
            g = grads[k][i]
            if g is None:
                continue
            step += 1
            wd = hyper.get("weight_decay", 0.0)
            if wd and hyper.get("decoupled_weight_decay"):
                w = decay_torch(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
            elif wd:
                g = l2_torch(g, w, wd)
            out = radam_update(w, g, m, v, step=step, convention=conv, **kw)
            for name, got, want in (("param", out.param, params[k][i]),
                                    ("m", out.m, slots["m"][k][i]),
                                    ("v", out.v, slots["v"][k][i])):
                d = ulp_distance(got, want)
                if d.size and d.max() > worst:
                    j = int(np.argmax(d))
                    worst = float(d.max())
                    where = f"step {k + 1}, {name} of variable {i}, element {j}"
    return worst, where


def test_golden_cases_cover_both_conventions_and_dtypes():
    ids = {e["id"] for e in _ENTRIES}
    for form in FORMS:
        assert {f"{form}/radam_f32", f"{form}/radam_f64", f"{form}/radam_opts_f32"} <= ids
    assert {"torch/radam_l2_f32", "torch/radam_decoupled_f32", "torch/radam_none_grads_f32",
            "torch/radam_wide_f32"} <= ids


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_radam_replay(entry):
    worst, where = replay_max_ulp(entry)
    assert worst <= entry["tolerance_ulp"], (
        f"{entry['id']}: {worst} ulp > tolerance {entry['tolerance_ulp']} ({where})")
