import json
import pathlib
from fractions import Fraction

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt import optax_schedules as osch
from refopt.checkpoint import load_checkpoint, save_checkpoint
from refopt.schedules import deserialize, serialize

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "conformance" / "schedules" / "optax.json"
RECORDED = json.loads(GOLDEN.read_text())["schedules"]
INT32_MAX = 2**31 - 1


def bits(x):
    return int(np.asarray(np.float32(x)).view(np.uint32))


def exact_fma32(a, b, c):
    """float32(a*b + c) with one rounding, by exact rational arithmetic (ties to even)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    near = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(near, np.float32(-np.inf)), near,
                 np.nextafter(near, np.float32(np.inf))):
        d = abs(Fraction(float(cand)) - exact)
        key = (d, bits(cand) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


# ---------------------------------------------------------------------------------------------
# Golden values recorded from optax 0.2.8 under jax.jit (gen_optax.py --schedules)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id", sorted(RECORDED))
def test_schedule_values_are_bit_identical_to_optax_under_jit(case_id):
    entry = RECORDED[case_id]
    schedule = deserialize(entry["schedule"])
    got = [bits(schedule(step)) for step in entry["steps"]]
    diff = [(s, hex(g), hex(w)) for s, g, w in zip(entry["steps"], got, entry["bits"]) if g != w]
    assert not diff, diff[:5]


def test_golden_file_covers_every_schedule_function():
    names = set()

    def walk(spec):
        names.add(spec["class_name"])
        for inner in spec["config"].get("schedules", []):
            walk(inner)

    for entry in RECORDED.values():
        walk(entry["schedule"])
    assert names == set(osch.SCHEDULES)


def test_polynomial_schedule_with_power_half_is_nan_past_its_end_as_in_optax():
    # fma(-T, f32(1/T), 1) is slightly negative for T = 48 (and 60% of T < 200), so optax's
    # frac ** 0.5 is NaN from the end of the transition on
    steps = RECORDED["polynomial_sqrt_nan"]["steps"]
    values = [np.uint32(b).view(np.float32) for b in RECORDED["polynomial_sqrt_nan"]["bits"]]
    assert np.isnan(values[steps.index(48)]) and np.isnan(values[steps.index(59)])
    assert not np.isnan(values[steps.index(47)])


@pytest.mark.parametrize("entry", [e for e in conformance.load_manifest()
                                   if e["id"].startswith("optax/adam_sched_")],
                         ids=lambda e: e["id"])
def test_the_learning_rate_inside_optax_adam_is_the_schedule_value(entry):
    with (conformance._data() / entry["file"]).open("rb") as f:
        z = dict(np.load(f))
    schedule = deserialize(entry["hyperparameters"]["learning_rate"])
    for k in range(1, entry["steps"] + 1):
        assert bits(schedule(k - 1)) == bits(z[f"state/learning_rate/{k}"]), k


def test_adam_with_an_optax_schedule_uses_it_at_the_pre_increment_step():
    schedule = osch.linear_schedule(0.1, 0.0, transition_steps=4)
    opt = refopt.Adam(learning_rate=schedule, convention="optax")
    w = np.ones(3, np.float32)
    for k in range(6):
        opt.apply_gradients([(np.full(3, 0.5, np.float32), w)])
        assert opt.learning_rate == float(schedule(k))
    assert opt.learning_rate == 0.0


# ---------------------------------------------------------------------------------------------
# optax's numerics: XLA's reciprocal, FMA, int32 count
# ---------------------------------------------------------------------------------------------


def test_linear_schedule_is_two_fmas_with_the_float32_reciprocal():
    init, end, steps = 0.3, 0.01, 97
    s = osch.linear_schedule(init, end, steps)
    r = np.float32(1) / np.float32(steps)
    for c in (1, 13, 50, 96):
        frac = exact_fma32(-np.float32(c), r, np.float32(1))
        assert bits(s(c)) == bits(exact_fma32(np.float32(init - end), frac, np.float32(end)))


def test_fma32_rounds_once_even_at_float64_ties():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(300).astype(np.float32)
    b = rng.standard_normal(300).astype(np.float32)
    c = rng.standard_normal(300).astype(np.float32)
    for x, y, z in zip(a, b, c):
        assert bits(osch._fma32(x, y, z)) == bits(exact_fma32(x, y, z))
    # a*b + c exactly halfway between two float32 in float64, the rest below float64's ulp
    x, y = np.float32(1 + 2**-12), np.float32(1 + 2**-12)  # x*y = 1 + 2**-11 + 2**-24
    z = np.float32(2**-24 - 2**-48)
    assert bits(osch._fma32(x, y, z)) == bits(exact_fma32(x, y, z))
    assert bits(osch._fma32(x, y, -z)) == bits(exact_fma32(x, y, -z))


def test_integer_power_is_square_and_multiply():
    x = np.float32(0.7331)
    cube = np.float32(x * np.float32(x * x))
    assert bits(osch._const_pow32(x, 3)) == bits(cube)
    assert bits(osch._const_pow32(x, -1)) == bits(np.float32(1) / x)
    assert osch._const_pow32(x, 0) == 1


def test_the_count_saturates_at_the_int32_maximum():
    s = osch.exponential_decay(1.0, transition_steps=10**8, decay_rate=0.5)
    assert bits(s(2**40)) == bits(s(INT32_MAX)) != bits(s(INT32_MAX - 10**6))


def test_subnormal_values_flush_to_zero():
    s = osch.exponential_decay(1.0, transition_steps=1, decay_rate=0.5)
    assert s(140) == 0 and s(126) > 0  # 2**-140 is subnormal in float32


# ---------------------------------------------------------------------------------------------
# optax's rules for degenerate arguments
# ---------------------------------------------------------------------------------------------


def test_degenerate_arguments_follow_optax():
    assert bits(osch.linear_schedule(0.3, 0.1, 0)(5)) == bits(0.3)
    assert bits(osch.exponential_decay(0.3, 0, 0.5)(5)) == bits(0.3)
    assert bits(osch.exponential_decay(0.3, 10, 0.0)(5)) == bits(0.3)
    neg = osch.linear_schedule(1.0, 0.0, 4, transition_begin=-3)
    zero = osch.linear_schedule(1.0, 0.0, 4, transition_begin=0)
    assert [bits(neg(t)) for t in range(6)] == [bits(zero(t)) for t in range(6)]
    assert osch.piecewise_constant_schedule(0.2)(10**6) == np.float32(0.2)


def test_warmup_cosine_alpha_is_computed_in_python():
    peak, end = 0.3, 0.1
    s = osch.warmup_cosine_decay_schedule(0.0, peak, 1, 11)
    t = osch.warmup_cosine_decay_schedule(0.0, peak, 1, 11, end_value=end)
    assert s(11) == 0 and bits(t(11)) == bits(np.float32(peak) * np.float32(end / peak))


def test_join_takes_the_steps_since_each_boundary_and_later_boundaries_win():
    a, b = osch.constant_schedule(1.0), osch.linear_schedule(1.0, 0.0, 10)
    s = osch.join_schedules([a, b, a], [2, 5])
    assert [float(s(t)) for t in (0, 1, 2, 3, 4, 5, 9)] == [1.0, 1.0, 1.0,
                                                             float(b(1)), float(b(2)), 1.0, 1.0]


# ---------------------------------------------------------------------------------------------
# Serialization, optimizers, checkpoints
# ---------------------------------------------------------------------------------------------

ALL = [
    osch.constant_schedule(0.1),
    osch.linear_schedule(0.1, 0.01, 10, 2),
    osch.polynomial_schedule(0.1, 0.01, 1.5, 10, 1),
    osch.exponential_decay(0.1, 5, 0.7, 1, True, 0.02),
    osch.cosine_decay_schedule(0.1, 20, 0.1, 2.0),
    osch.warmup_cosine_decay_schedule(0.0, 0.1, 3, 20, 0.001),
    osch.warmup_exponential_decay_schedule(0.0, 0.1, 3, 5, 0.5),
    osch.piecewise_constant_schedule(0.1, {5: 0.5, 2: 0.1}),
    osch.join_schedules([osch.constant_schedule(0.1), osch.linear_schedule(0.1, 0.0, 5)], [4]),
]


@pytest.mark.parametrize("schedule", ALL, ids=lambda s: type(s).__name__)
def test_json_round_trip_is_bit_identical(schedule):
    payload = json.loads(json.dumps(serialize(schedule)))
    assert payload["class_name"] == type(schedule).__name__
    rebuilt = deserialize(payload)
    assert rebuilt.get_config() == schedule.get_config()
    assert [bits(rebuilt(t)) for t in range(25)] == [bits(schedule(t)) for t in range(25)]


def test_optimizer_config_and_checkpoint_keep_the_schedule(tmp_path):
    schedule = osch.warmup_cosine_decay_schedule(0.0, 0.05, 2, 8, 0.001)
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(4).astype(np.float32) for _ in range(6)]

    def run(opt, w, gs):
        for g in gs:
            opt.apply_gradients([(g.copy(), w)])

    w = np.ones(4, np.float32)
    opt = refopt.Adam(learning_rate=schedule, convention="optax")
    run(opt, w, grads[:3])
    save_checkpoint(tmp_path / "c.npz", opt, [w])
    run(opt, w, grads[3:])
    resumed, (w2,) = load_checkpoint(tmp_path / "c.npz")
    assert type(resumed.get_config()["learning_rate"]) is dict
    run(resumed, w2, grads[3:])
    assert w2.tobytes() == w.tobytes()
    clone = refopt.Adam.from_config(json.loads(json.dumps(opt.get_config())))
    assert clone.get_config() == opt.get_config()


def test_works_under_other_conventions():
    s = osch.piecewise_constant_schedule(0.1, {1: 0.5})
    for conv in ("tf_keras", "torch"):
        opt = refopt.SGD(learning_rate=s, convention=conv)
        w = np.ones(2, np.float32)
        opt.apply_gradients([(np.ones(2, np.float32), w)])
        opt.apply_gradients([(np.ones(2, np.float32), w)])
        assert opt.learning_rate == float(np.float32(0.05))


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error naming the argument and the value
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make, error, match", [
    (lambda: osch.cosine_decay_schedule(0.1, 0), ValueError, "decay_steps=0"),
    (lambda: osch.warmup_cosine_decay_schedule(0.0, 0.1, 5, 5), ValueError, "decay_steps=0"),
    (lambda: osch.linear_schedule(0.1, 0.0, 2.5), TypeError, "transition_steps=2.5"),
    (lambda: osch.linear_schedule(float("nan"), 0.0, 3), ValueError, "init_value=nan"),
    (lambda: osch.exponential_decay(0.1, 3, 0.5, staircase=1), TypeError, "staircase=1"),
    (lambda: osch.exponential_decay(0.1, 2**31, 0.5), ValueError, "transition_steps=2147483648"),
    (lambda: osch.piecewise_constant_schedule(0.1, {3: -0.5}), ValueError, "non-negative"),
    (lambda: osch.piecewise_constant_schedule(0.1, {-3: 0.5}), ValueError, "step=-3"),
    (lambda: osch.piecewise_constant_schedule(0.1, [3]), TypeError, "boundaries_and_scales"),
    (lambda: osch.join_schedules([osch.constant_schedule(1.0)], [3]), ValueError, "one entry"),
    (lambda: osch.join_schedules([refopt.schedules.ExponentialDecay(0.1, 3, 0.5)], []),
     TypeError, "schedules\\[0\\]"),
    (lambda: osch.join_schedules([], []), ValueError, "schedules=\\[\\]"),
])
def test_bad_arguments_raise_naming_them(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("step, error", [(-1, ValueError), (1.5, ValueError),
                                         ("3", TypeError), (np.zeros(2), ValueError)])
def test_bad_steps_raise(step, error):
    with pytest.raises(error, match="step"):
        osch.constant_schedule(0.1)(step)


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(osch, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_linear_decay_to_zero_steps_on_past_its_tiny_negative_end():
    """Under jit optax's linear_schedule(0.1, 0, 10) ends at -1.49e-9 (T*f32(1/T) != 1) and
    optax.sgd goes on stepping with it; refopt used to refuse the negative rate (found by a
    user). optax 0.2.8 (update jitted), 15 steps of gradient 1 from 1: 0x3ee66666 each."""
    import refopt
    from refopt.optax_schedules import linear_schedule

    for backend in ("reference", "cpu"):
        opt = refopt.SGD(learning_rate=linear_schedule(0.1, 0.0, 10), convention="optax",
                         backend=backend)
        w = np.ones(3, np.float32)
        for _ in range(15):
            opt.apply_gradients([(np.ones(3, np.float32), w)])
        assert w.view(np.uint32).tolist() == [1055286886] * 3, backend
