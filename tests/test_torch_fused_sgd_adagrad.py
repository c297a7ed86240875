"""torch's fused CPU SGD and Adagrad under the "torch_fused" preset (issue 12 item 4, rest).

``SGD(fused=True)`` (``FusedSGDKernel.cpp``) computes the for-loop's formulas on whole AVX2
vectors and contracts the momentum buffer the other way round on its scalar tail (the last
``numel % 8`` float32 / ``% 4`` float64 elements): knob ``sgd_momentum="torch_fused"``.
``Adagrad(fused=True)`` (``FusedAdagradKernel.cpp``) is the for-loop's formula with the
correctly rounded root (knob ``sqrt="torch_fused"``: IEEE for a dense Adagrad step). The values
below are torch 2.13.0+cpu's (AVX2), printed with ``float.hex``; the recorded trajectories are
the conformance cases ``torch/fusedk_*`` (replayed on every backend by tests/test_conformance.py
and here on the CUDA simulator).
"""

import numpy as np
import pytest

import refopt
from refopt import _mkl, conformance
from refopt.conventions import KNOB_VALUES, PRESETS, get_convention
from refopt.rules.sgd import sgd_call

F32 = np.dtype(np.float32)
needs_mkl = pytest.mark.skipif(not _mkl.mkl_available(),
                               reason="MKL's sqrt needs torch or the mkl wheel")


def _h(values):
    return np.array([float.fromhex(v) for v in values], F32)


def inputs(seed):
    """11 float32 weights (one AVX2 vector of 8 and a scalar tail of 3) and 3 gradients."""
    rng = np.random.default_rng(seed)
    w0 = rng.standard_normal(11).astype(F32)
    return w0, [rng.standard_normal(11).astype(F32) for _ in range(3)]


# torch.optim.SGD(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1, fused=True) on
# inputs(6), after 3 steps: the weights and the momentum buffer
SGD_FUSED_W = _h(["0x1.2c4956p+0", "0x1.cac0eap+0", "-0x1.35b604p+1", "0x1.0f7c8ep-4",
                  "0x1.a31be2p-1", "0x1.2ea83cp+0", "0x1.41e298p-2", "0x1.78216cp+0",
                  "0x1.8e6678p-8", "0x1.518d16p-1", "0x1.d56eb4p-3"])
SGD_FUSED_B = _h(["-0x1.61f84cp-1", "0x1.462d8p-1", "-0x1.9c7226p+0", "-0x1.bcbc6p+0",
                  "0x1.f598e6p-1", "0x1.32fdbep+0", "0x1.2e5434p+1", "-0x1.dd9e4ep-5",
                  "0x1.61ab88p+1", "-0x1.76750ep-1", "-0x1.13c28ap-3"])
# the same with fused=False (torch's for-loop): element 8 (in the fused kernel's tail) differs
SGD_LOOP_W8 = float.fromhex("0x1.8e66aap-8")

# torch.optim.Adagrad(lr=0.1, lr_decay=0.05, weight_decay=0.1, fused=True) on inputs(2),
# after 3 steps; the for-loop (MKL's sqrt) differs at elements 0, 6 and 10
ADAGRAD_FUSED_W = _h(["0x1.1a6fe4p-3", "-0x1.07e99ep-1", "-0x1.063b5p-2", "-0x1.499788p+1",
                      "0x1.9100d8p+0", "0x1.2dce4p+0", "-0x1.d83d98p-4", "0x1.7f415cp-1",
                      "0x1.e71c48p-3", "-0x1.30eb3p-1", "0x1.afc0bp-1"])
ADAGRAD_FUSED_SUM = _h(["0x1.89140ap-1", "0x1.3a561ap-2", "0x1.d9258ep+0", "0x1.05efcep-1",
                        "0x1.817d22p+2", "0x1.e9317p+1", "0x1.d58812p+1", "0x1.1ae7fep+1",
                        "0x1.3847ep+2", "0x1.4fd58cp+0", "0x1.38a634p+1"])
ADAGRAD_LOOP_W = {0: "0x1.1a6fe6p-3", 6: "-0x1.d83d9cp-4", 10: "0x1.afc0b2p-1"}


def run_sgd(conv, backend="reference"):
    w0, gs = inputs(6)
    w = w0.copy()
    opt = refopt.SGD(learning_rate=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1,
                     convention=conv, backend=backend)
    for g in gs:
        opt.apply_gradients([(g, w)])
    return w, opt.get_slot(w, "m")


def run_adagrad(conv, backend="reference"):
    w0, gs = inputs(2)
    w = w0.copy()
    opt = refopt.Adagrad(learning_rate=0.1, lr_decay=0.05, weight_decay=0.1, convention=conv,
                         backend=backend)
    for g in gs:
        opt.apply_gradients([(g, w)])
    return w, opt.get_slot(w, "accumulator")


def test_the_preset_takes_the_fused_knob_values():
    assert KNOB_VALUES["sgd_momentum"] == ("keras", "tf1", "torch", "torch_fused", "optax")
    assert PRESETS["torch_fused"].sgd_momentum == "torch_fused"
    assert PRESETS["torch"].sgd_momentum == "torch"
    with pytest.raises(ValueError, match=r"`sgd_momentum`.*Received: sgd_momentum='fused'"):
        get_convention("torch_fused", sgd_momentum="fused")


def test_the_rule_marks_the_avx2_tail():
    fused, loop = PRESETS["torch_fused"], PRESETS["torch"]
    kw = {"learning_rate": 0.1, "momentum": 0.9, "nesterov": False, "step": 2}
    assert sgd_call(np.float32, fused, **kw).tail_lanes == 8
    assert sgd_call(np.float64, fused, **kw).tail_lanes == 4
    assert sgd_call(np.float32, loop, **kw).tail_lanes == 0
    assert sgd_call(np.float16, fused, **kw).tail_lanes == 0  # no float16 tail modelled
    assert sgd_call(np.float32, fused, **{**kw, "momentum": 0.0}).tail_lanes == 0  # no buffer


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_fused_sgd_is_torchs_value(backend, monkeypatch):
    from refopt.executors import cpu

    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    w, b = run_sgd("torch_fused", backend)
    np.testing.assert_array_equal(w, SGD_FUSED_W)
    np.testing.assert_array_equal(b, SGD_FUSED_B)
    assert ran == ([True] * 3 if backend == "cpu" else [])  # the fused kernels, with a tail
    w_loop, b_loop = run_sgd("torch", backend)
    assert w_loop[8] == F32.type(SGD_LOOP_W8) != w[8]  # the for-loop has no tail
    np.testing.assert_array_equal(w_loop[:8], w[:8])
    np.testing.assert_array_equal(b_loop[:8], b[:8])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_fused_adagrad_is_torchs_value(backend, monkeypatch):
    from refopt.executors import cpu

    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    w, acc = run_adagrad("torch_fused", backend)
    np.testing.assert_array_equal(w, ADAGRAD_FUSED_W)
    np.testing.assert_array_equal(acc, ADAGRAD_FUSED_SUM)
    assert ran == ([True] * 3 if backend == "cpu" else [])  # IEEE's root: the fast path


@needs_mkl
def test_fused_adagrad_differs_from_the_loop_by_the_root_only():
    w, acc = run_adagrad("torch_fused")
    w_loop, acc_loop = run_adagrad("torch")
    np.testing.assert_array_equal(acc_loop, acc)
    assert sorted(np.flatnonzero(w_loop != w)) == sorted(ADAGRAD_LOOP_W)
    for k, v in ADAGRAD_LOOP_W.items():
        assert w_loop[k] == F32.type(float.fromhex(v))
    w_ieee, _ = run_adagrad(get_convention("torch", sqrt="ieee"))
    np.testing.assert_array_equal(w_ieee, w)


@needs_mkl
def test_sparse_adagrad_rows_stay_the_for_loop(monkeypatch):
    """torch's fused Adagrad refuses sparse gradients: the rows keep MKL's root (the CPU's
    rows_root kernel calls it)."""
    from refopt.executors import cpu
    from refopt.reference.sqrt import optimizer_takes_mkl_sqrt

    opt = refopt.Adagrad(learning_rate=0.1, convention="torch_fused", backend="cpu")
    g = refopt.IndexedSlices(np.ones((2, 3), F32), [0, 2], (4, 3))
    assert optimizer_takes_mkl_sqrt(opt, [g])
    assert not optimizer_takes_mkl_sqrt(opt, [np.ones(3, F32)])
    assert optimizer_takes_mkl_sqrt(opt)  # gradients unknown: the for-loop's, conservatively
    ran = []
    real = cpu.try_fast_step
    monkeypatch.setattr(cpu, "try_fast_step", lambda *a: ran.append(real(*a)) or ran[-1])
    w = np.arange(12, dtype=F32).reshape(4, 3)
    opt.apply_gradients([(g, w)])
    assert ran == [True]
    ref = refopt.Adagrad(learning_rate=0.1, convention="torch")
    w_ref = np.arange(12, dtype=F32).reshape(4, 3)
    ref.apply_gradients([(g, w_ref)])
    np.testing.assert_array_equal(w, w_ref)


def _entry(case_id):
    return dict(next(e for e in conformance.load_manifest() if e["id"] == case_id))


@pytest.mark.parametrize("case", ["torch/fusedk_sgd_dampening_l2_f32",
                                  "torch/fusedk_sgd_nesterov_l2_f64"])
def test_the_recorded_fused_sgd_needs_the_tail(case):
    """The golden cases are not vacuous: the for-loop's buffer (no tail) fails them."""
    entry = _entry(case)
    assert conformance.replay(entry).passed
    r = conformance.replay(dict(entry, knobs={"sgd_momentum": "torch"}))
    assert not r.passed and r.max_ulp > 0


@needs_mkl
def test_the_recorded_fused_adagrad_needs_ieees_root():
    entry = _entry("torch/fusedk_adagrad_decay_l2_f32")
    assert conformance.replay(entry).passed
    r = conformance.replay(dict(entry, knobs={"sqrt": "mkl"}))
    assert not r.passed and r.max_ulp > 0


@pytest.mark.parametrize("case", ["torch/fusedk_sgd_nesterov_l2_f32",
                                  "torch/fusedk_adagrad_decay_l2_f64"])
def test_replay_cuda(case, monkeypatch):
    """backend="cuda" on numba's simulator: the tail on the device, bit for bit."""
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("needs numba's CUDA simulator or an NVIDIA GPU")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    entry = _entry(case)
    r = conformance.replay(dict(entry, steps=3), backend="cuda")
    assert r.passed and r.tolerance_ulp == 0, r.detail


@pytest.mark.filterwarnings("error::refopt.executors.cuda.HostStepWarning")
def test_cuda_runs_the_tail_on_the_device(monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("needs numba's CUDA simulator or an NVIDIA GPU")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    w0, gs = inputs(6)
    w = kc.to_device(w0)
    opt = refopt.SGD(learning_rate=0.05, momentum=0.9, dampening=0.3, weight_decay=0.1,
                     convention="torch_fused", backend="cuda")
    for g in gs:
        opt.apply_gradients([(kc.to_device(g), w)])
    np.testing.assert_array_equal(w.copy_to_host(), SGD_FUSED_W)
    assert not opt._state.fallbacks  # the rule drivers, not the host step
