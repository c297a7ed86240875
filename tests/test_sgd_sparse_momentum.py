"""PyTorch's SGD with momentum on sparse COO gradients: its uncoalesced sparse buffer (issue 14).

Every expected value is torch 2.13's: the golden cases ``torch/sgd_sparse_momentum_*``,
``torch/sgd_sparse_nesterov_*`` (recorded by conformance/generators/gen_torch.py, which also
stores torch's raw buffer, ``state/sparse_m_indices`` and ``state/sparse_m_values``), and the
small examples below, measured with ``torch.sparse_coo_tensor`` (noted where used). The
replay of params and ``m`` (torch's ``buf.to_dense()``) on "reference" and "cpu" is in
tests/test_conformance.py; here: the raw buffer, cuda, the state's round trips, atomicity.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.reference import SparseMomentumBuffer, sgd_sparse_torch_momentum_update
from refopt.reference.sgd_sparse_momentum import (
    sparse_buffer_to_dense,
    torch_sparse_add,
)

F32 = np.float32
ENTRIES = {e["id"]: e for e in conformance.load_manifest()}
MOMENTUM_CASES = sorted(i for i in ENTRIES if i.startswith(("torch/sgd_sparse_momentum",
                                                             "torch/sgd_sparse_nesterov")))


def _npz(entry):
    from importlib import resources

    with resources.as_file(resources.files("refopt") / "conformance_data" / entry["file"]) as p:
        return dict(np.load(p))


def _optimizer(entry, backend="reference"):
    return refopt.SGD(**entry["hyperparameters"], convention="torch", backend=backend)


def test_cases_recorded():
    assert len(MOMENTUM_CASES) >= 7
    dtypes = {ENTRIES[i]["dtype"] for i in MOMENTUM_CASES}
    assert dtypes == {"float32", "float64"}
    assert all(ENTRIES[i]["tolerance_ulp"] == 0 for i in MOMENTUM_CASES)
    assert any(ENTRIES[i]["hyperparameters"].get("nesterov") for i in MOMENTUM_CASES)


@pytest.mark.parametrize("case", MOMENTUM_CASES)
def test_raw_buffer_is_torchs_every_step(case):
    """The buffer itself (entries, their order, duplicates, growth) equals torch's."""
    entry = ENTRIES[case]
    data = _npz(entry)
    init, grads, params, _ = conformance.load_case(entry)
    opt = _optimizer(entry)
    variables = [a.copy() for a in init]
    sizes = []
    for k, row in enumerate(grads, start=1):
        opt.apply_gradients([(g, v) for g, v in zip(row, variables)])
        sd = opt.state_dict()["sparse_momentum"][0]
        idx = data[f"state/sparse_m_indices/{k}/0"]
        vals = data[f"state/sparse_m_values/{k}/0"]
        assert sd["indices"].dtype == np.int64 and sd["indices"].tolist() == idx.tolist()
        assert sd["values"].dtype == vals.dtype, (case, k)
        assert sd["values"].tobytes() == vals.reshape(-1).tobytes(), (case, k)
        sizes.append(len(idx))
        assert variables[0].tobytes() == params[k - 1][0].tobytes()
    if case in ("torch/sgd_sparse_momentum_f32", "torch/sgd_sparse_nesterov_f64"):
        assert sizes == [5, 8, 8, 10, 14]  # torch's buffer grows: never coalesced


def test_the_densified_step_fails_the_goldens():
    """The golden cases discriminate: the old densified step (which refopt still takes with
    a global step counter) is not torch's."""
    entry = dict(ENTRIES["torch/sgd_sparse_momentum_f32"], knobs={"step_counter": "global"})
    r = conformance.replay(entry)
    assert not r.passed and "step 2" in r.detail


def test_cuda_host_step_replays_bit_for_bit(monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = conformance.replay(ENTRIES["torch/sgd_sparse_nesterov_f32"], backend="cuda")
    assert r.passed, r.detail


def test_merge_order_torch_value():
    # torch 2.13: t = [3, 1, 3, 0] (values 0.9 * rows), s = [1, 4, 3, 1]; t.add_(s, alpha=0.5)
    # gives indices [1, 3, 1, 3, 0, 4, 3, 1] (one merge pass over the unsorted lists).
    t = SparseMomentumBuffer(np.array([3, 1, 3, 0]),
                             np.array([[1, 2], [3, 4], [5, 6], [7, 8]], F32) * F32(0.9))
    s = SparseMomentumBuffer(np.array([1, 4, 3, 1]),
                             np.array([[1, 1], [2, 2], [3, 3], [4, 4]], F32))
    r = torch_sparse_add(t, s, 0.5)
    assert r.indices.tolist() == [1, 3, 1, 3, 0, 4, 3, 1]
    expected = [[0.5, 0.5], [0.8999999761581421, 1.7999999523162842],
                [2.6999998092651367, 3.5999999046325684], [4.5, 5.399999618530273],
                [6.299999713897705, 7.199999809265137], [1.0, 1.0], [1.5, 1.5], [2.0, 2.0]]
    assert r.values.tolist() == expected
    # torch 2.13: a -0 entry merged comes out +0 (axpy into a zeroed row); an empty operand
    # copies the other (times alpha), keeping -0
    neg = SparseMomentumBuffer(np.array([0, 2]), np.array([-0.0, -0.0], F32))
    one = SparseMomentumBuffer(np.array([1]), np.array([-0.0], F32))
    merged = torch_sparse_add(neg, one, 0.5)
    assert merged.indices.tolist() == [0, 1, 2]
    assert not np.signbit(merged.values).any()
    empty = SparseMomentumBuffer(np.zeros(0, np.int64), np.zeros(0, F32))
    assert np.signbit(torch_sparse_add(empty, one, 0.5).values).all()
    dense = sparse_buffer_to_dense(r, (5, 2))
    assert dense[1].tolist() == [F32(0.5) + F32(2.6999998) + F32(2.0),
                                 F32(0.5) + F32(3.6) + F32(2.0)]


def _same_buffers(a, b):
    """Whether two ``state_dict()["sparse_momentum"]`` lists hold the same bits."""
    return len(a) == len(b) and all(
        (x is None and y is None) or (x is not None and y is not None and all(
            x[k].dtype == y[k].dtype and x[k].tobytes() == y[k].tobytes()
            for k in ("indices", "values")))
        for x, y in zip(a, b))


def _run(opt, table, grads):
    for g in grads:
        opt.apply_gradients([(g, table)])


def _grads(seed=0, n=4, shape=(6, 3)):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        k = int(rng.integers(1, 5))
        out.append(refopt.IndexedSlices(rng.standard_normal((k,) + shape[1:]).astype(F32),
                                        rng.integers(0, shape[0], k), shape))
    return out


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_state_dict_and_checkpoint_resume_bit_for_bit(backend, tmp_path):
    grads = _grads()
    kw = {"learning_rate": 0.1, "momentum": 0.9, "dampening": 0.2, "convention": "torch",
          "backend": backend}
    w_full = np.ones((6, 3), F32)
    full = refopt.SGD(**kw)
    _run(full, w_full, grads)

    w = np.ones((6, 3), F32)
    first = refopt.SGD(**kw)
    _run(first, w, grads[:2])
    sd = first.state_dict()
    assert sd["sparse_momentum"][0]["indices"].size  # the sparse buffer is in the state
    again = refopt.SGD(**kw)
    w2 = w.copy()
    again.load_state_dict(sd, var_list=[w2])
    _run(again, w2, grads[2:])
    assert w2.tobytes() == w_full.tobytes()

    refopt.save_checkpoint(tmp_path / "c.npz", first, [w])
    opt3, (w3,) = refopt.load_checkpoint(tmp_path / "c.npz", backend=backend)
    _run(opt3, w3, grads[2:])
    assert w3.tobytes() == w_full.tobytes()
    assert opt3.get_slot(w3, "m").tobytes() == full.get_slot(w_full, "m").tobytes()


def test_checkpoint_in_another_order_and_inside_a_wrapper_resumes_bit_for_bit(tmp_path):
    # two tables with their own sparse buffers, saved in the reverse of the build order
    # (regression: the buffers were written in build order, the slots in the file's order),
    # and the same through LossScaleOptimizer (regression: its checkpoint dropped them)
    ga, gb = _grads(seed=1, n=4), _grads(seed=2, n=4, shape=(5, 2))
    kw = {"learning_rate": 0.1, "momentum": 0.9, "convention": "torch",
          "backend": "reference"}
    for wrap in (False, True):
        def make():
            opt = refopt.SGD(**kw)
            return refopt.LossScaleOptimizer(opt, initial_scale=1.0) if wrap else opt

        def run(opt, a, b, steps):
            for k in steps:
                opt.apply_gradients([(ga[k], a), (gb[k], b)])

        full_a, full_b = np.ones((6, 3), F32), np.ones((5, 2), F32)
        full = make()
        run(full, full_a, full_b, range(4))
        a, b = np.ones((6, 3), F32), np.ones((5, 2), F32)
        first = make()
        run(first, a, b, range(2))
        refopt.save_checkpoint(tmp_path / "c.npz", first, [b, a])
        opt, (b2, a2) = refopt.load_checkpoint(tmp_path / "c.npz", backend="reference")
        run(opt, a2, b2, range(2, 4))
        assert a2.tobytes() == full_a.tobytes() and b2.tobytes() == full_b.tobytes(), wrap
        assert opt.get_slot(b2, "m").tobytes() == full.get_slot(full_b, "m").tobytes()


def test_a_step_that_raises_changes_nothing():
    # variable 1 had dense gradients, so its buffer is dense; torch's Nesterov step cannot
    # add it to a sparse gradient (torch 2.13: "add(sparse, dense) is not supported")
    kw = {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True, "convention": "torch",
          "backend": "reference"}
    table, vec = np.ones((6, 3), F32), np.ones(4, F32)
    opt = refopt.SGD(**kw)
    g0 = _grads(n=3)
    opt.apply_gradients([(g0[0], table), (np.full(4, 0.5, F32), vec)])
    before = (table.copy(), vec.copy(), opt.state_dict())
    bad = refopt.IndexedSlices(np.ones(1, F32), [2], (4,))
    with pytest.raises(TypeError, match="position 1"):
        opt.apply_gradients([(g0[1], table), (bad, vec)])
    after = opt.state_dict()
    assert table.tobytes() == before[0].tobytes() and vec.tobytes() == before[1].tobytes()
    assert _same_buffers(after["sparse_momentum"], before[2]["sparse_momentum"])
    assert after["variable_steps"] == before[2]["variable_steps"] and opt.iterations == 1
    # and the next good step is the one an optimizer that never saw the failure takes
    ref_table, ref_vec = np.ones((6, 3), F32), np.ones(4, F32)
    clean = refopt.SGD(**kw)
    clean.apply_gradients([(g0[0], ref_table), (np.full(4, 0.5, F32), ref_vec)])
    for o, t in ((opt, table), (clean, ref_table)):
        o.apply_gradients([(g0[1], t)])
        o.apply_gradients([(g0[2], t)])
    assert table.tobytes() == ref_table.tobytes()


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_sparse_buffer_then_dense_gradient_raises_as_torch(backend):
    # torch 2.13: SGD(momentum=0.9), a sparse step, then a dense gradient raises
    # RuntimeError "add(sparse, dense) is not supported" (after scaling the buffer);
    # refopt raises TypeError and changes nothing, on every path (the cpu quick path too)
    table, vec = np.ones((3, 2), F32), np.ones(2, F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend=backend)
    g = refopt.IndexedSlices(np.array([[1, 2], [3, 4]], F32), [1, 1], (3, 2))
    opt.apply_gradients([(g, table), (np.ones(2, F32), vec)])
    opt.apply_gradients([(g, table), (np.ones(2, F32), vec)])  # the dense vec: quick path
    before = (table.tobytes(), vec.tobytes(), opt.state_dict())
    for _ in range(2):
        with pytest.raises(TypeError, match="position 0 has PyTorch's sparse momentum"):
            opt.apply_gradients([(np.ones((3, 2), F32), table), (np.ones(2, F32), vec)])
    after = opt.state_dict()
    assert (table.tobytes(), vec.tobytes()) == before[:2] and opt.iterations == 2
    assert _same_buffers(after["sparse_momentum"], before[2]["sparse_momentum"])
    assert after["variable_steps"] == before[2]["variable_steps"]
    opt.apply_gradients([(np.ones(2, F32), vec)])  # a variable with a dense buffer: fine
    assert opt.iterations == 3


def test_dense_buffer_then_sparse_gradient_torch_value():
    # torch 2.13, SGD(lr=0.1, momentum=0.9): a dense step with ones, then the rows [1, 1]
    # with [[1, 2], [3, 4]]: buf = 0.9 * 1, + each entry in turn; the table
    # and buffer below, torch's float32 values
    table = np.ones((3, 2), F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend="reference")
    opt.apply_gradients([(np.ones((3, 2), F32), table)])
    opt.apply_gradients([(refopt.IndexedSlices(np.array([[1, 2], [3, 4]], F32), [1, 1],
                                               (3, 2)), table)])
    expected = np.array([[0.8100000023841858] * 2, [0.4099999666213989, 0.2099999636411667],
                         [0.8100000023841858] * 2], F32)
    assert table.tobytes() == expected.tobytes()
    m = np.array([[0.8999999761581421] * 2, [4.900000095367432, 6.900000095367432],
                  [0.8999999761581421] * 2], F32)
    assert opt.get_slot(table, "m").tobytes() == m.tobytes()
    assert opt.state_dict()["sparse_momentum"] == [None]  # the buffer stays dense


def test_load_state_dict_refuses_a_bad_buffer_and_changes_nothing():
    table = np.ones((6, 3), F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend="reference")
    _run(opt, table, _grads(n=2))
    sd = opt.state_dict()
    good = opt.state_dict()
    sd["sparse_momentum"] = [{"indices": np.array([7]), "values": np.ones((1, 3), F32)}]
    with pytest.raises(ValueError, match="does not fit variable 0"):  # row 7 of 6
        opt.load_state_dict(sd)
    sd["sparse_momentum"] = [{"indices": np.array([1]), "values": np.array(["one"] * 3)}]
    with pytest.raises(ValueError, match="must be a float array"):
        opt.load_state_dict(sd)
    sd["sparse_momentum"] = [{"indices": np.array([1.5]), "values": np.ones((1, 3), F32)}]
    with pytest.raises(ValueError, match="1-d integer array"):
        opt.load_state_dict(sd)
    assert _same_buffers(opt.state_dict()["sparse_momentum"], good["sparse_momentum"])


def test_function_errors_name_the_argument():
    p = np.ones((3, 2), F32)
    g = refopt.IndexedSlices(np.ones((1, 2), F32), [1], (3, 2))
    with pytest.raises(TypeError, match="`buffer` must be a SparseMomentumBuffer"):
        sgd_sparse_torch_momentum_update(p, g, [1], learning_rate=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="momentum=0"):
        sgd_sparse_torch_momentum_update(p, g, None, learning_rate=0.1, momentum=0)
    bad = SparseMomentumBuffer(np.array([5]), np.ones((1, 2), F32))
    with pytest.raises(ValueError, match=r"`buffer.indices` must lie in \[0, 3\)"):
        sgd_sparse_torch_momentum_update(p, g, bad, learning_rate=0.1, momentum=0.9)
    assert p.tolist() == [[1, 1]] * 3


def test_functional_carries_the_sparse_buffer_through_flat_states():
    """refopt.functional: a fresh functional object, from a state flattened and read back,
    continues with the class's bits (the buffer travels as ``state["sparse_momentum"]``)."""
    from refopt import functional as F

    kw = {"learning_rate": 0.1, "momentum": 0.9, "convention": "torch",
          "backend": "reference"}
    params = {"t": np.ones((6, 3), F32), "b": np.ones(2, F32)}
    state = F.functional(refopt.SGD, **kw).init(params)
    assert "sparse_momentum" not in state  # nothing sparse yet
    opt, w, wb = refopt.SGD(**kw), np.ones((6, 3), F32), np.ones(2, F32)
    for k, g in enumerate(_grads(seed=3, n=4)):
        gb = np.full(2, 0.25 * (k + 1), F32)
        flat = {key: np.array(v) for key, v in F.flatten_state(state).items()}
        state = F.unflatten_state(flat, params)
        params, state = F.functional(refopt.SGD, **kw).step({"t": g, "b": gb}, state, params)
        opt.apply_gradients([(g, w), (gb, wb)])
        assert params["t"].tobytes() == w.tobytes() and params["b"].tobytes() == wb.tobytes()
    assert "sparse_momentum" in state
    # without it the buffer is lost: the next step is other bits
    g = _grads(seed=4, n=1)[0]
    lost = {key: v for key, v in state.items() if key != "sparse_momentum"}
    p_lost, _ = F.functional(refopt.SGD, **kw).step({"t": g, "b": None}, lost, params)
    p_kept, _ = F.functional(refopt.SGD, **kw).step({"t": g, "b": None}, state, params)
    opt.apply_gradients([(g, w)])
    assert p_kept["t"].tobytes() == w.tobytes() != p_lost["t"].tobytes()


def test_torch_adapter_embedding_resumes_bit_for_bit():
    """refopt.torch.SGD on nn.Embedding(sparse=True) gradients: the sparse buffer travels in
    its state_dict (torch tensors as variables), a resumed run has the uninterrupted bits."""
    torch = pytest.importorskip("torch")
    import refopt.torch as rt

    torch.manual_seed(0)
    idxs = [torch.randint(0, 20, (7,)) for _ in range(6)]
    kw = {"lr": 0.1, "momentum": 0.9, "nesterov": True, "backend": "reference"}

    def run(emb, opt, idx):
        opt.zero_grad()
        emb(idx).pow(2).sum().backward()
        opt.step()

    a = torch.nn.Embedding(20, 4, sparse=True)
    b = torch.nn.Embedding(20, 4, sparse=True)
    b.load_state_dict(a.state_dict())
    oa, ob = rt.SGD(a.parameters(), **kw), rt.SGD(b.parameters(), **kw)
    for idx in idxs[:3]:
        run(a, oa, idx)
        run(b, ob, idx)
    resumed = rt.SGD(b.parameters(), **kw)
    resumed.load_state_dict(ob.state_dict())
    for idx in idxs[3:]:
        run(a, oa, idx)
        run(b, resumed, idx)
    assert a.weight.detach().numpy().tobytes() == b.weight.detach().numpy().tobytes()


def test_checkpoint_stores_the_buffer_as_arrays(tmp_path):
    # the buffer grows every step: it is saved as .npz arrays in the variable's dtype, the
    # JSON meta naming only each variable's fields
    import json

    table, vec = np.ones((6, 3), np.float64), np.ones(4, np.float64)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch", backend="reference")
    g = refopt.IndexedSlices(np.arange(6, dtype=np.float64).reshape(2, 3), [4, 4], (6, 3))
    opt.apply_gradients([(g, table), (np.ones(4), vec)])
    refopt.save_checkpoint(tmp_path / "c.npz", opt, [vec, table])
    z = np.load(tmp_path / "c.npz")
    assert json.loads(str(z["meta"]))["sparse_momentum"] == [None, ["indices", "values"]]
    assert z["sparse_momentum_1_indices"].tolist() == [4, 4]
    assert z["sparse_momentum_1_values"].dtype == np.float64
    assert z["sparse_momentum_1_values"].tobytes() == g.values.tobytes()  # step 1: a copy
