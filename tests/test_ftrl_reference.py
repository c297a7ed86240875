# Ftrl's reference (refopt/reference/ftrl.py) against hand-derived values and the facts the
# golden cases recorded from TensorFlow 2.21 / tf_keras / Keras 3 and TF 2.15 (Keras 2, TF1).
import math

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices, _libm
from refopt.conventions import get_convention
from refopt.reference import ftrl as F

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FORMS = ("tf_keras", "keras3", "keras2", "tf1")
REG = dict(learning_rate_power=-0.3, l1_regularization_strength=0.01,
           l2_regularization_strength=0.02, l2_shrinkage_regularization_strength=0.1, beta=0.1)


def naive_keras_step(w, g, n, z, lr, power, l1, l2, shrink, beta):
    """Keras' update_step in float64 Python scalars (no framework rounding)."""
    l2r = l2 + beta / (2 * lr)
    n_new = n + g * g
    z = z + (g + 2 * shrink * w) - (n_new ** power - n ** power) / lr * w
    q = n_new ** power / lr + 2 * l2r
    return (min(max(z, -l1), l1) - z) / q, n_new, z


# A float32 accumulator where glibc's powf(x, 0.5) is not sqrtf(x) (found by an exhaustive
# scan; tf.pow on a scalar gives powf's value).
POW_NOT_SQRT = np.float32(3.5876377e29)


# --------------------------------------------------------------------------- one step
def test_docstring_example_step_by_hand():
    w = np.array([1.0], F32)
    acc, lin = F.ftrl_initial_state(w)
    r = F.ftrl_update(w, np.array([0.5], F32), acc, lin, learning_rate=0.1)
    n = np.float32(0.1) + np.float32(0.25)
    z = np.float32(0.5) - ((np.sqrt(n) - np.sqrt(np.float32(0.1))) / np.float32(0.1)) * 1
    assert r.accumulator[0] == n and r.linear[0] == z
    assert r.param[0] == (np.float32(0) - z) / (np.sqrt(n) / np.float32(0.1))
    assert r.param.tolist() == [np.float32(0.3809621).item()]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_is_the_paper_formula_within_float_rounding(form):
    rng = np.random.default_rng(0)
    w, g, z = (rng.standard_normal(6) for _ in range(3))
    n = rng.random(6) + 0.1
    r = F.ftrl_update(w, g, n, z, learning_rate=0.25, convention=form, **REG)
    for i in range(6):
        want = naive_keras_step(w[i], g[i], n[i], z[i], 0.25, 0.3, 0.01, 0.02, 0.1, 0.1)
        for got, x in zip((r.param[i], r.accumulator[i], r.linear[i]), want):
            # Keras 2/TF1 round their scalars through float32
            assert math.isclose(got, x, rel_tol=1e-6, abs_tol=1e-9), (form, i)


def test_keras_calls_pow_where_the_kernels_take_sqrt():
    # the default power -0.5: Keras' ops call pow, TF's kernels their sqrt special case
    w, g = np.ones(1, F32), np.zeros(1, F32)
    n, z = np.array([POW_NOT_SQRT]), np.ones(1, F32)
    n = n.astype(F32)
    k3 = F.ftrl_update(w, g, n, z, learning_rate=1.0, convention="keras3")
    k2 = F.ftrl_update(w, g, n, z, learning_rate=1.0, convention="keras2")
    assert k2.param[0] == np.float32(-1) / np.sqrt(POW_NOT_SQRT)
    assert k3.param[0] == np.float32(-1) / _libm.powf(POW_NOT_SQRT, 0.5)
    assert k3.param[0] != k2.param[0]


def test_c_pow_is_the_c_librarys_even_at_one_half():
    x = np.array([POW_NOT_SQRT, 2.0, 0.0, np.inf], F32)
    got = F.c_pow(x, 0.5)
    assert got.dtype == F32 and got[0] != np.sqrt(x[0])
    assert got.tolist() == [_libm.powf(v, 0.5).item() for v in x]
    assert F.c_pow(np.array([2.0], F64), 0.3)[0] == _libm.power(F64, 2.0, 0.3)
    assert F.c_pow(np.array([[4.0]], F16), 0.5).dtype == F16


def test_kernels_weight_is_a_select_keras_a_clip():
    # |z| <= l1: the kernel writes +0, Keras (z - z) / q; a NaN z: 0 against NaN
    w, g = np.ones(2, F32), np.array([0.0, np.nan], F32)
    n, z = np.full(2, 0.1, F32), np.array([0.005, 0.0], F32)
    kw = dict(learning_rate=0.1, l1_regularization_strength=0.01)
    k2 = F.ftrl_update(w, g, n, z, convention="keras2", **kw)
    k3 = F.ftrl_update(w, g, n, z, convention="keras3", **kw)
    assert k2.param.tolist() == [0.0, 0.0] and k3.param[0] == 0 and np.isnan(k3.param[1])


def test_shrinkage_enters_z_only_and_switches_the_kernel():
    w, g = np.array([2.0], F32), np.array([0.5], F32)
    n, z = np.full(1, 0.1, F32), np.zeros(1, F32)
    base = F.ftrl_update(w, g, n, z, learning_rate=0.1, convention="tf1")
    shr = F.ftrl_update(w, g, n, z, learning_rate=0.1, convention="tf1",
                        l2_shrinkage_regularization_strength=0.25)
    assert shr.accumulator[0] == base.accumulator[0] == np.float32(0.1) + np.float32(0.25)
    assert shr.linear[0] == base.linear[0] + np.float32(1.0)  # + 2 * 0.25 * w, exact here


# --------------------------------------------------------------------------- scalars, state
def test_scalars_rounding_per_form():
    s = {f: F.ftrl_scalars(F64, f, learning_rate=0.1, **REG) for f in FORMS}
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert s["keras3"]["lr"] == f32(0.1) and s["keras3"]["l1"] == 0.01
    assert s["keras3"]["power"] == 0.3 and s["keras2"]["power"] == f32(0.3)
    assert s["keras3"]["two_l2"] == 2 * (0.02 + 0.1 / (2 * f32(0.1)))
    assert s["keras2"]["two_l2"] == 2 * (f32(0.02) + f32(0.1) / (2 * f32(0.1)))
    tf1_l2 = np.float32(0.02) + np.float32(0.1) / (np.float32(2) * np.float32(0.1))
    assert s["tf1"]["two_l2"] == 2 * float(tf1_l2)  # computed in float32, then cast
    assert s["keras3"]["two_shrinkage"] == 0.2 and s["tf1"]["two_shrinkage"] == 2 * f32(0.1)
    assert not any(v["use_sqrt"] for v in s.values())
    assert F.ftrl_scalars(F32, "tf1", learning_rate=0.1)["use_sqrt"]
    assert not F.ftrl_scalars(F32, "keras3", learning_rate=0.1)["use_sqrt"]


def test_initial_accumulator_keras_rounds_through_float32():
    assert F.initial_accumulator("tf_keras", F64) == float(np.float32(0.1))
    assert F.initial_accumulator("keras3", F64) == float(np.float32(0.1))
    assert F.initial_accumulator("keras2", F64) == 0.1
    assert F.initial_accumulator("tf1", F64, 0.25) == 0.25
    acc, lin = F.ftrl_initial_state(np.zeros((2, 3), F32), initial_accumulator_value=0.5)
    assert acc.tolist() == [[0.5] * 3] * 2 and not lin.any() and lin.dtype == F32


def test_defaults_per_convention():
    assert F.ftrl_defaults("keras2")["learning_rate"] == 0.001
    assert F.ftrl_defaults("tf1")["learning_rate"] is None
    assert F.ftrl_defaults()["learning_rate_power"] == -0.5
    with pytest.raises(ValueError, match="Ftrl does not exist under convention='torch'"):
        F.ftrl_defaults("torch")


# --------------------------------------------------------------------------- sparse
def _table():
    w = np.arange(1, 13, dtype=F32).reshape(4, 3)
    acc, lin = F.ftrl_initial_state(w)
    g = IndexedSlices(np.ones((3, 3), F32), np.array([2, 0, 2]), (4, 3))
    return w, g, acc, lin


@pytest.mark.parametrize("form", ["keras2", "tf1"])
def test_kernels_update_only_the_present_rows_on_the_summed_gradient(form):
    w, g, acc, lin = _table()
    r = F.ftrl_update(w, g, acc, lin, learning_rate=0.1, convention=form)
    assert F.is_lazy_sparse(form)
    np.testing.assert_array_equal(r.param[[1, 3]], w[[1, 3]])
    np.testing.assert_array_equal(r.accumulator[[1, 3]], acc[[1, 3]])
    dense = F.ftrl_update(w[2:3], np.full((1, 3), 2, F32), acc[2:3], lin[2:3], learning_rate=0.1,
                          convention=form)
    np.testing.assert_array_equal(r.linear[2:3], dense.linear)
    assert r.accumulator[2, 0] == np.float32(0.1) + np.float32(4)


@pytest.mark.parametrize("form", ["tf_keras", "keras3"])
def test_keras_densifies_so_rows_without_gradient_become_zero(form):
    form = get_convention(form, keras3_sparse_square=False)  # the summed duplicates
    w, g, acc, lin = _table()
    r = F.ftrl_update(w, g, acc, lin, learning_rate=0.1, convention=form)
    assert not F.is_lazy_sparse(form)
    assert r.param[[1, 3]].tolist() == [[0.0] * 3] * 2  # z = 0: the closed form gives 0
    dense = F.ftrl_update(w, g.deduplicate().to_dense(), acc, lin, learning_rate=0.1,
                          convention=form)
    for a, b in zip(r, dense):
        np.testing.assert_array_equal(a, b)


def test_keras3_unsummed_duplicates_square_each_occurrence():
    w, g, acc, lin = _table()
    conv = get_convention("keras3", keras3_sparse_square=True)
    r = F.ftrl_update(w, g, acc, lin, learning_rate=0.1, convention=conv)
    assert r.accumulator[2, 0] == np.float32(0.1) + np.float32(2)  # 1 + 1, not (1 + 1)**2
    summed = F.ftrl_update(w, g, acc, lin, learning_rate=0.1,
                           convention=get_convention("keras3", keras3_sparse_square=False))
    assert r.linear[0, 0] == summed.linear[0, 0]  # a row without duplicates is the same
    preset = F.ftrl_update(w, g, acc, lin, learning_rate=0.1, convention="keras3")
    assert preset.accumulator[2, 0] == r.accumulator[2, 0]  # the preset is Keras 3's


def test_one_element_rows_take_the_scalar_loop():
    # (z + g) - sigma*w, sigma from pow even at -0.5, the weight from a clip
    w = np.array([1.0, 2.0, 3.0], F32)
    acc, lin = F.ftrl_initial_state(w, convention="tf1")
    lin = np.array([0.3, 0.0, 0.0], F32)
    g = IndexedSlices(np.array([0.7], F32), np.array([0]), (3,))
    r = F.ftrl_update(w, g, acc, lin, learning_rate=0.5, convention="tf1")
    n = np.float32(0.1) + np.float32(0.7) * np.float32(0.7)
    sigma = (_libm.powf(n, 0.5) - _libm.powf(np.float32(0.1), 0.5)) / np.float32(0.5)
    z = (np.float32(0.3) + np.float32(0.7)) - sigma * np.float32(1)
    assert r.linear[0] == z and r.param[0] == -z / (np.sqrt(n) / np.float32(0.5))
    assert r.param[1:].tolist() == [2.0, 3.0]


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kw, exc, match", [
    (dict(learning_rate=-1.0), ValueError, r"learning_rate.*>= 0.*-1\.0"),
    (dict(learning_rate_power=0.5), ValueError, r"learning_rate_power.*<= 0.*0\.5"),
    (dict(l1_regularization_strength=-0.1), ValueError, r"l1_regularization_strength.*>= 0"),
    (dict(beta="x"), TypeError, r"beta.*real number"),
    (dict(convention="optax"), ValueError, r"Ftrl does not exist under convention='optax'"),
    (dict(convention=3), TypeError, r"convention"),
])
def test_errors_name_the_argument(kw, exc, match):
    p = np.ones(3, F32)
    args = dict(learning_rate=0.1)
    args.update(kw)
    with pytest.raises(exc, match=match):
        F.ftrl_update(p, p, p, p, **args)


def test_shapes_and_dtypes_are_checked():
    p = np.ones(3, F32)
    with pytest.raises(ValueError, match="linear"):
        F.ftrl_update(p, p, p, np.ones(4, F32), learning_rate=0.1)
    with pytest.raises(ValueError, match="rank >= 1"):
        z = np.array(1.0, F32)
        F.ftrl_update(z, IndexedSlices(np.ones(1, F32), [0], (1,)), z, z, learning_rate=0.1)


def test_inputs_are_not_modified_and_results_are_new():
    w, g, acc, lin = _table()
    before = [a.copy() for a in (w, acc, lin)]
    for form in FORMS:
        r = F.ftrl_update(w, g, acc, lin, learning_rate=0.1, convention=form, **REG)
        assert all(x is not y for x, y in zip(r, (w, acc, lin)))
    for a, b in zip((w, acc, lin), before):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- the class
def test_optimizer_matches_the_reference_function():
    w = np.array([[1.0, -2.0], [0.5, 3.0]], F64)
    opt = refopt.Ftrl(learning_rate=0.1, convention="tf1", **REG)
    acc, lin = F.ftrl_initial_state(w, convention="tf1")
    ref_w = w.copy()
    for g in ([[0.1, 0.2], [0.3, -0.4]], [[1.0, 0.0], [-2.0, 0.5]]):
        g = np.array(g, F64)
        r = F.ftrl_update(ref_w, g, acc, lin, learning_rate=0.1, convention="tf1", **REG)
        ref_w, acc, lin = r
        opt.apply_gradients([(g, w)])
    np.testing.assert_array_equal(w, ref_w)
    np.testing.assert_array_equal(opt.get_slot(w, "linear"), lin)
    np.testing.assert_array_equal(opt.get_slot(w, "accumulator"), acc)
    assert opt.slot_names == ("accumulator", "linear")


def test_docstring_examples_run():
    import doctest

    import refopt.optimizers.ftrl as class_module

    for module in (F, class_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


def test_config_round_trip_keeps_every_hyperparameter():
    opt = refopt.Ftrl(learning_rate=0.2, initial_accumulator_value=0.5, convention="keras2",
                      **REG)
    cfg = opt.get_config()
    assert {k: cfg[k] for k in REG} == REG and cfg["initial_accumulator_value"] == 0.5
    assert refopt.Ftrl.from_config(cfg).get_config() == cfg
