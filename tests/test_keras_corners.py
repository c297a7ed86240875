"""What Keras/TF accept, reproduced under their conventions (issue 12 item 6).

Expected values are TensorFlow's (TF 2.21 + tf_keras 2.21 + Keras 3.15; TF 2.15 legacy Keras 2),
printed by the frameworks and copied here; the whole trajectories are golden cases replayed by
tests/test_conformance.py (ids in CORNER_CASES).
"""

import json
import math
import warnings

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt import schedules as S

INF, NAN = float("inf"), float("nan")
G = np.array([0.5, -1.0], np.float32)


def _sgd_steps(steps=1, dtype=np.float32, **kwargs):
    w = np.array([1.0, 2.0], dtype)
    opt = refopt.SGD(backend=kwargs.pop("backend", "reference"), **kwargs)
    for _ in range(steps):
        opt.apply_gradients([(G.astype(dtype), w)])
    return w


# ------------------------------------------------------------------ clip thresholds

@pytest.mark.parametrize("convention", ["tf_keras", "keras3", "keras2"])
@pytest.mark.parametrize("key", ["clipnorm", "global_clipnorm"])
def test_inf_clip_norm_gives_nan_weights_with_a_warning(convention, key):
    # TF 2.21 tf_keras/Keras 3 and TF 2.15 legacy SGD(lr=0.1, clipnorm=inf): [nan, nan]
    with pytest.warns(UserWarning, match=rf"{key}=inf under convention='{convention}'.*NaN"):
        w = _sgd_steps(learning_rate=0.1, convention=convention, **{key: INF})
    assert np.isnan(w).all()


def test_nan_clipnorm_means_no_clipping_in_tf_keras_and_nan_in_keras2():
    # tf_keras SGD(0.1, clipnorm=nan): [0.95, 2.1] (nan > 0 fails); legacy Keras 2: [nan, nan]
    with pytest.warns(UserWarning, match="no clipping"):
        w = _sgd_steps(learning_rate=0.1, clipnorm=NAN)
    np.testing.assert_array_equal(w, np.array([0.95, 2.1], np.float32))
    with pytest.warns(UserWarning, match="NaN"):
        assert np.isnan(_sgd_steps(learning_rate=0.1, clipnorm=NAN, convention="keras2")).all()


def test_inf_clipvalue_clips_nothing_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = _sgd_steps(learning_rate=0.1, clipvalue=INF)  # tf_keras: [0.95, 2.1]
    np.testing.assert_array_equal(w, np.array([0.95, 2.1], np.float32))


@pytest.mark.parametrize("convention", ["torch", "optax"])
@pytest.mark.parametrize("key,value", [("clipnorm", NAN), ("clipnorm", INF),
                                       ("global_clipnorm", INF), ("clipvalue", INF)])
def test_frameworks_without_it_refuse_non_finite_clip_thresholds(convention, key, value):
    with pytest.raises(ValueError, match=rf"`{key}` must be finite.*Received: {key}={value}"):
        refopt.SGD(learning_rate=0.1, convention=convention, **{key: value})


@pytest.mark.parametrize("cls", [refopt.Adam, refopt.Adagrad, refopt.RMSprop, refopt.Ftrl])
def test_tf_conventions_take_inf_for_every_optimizer(cls):
    with pytest.warns(UserWarning, match="clipnorm=inf"):
        opt = cls(learning_rate=0.1, clipnorm=INF, backend="reference")
    assert opt.get_config()["clipnorm"] == INF


def test_keras2_still_refuses_what_keras2_refuses():
    with pytest.raises(ValueError, match=r"clipnorm >= 0.*Received: clipnorm=-inf"):
        refopt.SGD(clipnorm=-INF, convention="keras2")
    with pytest.raises(ValueError, match=r"clipvalue.*NaN.*Received: clipvalue=nan"):
        refopt.SGD(clipvalue=NAN, convention="keras2")


# ------------------------------------------------------------------ schedules

STEPS = (-15, -5, -1, 0, 1, 2.5, 5, 12)
# float(schedule(step)) in tf_keras 2.21 and Keras 3.15 (identical), TF 2.21 CPU
KERAS_VALUES = {
    "ExponentialDecay": (lambda **k: S.ExponentialDecay(0.1, 10, 0.5, **k), [
        0.2828427255153656, 0.1414213627576828, 0.10717733949422836, 0.10000000149011612,
        0.09330330044031143, 0.08408964425325394, 0.0707106813788414, 0.043527524918317795]),
    "PiecewiseConstantDecay": (lambda: S.PiecewiseConstantDecay([10, 20], [1.0, 0.5, 0.1]),
                               [1.0] * 7 + [0.5]),
    "PolynomialDecay_cycle": (lambda **k: S.PolynomialDecay(0.1, 10, 0.01, cycle=True, **k), [
        -0.03500000387430191, -INF, -INF, 0.10000000149011612, 0.09099999815225601,
        0.07750000059604645, 0.054999999701976776, 0.04599999636411667]),
    "InverseTimeDecay": (lambda **k: S.InverseTimeDecay(0.1, 10, 0.5, **k), [
        0.4000000059604645, 0.13333334028720856, 0.10526315867900848, 0.10000000149011612,
        0.0952381044626236, 0.08888889104127884, 0.07999999821186066, 0.0625]),
    "CosineDecay_warmup": (lambda **k: S.CosineDecay(
        0.0, 10, alpha=0.1, warmup_target=0.2, warmup_steps=4, **k), [
        -0.75, -0.25, -0.05000000074505806, 0.0, 0.05000000074505806, 0.125,
        0.19559508562088013, 0.037188466638326645]),
    "CosineDecayRestarts": (lambda **k: S.CosineDecayRestarts(0.1, 10, 2.0, 0.5, 0.1, **k), [
        NAN, 0.1899999976158142, 0.027188464999198914, 0.10000000149011612,
        0.09779754281044006, 0.08681981265544891, 0.05499999597668648, 0.05389877036213875]),
}
# tf_keras 2.21 with decay_steps=0 (Keras 3 raises "Argument `decay_steps` must be > 0")
TF_KERAS_ZERO = {
    "CosineDecay": (lambda **k: S.CosineDecay(0.1, 0, **k), [NAN] * 8),
    "CosineDecay_warmup": (lambda **k: S.CosineDecay(0.1, 0, warmup_target=0.2, warmup_steps=3,
                                                     **k), [
        -0.4000000059604645, -0.06666667014360428, 0.06666666269302368, 0.10000000149011612,
        0.13333334028720856, 0.18333333730697632, NAN, NAN]),
    "ExponentialDecay": (lambda **k: S.ExponentialDecay(0.1, 0, 0.5, **k),
                         [INF, INF, INF, NAN, 0.0, 0.0, 0.0, 0.0]),
    "PolynomialDecay": (lambda **k: S.PolynomialDecay(0.1, 0, **k), [INF] * 3 + [NAN] * 5),
    "InverseTimeDecay": (lambda **k: S.InverseTimeDecay(0.1, 0, 0.5, **k),
                         [-0.0, -0.0, -0.0, NAN, 0.0, 0.0, 0.0, 0.0]),
    "CosineDecayRestarts": (lambda **k: S.CosineDecayRestarts(0.1, 0, **k), [NAN] * 8),
}


def _bits(values):
    return np.array(values, np.float32).view(np.uint32)


def _same(got, want):  # bit for bit, any NaN matching any NaN
    got, want = np.array(got, np.float32), np.array(want, np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(_bits(got[ok]), _bits(want[ok]))


@pytest.mark.parametrize("name", KERAS_VALUES)
def test_schedules_evaluate_negative_and_fractional_steps_as_keras(name):
    make, want = KERAS_VALUES[name]
    schedule = make()
    _same([schedule(s) for s in STEPS], want)
    assert schedule(np.int64(-3)) == schedule(-3.0)  # an int64 tensor or a float step


@pytest.mark.parametrize("name", TF_KERAS_ZERO)
@pytest.mark.parametrize("convention", ["tf_keras", "keras2"])
def test_zero_decay_steps_taken_under_tf_keras_with_a_warning(name, convention):
    make, want = TF_KERAS_ZERO[name]
    with pytest.raises(ValueError, match=r"decay_steps` must be > 0. Received: \w*decay_steps=0"):
        make()  # refopt's own check (Keras 3's)
    with pytest.warns(UserWarning, match=r"decay_steps`=0 under convention="):
        schedule = make(convention=convention)
    _same([schedule(s) for s in STEPS], want)
    config = S.serialize(schedule)
    assert config["config"]["convention"] == convention
    with pytest.warns(UserWarning):
        again = S.deserialize(config)
    _same([again(s) for s in STEPS], want)


def test_schedule_convention_is_checked_and_absent_from_default_configs():
    with pytest.raises(ValueError, match=r"convention.*Received: convention='tfkeras'"):
        S.CosineDecay(0.1, 10, convention="tfkeras")
    assert "convention" not in S.CosineDecay(0.1, 10).get_config()


def test_optimizer_steps_with_a_nan_rate_under_tf_keras_only():
    with pytest.warns(UserWarning):
        schedule = S.CosineDecay(0.1, 0, convention="tf_keras")
    with pytest.warns(UserWarning, match=r"returned nan at step 0.*convention='tf_keras'"):
        w = _sgd_steps(3, learning_rate=schedule)  # tf_keras: [nan, nan]
    assert np.isnan(w).all()
    with pytest.raises(ValueError, match=r"built under convention='tf_keras'.*convention='keras3'"):
        refopt.SGD(learning_rate=schedule, convention="keras3")


# ------------------------------------------------------------------ Keras 2's decay

def test_keras2_decay_divides_the_rate_by_one_plus_decay_times_iterations():
    # TF 2.15 tf.keras.optimizers.legacy.SGD(0.1, decay=0.1), 3 steps of g = [0.5, -1]
    w32 = _sgd_steps(3, learning_rate=0.1, decay=0.1, convention="keras2")
    assert w32.tolist() == [0.8628787398338318, 2.2742421627044678]
    w64 = _sgd_steps(3, np.float64, learning_rate=0.1, decay=0.1, convention="keras2")
    assert w64.tolist() == [0.862878786000578, 2.2742424279988445]  # the rate in float64
    # the semantics notes' check: SGD lr 1, decay 1, g = 1: w = -1, -1.5, -1.8333
    opt = refopt.SGD(learning_rate=1.0, decay=1.0, convention="keras2", backend="reference")
    w = np.zeros(1, np.float32)
    seen = []
    for _ in range(3):
        opt.apply_gradients([(np.ones(1, np.float32), w)])
        seen.append(float(w[0]))
    assert seen == [-1.0, -1.5, float(np.float32(-1.5) - np.float32(1.0) / np.float32(3.0))]
    assert opt.learning_rate == 1.0  # the hyperparameter, undecayed (Keras 2's `lr`)


def test_keras2_decay_config_round_trip_and_zero_means_none():
    opt = refopt.Adam(learning_rate=0.01, decay=0.05, convention="keras2", backend="reference")
    config = opt.get_config()
    assert config["decay"] == 0.05
    assert refopt.Adam.from_config(config).decay == 0.05
    assert "decay" not in refopt.Adam(backend="reference").get_config()
    a = _sgd_steps(2, learning_rate=0.1, decay=0.0, convention="keras2")
    b = _sgd_steps(2, learning_rate=0.1, convention="keras2")
    np.testing.assert_array_equal(a, b)


def test_keras2_decay_bad_values():
    with pytest.raises(ValueError, match=r"Expected decay >= 0.*Received: decay=-0\.1"):
        refopt.SGD(decay=-0.1, convention="keras2")
    with pytest.raises(TypeError, match=r"decay.*Received: decay='0\.1'"):
        refopt.SGD(decay="0.1", convention="keras2")
    with pytest.warns(UserWarning, match=r"decay=inf.*NaN"):
        w = _sgd_steps(learning_rate=0.1, decay=INF, convention="keras2")  # TF 2.15: [nan, nan]
    assert np.isnan(w).all()
    with pytest.warns(UserWarning, match=r"decay=nan.*no decay"):
        w = _sgd_steps(2, learning_rate=0.1, decay=NAN, convention="keras2")
    np.testing.assert_array_equal(w, _sgd_steps(2, learning_rate=0.1, convention="keras2"))


def test_decay_elsewhere():
    with pytest.warns(UserWarning, match=r"`decay` is no longer supported.*ignored"):
        w = _sgd_steps(2, learning_rate=0.1, decay=0.5, convention="keras3")  # Keras 3
    np.testing.assert_array_equal(w, _sgd_steps(2, learning_rate=0.1, convention="keras3"))
    with pytest.raises(ValueError, match=r"convention='tf1'.*tf.compat.v1.train.*'keras2'"):
        refopt.Adam(decay=0.1, convention="tf1")
    for convention in ("tf_keras", "torch", "optax"):  # tf-keras 2.11+ raises ValueError
        with pytest.raises(ValueError, match=r"`decay` is a legacy.*Received: decay=0\.1"):
            refopt.Adam(decay=0.1, convention=convention)


def test_keras2_decay_fast_path_is_bit_identical():
    for dtype in (np.float32, np.float64):
        ref = _sgd_steps(3, dtype, learning_rate=0.1, momentum=0.5, decay=0.1,
                         convention="keras2")
        cpu = _sgd_steps(3, dtype, learning_rate=0.1, momentum=0.5, decay=0.1,
                         convention="keras2", backend="cpu")
        np.testing.assert_array_equal(ref.view(np.uint8), cpu.view(np.uint8))


# TF 2.15 legacy optimizers (TF-Addons 0.23 LazyAdam), learning_rate 0.1, decay 0.3, 4 steps
# of g = [0.5, -1, 0.25 k] on w = [1, 2, -0.5]; Keras 2's Nadam ignores its decay
KERAS2_DECAY = {
    'RMSprop_float32': [0.297490656375885, 2.702509641647339, -1.0581724643707275],
    'RMSprop_float64': [0.2974907014809705, 2.7025094773717333, -1.0581724454700474],
    'Adagrad_float32': [0.8068444728851318, 2.209918737411499, -0.6363383531570435],
    'Adagrad_float64': [0.8068444623988975, 2.2099187093599455, -0.6363383817816132],
    'Adadelta_float32': [0.9995815753936768, 2.0004184246063232, -0.5003350377082825],
    'Adadelta_float64': [0.9995816213936808, 2.0004183798760176, -0.5003350636762768],
    'Adamax_float32': [0.7079454064369202, 2.2920546531677246, -0.6025458574295044],
    'Adamax_float64': [0.7079454008158829, 2.2920546283895744, -0.6025458550398112],
    'Nadam_float32': [0.6696597933769226, 2.3303401470184326, -0.8143520951271057],
    'Nadam_float64': [0.669659548192247, 2.330340484841795, -0.8143523773475818],
    'Ftrl_float32': [0.1373777538537979, 1.0022553205490112, -0.12140429019927979],
    'Ftrl_float64': [0.13737773763023509, 1.0022554862763329, -0.121404295834928],
    'LazyAdam_float32': [0.7079469561576843, 2.292053699493408, -0.6548937559127808],
    'LazyAdam_float64': [0.7079467138513618, 2.292053971870112, -0.6548939757495116],
}


@pytest.mark.parametrize("key", sorted(KERAS2_DECAY))
def test_keras2_decay_in_every_legacy_optimizer(key):
    name, dtype = key.split("_")
    for backend in ("reference", "cpu"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Nadam's "ignores decay"
            opt = getattr(refopt, name)(learning_rate=0.1, decay=0.3, convention="keras2",
                                        backend=backend)
        w = np.array([1.0, 2.0, -0.5], dtype)
        for k in range(4):
            opt.apply_gradients([(np.array([0.5, -1.0, 0.25 * k], dtype), w)])
        assert w.tolist() == KERAS2_DECAY[key], backend


def test_keras2_nadam_warns_that_it_ignores_decay():
    with pytest.warns(UserWarning, match=r"Nadam under convention='keras2' ignores decay=0\.3"):
        refopt.Nadam(decay=0.3, convention="keras2")


# ------------------------------------------------------------------ golden cases

CORNER_CASES = [
    "tf_keras/sgd_clipnorm_inf_f32", "keras3/adam_global_clipnorm_inf_f32",
    "tf_keras/sgd_cosine_decay0_f32", "keras3/sgd_decay_ignored_f32",
    "keras2/adam_decay_f32", "keras2/adam_decay_f64", "keras2/sgd_decay_momentum_f32",
    "keras2/sgd_decay_sched_f64", "keras2/sgd_clipnorm_inf_f32",
]


def test_corner_cases_are_recorded_from_the_frameworks():
    by_id = {e["id"]: e for e in conformance.load_manifest()}
    for case_id in CORNER_CASES:
        entry = by_id[case_id]
        assert entry["tolerance_ulp"] == 0
        assert entry["framework"] == "tensorflow"
        _, _, params, _ = conformance.load_case(entry)
        degenerate = "inf" in case_id or "decay0" in case_id
        assert bool(np.isnan(params[-1][0]).all()) == degenerate
    json.dumps(by_id[CORNER_CASES[0]])  # plain JSON


@pytest.mark.parametrize("case_id", ["keras2/adam_decay_f64", "tf_keras/sgd_cosine_decay0_f32"])
def test_corner_cases_replay_bit_identical(case_id):
    entry = {e["id"]: e for e in conformance.load_manifest()}[case_id]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = conformance.replay(entry, backend="reference")
    assert result.passed and result.max_ulp == 0, result.detail
    assert not math.isinf(result.max_ulp)
