# Adadelta on the fast backends: the rule (refopt/rules/adadelta.py) against the reference's
# NumPy (refopt/reference/adadelta.py), bit for bit (NaN payloads aside: the rule keeps the
# magnitude of Keras' negated step, see the rule's docstring), under every convention.
#
# - backend="cpu": the pure function refopt.kernels.cpu.adadelta_update over several steps
#   (Hypothesis: dense and sparse gradients, any state, float32/float64), and the optimizer's
#   fused kernels, with the staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import (
    assert_bits_equal_nan_aware,
    float_arrays,
    slices_for,
    table_shapes,
)
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt.conventions import get_convention
from refopt import IndexedSlices
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
CONVENTIONS = ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax")
SPARSE = ("tf_keras", "keras3", "keras2", "tf1")

def _rules(conv):
    """The convention with Keras 3's raw duplicate slices off (the "keras3" preset computes
    them on the host: the reference's per-occurrence step); the rule drivers' sparse forms."""
    if conv == "torch":  # the rule's torch form: MKL's root is the host step (test_torch_loop)
        return get_convention(conv, sqrt="ieee")
    return get_convention(conv, keras3_sparse_square=False) if conv == "keras3" else conv



def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal_nan_aware(a, e, f"{what} {name}")


# --------------------------------------------------------------------------- cpu
@settings(max_examples=30)
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=table_shapes,
       conv=st.sampled_from(CONVENTIONS), n_steps=st.integers(1, 3))
def test_cpu_adadelta_update_bit_identical_every_form(data, dtype, shape, conv, n_steps):
    kw = dict(learning_rate=data.draw(st.floats(0.0, 1.0)), rho=data.draw(st.floats(0.0, 1.0)),
              epsilon=data.draw(st.sampled_from([1e-7, 1e-6, 1e-3, 0.0])), convention=conv)
    p = data.draw(float_arrays(dtype, shape))
    eg = data.draw(float_arrays(dtype, shape, nonneg=True))
    ex = data.draw(float_arrays(dtype, shape, nonneg=True))
    r_ref = r_cpu = ref.AdadeltaResult(p, eg, ex)
    for _ in range(n_steps):
        if conv in SPARSE and data.draw(st.booleans()):
            g = data.draw(slices_for(shape, dtype))
        else:
            g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.adadelta_update(*r_ref[:1], g, *r_ref[1:], **kw)
        r_cpu = cpu.adadelta_update(*r_cpu[:1], g, *r_cpu[1:], **kw)
        _assert_results(r_cpu, r_ref, conv)


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    kw = dict(learning_rate=0.1, rho=0.9, epsilon=1e-6)
    with pytest.raises(ValueError, match="rho"):
        cpu.adadelta_update(p, p, p, p, **dict(kw, rho=2.0))
    with pytest.raises(TypeError, match="optax"):
        cpu.adadelta_update(p, IndexedSlices(p[:1], [0], (3,)), p, p, convention="optax", **kw)
    r = cpu.adadelta_update(*(p.astype(F16),) * 4, **kw)  # float16: the reference computes it
    assert r.param.dtype == F16


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
    opt = refopt.Adadelta(learning_rate=0.5, convention=_rules(conv), backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, name).copy() for v in variables
                        for name in ("accumulated_grad", "accumulated_delta")]


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_optimizer_is_fused_and_bit_identical(conv, monkeypatch):
    # dense steps of every form (with the L2 term under torch and optax) and the lazy rows of
    # Keras 2 and TF1 are fused; the non-lazy sparse steps (tf_keras' whole-table branch,
    # Keras 3's dense step on the summed gradient) take the host path (checked for equality)
    cases = [dict(sparse=False)]
    if conv in SPARSE:
        cases.append(dict(sparse=True))
    extra = dict(weight_decay=0.01) if conv in ("torch", "optax") else {}
    for case in cases:
        sparse = case.pop("sparse")
        steps = _steps(np.random.default_rng(1), sparse, **case)
        kw = {} if sparse else extra
        want = _run(conv, "reference", steps, **case, **kw)
        with monkeypatch.context() as m:
            if not (sparse and conv in ("tf_keras", "keras3")):
                m.setattr(_staged, "compute",
                          lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", steps, **case, **kw)
        for a, b in zip(got, want):
            assert_bits_equal_nan_aware(a, b, f"{conv} sparse={sparse}")


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (F16, F32, F64):
            p, g = (rng.standard_normal((6, 3)).astype(dt) for _ in range(2))
            eg = np.abs(rng.standard_normal((6, 3))).astype(dt)
            ex = (np.abs(rng.standard_normal((6, 3))) * 1e-3).astype(dt)
            kw = dict(learning_rate=0.5, rho=0.9, epsilon=1e-6, convention=_rules(conv))
            grads = [g]
            if conv in SPARSE:
                grads.append(IndexedSlices(g[:3], np.array([4, 0, 4]), (6, 3)))
            for grad in grads:
                want = ref.adadelta_update(p, grad, eg, ex, **kw)
                got = kc.adadelta_update(p, grad, eg, ex, **kw)
                _assert_results(got, want, f"{conv} {dt} {type(grad).__name__}")


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3)), (F32, F64)
    extra = [dict(clipnorm=0.5)]
    if conv in ("tf_keras", "keras3", "torch"):
        extra.append(dict(use_ema=True, ema_overwrite_frequency=2))
    if conv in ("torch", "optax"):
        extra.append(dict(weight_decay=0.05))
    for kw in extra:
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Adadelta(learning_rate=0.5, convention=_rules(conv), **kw)
        dev = refopt.Adadelta(learning_rate=0.5, convention=_rules(conv), backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(2):
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if conv in ("keras3", "keras2", "tf1"):  # a sparse gradient with a duplicate row
                vals = rng.standard_normal((4, 3)).astype(F64)
                hg[1] = dg[1] = IndexedSlices(vals, np.array([4, 0, 4, 1]), (5, 3))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Gradients do not exist")
                host.apply_gradients(zip(hg, hv))
                dev.apply_gradients(zip(dg, dv))
            for k, (h, d) in enumerate(zip(hv, dv)):
                assert_bits_equal_nan_aware(d.copy_to_host(), h, f"{conv} {kw} step {t} var {k}")
                for name in ("accumulated_grad", "accumulated_delta"):
                    assert_bits_equal_nan_aware(dev.get_slot(d, name).copy_to_host(),
                                                host.get_slot(h, name), f"{conv} {kw} {name}")
        assert dev._state.fallbacks == {}, (conv, kw, dev._state.fallbacks)
