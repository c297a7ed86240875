"""torch's default for-loop path ("torch") and its fused=True kernels ("torch_fused").

Issue 12 item 4. The framework's values (torch 2.13 CPU) are held here as literals; the
recorded trajectories are the conformance cases ``torch/*_default_*`` (for-loop) and the
``fused`` ones relabelled "torch_fused" (tests/test_conformance.py replays them all).
"""

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refopt
from refopt import _mkl
from refopt.conventions import KNOB_VALUES, PRESETS, get_convention
from refopt.reference import sqrt as _sqrt

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
needs_mkl = pytest.mark.skipif(not _mkl.mkl_available(),
                               reason="MKL's sqrt needs torch or the mkl wheel")


def inputs():
    """16 float32 weights and 4 gradients (the seed of the values below)."""
    rng = np.random.default_rng(7)
    w0 = rng.standard_normal(16).astype(F32)
    gs = [(rng.standard_normal(16) * 10.0 ** rng.uniform(-3, 1, 16)).astype(F32)
          for _ in range(4)]
    return w0, gs


# torch.optim.Adam(lr=0.01, weight_decay=0.1) on inputs(), element 6 after 4 steps
# (torch 2.13.0+cpu, AVX2): the for-loop and the fused kernel differ there by 1 ulp
LOOP_W6 = 0.02508457377552986
FUSED_W6 = 0.02508457750082016


def adam_l2(conv, backend="reference"):
    w0, gs = inputs()
    w = w0.copy()
    opt = refopt.Adam(learning_rate=0.01, weight_decay=0.1, convention=conv, backend=backend)
    for g in gs:
        opt.apply_gradients([(g, w)])
    return w, opt


def test_presets_differ_in_four_knobs():
    assert KNOB_VALUES["sqrt"] == ("ieee", "mkl", "torch_fused")
    assert "torch_loop" in KNOB_VALUES["moment_update"]
    assert PRESETS["torch"].differences(PRESETS["torch_fused"]) == {
        "moment_update": ("torch_loop", "torch_fma"),
        "sgd_momentum": ("torch", "torch_fused"),
        "low_precision_compute": ("dtype", "torch_fused"),
        "sqrt": ("mkl", "torch_fused")}
    assert PRESETS["fbgemm"].sqrt == "mkl"  # FBGEMM's dense side: torch.optim's default
    assert {PRESETS[c].sqrt for c in ("tf_keras", "keras3", "keras2", "tf1", "optax")} == {
        "ieee"}
    with pytest.raises(ValueError, match=r"`sqrt`.*Received: sqrt='fast'"):
        get_convention("torch", sqrt="fast")


@needs_mkl
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_adam_l2_loop_and_fused_are_torchs_values(backend):
    loop, _ = adam_l2("torch", backend)
    fused, _ = adam_l2("torch_fused", backend)
    assert loop[6] == F32.type(LOOP_W6) and fused[6] == F32.type(FUSED_W6)
    assert (loop != fused).sum() == 1  # everything else agrees on this input


@needs_mkl
def test_cpu_calls_mkls_sqrt_from_the_fused_kernels(monkeypatch):
    # Adam's rule declares its root (refopt.rules.Root): the dense_root kernel calls MKL's
    # vmsSqrt per work item, the same bits as the reference (and torch: LOOP_W6 above)
    from refopt.executors import cpu

    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    w_ref, ref = adam_l2("torch")
    w_cpu, opt = adam_l2("torch", "cpu")
    assert ran and all(ran)  # every step on the fused kernels
    assert w_cpu[6] == F32.type(LOOP_W6)
    np.testing.assert_array_equal(w_cpu, w_ref)
    for name in ("m", "v"):
        np.testing.assert_array_equal(opt.get_slot(w_cpu, name), ref.get_slot(w_ref, name))
    # AMSGrad's root (of the running maximum) is not split: the staged step, on the host
    ran.clear()
    w0, gs = inputs()
    w_ams, w_ams_ref = w0.copy(), w0.copy()
    a = refopt.Adam(0.01, amsgrad=True, convention="torch", backend="cpu")
    b = refopt.Adam(0.01, amsgrad=True, convention="torch")
    for g in gs:
        a.apply_gradients([(g, w_ams)])
        b.apply_gradients([(g, w_ams_ref)])
    assert ran and not any(ran)
    np.testing.assert_array_equal(w_ams, w_ams_ref)
    # SGD has no root: the fast path stays
    ran.clear()
    refopt.SGD(0.1, momentum=0.9, convention="torch", backend="cpu").apply_gradients(
        [(np.ones(3, F32), np.zeros(3, F32))])
    assert ran == [True]


def sparse_run(make, dtype, backend, steps=5, V=40, D=24):
    """A table trained with ``make(backend)`` on sparse gradients with duplicate rows."""
    rng = np.random.default_rng(11)
    table = rng.standard_normal((V, D)).astype(dtype)
    opt = make(backend)
    for _ in range(steps):
        idx = rng.integers(0, V, 30)
        vals = (rng.standard_normal((30, D)) * 10.0 ** rng.uniform(-3, 1, (30, 1))).astype(dtype)
        opt.apply_gradients([(refopt.IndexedSlices(vals, idx, (V, D)), table)])
    return table, [np.array(s) for s in opt._slots.values() for s in s]


SPARSE_TORCH = {
    "Adagrad": lambda conv: lambda be: refopt.Adagrad(0.1, convention=conv, backend=be),
    "SparseAdam": lambda conv: lambda be: refopt.LazyAdam(0.01, convention=conv, backend=be),
    "Adagrad lr_decay": lambda conv: lambda be: refopt.Adagrad(
        0.1, lr_decay=0.01, initial_accumulator_value=0.5, convention=conv, backend=be),
}


@needs_mkl
@pytest.mark.parametrize("name, dtype", [("Adagrad", F32), ("Adagrad lr_decay", F64),
                                         ("SparseAdam", F32), ("SparseAdam", F64)])
def test_sparse_rows_take_mkls_root_in_the_fast_kernel(monkeypatch, name, dtype):
    # torch's sparse Adagrad and SparseAdam take MKL's root (torch.sqrt on the values): the
    # CPU backend's rows_root kernel calls MKL per row instead of leaving the step to the
    # host (4.3x slower); the bits are the reference's (itself held to torch's recorded
    # values by the conformance cases torch/adagrad_sparse_* and torch/sparseadam_f32)
    from refopt.executors import cpu

    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    make = SPARSE_TORCH[name]
    w_ref, s_ref = sparse_run(make("torch"), dtype, "reference")
    w_cpu, s_cpu = sparse_run(make("torch"), dtype, "cpu")
    assert ran and all(ran)  # every step on the fused kernel
    np.testing.assert_array_equal(w_cpu, w_ref)
    for a, b in zip(s_cpu, s_ref):
        np.testing.assert_array_equal(a, b)
    if dtype == F32:  # the input tells MKL's root from the correctly rounded one (float64's
        # roots differ on 1% of the elements, and the step rounds most of that away)
        w_ieee, _ = sparse_run(make(get_convention("torch", sqrt="ieee")), dtype, "cpu")
        assert (w_ieee != w_ref).any()


DENSE_TORCH = {
    "Adam": lambda be: refopt.Adam(0.01, weight_decay=0.1, global_clipnorm=2.0,
                                   convention="torch", backend=be),
    "AdamW": lambda be: refopt.AdamW(0.01, weight_decay=0.1, use_ema=True, ema_momentum=0.9,
                                     convention="torch", backend=be),
    "Adagrad": lambda be: refopt.Adagrad(0.1, lr_decay=0.01, clipvalue=0.5,
                                         convention="torch", backend=be),
    "RMSprop": lambda be: refopt.RMSprop(0.01, weight_decay=0.05, clipnorm=1.0,
                                         convention="torch", backend=be),
}


@needs_mkl
@pytest.mark.parametrize("name, dtype", [("Adam", F64), ("AdamW", F32), ("Adagrad", F32),
                                         ("RMSprop", F32)])
def test_dense_steps_take_mkls_root_in_the_fast_kernel(monkeypatch, name, dtype):
    # the dense_root kernel: two tensors, one over a work item (CHUNK = 65536 elements), with
    # clipping, weight decay or an EMA around the split root
    from refopt.executors import cpu
    from refopt.kernels.cpu._kernels import CHUNK

    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    out = {}
    for be in ("reference", "cpu"):
        rng = np.random.default_rng(5)
        ws = [rng.standard_normal(CHUNK + 77).astype(dtype),
              rng.standard_normal((5, 3)).astype(dtype)]
        opt = DENSE_TORCH[name](be)
        for _ in range(3):
            gs = [(rng.standard_normal(w.shape) * 10.0 ** rng.uniform(-3, 1, w.shape)).astype(
                dtype) for w in ws]
            opt.apply_gradients(list(zip(gs, ws)))
        out[be] = ws + [np.array(s) for s in opt._slots.values() for s in s]
    assert ran and all(ran)
    for a, b in zip(out["cpu"], out["reference"]):
        np.testing.assert_array_equal(a, b)


@needs_mkl
def test_sparse_rows_without_mkls_address_take_the_host_step(monkeypatch):
    from refopt.executors import cpu

    monkeypatch.setattr(_mkl, "mkl_address", lambda dtype: None)
    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    make = SPARSE_TORCH["Adagrad"]("torch")
    w_cpu, _ = sparse_run(make, F32, "cpu", steps=2)
    assert ran and not any(ran)
    np.testing.assert_array_equal(w_cpu, sparse_run(make, F32, "reference", steps=2)[0])


@needs_mkl
def test_the_knob_says_where_the_root_comes_from():
    v = np.random.default_rng(0).uniform(0.0, 10.0, 4096).astype(F32)
    mkl, ieee = _mkl.mkl_sqrt(v), np.sqrt(v)
    assert (mkl != ieee).any()  # MKL's root is not correctly rounded
    torch, fused = PRESETS["torch"], PRESETS["torch_fused"]
    np.testing.assert_array_equal(_sqrt.convention_sqrt(v, torch), mkl)
    np.testing.assert_array_equal(_sqrt.convention_sqrt(v, fused, fused_kernel=True), ieee)
    np.testing.assert_array_equal(_sqrt.convention_sqrt(v, fused), mkl)  # for-loop optimizers
    np.testing.assert_array_equal(_sqrt.convention_sqrt(v, PRESETS["tf_keras"]), ieee)
    half = v.astype(np.float16)
    np.testing.assert_array_equal(_sqrt.convention_sqrt(half, torch), np.sqrt(half))
    # which optimizers leave the fast path
    assert _sqrt.optimizer_takes_mkl_sqrt(refopt.Adam(convention="torch"))
    assert not _sqrt.optimizer_takes_mkl_sqrt(refopt.Adam(convention="torch_fused"))
    assert _sqrt.optimizer_takes_mkl_sqrt(refopt.LazyAdam(convention="torch_fused"))
    assert not _sqrt.optimizer_takes_mkl_sqrt(refopt.SGD(convention="torch"))


def test_without_mkl_a_warning_and_the_correctly_rounded_root(monkeypatch):
    monkeypatch.setattr(_mkl, "mkl_available", lambda: False)
    monkeypatch.setattr(_sqrt, "_warned", False)
    v = np.array([2.0, 3.0, 5.0], F32)
    with pytest.warns(RuntimeWarning, match=r"sqrt='mkl'.*torch or the `mkl` wheel"):
        out = _sqrt.convention_sqrt(v, PRESETS["torch"])
    np.testing.assert_array_equal(out, np.sqrt(v))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        _sqrt.convention_sqrt(v, PRESETS["torch"])


def test_loop_moments_have_no_fused_tail():
    # 13 float32 elements: 8 in a vector, 5 in the fused kernel's scalar tail, whose v is
    # contracted as fma(v, b2, (c2*g)*g); the for-loop's addcmul is fma(c2*g, g, v*b2) on
    # every element (checked against torch 2.13: exp_avg_sq.mul_(b2).addcmul_(g, g, value))
    from refopt.reference.variants import fma

    rng = np.random.default_rng(2)
    w = rng.standard_normal(13).astype(F32)
    m, v = rng.standard_normal(13).astype(F32), rng.uniform(0, 2, 13).astype(F32)
    g = rng.standard_normal(13).astype(F32) * F32.type(30)
    conv = get_convention("torch", sqrt="ieee")
    opt = refopt.Adam(0.01, convention=conv, backend="reference")
    opt.build([w])
    opt.get_slot(w, "m")[...] = m
    opt.get_slot(w, "v")[...] = v
    opt.apply_gradients([(g, w)])
    c2, b2 = F32.type(1 - 0.999), F32.type(0.999)
    np.testing.assert_array_equal(opt.get_slot(w, "v"), fma(c2 * g, g, v * b2))


@needs_mkl
@pytest.mark.filterwarnings("ignore::refopt.executors.cuda.HostStepWarning")
def test_cuda_computes_mkls_root_on_the_host():
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("needs numba's CUDA simulator or an NVIDIA GPU")
    w_ref, _ = adam_l2("torch")
    w0, gs = inputs()
    w = kc.to_device(w0)
    opt = refopt.Adam(learning_rate=0.01, weight_decay=0.1, convention="torch",
                      backend="cuda")
    for g in gs:
        opt.apply_gradients([(kc.to_device(g), w)])
    np.testing.assert_array_equal(w.copy_to_host(), w_ref)
    assert list(opt._state.fallbacks.values()) == [4]
    assert "MKL" in next(iter(opt._state.fallbacks))


@needs_mkl
def test_rmsprop_is_torchs_for_loop_value():
    # torch.optim.RMSprop(lr=0.1, alpha=0.99, eps=1e-8), w0 [1, -2, 0.5], three gradients
    # (torch 2.13.0+cpu, AVX2); the catalogue note prints [0.160026133, ..., -0.39184162]
    w = np.array([1.0, -2.0, 0.5], F32)
    opt = refopt.RMSprop(learning_rate=0.1, rho=0.99, epsilon=1e-8, convention="torch",
                         backend="reference")
    for g in ([0.3, -0.2, 0.7], [-0.1, 0.4, 0.2], [0.05, 0.05, -0.3]):
        opt.apply_gradients([(np.array(g, F32), w)])
    np.testing.assert_array_equal(
        w, np.array([0.16002607345581055, -2.0070974826812744, -0.39184173941612244], F32))


def test_adapter_refuses_fused_that_contradicts_the_convention():
    torch = pytest.importorskip("torch")
    import refopt.torch as rt

    p = [torch.nn.Parameter(torch.ones(3))]
    with pytest.raises(ValueError, match="contradicts"):
        rt.Adam(p, lr=0.1, fused=True, convention="torch")
    with pytest.raises(ValueError, match="contradicts"):
        rt.Adam(p, lr=0.1, fused=False, convention="torch_fused")
    with pytest.raises(TypeError, match="fused"):
        rt.Adam(p, lr=0.1, fused="yes")
    assert rt.Adam(p, lr=0.1, fused=True, convention="torch_fused") is not None


@needs_mkl
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), optimizer=st.sampled_from(["Adam", "AdamW", "Adagrad", "RMSprop",
                                                  "LazyAdam"]))
def test_mkl_root_kernels_are_the_reference_property(data, optimizer):
    # drawn trajectories under "torch" (MKL's root; the Root kernels where the rule declares
    # it, the staged step otherwise): cpu equals the reference on params and every slot
    from refopt.testing import strategies as rst
    from refopt.testing.trajectory import run_reference

    t = data.draw(rst.trajectories(optimizer=optimizer, convention="torch", max_steps=3,
                                   sparse=optimizer in ("Adagrad", "LazyAdam"), ema=False))
    want, got = run_reference(t), run_reference(t, backend="cpu")
    for w, g in zip(want, got):
        for a, b in zip(w.params, g.params):
            np.testing.assert_array_equal(b, a)
        assert set(w.slots) == set(g.slots)
        for name in w.slots:
            for a, b in zip(w.slots[name], g.slots[name]):
                np.testing.assert_array_equal(b, a, err_msg=name)
