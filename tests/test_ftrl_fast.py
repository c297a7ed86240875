# Ftrl on the fast backends: the rule (refopt/rules/ftrl.py, TensorFlow's kernels at the power
# -0.5) against the reference's NumPy (refopt/reference/ftrl.py), bit for bit, params and both
# slots. Where the framework calls pow (tf_keras, Keras 3, another power, one-element rows)
# there is no rule and every backend computes the reference's step: checked too.
#
# - backend="cpu": the pure function refopt.kernels.cpu.ftrl_update over several steps
#   (Hypothesis: dense and sparse gradients, float32/float64), and the optimizer's fused
#   kernels with the staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import assert_bits_equal_nan_aware, float_arrays, slices_for

import refopt
from refopt import IndexedSlices
from refopt.executors import staged as _staged
from refopt.kernels import cpu
from refopt.reference import ftrl as ref
from refopt.rules.ftrl import ftrl_call

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FORMS = ("tf_keras", "keras3", "keras2", "tf1")
KERNELS = ("keras2", "tf1")  # the forms with a rule (at power -0.5)
REG = dict(l1_regularization_strength=0.01, l2_regularization_strength=0.02,
           l2_shrinkage_regularization_strength=0.1, beta=0.1)


def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal_nan_aware(a, e, f"{what} {name}")


@st.composite
def ftrl_kwargs(draw):
    kw = dict(convention=draw(st.sampled_from(FORMS)),
              learning_rate=draw(st.floats(1e-3, 1.0)),
              learning_rate_power=draw(st.sampled_from([-0.5, -0.5, -0.3])))
    if draw(st.booleans()):
        kw.update(REG)
    return kw


# --------------------------------------------------------------------------- cpu
@settings(max_examples=40, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([F32, F64]),
       shape=st.sampled_from([(5, 3), (4, 1), (6,)]), n_steps=st.integers(1, 3))
def test_cpu_ftrl_update_bit_identical_every_form(data, dtype, shape, n_steps):
    kw = data.draw(ftrl_kwargs())
    p = data.draw(float_arrays(dtype, shape, 10.0))
    acc = data.draw(float_arrays(dtype, shape, 10.0, nonneg=True))
    r_ref = r_cpu = ref.FtrlResult(p, acc, np.zeros(shape, dtype))
    for _ in range(n_steps):
        if data.draw(st.booleans()):
            g = data.draw(slices_for(shape, dtype, bound=10.0))
        else:
            g = data.draw(float_arrays(dtype, shape, 10.0))
        r_ref = ref.ftrl_update(r_ref.param, g, r_ref.accumulator, r_ref.linear, **kw)
        r_cpu = cpu.ftrl_update(r_cpu.param, g, r_cpu.accumulator, r_cpu.linear, **kw)
        _assert_results(r_cpu, r_ref, str(kw))


def test_rule_exists_only_where_the_framework_takes_sqrt():
    conv = refopt.conventions.get_convention
    assert ftrl_call(F32, conv("keras2"), learning_rate=0.1) is not None
    assert ftrl_call(F64, conv("tf1"), learning_rate=0.1, lazy_rows=True, row_width=4)
    assert ftrl_call(F32, conv("tf1"), learning_rate=0.1, lazy_rows=True, row_width=1) is None
    assert ftrl_call(F32, conv("tf1"), learning_rate=0.1, lazy_rows=True) is None
    assert ftrl_call(F32, conv("keras2"), learning_rate=0.1, learning_rate_power=-0.3) is None
    assert ftrl_call(F32, conv("tf_keras"), learning_rate=0.1) is None  # pow even at -0.5
    assert ftrl_call(F32, conv("keras3"), learning_rate=0.1) is None


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="learning_rate_power"):
        cpu.ftrl_update(p, p, p, p, learning_rate=0.1, learning_rate_power=1.0,
                        convention="tf1")
    with pytest.raises(ValueError, match="convention='torch'"):
        cpu.ftrl_update(p, p, p, p, learning_rate=0.1, convention="torch")
    h = p.astype(F16)  # float16: the reference computes it
    assert cpu.ftrl_update(h, h, h, h, learning_rate=0.1).param.dtype == F16


def _steps(rng, sparse, table=(10, 4), dense=(13,)):
    out = []
    for _ in range(3):
        if sparse:
            idx = rng.integers(0, table[0], 6)
            g0 = IndexedSlices(rng.standard_normal((6,) + table[1:]).astype(F32), idx, table)
        else:
            g0 = rng.standard_normal(table).astype(F32)
        out.append([g0] + ([rng.standard_normal(dense).astype(F32)] if dense else []))
    return out


def _run(conv, backend, steps, table=(10, 4), dense=(13,), **kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal(table).astype(F32)]
    if dense:
        variables.append(rng.standard_normal(dense).astype(F32))
    opt = refopt.Ftrl(learning_rate=0.1, convention=conv, backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, name).copy() for v in variables
                        for name in ("accumulator", "linear")]


@pytest.mark.parametrize("conv", KERNELS)
@pytest.mark.parametrize("extra", [{}, dict(REG, learning_rate_power=-0.5, clipnorm=0.5)])
def test_cpu_optimizer_is_fused_and_bit_identical(conv, extra, monkeypatch):
    # the dense kernel and the sparse kernel's rows of several elements
    for sparse in (False, True):
        steps = _steps(np.random.default_rng(1), sparse)
        want = _run(conv, "reference", steps, **extra)
        with monkeypatch.context() as m:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", steps, **extra)
        for a, b in zip(got, want):
            assert_bits_equal_nan_aware(a, b, f"{conv} sparse={sparse}")


@pytest.mark.parametrize("conv", FORMS)
def test_cpu_optimizer_without_a_rule_takes_the_references_step(conv):
    # pow: tf_keras and Keras 3 always, the kernels at -0.3 and on one-element rows
    cases = [(dict(), dict(sparse=True)), (dict(learning_rate_power=-0.3), dict(sparse=False))]
    if conv in KERNELS:
        cases.append((dict(), dict(sparse=True, table=(12,), dense=None)))
    for kw, case in cases:
        case = dict(case)
        sparse = case.pop("sparse")
        steps = _steps(np.random.default_rng(2), sparse, **case)
        want = _run(conv, "reference", steps, **case, **kw)
        got = _run(conv, "cpu", steps, **case, **kw)
        for a, b in zip(got, want):
            assert_bits_equal_nan_aware(a, b, f"{conv} {kw} sparse={sparse}")


# --------------------------------------------------------------------------- cuda (simulator)
def _cuda():
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("needs numba's CUDA simulator or an NVIDIA GPU")
    return kc


def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in FORMS:
        for dt in (F16, F32, F64):
            p, g, z = (rng.standard_normal((6, 3)).astype(dt) for _ in range(3))
            acc = np.abs(rng.standard_normal((6, 3))).astype(dt)
            for grad in (g, IndexedSlices(g[:3], np.array([4, 0, 4]), (6, 3))):
                for kw in (dict(learning_rate=0.1), dict(REG, learning_rate=0.2)):
                    want = ref.ftrl_update(p, grad, acc, z, convention=conv, **kw)
                    got = kc.ftrl_update(p, grad, acc, z, convention=conv, **kw)
                    _assert_results(got, want, f"{conv} {dt} {type(grad).__name__} {kw}")


@pytest.mark.parametrize("conv", KERNELS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    for kw in ({}, dict(REG, clipnorm=0.5)):
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Ftrl(learning_rate=0.1, convention=conv, **kw)
        dev = refopt.Ftrl(learning_rate=0.1, convention=conv, backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(3):
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            vals = rng.standard_normal((4, 3)).astype(F64)  # a duplicate row
            hg[1] = dg[1] = IndexedSlices(vals, np.array([4, 0, 4, 1]), (5, 3))
            if t == 1:
                hg[2] = dg[2] = None
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                host.apply_gradients(zip(hg, hv))
                dev.apply_gradients(zip(dg, dv))
            for k, (h, d) in enumerate(zip(hv, dv)):
                assert_bits_equal_nan_aware(d.copy_to_host(), h, f"{conv} {kw} step {t} {k}")
                for name in ("accumulator", "linear"):
                    assert_bits_equal_nan_aware(dev.get_slot(d, name).copy_to_host(),
                                                host.get_slot(h, name), f"{conv} {name} {k}")
        assert dev._state.fallbacks == {}, (conv, kw, dev._state.fallbacks)
