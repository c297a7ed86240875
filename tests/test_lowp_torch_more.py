"""torch's other for-loop optimizers (Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop) on
float16 and bfloat16, and sparse gradients of float16 tables (SparseAdam, Adagrad), op by op
(:mod:`refopt.reference.bf16_torch_more`). Every expected bit pattern is torch 2.13's (CPU):
``conformance/generators/probe_sparse_f16.py`` for the ops, the golden cases
``torch/*_loopx_*`` / ``torch/*_sparsex_f16`` for the trajectories."""

import warnings

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.indexed_slices import IndexedSlices
from refopt.reference import bf16 as L
from refopt.reference import bf16_torch_more as M

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


def bits(a):
    return np.asarray(a).view(np.uint16)


def of_bits(values, dtype):
    return np.array(values, np.uint16).view(dtype)


# -------------------------------------------------------------------------------- the ops
def test_rtruediv_is_the_reciprocal_rounded_then_a_float32_product():
    # torch 2.13: 0.0377777777 / a (Tensor.__rtruediv__ = a.reciprocal() * s); dividing
    # directly gives another value on 42,279 of 200,000 float16 inputs (probe_sparse_f16.py)
    a = of_bits([24137], F16)
    assert bits(M.rdiv_s(0.0377777777, a)).tolist() == [1575]
    assert bits((np.float32(0.0377777777) / a.astype(np.float32)).astype(F16)).tolist() != [
        1575]
    assert bits(M.rdiv_s(0.0377777777, of_bits([17426], BF16))).tolist() == [14471]


def test_mul_by_a_float32_zero_d_tensor_keeps_it_in_float32():
    # torch: a.mul_(torch.tensor(1/3)) (ASGD's mu), the scalar not rounded to the dtype
    assert bits(L.mul_s(of_bits([12364], F16), np.float32(1 / 3))).tolist() == [10683]
    assert bits(L.mul_s(of_bits([16236], BF16), np.float32(1 / 3))).tolist() == [16029]


def test_dense_plus_sparse_on_half_rounds_the_product_first():
    # torch: y.add_(sparse_coo(x), alpha=-0.0123456789) on float16, c10::Half arithmetic
    y, x = of_bits([35959, 35929], F16), of_bits([42000, 8556], F16)
    assert bits(M._axpy_half(y, x, -0.0123456789)).tolist() == [34054, 36478]
    fma = (y.astype(np.float64) + x.astype(np.float64) * np.float64(np.float32(-0.0123456789)))
    assert bits(fma.astype(np.float32).astype(F16)).tolist() != [34054, 36478]


# --------------------------------------------------------------- whole steps against torch
_G = ([0.3, -2.0, 7.0], [0.1, 0.2, -0.3])
# torch 2.13: 7 steps on [1.0, -0.5, 0.25], gradients _G alternately (uint16 bits)
_DENSE = {
    ("RAdam", "bfloat16"): [16251, 48866, 15605],
    ("Adamax", "bfloat16"): [16241, 48876, 15956],
    ("Adadelta", "bfloat16"): [16252, 48888, 15988],
    ("Nadam", "bfloat16"): [16243, 48875, 15960],
    ("RAdam", "float16"): [15335, 46854, 10127],
    ("Adamax", "float16"): [15250, 46938, 12971],
    ("Adadelta", "float16"): [15323, 47056, 13208],
    ("Nadam", "float16"): [15262, 46954, 12996],
}
_KW = {"RAdam": {"learning_rate": 0.01, "epsilon": 1e-3},
       "Adamax": {"learning_rate": 0.01, "epsilon": 1e-3, "weight_decay": 0.05},
       "Adadelta": {"learning_rate": 1.0},
       "Nadam": {"learning_rate": 0.01, "epsilon": 1e-3}}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name,dtype", sorted(_DENSE))
def test_seven_steps_give_torchs_bits(name, dtype, backend):
    dt = BF16 if dtype == "bfloat16" else F16
    w = np.array([1.0, -0.5, 0.25], dt)
    opt = getattr(refopt, name)(convention="torch", backend=backend, **_KW[name])
    for t in range(7):
        opt.apply_gradients([(np.array(_G[t % 2], dt), w)])
    assert w.dtype == dt and bits(w).tolist() == _DENSE[name, dtype]


# torch 2.13: Rprop(lr=0.05), 4 steps with NaN, inf and signed zeros in the gradients: torch's
# sign() gives 0 for NaN (the element keeps its weight), -0.0 gradients kept in prev
_NAN = float("nan")
_RPROP_G = ([0.3, _NAN, -1.0, 0.0], [0.1, 0.2, float("inf"), -0.0], [-0.3, 0.5, 1.0, 2.0],
            [0.2, -0.1, 1.0, -0.0])
_RPROP = {"float16": ([15074, 47329, 13272, 43622], [12902, 0, 15360, 32768],
                      [10158, 10158, 10158, 10854]),
          "bfloat16": ([16220, 48924, 15995, 48461], [15949, 0, 16256, 32768],
                       [15607, 15607, 15607, 15693])}


@pytest.mark.parametrize("dtype", sorted(_RPROP))
def test_rprop_on_nonfinite_gradients_gives_torchs_bits(dtype):
    dt = BF16 if dtype == "bfloat16" else F16
    w = np.array([1.0, -0.5, 0.25, -0.0], dt)
    opt = refopt.Rprop(learning_rate=0.05, convention="torch")
    with np.errstate(all="ignore"):
        for g in _RPROP_G:
            opt.apply_gradients([(np.array(g, dt), w)])
    got = (w, opt.get_slot(w, "prev"), opt.get_slot(w, "step_size"))
    assert [bits(a).tolist() for a in got] == [list(x) for x in _RPROP[dtype]]


# torch 2.13: 3 steps of the sparse gradient rows [0, 2, 0] on a 3x2 float16 table
_SPARSE = {"LazyAdam": [[15301, 46982], [13312, 16384], [11389, 13418]],
           "Adagrad": [[14892, 46168], [13312, 16384], [45084, 11414]]}


@pytest.mark.parametrize("name", sorted(_SPARSE))
def test_sparse_float16_tables_give_torchs_bits(name):
    kw = ({"learning_rate": 0.01, "epsilon": 1e-3} if name == "LazyAdam"
          else {"learning_rate": 0.1})
    w = np.array([[1.0, -0.5], [0.25, 2.0], [0.1, 0.3]], F16)
    opt = getattr(refopt, name)(convention="torch", **kw)
    vals = np.array([[0.3, -2.0], [7.0, 0.1], [0.2, -0.3]], F16)
    for _ in range(3):
        opt.apply_gradients([(IndexedSlices(vals, np.array([0, 2, 0]), w.shape), w)])
    assert bits(w).tolist() == _SPARSE[name]


def test_sparse_float16_with_weight_decay_still_raises_and_changes_nothing():
    w = np.array([[1.0, -0.5], [0.25, 2.0]], F16)
    opt = refopt.Adagrad(learning_rate=0.1, weight_decay=0.1, convention="torch")
    assert not M.takes_sparse_f16(opt)
    opt.build([w])
    before = w.copy()
    with pytest.raises(TypeError, match="weight decay|weight_decay"):
        opt.apply_gradients([(IndexedSlices(np.ones((1, 2), F16), np.array([1]), w.shape), w)])
    assert bits(w).tolist() == bits(before).tolist()
    assert opt.get_slot(w, "accumulator").tolist() == [[0.0, 0.0], [0.0, 0.0]]


# ------------------------------------------------------------------- dispatch and refusals
def test_every_new_optimizer_is_taken_on_both_dtypes_under_torch_only():
    for cls in (refopt.Adamax, refopt.Nadam, refopt.RAdam, refopt.Adadelta, refopt.ASGD,
                refopt.Rprop):
        opt = cls(convention="torch")
        assert M.kind(opt) is not None
        assert L.takes(opt, F16) and L.takes(opt, BF16) and L.supported(opt) is None
    # not torch's form: the TF family's float16 arithmetic (every op rounded), not this model
    opt = refopt.Adamax(convention="tf_keras")
    assert M.kind(opt) is None and not L.takes(opt, F16)
    assert M.kind(refopt.Adam(convention="torch")) is None


def test_bfloat16_sparse_gradient_is_refused_naming_it_and_nothing_changes():
    w = np.array([[1.0, 2.0], [3.0, 4.0]], BF16)
    opt = refopt.Adadelta(convention="torch")
    opt.build([w])
    before = [bits(w).copy(), bits(opt.get_slot(w, "accumulated_grad")).copy()]
    with pytest.raises(TypeError, match="sparse gradient of a bfloat16 variable"):
        opt.apply_gradients([(IndexedSlices(np.ones((1, 2), BF16), np.array([1]), w.shape),
                              w)])
    assert (bits(w) == before[0]).all()
    assert (bits(opt.get_slot(w, "accumulated_grad")) == before[1]).all()
    assert opt.iterations == 0


def test_bfloat16_clipping_of_the_new_optimizers_is_refused_at_the_start():
    w = np.array([1.0, 2.0], BF16)
    opt = refopt.RAdam(convention="torch", clipnorm=1.0)
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16.*clipping"):
        opt.apply_gradients([(np.ones(2, BF16), w)])
    assert w.tolist() == [1.0, 2.0]


def test_update_rejects_an_unknown_kind():
    with pytest.raises(ValueError, match="kind_"):
        M.update(refopt.Adamax(convention="torch"), "adam", np.ones(2, F16), np.ones(2, F16),
                 {}, 0.1, 1, False)


# ------------------------------------------------------------------- golden cases on cuda
@pytest.mark.parametrize("case_id", ["torch/radam_l2_max_loopx_bf16",
                                     "torch/sparseadam_sparsex_f16"])
def test_cuda_takes_its_host_step_with_the_golden_bits(case_id):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("no CUDA device")
    entry = {e["id"]: e for e in conformance.load_manifest()}[case_id]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = conformance.replay(entry, backend="cuda")
    assert r.passed and r.max_ulp == 0


def test_numpys_float16_the_path_before_misses_the_goldens(monkeypatch):
    # the replays are not vacuous: NumPy's float16 (every op rounded) missed these by
    # 481 ulp (Adamax) and 8 (SparseAdam) over their 20 steps
    real = L.takes

    def before(opt, dtype, sparse=False):
        if dtype == F16 and (sparse or M.kind(opt) is not None):
            return False
        return real(opt, dtype, sparse)

    monkeypatch.setattr(L, "takes", before)
    by_id = {e["id"]: e for e in conformance.load_manifest()}
    for case_id in ("torch/adamax_loopx_f16", "torch/sparseadam_sparsex_f16"):
        assert not conformance.replay(by_id[case_id], backend="reference").passed
