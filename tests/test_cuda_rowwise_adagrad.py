"""RowWiseAdagrad on backend="cuda": the device row kernels (refopt.kernels.cuda.rowwise_adagrad).

Run on numba's CUDA simulator (tests/conftest.py). Every step is compared bit for bit with
the reference backend (table and accumulator), for the three forms the optimizer's update
distinguishes (dense gradient; IndexedSlices exact: duplicates summed first; approximate
``exact=False``: the occurrences in turn), the three weight decay modes, duplicate indices
whose summation order matters, an empty gradient, float32 and float64; no step may take the
host path (``HostStepWarning`` is an error here, ``_state.fallbacks`` stays empty). Also: the
FBGEMM golden cases replayed on cuda, a raising step changes nothing, what is not covered
falls back to the host step with the same numbers, and the PTX audit of the two kernels.
"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refopt
from refopt import conformance
from refopt.indexed_slices import IndexedSlices

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
from refopt.executors.cuda import HostStepWarning

F = np.float32


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    # few simulated threads per block (fast), several blocks for the rows of a launch
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 2)


def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _bits_equal(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (what, got, want)


def _steps(dtype, rng):
    """Dense, duplicates whose sum depends on the order (1e8 + 1 - 1e8 in float32), empty,
    unique, a row repeated four times."""
    big = np.full((1, 3), 1e8, dtype)
    dup = np.concatenate([big, np.ones((1, 3), dtype), -big,
                          rng.standard_normal((2, 3)).astype(dtype)])
    return [
        rng.standard_normal((6, 3)).astype(dtype),
        IndexedSlices(dup, np.array([2, 2, 2, 5, 0]), (6, 3)),
        IndexedSlices(np.zeros((0, 3), dtype), np.zeros(0, np.int64), (6, 3)),
        IndexedSlices(rng.standard_normal((2, 3)).astype(dtype), np.array([4, 1]), (6, 3)),
        IndexedSlices(rng.standard_normal((5, 3)).astype(dtype), np.array([3, 3, 1, 3, 3]),
                      (6, 3)),
    ]


def _pair(dtype, **kw):
    return (refopt.RowWiseAdagrad(backend="reference", **kw),
            refopt.RowWiseAdagrad(backend="cuda", **kw))


CASES = [(exact, mode, wd, F) for exact in (True, False)
         for mode, wd in (("none", 0.0), ("l2", 0.25), ("decoupled", 0.125))]
CASES += [(True, "l2", 0.25, np.float64), (False, "decoupled", 0.125, np.float64)]


@pytest.mark.parametrize("exact, mode, wd, dtype", CASES)
def test_device_steps_are_the_reference_bit_for_bit(exact, mode, wd, dtype):
    rng = np.random.default_rng(7)
    table = rng.standard_normal((6, 3)).astype(dtype)
    ref, dev = _pair(dtype, learning_rate=0.5, epsilon=1e-3, weight_decay=wd,
                     weight_decay_mode=mode, exact=exact)
    host, var = table.copy(), kc.to_device(table)
    for k, g in enumerate(_steps(dtype, rng)):
        ref.apply_gradients([(g, host)])
        with warnings.catch_warnings():
            warnings.simplefilter("error", HostStepWarning)
            dev.apply_gradients([(g if isinstance(g, IndexedSlices) else kc.to_device(g),
                                  var)])
        _bits_equal(var.copy_to_host(), host, f"table, step {k + 1}")
        _bits_equal(_host(dev.get_slot(var, "accumulator")),
                    ref.get_slot(host, "accumulator"), f"accumulator, step {k + 1}")
    assert dev._state.fallbacks == {}
    assert dev.iterations == ref.iterations == 5


@settings(max_examples=12)
@given(data=st.data(), exact=st.booleans(), mode=st.sampled_from(["none", "l2", "decoupled"]),
       dtype=st.sampled_from([np.float32, np.float64]), rows=st.integers(1, 5),
       width=st.integers(1, 4))
def test_random_sparse_steps_are_the_reference(data, exact, mode, dtype, rows, width):
    floats = st.floats(-1e3, 1e3, width=32)
    table = np.array(data.draw(st.lists(floats, min_size=rows * width, max_size=rows * width)),
                     dtype).reshape(rows, width)
    idx = np.array(data.draw(st.lists(st.integers(0, rows - 1), max_size=6)), np.int64)
    vals = np.array(data.draw(st.lists(floats, min_size=idx.size * width,
                                       max_size=idx.size * width)), dtype).reshape(-1, width)
    lr = data.draw(st.floats(1e-3, 2.0))
    wd = 0.0 if mode == "none" else data.draw(st.floats(0.0, 1.0))
    ref, dev = _pair(dtype, learning_rate=lr, epsilon=1e-6, weight_decay=wd,
                     weight_decay_mode=mode, exact=exact)
    host, var = table.copy(), kc.to_device(table)
    g = IndexedSlices(vals, idx, (rows, width))
    for _ in range(2):
        ref.apply_gradients([(g, host)])
        dev.apply_gradients([(g, var)])
    _bits_equal(var.copy_to_host(), host, "table")
    _bits_equal(_host(dev.get_slot(var, "accumulator")), ref.get_slot(host, "accumulator"),
                "accumulator")
    assert dev._state.fallbacks == {}


def test_several_tables_one_step_and_a_grid_stride(monkeypatch):
    """Tables of rank 1, 2 and 3 in one step, dense and sparse, with one block of one thread
    (every row through the grid-stride loop)."""
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 1)
    monkeypatch.setattr(kc.config, "MAX_BLOCKS", 1)
    rng = np.random.default_rng(3)
    shapes = [(5,), (4, 2), (3, 2, 2)]
    tables = [rng.standard_normal(s).astype(F) for s in shapes]
    ref, dev = _pair(F, learning_rate=0.2, weight_decay=0.5, weight_decay_mode="l2",
                     exact=False)
    hosts = [t.copy() for t in tables]
    devs = [kc.to_device(t) for t in tables]
    for _ in range(2):
        gs = [rng.standard_normal((5,)).astype(F),
              IndexedSlices(rng.standard_normal((3, 2)).astype(F), np.array([1, 3, 1]), (4, 2)),
              IndexedSlices(rng.standard_normal((4, 2, 2)).astype(F), np.array([2, 0, 2, 2]),
                            (3, 2, 2))]
        ref.apply_gradients(zip(gs, hosts))
        with warnings.catch_warnings():
            warnings.simplefilter("error", HostStepWarning)
            dev.apply_gradients(zip([kc.to_device(gs[0])] + gs[1:], devs))
        for h, d in zip(hosts, devs):
            _bits_equal(d.copy_to_host(), h, "table")
            _bits_equal(_host(dev.get_slot(d, "accumulator")), ref.get_slot(h, "accumulator"),
                        "accumulator")


ROWWISE = [e for e in conformance.load_manifest() if e["id"].startswith("fbgemm/rowwise")]


@pytest.mark.parametrize("entry", ROWWISE, ids=[e["id"] for e in ROWWISE])
def test_fbgemm_golden_cases_replay_on_the_device(entry):
    assert entry["tolerance_ulp"] == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostStepWarning)
        r = conformance.replay(entry, backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail


@pytest.mark.parametrize("exact", [True, False])
def test_a_raising_step_changes_nothing(exact):
    table = np.arange(8, dtype=F).reshape(4, 2)
    opt = refopt.RowWiseAdagrad(learning_rate=0.1, weight_decay=0.1, weight_decay_mode="l2",
                                exact=exact, backend="cuda")
    var = kc.to_device(table)
    g = IndexedSlices(np.ones((2, 2), F), np.array([1, 1]), (4, 2))
    opt.apply_gradients([(g, var)])
    before = var.copy_to_host(), _host(opt.get_slot(var, "accumulator"))
    opt.epsilon = -1.0  # invalid, set after construction
    with pytest.raises(ValueError, match=r"epsilon.*-1\.0"):
        opt.apply_gradients([(g, var)])
    opt.epsilon = 1e-8
    opt.weight_decay_mode = "none"  # a decay of 0.1 with mode "none": refused
    with pytest.raises(ValueError, match="weight_decay_mode='none'"):
        opt.apply_gradients([(kc.to_device(np.ones((4, 2), F)), var)])
    _bits_equal(var.copy_to_host(), before[0], "table")
    _bits_equal(_host(opt.get_slot(var, "accumulator")), before[1], "accumulator")
    assert opt.iterations == 1 and opt._state.fallbacks == {}


@pytest.mark.parametrize("kw", [{"clipnorm": 0.5}, {"use_ema": True, "ema_momentum": 0.9}])
def test_what_the_kernels_do_not_cover_takes_the_host_step(kw):
    """Clipping and the EMA: the host step (one HostStepWarning), the reference's numbers."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((4, 3)).astype(F)
    ref, dev = _pair(F, learning_rate=0.3, **kw)
    host, var = table.copy(), kc.to_device(table)
    g = IndexedSlices(rng.standard_normal((3, 3)).astype(F), np.array([0, 2, 0]), (4, 3))
    ref.apply_gradients([(g, host)])
    with pytest.warns(HostStepWarning):
        dev.apply_gradients([(g, var)])
    _bits_equal(var.copy_to_host(), host, "table")
    assert sum(dev._state.fallbacks.values()) == 1


def test_a_subclass_that_rewrites_the_update_takes_the_host_step():
    class Halved(refopt.RowWiseAdagrad):
        def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                         lazy_rows=False):
            p, s = super()._update_step(param, grad, slots, learning_rate, step,
                                        weight_decay, lazy_rows)
            return p * F(0.5), s

    table = np.ones((3, 2), F)
    var = kc.to_device(table)
    opt = Halved(learning_rate=0.1, backend="cuda")
    with pytest.warns(HostStepWarning):
        opt.apply_gradients([(kc.to_device(np.ones((3, 2), F)), var)])
    ref = Halved(learning_rate=0.1, backend="reference")
    ref.apply_gradients([(np.ones((3, 2), F), table)])
    _bits_equal(var.copy_to_host(), table, "table")


def test_ptx_audit_of_the_row_kernels():
    """Both kernels compile for a GPU (no device needed) without contraction, approximate
    or flush-to-zero instructions (a subprocess: numba reads NUMBA_ENABLE_CUDASIM once)."""
    pytest.importorskip("numba.cuda")
    code = ("import json; from refopt.kernels.cuda.rowwise_adagrad import ptx_audit; "
            "print(json.dumps(ptx_audit()))")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    if r.returncode != 0 and ("NVVM" in r.stderr or "nvrtc" in r.stderr.lower()):
        pytest.skip(f"no CUDA toolchain: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stderr
    import json

    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(report) == {"exact float32", "sequential float32", "exact float64",
                           "sequential float64"}
    assert all(problems == [] for problems in report.values()), report
