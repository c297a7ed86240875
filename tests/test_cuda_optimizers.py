"""backend="cuda": the numba-cuda kernels and the optimizers, against the reference.

Where they run: on numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set in
``tests/conftest.py`` before anything imports numba), or on a GPU when the variable is 0
(``scripts/gpu_check.sh``). Tests marked ``gpu`` need a real device and are skipped otherwise.
Without numba-cuda every test here is skipped.

Why bit-identical under the simulator: it executes each kernel's Python code with NumPy
scalars of the array dtype, so every ``+ - * /`` is the same IEEE operation, in the same
order, as the reference's NumPy array arithmetic; ``math.sqrt`` returns a Python float (the
correctly rounded double square root) which, added to a float32 ``epsilon`` under NumPy 2's
rules, is first rounded to float32: a double rounding that is exact for square roots of
float32 values. So elementwise steps are compared with ``array_equal``. Norms are not: the
mirror functions' norm kernels add fixed tiles in float64 (deterministic, more accurate) where
the reference adds in the dtype in NumPy's pairwise order, so those norms are compared within a
few ulp; the optimizers' norm clipping sums in NumPy's pairwise order (device leaves, host
tree) and is compared bit for bit.

On a real GPU the same comparisons are bit for bit too: every multiply, add and subtract in
the kernels is an explicitly rounded libdevice operation (``mul.rn``, ``add.rn``,
``sub.rn``), which NVVM does not contract into an FMA although its default ``-fma=1``
contracts plain ``a * b + c`` (``refopt.rules.ops.register_cuda``; the PTX is audited by
``tests/test_cuda_ptx.py``), and ``/`` and ``math.sqrt`` are ``div.rn`` and ``sqrt.rn``
without ``fastmath``. ``tests/conftest.py`` skips every ``gpu`` test on the simulator; each
also checks for a device itself.

Sizes are tiny and ``config.THREADS_PER_BLOCK`` is 4, so every array spans several blocks.
"""

import os
import warnings
import subprocess
import sys

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt import reference as R
from refopt.checkpoint import CheckpointError

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")

SIM = kc.simulator
ON_DEVICE = (not SIM) and kc.cuda.is_available()
gpu = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not ON_DEVICE, reason="needs an NVIDIA GPU (not the simulator)")
assert_bit_identical = np.testing.assert_array_equal  # elementwise: bit for bit, simulator or GPU


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)


def _host(a):
    return a.copy_to_host()


HP = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("ams", [False, True])
def test_adam_kernel_bit_identical(dtype, ams):
    rng = np.random.default_rng(1)
    p, g, m = (rng.standard_normal(37).astype(dtype) for _ in range(3))
    v, h = (np.abs(rng.standard_normal(37)).astype(dtype) for _ in range(2))
    D = [kc.to_device(x) for x in (p, g, m, v, h)]
    kc.adam_dense(D[0], D[1], D[2], D[3], D[4] if ams else None, step=3, weight_decay=0.1, **HP)
    r = R.adam_update(R.apply_weight_decay(p, learning_rate=0.01, weight_decay=0.1), g, m, v,
                      h if ams else None, step=3, **HP)
    for dev, ref in zip((D[0], D[2], D[3], D[4]), r):
        if ref is not None:
            assert_bit_identical(_host(dev), ref)


@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_kernel_bit_identical(nesterov):
    rng = np.random.default_rng(2)
    p, g, m = (rng.standard_normal(23).astype(np.float32) for _ in range(3))
    D = [kc.to_device(x) for x in (p, g, m)]
    kc.sgd_dense(*D, learning_rate=0.1, momentum=0.9, nesterov=nesterov)
    r = R.sgd_update(p, g, m, learning_rate=0.1, momentum=0.9, nesterov=nesterov)
    assert_bit_identical(_host(D[0]), r.param)
    assert_bit_identical(_host(D[2]), r.m)


def test_lazy_adam_rows_duplicates_summed_in_order():
    rng = np.random.default_rng(3)
    idx = np.array([5, 1, 5, 0, 5, 1, 7])
    vals = (rng.standard_normal((7, 3)) * 1e3).astype(np.float32)
    t, m = (rng.standard_normal((9, 3)).astype(np.float32) for _ in range(2))
    v = np.abs(rng.standard_normal((9, 3))).astype(np.float32)
    D = [kc.to_device(x) for x in (t, m, v)]
    kc.lazy_adam_rows(*D, None, vals, idx, step=2, **HP)
    r = R.lazy_adam_update(t, IndexedSlices(vals, idx, t.shape), m, v, step=2, **HP)
    for dev, ref in zip(D, r[:3]):
        assert_bit_identical(_host(dev), ref)


def test_clip_value_ema_decay_kernels():
    g = np.array([-3.0, -0.5, 0.0, 0.25, 2.0, np.inf, -np.inf, np.nan, 1.0], np.float32)
    out = kc.to_device(np.zeros_like(g))
    kc.clip_dense(out, kc.to_device(g), 1, 1.0)
    np.testing.assert_array_equal(_host(out), R.clip_by_value(g, 1.0))
    a, p = np.linspace(-1, 1, 11).astype(np.float64), np.linspace(2, 3, 11)
    A, P = kc.to_device(a), kc.to_device(p)
    kc.ema_dense(A, P, ema_momentum=0.9)
    assert_bit_identical(_host(A), R.ema_update(a, p, ema_momentum=0.9))
    out = kc.to_device(np.zeros_like(p))
    kc.decay_dense(out, P, learning_rate=0.1, weight_decay=0.3)
    assert_bit_identical(_host(out), R.apply_weight_decay(p, learning_rate=0.1, weight_decay=0.3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_norm_is_deterministic_and_close(dtype):
    g = np.random.default_rng(4).standard_normal(101).astype(dtype)
    G = kc.to_device(g)
    s1, s2 = kc.sumsq(G), kc.sumsq(G)
    assert s1.tobytes() == s2.tobytes()
    np.testing.assert_allclose(s1, np.sum(g * g), rtol=4 * np.finfo(dtype).eps)
    np.testing.assert_allclose(kc.sumsq(G, half=True), np.sum(g * g * dtype(0.5)),
                               rtol=4 * np.finfo(dtype).eps)


CASES = [
    (refopt.Adam, dict(learning_rate=0.01)),
    (refopt.Adam, dict(learning_rate=0.01, amsgrad=True, use_ema=True,
                       ema_overwrite_frequency=2)),
    (refopt.AdamW, dict(learning_rate=0.01, weight_decay=0.05, clipvalue=0.3)),
    (refopt.SGD, dict(learning_rate=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (refopt.SGD, dict(learning_rate=0.1, momentum=0.5, use_ema=True)),
    (refopt.LazyAdam, dict(learning_rate=0.01, weight_decay=0.1)),
]


def _run(cls, kw, dtype=np.float32, steps=3, sparse=False):
    rng = np.random.default_rng(5)
    shapes = [(6, 3), (5,)]
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]
    ref = cls(backend="reference", **kw)
    dev = cls(backend="cuda", **kw)
    hv = [x.copy() for x in init]
    dv = [kc.to_device(x) for x in init]
    for t in range(steps):
        gs = list(grads[t])
        if sparse:
            idx = np.array([4, 0, 4, 2, 4])
            vals = rng.standard_normal((5, 3)).astype(dtype)
            rg = [IndexedSlices(vals, idx, shapes[0]), gs[1]]
            dg = [IndexedSlices(vals, idx, shapes[0]), kc.to_device(gs[1])]
        else:
            rg, dg = gs, [kc.to_device(g) for g in gs]
        ref.apply_gradients(zip(rg, hv))
        assert dev.apply_gradients(zip(dg, dv)) == t + 1
        for h, d in zip(hv, dv):
            yield ("param", h, _host(d))
            for name in dev.slot_names:
                yield (name, ref.get_slot(h, name), _host(dev.get_slot(d, name)))


@pytest.mark.parametrize("cls,kw", CASES, ids=lambda c: getattr(c, "__name__", ""))
def test_optimizer_matches_reference_every_step(cls, kw):
    for name, ref, got in _run(cls, kw):
        assert_bit_identical(got, ref)


def test_lazy_adam_sparse_step_matches_reference():
    for name, ref, got in _run(refopt.LazyAdam, dict(learning_rate=0.01, amsgrad=True,
                                                      use_ema=True), sparse=True):
        assert_bit_identical(got, ref)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kw", [dict(clipnorm=0.5), dict(global_clipnorm=0.7)])
def test_norm_clipping_bit_identical_to_reference(kw, dtype):
    # The optimizers' norms are NumPy's pairwise sums (device leaves, host tree): the same
    # bits as the reference (the mirror functions' tile sums are only within a few ulp).
    for name, ref, got in _run(refopt.Adam, dict(learning_rate=0.01, **kw), dtype=dtype):
        assert_bit_identical(got, ref)


def test_float64_adam_and_finalize():
    w = kc.to_device(np.array([1.0, 2.0, 3.0]))
    opt = refopt.Adam(learning_rate=0.1, use_ema=True, ema_momentum=0.5, backend="cuda")
    opt.apply_gradients([(kc.to_device(np.array([0.1, -0.2, 0.3])), w)])
    avg = _host(opt.get_slot(w, "average"))
    opt.finalize_variable_values([w])
    np.testing.assert_array_equal(_host(w), avg)


def test_host_array_refused_with_helper_named():
    opt = refopt.Adam(backend="cuda")
    w = np.ones(3, np.float32)
    with pytest.raises(TypeError, match=r"to_device"):
        opt.apply_gradients([(np.ones(3, np.float32), w)])
    assert not opt.built
    dw = kc.to_device(w)
    with pytest.raises(TypeError, match=r"Gradient at position 0.*to_device"):
        opt.apply_gradients([(np.ones(3, np.float32), dw)])
    assert not opt.built and opt.iterations == 0


def test_bad_step_changes_nothing():
    dw = kc.to_device(np.ones(3, np.float32))
    opt = refopt.SGD(learning_rate=0.1, backend="cuda")
    opt.apply_gradients([(kc.to_device(np.ones(3, np.float32)), dw)])
    before = _host(dw)
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(kc.to_device(np.ones(4, np.float32)), dw)])
    np.testing.assert_array_equal(_host(dw), before)
    assert opt.iterations == 1


@pytest.mark.parametrize("cls,kw", [
    (refopt.Adam, dict(amsgrad=True, weight_decay=0.1, use_ema=True, clipvalue=0.8)),
    (refopt.AdamW, dict()),
    (refopt.SGD, dict(momentum=0.9, nesterov=True, weight_decay=0.05)),
    (refopt.SGD, dict(momentum=0.5, use_ema=True)),
], ids=["Adam", "AdamW", "SGD-nesterov", "SGD"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_non_lazy_sparse_updates_the_whole_table_as_the_reference(cls, kw, dtype):
    # tf-keras' non-lazy sparse update: absent rows move too (moments decay, momentum carries
    # on); duplicates are summed first; an IndexedSlices without rows still steps.
    rng = np.random.default_rng(9)
    shape = (6, 3)
    table = rng.standard_normal(shape).astype(dtype)
    dense = rng.standard_normal((4,)).astype(dtype)
    steps = [([4, 0, 4, 4], 4), ([5], 1), ([], 0), ([1, 2, 1], 3)]
    ref = cls(learning_rate=0.05, backend="reference", **kw)
    dev = cls(learning_rate=0.05, backend="cuda", **kw)
    hv = [table.copy(), dense.copy()]
    dv = [kc.to_device(table), kc.to_device(dense)]
    for t, (idx, n) in enumerate(steps):
        if t == 2:
            row5 = hv[0][5].copy()  # row 5 had a gradient in step 1 only
        vals = rng.standard_normal((n, 3)).astype(dtype)
        g = IndexedSlices(vals, np.array(idx, np.int64), shape)
        gd = rng.standard_normal((4,)).astype(dtype)
        ref.apply_gradients([(g, hv[0]), (gd, hv[1])])
        dev.apply_gradients([(g, dv[0]), (kc.to_device(gd), dv[1])])
        for h, d in zip(hv, dv):
            assert_bit_identical(_host(d), h)
            for name in dev.slot_names:
                assert_bit_identical(_host(dev.get_slot(d, name)), ref.get_slot(h, name))
    assert (hv[0][5] != row5).all()  # absent from steps 2 and 3, and it moved (momentum)


@pytest.mark.parametrize("cls,kw", [
    (refopt.Adam, dict(amsgrad=True, weight_decay=0.1, use_ema=True, clipvalue=0.8)),
    (refopt.SGD, dict(momentum=0.9, nesterov=True)),
], ids=["Adam", "SGD"])
def test_float16_matches_numpy_float16_arithmetic(cls, kw):
    # float16 runs in float32 on the device, rounded to float16 after each operation: NumPy's
    # float16 arithmetic, bit for bit, dense and sparse.
    rng = np.random.default_rng(12)
    init = [rng.standard_normal((5, 3)).astype(np.float16), np.float16([0.5, -2.0, 1e-4])]
    ref = cls(learning_rate=0.01, backend="reference", **kw)
    dev = cls(learning_rate=0.01, backend="cuda", **kw)
    hv = [x.copy() for x in init]
    dv = [kc.to_device(x) for x in init]
    for t in range(4):
        gt = IndexedSlices(rng.standard_normal((3, 3)).astype(np.float16), [4, 0, 4], (5, 3))
        gd = rng.standard_normal(3).astype(np.float16)
        ref.apply_gradients([(gt, hv[0]), (gd, hv[1])])
        dev.apply_gradients([(gt, dv[0]), (kc.to_device(gd), dv[1])])
        for h, d in zip(hv, dv):
            assert_bit_identical(_host(d), h)
            for name in dev.slot_names:
                assert_bit_identical(_host(dev.get_slot(d, name)), ref.get_slot(h, name))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_clip_by_value_keeps_numpys_sign_of_zero_per_dtype(dtype):
    # Regression: np.maximum/np.minimum return the first operand on a tie in float16 and the
    # second in float32/float64, so clipping [+0, -0] at 0 gives [+0, -0] in float16 but
    # [-0, -0] in float32/float64; the kernel first kept the float32 rule for float16.
    g = np.array([0.0, -0.0], dtype)
    want = np.maximum(np.minimum(g, dtype(0)), -dtype(0))
    expected_sign = [False, True] if dtype is np.float16 else [True, True]
    assert np.signbit(want).tolist() == expected_sign  # NumPy's rule, as stated
    got = kc.clip_by_value(g, 0.0)
    assert np.signbit(got).tolist() == expected_sign


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("sparse", [False, True])
def test_amsgrad_maximum_keeps_numpys_sign_of_zero_per_dtype(dtype, sparse):
    # Regression (breaker): np.maximum(vhat, v) with vhat = -0, v = +0 is +0 in float32/64
    # (second operand) and -0 in float16 (first); with epsilon = -0 the sign decides the
    # sign of the infinite step. The dense kernel kept the first operand in float32/64 and
    # the sparse kernel the second in float16.
    hp = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=-0.0, step=1)
    p, m = np.zeros((2, 1), dtype), np.ones((2, 1), dtype)
    v, vhat = np.zeros((2, 1), dtype), np.full((2, 1), -0.0, dtype)
    g = IndexedSlices(np.zeros((1, 1), dtype), [0], (2, 1)) if sparse else np.zeros((2, 1), dtype)
    want = R.adam_update(p, g, m, v, vhat, **hp)
    got = kc.adam_update(p, g, m, v, vhat, **hp)
    assert np.signbit(want.vhat).all() == (dtype is np.float16)
    for a, b in zip(got, want):
        assert_bit_identical(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


def test_gradient_sharing_memory_with_a_variable_is_read_before_the_step():
    # Regression (breaker): SGD with gradients that are the other variable. The reference
    # computes every update from the values before the step; cuda updated a first, then read
    # the new a as b's gradient.
    a0, b0 = np.arange(1, 5, dtype=np.float32), np.arange(5, 9, dtype=np.float32)
    ha, hb = a0.copy(), b0.copy()
    refopt.SGD(learning_rate=0.5, backend="reference").apply_gradients([(hb, ha), (ha, hb)])
    np.testing.assert_array_equal(hb, [4.5, 5.0, 5.5, 6.0])
    da, db = kc.to_device(a0), kc.to_device(b0)
    refopt.SGD(learning_rate=0.5, backend="cuda").apply_gradients([(db, da), (da, db)])
    assert_bit_identical(_host(da), ha)
    assert_bit_identical(_host(db), hb)
    # A slot as the gradient (it is written by the same kernel): the same rule.
    w, hw = kc.to_device(a0), a0.copy()
    dev, ref = (refopt.Adam(0.1, backend=b) for b in ("cuda", "reference"))
    dev.apply_gradients([(kc.to_device(b0), w)])
    ref.apply_gradients([(b0, hw)])
    dev.apply_gradients([(dev.get_slot(w, "m"), w)])
    ref.apply_gradients([(ref.get_slot(hw, "m"), hw)])
    assert_bit_identical(_host(w), hw)
    assert_bit_identical(_host(dev.get_slot(w, "v")), ref.get_slot(hw, "v"))


def test_overlapping_variables_are_refused_and_nothing_is_built():
    d = kc.to_device(np.arange(8, dtype=np.float32))
    opt = refopt.SGD(0.5, backend="cuda")
    with pytest.raises(ValueError, match="variables at positions 0 and 1 .* share device"):
        opt.apply_gradients([(kc.to_device(np.ones(4, np.float32)), d[0:4]),
                             (kc.to_device(np.ones(4, np.float32)), d[2:6])])
    assert not opt.built and opt.iterations == 0
    np.testing.assert_array_equal(_host(d), np.arange(8))
    opt.build([d[0:4], d[4:8]])  # adjacent, not overlapping: fine
    assert opt.built


def test_a_single_device_array_is_not_a_list_of_variables():
    # Regression (breaker): build() iterated a 2-D device array's rows as variables.
    d = kc.to_device(np.ones((3, 2), np.float32))
    opt = refopt.Adam(backend="cuda")
    for call in (opt.build, opt.exclude_from_weight_decay):
        with pytest.raises(TypeError, match="not a single array"):
            call(d)
    assert not opt.built


def test_cuda_errors_are_the_references_in_the_references_order():
    # Regression (breaker): dtype of an IndexedSlices (TypeError, not ValueError), and on a
    # built optimizer an unknown variable is a KeyError before the all-None check and before
    # the missing-gradient warning.
    for backend, to in (("reference", np.asarray), ("cuda", kc.to_device)):
        w, other = to(np.ones((3, 2), np.float32)), to(np.ones(2, np.float32))
        opt = refopt.Adam(0.1, backend=backend)
        with pytest.raises(TypeError, match="IndexedSlices.*dtype=float64"):
            opt.apply_gradients([(IndexedSlices(np.ones((1, 2)), [0], (3, 2)), w)])
        opt.apply_gradients([(to(np.ones((3, 2), np.float32)), w)])
        with pytest.raises(KeyError):
            opt.apply_gradients([(None, other)])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "Gradients do not exist" warning first
            with pytest.raises(KeyError):
                opt.apply_gradients([(None, w), (to(np.ones(2, np.float32)), other)])
        assert opt.iterations == 1, backend


def test_invalid_launch_config_fails_the_first_step_without_building(monkeypatch):
    # Regression (breaker): with only sparse gradients the bad value surfaced at launch time,
    # after build.
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 3)
    t = kc.to_device(np.ones((4, 2), np.float32))
    opt = refopt.LazyAdam(0.1, backend="cuda")
    with pytest.raises(ValueError, match="THREADS_PER_BLOCK must be a power of two"):
        opt.apply_gradients([(IndexedSlices(np.ones((1, 2), np.float32), [1], (4, 2)), t)])
    assert not opt.built and opt.iterations == 0
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "TENSORS_PER_LAUNCH", 0)
    with pytest.raises(ValueError, match=r"TENSORS_PER_LAUNCH must be an int in \[1, 32\]"):
        opt.apply_gradients([(kc.to_device(np.ones((4, 2), np.float32)), t)])
    assert not opt.built


def test_load_checkpoint_into_overlapping_device_variables_changes_nothing(tmp_path):
    # Regression (breaker 2): iterations was restored before build refused the overlap.
    w = kc.to_device(np.ones(5, np.float32))
    a = refopt.SGD(0.1, backend="cuda")
    a.apply_gradients([(kc.to_device(np.ones(5, np.float32)), w)])
    a.apply_gradients([(kc.to_device(np.ones(5, np.float32)), w)])
    x = kc.to_device(np.zeros(5, np.float32))
    refopt.save_checkpoint(tmp_path / "c.npz", a, [w])
    b = refopt.SGD(0.1, backend="cuda")
    with pytest.raises(ValueError, match="positions 0 and 1 .* share device memory"):
        refopt.load_checkpoint(tmp_path / "c.npz", b, [x[0:4], x[3:5]])
    assert b.iterations == 0 and not b.built
    assert (_host(x) == 0).all()


@pytest.mark.parametrize("attr,value,err", [("epsilon", None, TypeError),
                                            ("beta_1", "x", TypeError),
                                            ("ema_momentum", "x", TypeError),
                                            ("weight_decay", "x", TypeError)])
def test_hyperparameter_set_to_a_bad_value_fails_before_any_launch(attr, value, err):
    # Regression (breaker 2): the launchers convert hyperparameters at launch time, so a
    # step failed halfway (a sparse table already updated, the optimizer left built).
    results = {}
    for backend, to in (("reference", np.asarray), ("cuda", kc.to_device)):
        table, dense = to(np.ones((3, 2), np.float32)), to(np.ones(2, np.float32))
        opt = refopt.Adam(0.1, use_ema=True, weight_decay=0.1, backend=backend)
        setattr(opt, attr, value)
        grads = [(IndexedSlices(np.ones((1, 2), np.float32), [0], (3, 2)), table),
                 (to(np.ones(2, np.float32)), dense)]
        with pytest.raises(err) as info:
            opt.apply_gradients(grads)
        results[backend] = str(info.value)
        assert not opt.built and opt.iterations == 0
        host = table if backend == "reference" else _host(table)
        assert (host == 1).all(), backend
    assert results["cuda"] == results["reference"]


def test_refused_build_keeps_nothing():
    # Regression (breaker 2): variables of a refused build stayed registered.
    d = kc.to_device(np.arange(8, dtype=np.float32))
    opt, fresh = refopt.Adam(backend="cuda"), refopt.Adam(backend="cuda")
    v0, v1 = d[0:4], d[2:6]
    with pytest.raises(ValueError, match="share device memory"):
        opt.build([v0, v1])
    assert not opt.built and len(opt.variables) == len(fresh.variables) == 1  # iterations
    messages = []
    for o in (opt, fresh):
        with pytest.raises(KeyError) as info:
            o.get_slot(v0, "m")
        messages.append(str(info.value))
    assert messages[0] == messages[1]


def test_launch_config_accepts_numpy_ints_and_bounds_every_launcher(monkeypatch):
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", np.int64(4))
    g = np.ones(6, np.float32)
    assert np.array_equal(kc.clip_by_value(g, 0.5), R.clip_by_value(g, 0.5))
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 2048)
    with pytest.raises(ValueError, match=r"THREADS_PER_BLOCK must be an int in \[1, 1024\]"):
        kc.clip_by_value(g, 0.5)
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 0)  # was a ZeroDivisionError
    with pytest.raises(ValueError, match="ITEMS_PER_THREAD"):
        kc.global_norm([g])


def test_launch_grids_are_python_ints_even_from_numpy_config(monkeypatch):
    # Regression (device review): a GPU launch refuses NumPy integers in the grid (cuda.core
    # LaunchConfig), the simulator accepts them; config values may be NumPy ints.
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", np.int64(4))
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", np.int32(2))
    monkeypatch.setattr(kc.config, "MAX_BLOCKS", np.int64(3))
    seen = []

    class Record:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, launch):
            seen.append(launch)
            return self.kernel[launch]

    names = []
    wrap_rule_kernels(monkeypatch, lambda kernel, name, ks: names.append(name) or Record(kernel))
    w, t = kc.to_device(np.ones(40, np.float32)), kc.to_device(np.ones((6, 2), np.float32))
    opt = refopt.Adam(0.1, clipnorm=1.0, use_ema=True, ema_overwrite_frequency=1,
                      backend="cuda")
    opt.apply_gradients([(kc.to_device(np.ones(40, np.float32)), w),
                         (IndexedSlices(np.ones((2, 2), np.float32), [1, 4], (6, 2)), t)])
    lazy = refopt.LazyAdam(0.1, backend="cuda")
    lazy.apply_gradients([(IndexedSlices(np.ones((2, 2), np.float32), [1, 4], (6, 2)), t)])
    kc.clip_by_value(np.ones(9, np.float32), 0.5)
    kc.global_norm([np.ones(9, np.float32)])
    kc.ema_dense(w, kc.to_device(np.ones(40, np.float32)), ema_momentum=0.9)
    assert {"dense", "rows", "table", "leaf_sums"} <= set(names)
    assert len(seen) >= 7
    for launch in seen:
        assert all(type(x) is int for x in launch), launch


def test_integer_variables_refused():
    with pytest.raises(TypeError, match="float16, float32 or float64"):
        refopt.Adam(backend="cuda").build([kc.to_device(np.ones(2, np.int32))])


def test_no_gpu_no_simulator_is_one_clear_error():
    code = ("import refopt\n"
            "try:\n    refopt.Adam(backend='cuda')\n"
            "except RuntimeError as e:\n    print('RuntimeError', e)\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    if ON_DEVICE or "RuntimeError" not in out.stdout and out.returncode == 0:
        pytest.skip("a GPU is present")
    assert "RuntimeError backend='cuda' needs an NVIDIA GPU" in out.stdout, out.stderr


def test_importing_refopt_does_not_import_numba_cuda():
    code = ("import sys, refopt, refopt.optimizers\n"
            "refopt.Adam(backend='cpu')\n"
            "print(any(m.startswith('numba.cuda') or m.startswith('numba_cuda') "
            "for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stdout.strip() == "False", out.stderr


@gpu
@needs_gpu
def test_foreign_cuda_array_interface_on_device():
    """CuPy or torch CUDA tensors are updated in place (needs a GPU and one of them)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    w = torch.tensor([1.0, 2.0, 3.0], device="cuda")
    g = torch.tensor([0.1, -0.2, 0.3], device="cuda")
    refopt.Adam(learning_rate=0.1, backend="cuda").apply_gradients([(g, w)])
    ref = np.array([1.0, 2.0, 3.0], np.float32)
    refopt.Adam(learning_rate=0.1).apply_gradients([(np.array([0.1, -0.2, 0.3], np.float32),
                                                     ref)])
    assert_bit_identical(w.cpu().numpy(), ref)


@gpu
@needs_gpu
def test_repeated_runs_identical_bits_on_device():
    kc.config.THREADS_PER_BLOCK = 256
    g = np.random.default_rng(9).standard_normal(1 << 20).astype(np.float32)
    G = kc.to_device(g)
    assert len({kc.sumsq(G).tobytes() for _ in range(5)}) == 1


@gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_full_width_launch_on_device(dtype, monkeypatch):
    """24 tensors in one launch at 256 threads: the tuple arguments fit CUDA's 4 KiB of
    kernel parameters and the results are the reference's, bit for bit (no FMA contraction:
    every multiply and add is an explicitly rounded libdevice operation)."""
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 256)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 8)
    assert kc.config.TENSORS_PER_LAUNCH == 24
    rng = np.random.default_rng(12)
    host = [rng.standard_normal(1 + 997 * k).astype(dtype) for k in range(24)]
    grads = [rng.standard_normal(h.shape).astype(dtype) for h in host]
    kw = dict(learning_rate=0.01, amsgrad=True, weight_decay=0.01, use_ema=True,
              clipvalue=1.0)
    ref, dev = refopt.AdamW(backend="reference", **kw), refopt.AdamW(backend="cuda", **kw)
    dv = [kc.to_device(h) for h in host]
    for _ in range(3):
        ref.apply_gradients(zip(grads, host))
        dev.apply_gradients(zip([kc.to_device(g) for g in grads], dv))
    for h, d in zip(host, dv):
        assert_bit_identical(_host(d), h)
        for name in dev.slot_names:
            assert_bit_identical(_host(dev.get_slot(d, name)), ref.get_slot(h, name))


def _steps(opt, ws, grads):
    """Apply host gradients ``grads`` (one list per step), on the device if ``ws`` are."""
    on_device = not isinstance(ws[0], np.ndarray)
    for gs in grads:
        opt.apply_gradients(zip([kc.to_device(g) if on_device else g for g in gs], ws))


def _grads(rng, shapes, steps, dtype=np.float32):
    return [[rng.standard_normal(s).astype(dtype) for s in shapes] for _ in range(steps)]


CKPT = dict(learning_rate=0.05, amsgrad=True, weight_decay=0.1, use_ema=True,
            ema_overwrite_frequency=3, clipvalue=0.9)  # elementwise: exact vs reference


def test_checkpoint_round_trip_on_cuda_is_bit_identical(tmp_path):
    rng = np.random.default_rng(5)
    shapes = [(4, 3), (5,), (0, 2)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = _grads(rng, shapes, 5)
    # The uninterrupted run, and the reference.
    ws = [kc.to_device(x) for x in init]
    full = refopt.Adam(backend="cuda", **CKPT)
    _steps(full, ws, grads)
    ref_ws = [x.copy() for x in init]
    ref = refopt.Adam(backend="reference", **CKPT)
    _steps(ref, ref_ws, grads)
    # Interrupted after 3 steps, resumed into new device arrays holding garbage.
    ws1 = [kc.to_device(x) for x in init]
    first = refopt.Adam(backend="cuda", **CKPT)
    _steps(first, ws1, grads[:3])
    meta = refopt.save_checkpoint(tmp_path / "c.npz", first, ws1)
    assert meta["iterations"] == 3 and meta["slots"] == ["m", "v", "vhat", "average"]
    ws2 = [kc.to_device(np.full(s, 7.0, np.float32)) for s in shapes]
    resumed = refopt.Adam(backend="cuda", **CKPT)
    refopt.load_checkpoint(tmp_path / "c.npz", resumed, ws2)
    assert resumed.iterations == 3
    _steps(resumed, ws2, grads[3:])
    for a, b, r in zip(ws, ws2, ref_ws):
        assert_bit_identical(_host(b), _host(a))
        assert_bit_identical(_host(b), r)
        for name in resumed.slot_names:
            assert_bit_identical(_host(resumed.get_slot(b, name)),
                                 _host(full.get_slot(a, name)))
            assert_bit_identical(_host(resumed.get_slot(b, name)), ref.get_slot(r, name))


@pytest.mark.parametrize("direction", ["cuda->reference", "cpu->cuda"])
def test_checkpoint_moves_between_cuda_and_host_backends(direction, tmp_path):
    src, dst = direction.split("->")
    rng = np.random.default_rng(6)
    shapes = [(3, 2), (4,)]
    init = [rng.standard_normal(s) for s in shapes]  # float64
    grads = _grads(rng, shapes, 4, np.float64)

    def make(backend, values):
        return [kc.to_device(x) if backend == "cuda" else x.copy() for x in values]

    ref_ws = make("reference", init)
    ref = refopt.Adam(backend="reference", **CKPT)
    _steps(ref, ref_ws, grads)
    ws = make(src, init)
    a = refopt.Adam(backend=src, **CKPT)
    _steps(a, ws, grads[:2])
    refopt.save_checkpoint(tmp_path / "c.npz", a, ws)
    ws2 = make(dst, [np.zeros(s) for s in shapes])
    b = refopt.Adam(backend=dst, **CKPT)
    refopt.load_checkpoint(tmp_path / "c.npz", b, ws2)
    _steps(b, ws2, grads[2:])
    for w, r in zip(ws2, ref_ws):
        host = w if isinstance(w, np.ndarray) else _host(w)
        assert_bit_identical(host, r)
        for name in b.slot_names:
            s = b.get_slot(w, name)
            assert_bit_identical(s if isinstance(s, np.ndarray) else _host(s),
                                 ref.get_slot(r, name))


def test_lazy_adam_checkpoint_on_cuda_resumes_sparse_steps(tmp_path):
    rng = np.random.default_rng(8)
    table = rng.standard_normal((6, 2)).astype(np.float32)
    grads = [IndexedSlices(rng.standard_normal((3, 2)).astype(np.float32),
                           np.array(idx), (6, 2)) for idx in ([1, 4, 1], [0, 5, 5], [2, 1, 3])]
    ref_t = table.copy()
    ref = refopt.LazyAdam(0.1, backend="reference")
    for g in grads:
        ref.apply_gradients([(g, ref_t)])
    t1 = kc.to_device(table)
    a = refopt.LazyAdam(0.1, backend="cuda")
    a.apply_gradients([(grads[0], t1)])
    refopt.save_checkpoint(tmp_path / "l.npz", a, [t1])
    t2 = kc.to_device(np.zeros_like(table))
    b = refopt.LazyAdam(0.1, backend="cuda")
    refopt.load_checkpoint(tmp_path / "l.npz", b, [t2])
    for g in grads[1:]:
        b.apply_gradients([(g, t2)])
    assert_bit_identical(_host(t2), ref_t)
    for name in ("m", "v"):
        assert_bit_identical(_host(b.get_slot(t2, name)), ref.get_slot(ref_t, name))


def test_cuda_checkpoint_errors_change_nothing(tmp_path):
    w = kc.to_device(np.ones(4, np.float32))
    a = refopt.Adam(0.1, backend="cuda")
    a.apply_gradients([(kc.to_device(np.ones(4, np.float32)), w)])
    with pytest.raises(TypeError, match="to_device"):
        refopt.save_checkpoint(tmp_path / "x.npz", a, [np.ones(4, np.float32)])
    with pytest.raises(TypeError, match="must be a list of device arrays, not a single array"):
        refopt.save_checkpoint(tmp_path / "x.npz", a, w)
    assert not (tmp_path / "x.npz").exists()
    refopt.save_checkpoint(tmp_path / "c.npz", a, [w])
    # A host array, a wrong shape, a wrong dtype: refused, nothing built or written.
    for bad, err in ((np.zeros(4, np.float32), TypeError),
                     (kc.to_device(np.full(5, 3.0, np.float32)), CheckpointError),
                     (kc.to_device(np.full(4, 3.0)), CheckpointError)):
        b = refopt.Adam(0.1, backend="cuda")
        with pytest.raises(err):
            refopt.load_checkpoint(tmp_path / "c.npz", b, [bad])
        assert not b.built and b.iterations == 0
        if not isinstance(bad, np.ndarray):
            assert (_host(bad) == 3.0).all()


class _CountLaunches:
    """Wraps a kernel: counts ``kernel[grid]`` configurations."""

    def __init__(self, kernel):
        self.kernel, self.count = kernel, 0

    def __getitem__(self, config):
        self.count += 1
        return self.kernel[config]


def wrap_rule_kernels(monkeypatch, wrap):
    """Put ``wrap(kernel, name, ks)`` in place of every rule-driver kernel the step uses
    (``name``: ``"dense"``, ``"rows"``, ``"table"``, or a reduction's ``"leaf_sums"`` and
    ``"lane_sums"``; ``ks`` the :class:`refopt.kernels.cuda.drivers.Kernels`, None for a
    reduction's)."""
    import copy

    from refopt.kernels.cuda import drivers

    real_kernels, real_reduce = drivers.kernels, drivers.reduce_kernels

    def kernels(*args, **kwargs):
        ks = real_kernels(*args, **kwargs)
        stand_in = copy.copy(ks)
        stand_in.dense = wrap(ks.dense, "dense", ks)
        stand_in.rows = wrap(ks.rows, "rows", ks)
        stand_in.table = wrap(ks.table, "table", ks)
        return stand_in

    monkeypatch.setattr(drivers, "kernels", kernels)
    def reduce_kernels(*args, **kwargs):
        rk = real_reduce(*args, **kwargs)
        stand_in = copy.copy(rk)
        stand_in.leaf_sums = wrap(rk.leaf_sums, "leaf_sums", None)
        if rk.lane_sums is not None:
            stand_in.lane_sums = wrap(rk.lane_sums, "lane_sums", None)
        return stand_in

    monkeypatch.setattr(drivers, "reduce_kernels", reduce_kernels)


@pytest.mark.parametrize("cls,kw", [(refopt.Adam, dict(amsgrad=True, use_ema=True)),
                                    (refopt.SGD, dict(momentum=0.9, clipvalue=0.5,
                                                      weight_decay=0.1))])
def test_one_launch_per_dtype_group_of_up_to_24_tensors(cls, kw, monkeypatch):
    # The rule driver's dense kernel: one launch per dtype group of up to 24 tensors.
    by_dtype = {np.dtype(np.float32): _CountLaunches(None),
                np.dtype(np.float64): _CountLaunches(None)}

    def count(kernel, name, ks):
        if name != "dense":
            return kernel

        class Counted:
            def __getitem__(self, config):
                by_dtype[ks.dtype].count += 1
                return kernel[config]

        return Counted()

    wrap_rule_kernels(monkeypatch, count)
    counters = list(by_dtype.values())
    rng = np.random.default_rng(11)
    # 30 float32 tensors (two launches: 24 + 6), 3 float64 (one), one empty (none).
    host = ([rng.standard_normal(1 + k % 5).astype(np.float32) for k in range(30)]
            + [rng.standard_normal((2, 3)) for _ in range(3)] + [np.zeros((0, 2), np.float32)])
    grads = [rng.standard_normal(h.shape).astype(h.dtype) for h in host]
    ref = cls(learning_rate=0.1, backend="reference", **kw)
    dev = cls(learning_rate=0.1, backend="cuda", **kw)
    dv = [kc.to_device(h) for h in host]
    for step in range(2):
        ref.apply_gradients(zip(grads, host))
        dev.apply_gradients(zip([kc.to_device(g) for g in grads], dv))
        assert [c.count for c in counters] == [2 * (step + 1), step + 1]
    for h, d in zip(host, dv):
        assert_bit_identical(_host(d), h)
        for name in dev.slot_names:
            assert_bit_identical(_host(dev.get_slot(d, name)), ref.get_slot(h, name))


def test_slots_are_views_of_one_flat_buffer_per_dtype():
    ws = [kc.to_device(np.ones(3, np.float32)), kc.to_device(np.ones((2, 2))),
          kc.to_device(np.ones(4, np.float32))]
    opt = refopt.Adam(0.1, backend="cuda", use_ema=True)
    opt.build(ws)
    state = opt._state
    assert set(state.buffers) == {np.dtype(np.float32), np.dtype(np.float64)}
    assert state.buffers[np.dtype(np.float32)]["m"].size == 7
    assert state.offsets == [0, 0, 3]
    opt.apply_gradients([(kc.to_device(np.full(3, 0.5, np.float32)), ws[0]),
                         (kc.to_device(np.full(4, 2.0, np.float32)), ws[2])])
    flat_m = _host(state.buffers[np.dtype(np.float32)]["m"])
    np.testing.assert_array_equal(flat_m[:3], _host(opt.get_slot(ws[0], "m")))
    np.testing.assert_array_equal(flat_m[3:], _host(opt.get_slot(ws[2], "m")))
    np.testing.assert_array_equal(_host(opt.get_slot(ws[1], "m")), np.zeros((2, 2)))
