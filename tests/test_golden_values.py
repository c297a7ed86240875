# Values recorded from tf.keras 2.21 / TF 2.21 float32 (issue #2 and the semantics notes,
# ../shared/semantics/keras_tf.md, marked [verified] there), or derived by hand; never computed
# by refopt itself.
import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt import reference as ref

F32 = np.float32
GRADS_3 = ([0.1, -0.2, 0.3], [0.01, 0.5, -1.0], [1e-4, 0.0, 2.0])


def _f32(xs):
    return np.array(xs, dtype=F32)


def _dup_slices():
    # notes 2.1: values [[1, 2], [3, 4]] at indices [1, 1] of a 3x2 table (dense row 1 = [4, 6])
    return IndexedSlices(_f32([[1, 2], [3, 4]]), [1, 1], (3, 2))


@pytest.mark.parametrize(
    "amsgrad,expected",
    [
        (False, [0.9768599271774292, 2.002159357070923, 2.9914004802703857]),
        (True, [0.9768627882003784, 2.0021610260009766, 2.9914004802703857]),
    ],
)
def test_adam_three_steps_match_tf_keras_bit_for_bit(amsgrad, expected):
    w = _f32([1, 2, 3])
    opt = refopt.Adam(learning_rate=0.01, amsgrad=amsgrad)
    for g in GRADS_3:
        opt.apply_gradients([(_f32(g), w)])
    np.testing.assert_array_equal(w, _f32(expected))
    assert opt.iterations == 3


@pytest.mark.parametrize("amsgrad", [False, True])
def test_reference_adam_three_steps_match_tf_keras_bit_for_bit(amsgrad):
    expected = {
        False: [0.9768599271774292, 2.002159357070923, 2.9914004802703857],
        True: [0.9768627882003784, 2.0021610260009766, 2.9914004802703857],
    }[amsgrad]
    w, m, v = _f32([1, 2, 3]), np.zeros(3, F32), np.zeros(3, F32)
    vhat = np.zeros(3, F32) if amsgrad else None
    lr = float(F32(0.01))  # tf-keras stores the learning rate in a float32 variable
    for t, g in enumerate(GRADS_3, start=1):
        w, m, v, vhat = ref.adam_update(w, _f32(g), m, v, vhat, learning_rate=lr, beta_1=0.9,
                                        beta_2=0.999, epsilon=1e-7, step=t)
    np.testing.assert_array_equal(w, _f32(expected))


def test_adam_epsilon_is_epsilon_hat_issue_35102():
    # tensorflow/tensorflow#35102: lr 1, eps 1e-7, one step with g = 1e-6 moves by 0.24025147
    # in Keras (the paper's bias-corrected epsilon would give 0.90909).
    w = np.zeros(1, F32)
    refopt.Adam(learning_rate=1.0).apply_gradients([(_f32([1e-6]), w)])
    np.testing.assert_array_equal(w, _f32([-0.24025147]))


def test_adam_first_step_is_not_exactly_lr_in_tf_keras():
    # notes 1.5 (1): alpha uses 1 - f32(beta_2)**1 while v uses f32(1 - beta_2).
    w = np.zeros(1, F32)
    refopt.Adam(learning_rate=1.0, epsilon=1e-12).apply_gradients([(_f32([1.0]), w)])
    np.testing.assert_array_equal(w, _f32([-0.99999326]))


def test_sgd_ema_overwrites_every_third_step_with_copy_initialised_average():
    # Issue #2: SGD lr 1, ema_momentum 0.9, overwrite frequency 3, g = 1. tf-keras starts the
    # average as a copy of the variable. By hand: w 3 -> 2 -> 1 -> 0; avg 3 -> 2.9 -> 2.71 ->
    # 0.9 * 2.71 + 0.1 * 0 = 2.439, and the third step writes 2.439 into w (offsets +1, +2, +3).
    w = _f32([[3, 4], [5, 6]])
    opt = refopt.SGD(learning_rate=1.0, use_ema=True, ema_momentum=0.9, ema_overwrite_frequency=3)
    ones = np.ones((2, 2), F32)
    opt.apply_gradients([(ones, w)])
    np.testing.assert_allclose(w, [[2, 3], [4, 5]])
    np.testing.assert_allclose(opt.get_slot(w, "average"), [[2.9, 3.9], [4.9, 5.9]], rtol=1e-6)
    opt.apply_gradients([(ones, w)])
    np.testing.assert_allclose(w, [[1, 2], [3, 4]])
    np.testing.assert_allclose(opt.get_slot(w, "average"), [[2.71, 3.71], [4.71, 5.71]], rtol=1e-6)
    opt.apply_gradients([(ones, w)])
    np.testing.assert_allclose(w, [[2.439, 3.439], [4.439, 5.439]], rtol=1e-6)
    np.testing.assert_array_equal(w, opt.get_slot(w, "average"))
    opt.apply_gradients([(ones, w)])  # step 4: no overwrite, plain SGD from the overwritten w
    np.testing.assert_allclose(w, [[1.439, 2.439], [3.439, 4.439]], rtol=1e-6)


def test_ema_keras_issue_18949_with_tf_keras_semantics():
    # keras-team/keras#18949 scenario: w0 = 10, SGD lr 0.01, EMA 0.99, g = 1 ten times.
    # tf-keras 2.11+ (copy-initialised average) gives 9.994662 after finalize [verified].
    w = _f32([10.0])
    opt = refopt.SGD(use_ema=True)
    for _ in range(10):
        opt.apply_gradients([(_f32([1.0]), w)])
    np.testing.assert_allclose(w, [9.899998], rtol=1e-7)
    opt.finalize_variable_values([w])
    np.testing.assert_allclose(w, [9.994662], rtol=1e-7)


def test_decoupled_weight_decay_values():
    # notes 3.4: AdamW(lr 0.1, wd 0.1), w = 2: g = 0 -> 1.98; g = 1 -> 1.8800011.
    w = _f32([2.0])
    refopt.AdamW(learning_rate=0.1, weight_decay=0.1).apply_gradients([(_f32([0.0]), w)])
    np.testing.assert_allclose(w, [1.98], rtol=1e-7)
    w = _f32([2.0])
    refopt.AdamW(learning_rate=0.1, weight_decay=0.1).apply_gradients([(_f32([1.0]), w)])
    np.testing.assert_allclose(w, [1.8800011], rtol=1e-7)
    # By hand: three steps of decay 0.004 at lr 1 with g = 0 -> 2 * 0.996**3.
    w = _f32([2.0])
    opt = refopt.SGD(learning_rate=1.0, weight_decay=0.004)
    for _ in range(3):
        opt.apply_gradients([(_f32([0.0]), w)])
    np.testing.assert_allclose(w, [2 * 0.996**3], rtol=1e-6)


def test_sparse_weight_decay_decays_every_row_for_adam_and_sgd():
    # notes 3.4: SGD lr 0.1, wd 0.5 on the duplicate example: untouched rows 1 -> 0.95.
    t = np.ones((3, 2), F32)
    refopt.SGD(learning_rate=0.1, weight_decay=0.5).apply_gradients([(_dup_slices(), t)])
    np.testing.assert_allclose(t[[0, 2]], 0.95, rtol=1e-7)
    np.testing.assert_allclose(t[1], [0.95 - 0.4, 0.95 - 0.6], rtol=1e-6)


def test_duplicate_indices_are_summed_for_adam():
    # notes 2.1: Adam lr 0.1, two identical steps of the duplicate example. Dense-equivalent
    # row 1 = [0.8000018, 0.8000017] (tf-keras/Keras 3 dense), v row 1 = [0.031984, 0.071964].
    t = np.ones((3, 2), F32)
    opt = refopt.Adam(learning_rate=0.1)
    for _ in range(2):
        opt.apply_gradients([(_dup_slices(), t)])
    np.testing.assert_allclose(t[1], [0.8000018, 0.8000017], rtol=2e-7)
    np.testing.assert_allclose(opt.get_slot(t, "v")[1], [0.031984, 0.071964], rtol=1e-6)
    # The failure mode without summing (last-write-wins scatter) gives [0.6128948, 0.6067831].
    assert not np.allclose(t[1], [0.6128948, 0.6067831], rtol=1e-3)


def test_clipnorm_runs_before_duplicate_summing_as_tf_keras():
    # notes 2.1 [verified tf-keras]: with clipnorm 1, row 1 = [0.8000024, 0.8000022] (norm of
    # the raw duplicated values), vs [0.8000026, 0.8000023] when the dense gradient is clipped.
    t = np.ones((3, 2), F32)
    opt = refopt.Adam(learning_rate=0.1, clipnorm=1.0)
    for _ in range(2):
        opt.apply_gradients([(_dup_slices(), t)])
    np.testing.assert_allclose(t[1], [0.8000024, 0.8000022], rtol=1e-7)
    d = np.ones((3, 2), F32)
    opt = refopt.Adam(learning_rate=0.1, clipnorm=1.0)
    for _ in range(2):
        opt.apply_gradients([(_dup_slices().to_dense(), d)])
    np.testing.assert_allclose(d[1], [0.8000026, 0.8000023], rtol=1e-7)


def test_clipvalue_clips_raw_duplicate_rows_before_summing():
    # notes 3.3: clipvalue 2.5 on the duplicate example -> row 1 gradient [1,2]+[2.5,2.5].
    t = np.ones((3, 2), F32)
    refopt.SGD(learning_rate=1.0, clipvalue=2.5).apply_gradients([(_dup_slices(), t)])
    np.testing.assert_array_equal(t, _f32([[1, 1], [-2.5, -3.5], [1, 1]]))


def test_clipnorm_is_per_tensor_and_global_clipnorm_is_global():
    # notes 6.14: g1 = [3, 0], g2 = [0, 4], c = 1.
    for kwargs, e1, e2 in (
        ({"clipnorm": 1.0}, [-1, 0], [0, -1]),
        ({"global_clipnorm": 1.0}, [-0.6, 0], [0, -0.8]),
    ):
        a, b = np.zeros(2, F32), np.zeros(2, F32)
        refopt.SGD(learning_rate=1.0, **kwargs).apply_gradients(
            [(_f32([3, 0]), a), (_f32([0, 4]), b)]
        )
        np.testing.assert_allclose(a, e1, rtol=1e-7)
        np.testing.assert_allclose(b, e2, rtol=1e-7)


@pytest.mark.parametrize("kwargs", [{"clipnorm": 0.0}, {"clipvalue": -1.0}, {"global_clipnorm": 0.0}])
def test_zero_or_negative_clip_means_no_clipping(kwargs):
    # notes 3.3 [verified]: SGD lr 1, w [1, 1], g [3, 4] -> [-2, -3].
    w = _f32([1, 1])
    refopt.SGD(learning_rate=1.0, **kwargs).apply_gradients([(_f32([3, 4]), w)])
    np.testing.assert_array_equal(w, _f32([-2, -3]))


def test_clip_functions_edge_cases_as_tf():
    np.testing.assert_array_equal(ref.clip_by_norm(_f32([100, 100]), 1.0), _f32([0.70710677] * 2))
    np.testing.assert_allclose(ref.clip_by_norm(_f32([3, 4]), 1.0), [0.6, 0.8], rtol=1e-7)
    # TF 2.21: clip_norm = inf gives NaN everywhere (inf / inf); inf element -> NaN there, 0 elsewhere.
    assert np.isnan(ref.clip_by_norm(_f32([3, 4]), np.inf)).all()
    np.testing.assert_array_equal(ref.clip_by_norm(_f32([np.inf, 1]), 1.0), _f32([np.nan, 0]))
    assert np.isnan(ref.clip_by_norm(_f32([np.nan, 1]), 1.0)).all()
    # c = 0 with g = 0 is 0/0 = NaN; a zero gradient with c > 0 stays zero.
    assert np.isnan(ref.clip_by_norm(_f32([0, 0]), 0.0)).all()
    np.testing.assert_array_equal(ref.clip_by_norm(_f32([0, 0]), 1.0), _f32([0, 0]))
    np.testing.assert_array_equal(ref.clip_by_value(_f32([np.inf, 1]), 1.0), _f32([1, 1]))
    np.testing.assert_array_equal(ref.clip_by_value(_f32([np.nan, -3]), 1.0), _f32([np.nan, -1]))


def test_global_norm_counts_raw_duplicate_rows():
    # notes 4 [verified]: values [[1,2],[3,4]] at [1,1] -> sqrt(30) = 5.477226, not |[4,6]|.
    np.testing.assert_allclose(ref.global_norm([_dup_slices(), None]), np.sqrt(30.0), rtol=1e-7)


def test_global_clipnorm_with_infinite_norm_makes_every_gradient_nan():
    # tensorflow/tensorflow#21363 / PR #27733 [verified]: [[inf, 1], [1, 1]], c = 1.
    clipped, norm = ref.clip_by_global_norm([_f32([[np.inf, 1], [1, 1]]), _f32([1, 1]), None], 1.0)
    assert norm == np.inf
    assert np.isnan(clipped[0]).all() and np.isnan(clipped[1]).all() and clipped[2] is None
    # a zero global norm leaves the gradients unchanged (scale 1)
    clipped, norm = ref.clip_by_global_norm([np.zeros(2, F32)], 1.0)
    assert norm == 0 and np.array_equal(clipped[0], np.zeros(2, F32))


def test_schedule_is_evaluated_at_the_pre_increment_step():
    # notes 5: boundary [1] -> calls 0 and 1 use values[0], call 2 uses values[1].
    w = np.zeros(1, F32)
    opt = refopt.SGD(learning_rate=refopt.schedules.PiecewiseConstantDecay([1], [1.0, 0.5]))
    seen = []
    for _ in range(3):
        opt.apply_gradients([(_f32([1.0]), w)])
        seen.append((float(w[0]), opt.learning_rate))
    assert seen == [(-1.0, 1.0), (-2.0, 1.0), (-2.5, 0.5)]


def test_lazy_adam_moves_only_present_rows_and_uses_the_global_step():
    # notes 2.3 scenario (lr 0.1, 3x2 ones; step 1 row 0 = [1, 1], step 2 row 2 = [1, 1]).
    # By hand in float64: step 1 row 0: m = 0.1, v = 0.001, alpha = 0.1*sqrt(0.001)/0.1,
    # w = 1 - 0.1*alpha/(sqrt(0.001)+1e-7) ~= 0.9000003; step 2 row 2 first seen at t = 2:
    # m = 0.1, v = 0.001, alpha = 0.1*sqrt(1-0.999**2)/(1-0.9**2), w ~= 0.9255868.
    # tf-keras rounding (f32(1-beta) vs 1-f32(beta)) moves both by ~1e-6 relative.
    t = np.ones((3, 2), F32)
    opt = refopt.LazyAdam(learning_rate=0.1)
    opt.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [0], (3, 2)), t)])
    row0 = t[0].copy()
    opt.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [2], (3, 2)), t)])
    a1 = 0.1 * np.sqrt(1 - 0.999) / (1 - 0.9)
    a2 = 0.1 * np.sqrt(1 - 0.999**2) / (1 - 0.9**2)
    np.testing.assert_allclose(row0, 1 - 0.1 * a1 / (np.sqrt(0.001) + 1e-7), rtol=2e-6)
    np.testing.assert_array_equal(t[0], row0)  # absent at step 2: unchanged bit for bit
    np.testing.assert_array_equal(t[1], _f32([1, 1]))
    np.testing.assert_allclose(t[2], 1 - 0.1 * a2 / (np.sqrt(0.001) + 1e-7), rtol=2e-6)
    # non-lazy Adam moves row 0 again at step 2 (0.8329949 in the notes, legacy rounding)
    d = np.ones((3, 2), F32)
    adam = refopt.Adam(learning_rate=0.1)
    adam.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [0], (3, 2)), d)])
    adam.apply_gradients([(IndexedSlices(np.ones((1, 2), F32), [2], (3, 2)), d)])
    np.testing.assert_allclose(d[0], [0.8329949] * 2, rtol=2e-6)


def test_sgd_momentum_and_nesterov_by_hand():
    # lr 0.1, momentum 0.9, g = 1 twice: m1 = -0.1, w1 = -0.1; m2 = -0.1 - 0.09 = -0.19,
    # w2 = -0.29. Nesterov: w1 = -0.1 + 0.9*(-0.1) = -0.19; w2 = -0.19 + (-0.1 + 0.9*(-0.19)).
    w = np.zeros(1, F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9)
    opt.apply_gradients([(_f32([1]), w)])
    opt.apply_gradients([(_f32([1]), w)])
    np.testing.assert_allclose(w, [-0.29], rtol=1e-6)
    np.testing.assert_allclose(opt.get_slot(w, "m"), [-0.19], rtol=1e-6)
    w = np.zeros(1, F32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, nesterov=True)
    opt.apply_gradients([(_f32([1]), w)])
    np.testing.assert_allclose(w, [-0.19], rtol=1e-6)
    opt.apply_gradients([(_f32([1]), w)])
    np.testing.assert_allclose(w, [-0.19 - 0.1 - 0.9 * 0.19], rtol=1e-6)


def test_sgd_duplicates_are_summed():
    # notes 2.4 [verified]: SGD lr 1 on the duplicate example -> row 1 = [-3, -5].
    t = np.ones((3, 2), F32)
    refopt.SGD(learning_rate=1.0).apply_gradients([(_dup_slices(), t)])
    np.testing.assert_array_equal(t, _f32([[1, 1], [-3, -5], [1, 1]]))


def test_float64_variables_use_the_float32_rounded_learning_rate():
    # tf-keras keeps a float learning rate in a float32 variable and casts it to the variable
    # dtype: SGD lr 0.1 on a float64 variable moves by float64(float32(0.1)), not 0.1.
    w = np.zeros(1, np.float64)
    refopt.SGD(learning_rate=0.1).apply_gradients([(np.ones(1), w)])
    assert w[0] == -float(np.float32(0.1)) and w[0] != -0.1


def test_float16_adam_computes_in_float16():
    w = np.ones(4, np.float16)
    opt = refopt.Adam(learning_rate=0.01)
    opt.apply_gradients([(np.full(4, 0.5, np.float16), w)])
    assert w.dtype == np.float16 and opt.get_slot(w, "m").dtype == np.float16
    # first step is ~lr * sign(g): 1 - 0.01 = 0.99 within float16 resolution (eps 2**-10)
    np.testing.assert_allclose(w.astype(np.float64), 0.99, atol=2 * 2.0**-10)


# Regressions found by replaying random cases through TF 2.21 / tf-keras 2.21 (CPU, eager):
# values printed by TensorFlow.

def test_adam_bias_correction_pow_is_the_c_library_powf():
    # np.power(f32(0.9), f32(4)) = 0.6561 on AVX-512 NumPy builds; tf.pow (powf) = 0.6560999.
    w = _f32([1.0])
    opt = refopt.Adam(learning_rate=1.0)
    for _ in range(4):
        opt.apply_gradients([(_f32([1.0]), w)])
    assert float(w[0]) == -2.9999611377716064


@pytest.mark.parametrize(
    "make,steps,grad,expected",
    [
        (lambda: refopt.Adam(learning_rate=0.001), 1, 1.0, 0.9990000097904889),
        (lambda: refopt.SGD(learning_rate=0.1, momentum=0.9), 2, 1.0, 0.7099999980628491),
        (lambda: refopt.SGD(learning_rate=0.5, weight_decay=0.1), 1, 0.0, 0.9499999992549419),
    ],
    ids=["adam-beta", "sgd-momentum", "weight-decay"],
)
def test_float64_hyperparameters_go_through_float32_as_tf_cast(make, steps, grad, expected):
    # tf.cast(0.9, tf.float64) == 0.8999999761581421: tf-keras casts beta, momentum and
    # weight_decay from Python floats, which TF first makes float32 tensors.
    w = np.array([1.0])
    opt = make()
    for _ in range(steps):
        opt.apply_gradients([(np.array([grad]), w)])
    assert float(w[0]) == expected


def test_schedule_pow_is_the_c_library_powf():
    s = refopt.schedules.ExponentialDecay(0.018287960217785164, 28.280102444736478, 0.5942197403236961)
    assert s(10) == np.float32(0.01521359)


def test_numpy_float64_hyperparameters_keep_their_precision_on_float64_variables():
    # tf.cast(np.float64(0.8), tf.float64) is exact, unlike a Python 0.8 (via float32):
    # tf-keras 2.21 gives 0.9000012746895992 for beta_1=np.float64(0.8), and
    # 0.9000012687292104 for beta_1=0.8.
    w = np.array([1.0, 2.0])
    refopt.Adam(0.1, beta_1=np.float64(0.8)).apply_gradients([(np.array([0.5, -0.5]), w)])
    assert float(w[0]) == 0.9000012746895992
    w = np.array([1.0, 2.0])
    refopt.Adam(0.1, beta_1=0.8).apply_gradients([(np.array([0.5, -0.5]), w)])
    assert float(w[0]) == 0.9000012687292104
