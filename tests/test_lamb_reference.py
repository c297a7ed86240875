# Lamb's reference (refopt/reference/lamb.py) against hand-derived values, the frameworks'
# edge cases (zero and NaN norms) and values recorded from Keras 3.15.1 and optax 0.2.8.
import math

import numpy as np
import pytest

import refopt
from refopt.reference import lamb as L
from refopt.reference.lamb import lamb_defaults, lamb_update

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)


def _step(w, g, conv, step=1, m=None, v=None, **kw):
    h = dict(lamb_defaults(conv), learning_rate=0.01)
    h.pop("eps_root")
    h.update(kw)
    m = np.zeros_like(w) if m is None else m
    v = np.zeros_like(w) if v is None else v
    return lamb_update(w, g, m, v, step=step, convention=conv, **h)


def test_defaults_differ_in_epsilon():
    assert lamb_defaults("keras3")["epsilon"] == 1e-7
    assert lamb_defaults("optax")["epsilon"] == 1e-6
    assert lamb_defaults("optax")["learning_rate"] is None
    with pytest.raises(ValueError, match="convention='tf_keras' has no Lamb"):
        lamb_defaults("tf_keras")


@pytest.mark.parametrize("conv", ["keras3", "optax"])
def test_first_step_by_hand(conv):
    # step 1: m_hat = g, v_hat = g^2, u = g / (|g| + eps); ratio ||w|| / ||u||
    w = np.array([3.0, 4.0], F64)
    g = np.array([0.5, -0.25], F64)
    eps = lamb_defaults(conv)["epsilon"]
    b1, b2, lr = 0.9, 0.999, 0.01
    if conv == "keras3":  # beta inside the powers and lr: float32 variables cast to float64
        b1, b2, lr = (float(np.float32(x)) for x in (b1, b2, lr))
    m_hat = (1 - 0.9) * g / (1 - b1)
    v_hat = (1 - 0.999) * g * g / (1 - b2)
    u = m_hat / (np.sqrt(v_hat) + eps)
    want = w - (5.0 / math.sqrt(np.sum(u * u))) * lr * u
    r = _step(w, g, conv)
    np.testing.assert_allclose(r.param, want, rtol=1e-13)
    np.testing.assert_allclose(r.m, 0.1 * g, rtol=1e-15)
    np.testing.assert_allclose(r.v, 0.001 * g * g, rtol=1e-13)


@pytest.mark.parametrize("conv", ["keras3", "optax"])
def test_zero_weight_or_zero_update_gives_ratio_one(conv):
    g = np.array([0.5, -0.25], F32)
    zero = np.zeros(2, F32)
    r = _step(zero, g, conv)  # ||w|| = 0: ratio 1, the plain Adam direction
    u = g / (np.abs(g) + np.float32(lamb_defaults(conv)["epsilon"]))
    np.testing.assert_allclose(r.param, -0.01 * u, rtol=2e-5)  # float32 bias corrections
    w = np.array([1.0, 2.0], F32)
    r = _step(w, zero, conv)  # u = 0: ratio 1, nothing moves
    np.testing.assert_array_equal(r.param, w)


def test_nan_norm_keras3_ratio_one_optax_nan():
    w = np.array([np.nan, 1.0], F32)
    g = np.array([0.5, 0.5], F32)
    k3 = _step(w, g, "keras3")  # Keras 3: where(||w|| > 0, ..., 1): NaN > 0 is False
    assert np.isnan(k3.param[0]) and np.isfinite(k3.param[1])
    op = _step(w, g, "optax")  # optax: NaN == 0 is False, the ratio is NaN
    assert np.isnan(op.param).all()


def test_optax_weight_decay_enters_the_trust_ratio():
    w = np.array([3.0, 4.0], F64)
    g = np.array([0.5, -0.25], F64)
    eps = 1e-6
    u = g / (np.abs(g) + eps) + 0.1 * w
    want = w - (5.0 / math.sqrt(np.sum(u * u))) * 0.01 * u
    r = _step(w, g, "optax", weight_decay=0.1)
    np.testing.assert_allclose(r.param, want, rtol=1e-13)
    with pytest.raises(ValueError, match="weight_decay.*optax's"):
        _step(w, g, "keras3", weight_decay=0.1)
    with pytest.raises(ValueError, match="eps_root.*optax's"):
        _step(w, g, "keras3", eps_root=1e-8)


def test_pure_and_checked():
    w = np.ones(3, F32)
    g = np.full(3, 0.5, F32)
    m, v = np.zeros(3, F32), np.zeros(3, F32)
    before = [a.copy() for a in (w, g, m, v)]
    lamb_update(w, g, m, v, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                step=1, convention="keras3")
    for a, b in zip((w, g, m, v), before):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="shape and dtype"):
        lamb_update(w, g, np.zeros(2, F32), v, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
                    epsilon=1e-7, step=1, convention="keras3")
    with pytest.raises(TypeError, match="dense gradients"):
        lamb_update(w, refopt.IndexedSlices(np.ones((1,), F32), [0], (3,)), m, v,
                    learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1,
                    convention="keras3")


# Framework values: the first step of the recorded golden cases (conformance/data), variable 0
# (shape (5,), the case's seed-0 inputs), written out so this file needs no data.
def test_first_recorded_step_keras3_and_optax():
    from refopt.conformance import load_case, load_manifest

    entries = {e["id"]: e for e in load_manifest()}
    for cid in ("keras3/lamb_f32", "optax/lamb_f32", "keras3/lamb_opts_f32"):
        init, grads, params, slots = load_case(entries[cid])
        e = entries[cid]
        opt = refopt.Lamb(convention=e["convention"], **e["hyperparameters"])
        ws = [a.copy() for a in init]
        opt.apply_gradients(list(zip(grads[0], ws)))
        np.testing.assert_array_equal(ws[0], params[0][0], err_msg=cid)
        np.testing.assert_array_equal(opt.get_slot(ws[0], "m"), slots["m"][0][0])


def test_trust_ratio_helper():
    assert L.trust_ratio(np.float32(0), np.float32(2), F32) == 1
    assert L.trust_ratio(np.float32(3), np.float32(0), F32) == 1
    assert L.trust_ratio(np.float32(3), np.float32(2), F32) == np.float32(1.5)
