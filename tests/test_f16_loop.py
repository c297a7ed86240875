"""float16 variables under torch's default for-loop path (``"torch"``): every torch op
computed in float32 and rounded once to float16, the op model of
:mod:`refopt.reference.bf16` with float16's rounding and tail. The whole trajectories are the
golden cases ``torch/*_loop_f16``, ``torch/adagrad_f16`` and ``torch/sgd_momentum_f16``
(``tests/test_conformance.py -k _f16``, all 0 ulp); the op values below were recorded from
torch 2.13 (CPU, AVX2) on inputs where the plausible float32 formulas disagree
(``conformance/generators/probe_f16_ops.py`` prints them).
"""

import warnings

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.indexed_slices import IndexedSlices
from refopt.reference import bf16 as L

F16 = np.dtype(np.float16)


def bits(a):
    return np.asarray(a).view(np.uint16)


def from_bits(b, n=33):
    """``n`` copies of the float16 with bits ``b``: element 0 lies in the vectorised body,
    element 32 in the scalar tail (numel % 32)."""
    return np.full(n, b, np.uint16).view(F16)


# torch 2.13, float16: (op, inputs' bits, result bits at element 0 (body), at 32 (tail))
TORCH_OPS = [
    # a.lerp(b, 0.9) = fma(0.9 - 1, b - a, b); b - (b - a)*(1 - 0.9) gives 14840
    ("lerp", (47687, 15190), 14841, 14841),
    # a.addcmul(b, c, value=0.37) = fma(0.37*b, c, a); a + 0.37*b*c rounds differently
    ("addcmul", (13415, 47935, 14946), 8179, 8179),
    # a.addcdiv(b, c, value=-0.37) = a + (-0.37*b)/c; a + -0.37*(b/c) rounds differently
    ("addcdiv", (16218, 16085, 13697), 4662, 4662),
    # a.add(b, alpha=0.37): fma(b, R(alpha), a) in the body, a + R(b*R(alpha)) in the tail
    ("add", (13769, 47576), 11734, 11736),
]


@pytest.mark.parametrize("op, ins, body, tail", TORCH_OPS, ids=[t[0] for t in TORCH_OPS])
def test_each_op_is_torchs_in_the_body_and_the_tail(op, ins, body, tail):
    args = [from_bits(b) for b in ins]
    out = {"lerp": lambda a, b: L.lerp(a, b, 0.9),
           "addcmul": lambda a, b, c: L.addcmul(a, b, c, 0.37),
           "addcdiv": lambda a, b, c: L.addcdiv(a, b, c, -0.37),
           "add": lambda a, b: L.add(a, b, alpha=0.37)}[op](*args)
    assert out.dtype == F16 and out.shape == (33,)
    assert int(bits(out)[0]) == body and int(bits(out)[32]) == tail
    assert (bits(out)[:32] == body).all()


@pytest.mark.parametrize("n", [1, 31, 32, 63, 65, 100])
def test_the_tail_is_numel_mod_32(n):
    # torch 2.13 (probe_f16_ops.py): the last n % 32 elements take the tail's formula
    out = bits(L.add(from_bits(13769, n), from_bits(47576, n), alpha=0.37))
    want = np.where(np.arange(n) < n - n % 32, 11734, 11736)
    np.testing.assert_array_equal(out, want)


def test_scalars_kept_in_float32_except_add():
    # torch 2.13: f16 [3].mul_(1 + 3*2**-12) -> 3.001953125 (rounded to float16 first, the
    # scalar would give a tie, 3.00390625); f16 [1].add_(2**-11 + 2**-22) -> 1.0 (the scalar
    # rounded to float16 first, a tie to even; in float32 it would give 1 + 2**-10)
    assert float(L.mul_s(np.array([3.0], F16), 1 + 3 * 2.0**-12)[0]) == 3.001953125
    assert float(L.add_s(np.array([1.0], F16), 2.0**-11 + 2.0**-22)[0]) == 1.0


def _golden(case_id):
    return {e["id"]: e for e in conformance.load_manifest()}[case_id]


def test_the_old_float16_arithmetic_misses_the_goldens(monkeypatch):
    # the replays are not vacuous: NumPy's float16 (every op rounded), the path before,
    # misses torch's bits (it carried 16-32 ulp); without the tail the SGD case misses too
    real = L.takes
    monkeypatch.setattr(L, "takes", lambda opt, dtype, sparse=False: (
        dtype != F16 and real(opt, dtype, sparse)))
    for cid in ("torch/adagrad_f16", "torch/rmsprop_loop_f16"):
        r = conformance.replay(_golden(cid), backend="reference")
        assert not r.passed and r.max_ulp >= 1, cid
    monkeypatch.setattr(L, "takes", real)
    # the average as NumPy's float16 (1 - mu rounded to float16, w - avg rounded) misses too
    monkeypatch.setattr(L, "takes_average", lambda opt, dtype: False)
    r = conformance.replay(_golden("torch/sgd_ema_loop_f16"), backend="reference")
    assert not r.passed and r.max_ulp >= 1
    monkeypatch.undo()
    monkeypatch.setattr(L, "TAIL_LANES_F16", 10**9)
    r = conformance.replay(_golden("torch/sgd_loop_f16"), backend="reference")
    assert not r.passed and r.max_ulp >= 1


def test_division_by_zero_gives_torchs_infinities():
    # eps 1e-8 rounds to 0 in float16: a v that underflows divides m by 0, as torch does
    e = _golden("torch/adam_eps8_loop_f16")
    r = conformance.replay(e, backend="reference")
    assert r.passed and r.max_ulp == 0
    _, _, params, _ = conformance.load_case(e)
    last = np.concatenate([np.ravel(a) for a in params[-1]])
    assert np.isinf(last).any() and np.isfinite(last).any()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_adamw_state_is_float16_and_matches_the_ops(backend):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(37).astype(F16)
    g = (rng.standard_normal(37) * 0.1).astype(F16)
    w0 = w.copy()
    opt = refopt.AdamW(learning_rate=0.01, epsilon=1e-3, weight_decay=0.05,
                       convention="torch", backend=backend)
    opt.apply_gradients([(g, w)])
    m, v = opt.get_slot(w, "m"), opt.get_slot(w, "v")
    assert w.dtype == m.dtype == v.dtype == F16
    z = np.zeros(37, F16)
    p, m1, v1, _ = L.adam(w0, g, z, z, None, learning_rate=0.01, beta_1=0.9, beta_2=0.999,
                          epsilon=1e-3, step=1, weight_decay=0.05, decoupled=True)
    assert (bits(w) == bits(p)).all() and (bits(m) == bits(m1)).all()
    assert (bits(v) == bits(v1)).all()
    assert (bits(w) != bits(w0)).any()


def test_what_the_model_does_not_take_keeps_numpys_float16():
    # taken: torch's for-loop kinds, dense, with clipping or the EMA; not: sparse gradients,
    # another convention, a knob changed, another optimizer (all as before)
    from refopt.conventions import get_convention

    assert L.takes(refopt.SGD(momentum=0.9, convention="torch"), F16)
    assert L.takes(refopt.Adam(convention="torch", clipnorm=1.0), F16)
    assert L.takes(refopt.SGD(convention="torch", use_ema=True), F16)
    assert L.takes(refopt.RMSprop(convention="torch_fused"), F16)  # torch's only RMSprop
    assert not L.takes(refopt.SGD(convention="torch"), F16, sparse=True)
    assert not L.takes(refopt.Adam(convention="torch_fused"), F16)  # float32 compute
    assert not L.takes(refopt.SGD(convention="tf_keras"), F16)
    assert not L.takes(refopt.Adafactor(convention="torch"), F16)  # (Nadam: bf16_torch_more)
    assert not L.takes(refopt.SGD(convention=get_convention("torch", sqrt="ieee")), F16)


def test_sparse_float16_still_steps_with_numpys_float16():
    w = np.array([[1.0, 2.0], [3.0, 4.0]], F16)
    opt = refopt.Adagrad(learning_rate=0.1, convention="torch", backend="reference")
    g = IndexedSlices(np.full((1, 2), 0.5, F16), np.array([1]), (2, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        opt.apply_gradients([(g, w)])
    # row 1: acc 0.25, w - 0.1 * 0.5 / (0.5 + 1e-10) = w - 0.1 (row 0 untouched)
    assert w[0].tolist() == [1.0, 2.0]
    np.testing.assert_array_equal(w[1], np.array([3.0, 4.0], F16) - np.float16(0.1))
    assert opt.get_slot(w, "accumulator").tolist() == [[0.0, 0.0], [0.25, 0.25]]


def test_ema_average_of_float16_is_torchs_lerp():
    # torch 2.13 (probe_f16_ops.py): AveragedModel(get_ema_multi_avg_fn(0.9)) on float16,
    # the first update copies, the second lerp_(w, 0.1) in float32, rounded once; NumPy's
    # float16 (1 - mu rounded to float16, w - avg rounded) gives 15671, 13075, 14421
    avg = np.array([15671, 13068, 14420], np.uint16).view(F16)
    w = np.array([15676, 13143, 14435], np.uint16).view(F16)
    assert (bits(L.ema_torch(avg, w, 0.9, first_step=True)) == bits(w)).all()
    out = L.ema_torch(avg, w, 0.9, first_step=False)
    assert out.dtype == F16 and bits(out).tolist() == [15672, 13076, 14422]


@pytest.mark.parametrize("case_id", ["torch/sgd_nesterov_loop_f16", "torch/sgd_ema_loop_f16"])
def test_cuda_takes_its_host_step_with_the_golden_bits(case_id):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("no CUDA device")
    r = conformance.replay(_golden(case_id), backend="cuda")
    assert r.passed and r.max_ulp == 0


def test_cuda_averages_float16_as_the_reference_under_torch_fused():
    # SGD(fused=True) on float16 otherwise runs the device kernels; its AveragedModel EMA
    # (torch's lerp on Half) is the host step's, every variable averaged
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("no CUDA device")
    from refopt.executors.cuda import HostStepWarning

    rng = np.random.default_rng(3)
    init = [rng.standard_normal(n).astype(F16) for n in (37, 5)]
    kw = {"learning_rate": 0.1, "momentum": 0.9, "use_ema": True, "ema_momentum": 0.9,
          "convention": "torch_fused"}
    ref, dev = refopt.SGD(backend="reference", **kw), refopt.SGD(backend="cuda", **kw)
    hv, dv = [x.copy() for x in init], [kc.to_device(x) for x in init]
    for t in range(3):
        g = [rng.standard_normal(x.shape).astype(F16) for x in init]
        if t == 1:
            g[1] = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", HostStepWarning)
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            ref.apply_gradients(zip(g, hv))
            dev.apply_gradients(zip([None if x is None else kc.to_device(x) for x in g], dv))
        for h, d in zip(hv, dv):
            assert (bits(d.copy_to_host()) == bits(h)).all()
            assert (bits(ref._averages[ref._index[id(h)]]) == bits(
                dev._averages[dev._index[id(d)]].copy_to_host())).all()
    assert set(dev._state.fallbacks) == {
        "float16 averaged as torch's AveragedModel (refopt.reference.bf16)"}
