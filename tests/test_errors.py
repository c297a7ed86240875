import re
import warnings

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices

from optimizer_db import OPTIMIZERS, optimizer_id


def _snapshot(opt, variables):
    state = [v.copy() for v in variables] + [np.array(s, copy=True) for s in opt.variables]
    return state, opt.iterations, opt.learning_rate


def _assert_unchanged(before, opt, variables):
    state, iterations, lr = before
    now = [v.copy() for v in variables] + [np.array(s, copy=True) for s in opt.variables]
    assert len(now) == len(state)
    for a, b in zip(state, now):
        np.testing.assert_array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
    assert opt.iterations == iterations
    assert opt.learning_rate == lr


ERROR_CASES = [
    (info, kwargs, exc, pattern)
    for info in OPTIMIZERS
    for kwargs, exc, pattern in info.error_configs
]


@pytest.mark.parametrize(
    "info,kwargs,exc,pattern",
    ERROR_CASES,
    ids=[f"{i.cls.__name__}-{'-'.join(map(str, k))}-{j}" for j, (i, k, _, _) in enumerate(ERROR_CASES)],
)
def test_constructor_rejects_bad_arguments(info, kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        info.cls(**kwargs)


@pytest.mark.parametrize("info", OPTIMIZERS, ids=optimizer_id)
def test_every_good_config_constructs_and_steps(info):
    for config in info.configs:
        w = np.ones((3, 2), np.float32)
        opt = info.cls(**config)
        opt.apply_gradients([(np.full((3, 2), 0.5, np.float32), w)])
        assert opt.iterations == 1
        assert np.all(np.isfinite(w))


def test_clipvalue_with_clipnorm_warns_that_it_is_ignored():
    with pytest.warns(UserWarning, match=r"clipvalue=0\.5 is ignored because clipnorm"):
        opt = refopt.SGD(learning_rate=1.0, clipnorm=1.0, clipvalue=0.5)
    w = np.zeros(2, np.float32)
    opt.apply_gradients([(np.array([3.0, 4.0], np.float32), w)])
    # tf-keras applies clipnorm only: [3, 4] / 5 (semantics notes 3.11, verified).
    np.testing.assert_allclose(w, [-0.6, -0.8], rtol=1e-6)


# --- apply_gradients: bad input changes nothing --------------------------------------------

def _built_adam():
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    b = np.array([1.0, -2.0, 3.0], np.float32)
    opt = refopt.Adam(learning_rate=0.1, amsgrad=True, use_ema=True, weight_decay=0.01)
    opt.apply_gradients([(np.ones((3, 2), np.float32), a), (np.ones(3, np.float32), b)])
    return opt, a, b


def _noncontiguous():
    return np.ones((3, 4), np.float32)[:, ::2]


def _readonly():
    r = np.ones(3, np.float32)
    r.flags.writeable = False
    return r


# Each case: a function (a, b) -> grads_and_vars, the exception, and a message regex.
APPLY_ERRORS = {
    "grad_shape": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(4, np.float32), b)],
        ValueError, r"position 1 has shape=\(4,\), but its variable has shape=\(3,\)"),
    "grad_dtype": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(3, np.float64), b)],
        TypeError, r"position 1 has dtype=float64, but its variable has dtype=float32"),
    "sparse_dense_shape": (
        lambda a, b: [(IndexedSlices(np.ones((1, 2), np.float32), [0], (4, 2)), a)],
        ValueError, r"dense_shape=\(4, 2\), but its variable has shape=\(3, 2\)"),
    "sparse_dtype": (
        lambda a, b: [(IndexedSlices(np.ones((1, 2), np.float64), [0], (3, 2)), a)],
        TypeError, r"IndexedSlices\) has dtype=float64"),
    "grad_list_not_array": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), ([1.0, 2.0, 3.0], b)],
        TypeError, r"position 1 must be a numpy.ndarray, an IndexedSlices or None. Received: list"),
    "unknown_variable": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(3, np.float32), b.copy())],
        KeyError, r"cannot recognize variable"),
    "non_contiguous_variable": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones((3, 2), np.float32), _noncontiguous())],
        ValueError, r"C-contiguous.*position 1"),
    "read_only_variable": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(3, np.float32), _readonly())],
        ValueError, r"writeable.*position 1 is read-only"),
    "integer_variable": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(3, np.int32), np.ones(3, np.int32))],
        TypeError, r"float16, float32 or float64.*dtype=int32"),
    "variable_not_array": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones(3, np.float32), [1.0, 2.0, 3.0])],
        TypeError, r"numpy.ndarray.*position 1 of type list"),
    "same_variable_twice": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (np.ones((3, 2), np.float32), a)],
        ValueError, r"same variable appears twice"),
    "all_gradients_none": (
        lambda a, b: [(None, a), (None, b)],
        ValueError, r"No gradients provided for any variable"),
    "malformed_pair": (
        lambda a, b: [(np.ones((3, 2), np.float32), a), (b,)],
        TypeError, r"\(gradient, variable\) pairs.*position 1"),
}


@pytest.mark.parametrize("case", sorted(APPLY_ERRORS))
def test_apply_gradients_error_leaves_everything_unchanged(case):
    make, exc, pattern = APPLY_ERRORS[case]
    opt, a, b = _built_adam()
    before = _snapshot(opt, [a, b])
    with pytest.raises(exc, match=pattern):
        opt.apply_gradients(make(a, b))
    _assert_unchanged(before, opt, [a, b])
    # And the optimizer still works afterwards.
    opt.apply_gradients([(np.ones((3, 2), np.float32), a), (np.ones(3, np.float32), b)])
    assert opt.iterations == 2


def test_first_call_that_raises_does_not_build():
    a = np.ones(3, np.float32)
    opt = refopt.Adam()
    with pytest.raises(TypeError):
        opt.apply_gradients([(np.ones(3, np.float64), a)])
    assert opt.variables[1:] == [] and opt.iterations == 0
    b = np.ones(2, np.float32)
    opt.apply_gradients([(np.ones(2, np.float32), b)])  # builds with b only
    with pytest.raises(KeyError):
        opt.apply_gradients([(np.ones(3, np.float32), a)])


def test_error_in_schedule_leaves_everything_unchanged():
    class Exploding(refopt.schedules.LearningRateSchedule):
        def __call__(self, step):
            if step >= 1:
                raise RuntimeError("boom")
            return np.float32(0.1)

        def get_config(self):
            return {}

    w = np.ones(3, np.float32)
    opt = refopt.SGD(learning_rate=Exploding(), momentum=0.9)
    opt.apply_gradients([(np.ones(3, np.float32), w)])
    before = _snapshot(opt, [w])
    with pytest.raises(RuntimeError, match="boom"):
        opt.apply_gradients([(np.ones(3, np.float32), w)])
    _assert_unchanged(before, opt, [w])


def test_unknown_variable_is_a_key_error_as_in_tf_keras():
    opt = refopt.SGD()
    w = np.ones(2, np.float32)
    opt.build([w])
    with pytest.raises(KeyError, match="build"):
        opt.apply_gradients([(np.ones(2, np.float32), np.ones(2, np.float32))])


def test_iterations_not_settable_after_build():
    opt = refopt.SGD()
    opt.iterations = 5
    assert opt.iterations == 5
    with pytest.raises(ValueError, match=r"iterations.*\[0, 2\*\*63 - 1\].*Received: iterations=-1"):
        opt.iterations = -1
    with pytest.raises(ValueError, match=r"Received: iterations=1000000000000000000000"):
        opt.iterations = 10**21
    assert opt.iterations == 5
    opt.build([np.ones(2, np.float32)])
    with pytest.raises(RuntimeError, match="Cannot set `iterations`"):
        opt.iterations = 0


def test_minimize_rejects_wrong_number_of_gradients():
    w = np.ones(2, np.float32)
    opt = refopt.SGD()
    with pytest.raises(ValueError, match=r"returned 2 gradients for 1 variables"):
        opt.minimize(lambda: (0.0, [np.ones(2, np.float32)] * 2), [w])
    with pytest.raises(TypeError, match=r"must return a pair"):
        opt.minimize(lambda: 0.0, [w])
    np.testing.assert_array_equal(w, [1.0, 1.0])


def test_exclude_from_weight_decay_only_before_build():
    opt = refopt.AdamW()
    opt.build([np.ones(2, np.float32)])
    with pytest.raises(ValueError, match="before the optimizer is built"):
        opt.exclude_from_weight_decay(var_list=[])


# --- IndexedSlices validation ---------------------------------------------------------------

SLICES_ERRORS = {
    "float_indices": (([[1.0]], np.array([0.0]), (2, 1)), TypeError, r"`indices` must have an integer dtype.*float64"),
    "2d_indices": (([[1.0]], np.array([[0]]), (2, 1)), ValueError, r"`indices` must be 1-D.*shape=\(1, 1\)"),
    "index_too_large": ((np.ones((2, 1)), [0, 2], (2, 1)), ValueError, r"\[0, 2\).*indices\[1\]=2"),
    "negative_index": ((np.ones((2, 1)), [-1, 0], (2, 1)), ValueError, r"indices\[0\]=-1"),
    "values_shape": ((np.ones((2, 3)), [0, 1], (2, 1)), ValueError, r"values.*\(2, 1\).*Received: values with shape=\(2, 3\)"),
    "values_count": ((np.ones((3, 1)), [0, 1], (2, 1)), ValueError, r"values.*shape=\(3, 1\)"),
    "integer_values": ((np.ones((1, 1), np.int64), [0], (2, 1)), TypeError, r"`values` must have dtype float16, float32 or float64.*int64"),
    "empty_dense_shape": ((np.ones(1), [0], ()), TypeError, r"dense_shape"),
    "float_dense_shape": ((np.ones((1, 1)), [0], (2.0, 1)), TypeError, r"dense_shape.*Received: dense_shape=\(2\.0, 1\)"),
    "scalar_dense_shape": ((np.ones((1, 1)), [0], 3), TypeError, r"dense_shape"),
}


@pytest.mark.parametrize("case", sorted(SLICES_ERRORS))
def test_indexed_slices_rejects_bad_input(case):
    args, exc, pattern = SLICES_ERRORS[case]
    with pytest.raises(exc, match=pattern):
        IndexedSlices(*args)


def test_reference_functions_name_the_bad_argument():
    w = np.ones(3, np.float32)
    z = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match=re.escape("`v` must have the shape and dtype")):
        refopt.reference.adam_update(w, z, z, np.zeros(2, np.float32), learning_rate=0.1,
                                     beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1)
    with pytest.raises(TypeError, match="`param` must be a numpy.ndarray"):
        refopt.reference.sgd_update([1.0], z, z, learning_rate=0.1, momentum=0.0)
    with pytest.raises(TypeError, match="`clip_norm` must be a real number"):
        refopt.reference.clip_by_norm(w, "1")


# --- regressions from a user trying to break refopt -----------------------------------------

def test_first_call_that_fails_during_the_step_leaves_the_optimizer_unbuilt():
    # Mixed dtypes under global_clipnorm fail inside the step, after validation (TF refuses
    # them too). The optimizer must not stay bound to the variables of the failed call.
    a, b = np.ones(2, np.float16), np.ones(2, np.float32)
    opt = refopt.Adam(global_clipnorm=1.0)
    with pytest.raises(TypeError, match="same dtype"):
        opt.apply_gradients([(np.ones(2, np.float16), a), (np.ones(2, np.float32), b)])
    assert opt.variables == [np.int64(0)]
    c = np.ones(3, np.float32)
    opt.apply_gradients([(np.ones(3, np.float32), c)])  # builds with c, no KeyError
    assert opt.iterations == 1


def test_iterations_setter_changes_nothing_when_the_schedule_fails():
    opt = refopt.Adam(refopt.schedules.ExponentialDecay(0.1, 10, 1.5))
    with pytest.raises(ValueError, match="returned inf at step 1000000"):
        opt.iterations = 10**6
    assert opt.iterations == 0 and opt.learning_rate == np.float32(0.1)


def test_huge_numbers_are_named_errors_not_overflow_errors():
    with pytest.raises(ValueError, match=r"`epsilon` must be finite. Received: epsilon=1000"):
        refopt.Adam(epsilon=10**400)
    with pytest.raises(ValueError, match=r"`learning_rate` must be finite"):
        refopt.Adam(learning_rate=10**400)


def test_float16_overflowing_clip_threshold_does_not_warn():
    import warnings

    w = np.ones(3, np.float16)
    # 1e5 rounds to inf in float16, and TF's clip_by_norm then computes (g * inf) / inf = NaN
    # (the clipnorm=inf behaviour of TF 2.21): silently, as TF does.
    opt = refopt.Adam(0.1, clipnorm=1e5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.apply_gradients([(np.ones(3, np.float16), w)])
    assert opt.iterations == 1 and np.isnan(w).all()


def test_minimize_and_exclude_refuse_a_single_array_for_a_list():
    w = np.ones((2, 2), np.float32)
    opt = refopt.SGD()
    with pytest.raises(TypeError, match="list of arrays, not a single array"):
        opt.minimize(lambda: (0.0, [np.ones(2, np.float32)] * 2), w)
    with pytest.raises(TypeError, match="list of arrays, not a single array"):
        opt.exclude_from_weight_decay(w)
    np.testing.assert_array_equal(w, np.ones((2, 2)))


def test_indexed_slices_indices_cannot_be_changed_after_validation():
    g = IndexedSlices(np.ones((1, 2), np.float32), np.array([1]), (4, 2))
    with pytest.raises(ValueError, match="read-only"):
        g.indices[0] = -1
    d = g.deduplicate()
    with pytest.raises(ValueError, match="read-only"):
        d.indices[0] = -1
    with pytest.raises(AttributeError):
        g.indices = np.array([-1])
    source = np.array([1])
    g = IndexedSlices(np.ones((1, 2), np.float32), source, (4, 2))
    source[0] = -1  # the caller's array is not aliased
    assert g.indices[0] == 1


def test_indexed_slices_accepts_an_empty_python_list_of_indices():
    g = IndexedSlices(np.zeros((0, 2), np.float32), [], (4, 2))
    assert g.indices.dtype == np.int64 and g.indices.shape == (0,)


REFERENCE_SCALAR_ERRORS = [
    (lambda w, z: refopt.reference.adam_update(w, z, z, z, learning_rate=None, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1),
     TypeError, r"`learning_rate` must be a real number. Received: learning_rate=None"),
    (lambda w, z: refopt.reference.adam_update(w, z, z, z, learning_rate=np.ones(3), beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1),
     TypeError, r"`learning_rate` must be a real number"),
    (lambda w, z: refopt.reference.adam_update(w, z, z, z, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=0),
     ValueError, r"`step` must be an integer >= 1. Received: step=0"),
    (lambda w, z: refopt.reference.adam_update(w, z, z, z, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1.5),
     ValueError, r"`step` must be an integer >= 1. Received: step=1.5"),
    (lambda w, z: refopt.reference.sgd_update(w, z, z, learning_rate=0.1, momentum=0.9, nesterov="no"),
     TypeError, r"`nesterov` must be a bool. Received: nesterov='no'"),
    (lambda w, z: refopt.reference.ema_update(w, z, ema_momentum="0.5"),
     TypeError, r"`ema_momentum` must be a real number. Received: ema_momentum='0.5'"),
    (lambda w, z: refopt.reference.clip_by_global_norm([w], 1.0, use_norm="3"),
     TypeError, r"`use_norm` must be a real number"),
    (lambda w, z: refopt.reference.apply_weight_decay(w, learning_rate=0.1, weight_decay=True),
     TypeError, r"`weight_decay` must be a real number"),
]


@pytest.mark.parametrize("case", range(len(REFERENCE_SCALAR_ERRORS)))
def test_reference_functions_validate_their_scalars(case):
    call, exc, pattern = REFERENCE_SCALAR_ERRORS[case]
    w, z = np.ones(3, np.float32), np.zeros(3, np.float32)
    with pytest.raises(exc, match=pattern):
        call(w, z)


# ------------------------------------------------------------ what a new user tripped on (#15)
def test_a_learning_rate_that_underflows_float32_warns():
    # 1e-50 is 0 in float32: tf-keras stores it so and nothing moves; say it instead of silence.
    with pytest.warns(UserWarning, match=r"learning_rate=1e-50 underflows to 0 in float32"):
        opt = refopt.Adam(learning_rate=1e-50)
    assert opt.learning_rate == 0.0
    with pytest.warns(UserWarning, match="float64 ones keep it"):
        refopt.Adam(learning_rate=1e-50, convention="torch")


def test_a_second_build_with_new_variables_warns_and_does_nothing():
    a, b = np.ones(2, np.float32), np.ones(3, np.float32)
    opt = refopt.Adam()
    opt.build([a])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt.build([a])  # the same list: silent, as tf-keras
    with pytest.warns(UserWarning, match=r"1 not in the first list.*does nothing"):
        opt.build([a, b])
    with pytest.raises(KeyError, match="cannot recognize variable"):
        opt.apply_gradients([(np.ones(3, np.float32), b)])
