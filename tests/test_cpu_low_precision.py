"""float16 and bfloat16 variables on backend="cpu" (issue #17 item 1): where the convention
computes them in float32 (low_precision_compute "float32", and "torch_fused" for Adam/AdamW),
the fused kernels take them (uint16 bits, refopt.kernels.cpu.halfbits) and give the reference's
bits: variable and every slot, every step. The framework's values are the golden cases
torch/*_fused_f16 and *_fused_bf16 (tests/test_conformance.py, on both backends; here checked
to run on the kernels, not on the staged step).

Compile cost: one low-precision module per flag set (float16 and bfloat16 share it: the format
is a run-time argument); Adam's, AdamW's and SGD's are those of the golden cases, RMSprop's and
Adagrad's are new, and Adam's parallel kernel.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refopt
from refopt import conformance as conf
from refopt.conventions import KNOB_VALUES, PRESETS, get_convention
from refopt.executors import staged
from refopt.kernels.cpu._common import PARALLEL_MIN_ELEMENTS

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
# torch's fused kernels (float32 opmath): the "torch_fused" preset where it exists (torch's
# fused Adam/AdamW; the others as SGD(fused=True) computes: low_precision_compute="float32")
FUSED = "torch_fused" if "torch_fused" in PRESETS else "torch"
# (with a correctly rounded sqrt where the knob exists: torch's for-loop RMSprop and Adagrad
# take MKL's, which the fused kernels do not model; the staged step does)
OPMATH = get_convention(FUSED, low_precision_compute="float32",
                        **({"sqrt": "ieee"} if "sqrt" in KNOB_VALUES else {}))

# Adam, AdamW and SGD with the flag sets of the golden cases (their kernels are compiled once
# for both); RMSprop and Adagrad are two more kernels.
CASES = {
    "adam_l2": (refopt.Adam, FUSED, {"weight_decay": 0.1}),
    "amsgrad": (refopt.Adam, FUSED, {"amsgrad": True}),
    "adamw": (refopt.AdamW, FUSED, {"weight_decay": 0.1}),
    "sgd_momentum": (refopt.SGD, OPMATH, {"momentum": 0.9}),
    "rmsprop": (refopt.RMSprop, OPMATH, {"momentum": 0.5, "centered": True}),
    "adagrad": (refopt.Adagrad, OPMATH, {}),
}


def bits(a):
    return np.asarray(a).view(np.uint16)


def no_staged(*args, **kwargs):
    raise AssertionError("backend='cpu' took the staged step")


def values(rng, shape, dtype, scale):
    """Random values in float32 rounded to ``dtype``: gradients up to ~3000 (g*g overflows
    float16), tiny ones (float16 subnormals) and zeros."""
    x = rng.standard_normal(shape).astype(np.float32) * np.float32(scale)
    tiny = rng.random(shape) < 0.2
    x[tiny] *= np.float32(1e-6)
    x[rng.random(shape) < 0.05] = 0
    return x.astype(dtype)


def run_both(cls, conv, kw, dtypes, shapes, steps, seed, lr=0.01):
    """The same steps on backend="reference" and "cpu" (the staged step forbidden there):
    returns both optimizers and both variable lists."""
    rng = np.random.default_rng(seed)
    init = [values(rng, s, d, 2.0) for s, d in zip(shapes, dtypes)]
    grads = [[values(rng, s, d, 300.0) for s, d in zip(shapes, dtypes)] for _ in range(steps)]
    out = []
    for backend in ("reference", "cpu"):
        w = [a.copy() for a in init]
        opt = cls(learning_rate=lr, convention=conv, backend=backend, **kw)
        with pytest.MonkeyPatch.context() as m:
            if backend == "cpu":
                m.setattr(staged, "compute", no_staged)
            for gs in grads:
                opt.apply_gradients([(g.copy(), v) for g, v in zip(gs, w)])
        out.append((opt, w))
    return out


def assert_same_bits(ref, cpu):
    (o_ref, w_ref), (o_cpu, w_cpu) = ref, cpu
    for k, (a, b) in enumerate(zip(w_ref, w_cpu)):
        assert b.dtype == a.dtype
        assert np.array_equal(bits(a), bits(b)), f"variable {k} ({a.dtype})"
        for name in o_ref._slot_names():
            sa, sb = o_ref.get_slot(a, name), o_cpu.get_slot(b, name)
            assert sb.dtype == a.dtype
            assert np.array_equal(bits(sa), bits(sb)), f"slot {name} of variable {k}"
    assert o_ref.iterations == o_cpu.iterations


@pytest.mark.parametrize("case", list(CASES))
@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**31 - 1),
       sizes=st.lists(st.integers(1, 300), min_size=1, max_size=3),
       bf16=st.lists(st.booleans(), min_size=3, max_size=3),
       lr=st.sampled_from([0.01, 0.1, 1e-3]))
def test_cpu_equals_reference_bit_for_bit(case, seed, sizes, bf16, lr):
    cls, conv, kw = CASES[case]
    dtypes = [BF16 if b else F16 for b in bf16[:len(sizes)]]
    ref, cpu = run_both(cls, conv, kw, dtypes, [(n,) for n in sizes], 3, seed,
                        lr)
    assert_same_bits(ref, cpu)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("case", ["adam_l2", "adamw"])
def test_inf_nan_and_overflow_give_the_same_bits(dtype, case):
    # NaN signs and payloads, infinities, overflow past 65504 (float16), signed zeros
    cls, conv, kw = CASES[case]
    w0 = np.array([1, -1, 0.5, 2, -0.0, 0, 3, 1e-4], np.float32).astype(dtype)
    gs = [np.array([np.inf, -np.inf, np.nan, 6e4, -0.0, 1e-7, -3e4, 0], np.float32),
          np.array([1, 2, 3, -4, 5, np.nan, 7, 8], np.float32)]
    got = []
    for backend in ("reference", "cpu"):
        w = w0.copy()
        opt = cls(learning_rate=0.1, convention=conv, backend=backend, **kw)
        with pytest.MonkeyPatch.context() as m:
            if backend == "cpu":
                m.setattr(staged, "compute", no_staged)
            for g in gs:
                opt.apply_gradients([(g.astype(dtype), w)])
        got.append([bits(w).copy()] + [bits(opt.get_slot(w, n)).copy()
                                       for n in opt._slot_names()])
    assert np.isnan(got[0][0].view(dtype).astype(np.float32)).sum() >= 3
    for a, b in zip(*got):
        assert np.array_equal(a, b)


def test_mixed_dtypes_and_the_parallel_kernel():
    # float16, bfloat16 and float32 variables in one step: one fused call per dtype; the
    # large one (more than PARALLEL_MIN_ELEMENTS) on the parallel kernel
    n = PARALLEL_MIN_ELEMENTS + 12345
    cls, conv, kw = CASES["adam_l2"]  # the kernels of the test above (float32: the golden
    # case torch/adam_l2_fused_f32's)
    ref, cpu = run_both(cls, conv, kw, [F16, BF16, np.dtype(np.float32), F16],
                        [(3, 5), (7,), (4,), (n,)], 2, 11)
    assert_same_bits(ref, cpu)
    m = cpu[0].get_slot(cpu[1][3], "m").astype(np.float32)
    assert np.count_nonzero(m) > n // 2  # the kernel ran over the large one


def test_the_framework_values_on_the_kernels(monkeypatch):
    # torch 2.13's fused Adam on float16 and bfloat16 parameters (golden cases), replayed
    # on backend="cpu" without the staged step
    ids = [e["id"] for e in conf.load_manifest()
           if e["id"].startswith("torch/") and "fused" in e["id"]
           and e["id"].endswith(("_f16", "_bf16"))]
    assert len(ids) >= 5
    by_id = {e["id"]: e for e in conf.load_manifest()}
    monkeypatch.setattr(staged, "compute", no_staged)
    for cid in ids:
        r = conf.replay(by_id[cid], backend="cpu")
        assert r.passed and r.max_ulp == 0, (cid, r.detail)


@pytest.mark.parametrize("kw, conv", [
    ({"use_ema": True, "ema_momentum": 0.9}, FUSED),  # the EMA is computed in the dtype
    ({"clipvalue": 0.3}, FUSED),  # clipping too
    ({}, get_convention(FUSED, low_precision_compute="dtype")),  # every op in float16
])
def test_what_stays_on_the_staged_step_gives_the_same_bits(kw, conv):
    rng = np.random.default_rng(5)
    w0 = values(rng, (9,), F16, 2.0)
    gs = [values(rng, (9,), F16, 300.0) for _ in range(3)]
    got = []
    for backend in ("reference", "cpu"):
        w = w0.copy()
        opt = refopt.Adam(learning_rate=0.01, convention=conv, backend=backend, **kw)
        for g in gs:
            opt.apply_gradients([(g, w)])
        got.append(bits(w).copy())
    assert np.array_equal(got[0], got[1])


def test_a_raising_step_changes_nothing():
    w = np.array([1.0, -2.0, 0.5], F16)
    opt = refopt.Adam(learning_rate=0.01, convention=FUSED, backend="cpu")
    opt.apply_gradients([(np.ones(3, F16), w)])
    before = [bits(w).copy()] + [bits(opt.get_slot(w, n)).copy() for n in opt._slot_names()]
    with pytest.raises((TypeError, ValueError), match="float32"):
        opt.apply_gradients([(np.ones(3, np.float32), w)])  # a gradient of another dtype
    after = [bits(w)] + [bits(opt.get_slot(w, n)) for n in opt._slot_names()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))
    assert opt.iterations == 1
