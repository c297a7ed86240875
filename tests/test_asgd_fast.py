# ASGD on the fast backends: the rule (refopt/rules/asgd.py) against the reference's NumPy
# (refopt/reference/asgd.py), bit for bit, params and the slot ax.
#
# - backend="cpu": the pure function refopt.kernels.cpu.asgd_update over several steps
#   (Hypothesis), and the optimizer's fused kernels with the staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import assert_bits_equal, assert_bits_equal_nan_aware, float_arrays
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SHAPES = st.sampled_from([(), (1,), (7,), (3, 5), (19,)])


def _hp(data):
    return dict(learning_rate=data.draw(st.sampled_from([0.0, 0.01, 0.3, 2.0])),
                lambd=data.draw(st.sampled_from([0.0, 1e-4, 0.1])),
                alpha=data.draw(st.sampled_from([0.75, 1.0, -0.5])),
                t0=data.draw(st.sampled_from([0.0, 2.0, 1e6])))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=SHAPES,
       step0=st.integers(1, 6))
def test_cpu_asgd_update_bit_identical(data, dtype, shape, step0):
    hp = _hp(data)
    p = data.draw(float_arrays(dtype, shape))
    ax = data.draw(float_arrays(dtype, shape))
    r_ref = r_cpu = ref.ASGDResult(p, ax, None, None)
    for step in range(step0, step0 + 3):
        g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.asgd_update(r_ref.param, g, r_ref.ax, step=step, **hp)
        r_cpu = cpu.asgd_update(r_cpu.param, g, r_cpu.ax, step=step, **hp)
        assert_bits_equal_nan_aware(r_cpu.param, r_ref.param, f"step {step} param")
        assert_bits_equal_nan_aware(r_cpu.ax, r_ref.ax, f"step {step} ax")
        assert (r_cpu.eta, r_cpu.mu) == (r_ref.eta, r_ref.mu)


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    kw = dict(learning_rate=0.1, lambd=1e-4, alpha=0.75, t0=1e6, step=1)
    with pytest.raises(ValueError, match="ASGD does not exist under convention='keras3'"):
        cpu.asgd_update(p, p, p, convention="keras3", **kw)
    with pytest.raises(ValueError, match="lambd"):
        cpu.asgd_update(p, p, p, **dict(kw, lambd=-1.0))
    r = cpu.asgd_update(p.astype(F16), p.astype(F16), p.astype(F16), **kw)
    assert r.param.dtype == F16  # the reference computes float16


def _run(backend, steps, **kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F64)]
    opt = refopt.ASGD(learning_rate=0.1, lambd=0.01, alpha=0.6, t0=1.0, backend=backend, **kw)
    for grads in steps:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, "ax").copy() for v in variables]


@pytest.mark.parametrize("kw", [{}, dict(weight_decay=0.05, clipvalue=0.5)])
def test_cpu_optimizer_is_fused_and_bit_identical(kw, monkeypatch):
    rng = np.random.default_rng(1)
    steps = [[rng.standard_normal((10, 4)).astype(F32),
              None if k == 2 else rng.standard_normal(13).astype(F64)] for k in range(6)]
    want = _run("reference", steps, **kw)
    with monkeypatch.context() as m:
        m.setattr(_staged, "compute",
                  lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
        got = _run("cpu", steps, **kw)
    for a, b in zip(got, want):
        assert_bits_equal(a, b, str(kw))


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for dt in (F16, F32, F64):
        p, g, ax = (rng.standard_normal((6, 3)).astype(dt) for _ in range(3))
        for step in (1, 4):
            kw = dict(learning_rate=0.1, lambd=0.01, alpha=0.75, t0=1.0, step=step)
            want = ref.asgd_update(p, g, ax, **kw)
            got = kc.asgd_update(p, g, ax, **kw)
            assert_bits_equal_nan_aware(got.param, want.param, f"{dt} {step} param")
            assert_bits_equal_nan_aware(got.ax, want.ax, f"{dt} {step} ax")
            assert (got.eta, got.mu) == (want.eta, want.mu)


def test_cuda_optimizer_runs_on_the_rule_drivers(monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    for kw in ({}, dict(weight_decay=0.05, use_ema=True, ema_overwrite_frequency=2)):
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        hp = dict(learning_rate=0.1, lambd=0.01, alpha=0.6, t0=0.0)
        host = refopt.ASGD(**hp, **kw)
        dev = refopt.ASGD(**hp, backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(4):
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if t == 1:
                hg[2] = dg[2] = None  # torch's per-variable steps
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                host.apply_gradients(zip(hg, hv))
                dev.apply_gradients(zip(dg, dv))
            for k, (h, d) in enumerate(zip(hv, dv)):
                assert_bits_equal_nan_aware(d.copy_to_host(), h, f"{kw} step {t} var {k}")
                assert_bits_equal_nan_aware(dev.get_slot(d, "ax").copy_to_host(),
                                            host.get_slot(h, "ax"), f"{kw} ax {k}")
        assert dev._state.fallbacks == {}, (kw, dev._state.fallbacks)
