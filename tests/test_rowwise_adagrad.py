import numpy as np
import pytest
from test_properties import assert_bits_equal_nan_aware

import refopt
from refopt import IndexedSlices
from refopt.reference import (
    rowwise_adagrad_initial_state,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)

F = np.float32


def f32(x):
    return np.asarray(x, F)


def naive_sequential(w, g, acc, **kw):
    """FBGEMM's approximate form by its definition: one occurrence after another, each a
    one-row exact step of the reference."""
    from refopt.reference import rowwise_adagrad_rows

    w, acc = w.copy(), acc.copy()
    for k, r in enumerate(g.indices):
        nw, na = rowwise_adagrad_rows(w[r:r + 1], g.values[k:k + 1], acc[r:r + 1], **kw)
        w[r:r + 1], acc[r:r + 1] = nw, na
    return w, acc


def test_one_row_by_hand():
    # acc = mean(3^2, 4^2) = 12.5; w = 1 - 0.1*g/sqrt(12.5) (1e-8 vanishes in float32)
    w = np.ones((2, 2), F)
    r = rowwise_adagrad_update(w, f32([[3, 4], [0, 0]]), np.zeros(2, F), learning_rate=0.1)
    mult = F(0.1) / (np.sqrt(F(12.5)) + F(1e-8))
    assert r.accumulator.tolist() == [12.5, 0.0]
    np.testing.assert_array_equal(r.param[0], F(1) - f32([3, 4]) * mult)
    np.testing.assert_array_equal(r.param[1], [1, 1])   # zero gradient: w - 0


def test_duplicates_are_summed_first_then_squared():
    # rows [1, 1] with [1, 2] and [2, 2]: the coalesced row is [3, 4], mean square 12.5
    # (not (1 + 4 + 4 + 4) / 2 = 6.5, the squares of each occurrence)
    g = IndexedSlices(f32([[1, 2], [2, 2]]), [1, 1], (3, 2))
    r = rowwise_adagrad_update(np.ones((3, 2), F), g, np.zeros(3, F), learning_rate=0.1)
    assert r.accumulator.tolist() == [0.0, 12.5, 0.0]
    dense = rowwise_adagrad_update(np.ones((1, 2), F), f32([[3, 4]]), np.zeros(1, F),
                                   learning_rate=0.1)
    np.testing.assert_array_equal(r.param[1], dense.param[0])
    np.testing.assert_array_equal(r.param[[0, 2]], np.ones((2, 2), F))


def test_approximate_form_applies_each_occurrence_in_turn():
    g = IndexedSlices(f32([[1.0], [1.0]]), [0, 0], (1, 1))
    r = rowwise_adagrad_sequential_update(np.zeros((1, 1), F), g, np.zeros(1, F),
                                          learning_rate=1.0)
    # first: acc 1, w = -1; second: acc 2, w = -1 - 1/sqrt(2)
    assert r.accumulator.tolist() == [2.0]
    assert r.param[0, 0] == F(-1) - F(1) / (np.sqrt(F(2)) + F(1e-8))


def test_absent_rows_and_empty_gradients_change_nothing():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 4)).astype(F)
    acc = np.full(5, 0.5, F)
    empty = IndexedSlices(np.zeros((0, 4), F), np.zeros(0, np.int64), (5, 4))
    r = rowwise_adagrad_update(w, empty, acc, learning_rate=0.1, weight_decay=0.1,
                               weight_decay_mode="decoupled")
    np.testing.assert_array_equal(r.param, w)
    np.testing.assert_array_equal(r.accumulator, acc)


def test_weight_decay_modes():
    w, g, acc = f32([[2.0, -1.0]]), f32([[0.5, 0.25]]), np.zeros(1, F)
    none = rowwise_adagrad_update(w, g, acc, learning_rate=0.1)
    dec = rowwise_adagrad_update(w, g, acc, learning_rate=0.1, weight_decay=0.5,
                                 weight_decay_mode="decoupled")
    l2 = rowwise_adagrad_update(w, g, acc, learning_rate=0.1, weight_decay=0.5,
                                weight_decay_mode="l2")
    assert dec.accumulator.tolist() == none.accumulator.tolist()  # decay outside the sum
    # decoupled: (1 - lr*wd)*w - g*mult (here exact: 0.95*w and mult*g are representable
    # to within one rounding each, and the fma rounds once)
    mult = F(0.1) / (np.sqrt(none.accumulator[0]) + F(1e-8))
    expect = (np.float64(F(1) - F(0.1) * F(0.5)) * np.float64(w)
              - np.float64(g * mult)).astype(F)
    np.testing.assert_array_equal(dec.param, expect)
    # L2: the sum of squares sees g + wd*w = [1.5, -0.25]: mean 1.15625
    assert l2.accumulator[0] == (F(1.5) ** 2 + F(0.25) ** 2) / F(2)


def test_bad_input_is_refused_and_names_the_argument():
    w = np.ones((3, 2), F)
    with pytest.raises(ValueError, match="weight_decay_mode.*Received: weight_decay_mode='x'"):
        rowwise_adagrad_update(w, w, np.zeros(3, F), weight_decay_mode="x")
    with pytest.raises(ValueError, match=r"accumulator.*shape \(3,\)"):
        rowwise_adagrad_update(w, w, np.zeros((3, 2), F))
    with pytest.raises(TypeError, match="grad.*dtype"):
        rowwise_adagrad_update(w, w.astype(np.float64), np.zeros(3, F))
    with pytest.raises(ValueError, match="RowWiseAdagrad does not exist under "
                                         "convention='tf_keras'"):
        rowwise_adagrad_update(w, w, np.zeros(3, F), convention="tf_keras")
    assert rowwise_adagrad_initial_state(w).shape == (3,)


@pytest.mark.parametrize("backend", ["reference", "cpu", "cuda"])
@pytest.mark.parametrize("exact", [True, False])
def test_class_matches_the_reference_on_every_backend(backend, exact):
    rng = np.random.default_rng(1)
    table = rng.standard_normal((7, 4)).astype(F)
    kw = dict(learning_rate=0.1, epsilon=1e-3, weight_decay=0.1, weight_decay_mode="l2")
    opt = refopt.RowWiseAdagrad(exact=exact, backend=backend, **kw)
    var = table.copy()
    if backend == "cuda":
        from numba import cuda
        var = cuda.to_device(table)
    ref_w, ref_a = table.copy(), np.zeros(7, F)
    step = rowwise_adagrad_update if exact else rowwise_adagrad_sequential_update
    for k, idx in enumerate(([1, 3, 1], [], [6, 6, 6, 0])):
        vals = rng.standard_normal((len(idx), 4)).astype(F)
        g = IndexedSlices(vals, np.asarray(idx, np.int64), (7, 4))
        opt.apply_gradients([(g, var)])
        r = step(ref_w, g, ref_a, **kw)
        ref_w, ref_a = r.param, r.accumulator
        got = var.copy_to_host() if backend == "cuda" else var
        acc = opt.get_slot(var, "accumulator")
        acc = acc.copy_to_host() if hasattr(acc, "copy_to_host") else acc
        np.testing.assert_array_equal(got, ref_w, err_msg=f"step {k + 1}")
        np.testing.assert_array_equal(acc, ref_a, err_msg=f"step {k + 1}")


@pytest.mark.parametrize("mode", ["none", "l2", "decoupled"])
def test_cpu_row_kernel_is_bit_identical_to_the_reference(mode):
    from refopt.kernels import cpu
    from refopt.reference import rowwise_adagrad_rows

    rng = np.random.default_rng(2)
    w = (rng.standard_normal((50, 24)) * 10.0 ** rng.uniform(-3, 3, (50, 1))).astype(F)
    g = (rng.standard_normal((50, 24)) * 10.0 ** rng.uniform(-4, 2, (50, 1))).astype(F)
    g[3, 5], g[7, 0], w[9, 1] = np.inf, np.nan, -np.inf
    acc = rng.uniform(0, 2, 50).astype(F)
    kw = dict(learning_rate=0.05, epsilon=1e-6, weight_decay=0.3, weight_decay_mode=mode)
    want = rowwise_adagrad_rows(w, g, acc, **kw)
    got = cpu.rowwise_adagrad_rows(w, g, acc, **kw)
    for a, b in zip(got, want):  # bit for bit; a NaN may have the other sign
        assert_bits_equal_nan_aware(a, b)


# FBGEMM 1.8.0 (fbgemm-gpu-cpu, SplitTableBatchedEmbeddingBagsCodegen, EXACT_ROWWISE_ADAGRAD,
# PoolingMode.NONE, CPU) on a 1x4 table of ones, eps 1e-8, one lookup of row 0: its weights
# and momentum1 after the step. The decay factor 1 - x*wd is one fma there: unfused, the L2
# row would be [-0.92153788, 0.67974365 x3] and the decoupled ones 0.97 and 0.70299995.
_FBGEMM_DECAY = [
    ("l2", 1.0, 0.2, [1, 0, 0, 0],
     [-0.9215378165245056, 0.6797437071800232, 0.6797437071800232, 0.6797437071800232],
     0.38999998569488525),
    ("decoupled", 0.3, 0.1, [0, 0, 0, 0], [0.9699999690055847] * 4, 0.0),
    ("decoupled", 1.1, 0.27, [0, 0, 0, 0], [0.703000009059906] * 4, 0.0),
]


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("mode, lr, wd, g, want_w, want_a", _FBGEMM_DECAY)
def test_decay_factor_is_one_fma_as_fbgemm(backend, mode, lr, wd, g, want_w, want_a):
    from refopt.kernels import cpu

    fn = rowwise_adagrad_update if backend == "reference" else cpu.rowwise_adagrad_update
    r = fn(np.ones((1, 4), F), f32([g]), np.zeros(1, F), learning_rate=lr, epsilon=1e-8,
           weight_decay=wd, weight_decay_mode=mode)
    np.testing.assert_array_equal(r.param, f32([want_w]))
    np.testing.assert_array_equal(r.accumulator, f32([want_a]))


def test_keras3_sparse_square_convention_is_refused():
    from refopt.conventions import get_convention

    conv = get_convention("fbgemm").replace(keras3_sparse_square=True)
    for exact in (True, False):
        with pytest.raises(ValueError, match="RowWiseAdagrad cannot take a convention with "
                                             "keras3_sparse_square=True"):
            refopt.RowWiseAdagrad(0.1, exact=exact, convention=conv, backend="reference")


@pytest.mark.parametrize("mode", ["none", "l2", "decoupled"])
def test_approximate_form_rounds_and_cpu_loop_match_the_definition(mode):
    from refopt.kernels import cpu

    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 5)).astype(F)
    acc = rng.uniform(0, 1, 9).astype(F)
    idx = np.array([4, 2, 4, 4, 0, 2, 8, 4, 0])  # row 4 four times, 2 and 0 twice
    g = IndexedSlices(rng.standard_normal((9, 5)).astype(F), idx, (9, 5))
    kw = dict(learning_rate=0.7, epsilon=1e-3, weight_decay=0.0 if mode == "none" else 0.2,
              weight_decay_mode=mode)
    w0, acc0 = w.copy(), acc.copy()
    want_w, want_a = naive_sequential(w, g, acc, **kw)
    for fn in (rowwise_adagrad_sequential_update, cpu.rowwise_adagrad_sequential_update):
        r = fn(w, g, acc, **kw)
        np.testing.assert_array_equal(r.param, want_w)
        np.testing.assert_array_equal(r.accumulator, want_a)
        np.testing.assert_array_equal(w, w0)  # pure: the arrays given do not move
        np.testing.assert_array_equal(acc, acc0)


def test_cpu_approximate_step_is_one_compiled_loop(monkeypatch):
    from refopt.kernels.cpu import rowwise_adagrad as cpu_rw

    def forbidden(*a, **k):
        raise AssertionError("the reference's per-round step was called")

    monkeypatch.setattr(cpu_rw._ref, "rowwise_adagrad_rows", forbidden)
    monkeypatch.setattr(cpu_rw._ref, "rowwise_adagrad_sequential_update", forbidden)
    table = np.ones((50, 8), F)
    g = IndexedSlices(np.ones((2000, 8), F), np.zeros(2000, np.int64), (50, 8))
    opt = refopt.RowWiseAdagrad(0.1, exact=False, backend="cpu")
    opt.apply_gradients([(g, table)])
    assert opt.get_slot(table, "accumulator")[0] > 0 and table[0, 0] < 1


@pytest.mark.parametrize("fn_name", ["rowwise_adagrad_update",
                                     "rowwise_adagrad_sequential_update"])
@pytest.mark.parametrize("where", ["reference", "cpu"])
@pytest.mark.parametrize("kw, exc, rx", [
    (dict(learning_rate=-1.0), ValueError, r"learning_rate.*>= 0.*Received: learning_rate=-1"),
    (dict(learning_rate=float("nan")), ValueError, r"learning_rate.*finite"),
    (dict(learning_rate=1e39), ValueError, r"learning_rate.*finite in float32.*=1e\+39"),
    (dict(epsilon=True), TypeError, r"epsilon.*real number"),
    (dict(weight_decay=1e39, weight_decay_mode="l2"), ValueError,
     r"weight_decay.*finite in float32"),
    (dict(weight_decay=-0.1, weight_decay_mode="l2"), ValueError, r"weight_decay.*>= 0"),
    (dict(weight_decay=0.1), ValueError, r"weight_decay. > 0 needs.*Received: weight_decay=0.1"),
    (dict(weight_decay_mode=None), ValueError, r"weight_decay_mode.*Received"),
])
def test_functions_check_their_hyperparameters_like_the_class(fn_name, where, kw, exc, rx):
    from refopt import reference
    from refopt.kernels import cpu

    fn = getattr(reference if where == "reference" else cpu, fn_name)
    w, acc = np.ones((3, 2), F), np.zeros(3, F)
    g = IndexedSlices(np.ones((2, 2), F), [1, 1], (3, 2))
    with pytest.raises(exc, match=rx):
        fn(w, g, acc, **kw)
    assert w.tolist() == [[1, 1]] * 3 and acc.tolist() == [0, 0, 0]


@pytest.mark.parametrize("kw, rx", [
    (dict(weight_decay=1e39, weight_decay_mode="decoupled"), r"weight_decay.*finite in float32"),
    (dict(epsilon=1e39), r"epsilon.*finite in float32"),
    (dict(learning_rate=1e39), r"learning_rate.*finite in float32"),
])
def test_class_refuses_hyperparameters_that_overflow_float32(kw, rx):
    with pytest.raises(ValueError, match=rx):
        refopt.RowWiseAdagrad(backend="reference", **kw)


@pytest.mark.parametrize("fn_name", ["rowwise_adagrad_update",
                                     "rowwise_adagrad_sequential_update"])
def test_integer_tables_and_lists_are_refused(fn_name):
    from refopt import reference

    fn = getattr(reference, fn_name)
    with pytest.raises(TypeError, match=r"`param` must have dtype float16, float32 or float64"
                                        r".*int64"):
        fn(np.ones((3, 2), np.int64), np.ones((3, 2), np.int64), np.zeros(3, np.int64))
    with pytest.raises(TypeError, match=r"`accumulator` must be a numpy.ndarray"):
        fn(np.ones((3, 2), F), np.ones((3, 2), F), [0.0, 0.0, 0.0])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("exact", [True, False])
def test_zero_width_table_keeps_its_accumulator(backend, exact):
    table = np.zeros((4, 0), F)
    opt = refopt.RowWiseAdagrad(0.1, exact=exact, backend=backend)
    g = IndexedSlices(np.zeros((3, 0), F), [1, 1, 3], (4, 0))
    opt.apply_gradients([(g, table)])
    opt.apply_gradients([(np.zeros((4, 0), F), table)])
    assert opt.get_slot(table, "accumulator").tolist() == [0, 0, 0, 0]  # not 0/0 = NaN
    r = rowwise_adagrad_update(table, g, np.full(4, 0.5, F), learning_rate=0.1)
    assert r.accumulator.tolist() == [0.5] * 4 and r.param.shape == (4, 0)
