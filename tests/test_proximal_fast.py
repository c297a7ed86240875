# TF1's proximal optimizers on the fast backends: the rules (refopt/rules/proximal.py) against
# the reference's NumPy (refopt/reference/proximal.py), bit for bit.
#
# - backend="cpu": the pure functions (Hypothesis: dense and sparse gradients with duplicates,
#   tables of every row width, any accumulator > 0, l1/l2 on or off, float32/float64), and the
#   optimizers' fused kernels (the lazy-rows kernel for sparse steps) with the staged NumPy
#   path made to fail where a rule exists.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror functions and the
#   optimizers' rule drivers, with no host step.
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import assert_bits_equal, float_arrays, slices_for, table_shapes
from test_properties import assert_bits_equal_nan_aware as _assert_nan_aware
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import IndexedSlices
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
_STRENGTHS = st.sampled_from([0.0, 0.05, 0.5])


def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal(a, e, f"{what} {name}")


# --------------------------------------------------------------------------- cpu
@given(data=st.data(), dtype=st.sampled_from([F32, F64]), shape=table_shapes,
       n_steps=st.integers(1, 3))
def test_cpu_pure_functions_bit_identical(data, dtype, shape, n_steps):
    kw = {"learning_rate": data.draw(st.sampled_from([0.01, 0.1, 1.0])),
              "l1_regularization_strength": data.draw(_STRENGTHS),
              "l2_regularization_strength": data.draw(_STRENGTHS)}
    p = data.draw(float_arrays(dtype, shape, bound=10.0))
    acc = data.draw(float_arrays(dtype, shape, bound=10.0, nonneg=True)) + dtype.type(0.1)
    r_ref = r_cpu = ref.ProximalAdagradResult(p, acc)
    s_ref = s_cpu = ref.ProximalGradientDescentResult(p)
    for _ in range(n_steps):
        if data.draw(st.booleans()):
            g = data.draw(slices_for(shape, dtype, bound=10.0))
        else:
            g = data.draw(float_arrays(dtype, shape, bound=10.0))
        r_ref = ref.proximal_adagrad_update(r_ref.param, g, r_ref.accumulator, **kw)
        r_cpu = cpu.proximal_adagrad_update(r_cpu.param, g, r_cpu.accumulator, **kw)
        _assert_results(r_cpu, r_ref, f"ProximalAdagrad {kw}")
        s_ref = ref.proximal_gradient_descent_update(s_ref.param, g, **kw)
        s_cpu = cpu.proximal_gradient_descent_update(s_cpu.param, g, **kw)
        _assert_results(s_cpu, s_ref, f"ProximalGradientDescent {kw}")


def test_cpu_pure_functions_check_like_the_reference():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="does not exist under convention='optax'"):
        cpu.proximal_adagrad_update(p, p, p, learning_rate=0.1, convention="optax")
    with pytest.raises(ValueError, match=r"l1_regularization_strength.*>= 0"):
        cpu.proximal_gradient_descent_update(p, p, learning_rate=0.1,
                                             l1_regularization_strength=-1.0)
    r = cpu.proximal_adagrad_update(p.astype(F16), p.astype(F16), p.astype(F16),
                                    learning_rate=0.1)  # float16: the reference computes it
    assert r.param.dtype == F16


def _steps(rng, table, n=3):
    out = []
    for k in range(n):
        idx = rng.integers(0, table[0] - 1, 6)  # the last row is never touched
        idx[-1] = idx[0]  # a duplicate
        if k == 1:
            idx = idx[:0]  # an empty gradient
        vals = rng.standard_normal((idx.size,) + table[1:]).astype(F32)
        out.append([IndexedSlices(vals, idx, table), rng.standard_normal(13).astype(F32)])
    return out


def _run(cls, backend, steps, table, **kw):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal(table).astype(F32), rng.standard_normal(13).astype(F32)]
    opt = cls(learning_rate=0.1, backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, n).copy() for n in opt.slot_names for v in variables]


@pytest.mark.parametrize("cls", [refopt.ProximalAdagrad, refopt.ProximalGradientDescent])
@pytest.mark.parametrize("table, kw, fused", [
    ((10, 4), {"l1_regularization_strength": 0.05, "l2_regularization_strength": 0.1}, True),
    ((12,), {"l1_regularization_strength": 0.05}, True),  # one-element rows, no l2
    # one-element rows with l2 in float32: TF divides in double; the reference's step
    ((12, 1), {"l2_regularization_strength": 0.1}, False),
])
def test_cpu_optimizer_is_fused_and_bit_identical(cls, table, kw, fused, monkeypatch):
    steps = _steps(np.random.default_rng(1), table)
    want = _run(cls, "reference", steps, table, **kw)
    with monkeypatch.context() as m:
        if fused:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
        got = _run(cls, "cpu", steps, table, **kw)
    for a, b in zip(got, want):
        assert_bits_equal(a, b, f"{cls.__name__} {table} {kw}")
    assert got[0][-1].tolist() == want[0][-1].tolist()  # the untouched row


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_functions_are_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    kw = {"learning_rate": 0.1, "l1_regularization_strength": 0.05, "l2_regularization_strength": 0.1}
    for dt, shapes in ((F16, [(6, 3)]), (F32, [(6, 3), (6,)]), (F64, [(6,)])):
        for shape in shapes:  # (6,): one-element rows
            p, g = (rng.standard_normal(shape).astype(dt) for _ in range(2))
            acc = (np.abs(rng.standard_normal(shape)) + 0.1).astype(dt)
            for grad in (g, IndexedSlices(g[:3], np.array([4, 0, 4]), shape)):
                what = f"{dt} {shape} {type(grad).__name__}"
                want = ref.proximal_adagrad_update(p, grad, acc, **kw)
                got = kc.proximal_adagrad_update(p, grad, acc, **kw)
                for x, y, name in zip(got, want, want._fields):
                    _assert_nan_aware(x, y, f"{what} {name}")
                want = ref.proximal_gradient_descent_update(p, grad, **kw)
                got = kc.proximal_gradient_descent_update(p, grad, **kw)
                _assert_nan_aware(got.param, want.param, f"{what} sgd")


@pytest.mark.parametrize("cls", [refopt.ProximalAdagrad, refopt.ProximalGradientDescent])
def test_cuda_optimizer_runs_on_the_rule_drivers(cls, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    for kw in ({}, {"clipnorm": 0.5, "l1_regularization_strength": 0.05,
                        "l2_regularization_strength": 0.1}):
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = cls(learning_rate=0.1, backend="reference", **kw)
        dev = cls(learning_rate=0.1, backend="cuda", **kw)
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
                _assert_nan_aware(d.copy_to_host(), h, f"{kw} step {t} var {k}")
                for name in host.slot_names:
                    _assert_nan_aware(dev.get_slot(d, name).copy_to_host(),
                                      host.get_slot(h, name), f"{kw} {name} {k}")
        assert dev._state.fallbacks == {}, (kw, dev._state.fallbacks)
