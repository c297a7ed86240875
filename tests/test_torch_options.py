"""PyTorch's options on refopt's optimizers (issue #12 item 7): ``maximize``, SGD's
``dampening``, torch's weight decay forms.

The numbers are torch's recorded ones (``tests/test_conformance.py`` replays
``torch/*maximize*``, ``torch/sgd_dampening*``, ``torch/sgd_l2_f32``, ``torch/rmsprop_l2_f64``
on the reference and cpu backends, bit-identical); here: the numbers of two steps written
out from torch's rule, the cuda simulator on the same golden cases, and the errors.
"""

from __future__ import annotations

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.indexed_slices import IndexedSlices

ENTRIES = {e["id"]: e for e in conformance.load_manifest()}


def _step(opt, grads, variables):
    opt.apply_gradients(list(zip(grads, variables)))


# ---------------------------------------------------------------- maximize
@pytest.mark.parametrize("name", ["Adam", "SGD", "Adagrad", "RMSprop", "Adadelta", "Adamax",
                                  "Nadam", "RAdam", "ASGD", "Rprop", "AdamW"])
def test_maximize_is_the_step_on_the_negated_gradient(name):
    rng = np.random.default_rng(3)
    g1, g2 = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    kw = {"convention": "torch", "backend": "reference", "weight_decay": 0.1}
    if name == "Rprop":
        kw.pop("weight_decay")  # torch's Rprop has none
    w_max, w_neg = np.ones(4, np.float32), np.ones(4, np.float32)
    a = getattr(refopt, name)(maximize=True, **kw)
    b = getattr(refopt, name)(**kw)
    for g in (g1, g2):
        keep = g.copy()
        _step(a, [g], [w_max])
        np.testing.assert_array_equal(g, keep)  # the caller's gradient is not changed
        _step(b, [-g], [w_neg])
    np.testing.assert_array_equal(w_max, w_neg)
    assert not np.array_equal(w_max, np.ones(4, np.float32))


def test_maximize_sgd_momentum_numbers_from_torchs_rule():
    # torch: g = -g; g += wd*w; b = g (first step) / b = mu*b + g; w -= lr*b
    w = np.array([1.0, -2.0])
    opt = refopt.SGD(learning_rate=0.1, momentum=0.5, weight_decay=0.25, maximize=True,
                     convention="torch", backend="reference")
    _step(opt, [np.array([1.0, 1.0])], [w])
    g = -1.0 + 0.25 * np.array([1.0, -2.0])  # [-0.75, -1.5]
    np.testing.assert_array_equal(w, [1.0 + 0.075, -2.0 + 0.15])
    w_before = w.copy()
    _step(opt, [np.array([1.0, 1.0])], [w])
    b = 0.5 * g + (-1.0 + 0.25 * w_before)
    np.testing.assert_allclose(w, w_before - 0.1 * b, rtol=0, atol=1e-15)


def test_maximize_sparse_gradient_is_negated_too():
    table = np.ones((3, 2))
    other = np.ones((3, 2))
    a = refopt.Adagrad(learning_rate=0.1, maximize=True, convention="torch", backend="reference")
    b = refopt.Adagrad(learning_rate=0.1, convention="torch", backend="reference")
    values = np.array([[1.0, 2.0], [3.0, 4.0]])
    a.apply_gradients([(IndexedSlices(values, np.array([0, 2]), (3, 2)), table)])
    b.apply_gradients([(IndexedSlices(-values, np.array([0, 2]), (3, 2)), other)])
    np.testing.assert_array_equal(table, other)
    assert table[0, 0] > 1.0


def test_maximize_cpu_backend_matches_reference():
    rng = np.random.default_rng(5)
    grads = [rng.standard_normal(7).astype(np.float32) for _ in range(3)]
    ws = []
    for backend in ("reference", "cpu"):
        w = np.linspace(-1, 1, 7, dtype=np.float32)
        opt = refopt.SGD(learning_rate=0.1, momentum=0.9, weight_decay=0.05, maximize=True,
                         convention="torch", backend=backend)
        for g in grads:
            _step(opt, [g], [w])
        ws.append(w)
    np.testing.assert_array_equal(ws[0], ws[1])


def test_maximize_refused_outside_torch_conventions_and_config_round_trip():
    for conv in ("tf_keras", "keras3", "keras2", "optax"):
        with pytest.raises(ValueError, match=rf"convention='{conv}' has no `maximize`"):
            refopt.SGD(maximize=True, convention=conv)
    with pytest.raises(TypeError, match="maximize=1"):
        refopt.Adam(maximize=1, convention="torch")
    opt = refopt.Adam(maximize=True, convention="fbgemm", backend="reference")
    config = opt.get_config()
    assert config["maximize"] is True
    assert refopt.Adam.from_config(config).maximize is True
    assert "maximize" not in refopt.Adam(convention="torch").get_config()


def test_maximize_raising_step_changes_nothing():
    w = np.ones(3, np.float32)
    opt = refopt.Adam(maximize=True, convention="torch", backend="reference")
    _step(opt, [np.ones(3, np.float32)], [w])
    before, m = w.copy(), opt.get_slot(w, "m").copy()
    with pytest.raises((TypeError, ValueError)):
        _step(opt, [np.ones(4, np.float32)], [w])
    np.testing.assert_array_equal(w, before)
    np.testing.assert_array_equal(opt.get_slot(w, "m"), m)
    assert opt.iterations == 1


def test_torch_adapter_maximize_still_negates():
    torch = pytest.importorskip("torch")
    from refopt import torch as rt

    p = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    opt = rt.SGD([p], lr=0.5, maximize=True, backend="reference")
    p.grad = torch.ones(2, dtype=torch.float64)
    opt.step()
    assert p.detach().tolist() == [1.5, 1.5]


# ---------------------------------------------------------------- dampening
def test_dampening_is_skipped_on_the_first_step():
    w = np.array([0.0])
    opt = refopt.SGD(learning_rate=1.0, momentum=0.5, dampening=0.75, convention="torch",
                     backend="reference")
    _step(opt, [np.array([2.0])], [w])
    assert opt.get_slot(w, "m")[0] == 2.0  # b = g, not (1 - 0.75) g
    _step(opt, [np.array([2.0])], [w])
    assert opt.get_slot(w, "m")[0] == 0.5 * 2.0 + 0.25 * 2.0
    assert w[0] == -2.0 - 1.5


def test_dampening_first_step_is_per_variable():
    # torch counts the buffer per parameter: a variable first stepped later starts b = g
    a, b = np.zeros(1), np.zeros(1)
    opt = refopt.SGD(learning_rate=1.0, momentum=0.5, dampening=0.75, convention="torch",
                     backend="reference")
    with pytest.warns(UserWarning):
        opt.apply_gradients([(np.array([1.0]), a), (None, b)])
    opt.apply_gradients([(np.array([1.0]), a), (np.array([4.0]), b)])
    assert opt.get_slot(b, "m")[0] == 4.0
    assert opt.get_slot(a, "m")[0] == 0.5 + 0.25


def test_dampening_cpu_matches_reference():
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(9).astype(np.float32) for _ in range(4)]
    out = []
    for backend in ("reference", "cpu"):
        w = np.zeros(9, np.float32)
        opt = refopt.SGD(learning_rate=0.1, momentum=0.9, dampening=0.3, convention="torch",
                         backend=backend)
        for g in grads:
            _step(opt, [g], [w])
        out.append((w, opt.get_slot(w, "m").copy()))
    np.testing.assert_array_equal(out[0][0], out[1][0])
    np.testing.assert_array_equal(out[0][1], out[1][1])


def test_dampening_errors():
    with pytest.raises(ValueError, match=r"convention='tf_keras' has no SGD dampening.*0\.5"):
        refopt.SGD(momentum=0.9, dampening=0.5)
    with pytest.raises(ValueError, match="zero dampening"):
        refopt.SGD(momentum=0.9, nesterov=True, dampening=0.5, convention="torch")
    with pytest.raises((TypeError, ValueError), match="dampening"):
        refopt.SGD(momentum=0.9, dampening="x", convention="torch")
    opt = refopt.SGD(momentum=0.9, dampening=0.5, convention="torch")
    assert refopt.SGD.from_config(opt.get_config()).dampening == 0.5
    assert "dampening" not in refopt.SGD().get_config()  # tf-keras' config keys unchanged


# ---------------------------------------------------------------- AveragedModel's average
def test_equal_weight_average_is_the_mean_of_the_iterates():
    w = np.zeros(3)
    opt = refopt.SGD(learning_rate=1.0, use_ema=True, ema_momentum=None, convention="torch",
                     backend="reference")
    seen = []
    for k in range(4):
        opt.apply_gradients([(np.full(3, -1.0 - k), w)])
        seen.append(w.copy())
    avg = seen[0]
    for n, x in enumerate(seen[1:], start=1):  # torch: avg + (x - avg) / (n + 1)
        avg = avg + (x - avg) / np.float64(n + 1)
    opt.finalize_variable_values([w])
    np.testing.assert_array_equal(w, avg)
    np.testing.assert_array_equal(w, np.mean(seen, axis=0))  # exact for these values


def test_equal_weight_average_cpu_matches_reference_and_config():
    out = []
    for backend in ("reference", "cpu"):
        w = np.linspace(0, 1, 5, dtype=np.float32)
        opt = refopt.Adam(learning_rate=0.1, use_ema=True, ema_momentum=None,
                          convention="torch", backend=backend)
        for k in range(3):
            opt.apply_gradients([(np.full(5, 0.5 - k, np.float32), w)])
        opt.finalize_variable_values([w])
        out.append(w)
    np.testing.assert_array_equal(out[0], out[1])
    config = opt.get_config()
    assert config["ema_momentum"] is None
    assert refopt.Adam.from_config(config).ema_momentum is None


def test_equal_weight_average_refused_outside_torch():
    with pytest.raises((TypeError, ValueError), match="ema_momentum"):
        refopt.SGD(use_ema=True, ema_momentum=None, convention="tf_keras")


# ---------------------------------------------------------------- cuda simulator
@pytest.mark.parametrize("case", ["torch/sgd_dampening_f32", "torch/sgd_maximize_l2_f32",
                                  "torch/swa_sgd_f32"])
def test_cuda_simulator_replays_golden_cases(case, monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    entry = dict(ENTRIES[case], steps=4)  # steps 1 (undamped) to 4
    r = conformance.replay(entry, backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail


# ---------------------------------------------------------------- lr scheduler trajectories
def test_scheduled_golden_cases_record_torchs_learning_rates():
    from refopt import lr_scheduler

    for case in ("torch/sgd_onecycle_f32", "torch/adam_fused_cosine_f32",
                 "torch/sgd_sequential_f64"):
        entry = ENTRIES[case]
        data = np.load(conformance._data() / entry["file"])
        want = [float(data[f"state/lr/{k}"]) for k in range(1, entry["steps"] + 1)]
        opt = conformance._optimizer(entry, "reference")
        sched = lr_scheduler.from_config(opt, entry["lr_scheduler"])
        got = []
        for _ in range(entry["steps"]):
            got.append(opt.learning_rate)
            sched.step()
        assert got == want, case
        assert len(set(got)) > 3  # the learning rate did move


def test_torch_adapter_sgd_dampening_equals_torch():
    torch = pytest.importorskip("torch")
    from refopt import torch as rt

    rng = np.random.default_rng(2)
    init = rng.standard_normal(6).astype(np.float32)
    grads = [rng.standard_normal(6).astype(np.float32) for _ in range(4)]
    out = []
    for make in (torch.optim.SGD, rt.SGD):
        p = torch.nn.Parameter(torch.from_numpy(init.copy()))
        kw = {} if make is torch.optim.SGD else {"backend": "reference"}
        opt = make([p], lr=0.1, momentum=0.9, dampening=0.3, weight_decay=0.01,
                   maximize=True, **kw)
        for g in grads:
            p.grad = torch.from_numpy(g.copy())
            opt.step()
        out.append(p.detach().numpy().copy())
    np.testing.assert_array_equal(out[0], out[1])
