# Ftrl on the fast backends: the rule (refopt/rules/ftrl.py, every form) against the
# reference's NumPy (refopt/reference/ftrl.py), bit for bit (NaN payloads aside), params and
# both slots. Where the framework calls pow (tf_keras, Keras 3, another power, one-element
# rows) the CPU rule calls the C library's pow (refopt.rules.ops.cpow) as the reference does;
# CUDA has no such pow, so there the step stays the reference's (host step, HostStepWarning).
#
# - backend="cpu": the pure function refopt.kernels.cpu.ftrl_update over several steps
#   (Hypothesis: dense and sparse gradients, float32/float64), and the optimizer's fused
#   kernels with the staged NumPy path made to fail.
# - backend="cuda" on numba's CUDA simulator (tests/conftest.py): the mirror function and the
#   optimizer's rule drivers, with no host step at power 0.5 (Keras 2, TF1), the host step
#   for pow.
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_properties import assert_bits_equal_nan_aware, float_arrays, slices_for
from test_properties import cuda_or_skip as _cuda

import refopt
from refopt import IndexedSlices
from refopt.executors import staged as _staged
from refopt.kernels import cpu
from refopt.reference import ftrl as ref
from refopt.rules import ops
from refopt.rules.ftrl import ftrl_call

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FORMS = ("tf_keras", "keras3", "keras2", "tf1")
KERNELS = ("keras2", "tf1")  # the forms with a rule on every target (at power -0.5)
KERAS = ("tf_keras", "keras3")  # pow at every power: a rule on the CPU only
REG = dict(l1_regularization_strength=0.01, l2_regularization_strength=0.02,
           l2_shrinkage_regularization_strength=0.1, beta=0.1)


def _assert_results(actual, expected, what):
    for name, a, e in zip(expected._fields, actual, expected):
        assert_bits_equal_nan_aware(a, e, f"{what} {name}")


@st.composite
def ftrl_kwargs(draw):
    kw = dict(convention=draw(st.sampled_from(FORMS)),
              learning_rate=draw(st.floats(1e-3, 1.0)),
              learning_rate_power=draw(st.sampled_from([-0.5, -0.5, -0.3, -1.0, 0.0])))
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


def test_pow_rules_on_the_cpu_only():
    conv = refopt.conventions.get_convention
    if not ops.CPU_POW:
        pytest.skip("the C library's pow is not Numba's here")
    for name in FORMS:
        for power in (-0.5, -0.3):
            assert ftrl_call(F32, conv(name), learning_rate=0.1, learning_rate_power=power,
                             allow_pow=True) is not None
    assert ftrl_call(F32, conv("tf1"), learning_rate=0.1, lazy_rows=True, row_width=1,
                     allow_pow=True) is not None
    assert ftrl_call(F32, conv("tf_keras"), learning_rate=0.1, lazy_rows=True, row_width=4,
                     allow_pow=True) is None  # no lazy rows there
    for name in KERAS:  # the pow rule names the CPU as its only target
        rc = refopt.Ftrl(convention=name).update_rule(F32, 0.1, 1)
        assert rc.rule.name == "ftrl_pow" and rc.rule.targets == ("cpu",)
    rc = refopt.Ftrl(convention="tf1", learning_rate=0.1,
                     learning_rate_power=-0.3).update_rule(F64, 0.1, 1)
    assert rc.rule.targets == ("cpu",)
    assert refopt.Ftrl(convention="tf1", learning_rate=0.1).update_rule(
        F64, 0.1, 1).rule.targets == ("cpu", "cuda")  # sqrt at the default power


def _pow_inputs(dt, rng):
    ub = np.uint32 if dt == F32 else np.uint64
    fi = np.finfo(dt)
    snan = np.array([0x7F800001, 0xFFA00000] if dt == F32 else
                    [0x7FF0000000000001, 0xFFF4000000000000], ub).view(dt)
    specials = np.concatenate([np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0, -2.0, 0.35, -0.35,
         fi.smallest_subnormal, -fi.smallest_subnormal, fi.tiny, fi.tiny - fi.smallest_subnormal,
         fi.max, -fi.max, 1 + fi.eps], dt), snan])
    random_bits = rng.integers(0, np.iinfo(ub).max, 8000, dtype=ub).view(dt)
    plausible = (np.abs(rng.standard_normal(8000)) * 10.0 ** rng.integers(-6, 6, 8000)).astype(dt)
    return specials, np.concatenate([specials, random_bits, plausible])


def test_cpu_pow_op_is_the_c_librarys_pow():
    # Numba's math.pow calls powf/pow once per element (no vector library): the reference's
    # c_pow bit for bit, NaN bits included (a signalling NaN arrives at c_pow's powf
    # quietened: pow(sNaN, 0) == 1 there, and so in the op), also inside a loop that LLVM
    # vectorises around the calls.
    if not ops.CPU_POW:
        pytest.skip("the C library's pow is not Numba's here")
    from numba import njit

    @njit(error_model="numpy")
    def pows(x, y, out):
        for i in range(x.size):
            out[i] = ops.cpow(x[i], y[i])

    @njit(error_model="numpy")
    def sigma(n, g, y, lr, out):  # FTRL's (pow(n + g g) - pow(n)) / lr
        for i in range(n.size):
            out[i] = (ops.cpow(n[i] + g[i] * g[i], y) - ops.cpow(n[i], y)) / lr

    rng = np.random.default_rng(11)
    for dt in (F32, F64):
        ub = np.uint32 if dt == F32 else np.uint64
        specials, xs = _pow_inputs(dt, rng)
        exps = np.array([-0.5, -0.3, -1.0, 0.0, -0.0, 0.5, 0.3, 1.0, 2.0, 3.0, np.inf, np.nan],
                        dt)
        X = np.concatenate([np.tile(xs, exps.size), np.tile(specials, specials.size)])
        Y = np.concatenate([np.repeat(exps, xs.size), np.repeat(specials, specials.size)])
        out = np.empty_like(X)
        pows(X, Y, out)
        want = np.concatenate([ref.c_pow(xs, e) for e in exps] +
                              [ref.c_pow(specials, e) for e in specials])
        bad = np.flatnonzero(out.view(ub) != want.view(ub))
        assert bad.size == 0, [(X[k], Y[k], out[k], want[k]) for k in bad[:5]]
        assert ops.cpow(X[0], Y[0]).dtype == dt  # the Python body (the simulator's)
        for k in range(0, X.size, 997):
            assert ops.cpow(X[k], Y[k]).view(ub) == want[k].view(ub)
        n = np.abs(rng.standard_normal(4099)).astype(dt)
        g = rng.standard_normal(4099).astype(dt)
        for e in (-0.5, -0.3, -1.0, 0.0):
            y, lr = dt.type(-e), dt.type(0.05)
            out = np.empty_like(n)
            sigma(n, g, y, lr, out)
            want = (ref.c_pow(n + g * g, y) - ref.c_pow(n, y)) / lr
            assert_bits_equal_nan_aware(out, want, f"{dt} sigma {e}")


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


def _no_staged(m):
    m.setattr(_staged, "compute",
              lambda *a: (_ for _ in ()).throw(AssertionError("staged path ran")))


def _no_reference(m):  # the pure function must not fall back to the reference's step
    m.setattr(ref, "ftrl_update",
              lambda *a, **k: (_ for _ in ()).throw(AssertionError("reference ran")))


def _run_dtype(conv, backend, steps, dtype, **kw):
    steps = [[g if isinstance(g, IndexedSlices) else g.astype(dtype) for g in gs]
             for gs in steps]
    steps = [[IndexedSlices(g.values.astype(dtype), g.indices, g.dense_shape)
              if isinstance(g, IndexedSlices) else g for g in gs] for gs in steps]
    rng = np.random.default_rng(0)
    shapes = [g.dense_shape if isinstance(g, IndexedSlices) else g.shape for g in steps[0]]
    variables = [rng.standard_normal(s).astype(dtype) for s in shapes]
    opt = refopt.Ftrl(learning_rate=0.1, convention=conv, backend=backend, **kw)
    for grads in steps:
        opt.apply_gradients(zip(grads, variables))
    return variables + [opt.get_slot(v, name).copy() for v in variables
                        for name in ("accumulator", "linear")]


@pytest.mark.parametrize("conv", FORMS)
def test_cpu_optimizer_pow_forms_are_fused_and_bit_identical(conv, monkeypatch):
    # pow: tf_keras and Keras 3 at every power, the kernels at other powers (dense, rows of
    # several elements and the scalar loop of one-element rows); float32 and float64
    if not ops.CPU_POW:
        pytest.skip("the C library's pow is not Numba's here")
    powers = [(-0.5, {}), (-0.3, REG), (-1.0, {})] if conv in KERAS else [(-0.3, REG),
                                                                          (0.0, {})]
    for dtype in (F32, F64):
        for power, reg in powers:
            kw = dict(reg, learning_rate_power=power)
            cases = [dict(sparse=False)]
            if conv in KERNELS:  # lazy rows: fused too
                cases += [dict(sparse=True), dict(sparse=True, table=(12,), dense=None)]
            for case in cases:
                case = dict(case)
                sparse = case.pop("sparse")
                steps = _steps(np.random.default_rng(2), sparse, **case)
                want = _run_dtype(conv, "reference", steps, dtype, **kw)
                with monkeypatch.context() as m:
                    _no_staged(m)
                    got = _run_dtype(conv, "cpu", steps, dtype, **kw)
                for a, b in zip(got, want):
                    assert_bits_equal_nan_aware(a, b, f"{conv} {dtype} {kw} {case}")


@pytest.mark.parametrize("conv", KERAS)
def test_cpu_optimizer_keras_sparse_runs_the_rule(conv, monkeypatch):
    # tf_keras and Keras 3 densify an IndexedSlices gradient: the staged step, whose pure
    # function runs the rule on the summed dense gradient (never the reference's NumPy).
    # The "keras3" preset squares each raw occurrence instead (the reference): knob off here.
    conv = refopt.conventions.get_convention(conv, keras3_sparse_square=False)
    if not ops.CPU_POW:
        pytest.skip("the C library's pow is not Numba's here")
    for dtype, kw in ((F32, dict(learning_rate_power=-0.5)), (F64, dict(REG, clipnorm=0.5))):
        steps = _steps(np.random.default_rng(3), True)
        want = _run_dtype(conv, "reference", steps, dtype, **kw)
        with monkeypatch.context() as m:
            _no_reference(m)
            got = _run_dtype(conv, "cpu", steps, dtype, **kw)
        for a, b in zip(got, want):
            assert_bits_equal_nan_aware(a, b, f"{conv} {dtype} {kw}")


def test_cpu_pure_function_pow_forms_run_the_rule(monkeypatch):
    if not ops.CPU_POW:
        pytest.skip("the C library's pow is not Numba's here")
    rng = np.random.default_rng(4)
    shape = (6, 3)
    for dt in (F32, F64):
        ub = np.uint32 if dt == F32 else np.uint64
        specials, _ = _pow_inputs(dt, rng)
        p, g, z = (rng.standard_normal(shape).astype(dt) for _ in range(3))
        acc = np.abs(rng.standard_normal(shape)).astype(dt)
        # special values in every operand: NaN, inf, subnormals, signalling NaNs, -0.0
        P = np.concatenate([p.ravel(), specials, rng.permutation(specials)])
        G = np.concatenate([g.ravel(), rng.permutation(specials), specials])
        N = np.concatenate([acc.ravel(), np.abs(specials), specials])
        Z = np.concatenate([z.ravel(), specials, rng.permutation(specials)])
        sq = rng.integers(0, np.iinfo(ub).max, 4 * 64, dtype=ub).view(dt).reshape(4, 64)
        cases = [(p, g, acc, z), (P, G, N, Z), tuple(sq)]
        sparse = IndexedSlices(g[:4], np.array([4, 0, 4, 1]), shape)
        for conv in FORMS:
            for power in (-0.5, -0.3, -1.0, 0.0):
                for reg in ({}, REG):
                    # (the "keras3" preset's raw duplicate slices are the reference's: off)
                    c = (refopt.conventions.get_convention(conv, keras3_sparse_square=False)
                         if conv == "keras3" else conv)
                    kw = dict(reg, learning_rate=0.1, learning_rate_power=power, convention=c)
                    grads = cases + [(p, sparse, acc, z)]
                    if conv in KERNELS:  # one-element rows: the scalar loop
                        grads.append((p[:, :1].copy(), IndexedSlices(
                            g[:4, :1].copy(), np.array([4, 0, 4, 1]), (6, 1)),
                            acc[:, :1].copy(), z[:, :1].copy()))
                    for args in grads:
                        want = ref.ftrl_update(*args, **kw)
                        with monkeypatch.context() as m:
                            _no_reference(m)
                            got = cpu.ftrl_update(*args, **kw)
                        _assert_results(got, want, f"{conv} {dt} {kw}")


# --------------------------------------------------------------------------- cuda (simulator)
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


@pytest.mark.parametrize("conv", ["tf_keras", "tf1"])
def test_cuda_pow_forms_take_the_host_step(conv):
    kc = _cuda()
    rng = np.random.default_rng(6)
    kw = dict(learning_rate=0.1, convention=conv,
              learning_rate_power=-0.5 if conv == "tf_keras" else -0.3)
    init = rng.standard_normal((5, 3)).astype(F32)
    host = refopt.Ftrl(**kw)
    dev = refopt.Ftrl(backend="cuda", **kw)
    assert "cuda" not in dev.update_rule(F32, 0.1, 1).rule.targets
    hv, dv = init.copy(), kc.to_device(init)
    g = rng.standard_normal((5, 3)).astype(F32)
    host.apply_gradients([(g, hv)])
    from refopt.executors.cuda import HostStepWarning

    with pytest.warns(HostStepWarning):
        dev.apply_gradients([(kc.to_device(g), dv)])
    assert_bits_equal_nan_aware(dv.copy_to_host(), hv, conv)
    assert dev._state.fallbacks


def test_ptx_audit_never_compiles_the_pow_rule():
    pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    from refopt.kernels.cuda import ptx

    names = {v[1].name for v in ptx.rule_variants(F32) if v[1].name.startswith("ftrl")}
    assert names == {"ftrl"}, names
