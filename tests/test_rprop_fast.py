# Rprop on the fast backends: the rule (refopt/rules/rprop.py) against the reference's NumPy
# (refopt/reference/rprop.py), bit for bit, params and both slots (prev, step_size).
#
# - backend="cpu": the pure function refopt.kernels.cpu.rprop_update over several steps
#   (Hypothesis, non-finite gradients included), and the optimizer's fused kernels with the
#   staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_properties import assert_bits_equal, assert_bits_equal_nan_aware
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
SHAPES = st.sampled_from([(), (1,), (7,), (3, 5), (19,)])
ETAS = st.sampled_from([(0.5, 1.2), (0.3, 1.5), (1 - 1e-9, 1.5), (1e-50, 2.0)])
STEP_SIZES = st.sampled_from([(1e-6, 50.0), (1e-3, 0.05), (0.0, 1e30)])


def _grads(dtype, shape):
    # signs matter: small integers (zeros, flips) and any float (NaN and infinities too)
    small = st.integers(-2, 2).map(float)
    return hnp.arrays(dtype, shape, elements=small | st.floats(width=8 * dtype.itemsize))


@settings(max_examples=30, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=SHAPES, etas=ETAS,
       step_sizes=STEP_SIZES)
def test_cpu_rprop_update_bit_identical(data, dtype, shape, etas, step_sizes):
    p = data.draw(hnp.arrays(dtype, shape, elements=st.floats(-10, 10, width=8 * dtype.itemsize)))
    prev, s = ref.rprop_initial_state(p, learning_rate=data.draw(st.sampled_from([0.01, 1.0])))
    r_ref = r_cpu = ref.RpropResult(p, prev, s)
    kw = dict(etas=etas, step_sizes=step_sizes)
    for step in range(4):
        g = data.draw(_grads(dtype, shape))
        r_ref = ref.rprop_update(*r_ref[:1], g, *r_ref[1:], **kw)
        r_cpu = cpu.rprop_update(*r_cpu[:1], g, *r_cpu[1:], **kw)
        for name, a, e in zip(r_ref._fields, r_cpu, r_ref):
            assert_bits_equal_nan_aware(a, e, f"step {step} {name}")


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="Rprop does not exist under convention='tf1'"):
        cpu.rprop_update(p, p, p, p, convention="tf1")
    with pytest.raises(ValueError, match="etas"):
        cpu.rprop_update(p, p, p, p, etas=(0.5, 0.9))
    r = cpu.rprop_update(*(p.astype(F16),) * 4)
    assert r.param.dtype == F16  # the reference computes float16


def _run(backend, steps, **kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F64)]
    opt = refopt.Rprop(learning_rate=0.02, etas=(0.3, 1.5), backend=backend, **kw)
    for grads in steps:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, n).copy() for n in ("prev", "step_size")
                        for v in variables]


@pytest.mark.parametrize("kw", [{}, dict(clipvalue=0.5, use_ema=True)])
def test_cpu_optimizer_is_fused_and_bit_identical(kw, monkeypatch):
    rng = np.random.default_rng(1)
    steps = [[np.sign(rng.standard_normal((10, 4))).astype(F32) * (k % 3),
              None if k == 2 else rng.standard_normal(13).astype(F64)] for k in range(6)]
    steps[3][0][0, 0] = np.nan
    want = _run("reference", steps, **kw)
    with monkeypatch.context() as m:
        m.setattr(_staged, "compute",
                  lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
        got = _run("cpu", steps, **kw)
    for a, b in zip(got, want):
        assert_bits_equal_nan_aware(a, b, str(kw))


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for dt in (F16, F32, F64):
        p = rng.standard_normal((6, 3)).astype(dt)
        g = np.sign(rng.standard_normal((6, 3))).astype(dt)
        g[0, 0] = np.nan
        prev = np.sign(rng.standard_normal((6, 3))).astype(dt)
        s = np.abs(rng.standard_normal((6, 3))).astype(dt)
        for etas in ((0.5, 1.2), (1 - 1e-9, 1.5)):
            want = ref.rprop_update(p, g, prev, s, etas=etas)
            got = kc.rprop_update(p, g, prev, s, etas=etas)
            for name, a, e in zip(want._fields, got, want):
                assert_bits_equal_nan_aware(a, e, f"{dt} {etas} {name}")


def test_cuda_optimizer_runs_on_the_rule_drivers(monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    for kw in ({}, dict(clipvalue=0.5, use_ema=True, ema_overwrite_frequency=2)):
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Rprop(learning_rate=0.05, **kw)
        dev = refopt.Rprop(learning_rate=0.05, backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(4):
            hg = [np.sign(rng.standard_normal(s)).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if t == 1:
                hg[2] = dg[2] = None
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                host.apply_gradients(zip(hg, hv))
                dev.apply_gradients(zip(dg, dv))
            for k, (h, d) in enumerate(zip(hv, dv)):
                assert_bits_equal(d.copy_to_host(), h, f"{kw} step {t} var {k}")
                for name in ("prev", "step_size"):
                    assert_bits_equal(dev.get_slot(d, name).copy_to_host(),
                                      host.get_slot(h, name), f"{kw} {name} {k}")
        assert dev._state.fallbacks == {}, (kw, dev._state.fallbacks)
