import numpy as np
import pytest

import refopt
from refopt import IndexedSlices, schedules

from optimizer_db import OPTIMIZERS, optimizer_id

F32 = np.float32

SCHEDULES = [
    schedules.ExponentialDecay(0.1, 10, 0.5, staircase=True),
    schedules.PiecewiseConstantDecay([2, 4], [0.1, 0.05, 0.01]),
    schedules.PolynomialDecay(0.1, 10, 0.01, power=2.0, cycle=True),
    schedules.InverseTimeDecay(0.1, 10, 0.5),
    schedules.CosineDecay(0.0, 10, alpha=0.1, warmup_target=0.2, warmup_steps=4),
    schedules.CosineDecayRestarts(0.1, 3, t_mul=2.0, m_mul=0.5, alpha=0.1),
]


def _run(opt, steps=4, seed=0, sparse=False):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((4, 3)).astype(F32)
    b = rng.standard_normal(5).astype(F32)
    for _ in range(steps):
        ga = rng.standard_normal((4, 3)).astype(F32)
        if sparse:
            ga = IndexedSlices(ga[:2], rng.integers(0, 4, 2), (4, 3))
        opt.apply_gradients([(ga, a), (rng.standard_normal(5).astype(F32), b)])
    return a, b


@pytest.mark.parametrize("info", OPTIMIZERS, ids=optimizer_id)
def test_config_round_trip_gives_identical_trajectories(info):
    for config in info.configs:
        opt = info.cls(**config)
        clone = info.cls.from_config(opt.get_config())
        assert clone.get_config() == opt.get_config()
        for x, y in zip(_run(opt), _run(clone)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: type(s).__name__)
def test_config_round_trip_with_schedules(schedule):
    opt = refopt.Adam(learning_rate=schedule, amsgrad=True)
    config = opt.get_config()
    assert config["learning_rate"]["class_name"] == type(schedule).__name__
    clone = refopt.Adam.from_config(config)
    assert isinstance(clone._learning_rate, type(schedule))
    for x, y in zip(_run(opt, steps=8), _run(clone, steps=8)):
        np.testing.assert_array_equal(x, y)


def test_get_config_has_the_tf_keras_keys():
    config = refopt.Adam().get_config()
    assert set(config) == {
        "name", "learning_rate", "weight_decay", "clipnorm", "global_clipnorm", "clipvalue",
        "use_ema", "ema_momentum", "ema_overwrite_frequency", "jit_compile",
        "is_legacy_optimizer", "beta_1", "beta_2", "epsilon", "amsgrad", "backend", "convention",
    }
    assert config["learning_rate"] == float(F32(0.001))  # stored as float32, like tf-keras
    assert config["epsilon"] == 1e-7 and config["name"] == "Adam"
    sgd = refopt.SGD().get_config()
    assert sgd["momentum"] == 0.0 and sgd["nesterov"] is False and sgd["learning_rate"] == float(F32(0.01))
    assert refopt.AdamW().get_config()["weight_decay"] == 0.004


def test_defaults_match_tf_keras():
    adam = refopt.Adam()
    assert (adam.beta_1, adam.beta_2, adam.epsilon, adam.amsgrad) == (0.9, 0.999, 1e-7, False)
    assert adam.weight_decay is None and adam.use_ema is False and adam.ema_momentum == 0.99
    assert refopt.LazyAdam().name == "LazyAdam" and refopt.AdamW().name == "AdamW"
    assert refopt.SGD().learning_rate == float(F32(0.01))


def test_learning_rate_getter_and_setter_rules():
    opt = refopt.SGD(learning_rate=0.1)
    assert opt.learning_rate == float(F32(0.1))
    opt.learning_rate = 0.5
    assert opt.learning_rate == 0.5
    with pytest.raises(ValueError, match="learning_rate"):
        opt.learning_rate = -1.0
    assert opt.learning_rate == 0.5
    sched = schedules.ExponentialDecay(1.0, 1, 0.5)
    opt = refopt.SGD(learning_rate=sched)
    assert opt.learning_rate == 1.0  # evaluated at iterations = 0
    w = np.zeros(1, F32)
    opt.apply_gradients([(np.ones(1, F32), w)])
    opt.apply_gradients([(np.ones(1, F32), w)])
    assert opt.learning_rate == 0.5  # the value used by the last step (step 1)
    with pytest.raises(TypeError, match="not settable"):
        opt.learning_rate = 0.1
    opt.learning_rate = schedules.ExponentialDecay(2.0, 1, 0.5)  # a schedule may replace one
    assert opt.learning_rate == 0.5  # 2.0 * 0.5**2 at iterations = 2


def test_variables_are_in_tf_keras_order():
    a, b = np.ones(2, F32), np.ones(3, F32)
    opt = refopt.Adam(amsgrad=True, use_ema=True)
    opt.build([a, b])
    v = opt.variables
    assert len(v) == 1 + 2 + 3 * 2
    assert v[0] == 0
    # tf-keras 2.21 order: [iteration, avg_a, avg_b, m_a, v_a, m_b, v_b, vhat_a, vhat_b]
    get = opt.get_slot
    expected = [get(a, "average"), get(b, "average"), get(a, "m"), get(a, "v"), get(b, "m"),
                get(b, "v"), get(a, "vhat"), get(b, "vhat")]
    assert all(x is y for x, y in zip(v[1:], expected))
    np.testing.assert_array_equal(opt.get_slot(a, "average"), a)  # copy-initialised
    with pytest.raises(KeyError, match="Unknown slot"):
        opt.get_slot(a, "velocity")


def test_none_gradient_is_skipped_with_a_warning():
    a, b = np.ones(2, F32), np.ones(2, F32)
    opt = refopt.SGD(learning_rate=1.0, momentum=0.5)
    with pytest.warns(UserWarning, match=r"positions \[1\]"):
        opt.apply_gradients([(np.ones(2, F32), a), (None, b)])
    np.testing.assert_array_equal(a, [0, 0])
    np.testing.assert_array_equal(b, [1, 1])
    np.testing.assert_array_equal(opt.get_slot(b, "m"), [0, 0])
    assert opt.iterations == 1


def test_empty_gradient_list_is_a_no_op():
    opt = refopt.Adam()
    assert opt.apply_gradients([]) == 0
    assert opt.iterations == 0 and opt.variables == [np.int64(0)]


def test_ema_updates_only_the_variables_of_the_call():
    a, b = np.ones(2, F32), np.ones(2, F32)
    opt = refopt.SGD(learning_rate=1.0, use_ema=True, ema_momentum=0.5)
    opt.build([a, b])
    opt.apply_gradients([(np.ones(2, F32), a)])
    np.testing.assert_array_equal(opt.get_slot(a, "average"), [0.5, 0.5])
    np.testing.assert_array_equal(opt.get_slot(b, "average"), [1, 1])


def test_finalize_without_ema_is_a_no_op_and_with_unknown_variable_raises():
    w = np.ones(2, F32)
    opt = refopt.SGD(learning_rate=1.0)
    opt.apply_gradients([(np.ones(2, F32), w)])
    opt.finalize_variable_values([w])
    np.testing.assert_array_equal(w, [0, 0])
    opt = refopt.SGD(use_ema=True)
    opt.build([w])
    with pytest.raises(KeyError):
        opt.finalize_variable_values([w, np.ones(2, F32)])


def test_minimize_applies_the_gradients_of_the_callable_and_returns_the_loss():
    w = np.array([3.0, -2.0], F32)
    opt = refopt.SGD(learning_rate=0.25)

    def loss_and_grads():
        return float(np.sum(w**2)), [2 * w]

    losses = [opt.minimize(loss_and_grads, [w]) for _ in range(3)]
    assert losses == [13.0, 3.25, 0.8125]  # w halves each step: (1 - 0.25*2) = 0.5
    np.testing.assert_array_equal(w, [0.375, -0.25])


def test_build_is_idempotent_and_excluded_variables_are_not_decayed():
    a, b = np.full(2, 2.0, F32), np.full(2, 2.0, F32)
    opt = refopt.SGD(learning_rate=1.0, weight_decay=0.1)
    opt.exclude_from_weight_decay(var_list=[b])
    opt.build([a, b])
    opt.build([a])
    opt.apply_gradients([(np.zeros(2, F32), a), (np.zeros(2, F32), b)])
    np.testing.assert_allclose(a, [1.8, 1.8], rtol=1e-7)
    np.testing.assert_array_equal(b, [2, 2])


def test_lazy_adam_weight_decay_is_lazy():
    t = np.full((3, 2), 2.0, F32)
    opt = refopt.LazyAdam(learning_rate=0.1, weight_decay=0.5)
    opt.apply_gradients([(IndexedSlices(np.zeros((1, 2), F32), [1], (3, 2)), t)])
    np.testing.assert_array_equal(t[[0, 2]], np.full((2, 2), 2.0, F32))
    np.testing.assert_allclose(t[1], [1.9, 1.9], rtol=1e-7)  # 2 - 2*0.5*0.1, zero gradient


def test_lazy_adam_with_a_dense_gradient_is_adam():
    a, b = np.ones((3, 2), F32), np.ones((3, 2), F32)
    lazy, adam = refopt.LazyAdam(learning_rate=0.1), refopt.Adam(learning_rate=0.1)
    for k in range(3):
        g = np.full((3, 2), 0.1 * (k + 1), F32)
        lazy.apply_gradients([(g, a)])
        adam.apply_gradients([(g, b)])
    np.testing.assert_array_equal(a, b)


def test_optimizer_works_with_zero_d_and_empty_variables():
    s, e = np.array(1.0, F32), np.zeros((0, 3), F32)
    opt = refopt.Adam(learning_rate=0.1, use_ema=True)
    opt.apply_gradients([(np.array(0.5, F32), s), (np.zeros((0, 3), F32), e)])
    assert s.shape == () and float(s) < 1.0 and e.shape == (0, 3)
    lazy = refopt.LazyAdam()
    lazy.apply_gradients([(IndexedSlices(np.zeros((0, 3), F32), np.zeros(0, np.int64), (0, 3)), e)])
    assert lazy.iterations == 1


def test_python_number_arguments_are_accepted_as_in_keras():
    opt = refopt.SGD(learning_rate=1, momentum=0)  # ints are fine
    w = np.zeros(1, F32)
    opt.apply_gradients([(np.ones(1, F32), w)])
    assert w[0] == -1.0
    opt = refopt.Adam(learning_rate=np.float32(0.01), beta_1=np.float64(0.9))
    assert opt.learning_rate == float(F32(0.01))


def test_indexed_slices_deduplicate_keeps_first_appearance_order_and_sums_in_order():
    g = IndexedSlices(np.array([[1.0], [2.0], [3.0], [4.0]], F32), [5, 2, 5, 0], (6, 1))
    d = g.deduplicate()
    np.testing.assert_array_equal(d.indices, [5, 2, 0])
    np.testing.assert_array_equal(d.values, [[4.0], [2.0], [4.0]])
    np.testing.assert_array_equal(d.to_dense()[:, 0], [4, 0, 2, 0, 0, 4])
    np.testing.assert_array_equal(g.to_dense(), d.to_dense())
    assert "IndexedSlices(values=" in repr(g) and d.dtype == np.float32


class HalvingSchedule(schedules.LearningRateSchedule):
    def __init__(self, initial_learning_rate):
        self.initial_learning_rate = initial_learning_rate

    def __call__(self, step):
        return np.float32(self.initial_learning_rate) / np.float32(2.0) ** np.float32(step)

    def get_config(self):
        return {"initial_learning_rate": self.initial_learning_rate}


def test_custom_schedule_round_trips_with_custom_objects():
    opt = refopt.SGD(learning_rate=HalvingSchedule(1.0))
    config = opt.get_config()
    with pytest.raises(ValueError, match="Unknown learning rate schedule"):
        refopt.SGD.from_config(config)
    clone = refopt.SGD.from_config(config, custom_objects={"HalvingSchedule": HalvingSchedule})
    w1, w2 = np.zeros(1, F32), np.zeros(1, F32)
    for _ in range(3):
        opt.apply_gradients([(np.ones(1, F32), w1)])
        clone.apply_gradients([(np.ones(1, F32), w2)])
    assert w1[0] == w2[0] == -1.75  # 1 + 0.5 + 0.25


def test_slot_names_and_built_are_public():
    opt = refopt.Adam(amsgrad=True, use_ema=True)
    assert opt.slot_names == ("m", "v", "vhat", "average") and not opt.built
    opt.build([np.ones(2, F32)])
    assert opt.built and refopt.SGD().slot_names == ("m",)
