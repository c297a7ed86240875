"""float16 and bfloat16 variables: the convention knob ``low_precision_compute`` (issue #17
items 1-2, issue #12 item 3), bfloat16 checks, checkpoints and errors.

The framework's values: torch 2.13 (``torch.optim.Adam(fused=True)``) below, and the golden
cases ``torch/*_f16``, ``torch/*_bf16``, ``tf_keras/*_f16``, ``keras3/*_f16`` replayed by
``tests/test_conformance.py``.
"""

import os

import ml_dtypes
import numpy as np
import pytest

import refopt
from refopt import conformance as conf
from refopt.checkpoint import load_checkpoint, save_checkpoint
from refopt.conventions import KNOB_VALUES, PRESETS, get_convention
from refopt.precision import compute_dtype, round_to
from refopt.testing.conformance import ulp_distance

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)

# torch 2.13.0+cpu, Adam(lr=0.01, fused=True), p = [1, -0.5, 0.25], two steps with gradients
# [300, -1000, 1e-3] and [250, 2000, -2e-3] in the parameter's dtype: p, exp_avg, exp_avg_sq.
TORCH_FUSED = {
    F16: ([0.98046875, -0.49365234375, 0.244140625],
          [52.0, 110.0, -0.00011008977890014648], [152.375, 5000.0, 0.0]),
    BF16: ([0.9765625, -0.494140625, 0.244140625],
           [52.0, 110.0, -0.00010967254638671875], [152.0, 4992.0, 5.005858838558197e-09]),
}
GRADS = ([300.0, -1000.0, 1e-3], [250.0, 2000.0, -2e-3])


def bits(a):
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def two_steps(dtype, backend="reference", **knobs):
    w = np.array([1.0, -0.5, 0.25], np.float32).astype(dtype)
    opt = refopt.Adam(learning_rate=0.01, backend=backend,
                      convention=get_convention("torch_fused", **knobs))
    for g in GRADS:
        opt.apply_gradients([(np.array(g, np.float32).astype(dtype), w)])
    return w, opt.get_slot(w, "m"), opt.get_slot(w, "v")


def test_the_knob_and_its_presets():
    assert KNOB_VALUES["low_precision_compute"] == ("dtype", "float32", "torch_fused")
    want = {"torch_fused": "torch_fused"}  # "torch" (the for-loop) rounds in the dtype
    for name, conv in PRESETS.items():
        assert conv.low_precision_compute == want.get(name, "dtype"), name
    conv = get_convention("tf_keras", low_precision_compute="float32")
    assert compute_dtype(conv, F16) == np.float32 and compute_dtype(conv, BF16) == np.float32
    assert compute_dtype(conv, np.float32) is None and compute_dtype(conv, np.float64) is None
    assert compute_dtype(PRESETS["keras3"], F16) is None
    # torch_fused: Adam/AdamW are torch's fused kernels (float32); the others its for-loop
    # paths; torch (the for-loop everywhere): the dtype
    for opt, want32 in ((refopt.Adam(), True), (refopt.AdamW(), True),
                        (refopt.LazyAdam(convention="torch"), False), (refopt.SGD(), False),
                        (refopt.RMSprop(), False)):
        assert (compute_dtype(PRESETS["torch_fused"], F16, opt) is not None) == want32, \
            type(opt).__name__
        assert compute_dtype(PRESETS["torch"], F16, opt) is None
    with pytest.raises(ValueError, match=r"low_precision_compute.*'float64'"):
        get_convention("torch", low_precision_compute="float64")


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_torch_fused_adam_values(dtype, backend):
    # torch's fused kernel: p, g, m, v loaded into float32, one rounding per stored result
    w, m, v = two_steps(dtype, backend)
    for got, want in zip((w, m, v), TORCH_FUSED[dtype]):
        assert got.dtype == dtype
        assert bits(got).tolist() == bits(np.array(want, np.float32).astype(dtype)).tolist()


def test_float16_computed_in_float16_overflows_where_torch_does_not():
    # issue #12 item 3: in float16 v underflows to 0 and epsilon 1e-8 rounds to 0, so the
    # third element is 0/0; torch's fused Adam (epsilon in float32) stays finite
    w, _, _ = two_steps(F16, low_precision_compute="dtype")
    assert np.isnan(w[2]) and np.isfinite(TORCH_FUSED[F16][0]).all()


@pytest.mark.parametrize("opt_cls, kw", [
    (refopt.AdamW, {"weight_decay": 0.1, "amsgrad": True}),
    (refopt.SGD, {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    (refopt.RMSprop, {"momentum": 0.5, "centered": True}),
])
def test_float32_compute_is_the_float32_step_rounded_once(opt_cls, kw):
    # One step of a low-precision variable == the float32 step on exact copies, rounded once
    # (variable and every slot), under any optimizer: the rule is generic.
    rng = np.random.default_rng(3)
    for dtype in (F16, BF16):
        w0 = (rng.standard_normal(7) * 3).astype(np.float32).astype(dtype)
        g = (rng.standard_normal(7) * 400).astype(np.float32).astype(dtype)
        w = w0.copy()
        conv = get_convention("torch", low_precision_compute="float32")  # SGD(fused=True)
        low = opt_cls(learning_rate=0.01, convention=conv, **kw)
        low.apply_gradients([(g, w)])
        w32 = w0.astype(np.float32)
        ref = opt_cls(learning_rate=0.01, convention=conv, **kw)
        ref.apply_gradients([(g.astype(np.float32), w32)])
        assert bits(w).tolist() == bits(round_to(w32, dtype)).tolist(), dtype
        for name in low.slot_names:
            s = low.get_slot(w, name)
            assert s.dtype == dtype
            assert bits(s).tolist() == bits(round_to(ref.get_slot(w32, name), dtype)).tolist()


def test_round_to_is_nearest_even_and_keeps_specials():
    x = np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 65520.0, -0.0, np.inf, np.nan], np.float32)
    assert round_to(x, BF16)[:2].astype(np.float32).tolist() == [1.0, 1 + 2.0**-6]
    h = round_to(x, F16)
    assert np.isinf(h[2]) and np.signbit(h[3]) and np.isinf(h[4]) and np.isnan(h[5])
    assert np.isnan(round_to(x, BF16)[5])


def test_bfloat16_refused_where_the_convention_computes_in_the_dtype():
    w = np.array([1.0, 2.0], BF16)
    before = bits(w).copy()
    # tf_keras' Ftrl: computed in the variable's dtype, not modelled on bfloat16 (TF's pow;
    # the other optimizers are: refopt.reference.bf16, bf16_generic, tests/test_bf16_*.py)
    opt = refopt.Ftrl(learning_rate=0.1)
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16.*'tf_keras'"):
        opt.apply_gradients([(np.ones(2, BF16), w)])
    assert not opt.built and opt.iterations == 0 and (bits(w) == before).all()
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16"):
        refopt.RMSprop(learning_rate=0.1, convention="optax", clipnorm=1.0).build([w])
    # torch's for-loop optimizers not modelled op by op on bfloat16 (refopt.reference.
    # bf16 takes Adam, AdamW, SGD, Adagrad, RMSprop; bf16_torch_more Adamax, NAdam, RAdam,
    # Adadelta, ASGD, Rprop): refused, naming the class
    with pytest.raises(TypeError, match=r"var_list\[0\].*Adafactor under convention='torch'"):
        refopt.Adafactor(convention="torch").build([w])
    refopt.SGD(convention=get_convention("torch", low_precision_compute="float32")).build([w])


def test_torch_for_loop_optimizers_compute_float16_in_float16():
    # refopt's torch SGD is torch's for-loop path (op by op, refopt.reference.bf16: the
    # golden torch/sgd_momentum_f16 bit for bit); the torch preset computes it as
    # low_precision_compute="dtype" does
    g = np.array([3.0, -1e-4, 70.0], F16)
    out = []
    for knobs in ({}, {"low_precision_compute": "dtype"}):
        w = np.array([1.0, 0.5, -2.0], F16)
        opt = refopt.SGD(learning_rate=0.01, momentum=0.9,
                         convention=get_convention("torch", **knobs))
        for _ in range(3):
            opt.apply_gradients([(g, w)])
        out.append(bits(w).copy())
    assert (out[0] == out[1]).all()


def test_bfloat16_errors_change_nothing():
    w = np.array([1.0, 2.0], BF16)
    opt = refopt.Adam(learning_rate=0.1, convention="torch_fused")
    opt.apply_gradients([(np.ones(2, BF16), w)])
    state = {n: bits(opt.get_slot(w, n)).copy() for n in opt.slot_names}
    before = bits(w).copy()
    with pytest.raises(TypeError, match="dtype=float32.*bfloat16"):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert opt.iterations == 1 and (bits(w) == before).all()
    assert all((bits(opt.get_slot(w, n)) == state[n]).all() for n in opt.slot_names)


def test_bfloat16_checkpoint_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    w = [rng.standard_normal(5).astype(BF16), rng.standard_normal((2, 3)).astype(np.float32)]
    gs = [[rng.standard_normal(a.shape).astype(a.dtype) for a in w] for _ in range(4)]
    opt = refopt.AdamW(learning_rate=0.01, convention="torch_fused", amsgrad=True)
    for g in gs[:2]:
        opt.apply_gradients(zip(g, w))
    path = os.path.join(tmp_path, "c.npz")
    save_checkpoint(path, opt, w)
    with np.load(path) as z:  # .npz has no bfloat16: stored as its bits
        assert z["variable_0"].dtype == np.uint16 and z["slot_vhat_0"].dtype == np.uint16
    for g in gs[2:]:
        opt.apply_gradients(zip(g, w))
    restored = load_checkpoint(path)
    v = restored.variables
    assert v[0].dtype == BF16 and restored.optimizer.get_slot(v[0], "m").dtype == BF16
    for g in gs[2:]:
        restored.optimizer.apply_gradients(zip(g, v))
    assert all((bits(a) == bits(b)).all() for a, b in zip(v, w))


def test_ulp_distance_of_bfloat16():
    one = np.array([1.0, 1.0, -0.0, np.nan], BF16)
    other = np.array([1.0, 1 + 2.0**-7, 0.0, 1.0], np.float32).astype(BF16)
    assert ulp_distance(one, other).tolist() == [0.0, 1.0, 0.0, np.inf]


def test_golden_low_precision_cases_are_recorded():
    ids = {e["id"]: e for e in conf.load_manifest()}
    for case in ("torch/adam_fused_f16", "torch/adam_fused_big_f16", "torch/adamw_fused_bf16",
                 "keras3/adam_f16", "tf_keras/adam_big_f16"):
        assert ids[case]["tolerance_ulp"] == 0, case
    init, _, params, _ = conf.load_case(ids["torch/adam_fused_bf16"])
    assert init[0].dtype == BF16 and params[-1][0].dtype == BF16
    # torch stays finite where the float16 computation overflows (g up to 3000)
    _, _, params, _ = conf.load_case(ids["torch/adam_fused_big_f16"])
    assert all(np.isfinite(p).all() for row in params for p in row)


# ----------------------------------------------------------------------- master weights
def test_splitmix64_known_answer():
    from refopt.precision import _mix

    # SplitMix64 (Steele, Lea, Flood 2014) from state 0: its published first two outputs
    assert _mix(0) == 0xE220A8397B1DCDAF
    assert _mix(0x9E3779B97F4A7C15) == 0x6E789E6AA1B965F4
    z = np.array([0, 0x9E3779B97F4A7C15], np.uint64)
    assert _mix(z).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


@pytest.mark.parametrize("conv", ["keras3", "torch"])
def test_master_weights_are_the_float32_trajectory_rounded(conv):
    # Keras 3's mixed_float16/mixed_bfloat16 policies keep float32 variables, float32
    # gradients and float32 slots (TF 2.21 / Keras 3.15, checked); the layer reads the
    # variable cast to float16 (tf.cast: to nearest even). MasterWeights is that recipe.
    rng = np.random.default_rng(5)
    low = [rng.standard_normal(6).astype(F16), rng.standard_normal(3).astype(BF16)]
    w32 = [a.astype(np.float32) for a in low]  # the float32 variables the masters start as
    grads = [[(rng.standard_normal(a.shape) * 10).astype(np.float32) for a in w32]
             for _ in range(4)]
    ref = refopt.Adam(learning_rate=0.01, convention=conv)
    mw = refopt.MasterWeights(refopt.Adam(learning_rate=0.01, convention=conv))
    for g0, g1 in grads:
        g1 = g1.astype(BF16)  # a gradient in the variable's dtype, converted exactly
        ref.apply_gradients([(g0, w32[0]), (g1.astype(np.float32), w32[1])])
        mw.apply_gradients([(g0, low[0]), (g1, low[1])])
        for a, b in zip(low, w32):
            assert bits(mw.get_master(a)).tolist() == bits(b).tolist()
            assert bits(a).tolist() == bits(round_to(b, a.dtype)).tolist()
            assert bits(mw.get_slot(a, "v")).tolist() == bits(ref.get_slot(b, "v")).tolist()
    assert mw.get_slot(low[1], "v").dtype == np.float32 and mw.iterations == 4


def test_stochastic_rounding_is_seeded_and_the_same_on_every_host_backend():
    rng = np.random.default_rng(2)
    w0 = rng.standard_normal(257).astype(np.float32).astype(BF16)
    g = (rng.standard_normal(257) * 1e-2).astype(np.float32)
    out = {}
    for backend in ("reference", "cpu"):
        for seed in (1, 2):
            w = w0.copy()
            mw = refopt.MasterWeights(refopt.SGD(learning_rate=0.1, backend=backend),
                                      stochastic_rounding=True, seed=seed)
            for _ in range(3):
                mw.apply_gradients([(g, w)])
            out[backend, seed] = bits(w).copy()
            # each element is one of the two bfloat16 neighbours of its master
            master = mw.get_master(w).astype(np.float64)
            gap = np.abs(master) * 2.0**-7  # bfloat16 keeps 8 significant bits
            assert (np.abs(w.astype(np.float64) - master) <= gap).all()
    assert (out["reference", 1] == out["cpu", 1]).all()
    assert (out["reference", 1] != out["reference", 2]).any()


def test_stochastic_rounding_is_unbiased_on_a_quarter_gap():
    from refopt.precision import random_bits, stochastic_round

    x = np.full(20000, 1 + 2.0**-9, np.float32)  # a quarter of bfloat16's gap above 1
    r = stochastic_round(x, BF16, random_bits(7, 1, 0, x.size)).astype(np.float64)
    assert set(np.unique(r).tolist()) == {1.0, 1 + 2.0**-7}
    assert abs((r == 1 + 2.0**-7).mean() - 0.25) < 0.02
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    s = stochastic_round(special, F16, random_bits(0, 1, 0, 6))
    assert bits(s).tolist() == bits(special.astype(F16)).tolist()


def test_master_weights_errors_change_nothing_and_state_dict_round_trips():
    w = np.array([1.0, -2.0, 3.0], F16)
    mw = refopt.MasterWeights(refopt.Adam(learning_rate=0.1))  # bfloat16/float16 any convention
    mw.apply_gradients([(np.ones(3, F16), w)])
    sd = mw.state_dict()
    before = (bits(w).copy(), mw.get_master(w).copy(), mw.get_slot(w, "m").copy())
    with pytest.raises(TypeError, match=r"position 0.*float64.*float16 or float32"):
        mw.apply_gradients([(np.ones(3, np.float64), w)])
    assert mw.iterations == 1 and (bits(w) == before[0]).all()
    assert (mw.get_master(w) == before[1]).all() and (mw.get_slot(w, "m") == before[2]).all()
    mw.apply_gradients([(np.ones(3, F16), w)])
    w2 = w.copy()
    other = refopt.MasterWeights(refopt.Adam(learning_rate=0.1))
    w_b = before[0].view(F16).copy()
    other.load_state_dict(sd, var_list=[w_b])
    other.apply_gradients([(np.ones(3, F16), w_b)])
    assert (bits(w_b) == bits(w2)).all() and other.iterations == 2
    with pytest.raises(ValueError, match="backend='cuda'"):
        refopt.MasterWeights(refopt.Adam(backend="cuda"))
    with pytest.raises(ValueError, match=r"seed.*2\*\*64"):
        refopt.MasterWeights(refopt.Adam(), seed=-1)


@pytest.mark.parametrize("policy, dtype", [("mixed_float16", F16), ("mixed_bfloat16", BF16)])
def test_master_weights_reproduce_keras3_mixed_precision(policy, dtype):
    # conformance/precision/keras3_mixed.npz (gen_mixed_precision.py, Keras 3.15 / TF 2.21):
    # a Dense layer under the policy; Keras' float32 variables are the masters, the values
    # the layer reads (its autocast) the low-precision working copies.
    path = os.path.join(os.path.dirname(__file__), os.pardir, "conformance", "precision",
                        "keras3_mixed.npz")
    with np.load(path) as z:
        z = {k: z[k] for k in z.files if k.startswith(policy)}
    assert z[f"{policy}/dtypes"].tolist()[:3] == ["float32"] * 3  # variable, gradient, slots
    init = [z[f"{policy}/init/{i}"] for i in range(2)]
    low = [round_to(a, dtype) for a in init]
    mw = refopt.MasterWeights(refopt.Adam(learning_rate=0.01, convention="keras3"))
    mw.build(low)
    for a, m in zip(init, (mw.get_master(w) for w in low)):
        np.copyto(m, a)  # Keras' float32 start, not its rounding
    k = 1
    while f"{policy}/grad/{k}/0" in z:
        mw.apply_gradients([(z[f"{policy}/grad/{k}/{i}"], low[i]) for i in range(2)])
        for i, w in enumerate(low):
            assert bits(mw.get_master(w)).tolist() == bits(z[f"{policy}/param/{k}/{i}"]).tolist()
            assert bits(w).tolist() == z[f"{policy}/cast/{k}/{i}"].view(
                f"u{w.dtype.itemsize}").tolist()
            for name in ("m", "v"):
                assert bits(mw.get_slot(w, name)).tolist() == bits(
                    z[f"{policy}/slot/{name}/{k}/{i}"]).tolist()
        k += 1
    assert k == 9


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_bfloat16_clip_grad_norm_under_torch_fused_is_torchs(backend):
    # found by a user: bfloat16 with clipnorm raised KeyError (the float32 reduction's tail
    # table) once a tensor had a tail of 4 or more. torch 2.13 reduces bfloat16 as float16:
    # float32 squares summed serially, the root rounded. torch.optim.Adam(lr=0.01, fused=True)
    # after clip_grad_norm_(p, 1.0), two steps, the bfloat16 bits of p:
    torch_bits = [49087, 49055, 49022, 48958, 48894, 48777, 48292, 15981, 16120, 16188, 16252,
                  16287, 16319]
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    w = ((np.arange(13, dtype=np.float32) - 6) / 4).astype(bf16)
    opt = refopt.Adam(learning_rate=0.01, convention="torch_fused", clipnorm=1.0,
                      backend=backend)
    for g in (np.linspace(-3, 5, 13, dtype=np.float32), np.linspace(2, -1, 13, dtype=np.float32)):
        opt.apply_gradients([(g.astype(bf16), w)])
    assert w.view(np.uint16).tolist() == torch_bits
