"""Convention presets and knobs: construction, errors, config round trips, and the printed
values of the semantics notes (each measured on the framework; see conformance/README.md)."""

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt.conventions import PRESETS, get_convention

F = np.float32


def run(opt_cls, w0, grads, **kw):
    w = np.array(w0, F)
    opt = opt_cls(**kw)
    for g in grads:
        opt.apply_gradients([(np.array(g, F), w)])
    return w, opt


def test_presets_are_frozen_records_and_knobs_can_be_overridden():
    conv = get_convention("torch", amsgrad_maximum="corrected")
    assert conv.amsgrad_maximum == "corrected" and PRESETS["torch"].amsgrad_maximum == "raw"
    with pytest.raises(Exception):
        conv.amsgrad_maximum = "raw"
    assert conv.differences(PRESETS["torch"]) == {"amsgrad_maximum": ("corrected", "raw")}
    assert get_convention(conv) is conv


@pytest.mark.parametrize("args, kwargs, error, match", [
    (("jax",), {}, ValueError, r"convention.*Received: convention='jax'"),
    ((3,), {}, TypeError, r"convention.*Received: convention=3"),
    (("torch",), {"amsgrad_max": "raw"}, ValueError, r"Unknown convention knob.*amsgrad_max"),
    (("torch",), {"clip_formula": "l1"}, ValueError, r"clip_formula.*Received: clip_formula='l1'"),
    (("tf1",), {"default_epsilon": -1.0}, ValueError, r"default_epsilon.*>= 0"),
    (("tf1",), {"keras3_sparse_square": 1}, TypeError, r"keras3_sparse_square.*bool"),
])
def test_get_convention_errors_name_the_value(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        get_convention(*args, **kwargs)


def test_config_round_trip_keeps_preset_names_and_overridden_knobs():
    opt = refopt.Adam(convention="optax")
    assert opt.get_config()["convention"] == "optax" and opt.epsilon == 1e-8
    custom = get_convention("torch", step_counter="global")
    cfg = refopt.Adam(convention=custom).get_config()
    assert isinstance(cfg["convention"], dict) and cfg["convention"]["step_counter"] == "global"
    again = refopt.Adam.from_config(cfg)
    assert again.convention == custom


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(convention="keras2", weight_decay=0.1), ValueError, r"convention='keras2' has no weight"),
    (dict(convention="optax", use_ema=True), ValueError, r"convention='optax' has no moving"),
    (dict(convention="keras3", clipnorm=1.0, clipvalue=1.0), ValueError, r"Only one of"),
    (dict(convention="keras2", clipvalue=-1.0), ValueError, r"Expected clipvalue >= 0"),
])
def test_convention_specific_constructor_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        refopt.Adam(**kwargs)


def test_defaults_follow_the_convention():
    assert refopt.Adam().epsilon == 1e-7 and refopt.Adam(convention="tf1").epsilon == 1e-8
    assert refopt.Adam(convention="keras2", epsilon=0.0).epsilon == 1e-7  # epsilon or 1e-7
    assert [refopt.AdamW(convention=c).weight_decay for c in ("tf_keras", "torch", "optax")] \
        == [0.004, 0.01, 1e-4]
    with pytest.raises(ValueError, match="AdamW requires a `weight_decay`"):
        refopt.AdamW(weight_decay=None)


def test_adamw_under_a_convention_without_it_says_so():
    with pytest.raises(ValueError, match="AdamW does not exist under convention='tf1'"):
        refopt.AdamW(convention="tf1")


def test_every_convention_constructs_on_every_backend():
    # cuda runs on the simulator in the tests (conftest); every convention is built there too
    for backend in ("reference", "cpu", "cuda"):
        for conv in PRESETS:
            opt = refopt.Adam(convention=conv, backend=backend)
            assert opt.convention == PRESETS[conv] and opt.backend == backend


def test_torch_adam_refuses_sparse_gradients_and_changes_nothing():
    w = np.ones((3, 2), F)
    opt = refopt.Adam(convention="torch")
    opt.apply_gradients([(np.ones((3, 2), F), w)])
    before, m = w.copy(), opt.get_slot(w, "m").copy()
    g = IndexedSlices(np.ones((1, 2), F), np.array([1]), (3, 2))
    with pytest.raises(TypeError, match="convention='torch'.*IndexedSlices"):
        opt.apply_gradients([(g, w)])
    np.testing.assert_array_equal(w, before)
    np.testing.assert_array_equal(opt.get_slot(w, "m"), m)
    assert opt.iterations == 1


# Printed values from the semantics notes, measured on each framework (float32).
G3 = [[0.1, -0.2, 0.3], [0.01, 0.5, -1.0], [1e-4, 0.0, 2.0]]


@pytest.mark.parametrize("conv, kw, want", [
    ("tf_keras", {}, [0.9768599271774292, 2.002159357070923, 2.9914004802703857]),
    ("keras3", {"amsgrad": True}, [0.9768627882003784, 2.0021610260009766, 2.9914004802703857]),
    ("keras2", {}, [0.9768598079681396, 2.0021591186523438, 2.9914000034332275]),
    ("keras2", {"amsgrad": True}, [0.9768626689910889, 2.0021610260009766, 2.9914000034332275]),
    ("tf1", {}, [0.9768591523170471, 2.002159595489502, 2.9914002418518066]),
    ("tf1", {"epsilon": 1e-7}, [0.9768598079681396, 2.002159357070923, 2.9914002418518066]),
])
def test_keras_family_three_step_vectors(conv, kw, want):
    w, _ = run(refopt.Adam, [1, 2, 3], G3, learning_rate=0.01, convention=conv, **kw)
    assert w.tolist() == want


@pytest.mark.parametrize("cls, conv, kw, want", [
    (refopt.Adam, "torch", {}, [0.997000039, -2.00299978, 3.00299978]),
    (refopt.Adam, "optax", {}, [0.997000039, -2.00299978, 3.00299978]),
    (refopt.AdamW, "torch", {"weight_decay": 0.1}, [0.996700346, -2.00239944, 3.00209951]),
    (refopt.AdamW, "optax", {"weight_decay": 0.1}, [0.996700346, -2.00239968, 3.00209975]),
])
def test_torch_optax_reference_trajectory(cls, conv, kw, want):
    g = [0.1, 0.2, -0.3]
    w, _ = run(cls, [1, -2, 3], [g] * 3, learning_rate=1e-3, convention=conv, **kw)
    np.testing.assert_array_equal(w, np.array(want, F))


@pytest.mark.parametrize("conv, want", [("torch", -0.220674083), ("optax", -0.178483933)])
def test_amsgrad_maximum_of_raw_or_corrected_v(conv, want):
    w, _ = run(refopt.Adam, [0.0], [[1.0], [0.01], [0.01]], learning_rate=0.1, amsgrad=True,
               convention=conv)
    # optax's value was measured on a one-array pytree, which XLA compiles with reciprocal
    # multiplies; refopt reproduces the several-array form (the golden cases), 1 ulp away here.
    ulps = abs(int(w.view(np.int32)[0]) - int(np.array([want], F).view(np.int32)[0]))
    assert ulps <= (0 if conv == "torch" else 1)


@pytest.mark.parametrize("conv, eps, want", [
    ("torch", 1e-3, -0.0499999933),
    ("optax", 1e-3, -0.0499998257), ("torch", 1e-8, -0.0999989882),
    ("optax", 1e-8, -0.0999983251),
])
def test_epsilon_placement_one_step(conv, eps, want):
    w, _ = run(refopt.Adam, [0.0], [[1e-3]], learning_rate=0.1, epsilon=eps, convention=conv)
    np.testing.assert_allclose(w[0], want, rtol=2e-7)


def test_epsilon_hat_one_step_float64():
    """TF's epsilon-hat form: the notes' exact-math value -0.003065343 (eps 1e-3), against
    torch's -0.0499999933; tf-keras rounds lr and the betas through float32 (hence rtol)."""
    w = np.zeros(1)
    refopt.Adam(learning_rate=0.1, epsilon=1e-3).apply_gradients([(np.array([1e-3]), w)])
    np.testing.assert_allclose(w[0], -0.003065343, rtol=1e-5)


@pytest.mark.parametrize("conv, want", [
    ("tf_keras", [np.nan, np.nan]), ("torch", [0.0, np.nan]), ("optax", [0.0, np.nan]),
])
def test_global_clipnorm_with_an_infinite_norm(conv, want):
    w, _ = run(refopt.SGD, [0.0, 0.0], [[1.0, np.inf]], learning_rate=1.0,
               global_clipnorm=1.0, convention=conv)
    np.testing.assert_array_equal(-w, np.array(want, F))


@pytest.mark.parametrize("conv, want", [
    ("tf_keras", [0.6, 0.8]), ("torch", [0.599999905, 0.799999833]),
    ("optax", [0.600000024, 0.800000012]),
])
def test_global_clipnorm_formula(conv, want):
    w, _ = run(refopt.SGD, [0.0, 0.0], [[3.0, 4.0]], learning_rate=1.0, global_clipnorm=1.0,
               convention=conv)
    np.testing.assert_array_equal(-w, np.array(want, F))


def test_ema_starts_differ():
    """decay 0.9, the model's weights 2, 3, 4, 5 after four steps (SGD lr 1, g = -1)."""
    out = {}
    for conv in ("tf_keras", "keras3", "torch"):
        w = np.array([1.0], F)
        opt = refopt.SGD(learning_rate=1.0, use_ema=True, ema_momentum=0.9, convention=conv)
        avg = []
        for _ in range(4):
            opt.apply_gradients([(np.array([-1.0], F), w)])
            avg.append(float(opt.get_slot(w, "average")[0]))
        out[conv] = avg
    np.testing.assert_array_equal(out["torch"], F([2.0, 2.0999999, 2.28999996, 2.56099987]))
    assert out["keras3"][0] == 2.0 and out["tf_keras"][0] == F(0.9 * 1 + 0.1 * 2)


@pytest.mark.filterwarnings("ignore:Gradients do not exist")
def test_torch_counts_steps_per_variable():
    """A parameter without a gradient does not advance its own step (torch.optim)."""
    a, b = np.zeros(1, F), np.zeros(1, F)
    opt = refopt.Adam(learning_rate=0.1, convention="torch")
    opt.apply_gradients([(np.ones(1, F), a), (None, b)])
    opt.apply_gradients([(np.ones(1, F), a), (np.ones(1, F), b)])
    fresh = np.zeros(1, F)
    refopt.Adam(learning_rate=0.1, convention="torch").apply_gradients([(np.ones(1, F), fresh)])
    assert b[0] == fresh[0]  # b's first step used t = 1, not the optimizer's 2
    shared = np.zeros(1, F)
    keras = refopt.Adam(learning_rate=0.1, epsilon=1e-8)
    keras.iterations = 1
    keras.apply_gradients([(np.ones(1, F), shared)])
    assert shared[0] != fresh[0]  # with a shared counter (t = 2) the step differs
    assert opt.iterations == 2


@pytest.mark.filterwarnings("ignore:Gradients do not exist")
def test_checkpoint_keeps_torch_per_variable_steps(tmp_path):
    grads = [[np.ones(2, F), None], [np.ones(2, F), np.ones(2, F)], [np.ones(2, F)] * 2]
    a, b = np.zeros(2, F), np.zeros(2, F)
    opt = refopt.Adam(learning_rate=0.1, convention="torch")
    for g in grads[:2]:
        opt.apply_gradients(list(zip(g, [a, b])))
    refopt.save_checkpoint(tmp_path / "ck", opt, [a, b])
    a2, b2 = np.zeros(2, F), np.zeros(2, F)
    opt2 = refopt.Adam(learning_rate=0.1, convention="torch")
    refopt.load_checkpoint(tmp_path / "ck", opt2, [a2, b2])
    for o, vs in ((opt, [a, b]), (opt2, [a2, b2])):
        o.apply_gradients(list(zip(grads[2], vs)))
    np.testing.assert_array_equal(b2, b)
    np.testing.assert_array_equal(a2, a)


def test_torch_clip_grad_norm_with_max_norm_5():
    """torch: g=[3,4], max_norm=5 still scales: [2.99999928, 3.99999905] (semantics notes 3);
    the coefficient is (1/(N + 1e-6)) * max_norm, torch's Python-float-over-tensor."""
    w, _ = run(refopt.SGD, [0.0, 0.0], [[3.0, 4.0]], learning_rate=1.0, global_clipnorm=5.0,
               convention="torch")
    np.testing.assert_array_equal(-w, np.array([2.99999928, 3.99999905], F))
