"""bfloat16 variables computed in their dtype by the other optimizers of tf_keras, Keras 3
and optax (issue 17 item 1, :mod:`refopt.reference.bf16_generic`): the generic reference
functions on ml_dtypes arrays. The whole trajectories are golden cases (``tests/
test_conformance.py -k bf16``, reference and cpu); here the pieces they rest on and the
refusals kept.
"""

import ml_dtypes
import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.reference import bf16_generic as G
from refopt.reference import rmsprop as R

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(a):
    return np.asarray(a).view(np.uint16)


def _golden(case_id):
    return {e["id"]: e for e in conformance.load_manifest()}[case_id]


@pytest.mark.parametrize("case_id", ["optax/adamw_bf16", "optax_eager/nadam_bf16"])
def test_optax_bias_correction_is_float32_then_cast(case_id):
    # optax: 1 - b2**count in float32 (0.001), cast to bfloat16; 1 - bfloat16(0.999) would be
    # 0 and stop the first step. optax 0.2.8's first step, bit for bit:
    entry = _golden(case_id)
    init, grads, params, _ = conformance.load_case(entry)
    vs = [a.copy() for a in init]
    opt = conformance._optimizer(entry, "reference")
    opt.apply_gradients(list(zip(grads[0], vs)))
    for v, a, want in zip(vs, init, params[0]):
        assert (bits(v) == bits(want)).all()
        assert (bits(v) != bits(a)).any()


def test_rsqrt_of_bfloat16_is_the_float32_root_rounded_only_inside_a_step():
    x = np.array([2.0, 3.0, 0.5, 1e-30, 7.5e4], BF16)
    with pytest.raises(TypeError, match="bfloat16"):
        R.rsqrt(x)
    with G.computing_in(BF16):
        got = R.rsqrt(x)
    want = (1.0 / np.sqrt(x.astype(np.float64))).astype(np.float32).astype(BF16)
    assert got.dtype == BF16 and (bits(got) == bits(want)).all()
    with pytest.raises(TypeError, match="bfloat16"):  # the context does not leak
        R.rsqrt(x)


def test_public_reference_functions_still_refuse_bfloat16():
    w = np.ones(3, BF16)
    with pytest.raises(TypeError, match=r"`param` must have dtype float16, float32 or float64"):
        refopt.reference.rmsprop_update(w, w, w, learning_rate=0.1, rho=0.9, momentum=0.0,
                                        epsilon=1e-7, centered=False)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_keras3_ema_averages_a_bfloat16_variable_absent_from_the_call(backend):
    # Keras 3 averages every built variable: momentum = cast(iterations != 0) * 0.9 and
    # avg = momentum avg + (1 - momentum) w, each op in bfloat16 (1 - bf16(0.9), not bf16(0.1))
    w0 = np.array([1.0, -2.0, 0.3], BF16)
    w1 = np.array([0.7, 5.0, -1.1], BF16)
    opt = refopt.SGD(learning_rate=0.1, use_ema=True, ema_momentum=0.9, convention="keras3",
                     backend=backend)
    opt.apply_gradients([(np.ones(3, BF16), w0), (np.ones(3, BF16), w1)])
    avg1 = opt._averages[1].copy()
    opt.apply_gradients([(np.ones(3, BF16), w0)])
    mu = BF16.type(0.9)
    one_minus = BF16.type(1) - mu
    want = np.asarray(mu * avg1 + one_minus * w1)
    assert opt._averages[1].dtype == BF16
    assert (bits(opt._averages[1]) == bits(want)).all()


def test_a_float32_variable_beside_a_bfloat16_one_keeps_its_own_numbers():
    rng = np.random.default_rng(3)
    w32 = rng.standard_normal(6).astype(np.float32)
    g32 = rng.standard_normal(6).astype(np.float32)
    alone = w32.copy()
    refopt.Adagrad(learning_rate=0.1, convention="optax").apply_gradients([(g32, alone)])
    mixed = w32.copy()
    wb = np.ones(4, BF16)
    refopt.Adagrad(learning_rate=0.1, convention="optax").apply_gradients(
        [(g32, mixed), (np.full(4, 0.5, BF16), wb)])
    assert (mixed.view(np.uint32) == alone.view(np.uint32)).all()
    assert wb.dtype == BF16 and (bits(wb) != bits(np.ones(4, BF16))).all()


@pytest.mark.parametrize("make, match", [
    (lambda: refopt.Ftrl(convention="keras3"), r"pow on bfloat16"),
    (lambda: refopt.RMSprop(centered=True, convention="tf_keras"), r"rsqrt"),
    (lambda: refopt.Adam(clipnorm=1.0, convention="keras3"), r"clipping"),
    (lambda: refopt.Adagrad(global_clipnorm=1.0, convention="tf_keras"), r"clipping"),
    (lambda: refopt.Lion(learning_rate=0.1, clipvalue=0.5, convention="optax"), r"clipping"),
    (lambda: refopt.Adamax(convention="keras2"), r"not reproduced"),
    (lambda: refopt.Adagrad(learning_rate=0.1, convention="tf1"), r"not reproduced"),
], ids=["ftrl", "tf_keras_centered", "clipnorm", "global_clipnorm", "optax_clipvalue",
        "keras2", "tf1"])
def test_not_reproduced_is_refused_naming_variable_and_convention(make, match):
    w = np.array([1.0, 2.0], BF16)
    before = bits(w).copy()
    opt = make()
    conv = opt.convention.name
    with pytest.raises(TypeError, match=rf"var_list\[0\].*bfloat16.*'{conv}'.*{match}"):
        opt.apply_gradients([(np.ones(2, BF16), w)])
    assert not opt.built and opt.iterations == 0 and (bits(w) == before).all()


def test_keras3_centered_rmsprop_and_clipvalue_are_taken():
    # Keras 3's RMSprop divides by sqrt (no rsqrt): taken, centered too; clipvalue is
    # elementwise (golden cases keras3/rmsprop_centered_momentum_bf16, */adam_clipvalue_bf16)
    for opt in (refopt.RMSprop(0.1, centered=True, momentum=0.5, convention="keras3"),
                refopt.Adamax(0.1, clipvalue=0.5, convention="tf_keras")):
        w = np.array([1.0, 2.0], BF16)
        opt.apply_gradients([(np.array([3.0, -0.25], BF16), w)])
        assert w.dtype == BF16 and (bits(w) != bits(np.array([1.0, 2.0], BF16))).all()


@pytest.mark.parametrize("case_id", ["tf_keras/nadam_bf16", "keras3/nadam_bf16"])
def test_keras_nadam_u_product_is_bfloat16_as_recorded(case_id):
    # Keras' Nadam keeps u_product in the variables' dtype: every product rounded to bfloat16
    from refopt.reference.nadam import momentum_product

    entry = _golden(case_id)
    with np.load(conformance._data() / entry["file"]) as z:
        recorded = [z[f"state/u_product/{k}"] for k in range(1, entry["steps"] + 1)]
    with G.computing_in(BF16):
        got = [momentum_product(k, beta_1=0.9, convention=entry["convention"], dtype=BF16)
               for k in range(1, entry["steps"] + 1)]
    for k, (g, r) in enumerate(zip(got, recorded), start=1):
        assert np.asarray(g).dtype == BF16 and int(bits(g)) == int(r.view(np.uint16)), k


@pytest.mark.parametrize("case_id", ["optax/adagrad_bf16", "keras3/sgd_momentum_ema_bf16"])
def test_cuda_host_step_replays_bit_for_bit(case_id):
    # backend="cuda" takes the staged host step; Adagrad's accumulator starts at bfloat16(0.1)
    # on the device (precision.slot_initial_value), Keras 3's EMA runs there too
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("no GPU and not NUMBA_ENABLE_CUDASIM=1")
    r = conformance.replay(_golden(case_id), backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail
