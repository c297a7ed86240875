# RAdam on the fast backends: the rule (refopt/rules/radam.py) against the reference's NumPy
# (refopt/reference/radam.py), bit for bit, under both conventions.
#
# - backend="cpu": the pure function refopt.kernels.cpu.radam_update over several steps
#   (Hypothesis: dense gradients, any moments, float32/float64, steps on both sides of the
#   rectification threshold), and the optimizer's fused kernels, with the staged NumPy path
#   made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers.
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import assert_bits_equal, float_arrays, learning_rates
from test_properties import assert_bits_equal_nan_aware as _assert_nan_aware
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import reference as ref
from refopt.conventions import get_convention
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
CONVENTIONS = ("torch", "optax")


def _rules(conv):
    """torch's for-loop form with IEEE's root (MKL's is the host step: test_torch_loop.py)."""
    return get_convention(conv, sqrt="ieee") if conv == "torch" else conv


def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal(a, e, f"{what} {name}")


# --------------------------------------------------------------------------- cpu
@given(data=st.data(), dtype=st.sampled_from([F32, F64]),
       shape=st.sampled_from([(0,), (3,), (2, 5)]), conv=st.sampled_from(CONVENTIONS),
       step=st.integers(1, 12))
def test_cpu_radam_update_bit_identical_every_form(data, dtype, shape, conv, step):
    kw = dict(learning_rate=data.draw(learning_rates, label="lr"),
              beta_1=data.draw(st.sampled_from([0.9, 0.4, 0.0])),
              beta_2=data.draw(st.sampled_from([0.999, 0.99, 0.5])),
              epsilon=data.draw(st.sampled_from([1e-8, 0.0, 1e-3])), convention=conv)
    if conv == "optax":
        kw.update(epsilon_root=data.draw(st.sampled_from([0.0, 1e-8])),
                  threshold=data.draw(st.sampled_from([5.0, 3.0])))
    p = data.draw(float_arrays(dtype, shape))
    m = data.draw(float_arrays(dtype, shape))
    v = data.draw(float_arrays(dtype, shape, nonneg=True))
    r_ref = r_cpu = ref.RAdamResult(p, m, v)
    for t in range(step, step + 2):
        g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.radam_update(r_ref.param, g, r_ref.m, r_ref.v, step=t, **kw)
        r_cpu = cpu.radam_update(r_cpu.param, g, r_cpu.m, r_cpu.v, step=t, **kw)
        _assert_results(r_cpu, r_ref, f"{conv} step {t}")


def _run(conv, backend, kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F64)]
    lr = dict(learning_rate=0.05)
    opt = refopt.RAdam(convention=_rules(conv), backend=backend, **lr, **kw)
    for t in range(8):  # rectified from step 6 on
        grads = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F64)]
        if t == 2 and conv == "torch":
            grads[1] = None  # torch's per-variable step counts
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, s).copy() for v in variables for s in ("m", "v")]


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_optimizer_is_fused_and_bit_identical(conv, monkeypatch):
    cases = [dict(beta_2=0.99)]
    if conv == "torch":
        cases += [dict(weight_decay=0.1),
                  dict(weight_decay=0.1, decoupled_weight_decay=True, use_ema=True)]
    else:
        cases += [dict(threshold=3.0, epsilon_root=1e-8)]
    for kw in cases:
        want = _run(conv, "reference", kw)
        with monkeypatch.context() as m:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", kw)
        for a, b in zip(got, want):
            assert_bits_equal(a, b, f"{conv} {kw}")


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (np.float16, F32, F64):
            p, g, m = (rng.standard_normal((6, 3)).astype(dt) for _ in range(3))
            v = np.abs(rng.standard_normal((6, 3))).astype(dt)
            for step in (2, 7):
                kw = dict(learning_rate=0.1, convention=conv, step=step)
                want = ref.radam_update(p, g, m, v, **kw)
                got = kc.radam_update(p, g, m, v, **kw)
                for x, y, name in zip(got, want, want._fields):
                    _assert_nan_aware(x, y, f"{conv} {dt} step {step} {name}")


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    extra = [dict(beta_2=0.9)]
    if conv == "torch":
        extra.append(dict(beta_2=0.9, weight_decay=0.05, use_ema=True))
    for kw in extra:
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.RAdam(learning_rate=0.1, convention=_rules(conv), **kw)
        dev = refopt.RAdam(learning_rate=0.1, convention=_rules(conv), backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(3):  # beta_2 = 0.9: rho_inf = 19, rectified from step 2
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if t == 1:
                hg[2] = dg[2] = None
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                host.apply_gradients(zip(hg, hv))
                dev.apply_gradients(zip(dg, dv))
            for k, (h, d) in enumerate(zip(hv, dv)):
                _assert_nan_aware(d.copy_to_host(), h, f"{conv} {kw} step {t} var {k}")
                for s in ("m", "v"):
                    _assert_nan_aware(dev.get_slot(d, s).copy_to_host(), host.get_slot(h, s),
                                      f"{conv} {kw} {s} {k}")
        assert dev._state.fallbacks == {}, (conv, kw, dev._state.fallbacks)
