import numpy as np
import pytest

import refopt
from refopt import conformance


def _entry(case_id):
    return next(e for e in conformance.load_manifest() if e["id"] == case_id)


def _recorded_state(entry, name):
    with (conformance._data() / entry["file"]).open("rb") as f:
        z = dict(np.load(f))
    if f"state/{name}/1" not in z:
        return None
    return [z[f"state/{name}/{k}"] for k in range(1, entry["steps"] + 1)]


def _scalar_trace(opt, w, grads):
    out = []
    for g in grads:
        opt.apply_gradients([(np.array([g], w.dtype), w)])
        out.append((float(w[0]), opt.dynamic_scale, opt.iterations))
    return out


LS_CASES = ["keras3/loss_scale_adam_f32", "keras3/loss_scale_sgd_f64",
            "tf_keras/loss_scale_adam_f32", "tf_keras/loss_scale_sgd_f64",
            "torch/loss_scale_adam_fused_f32", "torch/loss_scale_adam_f32",
            "torch/loss_scale_sgd_f32", "keras2/loss_scale_adam_f32",
            "tf1/loss_scale_adam_f32"]


@pytest.mark.parametrize("case_id", LS_CASES)
def test_scale_counter_and_iterations_follow_the_recording(case_id):
    entry = _entry(case_id)
    init, grads, params, _ = conformance.load_case(entry)
    opt = conformance._optimizer(entry, "reference")
    variables = [a.copy() for a in init]
    scales, counters = _recorded_state(entry, "loss_scale"), _recorded_state(entry, "counter")
    iters = _recorded_state(entry, "iterations")  # tf_keras, Keras 3 and Keras 2 only
    for k, row in enumerate(grads):
        opt.apply_gradients(list(zip(row, variables)))
        assert np.float32(opt.dynamic_scale) == scales[k], k
        assert opt.step_counter == int(counters[k]), k
        if iters is not None:
            assert opt.iterations == int(iters[k]), k
        for got, want in zip(variables, params[k]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case_id", ["torch/loss_scale_adam_fused_f32",
                                     "torch/loss_scale_adam_f32", "torch/loss_scale_sgd_f32"])
def test_grad_scaler_replays_torch_bit_for_bit(case_id):
    # torch.amp.GradScaler's recordings, through refopt.GradScaler's own API. Regression:
    # GradScaler divided by the scale under the "torch" preset (the for-loop, whose
    # unscale_ multiplies by f32(1/s)) and multiplied under "torch_fused" (whose kernel
    # divides); the m and v slots differed from torch's in both cases.
    entry = _entry(case_id)
    init, grads, params, slots = conformance.load_case(entry)
    hyper = entry["hyperparameters"]
    inner = hyper["inner_optimizer"]
    opt = getattr(refopt, inner["class_name"])(**inner["config"],
                                                convention=entry["convention"],
                                                backend="reference")
    scaler = refopt.GradScaler(init_scale=hyper["initial_scale"],
                               growth_interval=hyper["dynamic_growth_steps"])
    variables = [a.copy() for a in init]
    scales = _recorded_state(entry, "loss_scale")
    for k, row in enumerate(grads):
        scaler.step(opt, list(zip(row, variables)))
        scaler.update()
        assert np.float32(scaler.get_scale()) == scales[k], k
        for i, (got, want) in enumerate(zip(variables, params[k])):
            np.testing.assert_array_equal(got, want)
            for name, per_step in slots.items():
                if per_step[k][i] is not None:
                    np.testing.assert_array_equal(opt.get_slot(got, name), per_step[k][i])


def test_keras3_trace_from_the_semantics_notes():
    # keras_tf.md 3.7, verified on Keras 3: SGD lr 1, initial_scale 1, growth 2, w0 = 1
    w = np.ones(1, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="keras3"),
                                    initial_scale=1.0, dynamic_growth_steps=2)
    trace = _scalar_trace(opt, w, [np.inf, np.inf, 1, 1, 1])
    assert trace == [(1, 0.5, 0), (1, 0.25, 0), (-3, 0.25, 1), (-7, 0.5, 2), (-9, 0.5, 3)]


def test_tf_keras_floors_the_scale_at_one_and_counts_skipped_steps():
    # keras_tf.md 3.7, verified on tf_keras: initial 2, growth 2, grads inf x3 then 1 x3
    w = np.ones(1, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="tf_keras"),
                                    initial_scale=2.0, dynamic_growth_steps=2)
    trace = _scalar_trace(opt, w, [np.inf] * 3 + [1.0] * 3)
    assert [t[1] for t in trace] == [1, 1, 1, 1, 2, 2]
    assert [t[2] for t in trace] == [1, 2, 3, 4, 5, 6]


def test_tf1_skips_without_counting():
    w = np.ones(1, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="tf1"),
                                    initial_scale=2.0, dynamic_growth_steps=2)
    trace = _scalar_trace(opt, w, [np.inf, 2.0])
    assert trace == [(1, 1, 0), (-1, 1, 1)]


def test_grad_scaler_trace_measured_on_torch():
    # catalogue.md 18, measured on torch 2.13 CPU: init 4, interval 2, SGD lr 1, w0 1
    w = np.ones(1, np.float32)
    opt = refopt.SGD(learning_rate=1.0, convention="torch")
    scaler = refopt.GradScaler(init_scale=4.0, growth_interval=2)
    ws, scales = [], []
    for g in (np.inf, 8, 8, 8, np.nan, 8):
        scaler.step(opt, [(np.array([g], np.float32), w)])
        scaler.update()
        ws.append(float(w[0]))
        scales.append(scaler.get_scale())
    assert ws == [1, -3, -7, -9, -9, -13]
    assert scales == [2, 2, 4, 4, 2, 2]
    assert opt.iterations == 4


def test_grad_scaler_factors_round_through_double_like_torch():
    # torch 2.13: init 0.1, growth 3, backoff 0.3, interval 1; grads 1, inf, 1
    scaler = refopt.GradScaler(init_scale=0.1, growth_factor=3.0, backoff_factor=0.3,
                               growth_interval=1)
    opt, w = refopt.SGD(learning_rate=1.0, convention="torch"), np.ones(1, np.float32)
    got = []
    for g in (1.0, np.inf, 1.0):
        scaler.step(opt, [(np.array([g], np.float32), w)])
        scaler.update()
        got.append(scaler.get_scale().hex())
    assert got == ["0x1.3333340000000p-2", "0x1.70a3d80000000p-4", "0x1.147ae20000000p-2"]


def test_torch_unscale_uses_the_float32_reciprocal_and_misses_overflow_by_unscaling():
    # torch 2.13: float64 grads times f32(1/3); a finite 3e38 at scale 0.5 becomes inf unseen
    w = np.array([1.0, 2.0])
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="torch"),
                                    initial_scale=3.0)
    opt.apply_gradients([(np.array([1.0, 0.1]), w)])
    assert w.tolist() == [0.6666666567325592, 1.9666666656732559]
    w = np.array([1.0, 2.0], np.float32)
    scaler = refopt.GradScaler(init_scale=0.5, growth_interval=2)
    sgd = refopt.SGD(learning_rate=1.0, convention="torch")
    scaler.step(sgd, [(np.array([3e38, 1.0], np.float32), w)])
    scaler.update()
    assert w[0] == -np.inf and w[1] == 0 and scaler._growth_tracker == 1


def test_grad_scaler_unscale_then_step_and_state_dict():
    w = np.ones(2, np.float32)
    opt = refopt.SGD(learning_rate=0.5, convention="torch")
    scaler = refopt.GradScaler(init_scale=8.0, growth_interval=3)
    pairs = scaler.unscale_(opt, [(np.full(2, 8.0, np.float32), w)])
    np.testing.assert_array_equal(pairs[0][0], np.ones(2, np.float32))
    with pytest.raises(RuntimeError, match="unscale_"):
        scaler.unscale_(opt, [(np.full(2, 8.0, np.float32), w)])
    scaler.step(opt, pairs)
    scaler.update()
    assert w.tolist() == [0.5, 0.5]
    sd = scaler.state_dict()
    assert sd == {"scale": 8.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 3, "_growth_tracker": 1}
    other = refopt.GradScaler()
    other.load_state_dict(sd)
    assert other.state_dict() == sd
    with pytest.raises(ValueError, match="_growth_tracker"):
        other.load_state_dict(dict(sd, _growth_tracker=3))
    assert other.state_dict() == sd


def test_float16_gradients_are_refused_under_torch():
    w = np.ones(2, np.float16)
    with pytest.raises(ValueError, match="FP16"):
        refopt.GradScaler().step(refopt.SGD(convention="torch"), [(np.ones(2, np.float16), w)])
    opt = refopt.LossScaleOptimizer(refopt.SGD(convention="torch"))
    with pytest.raises(ValueError, match="FP16"):
        opt.apply_gradients([(np.ones(2, np.float16), w)])
    assert opt.dynamic_scale == 2.0 ** 16 and not opt.built and w.tolist() == [1, 1]


def test_defaults_per_framework():
    assert refopt.LossScaleOptimizer(refopt.Adam()).dynamic_scale == 2.0 ** 15
    assert refopt.LossScaleOptimizer(refopt.Adam(convention="keras3")).dynamic_growth_steps == 2000
    assert refopt.LossScaleOptimizer(refopt.Adam(convention="torch")).dynamic_scale == 2.0 ** 16
    scaler = refopt.GradScaler()
    assert (scaler.get_scale(), scaler.get_growth_factor(), scaler.get_backoff_factor(),
            scaler.get_growth_interval()) == (2.0 ** 16, 2.0, 0.5, 2000)


def test_fixed_scale_applies_even_non_finite_gradients_under_tf_keras():
    w = np.ones(2, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0), dynamic=False,
                                    initial_scale=4.0)
    opt.apply_gradients([(np.array([4.0, np.inf], np.float32), w)])
    assert w[0] == 0 and w[1] == -np.inf and opt.dynamic_scale == 4.0


@pytest.mark.parametrize("kwargs, match", [
    ({"initial_scale": 0.0}, "initial_scale"),
    ({"initial_scale": 1e39}, "initial_scale"),
    ({"initial_scale": float("nan")}, "initial_scale"),
    ({"dynamic_growth_steps": 0}, "dynamic_growth_steps"),
    ({"dynamic_growth_steps": 2.5}, "dynamic_growth_steps"),
    ({"dynamic": False}, "initial_scale"),
    ({"dynamic": False, "initial_scale": 2.0, "dynamic_growth_steps": 3}, "dynamic_growth_steps"),
])
def test_bad_arguments_name_themselves(kwargs, match):
    with pytest.raises(ValueError, match=match):
        refopt.LossScaleOptimizer(refopt.SGD(), **kwargs)


def test_conventions_without_loss_scaling_or_fixed_scale_are_refused():
    with pytest.raises(ValueError, match="optax"):
        refopt.LossScaleOptimizer(refopt.Adam(convention="optax"))
    with pytest.raises(ValueError, match="dynamic=False"):
        refopt.LossScaleOptimizer(refopt.Adam(convention="keras3"), dynamic=False,
                                  initial_scale=2.0)
    with pytest.raises(TypeError, match="inner_optimizer"):
        refopt.LossScaleOptimizer("adam")
    with pytest.raises(TypeError, match="inner_optimizer"):
        refopt.LossScaleOptimizer(refopt.LossScaleOptimizer(refopt.Adam()))
    with pytest.raises(ValueError, match="convention"):
        refopt.LossScaleOptimizer(refopt.Adam(), convention="torch")


def test_overflowing_scale_raises_and_changes_nothing():
    w = np.ones(2, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.SGD(learning_rate=1.0, convention="keras3"),
                                    initial_scale=2.0 ** 127, dynamic_growth_steps=1)
    with pytest.raises(ValueError, match="overflow"):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert w.tolist() == [1, 1] and opt.iterations == 0 and opt.dynamic_scale == 2.0 ** 127
    opt = refopt.LossScaleOptimizer(refopt.SGD(convention="keras3"), initial_scale=2.0 ** -149)
    with pytest.raises(ValueError, match="underflow"):
        opt.apply_gradients([(np.full(2, np.nan, np.float32), w)])
    assert opt.dynamic_scale == 2.0 ** -149 and opt.step_counter == 0


def test_a_raising_step_changes_nothing():
    w = np.ones(2, np.float32)
    opt = refopt.LossScaleOptimizer(refopt.Adam(convention="keras3"), initial_scale=4.0,
                                    dynamic_growth_steps=1)
    opt.apply_gradients([(np.ones(2, np.float32), w)])
    before = (opt.dynamic_scale, opt.step_counter, opt.iterations, w.copy())
    with pytest.raises(ValueError):
        opt.apply_gradients([(np.ones(3, np.float32), w)])
    with pytest.raises(KeyError):
        opt.apply_gradients([(np.full(2, np.inf, np.float32), np.ones(2, np.float32))])
    assert (opt.dynamic_scale, opt.step_counter, opt.iterations) == before[:3]
    np.testing.assert_array_equal(w, before[3])


def test_state_dict_and_checkpoint_resume_bit_identically(tmp_path):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(3).astype(np.float32) * 4 for _ in range(6)]
    grads[1][0] = np.inf

    def make():
        return refopt.LossScaleOptimizer(refopt.Adam(learning_rate=0.1, convention="tf_keras"),
                                         initial_scale=4.0, dynamic_growth_steps=2)

    w_full, full = np.ones(3, np.float32), make()
    for g in grads:
        full.apply_gradients([(g, w_full)])
    w, opt = np.ones(3, np.float32), make()
    for g in grads[:3]:
        opt.apply_gradients([(g, w)])
    sd = opt.state_dict()
    assert sd["loss_scale"] == {"scale": opt.dynamic_scale, "counter": opt.step_counter}
    refopt.save_checkpoint(tmp_path / "ls.npz", opt, [w])
    w2, opt2 = w.copy(), make()
    opt2.load_state_dict(sd, var_list=[w2])
    opt3, (w3,) = refopt.load_checkpoint(tmp_path / "ls.npz")
    assert type(opt3) is refopt.LossScaleOptimizer
    for o, v in ((opt, w), (opt2, w2), (opt3, w3)):
        for g in grads[3:]:
            o.apply_gradients([(g, v)])
        np.testing.assert_array_equal(v, w_full)
        assert (o.dynamic_scale, o.step_counter, o.iterations) == (
            full.dynamic_scale, full.step_counter, full.iterations)
    bad = dict(sd, loss_scale={"scale": 0.0, "counter": 0})
    with pytest.raises(ValueError, match="loss_scale"):
        opt2.load_state_dict(bad)
    other = refopt.LossScaleOptimizer(refopt.Adam(learning_rate=0.1), initial_scale=8.0)
    with pytest.raises(ValueError, match="initial_scale"):
        other.load_state_dict(sd, var_list=[np.ones(3, np.float32)])
    assert not other.built and other.dynamic_scale == 8.0


def test_replay_on_the_cuda_simulator(monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    for case_id in ("tf_keras/loss_scale_adam_f32", "torch/loss_scale_sgd_f32"):
        r = conformance.replay(dict(_entry(case_id), steps=6), backend="cuda")
        assert r.passed and r.max_ulp == 0, r.detail


def test_docstring_examples():
    import doctest

    import refopt.optimizers.loss_scale as module

    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 8 and result.failed == 0
