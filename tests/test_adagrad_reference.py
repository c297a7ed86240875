# The Adagrad reference (refopt/reference/adagrad.py) and class under every adagrad_form.
#
# (a) Small cases whose expected values come from the update rules in the frameworks' sources
#     (restated in ../shared/semantics/catalogue.md section 2), evaluated here by hand with
#     exact arithmetic, or from numbers the frameworks printed (tf_keras' one step below, the
#     recorded golden trajectories); never from adagrad_update itself.
# (b) Every recorded Adagrad golden case (conformance/data/*adagrad*), replayed step by step
#     through adagrad_update with a resync to the recorded state before each step: max ulp
#     <= the case's tolerance (the optimizer-level replay is tests/test_conformance.py).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.adagrad as adagrad_class_module
import refopt.reference.adagrad as adagrad_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import (
    AdagradResult,
    adagrad_initial_state,
    adagrad_update,
    apply_weight_decay,
    initial_accumulator,
)
from refopt.reference.adagrad import adagrad_defaults, is_lazy_sparse
from refopt.reference.variants import fma, l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax")
SPARSE_FORMS = ("tf_keras", "keras3", "keras2", "tf1", "torch")


def _eps(form, eps):
    return None if form == "tf1" else eps


def _step(form, w, g, acc, *, learning_rate, epsilon, **kw):
    return adagrad_update(w, g, acc, learning_rate=learning_rate,
                          epsilon=_eps(form, epsilon), convention=form, **kw)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    d = {form: adagrad_defaults(form) for form in FORMS}
    assert d["tf_keras"] == d["keras3"] == d["keras2"] == dict(
        learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7, lr_decay=0.0)
    assert d["tf1"]["learning_rate"] is None and d["tf1"]["epsilon"] is None  # no epsilon
    assert d["torch"] == dict(learning_rate=0.01, initial_accumulator_value=0.0,
                              epsilon=1e-10, lr_decay=0.0)
    assert d["optax"]["learning_rate"] is None and d["optax"]["epsilon"] == 1e-7
    # the class takes them
    opt = refopt.Adagrad(convention="torch")
    assert (opt.learning_rate, opt.initial_accumulator_value, opt.epsilon) == (0.01, 0.0, 1e-10)
    opt = refopt.Adagrad()
    assert opt.learning_rate == float(np.float32(0.001))  # a float32 variable in Keras
    assert (opt.initial_accumulator_value, opt.epsilon, opt.lr_decay) == (0.1, 1e-7, None)
    opt = refopt.Adagrad(learning_rate=0.1, convention="tf1")
    assert opt.epsilon is None and opt.initial_accumulator_value == 0.1
    # Keras 2: epsilon=0 (or None) means backend.epsilon() = 1e-7 (legacy/adagrad.py)
    assert refopt.Adagrad(epsilon=0.0, convention="keras2").epsilon == 1e-7
    assert refopt.Adagrad(epsilon=0.0, convention="keras3").epsilon == 0.0


def test_initial_accumulator_rounding():
    # Keras 3's initializers.Constant is ops.cast(value, dtype) of a float32 tensor; the
    # others convert 0.1 straight to the dtype (tf.constant, constant_initializer,
    # torch.full_like, jnp.full_like).
    assert initial_accumulator("keras3", F64) == F64(F32(0.1)) == 0.10000000149011612
    for form in ("tf_keras", "keras2", "tf1", "optax"):
        assert initial_accumulator(form, F64) == F64(0.1)
    assert initial_accumulator("torch", F64) == 0.0
    assert initial_accumulator("torch", F32, 0.5) == F32(0.5)
    acc = adagrad_initial_state(np.zeros((2, 3), F64), convention="keras3")
    assert acc.dtype == F64 and (acc == F64(F32(0.1))).all()
    # ... and the golden case shows it: acc after step 1 minus g**2 is that start
    entry = next(e for e in load_manifest() if e["id"] == "keras3/adagrad_f64")
    _, grads, _, slots = load_case(entry)
    g, a = grads[0][0], slots["accumulator"][0][0]
    assert np.array_equal(a, F64(F32(0.1)) + g * g)
    entry = next(e for e in load_manifest() if e["id"] == "tf_keras/adagrad_f64")
    _, grads, _, slots = load_case(entry)
    assert np.array_equal(slots["accumulator"][0][0], F64(0.1) + grads[0][0] ** 2)


def test_tf_keras_printed_one_step():
    # tf_keras.optimizers.Adagrad(learning_rate=0.1) on var = [10.0] with gradient [10.0]
    # printed var = [9.90005], accumulator = [100.1] (TF 2.21, tf_keras 2.21).
    w = np.array([10.0], F32)
    r = adagrad_update(w, w.copy(), adagrad_initial_state(w), learning_rate=0.1, epsilon=1e-7)
    assert r.param[0] == F32(9.90005) and r.accumulator[0] == F32(100.1)


# Exact arithmetic: g = 2 from a zero accumulator, epsilon 0 (TF1 has none): acc = 4, the
# root 2 (rsqrt 0.5), lr*g/2 = lr; every operation exact, so every form gives these bits.
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_exact_step_every_form(form, dtype):
    w, g, acc = (np.array([x], dtype) for x in (3.0, 2.0, 0.0))
    r = _step(form, w, g, acc, learning_rate=0.5, epsilon=0.0)
    assert isinstance(r, AdagradResult)
    assert r.param.dtype == dtype and r.param[0] == 2.5 and r.accumulator[0] == 4.0


def test_epsilon_placement():
    # catalogue section 2: inside the root (tf_keras, Keras 3, optax), outside (Keras 2,
    # torch), none (TF1). g = 1e-3 from a zero accumulator, eps = 1e-6: sqrt(1e-6 + 1e-6)
    # vs 1e-3 + 1e-6 vs 1e-3: the steps lr/sqrt(2), lr/1.001, lr.
    g, lr, eps = 1e-3, 0.5, 1e-6
    inside, outside, none = lr * g / np.sqrt(g * g + eps), lr * g / (g + eps), lr
    expected = {"tf_keras": inside, "keras3": inside, "optax": inside, "keras2": outside,
                "torch": outside, "tf1": none}
    for form, want in expected.items():
        r = _step(form, np.zeros(1), np.array([g]), np.zeros(1), learning_rate=lr,
                  epsilon=eps)
        # Keras and TF1 round the learning rate through float32: compare to 1e-7
        assert -r.param[0] == pytest.approx(want, rel=1e-7), form
    assert abs(inside - outside) > 0.2 * outside


def test_torch_lr_decay_uses_the_variables_step():
    # clr = lr / (1 + (step - 1) * lr_decay): step 3, lr_decay 0.5 -> lr / 2 (exact here)
    w, g, acc = np.array([3.0], F32), np.array([2.0], F32), np.zeros(1, F32)
    r = adagrad_update(w, g, acc, learning_rate=1.0, epsilon=0.0, convention="torch",
                       lr_decay=0.5, step=3)
    assert r.param[0] == 2.5  # 3 - (0.5 * 2) / 2
    r1 = adagrad_update(w, g, acc, learning_rate=1.0, epsilon=0.0, convention="torch",
                        lr_decay=0.5, step=1)
    assert r1.param[0] == 2.0  # no decay at the first step


def test_torch_and_optax_fuse_the_square():
    # torch's addcmul_ and XLA's contraction: acc = fma(g, g, acc), one rounding; Keras
    # rounds g*g first. g = 1 + 2**-12 in float32: g*g needs 25 bits.
    g = np.array([1 + 2.0 ** -12], F32)
    acc = np.array([2.0 ** -30], F32)
    exact = F64(g[0]) ** 2 + F64(acc[0])
    for form in ("torch", "optax"):
        r = _step(form, np.zeros(1, F32), g, acc, learning_rate=0.1, epsilon=1e-7)
        assert r.accumulator[0] == F32(exact)
    r = _step("tf_keras", np.zeros(1, F32), g, acc, learning_rate=0.1, epsilon=1e-7)
    assert r.accumulator[0] == (g * g + acc)[0] != F32(exact)


def test_optax_zero_sum_gives_a_zero_step():
    # scale_by_rss: where(sum > 0, rsqrt(sum + eps), 0): no NaN when nothing accumulated;
    # the other forms with epsilon 0 divide 0 by 0.
    w, z = np.array([1.5], F32), np.zeros(1, F32)
    r = _step("optax", w, z, z, learning_rate=0.1, epsilon=0.0)
    assert r.param[0] == 1.5 and r.accumulator[0] == 0
    for form in ("tf_keras", "keras3", "keras2", "tf1", "torch"):
        assert np.isnan(_step(form, w, z, z, learning_rate=0.1, epsilon=0.0).param[0]), form


# ----------------------------------------------------------------------------- sparse
_DUP = IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], F32), np.array([1, 1]), (3, 2))


def test_which_forms_are_lazy():
    assert {f for f in FORMS if is_lazy_sparse(f)} == {"tf_keras", "keras2", "tf1", "torch"}


@pytest.mark.parametrize("form", ["tf_keras", "keras2", "tf1", "torch"])
def test_lazy_forms_move_only_the_present_rows(form):
    # duplicates summed first ([4, 6]); rows 0 and 2 and their accumulators do not move, even
    # with a zero accumulator and epsilon 0 (the dense step would give 0/0 there)
    w = np.array([[1.0, -2.0], [0.5, 0.25], [3.0, 4.0]], F32)
    acc = np.array([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]], F32)
    r = _step(form, w, _DUP, acc, learning_rate=0.1, epsilon=0.0)
    for k in (0, 2):
        assert np.array_equal(r.param[k], w[k]) and np.array_equal(r.accumulator[k], acc[k])
    assert np.array_equal(r.accumulator[1], acc[1] + np.array([16.0, 36.0], F32))
    dense = _step(form, w[1:2], np.array([[4.0, 6.0]], F32), acc[1:2], learning_rate=0.1,
                  epsilon=0.0)
    if form != "torch":  # the dense formula on the summed rows (torch: its sparse branch)
        assert np.array_equal(r.param[1], dense.param[0])


def test_keras3_sparse_is_per_occurrence_and_without_its_knob_the_dense_step():
    w, acc = np.ones((3, 2), F32), np.full((3, 2), 0.1, F32)
    kw = dict(learning_rate=0.1, epsilon=1e-7)
    summed = get_convention("keras3", keras3_sparse_square=False)
    r = adagrad_update(w, _DUP, acc, convention=summed, **kw)
    d = adagrad_update(w, _DUP.to_dense(), acc, convention=summed, **kw)
    assert np.array_equal(r.param, d.param) and np.array_equal(r.accumulator, d.accumulator)
    # Keras 3's TF backend on the raw duplicates (semantics notes section 14): the squares
    # are scatter-added one occurrence at a time, a + 1 + 9 and a + 4 + 16, not (1 + 3)**2;
    # the "keras3" preset does that
    conv = "keras3"
    k = adagrad_update(w, _DUP, acc, convention=conv, **kw)
    assert np.array_equal(k.accumulator[1], [(F32(0.1) + 1) + 9, (F32(0.1) + 4) + 16])
    den = np.sqrt(k.accumulator[1] + F32(1e-7))
    lr = F32(0.1)
    want = (w[1] - (lr * _DUP.values[0]) / den) - (lr * _DUP.values[1]) / den
    assert np.array_equal(k.param[1], want)
    assert np.array_equal(k.param[[0, 2]], w[[0, 2]])


def test_keras3_sparse_with_a_zero_root_gives_nan_like_the_dense_step():
    # elementwise_division widens the slices to the rows whose divisor is 0 or NaN
    w, acc = np.ones((3, 2), F32), np.zeros((3, 2), F32)
    for conv in ("keras3", get_convention("keras3", keras3_sparse_square=True)):
        r = adagrad_update(w, _DUP, acc, learning_rate=0.1, epsilon=0.0, convention=conv)
        assert np.isnan(r.param[[0, 2]]).all() and not np.isnan(r.param[1]).any()


def test_tf1_sparse_kernel_divides_on_one_element_rows():
    # training_ops.cc SparseApplyAdagrad, has_epsilon=false: inner_dim > 1 takes
    # lr*g*rsqrt(a), inner_dim == 1 takes lr*g/sqrt(a) (the golden case
    # tf1/adagrad_sparse_1d_f32 is bit-identical only with the latter)
    rng = np.random.default_rng(3)
    lr, lr32 = 1.0, F32(1.0)
    for shape in ((64,), (64, 1), (16, 4)):
        w = rng.standard_normal(shape).astype(F32)
        acc = (rng.random(shape) + 0.1).astype(F32)
        idx = np.arange(shape[0])
        vals = rng.standard_normal(shape).astype(F32)
        r = adagrad_update(w, IndexedSlices(vals, idx, shape), acc, learning_rate=lr,
                           epsilon=None, convention="tf1")
        a = acc + vals * vals
        if int(np.prod(shape[1:])) == 1:
            want = w - (lr32 * vals) / np.sqrt(a)
        else:
            want = w - (vals * lr32) * refopt.reference.rmsprop.rsqrt(a)
        assert np.array_equal(r.param, want), shape


def test_torch_sparse_branch_divides_first_and_fuses_the_add():
    # _single_tensor_adagrad, grad.is_sparse: sum.add_(g**2), std = sqrt + eps,
    # param.add_(g / std, alpha=-clr) (one FMA); the dense branch scales first
    rng = np.random.default_rng(4)
    w = rng.standard_normal((5, 3)).astype(F32)
    acc = np.abs(rng.standard_normal((5, 3))).astype(F32)
    vals = rng.standard_normal((2, 3)).astype(F32)
    g = IndexedSlices(vals, np.array([3, 0]), (5, 3))
    r = adagrad_update(w, g, acc, learning_rate=0.1, epsilon=1e-10, convention="torch")
    a = acc[[3, 0]] + vals * vals
    want = fma(F32(-0.1), vals / (np.sqrt(a) + F32(1e-10)), w[[3, 0]])
    assert np.array_equal(r.param[[3, 0]], want) and np.array_equal(r.accumulator[[3, 0]], a)
    assert np.array_equal(r.param[[1, 2, 4]], w[[1, 2, 4]])


def test_optax_refuses_sparse_gradients():
    with pytest.raises(TypeError, match="optax.*no sparse gradient.*IndexedSlices"):
        adagrad_update(np.ones((3, 2), F32), _DUP, np.ones((3, 2), F32), learning_rate=0.1,
                       epsilon=1e-7, convention="optax")


# ----------------------------------------------------------------------------- API, errors
def test_returns_new_arrays_and_leaves_inputs_alone():
    p, g, acc = np.array([1.0, 2.0], F32), np.array([0.5, -0.5], F32), np.ones(2, F32)
    copies = [x.copy() for x in (p, g, acc)]
    for form in FORMS:
        r = _step(form, p, g, acc, learning_rate=0.1, epsilon=1e-7)
        for out, inp in zip(r, (p, acc)):
            assert not np.shares_memory(out, inp) and out.dtype == F32
    for x, c in zip((p, g, acc), copies):
        np.testing.assert_array_equal(x, c)


def test_reference_errors_name_the_argument_and_value():
    p, z = np.ones(2, F32), np.zeros(2, F32)
    kw = dict(learning_rate=0.1, epsilon=1e-7)
    with pytest.raises(ValueError, match=r"no epsilon.*Received: epsilon=1e-07"):
        adagrad_update(p, p, z, convention="tf1", **kw)
    with pytest.raises(ValueError, match=r"`epsilon` must be a real number.*epsilon=None"):
        adagrad_update(p, p, z, learning_rate=0.1, epsilon=None)
    with pytest.raises(ValueError, match=r"`epsilon` must be >= 0.*epsilon=-1\.0"):
        adagrad_update(p, p, z, learning_rate=0.1, epsilon=-1.0)
    with pytest.raises(ValueError, match=r"lr_decay.*PyTorch.*lr_decay=0\.1"):
        adagrad_update(p, p, z, lr_decay=0.1, **kw)
    with pytest.raises(ValueError, match=r"`lr_decay` must be >= 0.*lr_decay=-1"):
        adagrad_update(p, p, z, lr_decay=-1, convention="torch", **kw)
    with pytest.raises(ValueError, match=r"`step` must be an integer >= 1.*step=0"):
        adagrad_update(p, p, z, step=0, convention="torch", **kw)
    with pytest.raises(TypeError, match=r"`learning_rate` must be a real number.*'0\.1'"):
        adagrad_update(p, p, z, learning_rate="0.1", epsilon=1e-7)
    with pytest.raises(ValueError, match=r"`accumulator` must have the shape.*shape=\(3,\)"):
        adagrad_update(p, p, np.zeros(3, F32), **kw)
    with pytest.raises(ValueError, match=r"`grad`.*dtype=float64"):
        adagrad_update(p, np.ones(2), z, **kw)
    with pytest.raises(TypeError, match=r"`param` must be a numpy.ndarray"):
        adagrad_update([1.0], p, z, **kw)
    with pytest.raises(TypeError, match=r"convention.*Received: convention=3"):
        adagrad_update(p, p, z, convention=3, **kw)


@pytest.mark.parametrize("kwargs, exc, match", [
    ({"epsilon": 1e-7, "learning_rate": 0.1, "convention": "tf1"}, ValueError,
     r"convention='tf1' has no epsilon.*Received: epsilon=1e-07"),
    ({"learning_rate": None, "convention": "optax"}, TypeError, r"needs a `learning_rate`"),
    ({"lr_decay": 0.1}, ValueError, r"lr_decay.*PyTorch.*tf_keras.*Received: lr_decay=0\.1"),
    ({"lr_decay": -0.1, "convention": "torch"}, ValueError, r"lr_decay.*>= 0"),
    ({"initial_accumulator_value": 0.0, "learning_rate": 0.1, "convention": "tf1"},
     ValueError, r"initial_accumulator_value.*> 0.*Received: initial_accumulator_value=0\.0"),
    ({"initial_accumulator_value": float("nan")}, ValueError, r"initial_accumulator_value"),
])
def test_class_errors_name_the_argument_and_value(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        refopt.Adagrad(**kwargs)


def test_torch_refuses_weight_decay_with_a_sparse_gradient():
    # torch: "weight_decay option is not compatible with sparse gradients"
    for backend in ("reference", "cpu"):
        w = np.ones((3, 2), F32)
        opt = refopt.Adagrad(weight_decay=0.1, convention="torch", backend=backend)
        with pytest.raises(TypeError, match=r"weight_decay is not compatible with sparse"):
            opt.apply_gradients([(_DUP, w)])
        assert np.array_equal(w, np.ones((3, 2), F32)) and opt.iterations == 0


def test_tf_keras_weight_decay_covers_every_row_of_a_sparse_variable():
    # tf_keras' _apply_weight_decay shrinks the whole variable; the update moves row 1 only
    w = np.ones((3, 2), F32)
    opt = refopt.Adagrad(learning_rate=0.1, weight_decay=0.5)
    opt.apply_gradients([(_DUP, w)])
    decayed = apply_weight_decay(np.ones((3, 2), F32), learning_rate=0.1, weight_decay=0.5)
    assert np.array_equal(w[[0, 2]], decayed[[0, 2]]) and (w[1] < decayed[1]).all()


def test_config_round_trip():
    opt = refopt.Adagrad(learning_rate=0.05, initial_accumulator_value=0.5, epsilon=1e-3,
                         lr_decay=0.2, convention="torch")
    cfg = opt.get_config()
    assert cfg["lr_decay"] == 0.2 and cfg["initial_accumulator_value"] == 0.5
    again = refopt.Adagrad.from_config(cfg)
    assert again.get_config() == cfg
    tf1 = refopt.Adagrad(learning_rate=0.1, convention="tf1")
    assert refopt.Adagrad.from_config(tf1.get_config()).epsilon is None


def test_docstring_examples_run():
    for module in (adagrad_module, adagrad_class_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ----------------------------------------------------------------------------- (b) golden
# bfloat16 cases: torch's for-loop op by op (refopt.reference.bf16), replayed through the
# optimizer by tests/test_conformance.py; adagrad_update takes float16/32/64
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Adagrad"
            and replayed_by_functions(e)]


def replay_max_ulp(entry):
    """Replay one golden case through adagrad_update (the pipeline's weight decay by hand),
    resyncing to the recorded state before every step; return (max ulp, where)."""
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = dict(adagrad_defaults(conv), **entry["hyperparameters"])
    init, grads, params, slots = load_case(entry)
    worst, where = 0.0, "all equal"
    for i, w0 in enumerate(init):
        w = w0.copy()
        acc = adagrad_initial_state(
            w, initial_accumulator_value=hyper["initial_accumulator_value"], convention=conv)
        step = 0  # torch counts per variable; the others' step does not enter the update
        for k in range(entry["steps"]):
            if k > 0:  # resync: the bound is per step
                w, acc = params[k - 1][i].copy(), slots["accumulator"][k - 1][i].copy()
            g = grads[k][i]
            if g is None:
                continue
            step += 1
            if hyper.get("maximize"):  # torch's maximize: the pipeline negates g first
                g = -g
            wd = hyper.get("weight_decay")
            if wd is not None and conv.adagrad_form == "torch":
                g = l2_torch(g, w, wd)
            elif wd is not None:
                w = apply_weight_decay(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
            out = adagrad_update(w, g, acc, learning_rate=hyper["learning_rate"],
                                 epsilon=hyper["epsilon"], convention=conv,
                                 lr_decay=hyper["lr_decay"], step=step)
            for name, got, want in (("param", out.param, params[k][i]),
                                    ("accumulator", out.accumulator,
                                     slots["accumulator"][k][i])):
                d = ulp_distance(got, want)
                if d.size and d.max() > worst:
                    j = int(np.argmax(d))
                    worst = float(d.max())
                    where = (f"step {k + 1}, {name} of variable {i}, element {j}: refopt "
                             f"{got.flat[j]!r}, {entry['framework']} {want.flat[j]!r}")
    return worst, where


def test_golden_cases_cover_every_convention_dtype_and_sparse_form():
    ids = {e["id"] for e in _ENTRIES}
    for form in FORMS:
        assert {f"{form}/adagrad_f32", f"{form}/adagrad_f64", f"{form}/adagrad_iav_f32"} <= ids
    assert {f"{form}/adagrad_sparse_f32" for form in SPARSE_FORMS} <= ids


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_adagrad_replay(entry):
    worst, where = replay_max_ulp(entry)
    assert worst <= entry["tolerance_ulp"], (
        f"{entry['id']}: {worst} ulp > tolerance {entry['tolerance_ulp']} ({where})")


def test_tf1_one_element_rows_need_the_division():
    # the rsqrt form of the dense kernel misses the recorded 1-D sparse case (lr = 1)
    entry = next(e for e in _ENTRIES if e["id"] == "tf1/adagrad_sparse_1d_f32")
    init, grads, params, slots = load_case(entry)
    w, acc, misses = init[0], np.full_like(init[0], F32(0.1)), 0
    for k in range(entry["steps"]):
        g = grads[k][0].deduplicate()
        a = acc[g.indices] + g.values * g.values
        rsqrt_form = w[g.indices] - (g.values * F32(1.0)) * refopt.reference.rmsprop.rsqrt(a)
        misses += int((rsqrt_form != params[k][0][g.indices]).sum())
        w, acc = params[k][0], slots["accumulator"][k][0]
    assert misses > 0
