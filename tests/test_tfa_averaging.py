import doctest

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.optimizers import averaging

# Expected values: TF-Addons 0.23 on TF 2.15 (Keras 2.15), CPU, eager; printed with
# .numpy().tolist() (the golden trajectories are conformance/data/keras2__moving_average_*
# and keras2__swa_*, replayed by tests/test_conformance.py on reference and cpu).

G = np.float32([1.0, -1.0])


def _sgd(lr=0.1, **kw):
    return refopt.SGD(learning_rate=lr, convention="keras2", backend="reference", **kw)


def _steps(opt, w, g, n):
    for _ in range(n):
        opt.apply_gradients([(g.copy(), w)])


# ---------------------------------------------------------------- TF-Addons' numbers
def test_moving_average_matches_tfa_sgd():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(_sgd(), average_decay=0.9)
    _steps(opt, w, G, 3)
    assert opt.get_slot(w, "average").tolist() == [0.9438999891281128, 2.0561001300811768]
    assert w.tolist() == [0.6999999284744263, 2.299999713897705]
    assert opt.iterations == 3 and opt.inner_optimizer.iterations == 3


def test_moving_average_dynamic_decay_and_num_updates_float64_match_tfa():
    w = np.float64([1.0, 2.0])
    opt = refopt.MovingAverage(_sgd(), average_decay=0.9, num_updates=3, dynamic_decay=True)
    got = []
    for _ in range(3):
        opt.apply_gradients([(G.astype(np.float64), w)])
        got.append(opt.get_slot(w, "average").tolist())
    assert got == [[0.909999998807907, 2.090000001192093],
                   [0.8199999979409305, 2.1800000020590695],
                   [0.7299999961324714, 2.2700000038675285]]


def test_moving_average_start_step_follows_the_weights_before_it():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(refopt.Adam(learning_rate=0.1, convention="keras2",
                                           backend="reference"),
                               average_decay=0.5, start_step=2)
    got = []
    for _ in range(4):
        opt.apply_gradients([(np.float32([1.0, -3.0]), w)])
        got.append(opt.get_slot(w, "average").tolist())
    assert got == [[0.9000003337860107, 2.0999999046325684],
                   [0.8000009059906006, 2.1999995708465576],
                   [0.7500008344650269, 2.249999523162842],
                   [0.6750010251998901, 2.3249993324279785]]
    assert w.tolist() == [0.6000012159347534, 2.3999993801116943]


def test_decay_schedule_is_float32_as_tfa():
    opt = refopt.MovingAverage(_sgd(), average_decay=0.99, start_step=2, dynamic_decay=True)
    assert [opt.decay(t) for t in (0, 1)] == [0.0, 0.0]
    assert opt.decay(2) == np.float32(0.1) and opt.decay(2).dtype == np.float32
    assert opt.decay(3) == np.float32(2) / np.float32(11)
    assert opt.decay(10**6) == np.float32(0.99)
    capped = refopt.MovingAverage(_sgd(), average_decay=0.99, num_updates=3)
    assert capped.decay(50) == np.float32(4) / np.float32(13)


def test_swa_matches_tfa_and_snapshots_every_period():
    w = np.float32([1.0, 2.0])
    opt = refopt.SWA(_sgd(), start_averaging=1, average_period=2)
    assert [opt.snapshots(t) for t in range(6)] == [
        (False, 0), (True, 0), (False, 0), (True, 1), (False, 1), (True, 2)]
    opt.apply_gradients([(G.copy(), w)])
    assert opt.get_slot(w, "average").tolist() == [0.0, 0.0]  # zeros before start_averaging
    _steps(opt, w, G, 3)
    assert opt.get_slot(w, "average").tolist() == [0.6999999284744263, 2.299999713897705]
    assert w.tolist() == [0.5999999046325684, 2.3999996185302734]


def test_swap_weights_is_tfa_arithmetic_not_an_exact_exchange():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(_sgd(), average_decay=0.9)
    _steps(opt, w, G, 3)
    opt.swap_weights([w])  # TF-Addons under tf.distribute.OneDeviceStrategy
    assert opt.get_slot(w, "average").tolist() == [0.6999999284744263, 2.299999713897705]
    assert w.tolist() == [0.9438999891281128, 2.056100368499756]  # not 2.0561001300811768


def test_assign_average_vars_and_finalize_copy_the_averages():
    w, b = np.float32([1.0, 2.0]), np.float32([3.0])
    opt = refopt.SWA(_sgd(), start_averaging=0, average_period=1)
    opt.apply_gradients([(G.copy(), w), (np.float32([0.5]), b)])
    opt.apply_gradients([(G.copy(), w), (np.float32([0.5]), b)])
    avg_w, avg_b = opt.get_slot(w, "average").copy(), opt.get_slot(b, "average").copy()
    assert not np.array_equal(avg_w, w)
    opt.assign_average_vars([w])
    np.testing.assert_array_equal(w, avg_w)
    assert b.tolist() == [2.9000000953674316]  # untouched
    opt.finalize_variable_values([b])
    np.testing.assert_array_equal(b, avg_b)


def test_the_wrappers_clipping_applies_as_tfa():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(_sgd(), average_decay=0.5, clipnorm=0.01)
    opt.apply_gradients([(G.copy(), w)])
    assert w.tolist() == [0.9992929100990295, 2.0007071495056152]  # TF-Addons 0.23
    assert refopt.MovingAverage.from_config(opt.get_config()).clipnorm == 0.01
    with pytest.raises(ValueError, match="clipnorm=0.5.*global_clipnorm=1.0"):
        refopt.SWA(_sgd(), clipnorm=0.5, global_clipnorm=1.0)
    with pytest.raises(ValueError, match="clipvalue=-1"):
        refopt.SWA(_sgd(), clipvalue=-1.0)


def test_none_gradient_keeps_that_average():
    w, b = np.float32([1.0, 2.0]), np.float32([3.0])
    opt = refopt.MovingAverage(_sgd(), average_decay=0.5)
    opt.apply_gradients([(G.copy(), w), (np.float32([1.0]), b)])
    before_b = opt.get_slot(b, "average").copy()
    before_w = opt.get_slot(w, "average").copy()
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        opt.apply_gradients([(G.copy(), w), (None, b)])
    np.testing.assert_array_equal(opt.get_slot(b, "average"), before_b)
    assert (opt.get_slot(w, "average") != before_w).all()  # w's average moved


# ---------------------------------------------------------------- errors, nothing changed
@pytest.mark.parametrize("cls", [refopt.MovingAverage, refopt.SWA])
def test_refuses_other_conventions_clipping_and_wrappers(cls):
    with pytest.raises(ValueError, match=r"convention='keras2'.*convention='tf_keras'"):
        cls(refopt.SGD(backend="reference"))
    with pytest.raises(ValueError, match=r"clipping is ignored.*clipnorm=1.0"):
        cls(refopt.SGD(clipnorm=1.0, convention="keras2", backend="reference"))
    with pytest.raises(TypeError, match="optimizer=MovingAverage"):
        cls(refopt.MovingAverage(_sgd()))
    with pytest.raises(TypeError, match="optimizer=str"):
        cls("sgd")
    with pytest.raises(ValueError, match=r"convention.*Received: convention='torch'"):
        cls(_sgd(), convention="torch")


@pytest.mark.parametrize("kw, match", [
    ({"average_decay": 1.5}, "average_decay=1.5"),
    ({"average_decay": True}, "average_decay=True"),
    ({"num_updates": -1}, "num_updates=-1"),
    ({"num_updates": 2.0}, "num_updates=2.0"),
    ({"start_step": -2}, "start_step=-2"),
    ({"dynamic_decay": "yes"}, "dynamic_decay"),
])
def test_moving_average_bad_arguments(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        refopt.MovingAverage(_sgd(), **kw)


@pytest.mark.parametrize("kw, match", [
    ({"average_period": 0}, "average_period must be >= 1. Received: average_period=0"),
    ({"start_averaging": -1}, "start_averaging=-1"),
    ({"average_period": 2.5}, "average_period=2.5"),
])
def test_swa_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        refopt.SWA(_sgd(), **kw)


def test_swa_refuses_float64_as_tfa_and_changes_nothing():
    w = np.float64([1.0, 2.0])
    opt = refopt.SWA(_sgd())
    with pytest.raises(ValueError, match="float32 variables only.*float64 variable at position 0"):
        opt.apply_gradients([(G.astype(np.float64), w)])
    assert w.tolist() == [1.0, 2.0] and opt.iterations == 0 and not opt.built
    with pytest.raises(ValueError, match="float16"):
        opt.build([np.float16([1.0])])
    assert not opt.built


def test_a_raising_step_changes_nothing():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(refopt.Adam(learning_rate=0.1, convention="keras2",
                                           backend="reference"), average_decay=0.5)
    opt.apply_gradients([(G.copy(), w)])
    sd = opt.state_dict()
    before = w.copy()
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(np.float32([1.0, 2.0, 3.0]), w)])
    with pytest.raises(KeyError):
        opt.apply_gradients([(G.copy(), np.float32([0.0, 0.0]))])
    np.testing.assert_array_equal(w, before)
    after = opt.state_dict()
    assert after["iterations"] == 1
    for name in sd["slot_names"]:
        np.testing.assert_array_equal(after["slots"][name][0], sd["slots"][name][0])
    fresh = refopt.MovingAverage(_sgd())  # a first call that raises forgets the build
    with pytest.raises(ValueError):
        fresh.apply_gradients([(np.float32([1.0]), w)])
    assert not fresh.built and fresh.variables == [0]


# ---------------------------------------------------------------- state, config, checkpoints
def _pair_run(make, n_before, n_after, tmp_path, via):
    w = np.float32([1.0, -2.0, 0.5])
    grads = [np.float32([0.3, -0.1, 0.2]) * (k + 1) for k in range(n_before + n_after)]
    whole = make()
    w_whole = w.copy()
    for g in grads:
        whole.apply_gradients([(g, w_whole)])
    first = make()
    w1 = w.copy()
    for g in grads[:n_before]:
        first.apply_gradients([(g, w1)])
    if via == "state_dict":
        second, w2 = make(), w1.copy()
        second.load_state_dict(first.state_dict(), var_list=[w2])
    else:
        refopt.save_checkpoint(tmp_path / "avg.npz", first, [w1])
        second, (w2,) = refopt.load_checkpoint(tmp_path / "avg.npz", backend="reference")
        assert type(second) is type(whole) and second.get_config() == whole.get_config()
    for g in grads[n_before:]:
        second.apply_gradients([(g, w2)])
    np.testing.assert_array_equal(w2, w_whole)
    np.testing.assert_array_equal(second.get_slot(w2, "average"),
                                  whole.get_slot(w_whole, "average"))
    assert second.iterations == whole.iterations


@pytest.mark.parametrize("via", ["state_dict", "checkpoint"])
@pytest.mark.parametrize("make", [
    lambda: refopt.MovingAverage(refopt.Adam(learning_rate=0.1, convention="keras2",
                                             backend="reference"),
                                 average_decay=0.9, start_step=1, dynamic_decay=True),
    lambda: refopt.SWA(_sgd(momentum=0.9), start_averaging=1, average_period=2),
], ids=["moving_average", "swa"])
def test_resumed_runs_are_bit_identical(make, via, tmp_path):
    _pair_run(make, 3, 3, tmp_path, via)


def test_config_round_trip_and_state_of_another_config_refused():
    opt = refopt.MovingAverage(_sgd(momentum=0.9), average_decay=0.9, num_updates=5,
                               start_step=2, dynamic_decay=True, name="ma")
    config = opt.get_config()
    assert config["optimizer"]["class_name"] == "SGD"
    assert {k: config[k] for k in ("average_decay", "num_updates", "start_step",
                                   "dynamic_decay", "name")} == {
        "average_decay": 0.9, "num_updates": 5, "start_step": 2, "dynamic_decay": True,
        "name": "ma"}
    again = refopt.MovingAverage.from_config(config)
    assert again.get_config() == config and again.decay(3) == opt.decay(3)
    swa = refopt.SWA(_sgd(), start_averaging=3, average_period=4)
    assert refopt.SWA.from_config(swa.get_config()).get_config() == swa.get_config()
    w = np.float32([1.0, 2.0])
    opt.apply_gradients([(G.copy(), w)])
    other = refopt.MovingAverage(_sgd(momentum=0.9), average_decay=0.8, num_updates=5,
                                 start_step=2, dynamic_decay=True)
    with pytest.raises(ValueError, match="average_decay: saved 0.9"):
        other.load_state_dict(opt.state_dict(), var_list=[w.copy()])
    assert not other.built


def test_state_dict_and_variables_hold_the_averages():
    w = np.float32([1.0, 2.0])
    opt = refopt.MovingAverage(_sgd(momentum=0.9), average_decay=0.9)
    assert opt.slot_names == ("m", "average")
    opt.apply_gradients([(G.copy(), w)])
    sd = opt.state_dict()
    assert sd["class"] == "MovingAverage" and sd["slot_names"] == ["m", "average"]
    np.testing.assert_array_equal(sd["slots"]["average"][0], opt.get_slot(w, "average"))
    assert any(a is opt.get_slot(w, "average") for a in opt.variables)


# ---------------------------------------------------------------- the CUDA simulator
@pytest.mark.parametrize("case", ["keras2/moving_average_sgd_f32", "keras2/swa_adam_sparse_f32"])
def test_replay_cuda_simulator(case, monkeypatch):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    entry = next(e for e in conformance.load_manifest() if e["id"] == case)
    entry = dict(entry, steps=min(5, entry["steps"]))
    r = conformance.replay(entry, backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail


def test_docstring_examples_hold_tfa_values():
    result = doctest.testmod(averaging, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 4 and result.failed == 0
