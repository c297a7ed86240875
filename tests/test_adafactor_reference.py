# Adafactor's reference (refopt/reference/adafactor.py) against hand-derived values, each
# framework's slot shapes and factoring rule, and the first steps recorded from tf_keras 2.21,
# Keras 3.15.1, torch 2.13 and optax 0.2.8 (conformance/data).
import math

import numpy as np
import pytest

import refopt
from refopt.reference import adafactor as A
from refopt.reference.adafactor import (
    adafactor_defaults,
    adafactor_initial_state,
    adafactor_slot_shapes,
    adafactor_update,
    factored_axes,
)

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
FORMS = ("tf_keras", "keras3", "torch", "optax")


def _step(w, g, conv, step=1, state=None, **kw):
    state = adafactor_initial_state(w, conv, **{k: kw[k] for k in ("factored",
                                                                   "min_dim_size_to_factor")
                                                if k in kw}) if state is None else state
    lr = kw.pop("learning_rate", adafactor_defaults(conv)["learning_rate"])
    return adafactor_update(w, g, *state, learning_rate=lr, step=step, convention=conv, **kw)


def test_defaults():
    assert adafactor_defaults("keras3")["learning_rate"] == 0.001
    assert adafactor_defaults("torch")["learning_rate"] == 0.01
    assert adafactor_defaults("torch")["epsilon_1"] is None  # the dtype's machine epsilon
    assert adafactor_defaults("optax")["learning_rate"] is None
    assert adafactor_defaults("optax")["min_dim_size_to_factor"] == 128
    with pytest.raises(ValueError, match="convention='tf1' has no Adafactor"):
        adafactor_defaults("tf1")


def test_slot_shapes_per_framework():
    s = (2, 3, 4)
    assert adafactor_slot_shapes(s, "keras3") == {
        "velocity_row": (2, 3), "velocity_col": (2, 4), "velocity": s}
    assert adafactor_slot_shapes(s, "torch") == {
        "velocity_row": (2, 3, 1), "velocity_col": (2, 1, 4), "velocity": ()}
    assert adafactor_slot_shapes((5,), "tf_keras") == {
        "velocity_row": (), "velocity_col": (), "velocity": (5,)}
    # optax: the two largest axes, only from min_dim_size_to_factor on
    assert adafactor_slot_shapes((130, 2, 129), "optax") == {
        "velocity_row": (2, 129), "velocity_col": (130, 2), "velocity": (1,)}
    assert factored_axes((130, 2, 129), "optax") == (0, 2)
    assert adafactor_slot_shapes((4, 3), "optax")["velocity"] == (4, 3)  # 3 < 128
    assert factored_axes((4, 3), "optax", min_dim_size_to_factor=2) == (0, 1)
    assert factored_axes((4, 3), "optax", factored=False, min_dim_size_to_factor=2) is None


@pytest.mark.parametrize("dtype", [F32, F64])
def test_first_step_vector_by_hand_keras(dtype):
    # step 1: beta_2_t = 0, v = g^2 + eps1, u = g / sqrt(v) ~ sign(g), RMS(u) ~ 1: no clip;
    # alpha = max(eps2, RMS(w)) * min(lr, 1)
    w = np.array([3.0, -4.0, 0.0], dtype)
    g = np.array([0.5, -2.0, 1e-3], dtype)
    lr = float(np.float32(0.001))
    u = g / np.sqrt(g.astype(F64) ** 2 + 1e-30)
    rms_u = math.sqrt(np.mean(u * u))
    alpha = max(1e-3, math.sqrt(25.0 / 3)) * lr
    want = w - alpha * u / max(1.0, rms_u)
    for form in ("keras3", "tf_keras"):
        r = _step(w, g, form)
        np.testing.assert_allclose(r.param, want, rtol=4 * np.finfo(dtype).eps)
        np.testing.assert_allclose(r.velocity, g * g + dtype.type(1e-30), rtol=1e-15)


def test_factored_second_moment_by_hand_keras():
    g = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], F64)
    w = np.ones_like(g)
    r = _step(w, g, "keras3")
    np.testing.assert_allclose(r.velocity_row, [14 / 3, 77 / 3], rtol=1e-15)
    np.testing.assert_allclose(r.velocity_col, [17 / 2, 29 / 2, 45 / 2], rtol=1e-15)
    est = np.outer(r.velocity_row / r.velocity_row.mean(), r.velocity_col)
    np.testing.assert_allclose(r.velocity, est, rtol=1e-15)


def test_relative_step_changes_nothing_in_keras():
    w = np.array([[0.3, -0.2], [0.1, 0.5]], F32)
    g = np.array([[0.01, -0.2], [0.3, 0.04]], F32)
    # rho = min(lr, 1/sqrt(t)) is applied whatever relative_step says: at t = 100, lr = 1
    a = _step(w, g, "keras3", step=100, learning_rate=1.0)
    np.testing.assert_array_equal(a.param, _step(w, g, "tf_keras", step=100,
                                                 learning_rate=1.0).param)


def test_torch_clamps_instead_of_adding():
    w = np.array([1.0, 2.0], F32)
    g = np.array([0.0, 1.0], F32)
    r = _step(w, g, "torch")
    # g = 0: the estimate 0 is clamped to eps1^2 and the update is 0 (Keras: 0/sqrt(1e-30))
    assert r.param[0] == w[0] * 1 and r.velocity[0] == 0
    k = _step(w, g, "keras3")
    assert k.param[0] == w[0] and k.velocity[0] == np.float32(1e-30)


def test_torch_weight_decay_after_the_scale():
    w = np.array([3.0, 4.0], F64)
    g = np.array([1.0, -1.0], F64)
    r = _step(w, g, "torch", weight_decay=0.5)
    alpha = max(1e-3, 5.0 / math.sqrt(2)) * 0.01  # from w before the decay
    np.testing.assert_allclose(r.param, w * (1 - 0.01 * 0.5) - alpha * np.sign(g), rtol=1e-12)


def test_optax_decay_offset_and_no_relative_step():
    w = np.array([3.0, 4.0], F32)
    g = np.array([1.0, -1.0], F32)
    # lr None: the step is RMS(w) times the clipped update, whatever the step number
    a = _step(w, g, "optax", step=1)
    b = _step(w, g, "optax", step=50, state=(np.zeros(1, F32), np.zeros(1, F32), g * g))
    np.testing.assert_array_equal(a.param, b.param)
    rms = math.sqrt(12.5)
    np.testing.assert_allclose(a.param, w - rms * np.sign(g), rtol=1e-6)
    # an offset past the step: the decay is NaN (as optax)
    c = _step(w, g, "optax", step=1, decay_offset=2)
    assert np.isnan(c.param).all()


def test_errors():
    w = np.ones((2, 3), F32)
    with pytest.raises(ValueError, match="min_dim_size_to_factor.*optax's"):
        _step(w, w, "keras3", min_dim_size_to_factor=2)
    with pytest.raises(ValueError, match="velocity_row.*shape"):
        adafactor_update(w, w, np.zeros(3, F32), np.zeros(3, F32), np.zeros((2, 3), F32),
                         learning_rate=0.1, step=1, convention="keras3")
    with pytest.raises(ValueError, match="weight decay"):
        _step(w, w, "keras3", weight_decay=0.1)
    with pytest.raises(TypeError, match="dense gradients"):
        _step(w, refopt.IndexedSlices(np.ones((1, 3), F32), [0], (2, 3)), "keras3")


def test_eigen_sum_order():
    # 8 float32 lanes: the tail (elements 8..9) from +0, then the lanes folded in halves
    x = np.array([1e8, 1, -1e8, 1, 0, 0, 0, 0, 3, 4], F32)
    lanes = x[:8]
    folded = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) + (
        (lanes[1] + lanes[5]) + (lanes[3] + lanes[7]))
    assert A.eigen_sum(x) == np.float32(7) + folded


@pytest.mark.parametrize("cid", ["tf_keras/adafactor_f32", "keras3/adafactor_f64",
                                 "torch/adafactor_opts_f32", "optax/adafactor_f32"])
def test_first_recorded_step(cid):
    from refopt.conformance import load_case, load_manifest

    e = {x["id"]: x for x in load_manifest()}[cid]
    init, grads, params, slots = load_case(e)
    opt = refopt.Adafactor(convention=e["convention"], **e["hyperparameters"])
    ws = [a.copy() for a in init]
    opt.apply_gradients(list(zip(grads[0], ws)))
    for i, w in enumerate(ws):
        np.testing.assert_array_equal(w, params[0][i], err_msg=f"{cid} variable {i}")
        for name in e["slots"]:
            if slots[name][0][i] is not None:
                np.testing.assert_array_equal(opt.get_slot(w, name), slots[name][0][i])


def test_torch_refuses_a_variable_without_elements_as_torch_does():
    # torch 2.13: torch.optim.Adafactor on a (0,) or (0, 3) parameter raises ZeroDivisionError
    # (`param.norm(2).item() / (param.numel() ** 0.5)`); Keras and optax step it.
    import refopt

    for shape in ((0,), (0, 3)):
        w = np.zeros(shape, np.float32)
        with pytest.raises(ValueError, match=r"convention='torch'.*without elements.*shape"):
            A.adafactor_update(w, w.copy(), *A.adafactor_initial_state(w, convention="torch"),
                                 learning_rate=0.01, step=1, convention="torch")
        opt = refopt.Adafactor(convention="torch")
        with pytest.raises(ValueError, match="without elements"):
            opt.apply_gradients([(w.copy(), w)])
        assert int(opt.iterations) == 0
