"""PyTorch's SGD on a sparse gradient (issue 14): each occurrence in turn, on the rows only.

The framework values below come from torch 2.13 (``torch.optim.SGD`` on an uncoalesced
``torch.sparse_coo_tensor``, as ``nn.Embedding(sparse=True)`` gives); the golden cases
``torch/sgd_sparse_*`` replay the longer trajectories (tests/test_conformance.py).
"""

from __future__ import annotations

import numpy as np
import pytest

import refopt
from refopt import reference as ref
from refopt.kernels import cpu as kcpu

BACKENDS = ("reference", "cpu")
F32 = np.float32


def _dup_grad():
    return refopt.IndexedSlices(np.array([[1, 2], [3, 4]], F32), [1, 1], (3, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_duplicates_in_turn_torch_value(backend):
    # torch 2.13: p.add_(grad, alpha=-0.1) adds [1, 2] then [3, 4]; summing first gives
    # [0.20000002, -0.20000003] after two steps (the dense step on [4, 6]).
    table = np.ones((3, 2), F32)
    opt = refopt.SGD(learning_rate=0.1, convention="torch", backend=backend)
    opt.apply_gradients([(_dup_grad(), table)])
    np.testing.assert_array_equal(table, np.array([[1, 1], [0.5999999642372131,
                                                            0.4000000059604645], [1, 1]], F32))
    opt.apply_gradients([(_dup_grad(), table)])
    expected = np.array([[1, 1], [0.19999995827674866, -0.20000000298023224], [1, 1]], F32)
    assert table.tobytes() == expected.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fma_on_rows_and_two_roundings_on_a_vector(backend):
    # torch 2.13, lr = 1/3, g = 3 on a row of ones: a row (vectorised add_) is one FMA,
    # 1 - float32(1/3)*3 exactly = -2.9802322e-08; a 1-D table (scalar loop) rounds the
    # product to 1 first: 0.
    rows = np.ones((2, 5), F32)
    vec = np.ones(2, F32)
    opt = refopt.SGD(learning_rate=1 / 3, convention="torch", backend=backend)
    opt.apply_gradients([
        (refopt.IndexedSlices(np.full((1, 5), 3, F32), [1], (2, 5)), rows),
        (refopt.IndexedSlices(np.array([3], F32), [1], (2,)), vec),
    ])
    assert set(rows[1].tolist()) == {-2.9802322387695312e-08}
    assert rows[0].tolist() == [1.0] * 5
    assert vec.tolist() == [1.0, 0.0]


def _zipf_grad(rng, shape, n, dtype):
    idx = (rng.zipf(1.3, n) - 1) % shape[0]
    vals = rng.standard_normal((n,) + shape[1:]).astype(dtype)
    return refopt.IndexedSlices(vals, idx, shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(50, 8), (30,), (20, 3, 5)])
def test_cpu_matches_reference_and_only_rows_move(dtype, shape):
    rng = np.random.default_rng(7)
    param = rng.standard_normal(shape).astype(dtype)
    param[0] = np.nan  # absent rows keep their bits, NaN included
    g = _zipf_grad(rng, shape, 200, dtype)
    g = refopt.IndexedSlices(g.values, np.where(g.indices == 0, 1, g.indices), shape)
    a = ref.sgd_sparse_torch_update(param, g, learning_rate=0.05)
    b = kcpu.sgd_sparse_torch_update(param, g, learning_rate=0.05)
    assert a.tobytes() == b.tobytes()
    absent = np.setdiff1d(np.arange(shape[0]), g.indices)
    assert a[absent].tobytes() == param[absent].tobytes()
    # duplicates are not summed first: the in-turn result differs from the summed step
    summed = g.deduplicate()
    s = ref.sgd_sparse_torch_update(param, summed, learning_rate=0.05)
    assert s.tobytes() != a.tobytes()
    # and it is the sequence of single-occurrence steps (rows: one FMA each); a 1-D table's
    # single-entry gradient rounds twice in torch 2.13, so there the sequence is the FMAs
    from refopt.reference.variants import fma

    seq = param.copy()
    neg_lr = dtype(-0.05)
    for k in range(g.indices.shape[0]):
        one = refopt.IndexedSlices(g.values[k:k + 1], g.indices[k:k + 1], shape)
        if len(shape) > 1:
            seq = ref.sgd_sparse_torch_update(seq, one, learning_rate=0.05)
        else:
            j = g.indices[k]
            seq[j] = fma(neg_lr, g.values[k], seq[j])
    assert seq.tobytes() == a.tobytes()


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_matches_function_empty_and_float16(backend):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((40, 4)).astype(F32)
    start = table.copy()
    g = _zipf_grad(rng, (40, 4), 64, F32)
    opt = refopt.SGD(learning_rate=0.2, convention="torch", backend=backend)
    opt.apply_gradients([(g, table)])
    assert table.tobytes() == ref.sgd_sparse_torch_update(start, g, learning_rate=0.2).tobytes()
    before = table.copy()
    opt.apply_gradients([(refopt.IndexedSlices(np.zeros((0, 4), F32), [], (40, 4)), table)])
    assert table.tobytes() == before.tobytes() and opt.iterations == 2
    h = np.ones((4, 2), np.float16)
    opt16 = refopt.SGD(learning_rate=0.5, convention="torch", backend=backend)
    gh = refopt.IndexedSlices(np.array([[1, 1], [2 ** -11, 2 ** -11]], np.float16), [0, 0],
                              (4, 2))
    opt16.apply_gradients([(gh, h)])
    # 1 - 0.5 = 0.5, then 0.5 - 2**-12 = 0.49975586 (exact in float16; summed: 0.5)
    assert h[0].tolist() == [0.499755859375] * 2 and h[1:].tolist() == [[1, 1]] * 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_weight_decay_refused_and_nothing_changes(backend):
    # torch 2.13 raises "add(sparse, dense) is not supported" for weight_decay != 0
    table = np.ones((3, 2), F32)
    opt = refopt.SGD(learning_rate=0.1, weight_decay=0.01, convention="torch",
                     backend=backend)
    opt.build([table])
    with pytest.raises(TypeError, match="IndexedSlices"):
        opt.apply_gradients([(_dup_grad(), table)])
    assert table.tolist() == [[1, 1]] * 3 and opt.iterations == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_momentum_keeps_torch_sparse_buffer(backend):
    # With momentum torch keeps an uncoalesced sparse buffer (issue 14 part 2; it used to be
    # densified here). torch 2.13, golden torch/sgd_sparse_momentum_dup_f32: buffer entries
    # [1, 1] with [[1.9, 3.8], [5.7, 7.6]] (float32) after two steps, applied in turn.
    g = _dup_grad()
    table = np.ones((3, 2), F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend=backend)
    for _ in range(2):
        opt.apply_gradients([(g, table)])
    expected = np.array([[1, 1], [-0.1600000262260437, -0.7400000095367432], [1, 1]], F32)
    assert table.tobytes() == expected.tobytes()
    m = np.array([[0, 0], [7.599999904632568, 11.399999618530273], [0, 0]], F32)
    assert opt.get_slot(table, "m").tobytes() == m.tobytes()  # torch's buf.to_dense()
    dense = np.ones((3, 2), F32)  # the densified step is other bits
    opt_d = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend=backend)
    for _ in range(2):
        opt_d.apply_gradients([(g.to_dense(), dense)])
    assert dense.tobytes() != table.tobytes()


def test_function_argument_errors():
    p = np.ones((3, 2), F32)
    g = _dup_grad()
    with pytest.raises(TypeError, match="`grad` must be an IndexedSlices"):
        ref.sgd_sparse_torch_update(p, np.ones((3, 2), F32), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"grad.dense_shape=\(3, 2\), param.shape=\(4, 2\)"):
        ref.sgd_sparse_torch_update(np.ones((4, 2), F32), g, learning_rate=0.1)
    with pytest.raises(TypeError, match="dtype=float32, param with dtype=float64"):
        kcpu.sgd_sparse_torch_update(np.ones((3, 2)), g, learning_rate=0.1)
    with pytest.raises(ValueError, match="learning_rate"):
        kcpu.sgd_sparse_torch_update(p, g, learning_rate=float("nan"))
    with pytest.raises(TypeError, match="`param` must be an ndarray"):
        ref.sgd_sparse_torch_update([[1.0, 1.0]] * 3, g, learning_rate=0.1)
    assert p.tolist() == [[1, 1]] * 3


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_float16_table_rounds_the_product_as_torch(backend):
    # torch 2.13, SGD(lr=0.1) on a float16 nn.Embedding(sparse=True): c10::Half arithmetic,
    # w + round(round(-lr) * g), no FMA. Regression (found by a user test): refopt took one
    # FMA and gave 0x20bd where torch gives 0x20c0.
    w = np.array([[-0.0757]], np.float16)
    g = refopt.IndexedSlices(np.array([[-0.8496]], np.float16), [0], (1, 1))
    refopt.SGD(learning_rate=0.1, convention="torch", backend=backend).apply_gradients(
        [(g, w)])
    assert int(w.view(np.uint16)[0, 0]) == 0x20C0
