# Adagrad on the fast backends: the rule (refopt/rules/adagrad.py) against the reference's
# NumPy (refopt/reference/adagrad.py), bit for bit, under every convention.
#
# - backend="cpu": the pure function refopt.kernels.cpu.adagrad_update over several steps
#   (Hypothesis: dense and sparse gradients, any accumulator, float32/float64), and the
#   optimizer's fused kernels, with the staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import (
    adagrad_call,
    assert_bits_equal,
    float_arrays,
    slices_for,
    table_shapes,
)
from test_properties import assert_bits_equal_nan_aware as _assert_nan_aware
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt.conventions import get_convention
from refopt import IndexedSlices
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
CONVENTIONS = ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax")
LAZY = ("tf_keras", "keras3", "keras2", "tf1", "torch")  # keras3: the same bits (see class)

def _rules(conv):
    """The convention with Keras 3's raw duplicate slices off (the "keras3" preset computes
    them on the host: the reference's per-occurrence step); the rule drivers' sparse forms."""
    if conv == "torch":  # the rule's torch form: MKL's root is the host step (test_torch_loop)
        return get_convention(conv, sqrt="ieee")
    return get_convention(conv, keras3_sparse_square=False) if conv == "keras3" else conv



def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal(a, e, f"{what} {name}")


# --------------------------------------------------------------------------- cpu
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=table_shapes,
       n_steps=st.integers(1, 3))
def test_cpu_adagrad_update_bit_identical_every_form(data, dtype, shape, n_steps):
    kw, acc = data.draw(adagrad_call(dtype, shape))
    p = data.draw(float_arrays(dtype, shape))
    r_ref = r_cpu = ref.AdagradResult(p, acc)
    sparse_ok = not str(kw["convention"]).startswith("optax")  # its three jit modes
    for _ in range(n_steps):
        if sparse_ok and data.draw(st.booleans()):
            g = data.draw(slices_for(shape, dtype))
        else:
            g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.adagrad_update(r_ref.param, g, r_ref.accumulator, **kw)
        r_cpu = cpu.adagrad_update(r_cpu.param, g, r_cpu.accumulator, **kw)
        _assert_results(r_cpu, r_ref, str(kw["convention"]))


def test_cpu_pure_function_checks_like_the_reference():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="no epsilon"):
        cpu.adagrad_update(p, p, p, learning_rate=0.1, epsilon=1e-7, convention="tf1")
    with pytest.raises(TypeError, match="optax"):
        cpu.adagrad_update(p, IndexedSlices(p[:1], [0], (3,)), p, learning_rate=0.1,
                           epsilon=1e-7, convention="optax")
    r = cpu.adagrad_update(p.astype(F16), p.astype(F16), p.astype(F16), learning_rate=0.1,
                           epsilon=1e-7)  # float16: the reference computes it
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
    opt = refopt.Adagrad(learning_rate=0.1, convention=_rules(conv), backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, "accumulator").copy() for v in variables]


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_optimizer_is_fused_and_bit_identical(conv, monkeypatch):
    # dense steps of every form; the lazy row update of every form that takes sparse
    # gradients (TF1's row form depends on the rows' width: a table alone, then a 1-D one)
    cases = [dict(sparse=False)]
    if conv in LAZY:
        cases.append(dict(sparse=True, dense=None) if conv == "tf1" else dict(sparse=True))
    if conv == "tf1":
        cases.append(dict(sparse=True, table=(12,), dense=None))
    extra = dict(weight_decay=0.01) if conv == "torch" else {}
    for case in cases:
        sparse = case.pop("sparse")
        steps = _steps(np.random.default_rng(1), sparse, **case)
        kw = {} if sparse else extra
        want = _run(conv, "reference", steps, **case, **kw)
        with monkeypatch.context() as m:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", steps, **case, **kw)
        for a, b in zip(got, want):
            assert_bits_equal(a, b, f"{conv} sparse={sparse}")


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (F16, F32, F64):
            p, g = (rng.standard_normal((6, 3)).astype(dt) for _ in range(2))
            acc = np.abs(rng.standard_normal((6, 3))).astype(dt)
            kw = dict(learning_rate=0.1, epsilon=None if conv == "tf1" else 1e-7,
                      convention=_rules(conv))
            grads = [g]
            if conv != "optax":
                grads.append(IndexedSlices(g[:3], np.array([4, 0, 4]), (6, 3)))
            for grad in grads:
                want = ref.adagrad_update(p, grad, acc, **kw)
                got = kc.adagrad_update(p, grad, acc, **kw)
                for x, y, name in zip(got, want, want._fields):
                    _assert_nan_aware(x, y, f"{conv} {dt} {type(grad).__name__} {name}")


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    extra = [{}, dict(clipnorm=0.5)]
    if conv in ("tf_keras", "keras3", "torch"):
        extra.append(dict(use_ema=True, ema_overwrite_frequency=2))
    if conv == "tf_keras":  # the decay covers every row: the dense step on the densified rows
        extra.append(dict(weight_decay=0.05))
    for kw in extra:
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Adagrad(learning_rate=0.1, convention=_rules(conv), **kw)
        dev = refopt.Adagrad(learning_rate=0.1, convention=_rules(conv), backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(3):
            hg = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
            dg = [kc.to_device(g) for g in hg]
            if conv != "optax":  # a sparse gradient with a duplicate row
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
                _assert_nan_aware(dev.get_slot(d, "accumulator").copy_to_host(),
                                  host.get_slot(h, "accumulator"), f"{conv} {kw} acc {k}")
        assert dev._state.fallbacks == {}, (conv, kw, dev._state.fallbacks)
