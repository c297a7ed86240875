# Nadam on the fast backends: the rule (refopt/rules/nadam.py) against the reference's
# NumPy (refopt/reference/nadam.py), bit for bit, under every convention that has Nadam.
#
# - backend="cpu": the pure function refopt.kernels.cpu.nadam_update over several steps
#   (Hypothesis: dense gradients and, where the framework takes them, sparse ones; any
#   moments; float32/float64), and the optimizer's fused kernels, with the staged NumPy path
#   made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import (
    assert_bits_equal,
    assert_bits_equal_nan_aware,
    float_arrays,
    slices_for,
    table_shapes,
)
from test_properties import assert_bits_equal_nan_aware as _assert_nan_aware
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import IndexedSlices
from refopt import reference as ref
from refopt.conventions import get_convention
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
CONVENTIONS = ("tf_keras", "keras3", "keras2", "torch", "optax")
SPARSE = ("tf_keras", "keras3", "keras2")

def _rules(conv):
    """The convention with Keras 3's raw duplicate slices off (the "keras3" preset computes
    them on the host: the reference's per-occurrence step); the rule drivers' sparse forms."""
    if conv == "torch":  # the rule's torch form: MKL's root is the host step (test_torch_loop)
        return get_convention(conv, sqrt="ieee")
    return get_convention(conv, keras3_sparse_square=False) if conv == "keras3" else conv



def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal(a, e, f"{what} {name}")


@st.composite
def nadam_kwargs(draw):
    conv = draw(st.sampled_from(CONVENTIONS))
    if conv == "keras3" and draw(st.booleans()):
        conv = get_convention("keras3", keras3_sparse_square=True)
    beta = st.floats(0.0, 0.9999)
    name = getattr(conv, "name", conv)
    # beta_1 both sides of 0.5: torch's lerp takes its other FMA from a weight of 0.5 on
    kw = dict(convention=conv, learning_rate=draw(st.floats(0.0, 1.0)), beta_1=draw(beta),
              beta_2=draw(beta), epsilon=draw(st.sampled_from([0.0, 1e-8, 1e-7, 1e-3])),
              step=draw(st.integers(1, 50)))
    if name == "torch":
        kw["momentum_decay"] = draw(st.sampled_from([None, 0.0, 0.05]))
    elif name != "optax" and draw(st.booleans()):  # the Keras product in another dtype
        kw["product_dtype"] = draw(st.sampled_from([F32, F64]))
    return kw


# --------------------------------------------------------------------------- cpu
@settings(max_examples=30)
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=table_shapes,
       n_steps=st.integers(1, 3))
def test_cpu_nadam_update_bit_identical_every_form(data, dtype, shape, n_steps):
    kw = data.draw(nadam_kwargs())
    p = data.draw(float_arrays(dtype, shape))
    m = data.draw(float_arrays(dtype, shape))
    v = data.draw(float_arrays(dtype, shape, nonneg=True))
    r_ref = r_cpu = ref.NadamResult(p, m, v)
    name = getattr(kw["convention"], "name", kw["convention"])
    for _ in range(n_steps):
        if name in SPARSE and data.draw(st.booleans()):
            g = data.draw(slices_for(shape, dtype))
        else:
            g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.nadam_update(r_ref.param, g, r_ref.m, r_ref.v, **kw)
        r_cpu = cpu.nadam_update(r_cpu.param, g, r_cpu.m, r_cpu.v, **kw)
        _assert_results(r_cpu, r_ref, name)
        kw["step"] += 1


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_nonfinite_gradients_every_form(conv):
    w = np.linspace(-1, 1, 8).astype(F32)
    g = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0, -2.0, 3e38], F32)
    m = np.array([0.1, np.nan, 0.3, -0.2, 0.0, np.inf, 1.0, 2.0], F32)
    v = np.array([1.0, 2.0, np.inf, np.nan, 0.0, 1.0, 0.5, 3e38], F32)
    kw = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=2,
              convention=conv)
    for grad in (g, g[::-1].copy()):
        want = ref.nadam_update(w, grad, m, v, **kw)
        got = cpu.nadam_update(w, grad, m, v, **kw)
        for a, b, name in zip(got, want, want._fields):
            assert_bits_equal_nan_aware(a, b, f"{conv} {name}")


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    kw = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1)
    with pytest.raises(ValueError, match="has no Nadam"):
        cpu.nadam_update(p, p, p, p, convention="tf1", **kw)
    with pytest.raises(TypeError, match="no sparse gradient"):
        cpu.nadam_update(p, IndexedSlices(p[:1], [0], (3,)), p, p, convention="torch", **kw)
    r = cpu.nadam_update(*(p.astype(F16),) * 4, **kw)  # float16: the reference computes it
    assert r.param.dtype == F16


def _steps(rng, sparse, table=(10, 4), dense=(13,)):
    out = []
    for _ in range(3):
        if sparse:
            idx = rng.integers(0, table[0], 6)
            g0 = IndexedSlices(rng.standard_normal((6,) + table[1:]).astype(F32), idx, table)
        else:
            g0 = rng.standard_normal(table).astype(F32)
        out.append([g0, rng.standard_normal(dense).astype(F32)])
    return out


def _run(conv, backend, steps, **kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F32)]
    opt = refopt.Nadam(learning_rate=0.1, convention=_rules(conv), backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, s).copy() for v in variables for s in ("m", "v")]


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_optimizer_is_fused_and_bit_identical(conv, monkeypatch):
    # dense steps of every form (torch with its two weight decays, beta_1 on both sides of
    # lerp's 0.5, a momentum_decay)
    cases = [(False, {})]
    if conv == "torch":
        cases += [(False, dict(weight_decay=0.01, momentum_decay=0.05)),
                  (False, dict(weight_decay=0.01, decoupled_weight_decay=True, beta_1=0.3))]
    if conv == "tf_keras":
        cases.append((False, dict(weight_decay=0.01, clipnorm=0.5)))
    for sparse, kw in cases:
        steps = _steps(np.random.default_rng(1), sparse)
        want = _run(conv, "reference", steps, **kw)
        with monkeypatch.context() as m:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", steps, **kw)
        for a, b in zip(got, want):
            assert_bits_equal(a, b, f"{conv} sparse={sparse} {kw}")


@pytest.mark.parametrize("conv", SPARSE)
def test_cpu_optimizer_non_lazy_sparse_is_the_references(conv):
    # the whole-table updates (Keras 3: its dense step) take the staged path
    steps = _steps(np.random.default_rng(2), True)
    for a, b in zip(_run(conv, "cpu", steps), _run(conv, "reference", steps)):
        assert_bits_equal(a, b, conv)


def test_cpu_mixed_dtypes_use_the_first_variables_product(monkeypatch):
    # the Keras forms' product lives in var_list[0]'s dtype (float32 here) on every backend
    for conv in ("keras3", "tf_keras", "keras2"):
        out = []
        for backend in ("reference", "cpu"):
            rng = np.random.default_rng(3)
            vs = [rng.standard_normal(5).astype(F32), rng.standard_normal(7).astype(F64)]
            opt = refopt.Nadam(learning_rate=0.1, convention=_rules(conv), backend=backend)
            for _ in range(3):
                opt.apply_gradients([(rng.standard_normal(5).astype(F32), vs[0]),
                                     (rng.standard_normal(7).astype(F64), vs[1])])
            out.append(vs)
        for a, b in zip(*out):
            assert_bits_equal(a, b, conv)


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (F16, F32, F64):
            p, g, m = (rng.standard_normal((6, 3)).astype(dt) for _ in range(3))
            v = np.abs(rng.standard_normal((6, 3))).astype(dt)
            kw = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=3,
                      convention=_rules(conv))
            grads = [g]
            if conv in SPARSE:
                grads.append(IndexedSlices(g[:3], np.array([4, 0, 4]), (6, 3)))
            for grad in grads:
                want = ref.nadam_update(p, grad, m, v, **kw)
                got = kc.nadam_update(p, grad, m, v, **kw)
                for x, y, name in zip(got, want, want._fields):
                    _assert_nan_aware(x, y, f"{conv} {dt} {type(grad).__name__} {name}")


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    extra = [{}]
    if conv in ("tf_keras", "keras3", "torch"):
        extra.append(dict(clipnorm=0.5, use_ema=True, ema_overwrite_frequency=2))
    if conv == "torch":
        extra.append(dict(weight_decay=0.01, decoupled_weight_decay=True))
    for kw in extra:
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Nadam(learning_rate=0.1, convention=_rules(conv), **kw)
        dev = refopt.Nadam(learning_rate=0.1, convention=_rules(conv), backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(3):
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if conv == "keras3":  # a sparse gradient with a duplicate row: densified
                vals = rng.standard_normal((4, 3)).astype(F64)
                hg[1] = dg[1] = IndexedSlices(vals, np.array([4, 0, 4, 1]), (5, 3))
            if t == 1:
                hg[2] = dg[2] = None  # torch's per-variable steps
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
