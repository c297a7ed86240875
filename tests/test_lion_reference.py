# The Lion reference (refopt/reference/lion.py) and class under every lion_form.
#
# (a) Small cases whose expected values come from the update rules in the frameworks' sources
#     (catalogue section 7), evaluated here by hand, or from numbers the frameworks printed
#     (the catalogue appendix, the recorded golden trajectories); never from lion_update.
# (b) Every recorded Lion golden case (conformance/data/*lion*), replayed step by step through
#     lion_update with a resync to the recorded state before each step (the optimizer-level
#     replay is tests/test_conformance.py).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.lion as lion_class_module
import refopt.reference.lion as lion_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import (
    LionResult,
    apply_weight_decay,
    lion_initial_state,
    lion_update,
)
from refopt.reference.lion import lion_defaults
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("tf_keras", "keras3", "optax")

# catalogue appendix: w0 = [1, -2, 0.5], three steps at lr 0.1 (float32)
W0 = [1.0, -2.0, 0.5]
GRADS = [[0.3, -0.2, 0.7], [-0.1, 0.4, 0.2], [0.05, 0.05, -0.3]]


def _run(conv, **kw):
    w = np.array(W0, F32)
    m = lion_initial_state(w)
    for g in GRADS:
        w, m = lion_update(w, np.array(g, F32), m, learning_rate=0.1, convention=conv, **kw)
    return w


def _bits(x):
    return np.asarray(x).view(np.uint32 if np.asarray(x).dtype == F32 else np.uint64)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    assert lion_defaults("tf_keras") == lion_defaults("keras3") == dict(
        learning_rate=0.001, beta_1=0.9, beta_2=0.99, weight_decay=None)
    assert lion_defaults("optax") == dict(learning_rate=None, beta_1=0.9, beta_2=0.99,
                                          weight_decay=1e-3)
    for conv in ("torch", "keras2", "tf1"):
        with pytest.raises(ValueError, match=f"Lion does not exist under convention='{conv}'"):
            lion_defaults(conv)


def test_catalogue_appendix_values():
    # Keras 3 = tf_keras = optax(weight_decay=0): [0.899999976, -2.0999999, 0.400000006];
    # optax's default decay 1e-3: [0.899710059, -2.09941006, 0.399880022]
    keras = np.array([0.899999976, -2.0999999, 0.400000006], F32)
    for conv, kw in (("tf_keras", {}), ("keras3", {}), ("optax", dict(weight_decay=0.0)),
                     ("optax", {})):
        np.testing.assert_array_equal(_run(conv, **kw), keras)
    np.testing.assert_array_equal(_run("optax", weight_decay=1e-3),
                                  np.array([0.899710059, -2.09941006, 0.399880022], F32))


def test_keras_casts_beta_through_float32_and_rounds_one_minus_beta_in_the_dtype():
    # one step from m = 0: m = g * (1 - b2) with b2 = float64(float32(0.99)) under Keras,
    # the Python 1 - 0.99 under optax (0.01000000000000000888 vs 0.00999999046325683594)
    g = np.array([1.0, -3.0], F64)
    w = np.zeros(2, F64)
    k = lion_update(w, g, np.zeros(2), learning_rate=0.1, convention="keras3")
    o = lion_update(w, g, np.zeros(2), learning_rate=0.1, convention="optax")
    np.testing.assert_array_equal(k.m, g * (1.0 - F64(F32(0.99))))
    np.testing.assert_array_equal(o.m, g * F64(1 - 0.99))
    assert k.m[0] != o.m[0]
    # the learning rate: Keras' float32 variable, optax's Python float
    np.testing.assert_array_equal(k.param, [-F64(F32(0.1)), F64(F32(0.1))])
    np.testing.assert_array_equal(o.param, [-0.1, 0.1])


def test_sign_of_zero_and_nan():
    # w = -0, g = -0, m = -0: the interpolation is -0. TensorFlow's sign gives +0 and
    # -0 - lr*(+0) = -0; XLA's sign keeps -0 and -0 + (-lr)*(-0) = -0 + 0 = +0.
    z = np.array([-0.0], F32)
    k = lion_update(z, z, z, learning_rate=0.1, convention="tf_keras")
    o = lion_update(z, z, z, learning_rate=0.1, convention="optax", weight_decay=0.0)
    assert np.signbit(k.param[0]) and not np.signbit(o.param[0])
    assert k.param[0] == 0 and o.param[0] == 0
    nan = np.array([np.nan], F32)
    for conv in FORMS:
        r = lion_update(np.ones(1, F32), nan, np.zeros(1, F32), learning_rate=0.1,
                        convention=conv)
        assert np.isnan(r.param[0]) and np.isnan(r.m[0])


def test_optax_weight_decay_inside_the_update():
    # u = sign + wd*w (one FMA), then w + (-lr)*u: w = 2, g = 1 -> 2 - 0.5*(1 + 0.25*2) = 1.25
    w = np.array([2.0], F32)
    r = lion_update(w, np.ones(1, F32), np.zeros(1, F32), learning_rate=0.5,
                    convention="optax", weight_decay=0.25)
    assert r.param[0] == F32(1.25)


def test_tf_keras_sparse_branch_moves_every_row_and_rescales_m():
    # one empty step on a 2-row table: Keras' dense formula would move each row by
    # lr*sign(b1*m) and set m = b2*m; tf_keras' sparse branch moves them too but computes
    # m = (b1*m)*b2 / b1 in float32, which differs from b2*m in the last bit for 0.13
    b1, b2 = F32(0.9), F32(0.99)
    m = np.array([[0.13], [-0.7]], F32)
    w = np.zeros((2, 1), F32)
    empty = IndexedSlices(np.zeros((0, 1), F32), np.zeros(0, np.int64), (2, 1))
    r = lion_update(w, empty, m, learning_rate=0.5)
    np.testing.assert_array_equal(r.param, [[-F32(0.5)], [F32(0.5)]])
    np.testing.assert_array_equal(r.m, ((m * b1) * b2) / b1)
    dense = lion_update(w, np.zeros((2, 1), F32), m, learning_rate=0.5)
    np.testing.assert_array_equal(dense.param, r.param)
    assert not np.array_equal(_bits(dense.m), _bits(r.m))
    # keras3: the dense step on the summed gradient
    k3 = lion_update(w, empty, m, learning_rate=0.5, convention="keras3")
    np.testing.assert_array_equal(_bits(k3.m), _bits(dense.m))


def test_keras3_raw_duplicates_scale_each_occurrence():
    # knob keras3_sparse_square: (g1*c) + (g2*c) instead of (g1 + g2)*c
    conv = get_convention("keras3", keras3_sparse_square=True)
    vals = np.array([[0.1], [0.7]], F32)
    g = IndexedSlices(vals, np.array([0, 0]), (1, 1))
    w, m = np.zeros((1, 1), F32), np.zeros((1, 1), F32)
    c2 = F32(1) - F32(0.99)
    raw = lion_update(w, g, m, learning_rate=0.1, convention=conv)
    summed = lion_update(w, g, m, learning_rate=0.1,
                         convention=get_convention("keras3", keras3_sparse_square=False))
    preset = lion_update(w, g, m, learning_rate=0.1, convention="keras3")
    assert preset.m[0, 0] == raw.m[0, 0]  # the preset is Keras 3's
    assert raw.m[0, 0] == (F32(0) + vals[0, 0] * c2) + vals[1, 0] * c2
    assert summed.m[0, 0] == (vals[0, 0] + vals[1, 0]) * c2
    assert raw.m[0, 0] != summed.m[0, 0]


@pytest.mark.parametrize("form", FORMS)
def test_pure_and_float16(form):
    rng = np.random.default_rng(0)
    w, g, m = (rng.standard_normal(4).astype(F16) for _ in range(3))
    copies = [a.copy() for a in (w, g, m)]
    r = lion_update(w, g, m, learning_rate=0.125, convention=form)
    assert isinstance(r, LionResult) and r.param.dtype == F16 and r.m.dtype == F16
    for a, b in zip((w, g, m), copies):
        np.testing.assert_array_equal(a, b)
    # every element moves by exactly lr (no decay; float16 holds these sums exactly here)
    np.testing.assert_array_equal(np.abs(r.param.astype(F64) - w.astype(F64)), 0.125)


def test_errors_name_the_argument():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="Lion does not exist under convention='torch'"):
        lion_update(p, p, p, learning_rate=0.1, convention="torch")
    with pytest.raises(TypeError, match="optax's lion takes no sparse gradient"):
        lion_update(p, IndexedSlices(p[:1], [0], (3,)), p, learning_rate=0.1,
                    convention="optax")
    with pytest.raises(ValueError, match="weight_decay=0.1 with lion_form='keras3'"):
        lion_update(p, p, p, learning_rate=0.1, convention="keras3", weight_decay=0.1)
    with pytest.raises(ValueError, match="weight_decay.*>= 0"):
        lion_update(p, p, p, learning_rate=0.1, convention="optax", weight_decay=-1.0)
    with pytest.raises(ValueError, match="`m` must have the shape"):
        lion_update(p, p, np.ones(2, F32), learning_rate=0.1)
    with pytest.raises(TypeError, match="beta_1.*real number"):
        lion_update(p, p, p, learning_rate=0.1, beta_1="0.9")


def test_class_defaults_and_config_round_trip():
    keras = refopt.Lion()
    assert keras.weight_decay is None and float(keras.learning_rate) == F32(0.001)
    optax = refopt.Lion(learning_rate=0.1, convention="optax")
    assert optax.weight_decay == 1e-3
    assert refopt.Lion(learning_rate=0.1, convention="optax", weight_decay=0.0).weight_decay == 0
    again = refopt.Lion.from_config(optax.get_config())
    assert again.weight_decay == 1e-3 and again.beta_2 == 0.99
    with pytest.raises(ValueError, match="Lion does not exist under convention='tf1'"):
        refopt.Lion(convention="tf1")


def test_docstring_examples_run():
    for module in (lion_module, lion_class_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ----------------------------------------------------------------------------- (b) golden
# bfloat16 cases: computed op by op in the optimizer's step (refopt.reference.bf16,
# bf16_generic), replayed by tests/test_conformance.py; the reference takes float16/32/64
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Lion"
            and replayed_by_functions(e)]


def replay_max_ulp(entry):
    """Replay one golden case through lion_update (Keras' decoupled decay by hand),
    resyncing to the recorded state before every step; return (max ulp, where)."""
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = dict(lion_defaults(conv), **entry["hyperparameters"])
    init, grads, params, slots = load_case(entry)
    optax = conv.lion_form == "optax"
    worst, where = 0.0, "all equal"
    for i, w0 in enumerate(init):
        w, m = w0.copy(), lion_initial_state(w0)
        for k in range(entry["steps"]):
            if k > 0:
                w, m = params[k - 1][i].copy(), slots["m"][k - 1][i].copy()
            wd = hyper["weight_decay"]
            if wd is not None and not optax:
                w = apply_weight_decay(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
            out = lion_update(w, grads[k][i], m, learning_rate=hyper["learning_rate"],
                              beta_1=hyper["beta_1"], beta_2=hyper["beta_2"], convention=conv,
                              weight_decay=wd if optax else None)
            for name, got, want in (("param", out.param, params[k][i]),
                                    ("m", out.m, slots["m"][k][i])):
                d = ulp_distance(got, want)
                if d.size and d.max() > worst:
                    j = int(np.argmax(d))
                    worst = float(d.max())
                    where = f"step {k + 1}, {name} of variable {i}, element {j}"
    return worst, where


def test_golden_cases_cover_every_convention_and_dtype():
    ids = {e["id"] for e in _ENTRIES}
    for form in FORMS:
        assert {f"{form}/lion_f32", f"{form}/lion_f64", f"{form}/lion_opts_f32"} <= ids
    assert {"tf_keras/lion_sparse_f32", "keras3/lion_sparse_f32", "optax/lion_wd0_f32"} <= ids


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_lion_replay(entry):
    worst, where = replay_max_ulp(entry)
    assert worst <= entry["tolerance_ulp"], (
        f"{entry['id']}: {worst} ulp > tolerance {entry['tolerance_ulp']} ({where})")
