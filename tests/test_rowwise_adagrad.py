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
