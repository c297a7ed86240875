# Adafactor and Lamb on the fast backends: bit for bit the reference's numbers on the
# variables and every slot, under every convention, through the whole pipeline (clipping,
# weight decay, EMA, per-variable steps, checkpoints across backends).
#
# backend="cpu" runs both in phases (refopt/rules/lamb.py, adafactor.py: rule kernels, the
# sums between them on the host) through the staged step; backend="cuda" (numba's CUDA
# simulator, tests/conftest.py) takes the executor's host step, and the device phases are
# the mirror functions refopt.kernels.cuda.lamb_update / adafactor_update, tested directly.
# What these tests pin: the phases give the reference's bits on both targets, and the
# executors keep slots whose shapes differ from their variable's (Adafactor's factored
# moments, outside the flat buffers).
import importlib
import warnings

import numpy as np
import pytest
from test_properties import assert_bits_equal, assert_bits_equal_nan_aware

import refopt
from refopt.executors.cuda import HostStepWarning

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)
SHAPES = [(5,), (4, 3), (2, 3, 2), ()]

CASES = [
    (refopt.Adafactor, dict(convention="tf_keras")),
    (refopt.Adafactor, dict(convention="keras3", weight_decay=0.01, use_ema=True,
                            clipnorm=1.0)),
    (refopt.Adafactor, dict(convention="torch", weight_decay=0.1, learning_rate=0.05)),
    (refopt.Adafactor, dict(convention="optax", min_dim_size_to_factor=2, learning_rate=0.1,
                            weight_decay=0.01, global_clipnorm=1.0)),
    (refopt.Lamb, dict(convention="keras3", weight_decay=0.01, learning_rate=0.05)),
    (refopt.Lamb, dict(convention="optax", learning_rate=0.05, eps_root=1e-9,
                       weight_decay=0.01)),
]


def _inputs(dtype, steps=3, seed=0):
    rng = np.random.default_rng(seed)
    init = [np.array(rng.standard_normal(s), dtype) for s in SHAPES]
    grads = [[np.array(rng.standard_normal(s) * 10.0 ** rng.uniform(-3, 1), dtype)
              for s in SHAPES] for _ in range(steps)]
    return init, grads


def _run(cls, kw, backend, dtype):
    init, grads = _inputs(dtype)
    opt = cls(backend=backend, **kw)
    if backend == "cuda":
        from refopt.kernels import cuda as kc

        ws = [kc.to_device(a) for a in init]
        get = lambda a: a.copy_to_host() if a.size else np.zeros(a.shape, a.dtype)
    else:
        ws = [a.copy() for a in init]
        get = np.asarray
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostStepWarning)
        for row in grads:
            g = row if backend != "cuda" else [kc.to_device(x) for x in row]
            opt.apply_gradients(list(zip(g, ws)))
    out = {"param": [get(w) for w in ws]}
    for name in opt.slot_names:
        out[name] = [get(opt.get_slot(w, name)) for w in ws]
    return out


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("cls,kw", CASES, ids=lambda x: getattr(x, "__name__", None) or
                         x.get("convention"))
def test_fast_backends_bit_identical(cls, kw, backend):
    for dtype in (F32, F64):
        want = _run(cls, kw, "reference", dtype)
        got = _run(cls, kw, backend, dtype)
        assert set(got) == set(want)
        for name in want:
            for i, (a, e) in enumerate(zip(got[name], want[name])):
                assert_bits_equal(a, e, f"{cls.__name__} {kw['convention']} {backend} "
                                        f"{dtype} {name} of variable {i}")


def test_slot_shapes_on_every_backend():
    for backend in ("reference", "cpu"):
        opt = refopt.Adafactor(convention="torch", backend=backend)
        w = np.ones((2, 3, 4), F32)
        v = np.ones(7, F32)
        opt.build([w, v])
        assert opt.get_slot(w, "velocity_row").shape == (2, 3, 1)
        assert opt.get_slot(w, "velocity_col").shape == (2, 1, 4)
        assert opt.get_slot(w, "velocity").shape == ()
        assert opt.get_slot(v, "velocity").shape == (7,)


def test_checkpoint_across_backends(tmp_path):
    init, grads = _inputs(F32, steps=4, seed=1)
    kw = dict(convention="optax", min_dim_size_to_factor=2, learning_rate=0.1)
    ref_opt = refopt.Adafactor(**kw)
    ref_w = [a.copy() for a in init]
    for row in grads:
        ref_opt.apply_gradients(list(zip(row, ref_w)))
    a = refopt.Adafactor(**kw)
    ws = [x.copy() for x in init]
    for row in grads[:2]:
        a.apply_gradients(list(zip(row, ws)))
    path = tmp_path / "af.npz"
    refopt.save_checkpoint(path, a, ws)
    b = refopt.Adafactor(backend="cpu", **kw)
    ws2 = [x.copy() for x in ws]
    refopt.load_checkpoint(path, b, ws2)
    for row in grads[2:]:
        b.apply_gradients(list(zip(row, ws2)))
    for w, e in zip(ws2, ref_w):
        assert_bits_equal(w, e, "resumed")
    for name in b.slot_names:
        for w, e in zip(ws2, ref_w):
            assert_bits_equal(b.get_slot(w, name), ref_opt.get_slot(e, name), name)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_mirror_functions_are_the_reference(backend):
    k = importlib.import_module(f"refopt.kernels.{backend}")
    w = np.array([[0.3, -0.2], [0.1, 0.5]], F32)
    g = np.array([[0.01, -0.2], [0.3, 0.04]], F32)
    st = refopt.reference.adafactor_initial_state(w, "keras3")
    r = k.adafactor_update(w, g, *st, learning_rate=0.01, step=1, convention="keras3")
    e = refopt.reference.adafactor_update(w, g, *st, learning_rate=0.01, step=1,
                                          convention="keras3")
    for a, b in zip(r, e):
        assert_bits_equal(a, b)
    m = np.zeros_like(w)
    r = k.lamb_update(w, g, m, m, learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                      step=1, convention="keras3")
    e = refopt.reference.lamb_update(w, g, m, m, learning_rate=0.01, beta_1=0.9, beta_2=0.999,
                                     epsilon=1e-7, step=1, convention="keras3")
    for a, b in zip(r, e):
        assert_bits_equal(a, b)


# Lamb's phases (refopt/rules/lamb.py) through each backend's pure function, on the edge cases
# of the trust ratio and with every option.
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("conv,extra", [("keras3", {}), ("optax", {}),
                                        ("optax", {"eps_root": 1e-6, "weight_decay": 0.1})])
def test_lamb_phases_bit_identical(backend, conv, extra):
    k = importlib.import_module(f"refopt.kernels.{backend}")
    rng = np.random.default_rng(7)
    for dtype in (F32, F64):
        for w in (rng.standard_normal((3, 5)), np.zeros((3, 5)),
                  np.where(np.eye(3, 5) > 0, np.nan, 1.0)):
            w = w.astype(dtype)
            m, v = np.zeros_like(w), np.zeros_like(w)
            kw = dict(learning_rate=0.05, beta_1=0.8, beta_2=0.99, epsilon=1e-6,
                      convention=conv, **extra)
            r_ref = r_fast = refopt.reference.LambResult(w, m, v)
            for step in (1, 2, 3):
                g = (rng.standard_normal(w.shape) * (0 if step == 2 else 1)).astype(dtype)
                r_ref = refopt.reference.lamb_update(*r_ref[:1], g, *r_ref[1:], step=step,
                                                     **kw)
                r_fast = k.lamb_update(*r_fast[:1], g, *r_fast[1:], step=step, **kw)
                for name, a, e in zip(r_ref._fields, r_fast, r_ref):
                    assert_bits_equal(a, e, f"{backend} {conv} {dtype} step {step} {name}")


# Adafactor's phases (refopt/rules/adafactor.py) through each backend's pure function: every
# form, factored and not, with the options and non-finite gradients.
_AF_CONFIGS = [
    ("keras3", {}), ("tf_keras", {"clip_threshold": 0.5, "epsilon_2": 1e-2}),
    ("torch", {}), ("torch", {"weight_decay": 0.1, "epsilon_1": 1e-10, "clip_threshold": 2.0}),
    ("optax", {"min_dim_size_to_factor": 2, "clip_threshold": float("inf"),
               "multiply_by_parameter_scale": False, "weight_decay": 0.01}),
    ("optax", {"min_dim_size_to_factor": 3, "decay_offset": -2, "beta_2_decay": -0.6}),
]


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize("conv,extra", _AF_CONFIGS)
def test_adafactor_phases_bit_identical(backend, conv, extra):
    k = importlib.import_module(f"refopt.kernels.{backend}")
    ref = refopt.reference
    rng = np.random.default_rng(11)
    axes_kw = {key: extra[key] for key in ("min_dim_size_to_factor",) if key in extra}
    for dtype in (F32, F64):
        for shape in ((6,), (4, 3), (2, 3, 4)):
            w = rng.standard_normal(shape).astype(dtype)
            st = ref.adafactor_initial_state(w, conv, **axes_kw)
            r_ref = r_fast = ref.AdafactorResult(w, *st)
            lr = None if conv == "optax" else 0.05
            for step in (1, 2, 3):
                g = rng.standard_normal(shape).astype(dtype)
                if step == 3:
                    g.flat[0] = np.nan
                r_ref = ref.adafactor_update(*r_ref[:1], g, *r_ref[1:], learning_rate=lr,
                                             step=step, convention=conv, **extra)
                r_fast = k.adafactor_update(*r_fast[:1], g, *r_fast[1:], learning_rate=lr,
                                            step=step, convention=conv, **extra)
                for name, a, e in zip(r_ref._fields, r_fast, r_ref):  # NaN signs aside
                    assert_bits_equal_nan_aware(a, e, f"{backend} {conv} {dtype} {shape} "
                                                      f"step {step} {name}")


# The compiled order-defined sums of the CPU phases (refopt/kernels/cpu/_reduce_seq.py) against
# the reference's readable ones, bit for bit: every size around the packets' and lanes' widths,
# odd shapes, every axis, and NaN (of either sign), infinities, zeros of both signs,
# subnormals and values whose squares overflow or underflow. Where NaNs of both signs meet in
# one sum, which of them propagates is the compiler's choice (NumPy's loops and Numba's code
# order the operands differently), so those inputs compare with NaN signs aside.
def _sum_inputs(dtype, rng, nan=np.nan):
    specials = [nan, nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-310, 1e30, 3e200]
    for n in (0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 15, 16, 17, 33, 127, 1000, 1003):
        yield rng.standard_normal(n).astype(dtype)
        with np.errstate(all="ignore"):  # 3e200 is inf in float32: intended
            x = (rng.standard_normal(n) * 10.0 ** rng.integers(-45, 39, n)).astype(dtype)
            if n > 2:
                x[rng.integers(0, n, 3)] = rng.choice(specials, 3)
        yield x
    yield np.zeros(9, dtype)
    yield np.full(17, -0.0, dtype)


def _sum_shapes(n):
    shapes = [(1, n), (n, 1)]
    for k in (3, 4, 7, 8):
        if n and n % k == 0:
            shapes.append((n // k, k))
            if (n // k) % 2 == 0:
                shapes.append((2, n // k // 2, k))
    return shapes


def test_compiled_sums_are_the_reference():
    from refopt.kernels.cpu import _reduce_seq as S
    from refopt.reference import adafactor as R
    from refopt.reference import reductions as RR
    from refopt.reference.variants import fma

    rng = np.random.default_rng(5)
    checked = 0
    cases = [(dtype, nan, mixed) for dtype in (F32, F64)
             for nan, mixed in ((np.nan, False), (-np.nan, False), (None, True))]
    for dtype, nan, mixed in cases:
        for x in _sum_inputs(dtype, rng, np.nan if mixed else nan):
            if mixed and x.size > 4:
                x.flat[rng.integers(0, x.size)] = -np.nan
            e = dtype.type(1e-30)
            with np.errstate(all="ignore"):
                pairs = [
                    ("eigen_sum", S.eigen_sum_map(x), R.eigen_sum(x)),
                    ("eigen_sum x*x", S.eigen_sum_map(x, S.M_SQ), R.eigen_sum(x * x)),
                    ("eigen_sum_squares", S.eigen_sum_squares(x), R.eigen_sum(x * x)),
                    ("xla_sum_squares", S.xla_sum_squares(x), R.xla_sum_squares(x)),
                    ("xla_sum_squares2", S.xla_sum_squares2(x, x[::-1]),
                     (R.xla_sum_squares(x), R.xla_sum_squares(x[::-1]))),
                    ("torch_sum_squares", S.torch_sum_squares(x), RR.torch_sum_squares(x)),
                    ("torch_vector_norm", S.torch_vector_norm(x), RR.torch_vector_norm(x)),
                ]
                for shape in _sum_shapes(x.size):
                    y = x.reshape(shape)
                    pairs.append(("eigen rows g*g+e", S.eigen_rows_map(y, S.M_SQ_ADD, e),
                                  R.eigen_sum_rows(y * y + e)))
                    pairs.append(("torch rows", S.torch_rows_norm(y),
                                  R._torch_norm_axis(y, -1)[..., 0]))
                    for ax in range(y.ndim):
                        pairs += [
                            ("seq x", S.seq_axis_map(y, ax), R._seq_sum(y, ax)),
                            ("seq x*x", S.seq_axis_map(y, ax, S.M_SQ), R._seq_sum(y * y, ax)),
                            ("seq x*x+e", S.seq_axis_map(y, ax, S.M_SQ_ADD, e),
                             R._seq_sum(y * y + e, ax)),
                            ("seq fma", S.seq_axis_map(y, ax, S.M_FMA, e),
                             R._seq_sum(fma(y, y, e), ax)),
                        ]
            for name, got, want in pairs:
                got, want = np.asarray(got), np.asarray(want)
                assert got.dtype == want.dtype and got.shape == want.shape, name
                check = assert_bits_equal_nan_aware if mixed else assert_bits_equal
                check(got, want, f"{name} {dtype} size {x.size}")
                checked += 1
    assert checked > 1500


def test_compiled_sums_large_and_parallel():
    # sizes where the row and column sums run in parallel and the packets' reduction is long
    from refopt.kernels.cpu import _reduce_seq as S
    from refopt.reference import adafactor as R
    from refopt.reference import reductions as RR

    rng = np.random.default_rng(6)
    for dtype in (F32, F64):
        x = rng.standard_normal(200_007).astype(dtype)
        assert_bits_equal(S.eigen_sum_squares(x), R.eigen_sum(x * x), "eigen")
        assert_bits_equal(S.torch_vector_norm(x), RR.torch_vector_norm(x), "torch")
        y = x[:200_000].reshape(400, 500)
        e = dtype.type(1e-30)
        assert_bits_equal(S.eigen_rows_map(y, S.M_SQ_ADD, e), R.eigen_sum_rows(y * y + e),
                          "rows")
        assert_bits_equal(S.seq_axis_map(y, 0, S.M_SQ_ADD, e), R._seq_sum(y * y + e, 0), "cols")
        assert_bits_equal(S.torch_rows_norm(y), R._torch_norm_axis(y, -1)[:, 0], "torch rows")
    x = rng.standard_normal(20_001).astype(F32)
    assert_bits_equal(S.xla_sum_squares(x), R.xla_sum_squares(x), "xla")


# Lamb's fused CPU phases on sizes around the packets' width and with non-finite values
@pytest.mark.parametrize("conv,extra", [("keras3", {}), ("optax", {"weight_decay": 0.1})])
def test_lamb_cpu_edge_sizes(conv, extra):
    from refopt.kernels import cpu as k

    rng = np.random.default_rng(8)
    for dtype in (F32, F64):
        for shape in ((0,), (1,), (7,), (8,), (9,), (3, 3), (1000,), (7, 11, 13)):
            w = rng.standard_normal(shape).astype(dtype)
            g = rng.standard_normal(shape).astype(dtype)
            if w.size > 4:
                w.flat[1], g.flat[3] = -0.0, 1e-40
            m, v = np.zeros_like(w), np.zeros_like(w)
            kw = dict(learning_rate=0.05, beta_1=0.8, beta_2=0.99, epsilon=1e-6,
                      convention=conv, step=1, **extra)
            e = refopt.reference.lamb_update(w, g, m, v, **kw)
            r = k.lamb_update(w, g, m, v, **kw)
            for name, a, b in zip(e._fields, r, e):
                assert_bits_equal(a, b, f"{conv} {dtype} {shape} {name}")
