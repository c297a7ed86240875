# Lion on the fast backends: the rule (refopt/rules/lion.py) against the reference's NumPy
# (refopt/reference/lion.py), bit for bit, under every convention.
#
# - backend="cpu": the pure function refopt.kernels.cpu.lion_update over several steps
#   (Hypothesis: dense gradients, any momentum, float32/float64, zeros and NaN included), and
#   the optimizer's fused kernels, with the staged NumPy path made to fail.
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
from refopt.conventions import get_convention
from refopt import IndexedSlices
from refopt import reference as ref
from refopt.executors import staged as _staged
from refopt.kernels import cpu

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
CONVENTIONS = ("tf_keras", "keras3", "optax")

def _rules(conv):
    """The convention with Keras 3's raw duplicate slices off (the "keras3" preset computes
    them on the host: the reference's per-occurrence step); the rule drivers' sparse forms."""
    return get_convention(conv, keras3_sparse_square=False) if conv == "keras3" else conv



def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal(a, e, f"{what} {name}")


# --------------------------------------------------------------------------- cpu
@given(data=st.data(), dtype=st.sampled_from([F32, F64]),
       shape=st.sampled_from([(0,), (3,), (2, 5)]), conv=st.sampled_from(CONVENTIONS),
       n_steps=st.integers(1, 3))
def test_cpu_lion_update_bit_identical_every_form(data, dtype, shape, conv, n_steps):
    kw = dict(learning_rate=data.draw(learning_rates, label="lr"),
              beta_1=data.draw(st.sampled_from([0.9, 0.5, 1.0])),
              beta_2=data.draw(st.sampled_from([0.99, 0.0, 0.9])), convention=conv)
    if conv == "optax":
        kw["weight_decay"] = data.draw(st.sampled_from([None, 0.0, 1e-3, 0.5]))
    p = data.draw(float_arrays(dtype, shape))
    r_ref = r_cpu = ref.LionResult(p, data.draw(float_arrays(dtype, shape)))
    for _ in range(n_steps):
        g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.lion_update(r_ref.param, g, r_ref.m, **kw)
        r_cpu = cpu.lion_update(r_cpu.param, g, r_cpu.m, **kw)
        _assert_results(r_cpu, r_ref, conv)


def test_cpu_signed_zeros_and_sparse_like_the_reference():
    z = np.array([-0.0, 0.0, np.nan, 1.0], F32)
    for conv in CONVENTIONS:
        a = ref.lion_update(-np.abs(z), -np.abs(z), -np.abs(z), learning_rate=0.1,
                            convention=conv)
        b = cpu.lion_update(-np.abs(z), -np.abs(z), -np.abs(z), learning_rate=0.1,
                            convention=conv)
        _assert_results(b, a, conv)
    t = np.arange(12, dtype=F32).reshape(4, 3)
    g = IndexedSlices(np.ones((3, 3), F32), np.array([2, 0, 2]), (4, 3))
    for conv in ("tf_keras", "keras3"):
        _assert_results(cpu.lion_update(t, g, t, learning_rate=0.1, convention=conv),
                        ref.lion_update(t, g, t, learning_rate=0.1, convention=conv), conv)
    with pytest.raises(TypeError, match="optax"):
        cpu.lion_update(t, g, t, learning_rate=0.1, convention="optax")


def _run(conv, backend, kw, sparse=False):
    rng = np.random.default_rng(0)
    variables = [rng.standard_normal((10, 4)).astype(F32), rng.standard_normal(13).astype(F64)]
    lr = dict(learning_rate=0.05)
    opt = refopt.Lion(convention=_rules(conv), backend=backend, **lr, **kw)
    for _ in range(3):
        g0 = rng.standard_normal((10, 4)).astype(F32)
        if sparse:
            g0 = IndexedSlices(g0[:5], rng.integers(0, 10, 5), (10, 4))
        opt.apply_gradients(zip([g0, rng.standard_normal(13).astype(F64)], variables))
    return variables + [opt.get_slot(v, "m").copy() for v in variables]


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cpu_optimizer_is_fused_and_bit_identical(conv, monkeypatch):
    # (optax's norm clipping over mixed dtypes takes the staged path: not here)
    cases = [dict(), dict(weight_decay=0.1)]
    if conv != "optax":
        cases += [dict(weight_decay=0.1, clipnorm=1.0),
                  dict(use_ema=True, ema_overwrite_frequency=2)]
    for kw in cases:
        want = _run(conv, "reference", kw)
        with monkeypatch.context() as m:
            m.setattr(_staged, "compute",
                      lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))
            got = _run(conv, "cpu", kw)
        for a, b in zip(got, want):
            assert_bits_equal(a, b, f"{conv} {kw}")
    if conv != "optax":  # sparse: Keras 3 fused (densified), tf_keras its host branch
        for a, b in zip(_run(conv, "cpu", {}, True), _run(conv, "reference", {}, True)):
            assert_bits_equal(a, b, f"{conv} sparse")


# --------------------------------------------------------------------------- cuda (simulator)
def test_cuda_mirror_function_is_the_references():
    kc = _cuda()
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (np.float16, F32, F64):
            p, g, m = (rng.standard_normal((6, 3)).astype(dt) for _ in range(3))
            g[0, 0] = 0
            m[0, 0] = 0
            kw = dict(learning_rate=0.1, convention=_rules(conv))
            if conv == "optax":
                kw["weight_decay"] = 1e-3
            grads = [g]
            if conv != "optax":
                grads.append(IndexedSlices(g[:3], np.array([4, 0, 4]), (6, 3)))
            for grad in grads:
                want = ref.lion_update(p, grad, m, **kw)
                got = kc.lion_update(p, grad, m, **kw)
                for x, y, name in zip(got, want, want._fields):
                    _assert_nan_aware(x, y, f"{conv} {dt} {type(grad).__name__} {name}")


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_cuda_optimizer_runs_on_the_rule_drivers(conv, monkeypatch):
    kc = _cuda()
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    shapes, dtypes = ((13,), (5, 3), (2,)), (F32, F64, F32)
    extra = [{}, dict(clipnorm=0.5, weight_decay=0.05)]
    if conv != "optax":
        extra.append(dict(use_ema=True, ema_overwrite_frequency=2))
    for kw in extra:
        rng = np.random.default_rng(0)
        init = [rng.standard_normal(s).astype(d) for s, d in zip(shapes, dtypes)]
        host = refopt.Lion(learning_rate=0.1, convention=_rules(conv), **kw)
        dev = refopt.Lion(learning_rate=0.1, convention=_rules(conv), backend="cuda", **kw)
        hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
        for t in range(3):
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
                _assert_nan_aware(dev.get_slot(d, "m").copy_to_host(),
                                  host.get_slot(h, "m"), f"{conv} {kw} m {k}")
        assert dev._state.fallbacks == {}, (conv, kw, dev._state.fallbacks)
