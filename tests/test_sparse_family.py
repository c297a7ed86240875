"""The sparse family's shared pieces on ``backend="cpu"`` (issue 14): the compiled duplicate
summing gives ``IndexedSlices.deduplicate``'s bits, and FBGEMM's approximate row-wise Adagrad
runs on the gathered rows (cost of the rows touched) with the reference's bits."""

from __future__ import annotations

import numpy as np
import pytest

import refopt
from refopt.kernels.cpu._common import deduplicate


def _awkward(rng, shape, n, dtype):
    vals = (rng.standard_normal((n,) + shape[1:])
            * 10.0 ** rng.integers(-6, 6, (n,) + shape[1:])).astype(dtype)
    m = rng.random(vals.shape)
    vals[m < 0.1] = -0.0
    vals[(m > 0.1) & (m < 0.12)] = np.inf
    vals[(m > 0.12) & (m < 0.14)] = -np.inf
    vals[(m > 0.14) & (m < 0.15)] = np.nan
    idx = (rng.zipf(1.3, n) - 1) % shape[0]
    return refopt.IndexedSlices(vals, idx, shape)


def _bits(a):
    return a.dtype, a.shape, a.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(7,), (9, 3), (5, 2, 4), (6, 0)])
def test_compiled_deduplicate_is_deduplicate(dtype, shape):
    rng = np.random.default_rng(11)
    for n in (0, 1, 40, 300):
        g = _awkward(rng, shape, n, dtype)
        a, b = g.deduplicate(), deduplicate(g)
        assert a.indices.dtype == b.indices.dtype == np.int64
        assert a.indices.tolist() == b.indices.tolist()  # first-appearance order
        assert _bits(a.values) == _bits(b.values)
        assert deduplicate(b) is b and b.dense_shape == g.dense_shape


def test_compiled_deduplicate_signs_of_zero():
    # from +0: a row of -0.0 only sums to +0.0; -0.0 + x keeps x
    g = refopt.IndexedSlices(np.array([[-0.0, -0.0], [-0.0, 1.5], [-0.0, -0.0]], np.float32),
                             [4, 2, 4], (5, 2))
    d = deduplicate(g)
    assert d.indices.tolist() == [4, 2]
    assert np.signbit(d.values).tolist() == [[False, False], [False, False]]
    assert d.values.tolist() == [[0.0, 0.0], [0.0, 1.5]]


@pytest.mark.parametrize("ema", [False, True])
def test_rowwise_adagrad_approx_cpu_is_reference(ema):
    rng = np.random.default_rng(5)
    shape = (30, 8)
    start = rng.standard_normal(shape).astype(np.float32)
    grads = [refopt.IndexedSlices(rng.standard_normal((25, 8)).astype(np.float32),
                                  (rng.zipf(1.4, 25) - 1) % 30, shape) for _ in range(3)]
    absent = np.setdiff1d(np.arange(30), np.concatenate([g.indices for g in grads]))
    out = {}
    for backend in ("reference", "cpu"):
        table = start.copy()
        opt = refopt.RowWiseAdagrad(learning_rate=0.1, exact=False, weight_decay=0.01,
                                    weight_decay_mode="l2", use_ema=ema, backend=backend)
        for g in grads:
            opt.apply_gradients([(g, table)])
        acc = opt.get_slot(table, "accumulator")
        assert table[absent].tobytes() == start[absent].tobytes()  # absent rows stay
        assert not np.any(acc[absent])
        out[backend] = (table.tobytes(), acc.tobytes())
    assert out["cpu"] == out["reference"]


def test_rowwise_adagrad_approx_applies_each_occurrence():
    # the README's example: two occurrences of row 0, each a step of its own
    g = refopt.IndexedSlices(np.array([[1, 0, 0, 0], [1, 0, 0, 0]], np.float32), [0, 0], (2, 4))
    for backend in ("reference", "cpu"):
        table = np.zeros((2, 4), np.float32)
        opt = refopt.RowWiseAdagrad(learning_rate=1.0, exact=False, backend=backend)
        opt.apply_gradients([(g, table)])
        assert table[0].tolist() == [np.float32(-3.4142136).item(), 0, 0, 0]
        assert table[1].tolist() == [0] * 4
        assert opt.get_slot(table, "accumulator").tolist() == [0.5, 0.0]


@pytest.mark.parametrize("name, shown", [("RowWiseAdagrad", "RowWiseAdagrad (fbgemm)"),
                                         ("ProximalAdagrad", "ProximalAdagrad (tf1)"),
                                         ("ProximalGradientDescent",
                                          "ProximalGradientDescent (tf1)")])
def test_demo_trains_with_the_sparse_family(name, shown, capsys):
    from refopt.cli import main

    small = ["--max-tokens", "4000", "--epochs", "3", "--dim", "16", "--batch-size", "256",
             "--min-count", "3", "--seed", "1", "--quiet", "--no-compare", "--words", "the"]
    assert main(["demo", *small, "--optimizer", name]) == 0
    out = capsys.readouterr().out
    assert f"sparse      {shown} is lazy here" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("loss        fell from")]
    assert len(lines) == 1 and f" {name} steps)" in lines[0]
    first, last = (float(w) for w in lines[0].split()[3:6:2])
    assert last < first
