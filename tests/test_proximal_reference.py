# TF1's ProximalAdagrad and ProximalGradientDescent (refopt/reference/proximal.py): the
# reference functions and the classes against values computed by hand or printed by TF 2.15.1
# (tf.compat.v1.train.ProximalAdagradOptimizer / ProximalGradientDescentOptimizer, graph mode,
# CPU); the longer trajectories are the golden cases (tests/test_conformance.py -k proximal).
import warnings

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt.conventions import get_convention
from refopt.reference import proximal as P

F32, F64 = np.float32, np.float64


def _bits(a):
    a = np.asarray(a)
    return a.view(np.int32 if a.dtype == F32 else np.int64)


def assert_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected, dtype=np.asarray(actual).dtype)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(_bits(actual), _bits(expected))


def _dup_grad():  # the duplicate example: rows [1, 1] of a 3x2 table
    return IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], F32), np.array([1, 1]), (3, 2))


# ------------------------------------------------------------------------- hand-derived
def test_one_adagrad_step_by_hand_and_as_tf():
    # a = 0.1 + 1 = 1.1; w = 1 - 0.1 * rsqrt(1.1); TF 2.15 prints 0.9046537, a = 1.1
    w = np.ones(1, F32)
    r = P.proximal_adagrad_update(w, w.copy(), P.proximal_adagrad_initial_state(w),
                                  learning_rate=0.1)
    assert_bits(r.accumulator, [np.float32(0.1) + np.float32(1)])
    assert_bits(r.param, [0.9046537])


def test_gradient_descent_soft_threshold_and_signed_zeros_as_tf():
    # lr 0.1, l1 0.5: threshold 0.05. 1 - 0.1 = 0.9 -> 0.85 (float32: 0.84999996); 0.01 is
    # thresholded to +0; -0.05 to -0 (sign -1 times max(0, 0)), 0.05 to +0 (TF prints
    # [0.84999996, 0., -0., 0.])
    w = np.array([1.0, 0.01, -0.05, 0.05], F32)
    g = np.array([1.0, 0.0, 0.0, 0.0], F32)
    r = P.proximal_gradient_descent_update(w, g, learning_rate=0.1,
                                           l1_regularization_strength=0.5)
    assert_bits(r.param, [0.84999996, 0.0, -0.0, 0.0])


def test_l2_divides_by_one_plus_lr_times_l2():
    # no l1: w = (w - lr g) / (1 + lr l2) = (2 - 0.5) / (1 + 0.5 * 1) = 1, exactly
    r = P.proximal_gradient_descent_update(np.array([2.0], F64), np.array([1.0], F64),
                                           learning_rate=0.5, l2_regularization_strength=1.0)
    assert r.param.tolist() == [1.0]
    # Adagrad with a = 3 + 1 = 4: lr_t = 1 / 2; v = 1 - 0.5 = 0.5; w = 0.5 / (1 + 0.5) = 1/3
    r = P.proximal_adagrad_update(np.array([1.0], F64), np.array([1.0], F64),
                                  np.array([3.0], F64), learning_rate=1.0,
                                  l2_regularization_strength=1.0)
    assert r.accumulator.tolist() == [4.0] and r.param.tolist() == [0.5 / 1.5]


def test_l1_of_zero_keeps_a_negative_zero():
    # l1 == 0 takes TF's other branch (v / (1 + l2 lr_t)): -0 stays -0, no thresholding
    r = P.proximal_gradient_descent_update(np.array([-0.0], F32), np.zeros(1, F32),
                                           learning_rate=0.1)
    assert np.signbit(r.param[0])


# ------------------------------------------------------------------------- TF's rounding
def test_one_element_rows_divide_in_double_as_tf():
    # TF's sparse kernel, rows of one element: (1.0 + l2*lr_t) promotes the float32 quotient
    # to double; TF prints -1.7260567 where a float32 division gives -1.7260568
    w = np.array([-1.836106, 0.5], F32)
    g = IndexedSlices(np.array([-1.9338895], F32), np.array([0]), (2,))
    r = P.proximal_adagrad_update(w, g, np.full(2, 0.1, F32), learning_rate=0.1,
                                  l1_regularization_strength=0.05,
                                  l2_regularization_strength=0.1)
    assert_bits(r.param, [-1.7260567, 0.5])


def test_float64_rsqrt_is_one_over_sqrt_as_tf():
    # Eigen's double rsqrt is 1/sqrt (two roundings): at a = 4.085024172081335 that is
    # 0.49476923215387003, one ulp above the correctly rounded root; TF prints w * 2**30 =
    # -0.49476923215387003 (g = 2**-30 leaves a unchanged and scales exactly)
    a = np.array([4.085024172081335])
    r = P.proximal_adagrad_update(np.zeros(1), np.array([2.0 ** -30]), a, learning_rate=1.0)
    assert r.param[0] * 2.0 ** 30 == -0.49476923215387003


# ------------------------------------------------------------------------- sparse semantics
def test_duplicates_are_summed_first_as_tf1s_optimizer():
    # TF 2.15 ProximalAdagradOptimizer(0.1): the accumulator row is 0.1 + 4**2 and
    # 0.1 + 6**2 (the square of the sum), the row moves once; the other rows do not move
    w = np.ones((3, 2), F32)
    r = P.proximal_adagrad_update(w, _dup_grad(), np.full((3, 2), 0.1, F32), learning_rate=0.1)
    assert_bits(r.accumulator, [[0.1, 0.1], [16.1, 36.1], [0.1, 0.1]])
    assert_bits(r.param, [[1, 1], [0.90031105, 0.9001386], [1, 1]])
    r = P.proximal_adagrad_update(w, _dup_grad(), np.full((3, 2), 0.1, F32), learning_rate=0.1,
                                  l1_regularization_strength=0.05,
                                  l2_regularization_strength=0.1)
    assert_bits(r.param, [[1, 1], [0.8968299, 0.89781207], [1, 1]])
    # ProximalGradientDescentOptimizer(0.1): 1 - 0.1 * 4 and 1 - 0.1 * 6
    r = P.proximal_gradient_descent_update(w, _dup_grad(), learning_rate=0.1)
    assert_bits(r.param, [[1, 1], [0.6, 0.39999998], [1, 1]])


def test_empty_gradient_changes_nothing():
    w = np.arange(6, dtype=F32).reshape(3, 2)
    acc = np.full((3, 2), 0.1, F32)
    empty = IndexedSlices(np.zeros((0, 2), F32), np.zeros(0, np.int64), (3, 2))
    r = P.proximal_adagrad_update(w, empty, acc, learning_rate=0.1,
                                  l1_regularization_strength=10.0)
    assert_bits(r.param, w)
    assert_bits(r.accumulator, acc)
    assert r.param is not w  # new arrays
    assert_bits(P.proximal_gradient_descent_update(w, empty, learning_rate=0.1,
                                                   l1_regularization_strength=10.0).param, w)


def test_absent_rows_are_not_decayed_even_with_l1_l2():
    # l1 and l2 act on the rows of the gradient only (the proximal step is in the row update)
    w = np.full((4, 2), 0.5, F32)
    g = IndexedSlices(np.zeros((1, 2), F32), np.array([2]), (4, 2))
    r = P.proximal_gradient_descent_update(w, g, learning_rate=1.0,
                                           l1_regularization_strength=1.0)
    assert r.param[2].tolist() == [0.0, 0.0]  # 0.5 thresholded by 1
    assert r.param[[0, 1, 3]].tolist() == [[0.5, 0.5]] * 3


def test_nan_gradient_gives_nan_as_tf():
    # TF prints [nan, 0.] for ProximalAdagrad(0.1, l1=0.5) from w=[0.5, 0], g=[nan, 0]
    r = P.proximal_adagrad_update(np.array([0.5, 0.0], F32), np.array([np.nan, 0.0], F32),
                                  np.full(2, 0.1, F32), learning_rate=0.1,
                                  l1_regularization_strength=0.5)
    assert np.isnan(r.param[0]) and r.param[1] == 0 and not np.signbit(r.param[1])


def test_float64_hyperparameters_go_through_float32_as_tf_cast():
    # lr 0.1 as a Python float: float64(float32(0.1)); a NumPy float64 keeps its value
    w, g = np.zeros(1), np.ones(1)
    r = P.proximal_gradient_descent_update(w, g, learning_rate=0.1)
    assert r.param[0] == -float(np.float32(0.1))
    r = P.proximal_gradient_descent_update(w, g, learning_rate=np.float64(0.1))
    assert r.param[0] == -0.1


# ------------------------------------------------------------------------- errors
def test_other_conventions_refuse_naming_both():
    w = np.ones(2, F32)
    with pytest.raises(ValueError, match=r"ProximalAdagrad does not exist under "
                                         r"convention='torch'.*proximal_adagrad_form"):
        P.proximal_adagrad_update(w, w, w, learning_rate=0.1, convention="torch")
    with pytest.raises(ValueError, match=r"ProximalGradientDescent does not exist under "
                                         r"convention='keras3'.*the presets that have it: tf1"):
        refopt.ProximalGradientDescent(learning_rate=0.1, convention="keras3")
    # a single knob turns it on elsewhere
    conv = get_convention("tf_keras", proximal_sgd_form="tf1")
    r = P.proximal_gradient_descent_update(w, w, learning_rate=0.5, convention=conv)
    assert r.param.tolist() == [0.5, 0.5]


@pytest.mark.parametrize("kw, exc, rx", [
    ({"learning_rate": -1.0}, ValueError, r"learning_rate.*>= 0.*Received: learning_rate=-1\.0"),
    ({"learning_rate": 0.1, "l1_regularization_strength": -0.1}, ValueError,
     r"l1_regularization_strength.*>= 0.*Received: l1_regularization_strength=-0\.1"),
    ({"learning_rate": 0.1, "l2_regularization_strength": float("nan")}, ValueError,
     r"l2_regularization_strength.*finite"),
    ({"learning_rate": "0.1"}, TypeError, r"learning_rate.*real number"),
])
def test_bad_hyperparameters_raise_naming_the_argument(kw, exc, rx):
    w = np.ones(2, F32)
    with pytest.raises(exc, match=rx):
        P.proximal_adagrad_update(w, w, w, **kw)
    with pytest.raises(exc, match=rx):
        P.proximal_gradient_descent_update(w, w, **kw)


def test_bad_arrays_raise_and_change_nothing():
    w, acc = np.ones(3, F32), np.full(3, 0.1, F32)
    with pytest.raises(ValueError, match=r"accumulator.*Received: accumulator with shape=\(2,\)"):
        P.proximal_adagrad_update(w, w, acc[:2], learning_rate=0.1)
    with pytest.raises(ValueError, match=r"grad.*dtype"):
        P.proximal_gradient_descent_update(w, w.astype(F64), learning_rate=0.1)
    with pytest.raises(ValueError, match="rank >= 1"):
        P.proximal_gradient_descent_update(np.ones((), F32), IndexedSlices(
            np.ones(1, F32), [0], (1,)), learning_rate=0.1)
    with pytest.raises(ValueError, match=r"initial_accumulator_value.*> 0"):
        P.proximal_adagrad_initial_state(w, initial_accumulator_value=0.0)
    assert w.tolist() == [1, 1, 1] and acc.tolist() == [np.float32(0.1)] * 3


# ------------------------------------------------------------------------- the classes
@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_class_default_convention_is_tf1_and_matches_tf(backend):
    opt = refopt.ProximalAdagrad(learning_rate=0.1, backend=backend)
    assert opt.convention.name == "tf1"
    w = np.ones((3, 2), F32)
    opt.apply_gradients([(_dup_grad(), w)])
    assert_bits(w, [[1, 1], [0.90031105, 0.9001386], [1, 1]])
    assert_bits(opt.get_slot(w, "accumulator"), [[0.1, 0.1], [16.1, 36.1], [0.1, 0.1]])
    opt = refopt.ProximalGradientDescent(learning_rate=0.1, backend=backend)
    w = np.ones((3, 2), F32)
    opt.apply_gradients([(_dup_grad(), w)])
    assert_bits(w, [[1, 1], [0.6, 0.39999998], [1, 1]])
    assert tuple(opt.slot_names) == ()  # no slot: TF1's optimizer creates none


def test_class_config_round_trip_and_required_learning_rate():
    opt = refopt.ProximalAdagrad(learning_rate=0.1, initial_accumulator_value=0.5,
                                 l1_regularization_strength=0.01, backend="reference")
    cfg = opt.get_config()
    assert cfg["initial_accumulator_value"] == 0.5 and cfg["l1_regularization_strength"] == 0.01
    assert cfg["l2_regularization_strength"] == 0.0
    again = refopt.ProximalAdagrad.from_config(cfg)
    assert again.get_config() == cfg
    with pytest.raises(TypeError, match=r"ProximalGradientDescent under convention='tf1' needs "
                                        r"a `learning_rate`.*Received: learning_rate=None"):
        refopt.ProximalGradientDescent()


@pytest.mark.parametrize("cls", [refopt.ProximalAdagrad, refopt.ProximalGradientDescent])
def test_keras3_sparse_square_convention_is_refused(cls):
    conv = get_convention("tf1").replace(keras3_sparse_square=True)
    with pytest.raises(ValueError, match=cls.__name__ + " cannot take a convention with "
                                                        "keras3_sparse_square=True"):
        cls(learning_rate=0.1, convention=conv, backend="reference")


@pytest.mark.parametrize("cls", [refopt.ProximalAdagrad, refopt.ProximalGradientDescent])
@pytest.mark.parametrize("name", ["l1_regularization_strength", "l2_regularization_strength"])
def test_strengths_that_overflow_float32_are_refused(cls, name):
    rx = name + r"` must be finite in float32.*Received: " + name + r"=1e\+39"
    with pytest.raises(ValueError, match=rx):
        cls(learning_rate=0.1, backend="reference", **{name: 1e39})
    w = np.ones(2, F32)
    with pytest.raises(ValueError, match=rx):
        P.proximal_gradient_descent_update(w, w, learning_rate=0.1, **{name: 1e39})
    with pytest.raises(ValueError, match=rx):
        P.proximal_adagrad_update(w, w, w, learning_rate=0.1, **{name: 1e39})
    with pytest.raises(ValueError, match=r"learning_rate.*finite in float32"):
        P.proximal_adagrad_update(w, w, w, learning_rate=1e39)
    assert w.tolist() == [1, 1]


def test_initial_accumulator_that_rounds_to_zero_warns():
    opt = refopt.ProximalAdagrad(learning_rate=0.1, initial_accumulator_value=1e-50,
                                 backend="reference")
    w32, w64 = np.ones(2, F32), np.ones(2, F64)
    with pytest.warns(RuntimeWarning, match=r"initial_accumulator_value=1e-50 rounds to 0 in "
                                            r"float32"):
        opt.build([w32])
    assert opt.get_slot(w32, "accumulator").tolist() == [0, 0]   # TF1's constant: 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float64 holds 1e-50: no warning
        acc = P.proximal_adagrad_initial_state(w64, initial_accumulator_value=1e-50)
    assert acc.tolist() == [1e-50, 1e-50]
    with pytest.warns(RuntimeWarning, match="rounds to 0 in float16"):
        P.proximal_adagrad_initial_state(np.ones(2, np.float16), initial_accumulator_value=1e-9)
