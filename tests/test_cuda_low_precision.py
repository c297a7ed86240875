"""float16 and bfloat16 variables on backend="cuda" (issue #17 item 2), on the simulator.

Where the convention computes them in float32 (low_precision_compute "float32", and
"torch_fused" for Adam/AdamW: PyTorch's fused kernels), the rule drivers' low-precision dense
kernel takes them on the device: uint16 bits (refopt.kernels.cuda.halfbits) loaded exactly
into float32, the rule in float32, the variable and every slot rounded once to nearest even.
Checked here: the conversions against NumPy's and ml_dtypes' casts (all 65,536 loads), the
optimizers' variables and every slot bit for bit against the reference with no host step, the
10 golden cases torch/*_fused_{f16,bf16} (torch 2.13's values) replayed on the device path,
the launch's argument types against what the PTX audit compiles (tests/test_cuda_ptx.py
audits those kernels), the host step for what the kernel does not take (clipping, EMA) now
bfloat16 too, and the refusals.

Cost: on the simulator nothing compiles; the kernels are Python (small arrays).
"""

import warnings

import ml_dtypes
import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.conventions import get_convention

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
pytestmark = pytest.mark.skipif(not kc.simulator and not kc.cuda.is_available(),
                                reason="needs numba's CUDA simulator or an NVIDIA GPU")

from refopt.executors import cuda as _cuda
from refopt.kernels.cuda import halfbits

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FUSED_SGD = get_convention("torch_fused", low_precision_compute="float32")

# (optimizer, convention, hyperparameters): Adam with torch's L2 decay and AMSGrad, AdamW's
# factor, SGD with momentum (torch's fused SGD computes in float32)
CASES = {
    "adam_l2_amsgrad": (refopt.Adam, "torch_fused", {"weight_decay": 0.1, "amsgrad": True}),
    "adamw": (refopt.AdamW, "torch_fused", {"weight_decay": 0.1}),
    "sgd_momentum": (refopt.SGD, FUSED_SGD, {"momentum": 0.9, "nesterov": True}),
}


def bits(a):
    return np.asarray(a).view(np.uint16)


def host(a):
    return a.copy_to_host()


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)


def no_host_step(*args, **kwargs):
    raise AssertionError("backend='cuda' took the host step")


# ----------------------------------------------------------------------------- conversions
def test_loads_are_exact_for_all_65536_bit_patterns():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    for kind, dt in ((halfbits.KIND_F16, F16), (halfbits.KIND_BF16, BF16)):
        got = np.array([halfbits.load(np.uint16(x), kind) for x in h.tolist()], np.float32)
        want = h.view(dt).astype(np.float32)  # NaNs keep sign and payload (NumPy, ml_dtypes)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_stores_round_to_nearest_even_as_numpy_and_ml_dtypes():
    rng = np.random.default_rng(17)
    u = rng.integers(0, 1 << 32, 20000, dtype=np.uint64).astype(np.uint32)
    edge = np.array([65504.0, 65519.996, 65520.0, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25,
                     2.0**-14, 3.3895314e38, 3.4028235e38, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11,
                     1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 0.0, 1e-45, np.inf], np.float32)
    x = np.concatenate([u.view(np.float32), edge, -edge,
                        np.array([0x7F800001, 0xFFC00001, 0x7FA00000], np.uint32)
                        .view(np.float32)])
    for kind, dt in ((halfbits.KIND_F16, F16), (halfbits.KIND_BF16, BF16)):
        with np.errstate(all="raise"):  # no unsigned wrap: the simulator would warn
            got = np.array([halfbits.store(v, kind) for v in x], np.uint16)
        with np.errstate(all="ignore"):
            want = x.astype(dt).view(np.uint16)
        np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ optimizers
def run(cls, conv, kw, dtype, steps=3, skip=None, **extra):
    """``steps`` steps on the reference and on the device; the two optimizers and variables.

    Three variables of 5, 9 and (2, 3) elements (two launches' worth of chunks at 4 threads
    and 2 items); with ``skip`` variable 1 has no gradient at that step (PyTorch counts steps
    per variable: two groups). Gradients up to ~3000 (their square overflows float16),
    tiny ones (float16 subnormals), zeros, and at step 2 one inf and one NaN.
    """
    rng = np.random.default_rng(5)
    shapes = [(5,), (9,), (2, 3)]

    def values(shape, scale):
        x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
        x[rng.random(shape) < 0.2] *= np.float32(1e-6)
        x[rng.random(shape) < 0.1] = 0
        return x.astype(dtype)

    ws = [values(s, 1.0) for s in shapes]
    ref = [w.copy() for w in ws]
    dev = [kc.to_device(w) for w in ws]
    o_ref = cls(learning_rate=0.01, convention=conv, **kw, **extra)
    o_dev = cls(learning_rate=0.01, convention=conv, backend="cuda", **kw, **extra)
    for k in range(steps):
        gs = [values(s, 1000.0) for s in shapes]
        if k == 1:  # an infinite and a NaN gradient element: NaN bits through the stores
            gs[0][0], gs[2][1, 1] = np.inf, np.nan
        pairs = [(None if (k == skip and i == 1) else g) for i, g in enumerate(gs)]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Gradients do not exist")
            o_ref.apply_gradients(zip(pairs, ref))
            o_dev.apply_gradients(zip([None if g is None else kc.to_device(g) for g in pairs],
                                      dev))
        for a, b in zip(ref, dev):
            assert b.dtype == dtype
            np.testing.assert_array_equal(bits(host(b)), bits(a), err_msg=f"step {k + 1}")
        for name in o_ref._slot_names():
            for a, b in zip(o_ref._slots[name], o_dev._slots[name]):
                assert b.dtype == a.dtype == dtype
                np.testing.assert_array_equal(bits(host(b)), bits(a),
                                              err_msg=f"{name}, step {k + 1}")
    assert o_dev.iterations == o_ref.iterations == steps
    return o_ref, o_dev, ref, dev


# the simulator runs the rule on NumPy scalars, which warn on inf - inf (as intended: NaN)
@pytest.mark.filterwarnings("ignore:.*encountered in scalar:RuntimeWarning")
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_device_kernels_match_the_reference_bit_for_bit(case, dtype, monkeypatch):
    monkeypatch.setattr(_cuda, "_host_step", no_host_step)
    cls, conv, kw = CASES[case]
    _, o_dev, _, dev = run(cls, conv, kw, dtype, skip=1)
    assert o_dev._state.fallbacks == {}
    # the slots are the variable's dtype, in the flat device buffers
    assert {np.dtype(o_dev.get_slot(dev[0], n).dtype) for n in o_dev._slot_names()} <= {dtype}


def test_a_moved_weight_does_not_move_the_update():
    # the rule runs in float32 on the exact float32 values: one float16 step of Adam with a
    # gradient of 300 (g*g overflows float16) is finite, as torch's fused Adam
    w = kc.to_device(np.array([1.0, -0.5, 0.25], np.float16))
    opt = refopt.Adam(learning_rate=0.01, convention="torch_fused", backend="cuda")
    opt.apply_gradients([(kc.to_device(np.float16([300.0, -1000.0, 1e-3])), w)])
    got = host(w)
    assert np.all(np.isfinite(got)) and opt._state.fallbacks == {}
    want = np.array([1.0, -0.5, 0.25], np.float16)
    refopt.Adam(learning_rate=0.01, convention="torch_fused").apply_gradients(
        [(np.float16([300.0, -1000.0, 1e-3]), want)])
    np.testing.assert_array_equal(bits(got), bits(want))


GOLDEN = [e["id"] for e in conformance.load_manifest()
          if e["convention"] == "torch_fused" and e["id"].endswith(("_f16", "_bf16"))]


def test_golden_cases_are_the_ten_recorded():
    assert len(GOLDEN) == 10 and sum(g.endswith("_bf16") for g in GOLDEN) == 4


@pytest.mark.parametrize("case", GOLDEN)
def test_golden_replay_on_the_device_path(case, monkeypatch):
    monkeypatch.setattr(_cuda, "_host_step", no_host_step)  # a host step fails the replay
    entry = next(e for e in conformance.load_manifest() if e["id"] == case)
    assert entry["tolerance_ulp"] == 0
    r = conformance.replay(dict(entry, steps=min(8, entry["steps"])), backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail


def test_launch_arguments_are_what_the_ptx_audit_compiles(monkeypatch):
    from test_cuda_optimizers import wrap_rule_kernels
    from test_cuda_ptx import _Record

    from refopt.kernels.cuda import ptx

    sigs = {label: sig for label, _, _, sig in ptx.low_precision_kernels(
        kc.config.TENSORS_PER_LAUNCH)}
    log = []
    wrap_rule_kernels(monkeypatch, lambda kernel, name, ks: _Record(kernel, (name, ks), log))
    run(refopt.AdamW, "torch_fused", {"weight_decay": 0.1}, BF16, steps=1)
    launched = [(ks.low, sig) for (name, ks), sig in log]
    assert launched and {low for low, _ in launched} == {halfbits.KIND_BF16}
    assert {sig for _, sig in launched} == {sigs["rule dense: torch_fused AdamW"]}


# ------------------------------------------------------------------ host step and refusals
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
def test_clipping_and_ema_take_the_host_step_with_the_reference_bits(dtype):
    # the low kernel has no clip and no EMA (as backend="cpu"): the reference's step on host
    # copies, bfloat16 included (refused before issue #17 item 2)
    with pytest.warns(_cuda.HostStepWarning, match="computed in float32"):
        _, o_dev, _, _ = run(refopt.Adam, "torch_fused", {"clipnorm": 0.5}, dtype, steps=2,
                             use_ema=True)
    assert o_dev._state.fallbacks == {f"{dtype.name} computed in float32 (refopt.precision)": 2}


def test_bfloat16_computed_in_its_dtype_is_refused_naming_the_variable():
    w = kc.to_device(np.ones(3, BF16))
    # tf_keras' Ftrl on bfloat16 is not reproduced (TF's pow; the other optimizers are, op
    # by op on the host step: refopt.reference.bf16, bf16_generic, tests/test_bf16_*.py)
    opt = refopt.Ftrl(convention="tf_keras", backend="cuda")
    with pytest.raises(TypeError, match=r"var_list\[0\]` has dtype bfloat16.*tf_keras"):
        opt.build([w])
    assert opt._state is None and bits(host(w)).tolist() == [0x3F80] * 3


def test_a_raising_step_changes_nothing():
    w = kc.to_device(np.array([1.0, 2.0, 3.0], BF16))
    opt = refopt.Adam(learning_rate=0.1, convention="torch_fused", backend="cuda")
    opt.apply_gradients([(kc.to_device(np.ones(3, BF16)), w)])
    before = bits(host(w)).copy(), bits(host(opt.get_slot(w, "m"))).copy()
    with pytest.raises(TypeError, match="dtype"):  # a float16 gradient for a bfloat16 variable
        opt.apply_gradients([(kc.to_device(np.ones(3, F16)), w)])
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(kc.to_device(np.ones(4, BF16)), w)])
    assert opt.iterations == 1
    np.testing.assert_array_equal(bits(host(w)), before[0])
    np.testing.assert_array_equal(bits(host(opt.get_slot(w, "m"))), before[1])


def test_a_bfloat16_checkpoint_resumes_bit_for_bit(tmp_path):
    # the state is saved as uint16 bits (refopt.checkpoint) and comes back onto the device
    g = [np.array([0.3, -0.2, 5.0], BF16), np.array([0.1, 0.1, -7.0], BF16)]
    w = kc.to_device(np.array([1.0, -2.0, 0.5], BF16))
    opt = refopt.Adam(learning_rate=0.1, convention="torch_fused", backend="cuda")
    opt.apply_gradients([(kc.to_device(g[0]), w)])
    refopt.save_checkpoint(tmp_path / "ck.npz", opt, [w])
    w2 = kc.to_device(np.zeros(3, BF16))
    opt2 = refopt.Adam(learning_rate=0.1, convention="torch_fused", backend="cuda")
    refopt.load_checkpoint(tmp_path / "ck.npz", opt2, [w2])
    for o, v in ((opt, w), (opt2, w2)):
        o.apply_gradients([(kc.to_device(g[1]), v)])
    ref = np.array([1.0, -2.0, 0.5], BF16)
    o_ref = refopt.Adam(learning_rate=0.1, convention="torch_fused")
    for x in g:
        o_ref.apply_gradients([(x, ref)])
    assert opt2.iterations == 2 and opt._state.fallbacks == opt2._state.fallbacks == {}
    for v, o in ((w, opt), (w2, opt2)):
        assert np.dtype(v.dtype) == BF16
        np.testing.assert_array_equal(bits(host(v)), bits(ref))
        for name in ("m", "v"):
            np.testing.assert_array_equal(bits(host(o.get_slot(v, name))),
                                          bits(o_ref.get_slot(ref, name)))


def test_bfloat16_computed_in_its_dtype_takes_the_host_step():
    # where the reference reproduces bfloat16 op by op (Keras' Adam: refopt.reference.bf16),
    # the device has no such kernel: the host step, the reference's bits
    w = np.array([1.0, -2.0, 0.5], BF16)
    d = kc.to_device(w)
    o_ref = refopt.Adam(learning_rate=0.1, convention="tf_keras")
    o_dev = refopt.Adam(learning_rate=0.1, convention="tf_keras", backend="cuda")
    g = np.array([0.3, -0.2, 5.0], BF16)
    for step in range(2):
        o_ref.apply_gradients([(g, w)])
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            o_dev.apply_gradients([(kc.to_device(g), d)])
        # one HostStepWarning per optimizer and reason: at the first step only
        assert [str(x.message).split(";")[0] for x in seen] == (
            ["backend='cuda': bfloat16 computed in its dtype"] if step == 0 else [])
    np.testing.assert_array_equal(bits(host(d)), bits(w))
    np.testing.assert_array_equal(bits(host(o_dev.get_slot(d, "v"))),
                                  bits(o_ref.get_slot(w, "v")))
    assert o_dev._state.fallbacks == {"bfloat16 computed in its dtype": 2}
