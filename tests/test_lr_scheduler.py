"""refopt.lr_scheduler against torch.optim.lr_scheduler's recorded learning rates.

The sequences in ``conformance/lr_scheduler/torch.json`` were recorded from PyTorch 2.13 by
``conformance/generators/gen_torch.py --lr-sequences`` (cases.LR_SEQUENCES); refopt must give
every learning rate (and OneCycleLR's momentum / beta1) bit for bit, as Python floats.
"""

from __future__ import annotations

import json
import math
import pathlib
import warnings

import numpy as np
import pytest

import refopt
from refopt import lr_scheduler as ls

ROOT = pathlib.Path(__file__).resolve().parents[1]
SEQUENCES = json.loads((ROOT / "conformance" / "lr_scheduler" / "torch.json").read_text())[
    "sequences"]
BY_ID = {s["id"]: s for s in SEQUENCES}


def _optimizer(seq):
    name, kw = seq.get("optimizer", ("SGD", {}))
    kw = {"beta_1": 0.9, "beta_2": 0.999} if name == "Adam" else kw  # torch's betas
    return getattr(refopt, name)(learning_rate=seq["lr"], convention="torch",
                                 backend="reference", **kw)


def _momentum(opt):
    return opt.beta_1 if hasattr(opt, "beta_1") else opt.momentum


def _run(seq):
    opt = _optimizer(seq)
    sched = ls.from_config(opt, seq["scheduler"])
    lrs, moms = [sched.get_last_lr()[0]], [_momentum(opt)]
    for k in range(seq["steps"]):
        if "metrics" in seq:
            sched.step(seq["metrics"][k])
        else:
            sched.step()
        lrs.append(sched.get_last_lr()[0])
        moms.append(_momentum(opt))
        assert opt.learning_rate == lrs[-1]  # the optimizer's own float, not a copy
    return lrs, moms


def _bits(xs):
    return [float(x).hex() for x in xs]


@pytest.mark.parametrize("seq_id", sorted(BY_ID))
def test_lr_sequence_bit_identical_to_torch(seq_id):
    seq = BY_ID[seq_id]
    lrs, moms = _run(seq)
    assert _bits(lrs) == _bits(seq["lrs"])
    if "optimizer" in seq:  # OneCycleLR cycles the momentum (SGD) or beta_1 (Adam)
        assert _bits(moms) == _bits(seq["momentum"])


# Closed forms written here from torch's documentation (not refopt's code): torch's recursive
# numbers differ from them, and refopt must follow the recursion.
def _closed_exponential(base, gamma, e):
    return base * gamma ** e


def _closed_cosine(base, eta_min, t_max, e):
    return eta_min + (base - eta_min) * (1 + math.cos(math.pi * e / t_max)) / 2


def test_exponential_recursive_differs_from_closed_form():
    seq = BY_ID["exponential"]
    closed = [_closed_exponential(0.1, 0.9, e) for e in range(seq["steps"] + 1)]
    differ = [e for e, (a, b) in enumerate(zip(seq["lrs"], closed)) if a != b]
    assert differ  # torch's ((0.1*0.9)*0.9)... is not 0.1*0.9**e at these epochs
    lrs, _ = _run(seq)
    assert _bits(lrs) == _bits(seq["lrs"])
    assert all(lrs[e] != closed[e] for e in differ)


def test_cosine_recursive_differs_from_closed_form():
    seq = BY_ID["cosine"]
    closed = [_closed_cosine(0.1, 0.001, 10, e) for e in range(seq["steps"] + 1)]
    differ = [e for e, (a, b) in enumerate(zip(seq["lrs"], closed)) if a != b]
    assert len(differ) > 5
    lrs, _ = _run(seq)
    assert all(lrs[e] == seq["lrs"][e] != closed[e] for e in differ)


def test_step_with_epoch_takes_the_closed_form_and_warns():
    opt = refopt.SGD(learning_rate=0.1, convention="torch", backend="reference")
    sched = ls.ExponentialLR(opt, gamma=0.9)
    with pytest.warns(UserWarning, match="deprecated"):
        sched.step(7)
    assert opt.learning_rate == _closed_exponential(0.1, 0.9, 7)
    assert sched.last_epoch == 7


def test_training_with_a_scheduler_uses_each_steps_learning_rate():
    opt = refopt.SGD(learning_rate=0.5, convention="torch", backend="reference")
    sched = ls.MultiStepLR(opt, milestones=[1, 2], gamma=0.5)
    w = np.zeros(1, np.float64)
    for _ in range(3):
        opt.apply_gradients([(np.ones(1), w)])
        sched.step()
    np.testing.assert_array_equal(w, [-(0.5 + 0.25 + 0.125)])


def test_state_dict_round_trip_resumes_the_sequence():
    seq = BY_ID["cosine_warm_restarts"]
    opt = _optimizer(seq)
    sched = ls.from_config(opt, seq["scheduler"])
    for _ in range(7):
        sched.step()
    saved = sched.state_dict()
    assert "optimizer" not in saved
    opt2 = _optimizer(seq)
    sched2 = ls.from_config(opt2, seq["scheduler"])
    sched2.load_state_dict(saved)
    opt2.learning_rate = opt.learning_rate  # the optimizer's state is saved with it, as torch
    for k in range(8, seq["steps"] + 1):
        sched2.step()
        assert sched2.get_last_lr()[0] == seq["lrs"][k]
    assert sched2.last_epoch == seq["steps"]


def test_sequential_state_dict_nests_its_schedulers():
    seq = BY_ID["sequential"]
    opt = _optimizer(seq)
    sched = ls.from_config(opt, seq["scheduler"])
    for _ in range(6):
        sched.step()
    saved = sched.state_dict()
    assert len(saved["_schedulers"]) == 3
    opt2 = _optimizer(seq)
    sched2 = ls.from_config(opt2, seq["scheduler"])
    sched2.load_state_dict(saved)
    opt2.learning_rate = opt.learning_rate
    for k in range(7, 12):
        sched2.step()
        assert sched2.get_last_lr()[0] == seq["lrs"][k]


def test_torch_adapter_groups_are_driven_too():
    torch = pytest.importorskip("torch")
    from refopt import torch as rt

    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    q = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    opt = rt.SGD([{"params": [p]}, {"params": [q], "lr": 0.2}], lr=0.1, backend="reference")
    sched = ls.ExponentialLR(opt, gamma=0.5)
    sched.step()
    assert sched.get_last_lr() == [0.05, 0.1]
    assert [g["initial_lr"] for g in opt.param_groups] == [0.1, 0.2]


def test_get_lr_outside_step_warns():
    opt = refopt.SGD(learning_rate=0.1, convention="torch", backend="reference")
    sched = ls.StepLR(opt, step_size=2)
    with pytest.warns(UserWarning, match="get_last_lr"):
        sched.get_lr()


def test_errors_name_the_argument_and_change_nothing():
    opt = refopt.SGD(learning_rate=0.1, convention="torch", backend="reference")
    with pytest.raises(ValueError, match="step_size=0"):
        ls.StepLR(opt, step_size=0)
    with pytest.raises(ValueError, match="factor=1.5"):
        ls.ReduceLROnPlateau(opt, factor=1.5)
    with pytest.raises(ValueError, match="mode='avg'"):
        ls.ReduceLROnPlateau(opt, mode="avg")
    with pytest.raises(ValueError, match="pct_start=1"):
        ls.OneCycleLR(opt, max_lr=0.1, total_steps=10, pct_start=1)
    with pytest.raises(TypeError, match="optimizer="):
        ls.StepLR(object(), step_size=2)
    with pytest.raises(KeyError, match="initial_lr"):
        ls.StepLR(refopt.SGD(convention="torch"), step_size=2, last_epoch=3)
    with pytest.raises(ValueError, match="class_name"):
        ls.from_config(opt, {"class_name": "CyclicLR", "config": {}})
    assert opt.learning_rate == 0.1
    sched_opt = refopt.SGD(learning_rate=refopt.schedules.ExponentialDecay(0.1, 2, 0.5))
    with pytest.raises(TypeError, match="LearningRateSchedule"):
        ls.StepLR(sched_opt, step_size=2)
    adagrad = refopt.Adagrad(convention="torch")
    with pytest.raises(ValueError, match="cycle_momentum"):
        ls.OneCycleLR(adagrad, max_lr=0.1, total_steps=10)
    one = ls.OneCycleLR(refopt.SGD(momentum=0.9, convention="torch"), max_lr=0.1, total_steps=2)
    one.step()
    with pytest.raises(ValueError, match="total_steps is 2"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one.step()
        one.step()


def test_one_cycle_run_resumes_bit_for_bit_through_state_dict_and_checkpoint(tmp_path):
    """torch restores the momentum OneCycleLR cycles with the optimizer's param_groups; refopt
    refused the state (its config "differed" in momentum) until a user found it. A run
    stopped at step 6 and resumed (optimizer, then scheduler, as torch's recipe) must equal
    the uninterrupted run."""
    from refopt.checkpoint import load_checkpoint, save_checkpoint
    from refopt.lr_scheduler import OneCycleLR

    def run(split, via):
        w = np.linspace(-1, 1, 6).astype(np.float32)
        opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch")
        sched = OneCycleLR(opt, max_lr=0.5, total_steps=20)
        for k in range(12):
            if k == split:
                ssd, w2 = sched.state_dict(), w.copy()
                if via == "checkpoint":
                    save_checkpoint(str(tmp_path / "c.npz"), opt, [w])
                else:
                    osd = opt.state_dict()
                opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch")
                sched = OneCycleLR(opt, max_lr=0.5, total_steps=20)
                if via == "checkpoint":
                    load_checkpoint(str(tmp_path / "c.npz"), opt, [w2])
                else:
                    opt.load_state_dict(osd, var_list=[w2])
                sched.load_state_dict(ssd)
                w = w2
            opt.apply_gradients([(w * np.float32(2), w)])
            sched.step()
        return w.view(np.uint32).tolist(), opt.momentum

    whole = run(-1, None)
    assert run(6, "state_dict") == whole
    assert run(6, "checkpoint") == whole


def test_a_step_the_optimizer_refuses_changes_nothing():
    """OneCycleLR stepped past total_steps sets a negative rate (torch 2.13: -0.00222 here);
    refopt's optimizer refuses it, and the scheduler must not be left half-stepped (a user
    found last_epoch advanced while the rate stayed)."""
    from refopt.lr_scheduler import OneCycleLR

    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch")
    w = np.ones(2, np.float32)
    sched = OneCycleLR(opt, max_lr=0.5, total_steps=20, anneal_strategy="linear",
                       three_phase=True, cycle_momentum=False)
    for _ in range(19):
        opt.apply_gradients([(w * 1, w)])
        sched.step()
    before = (sched.last_epoch, sched.get_last_lr(), opt.learning_rate, sched.state_dict())
    with pytest.raises(ValueError, match=r"OneCycleLR\.step\(\).*learning_rate.*-0\.00222"):
        sched.step()
    assert (sched.last_epoch, sched.get_last_lr(), opt.learning_rate) == before[:3]
    assert sched.state_dict().keys() == before[3].keys()
