import re
from pathlib import Path

import numpy as np
import pytest

import refopt
from refopt._libm import power  # the C library's powf/pow, as tf.pow calls on CPU
from refopt.testing import (
    ConformanceError,
    assert_conforms,
    check_trajectory,
    ulp_distance,
)
from refopt.testing.golden import make_trajectory

README = Path(__file__).resolve().parents[1] / "README.md"


# --------------------------------------------------------------------------- a port, by hand
# tf-keras 2.11+ Adam written from its formulas (README "Numerics worth knowing"), as a porter
# would write it: lr and the betas inside the bias corrections go through float32 (tf.cast of a
# Python float), 1 - beta is rounded once from float64, epsilon is not bias-corrected.
def tf_keras_adam(params, grads, state, hyper, t, *, bug=None, bug_from=1):
    new_params, new_state = [], []
    for w, g, s in zip(params, grads, state):
        dtype = w.dtype
        f = dtype.type
        buggy = bug is not None and t >= bug_from
        lr = f(np.float32(hyper["learning_rate"]))
        b1, b2 = f(np.float32(hyper["beta_1"])), f(np.float32(hyper["beta_2"]))
        c1, c2 = f(1 - hyper["beta_1"]), f(1 - hyper["beta_2"])
        if buggy and bug == "one_minus_f32_beta":
            c1, c2 = f(1) - b1, f(1) - b2
        p1, p2 = power(dtype, b1, f(t)), power(dtype, b2, f(t))
        alpha = lr * np.sqrt(f(1) - p2) / (f(1) - p1)
        eps = f(hyper["epsilon"])
        if buggy and bug == "bias_corrected_epsilon":  # the paper's (and PyTorch's) placement
            eps = eps * np.sqrt(f(1) - p2)
        m = s["m"] + (g - s["m"]) * c1
        v = s["v"] + (g * g - s["v"]) * c2
        out = {"m": m, "v": v}
        denominator = v
        if hyper["amsgrad"]:
            out["vhat"] = denominator = np.maximum(s["vhat"], v)
        new_params.append(w - (m * alpha) / (np.sqrt(denominator) + eps))
        new_state.append(out)
    return new_params, new_state


def one_ulp_off_at_step_2(params, grads, state, hyper, t):
    new_params, new_state = tf_keras_adam(params, grads, state, hyper, t)
    if t == 2:
        new_params[0] = np.nextafter(new_params[0], np.inf, dtype=new_params[0].dtype)
    return new_params, new_state


# --------------------------------------------------------------------------- ulp_distance
def test_ulp_distance_counts_representable_values():
    f = np.float32
    one, big = f(1), np.finfo(f).max
    actual = np.array([one, np.nextafter(one, f(2)), -0.0, 0.0, np.nan, np.nan, np.inf, big,
                       -np.float32(np.finfo(f).smallest_subnormal), f(2)], f)
    desired = np.array([one, one, 0.0, -0.0, np.nan, 1.0, big, big,
                        np.float32(np.finfo(f).smallest_subnormal), np.nextafter(f(2), f(0))], f)
    np.testing.assert_array_equal(ulp_distance(actual, desired),
                                  [0, 1, 0, 0, 0, np.inf, 1, 0, 2, 1])


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_ulp_distance_across_zero_and_extremes(dtype):
    info = np.finfo(dtype)
    a = np.array([info.max, -info.max, np.inf], dtype)
    d = np.array([-info.max, info.max, -np.inf], dtype)
    k = int(np.array(info.max, dtype).view(f"i{info.bits // 8}"))  # values from +0 to max
    np.testing.assert_array_equal(ulp_distance(a, d), [2 * k, 2 * k, 2 * k + 2])
    assert ulp_distance(np.array([info.max], dtype), np.array([np.inf], dtype))[0] == 1


def test_ulp_distance_refuses_mixed_inputs():
    with pytest.raises(TypeError, match="dtypes differ"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(2, np.float64))
    with pytest.raises(ValueError, match="shapes differ"):
        ulp_distance(np.zeros(2, np.float32), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="actual"):
        ulp_distance(np.zeros(2, np.int32), np.zeros(2, np.int32))


# --------------------------------------------------------------------------- the self-check
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_faithful_tf_keras_adam_conforms_bit_for_bit(dtype):
    assert_conforms(tf_keras_adam, dtype=dtype, steps=4, max_examples=40)


@pytest.mark.parametrize("optimizer", ["Adam", "AdamW", "LazyAdam", "SGD"])
def test_refopt_classes_conform_with_every_option(optimizer):
    assert_conforms(getattr(refopt, optimizer), optimizer=optimizer, max_examples=15,
                    vary=("weight_decay", "clipping", "ema", "schedules"), sparse=True)


def test_bias_corrected_epsilon_is_reported_in_the_params_with_its_ulp_error():
    with pytest.raises(ConformanceError) as info:
        assert_conforms(lambda *a: tf_keras_adam(*a, bug="bias_corrected_epsilon"),
                        max_examples=50)
    err = info.value
    # m and v are right; only the weights move differently. Shrinking leaves the diverging step
    # as the trajectory's last one, and no step before it diverged.
    assert {m["array"] for m in err.mismatches} == {"params"}
    assert err.step == err.trajectory.steps
    assert all(m["max_ulp"] >= 1 for m in err.mismatches)
    report = str(err)
    assert f"first divergence at step {err.step}" in report
    assert re.search(r"variable \d \(shape .*\), params: \d+ of \d+ element\(s\) off by more "
                     r"than 0 ulp; worst at index .*: \d+ ulp, candidate .* \(-?0x.*\), "
                     r"reference .* \(-?0x.*\)", report)
    assert "input:" in report and "Trajectory(optimizer='Adam'" in report
    assert "seed=0" in report


def test_one_minus_float32_beta_is_reported_in_the_moments():
    with pytest.raises(ConformanceError) as info:
        assert_conforms(lambda *a: tf_keras_adam(*a, bug="one_minus_f32_beta"), max_examples=50)
    arrays = {m["array"] for m in info.value.mismatches}
    assert arrays & {"m", "v"}
    assert "slot 'm'" in str(info.value) or "slot 'v'" in str(info.value)


def test_a_bug_from_step_3_is_reported_at_step_3():
    trajectory = make_trajectory(config={"learning_rate": 0.1, "epsilon": 1e-3},
                                 shapes=[(3,), (2, 2)], steps=5, seed=1)
    candidate = lambda *a: tf_keras_adam(*a, bug="bias_corrected_epsilon", bug_from=3)  # noqa: E731
    with pytest.raises(ConformanceError) as info:
        check_trajectory(candidate, trajectory)
    assert info.value.step == 3
    assert "first divergence at step 3 of 5" in str(info.value)
    assert "state before step 3" in str(info.value)


def test_resync_keeps_an_error_from_compounding():
    trajectory = make_trajectory(config={"learning_rate": 0.1}, shapes=[(4,)], steps=5, seed=2)
    with pytest.raises(ConformanceError) as info:
        check_trajectory(one_ulp_off_at_step_2, trajectory)
    assert info.value.step == 2
    [mismatch] = info.value.mismatches
    assert (mismatch["array"], mismatch["max_ulp"], mismatch["count"]) == ("params", 1, 4)
    # Within 1 ulp the candidate passes: steps 3-5 started again from the reference's state.
    check_trajectory(one_ulp_off_at_step_2, trajectory, tolerance_ulp=1)


# --------------------------------------------------------------------------- stateful candidates
class CopyingSlots:
    """refopt's Adam, 1 ulp off in m after step 1, whose get_slot returns copies."""

    nudge = True

    def __init__(self, **config):
        self.opt = refopt.Adam(**config)

    def apply_gradients(self, grads_and_vars):
        pairs = list(grads_and_vars)
        self.opt.apply_gradients(pairs)
        if self.nudge and self.opt.iterations == 1:
            for _, var in pairs:
                m = self.opt.get_slot(var, "m")
                m[...] = np.nextafter(m, np.inf, dtype=m.dtype)

    def get_slot(self, var, name):
        return self.opt.get_slot(var, name).copy()


class CopyingSlotsWithSetter(CopyingSlots):
    def set_slot(self, var, name, value):
        np.copyto(self.opt.get_slot(var, name), value)


def test_stateful_candidate_needs_live_slots_or_set_slot():
    with pytest.raises(ConformanceError, match="did not take.*set_slot"):
        assert_conforms(CopyingSlots, tolerance_ulp=1, max_examples=20)
    assert_conforms(CopyingSlotsWithSetter, tolerance_ulp=1, max_examples=20)
    with pytest.raises(ConformanceError, match="slot 'm': .* 1 ulp"):
        assert_conforms(CopyingSlotsWithSetter, max_examples=20)


class RenamedSlots(CopyingSlotsWithSetter):
    slot_map = {"m": "first", "v": "second", "vhat": None}
    nudge = False

    def get_slot(self, var, name):
        return super().get_slot(var, {"first": "m", "second": "v"}[name])

    def set_slot(self, var, name, value):
        super().set_slot(var, {"first": "m", "second": "v"}[name], value)


def test_slot_map_renames_and_skips_slots():
    assert_conforms(RenamedSlots, config={"amsgrad": True}, max_examples=10)
    with pytest.raises(ValueError, match=r"has no slot 'm'.*slot_map=\{'m': None\}"):
        assert_conforms(RenamedSlots, slot_map={}, max_examples=10)


# --------------------------------------------------------------------------- failures of candidates
def test_candidate_exception_is_reported_with_its_cause():
    def crashes_at_step_2(params, grads, state, hyper, t):
        if t == 2:
            raise ZeroDivisionError("boom")
        return tf_keras_adam(params, grads, state, hyper, t)

    with pytest.raises(ConformanceError, match="the candidate raised ZeroDivisionError") as info:
        assert_conforms(crashes_at_step_2, max_examples=20)
    assert info.value.step == 2
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_wrong_dtype_and_malformed_results_are_reported():
    def float64_params(*args):
        params, state = tf_keras_adam(*args)
        return [np.asarray(p, np.float64) for p in params], state

    with pytest.raises(ConformanceError, match="params: dtype float64, expected float32"):
        assert_conforms(float64_params, max_examples=5)
    with pytest.raises(ConformanceError, match=r"must return \(params, state\)"):
        assert_conforms(lambda p, g, s, h, t: None, max_examples=5)


def test_kind_detection_and_override():
    calls = []

    def factory(**config):
        calls.append(config)
        return refopt.Adam(**config)

    assert_conforms(factory, max_examples=3)
    assert calls and set(calls[0]) >= {"learning_rate", "beta_1", "amsgrad"}
    with pytest.raises(ConformanceError, match="factory raised TypeError"):
        assert_conforms(lambda config: refopt.Adam(**config), kind="stateful", max_examples=3)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"optimizer": "Shampoo"}, ValueError, "optimizer='Shampoo'"),
    ({"steps": 0}, ValueError, "steps=0"),
    ({"max_examples": 0}, ValueError, "max_examples=0"),
    ({"tolerance_ulp": -1}, ValueError, "tolerance_ulp=-1"),
    ({"vary": ("momentum",)}, ValueError, "vary="),
    ({"kind": "class"}, ValueError, "kind='class'"),
    ({"config": {"beta_1": 2.0}}, ValueError, "beta_1=2.0"),
    ({"slot_map": ["m"]}, TypeError, "slot_map"),
    ({"convention": "jax"}, ValueError, "convention='jax'"),
    ({"dtype": "int8"}, ValueError, "dtype='int8'"),
])
def test_bad_arguments_raise_before_running(kwargs, error, match):
    with pytest.raises(error, match=match):
        assert_conforms(refopt.Adam, **kwargs)
    with pytest.raises(TypeError, match="candidate"):
        assert_conforms(42)


# --------------------------------------------------------------------------- torch (README example)
def _readme_block(marker):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    [block] = [b for b in blocks if marker in b]
    return block


def test_readme_torch_adam_wrapper_reports_the_known_differences():
    pytest.importorskip("torch")
    namespace = {}
    exec(_readme_block("class TorchAdam"), namespace)
    TorchAdam = namespace["TorchAdam"]
    with pytest.raises(ConformanceError) as info:
        assert_conforms(TorchAdam, max_examples=50)
    report = str(info.value)
    assert "candidate TorchAdam does not conform to refopt Adam" in report
    assert info.value.mismatches
    # (No loose-tolerance pass is asserted here: tf-keras' epsilon and torch's differ by a factor
    # sqrt(1 - beta_2**t) wherever g*g underflows, so Hypothesis finds inputs that no tolerance
    # covers. The live-slot resync is tested by test_stateful_candidate_needs_live_slots_or_set_slot.)


def test_argument_slips_are_refused_clearly():
    import refopt as _refopt

    with pytest.raises(ValueError, match=r"slot_map.*\['zz'\]"):
        assert_conforms(_refopt.Adam, slot_map={"zz": "m"}, max_examples=2)
    with pytest.raises(ValueError, match=r"`seed` must be an integer or None. Received: seed='abc'"):
        assert_conforms(_refopt.Adam, seed="abc", max_examples=2)
    # a single string is one option, not its letters
    assert_conforms(_refopt.Adam, vary="ema", max_examples=3)


@pytest.mark.parametrize("conv", ["tf1", "optax", "keras2"])
def test_strategies_draw_only_what_the_convention_accepts(conv):
    """A user's report: under tf1 the strategies drew Adagrad's epsilon and a zero start
    (TF1 refuses both), and use_ema under conventions without EMA; refopt against itself
    must conform under every convention with every option varied."""
    import functools

    assert_conforms(functools.partial(refopt.Adagrad, convention=conv), optimizer="Adagrad",
                    convention=conv, max_examples=4, vary=("ema", "weight_decay", "clipping"))
