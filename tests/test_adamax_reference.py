# The Adamax reference (refopt/reference/adamax.py) and class under every adamax_form.
#
# (a) Small cases whose expected values are numbers the frameworks printed (TF 2.21 tf_keras
#     2.21 and Keras 3.15.1, TF 2.15.1 legacy Keras 2, torch 2.13.0 CPU, optax 0.2.8 under
#     jit; float32) or exact arithmetic from the update rules in the frameworks' sources
#     (restated in ../shared/semantics/catalogue.md section 4); never from adamax_update.
# (b) Every recorded Adamax golden case (conformance/data/*adamax*), replayed step by step
#     through adamax_update with a resync to the recorded state before each step: max ulp
#     <= the case's tolerance (the optimizer-level replay is tests/test_conformance.py).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.adamax as adamax_class_module
import refopt.reference.adamax as adamax_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import (
    AdamaxResult,
    adamax_initial_state,
    adamax_update,
    apply_weight_decay,
)
from refopt.reference.adamax import adamax_defaults, is_lazy_sparse
from refopt.reference.variants import l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("tf_keras", "keras3", "keras2", "torch", "optax")


def _run(form, steps, *, w=1.0, dtype=F32, learning_rate=0.1, epsilon=None, beta_1=0.9,
         beta_2=0.999):
    eps = adamax_defaults(form)["epsilon"] if epsilon is None else epsilon
    w = np.array([w], dtype)
    m, u = adamax_initial_state(w)
    for t, g in enumerate(steps, start=1):
        w, m, u = adamax_update(w, np.array([g], dtype), m, u, learning_rate=learning_rate,
                                beta_1=beta_1, beta_2=beta_2, epsilon=eps, step=t,
                                convention=form)
    return w[0], m[0], u[0]


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    d = {form: adamax_defaults(form) for form in FORMS}
    keras = dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7)
    assert d["tf_keras"] == d["keras3"] == d["keras2"] == keras
    assert d["torch"] == dict(learning_rate=0.002, beta_1=0.9, beta_2=0.999, epsilon=1e-8)
    assert d["optax"]["learning_rate"] is None and d["optax"]["epsilon"] == 1e-8
    assert refopt.Adamax(convention="torch").learning_rate == 0.002  # a Python float in torch
    assert refopt.Adamax().learning_rate == float(F32(0.001))  # a float32 variable in Keras
    assert refopt.Adamax(convention="torch").epsilon == 1e-8
    assert refopt.Adamax().epsilon == 1e-7
    # Keras 2: epsilon=0 means backend.epsilon() = 1e-7 (golden case keras2/adamax_eps0_f32)
    assert refopt.Adamax(epsilon=0.0, convention="keras2").epsilon == 1e-7
    assert refopt.Adamax(epsilon=0.0, convention="keras3").epsilon == 0.0
    with pytest.raises(ValueError, match="convention='tf1' has no Adamax"):
        adamax_defaults("tf1")
    with pytest.raises(ValueError, match="Adamax does not exist under convention='tf1'"):
        refopt.Adamax(convention="tf1")


def test_framework_printed_epsilon_placement():
    # w = 1, g = 1e-3 then 0, lr 0.1, eps 1e-3 (betas 0.9, 0.999), float32. Keras adds eps to
    # u in the denominator (u = 0.000999 after step 2); torch and optax put it inside the
    # maximum (u = b2*(|g| + eps) = 0.001998). Printed by each framework.
    keras = (F32(0.9263039231300354), F32(9.000000136438757e-05), F32(0.000999000039882958))
    inside = (F32(0.9262920618057251), F32(9.000000136438757e-05), F32(0.001998000079765916))
    for form in ("tf_keras", "keras3"):
        assert _run(form, [1e-3, 0.0], epsilon=1e-3) == keras, form
    # Keras 2: 1 - beta_1 in float32 (0.100000024): m differs in the last bits
    assert _run("keras2", [1e-3, 0.0], epsilon=1e-3) == (
        keras[0], F32(9.000002319226041e-05), keras[2])
    for form in ("torch", "optax"):
        assert _run(form, [1e-3, 0.0], epsilon=1e-3) == inside, form


def test_framework_printed_one_step():
    # w = 1, g = 1, lr 0.1, each framework's default epsilon: Keras' 1 - powf(0.9f, 1) =
    # 0.100000024 gives 0.90000004; torch's float64 lr/(1 - 0.9**1) rounds to -1.0 in float32
    # and gives 0.9 (0.89999998); optax's float32 bias correction gives 0.90000004.
    assert _run("tf_keras", [1.0]) == (F32(0.9000000357627869), F32(0.1), F32(1.0))
    assert _run("keras3", [1.0]) == (F32(0.9000000357627869), F32(0.1), F32(1.0))
    assert _run("keras2", [1.0]) == (F32(0.9000000357627869), F32(0.10000002384185791),
                                     F32(1.0))
    assert _run("torch", [1.0]) == (F32(0.8999999761581421), F32(0.1), F32(1.0))
    assert _run("optax", [1.0]) == (F32(0.9000000357627869), F32(0.1), F32(1.0))
    # eps 1e-7 is stored in u by torch and optax (1 + 1e-7 = 1.0000001 in float32)
    assert _run("torch", [1.0], epsilon=1e-7) == (F32(0.9000000357627869), F32(0.1),
                                                   F32(1.0000001192092896))
    assert _run("optax", [1.0], epsilon=1e-7)[2] == F32(1.0000001192092896)


# Exact arithmetic: beta_1 = 0.5 (1 - 0.5 and 0.5**t exact everywhere), g = 2, eps 0, lr
# 0.5: m = 1, u = 2, bias correction 1/2, step lr * (m/(1/2)) / u = 0.5 exactly.
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_exact_step_every_form(form, dtype):
    w, m, u = _run(form, [2.0], w=3.0, dtype=dtype, learning_rate=0.5, epsilon=0.0,
                   beta_1=0.5, beta_2=0.5)
    assert (w, m, u) == (2.5, 1.0, 2.0) and w.dtype == dtype


def test_result_is_new_arrays_and_named():
    w = np.array([1.0, -2.0], F32)
    m, u = adamax_initial_state(w)
    before = [a.copy() for a in (w, m, u)]
    r = adamax_update(w, w.copy(), m, u, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
                      epsilon=1e-7)
    assert isinstance(r, AdamaxResult) and r._fields == ("param", "m", "u")
    for a, b in zip((w, m, u), before):
        assert np.array_equal(a, b)
    assert all(x is not y for x in r for y in (w, m, u))


def test_framework_printed_nan_gradient():
    # w = 1, g = 1 then NaN, lr 0.1 (printed): tf.maximum, torch.maximum and XLA propagate the
    # NaN into u; Keras 2's ApplyAdaMax (Eigen's cwiseMax) keeps b2*u = 0.999.
    for form in ("tf_keras", "keras3", "torch", "optax"):
        assert np.isnan(_run(form, [1.0, np.nan])).all(), form
    w, m, u = _run("keras2", [1.0, np.nan])
    assert np.isnan(w) and np.isnan(m) and u == F32(0.9990000128746033)


def test_u_is_a_maximum_without_epsilon_for_keras():
    # catalogue section 4: Keras' u = max(b2*u, |g|) (eps only in the denominator)
    for form in ("tf_keras", "keras3", "keras2"):
        assert _run(form, [-4.0, 1.0], epsilon=0.5, beta_2=0.5)[2] == 2.0  # max(0.5*4, 1)
    for form in ("torch", "optax"):  # max(0.5*(4 + 0.5), 1 + 0.5)
        assert _run(form, [-4.0, 1.0], epsilon=0.5, beta_2=0.5)[2] == 2.25


# ----------------------------------------------------------------------------- sparse
def _sparse_case(dtype=F32):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 2)).astype(dtype)
    m = rng.standard_normal((5, 2)).astype(dtype)
    u = np.abs(rng.standard_normal((5, 2))).astype(dtype)
    g = IndexedSlices(rng.standard_normal((3, 2)).astype(dtype), np.array([3, 0, 3]), (5, 2))
    return w, g, m, u


KW = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=2)


def test_sparse_tf_keras_is_non_lazy():
    w, g, m, u = _sparse_case()
    r = adamax_update(w, g, m, u, convention="tf_keras", **KW)
    dense = adamax_update(w, g.to_dense(), m, u, convention="tf_keras", **KW)
    absent = [1, 2, 4]  # every row moves; the absent ones exactly as the dense step
    for a, b in zip(r, dense):
        assert np.array_equal(a[absent], b[absent])
    assert not np.array_equal(r.param[absent], w[absent])
    # present rows: m + (-m)(1-b1), then + g(1-b1); u*b2, then + (max(u, |g|) - u)
    c1, b2 = F32(1 - 0.9), F32(0.999)
    gs = g.deduplicate()
    for row, vals in zip(gs.indices, gs.values):
        mm = m[row] + (-m[row]) * c1
        assert np.array_equal(r.m[row], mm + vals * c1)
        uu = u[row] * b2
        assert np.array_equal(r.u[row], uu + (np.maximum(uu, np.abs(vals)) - uu))


def test_sparse_keras2_is_lazy_and_keras3_dense():
    w, g, m, u = _sparse_case()
    r = adamax_update(w, g, m, u, convention="keras2", **KW)
    absent = [1, 2, 4]
    for a, b in zip(r, (w, m, u)):
        assert np.array_equal(a[absent], b[absent])
    assert is_lazy_sparse("keras2") and not is_lazy_sparse("tf_keras")
    # Keras 3 without its raw-slice knob: its dense step on the summed gradient
    summed = get_convention("keras3", keras3_sparse_square=False)
    r = adamax_update(w, g, m, u, convention=summed, **KW)
    d = adamax_update(w, g.to_dense(), m, u, convention=summed, **KW)
    for a, b in zip(r, d):
        assert np.array_equal(a, b)


def test_sparse_opposite_duplicates_framework_values():
    # rows [1, 1] with values [1, -1] on a (3, 1) table of ones, lr 0.1, twice (printed):
    # the summed gradient is 0, so m, u and w stay 0, 0, 1 for tf_keras and Keras 2; Keras 3's
    # raw slices put |1| + |-1| = 2 into u of row 1 (m and w do not move).
    g = IndexedSlices(np.array([[1.0], [-1.0]], F32), np.array([1, 1]), (3, 1))
    for form, u_row1 in (("tf_keras", 0.0), ("keras2", 0.0), ("keras3", 2.0)):
        conv = get_convention(form, keras3_sparse_square=form == "keras3")
        w = np.ones((3, 1), F32)
        m, u = adamax_initial_state(w)
        for t in (1, 2):
            w, m, u = adamax_update(w, g, m, u, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
                                    epsilon=1e-7, step=t, convention=conv)
        assert (w == 1).all() and (m == 0).all(), form
        assert u.ravel().tolist() == [0.0, u_row1, 0.0], form


@pytest.mark.parametrize("form", ["torch", "optax"])
def test_sparse_refused_by_torch_and_optax(form):
    w, g, m, u = _sparse_case()
    with pytest.raises(TypeError, match="takes no sparse gradient"):
        adamax_update(w, g, m, u, convention=form, **KW)
    opt = refopt.Adamax(learning_rate=0.1, convention=form)
    with pytest.raises(TypeError):
        opt.apply_gradients([(g, w)])


# ----------------------------------------------------------------------------- errors
def test_argument_errors_name_the_argument():
    w = np.ones(3, F32)
    kw = dict(KW)
    with pytest.raises(TypeError, match="`m` must have dtype"):
        adamax_update(w, w, w.astype(np.int32), w, **kw)
    with pytest.raises(ValueError, match="`u` must have the shape"):
        adamax_update(w, w, w, np.ones(2, F32), **kw)
    with pytest.raises(ValueError, match="epsilon.*Received: epsilon=-1"):
        adamax_update(w, w, w, w, **dict(kw, epsilon=-1.0))
    with pytest.raises(TypeError, match="beta_2"):
        adamax_update(w, w, w, w, **dict(kw, beta_2="0.9"))
    with pytest.raises(ValueError, match="step"):
        adamax_update(w, w, w, w, **dict(kw, step=0))
    with pytest.raises(ValueError, match="has no Adamax"):
        adamax_update(w, w, w, w, convention="tf1", **kw)
    with pytest.raises(TypeError, match="convention"):
        adamax_update(w, w, w, w, convention=3, **kw)


def test_docstring_examples_run():
    for mod in (adamax_module, adamax_class_module):
        result = doctest.testmod(mod, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, mod.__name__


# ----------------------------------------------------------------------------- (b) golden
# bfloat16 cases: computed op by op in the optimizer's step (refopt.reference.bf16,
# bf16_generic), replayed by tests/test_conformance.py; the reference takes float16/32/64
ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Adamax"
           and replayed_by_functions(e)]


def test_every_convention_with_adamax_is_recorded():  # optax in its three jit modes
    assert {e["convention"] for e in ENTRIES} == set(FORMS) | {"optax_eager", "optax_jit_step"}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["id"] for e in ENTRIES])
def test_golden_case_step_by_step(entry):
    init, grads, params, slots = load_case(entry)
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = dict(adamax_defaults(conv), **entry["hyperparameters"])
    if conv.epsilon_zero_is_default and hyper["epsilon"] == 0:
        hyper["epsilon"] = 1e-7
    wd = hyper.pop("weight_decay", None)
    counts = [0] * len(init)
    worst = 0
    for k, row in enumerate(grads):
        for i, g in enumerate(row):
            if g is None:
                continue
            counts[i] += 1
            w = init[i] if k == 0 else params[k - 1][i]
            m = np.zeros_like(w) if k == 0 else slots["m"][k - 1][i]
            u = np.zeros_like(w) if k == 0 else slots["u"][k - 1][i]
            if m is None:
                m, u = np.zeros_like(w), np.zeros_like(w)
            t = counts[i] if conv.step_counter == "per_variable" else k + 1
            if wd is not None and conv.adam_weight_decay == "l2":
                g = l2_torch(g, w, wd)
            elif wd is not None:
                w = apply_weight_decay(w, learning_rate=hyper["learning_rate"],
                                       weight_decay=wd)
            r = adamax_update(w, g, m, u, step=t, convention=conv, **hyper)
            for got, want in ((r.param, params[k][i]), (r.m, slots["m"][k][i]),
                              (r.u, slots["u"][k][i])):
                worst = max(worst, int(np.max(ulp_distance(got, want), initial=0)))
    assert worst <= entry["tolerance_ulp"], (entry["id"], worst)
