"""Every convention on the CPU fast path: bit-identical to the reference, and really fast.

The rule-built kernels (``refopt.rules`` + ``refopt.kernels.cpu.drivers``) must reproduce the
readable NumPy reference (``refopt.reference``) bit for bit, for every convention, optimizer
and pipeline step (clipping, weight decay, EMA). Each case also checks that the fused path
ran: the staged NumPy path is made to fail.
"""

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt.conventions import PRESETS, get_convention
from refopt.executors import staged as _staged
from refopt.reference.sqrt import takes_mkl_sqrt

SHAPES = [(13,), (4, 3), (2, 3, 2)]

# (class, kwargs, conventions it applies to or None for all)
CASES = [
    (refopt.Adam, {}, None),
    (refopt.Adam, {"amsgrad": True, "clipnorm": 0.5}, None),
    (refopt.Adam, {"global_clipnorm": 0.3, "use_ema": True, "ema_overwrite_frequency": 2},
     ("tf_keras", "keras3", "torch_fused")),
    (refopt.Adam, {"weight_decay": 0.01, "clipvalue": 0.2},
     ("tf_keras", "keras3", "torch_fused")),
    (refopt.AdamW, {"amsgrad": True}, ("tf_keras", "keras3", "torch_fused", "optax")),
    (refopt.AdamW, {"global_clipnorm": 0.3}, ("tf_keras", "torch_fused", "optax")),
    (refopt.SGD, {"momentum": 0.9, "nesterov": True}, None),
    (refopt.SGD, {"momentum": 0.5, "use_ema": True, "ema_momentum": 0.9},
     ("tf_keras", "keras3", "torch")),
    (refopt.SGD, {"momentum": 0.9, "weight_decay": 0.01}, ("tf_keras", "torch")),
    (refopt.RMSprop, {"learning_rate": 0.01}, None),
    (refopt.RMSprop, {"learning_rate": 0.01, "momentum": 0.9, "centered": True}, None),
    (refopt.RMSprop, {"learning_rate": 0.01, "centered": True, "clipnorm": 0.4}, None),
    (refopt.RMSprop, {"learning_rate": 0.01, "momentum": 0.5, "weight_decay": 0.02},
     ("tf_keras", "keras3", "torch")),
]


def _params():
    # every case in float32; the first case of each class also in float64 (each case compiles
    # its own kernels: the suite keeps their number small)
    seen = set()
    for cls, kwargs, convs in CASES:
        dtypes = [np.float32] if cls in seen else [np.float32, np.float64]
        seen.add(cls)
        for conv in convs or PRESETS:
            if cls in (refopt.Adam, refopt.AdamW) and takes_mkl_sqrt(PRESETS[conv], True):
                continue  # MKL's sqrt: the dense_root kernel, tests/test_torch_loop.py
            for dtype in dtypes:
                yield pytest.param(cls, kwargs, conv, dtype,
                                   id=f"{conv}-{cls.__name__}-{sorted(kwargs)}-{np.dtype(dtype)}")


def _inputs(dtype, steps, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    grads = [[(rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 1)).astype(dtype)
              for s in SHAPES] for _ in range(steps)]
    return init, grads


def _run(cls, kwargs, conv, backend, dtype, steps=3):
    opt = cls(convention=conv, backend=backend, **kwargs)
    init, grads = _inputs(dtype, steps)
    variables = [v.copy() for v in init]
    for step_grads in grads:
        opt.apply_gradients(zip(step_grads, variables))
    state = {name: [opt.get_slot(v, name).copy() for v in variables] for name in opt.slot_names}
    return variables, state


@pytest.fixture
def no_staged_path(monkeypatch):
    """Make the staged (NumPy) step fail: only the fused kernels may run."""
    def refuse(opt, present, lr_value):
        raise AssertionError("the staged path ran instead of the fused CPU kernels")

    monkeypatch.setattr(_staged, "compute", refuse)


@pytest.mark.parametrize("cls, kwargs, conv, dtype", list(_params()))
def test_cpu_equals_reference_bit_for_bit(cls, kwargs, conv, dtype, request):
    if takes_mkl_sqrt(PRESETS[conv]):  # torch's for-loop forms, checked with IEEE's root
        conv = get_convention(conv, sqrt="ieee")  # (MKL's: tests/test_torch_loop.py)
    want_vars, want_state = _run(cls, kwargs, conv, "reference", dtype)
    request.getfixturevalue("no_staged_path")
    got_vars, got_state = _run(cls, kwargs, conv, "cpu", dtype)
    for w, g in zip(want_vars, got_vars):
        np.testing.assert_array_equal(g, w)  # bit-identical (NaN positions equal)
    for name in want_state:
        for w, g in zip(want_state[name], got_state[name]):
            np.testing.assert_array_equal(g, w, err_msg=name)


@pytest.mark.parametrize("conv", list(PRESETS))
def test_lazy_rows_every_convention(conv, no_staged_path, monkeypatch):
    """LazyAdam's rows (TF1/TF-Addons moments, SparseAdam for torch) on the fast path."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((10, 4)).astype(np.float32)
    dense = rng.standard_normal(5).astype(np.float32)
    steps = []
    for _ in range(3):
        idx = rng.integers(0, 10, 6)
        vals = rng.standard_normal((6, 4)).astype(np.float32)
        steps.append((IndexedSlices(vals, idx, (10, 4)), rng.standard_normal(5).astype(np.float32)))
    results = {}
    for backend in ("reference", "cpu"):
        if backend == "reference":
            monkeypatch.undo()
        else:
            monkeypatch.setattr(_staged, "compute",
                                lambda *a: (_ for _ in ()).throw(AssertionError("staged")))
        # MKL's sqrt (torch's for-loop SparseAdam) is called by the rows_root kernel; Keras
        # 3's raw duplicate slices (the "keras3" preset's keras3_sparse_square) are the
        # staged step's: the rows rule without them. torch's SparseAdam refuses dense
        # gradients: sparse ones only there
        c = get_convention(conv, keras3_sparse_square=False)
        opt = refopt.LazyAdam(learning_rate=0.01, convention=c, backend=backend)
        t, d = table.copy(), dense.copy()
        for g_sparse, g_dense in steps:
            opt.apply_gradients([(g_sparse, t)] + (
                [] if c.lazy_update == "torch_sparse" else [(g_dense, d)]))
        results[backend] = (t, d, opt.get_slot(t, "m").copy(), opt.get_slot(t, "v").copy())
    for w, g in zip(results["reference"], results["cpu"]):
        np.testing.assert_array_equal(g, w)


def test_rmsprop_tf1_velocity_starts_at_one_on_cpu():
    w = np.zeros(3, np.float32)
    opt = refopt.RMSprop(learning_rate=0.1, convention="tf1", backend="cpu")
    opt.build([w])
    np.testing.assert_array_equal(opt.get_slot(w, "velocity"), np.ones(3, np.float32))


# --------------------------------------------------------------------------- regressions
@pytest.mark.parametrize("cls", [refopt.Adam, refopt.RMSprop])
def test_torch_weight_decay_on_a_0d_variable_equals_a_1_element_one(cls):
    """A 0-d variable got other bits than a 1-element one under torch's L2 decay (the FMA of
    the reference returned a NumPy scalar, so Adam's vectorised-tail fix of ``v`` was lost,
    and RMSprop raised); a user's update_step got a scalar too. Both shapes must now give the
    bits of the (1,)-shaped path, which the golden torch cases cover."""
    results = []
    for shape in ((), (1,)):
        for backend in ("reference", "cpu"):
            w = np.full(shape, 0.3, np.float32)
            opt = cls(learning_rate=0.1, weight_decay=0.05, convention="torch_fused",
                      backend=backend)
            for g in (0.00189053, 0.00107003, -0.25):
                opt.apply_gradients([(np.full(shape, g, np.float32), w)])
            results.append([w.reshape(-1)] + [opt.get_slot(w, n).reshape(-1)
                                               for n in opt.slot_names])
    for other in results[1:]:
        for a, b in zip(other, results[0]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("conv", ["torch", "optax"])
@pytest.mark.parametrize("cls", [refopt.Adam, refopt.RMSprop])
def test_global_clipping_over_mixed_dtypes_keeps_dtypes_and_ignores_order(conv, cls):
    """RMSprop raised and Adam's float32 gradients were scaled in float64 (the first
    gradient's dtype decided); the norm now meets in the widest dtype, each gradient keeps
    its own, and the order of the list does not matter."""
    def run(order):
        a, b = np.ones(3, np.float64), np.ones(2, np.float32)
        pairs = [(np.full(3, 2.0), a), (np.full(2, 3.0, np.float32), b)]
        opt = cls(learning_rate=0.1, convention=conv, global_clipnorm=0.1)
        opt.apply_gradients(pairs if order else pairs[::-1])
        return a, b

    (a1, b1), (a2, b2) = run(True), run(False)
    assert a1.dtype == np.float64 and b1.dtype == np.float32
    np.testing.assert_array_equal(a1, a2)
    np.testing.assert_array_equal(b1, b2)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_torch_lazy_adam_refuses_a_dense_gradient(backend):
    # torch.optim.SparseAdam raises "SparseAdam does not support dense gradients" (user
    # test: refopt applied the dense formula); nothing changes, on the first step or later
    t = np.ones((4, 2), np.float32)
    opt = refopt.LazyAdam(0.1, convention="torch", backend=backend)
    with pytest.raises(TypeError, match=r"SparseAdam, which does not support dense.*position 0"):
        opt.apply_gradients([(np.ones((4, 2), np.float32), t)])
    assert opt.iterations == 0 and (t == 1).all()
    opt.apply_gradients([(IndexedSlices(np.ones((1, 2), np.float32), [2], (4, 2)), t)])
    before = (t.copy(), opt.get_slot(t, "m").copy(), opt.iterations)
    with pytest.raises(TypeError, match="does not support dense gradients"):
        opt.apply_gradients([(np.ones((4, 2), np.float32), t)])
    np.testing.assert_array_equal(t, before[0])
    np.testing.assert_array_equal(opt.get_slot(t, "m"), before[1])
    assert opt.iterations == before[2] == 1
    # tf_keras' LazyAdam takes it (the dense Adam update)
    refopt.LazyAdam(0.1, backend=backend).apply_gradients([(np.ones(2, np.float32),
                                                            np.ones(2, np.float32))])


@pytest.mark.parametrize("kwargs", [{"amsgrad": True}, {"weight_decay": 0.1}])
def test_torch_lazy_adam_refuses_what_sparse_adam_lacks(kwargs):
    with pytest.raises(ValueError, match="SparseAdam, which has no"):
        refopt.LazyAdam(convention="torch", **kwargs)
