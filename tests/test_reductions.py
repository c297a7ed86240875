"""Reductions (refopt.rules.reduce): NumPy's and PyTorch's orders of addition, on every target.

- NumPy's order: the CPU drivers' ``reduce`` kernel and the CUDA ``leaf_sums`` (simulator)
  equal ``np.sum`` bit for bit, at sizes around the 8 accumulators and the 128-term leaves.
- PyTorch's order: the reference (:mod:`refopt.reference.reductions`), the CPU kernel and the
  CUDA lanes agree bit for bit, specials included; the reference and the CPU fast path equal
  the values recorded from PyTorch 2.13 (``conformance/norms/torch.json``, by
  ``conformance/generators/gen_norms.py``: ``vector_norm`` at 1e3 to 1e6 elements and
  ``clip_grad_norm_``); with torch installed (AVX2 kernels) the reference equals
  ``torch.linalg.vector_norm`` at every size from 1 to 300 and a few large ones, with 1 and 2
  threads, and ``clip_grad_norm_`` on random lists (mixed dtypes, one-element tensors).
- TensorFlow's and optax's norms (recorded too) stay within the ulp measured for NumPy's
  order (Eigen's and XLA's orders are not reproduced).
"""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import refopt
from refopt.conventions import get_convention
from refopt.executors import staged as _staged
from refopt.reference.reductions import (
    torch_stack_order,
    torch_sum_squares,
    torch_vector_norm,
)
from refopt.reference.variants import clip_global_norm_variant
from refopt.rules.reduce import SUM_HALF_SQUARES, SUM_SQUARES

ROOT = Path(__file__).resolve().parents[1]
NORMS = ROOT / "conformance" / "norms"
sys.path.insert(0, str(ROOT / "conformance" / "generators"))
from gen_norms import make_input, sha256  # noqa: E402

F32, F64 = np.dtype(np.float32), np.dtype(np.float64)

# around NumPy's 8 accumulators and 128-term leaves, PyTorch's 8/4 lanes and 4-term tails
SIZES = [0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16, 17, 127, 128, 129, 135, 136, 255, 256,
         257, 1000, 1023, 4097, 8193, 100003]


def bits(x):
    return np.asarray(x).tobytes()


def from_hex(h, dtype):
    dtype = np.dtype(dtype)
    return np.array(int(h, 16), np.uint32 if dtype.itemsize == 4 else np.uint64).view(dtype)[()]


def ulp(a, b):
    a = np.asarray(a)
    it = np.int32 if a.dtype.itemsize == 4 else np.int64
    return abs(int(a.view(it)) - int(np.asarray(b, a.dtype).view(it)))


def arrays(dtype, sizes, seed=0, specials=False):
    rng = np.random.default_rng(seed)
    out = [(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3)).astype(dtype) for n in sizes]
    if specials:
        big, tiny = np.finfo(dtype).max ** 0.5 * 2, np.finfo(dtype).tiny ** 0.5 / 4
        out += [np.array([big], dtype), np.array([tiny], dtype), np.full(9, -0.0, dtype),
                np.array([1.0, np.inf, 2.0], dtype), np.array([np.nan] + [1.0] * 12, dtype),
                np.array([big] * 13, dtype), np.array([tiny] * 13, dtype)]
    return out


def recorded(framework):
    path = NORMS / f"{framework}.json"
    record = json.loads(path.read_text())
    for r in record["norms"]:
        x = make_input(r["dtype"], r["n"], r["seed"], r["scale"])
        assert sha256(x) == r["sha256"], "this NumPy draws other inputs than the recording's"
        yield r, x


# --------------------------------------------------------------------------- NumPy's order
@pytest.mark.parametrize("dtype", [F32, F64])
def test_cpu_numpy_order_is_np_sum(dtype):
    from refopt.kernels.cpu import drivers

    xs = arrays(dtype, SIZES, specials=True)
    h = dtype.type(0.5)
    with np.errstate(all="ignore"):
        want = [np.sum(x * x, dtype=dtype) for x in xs]
        want_half = [np.sum(x * x * h, dtype=dtype) for x in xs]
    assert bits(drivers.reduce(SUM_SQUARES, xs, dtype)) == bits(np.array(want, dtype))
    assert bits(drivers.reduce(SUM_HALF_SQUARES, xs, dtype, sc=[0.5])) == bits(
        np.array(want_half, dtype))


# --------------------------------------------------------------------------- PyTorch's order
def test_torch_stack_order_is_the_reverse_of_first_appearance():
    f16, f32, f64 = np.float16, np.float32, np.float64
    assert torch_stack_order([f32, f32, f32]) == [0, 1, 2]
    assert torch_stack_order([f32, f64, f32, f64]) == [1, 3, 0, 2]
    assert torch_stack_order([f64, f16, f32, f16]) == [2, 1, 3, 0]


@pytest.mark.parametrize("dtype", [F32, F64])
def test_torch_order_cpu_equals_reference(dtype):
    from refopt.kernels.cpu import clipping, drivers

    xs = arrays(dtype, SIZES + list(range(18, 40)), seed=1, specials=True)
    xs.append(np.array(3.0, dtype))  # 0-d
    got = drivers.reduce(SUM_SQUARES, xs, dtype, order="torch")
    assert bits(got) == bits(np.array([torch_sum_squares(x) for x in xs], dtype))
    norms = clipping.torch_norms(xs, dtype)
    assert bits(norms) == bits(np.array([torch_vector_norm(x) for x in xs], dtype))


@pytest.mark.parametrize("dtype", [F32, F64])
def test_cuda_simulator_orders_equal_reference(dtype, monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    from refopt.kernels.cuda import drivers

    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 32)
    xs = arrays(dtype, [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 15, 129, 1001], seed=2,
                specials=True)
    dev = [kc.to_device(x) for x in xs]
    with np.errstate(all="ignore"):
        want = np.array([np.sum(x * x, dtype=dtype) for x in xs], dtype)
    assert bits(drivers.sums_of_squares(dev, dtype)) == bits(want)
    got = drivers.reduce(SUM_SQUARES, dev, dtype, order="torch")
    assert bits(got) == bits(np.array([torch_sum_squares(x) for x in xs], dtype))
    got = drivers.torch_norms(dev, dtype)
    assert bits(got) == bits(np.array([torch_vector_norm(x) for x in xs], dtype))


def test_reference_and_cpu_norms_equal_recorded_torch():
    from refopt.kernels.cpu import clipping

    for r, x in recorded("torch"):
        want = from_hex(r["vector_norm"], r["dtype"])
        assert bits(torch_vector_norm(x)) == bits(want), (r["dtype"], r["n"])
        assert bits(clipping.torch_norms([x], x.dtype)[0]) == bits(want), (r["dtype"], r["n"])


def test_clip_grad_norm_equals_recorded_torch(monkeypatch):
    record = json.loads((NORMS / "torch.json").read_text())
    conv = get_convention("torch")
    for case in record["clip_grad_norm_"]:
        grads = [make_input(dt, n, seed, case["scale"])
                 for dt, n, seed in zip(case["dtypes"], case["sizes"], case["seeds"])]
        assert [sha256(g) for g in grads] == case["inputs_sha256"]
        dtype = np.result_type(*grads)
        order = torch_stack_order([g.dtype for g in grads])
        total = torch_vector_norm(np.array([torch_vector_norm(grads[k]) for k in order], dtype))
        assert bits(total) == bits(from_hex(case["total_norm"], dtype)), case["sizes"]
        clipped = clip_global_norm_variant(grads, case["max_norm"], conv)
        assert [sha256(c) for c in clipped] == case["clipped_sha256"], case["sizes"]
        # the CPU fast path (fused: one dtype) and the staged one: SGD with lr 1 from zeros
        # leaves -clipped in the variables (torch: p + (-1) g, one FMA, exact)
        variables = [np.zeros_like(g) for g in grads]
        opt = refopt.SGD(1.0, convention="torch", global_clipnorm=case["max_norm"],
                         backend="cpu")
        if len(set(case["dtypes"])) == 1:
            with monkeypatch.context() as m:
                m.setattr(_staged, "compute", lambda *a: pytest.fail("the staged path ran"))
                opt.apply_gradients(zip(grads, variables))
        else:
            opt.apply_gradients(zip(grads, variables))
        assert [sha256(-v) for v in variables] == case["clipped_sha256"], case["sizes"]


def test_torch_clipping_fast_path_on_a_size_numpys_order_gets_wrong():
    # 4097 float32 elements: NumPy's pairwise sum and PyTorch's lanes differ here (the
    # reason for this order), and the cpu backend's per-tensor torch clipping follows torch
    g = make_input("float32", 4097, 0, 1.0)
    assert bits(np.sqrt(np.sum(g * g, dtype=F32))) != bits(torch_vector_norm(g))
    results = []
    for backend in ("reference", "cpu"):
        v = np.zeros_like(g)
        refopt.SGD(1.0, convention="torch", clipnorm=1.0, backend=backend).apply_gradients(
            [(g, v)])
        results.append(v)
    assert bits(results[0]) == bits(results[1])
    norm = torch_vector_norm(g)
    coef = (F32.type(1) / (norm + F32.type(1e-6))) * F32.type(1.0)
    assert bits(results[0]) == bits(-(g * coef))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_reference_equals_live_torch():
    import torch

    if torch.backends.cpu.get_cpu_capability() != "AVX2":
        pytest.skip("refopt reproduces PyTorch's AVX2 kernels (8 float32 lanes); this CPU "
                    f"dispatches to {torch.backends.cpu.get_cpu_capability()}")
    threads = torch.get_num_threads()
    rng = np.random.default_rng(3)
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for dtype in (F32, F64):
                sizes = list(range(1, 301)) + [4097, 65537, 1000003]
                for n, x in zip(sizes, arrays(dtype, sizes, seed=t, specials=False)):
                    want = torch.linalg.vector_norm(torch.from_numpy(x), 2.0).numpy()
                    assert bits(torch_vector_norm(x)) == bits(want), (t, dtype, n)
                for x in arrays(dtype, [], specials=True) + [np.array(2.5, dtype)]:
                    want = torch.linalg.vector_norm(torch.from_numpy(x), 2.0).numpy()
                    assert bits(torch_vector_norm(x)) == bits(want), (t, dtype, x)
            # float16: PyTorch's generic reduction (float32 accumulator); serial below 32768
            for n, x in zip([2, 9, 100, 4097, 30000], arrays(np.float16, [2, 9, 100, 4097,
                                                                          30000], seed=t)):
                want = torch.linalg.vector_norm(torch.from_numpy(x), 2.0).numpy()
                assert bits(torch_vector_norm(x)) == bits(want), (t, "float16", n)
            conv = get_convention("torch")
            for k in range(30):  # clip_grad_norm_ over lists, mixed dtypes, float16
                dts = [F32, F64] if k % 3 else [np.float16, F32, F64]
                grads = [(rng.standard_normal(int(rng.choice([1, 3, 9, 100, 1001, 4097])))
                          * rng.uniform(0.1, 10)).astype(rng.choice(dts))
                         for _ in range(int(rng.integers(1, 10)))]
                c = float(rng.choice([0.1, 1.0, 3.3, 1e6]))
                params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.from_numpy(g).dtype))
                          for g in grads]
                for p, g in zip(params, grads):
                    p.grad = torch.from_numpy(g.copy())
                torch.nn.utils.clip_grad_norm_(params, c)
                for p, got in zip(params, clip_global_norm_variant(grads, c, conv)):
                    assert bits(p.grad.numpy()) == bits(got)
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- TF and optax
# The TensorFlow and optax conventions compute norms in NumPy's order; TensorFlow's (Eigen's
# thread-pool reduction) and XLA's orders are not reproduced. Measured on 1e3..1e6-element
# float32/float64 gradients (120 random arrays each, plus these recordings): sums of squares
# within 3 ulp of NumPy's (TF 2 ulp, jnp.sum 3), norms within 2 ulp.
SUM_ULP, NORM_ULP = 3, 2


@pytest.mark.parametrize("framework", ["tf", "optax"])
def test_tf_and_optax_norms_within_measured_ulp(framework):
    for r, x in recorded(framework):
        dt = x.dtype
        s = np.sum(x * x, dtype=dt)
        h = np.sum(x * x * dt.type(0.5), dtype=dt)
        if framework == "tf":
            assert ulp(from_hex(r["reduce_sum_squares"], dt), s) <= SUM_ULP
            assert ulp(from_hex(r["l2_loss"], dt), h) <= SUM_ULP
            assert ulp(from_hex(r["global_norm"], dt), refopt.reference.global_norm([x])) \
                <= NORM_ULP
        else:
            for key in ("sum_squares_eager", "sum_squares_jit"):
                assert ulp(from_hex(r[key], dt), s) <= SUM_ULP
            assert ulp(from_hex(r["global_norm_jit"], dt), np.sqrt(s)) <= NORM_ULP
