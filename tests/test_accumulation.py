import numpy as np
import pytest

import refopt
from refopt.accumulation import torch_accumulate
from refopt.schedules import LearningRateSchedule


class _Linear(LearningRateSchedule):  # keras_tf.md 3.2's schedule: lr(step) = 0.1 (step + 1)
    def __call__(self, step):
        return np.float32(0.1) * np.float32(step + 1)

    def get_config(self):
        return {}


def _run(opt, w, grads):
    out = []
    for g in grads:
        opt.apply_gradients([(np.asarray(g, w.dtype), w)])
        out.append((w.copy(), opt.iterations))
    return out


def test_schedule_at_the_raw_counter_and_iterations_divided():
    # keras_tf.md 3.2, verified on Keras 3: SGD, GA 2, lr(step) = 0.1 (step + 1), g = 1
    w = np.zeros(1, np.float32)
    opt = refopt.SGD(learning_rate=_Linear(), convention="keras3", gradient_accumulation_steps=2)
    trace = _run(opt, w, [[1.0]] * 4)
    assert [float(t[0][0]) for t in trace] == [0.0, np.float32(-0.2), np.float32(-0.2),
                                                np.float32(-0.2) - np.float32(0.4)]
    assert [t[1] for t in trace] == [0, 1, 1, 2]


def test_ema_every_micro_step_from_zero():
    # keras_tf.md 3.6, verified on Keras 3: GA 2, SGD lr 1, EMA momentum 0.5, g = 1, w0 = 1
    w = np.ones(1, np.float32)
    opt = refopt.SGD(learning_rate=1.0, convention="keras3", use_ema=True, ema_momentum=0.5,
                     gradient_accumulation_steps=2)
    ws, avgs = [], []
    for _ in range(4):
        opt.apply_gradients([(np.ones(1, np.float32), w)])
        ws.append(float(w[0]))
        avgs.append(float(opt.get_slot(w, "average")[0]))
    assert ws == [1, 0, 0, -1] and avgs == [1, 0, 0, -0.5]


def test_adam_fed_each_gradient_twice_equals_adam_without_accumulation():
    # keras_tf.md 3.2, verified on Keras 3 (the README's 1.5 vector)
    w = np.array([1.0, 2.0, 3.0], np.float32)
    opt = refopt.Adam(learning_rate=0.01, convention="keras3", gradient_accumulation_steps=2)
    for g in ([0.1, -0.2, 0.3], [0.01, 0.5, -1.0], [1e-4, 0.0, 2.0]):
        for _ in range(2):
            opt.apply_gradients([(np.array(g, np.float32), w)])
    assert w.tolist() == [0.9768599271774292, 2.002159357070923, 2.9914004802703857]
    assert opt.iterations == 3 and opt.get_config()["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("value", [1, -2, 2.5, True, "2"])
def test_bad_accumulation_steps_name_the_argument(value):
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        refopt.Adam(convention="keras3", gradient_accumulation_steps=value)


@pytest.mark.parametrize("convention", ["tf_keras", "keras2", "tf1", "torch", "optax"])
def test_only_keras3_has_gradient_accumulation_steps(convention):
    with pytest.raises(ValueError, match=f"convention='{convention}'"):
        refopt.SGD(convention=convention, gradient_accumulation_steps=2)


def test_zero_and_none_mean_no_accumulation():
    opt = refopt.SGD(convention="keras3", gradient_accumulation_steps=0)
    assert opt.gradient_accumulation_steps is None
    assert "gradient_accumulation_steps" not in opt.get_config()


def test_a_raising_call_changes_nothing():
    w = np.ones(3, np.float32)
    opt = refopt.Adam(convention="keras3", gradient_accumulation_steps=2)
    with pytest.raises(ValueError):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert not opt.built and opt.iterations == 0
    opt.apply_gradients([(np.full(3, 0.5, np.float32), w)])
    before = opt.state_dict()
    with pytest.raises(KeyError):
        opt.apply_gradients([(np.ones(3, np.float32), np.ones(3, np.float32))])
    after = opt.state_dict()
    assert after["gradient_accumulation"]["micro_steps"] == 1
    np.testing.assert_array_equal(after["gradient_accumulation"]["accumulators"][0],
                                  before["gradient_accumulation"]["accumulators"][0])
    assert w.tolist() == [1, 1, 1]


def test_state_dict_and_checkpoint_mid_accumulation_resume_bit_identically(tmp_path):
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(7)]

    def make():
        return refopt.AdamW(learning_rate=0.01, weight_decay=0.1, use_ema=True,
                            convention="keras3", gradient_accumulation_steps=3)

    w_full, full = np.ones((2, 3), np.float32), make()
    for g in grads:
        full.apply_gradients([(g, w_full)])
    w, opt = np.ones((2, 3), np.float32), make()
    for g in grads[:4]:  # one micro-step into the second accumulation
        opt.apply_gradients([(g, w)])
    sd = opt.state_dict()
    assert sd["iterations"] == 1 and sd["gradient_accumulation"]["micro_steps"] == 4
    np.testing.assert_array_equal(sd["gradient_accumulation"]["accumulators"][0], grads[3])
    refopt.save_checkpoint(tmp_path / "ga.npz", opt, [w])
    w2, opt2 = w.copy(), make()
    opt2.load_state_dict(sd, var_list=[w2])
    opt3, (w3,) = refopt.load_checkpoint(tmp_path / "ga.npz")
    for o, v in ((opt, w), (opt2, w2), (opt3, w3)):
        for g in grads[4:]:
            o.apply_gradients([(g, v)])
        np.testing.assert_array_equal(v, w_full)
        np.testing.assert_array_equal(o.get_slot(v, "average"), full.get_slot(w_full, "average"))
        assert o.iterations == full.iterations == 2
    bad = dict(sd, gradient_accumulation={"micro_steps": 7, "accumulators": []})
    with pytest.raises(ValueError, match="micro_steps"):
        make().load_state_dict(bad, var_list=[np.ones((2, 3), np.float32)])


# torch 2.13, three micro-batches of a linear loss (p * g).sum() accumulated by backward()
# without zero_grad(); "mean": each loss divided by 3 first.
_TORCH_MICRO = [[2.040919065475464, -2.5556650161743164, 0.4180988371372223, -0.5677695870399475],
                [-0.4526492953300476, -0.21559716761112213, -2.019986152648926,
                 -0.2319323718547821],
                [-0.8652130961418152, 3.3229994773864746, 0.22578661143779755,
                 -0.3526307940483093]]
_TORCH_SUM = [0.7230566143989563, 0.5517373085021973, -1.376100778579712, -1.1523327827453613]
_TORCH_MEAN = [0.2410188615322113, 0.18391239643096924, -0.4587002992630005,
               -0.3841109275817871]


def test_torch_accumulate_matches_torch_backward():
    micro = [np.array(g, np.float32) for g in _TORCH_MICRO]
    assert torch_accumulate(micro).tolist() == _TORCH_SUM
    assert torch_accumulate(micro, mean=True).tolist() == _TORCH_MEAN
    divided = sum(g / np.float32(3) for g in micro)  # what the recipe is often taken to be
    assert divided.tolist() != _TORCH_MEAN


def test_torch_accumulate_errors():
    with pytest.raises(ValueError, match=">= 1"):
        torch_accumulate([])
    with pytest.raises(ValueError, match=r"micro_grads\[1\]"):
        torch_accumulate([np.ones(2, np.float32), np.ones(2, np.float64)])


def test_replay_on_the_cuda_simulator(monkeypatch):
    from refopt import conformance

    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    for case_id in ("keras3/grad_accum_adamw_all_f32", "optax/multi_steps_sgd_sum_skip_f32"):
        entry = next(e for e in conformance.load_manifest() if e["id"] == case_id)
        r = conformance.replay(dict(entry, steps=7), backend="cuda")
        assert r.passed and r.max_ulp == 0, r.detail


def _ms_trace(opt, w, grads):
    out = []
    for g in grads:
        opt.apply_gradients([(np.float32([g]), w)])
        out.append(float(w[0]))
    return out


def test_multi_steps_running_mean_measured_on_optax():
    # torch_optax.md 5.7, optax 0.2.8: sgd(1), k = 3, grads 1, 2, 4 -> updates -0, -0, -7/3
    w = np.zeros(1, np.float32)
    opt = refopt.MultiSteps(refopt.SGD(learning_rate=1.0, convention="optax"), 3)
    assert _ms_trace(opt, w, [1, 2, 4]) == [0, 0, np.float32(-2.33333325)]
    assert (opt.iterations, opt.mini_step, opt.gradient_step) == (1, 0, 1)


def test_multi_steps_nan_poisons_unless_skipped():
    # torch_optax.md 5.7: k = 2, grads [nan, 1, 1, 1]: every output NaN; skip_not_finite:
    # [nan, 1, 3] -> updates 0, -0, -2
    w = np.zeros(1, np.float32)
    opt = refopt.MultiSteps(refopt.SGD(learning_rate=1.0, convention="optax"), 2)
    assert all(np.isnan(_ms_trace(opt, w, [np.nan, 1, 1, 1])))
    w = np.zeros(1, np.float32)
    opt = refopt.MultiSteps(refopt.SGD(learning_rate=1.0, convention="optax"), 2,
                            should_skip_update_fn="skip_not_finite")
    assert _ms_trace(opt, w, [np.nan, 1, 3]) == [0, 0, -2]


def test_multi_steps_errors_change_nothing():
    with pytest.raises(ValueError, match="convention='optax'"):
        refopt.MultiSteps(refopt.SGD(), 2)
    with pytest.raises(ValueError, match="every_k_schedule"):
        refopt.MultiSteps(refopt.SGD(convention="optax"), 0)
    w = np.ones(2, np.float32)
    opt = refopt.MultiSteps(refopt.SGD(convention="optax"), lambda step: 2 - step)
    opt.apply_gradients([(np.ones(2, np.float32), w)])
    opt.apply_gradients([(np.ones(2, np.float32), w)])  # emits; the schedule now gives 1
    before = (opt.mini_step, opt.gradient_step, opt.iterations, w.copy())
    opt.every_k_schedule = lambda step: 0
    with pytest.raises(ValueError, match="every_k_schedule"):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    table = np.ones((3, 2), np.float32)
    other = refopt.MultiSteps(refopt.SGD(convention="optax"), 2)
    with pytest.raises(ValueError, match="dense"):
        other.apply_gradients([(refopt.IndexedSlices(np.ones((1, 2), np.float32), [0], (3, 2)),
                                table)])
    assert (opt.mini_step, opt.gradient_step, opt.iterations) == before[:3]
    np.testing.assert_array_equal(w, before[3])
    assert not other.built


def test_multi_steps_checkpoint_mid_accumulation(tmp_path):
    rng = np.random.default_rng(2)
    grads = [rng.standard_normal(4).astype(np.float32) for _ in range(7)]

    def make():
        return refopt.MultiSteps(refopt.Adam(learning_rate=0.1, convention="optax"), 3)

    w_full, full = np.ones(4, np.float32), make()
    for g in grads:
        full.apply_gradients([(g, w_full)])
    w, opt = np.ones(4, np.float32), make()
    for g in grads[:4]:
        opt.apply_gradients([(g, w)])
    refopt.save_checkpoint(tmp_path / "ms.npz", opt, [w])
    opt2, (w2,) = refopt.load_checkpoint(tmp_path / "ms.npz")
    assert type(opt2) is refopt.MultiSteps and opt2.mini_step == 1
    for o, v in ((opt, w), (opt2, w2)):
        for g in grads[4:]:
            o.apply_gradients([(g, v)])
        np.testing.assert_array_equal(v, w_full)
        assert o.iterations == full.iterations == 2


@pytest.mark.parametrize("name", ["refopt.accumulation", "refopt.optimizers.multi_steps"])
def test_docstring_examples(name):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0
