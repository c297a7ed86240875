# The Adadelta reference (refopt/reference/adadelta.py) and class under every adadelta_form.
#
# (a) Small cases whose expected values come from the update rules in the frameworks' sources
#     (restated in ../shared/semantics/catalogue.md section 3), evaluated here by hand with
#     exact arithmetic, or from the recorded golden trajectories; never from adadelta_update
#     itself.
# (b) Every recorded Adadelta golden case (conformance/data/*adadelta*), replayed step by step
#     through adadelta_update with a resync to the recorded state before each step: max ulp
#     <= the case's tolerance (the optimizer-level replay is tests/test_conformance.py).
import doctest

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.adadelta as adadelta_class_module
import refopt.reference.adadelta as adadelta_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import (
    AdadeltaResult,
    adadelta_initial_state,
    adadelta_update,
    apply_weight_decay,
)
from refopt.reference.adadelta import adadelta_defaults, is_lazy_sparse
from refopt.reference.variants import fma, l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax")


def _state(w):
    return adadelta_initial_state(w)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    d = {form: adadelta_defaults(form) for form in FORMS}
    keras = dict(learning_rate=0.001, rho=0.95, epsilon=1e-7)
    assert d["tf_keras"] == d["keras3"] == d["keras2"] == keras
    assert d["tf1"] == dict(learning_rate=0.001, rho=0.95, epsilon=1e-8)
    assert d["torch"] == dict(learning_rate=1.0, rho=0.9, epsilon=1e-6)
    assert d["optax"] == dict(learning_rate=None, rho=0.9, epsilon=1e-6)
    opt = refopt.Adadelta(convention="torch")
    assert (opt.learning_rate, opt.rho, opt.epsilon) == (1.0, 0.9, 1e-6)
    opt = refopt.Adadelta()
    assert opt.learning_rate == float(F32(0.001))  # a float32 variable in Keras
    assert (opt.rho, opt.epsilon) == (0.95, 1e-7)
    assert refopt.Adadelta(convention="tf1").epsilon == 1e-8
    # Keras 2: epsilon=0 (or None) means backend.epsilon() = 1e-7 (legacy/adadelta.py)
    assert refopt.Adadelta(epsilon=0.0, convention="keras2").epsilon == 1e-7
    assert refopt.Adadelta(epsilon=0.0, convention="keras3").epsilon == 0.0
    assert refopt.Adadelta(learning_rate=0.5, convention="optax").rho == 0.9


# Exact arithmetic: E_g = 0, E_x = 2, g = 2, rho = 0.5, eps = 2, lr = 0.5: E_g = 0.5*4 = 2,
# the roots sqrt(2 + 2) = 2 (rsqrt 0.5), the step 2*2/2 = 2, E_x = 0.5*2 + 0.5*4 = 3,
# w = 3 - 0.5*2 = 2; every operation exact, so every form gives these bits in every dtype.
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", [F16, F32, F64])
def test_exact_step_every_form(form, dtype):
    w, g, eg, ex = (np.array([x], dtype) for x in (3.0, 2.0, 0.0, 2.0))
    r = adadelta_update(w, g, eg, ex, learning_rate=0.5, rho=0.5, epsilon=2.0, convention=form)
    assert isinstance(r, AdadeltaResult)
    assert r.param.dtype == dtype
    assert (r.param[0], r.accumulated_grad[0], r.accumulated_delta[0]) == (2.0, 2.0, 3.0)


def test_first_step_is_sqrt_eps_over_rms_g():
    # From zero state: E_g = (1-rho) g^2, step = sqrt(eps)/sqrt(E_g + eps) * g, the same in
    # every framework up to rounding (catalogue section 3).
    g, rho, eps = 0.5, 0.9, 1e-6
    want = np.sqrt(eps) / np.sqrt((1 - rho) * g * g + eps) * g
    for form in FORMS:
        w = np.zeros(1)
        r = adadelta_update(w, np.array([g]), *_state(w), learning_rate=1.0, rho=rho,
                            epsilon=eps, convention=form)
        assert -r.param[0] == pytest.approx(want, rel=1e-6), form  # TF forms: rho via float32


def _golden(case_id):
    entry = next(e for e in load_manifest() if e["id"] == case_id)
    return entry, load_case(entry)


def _misses(case_id, form):
    """Elements of the recorded trajectory (resynced every step) that ``form`` misses."""
    entry, (init, grads, params, slots) = _golden(case_id)
    hyper = dict(adadelta_defaults(entry["convention"]), **entry["hyperparameters"])
    misses = 0
    for i, w0 in enumerate(init):
        for k in range(entry["steps"]):
            w = params[k - 1][i] if k else w0
            eg, ex = ((slots["accumulated_grad"][k - 1][i], slots["accumulated_delta"][k - 1][i])
                      if k else _state(w0))
            r = adadelta_update(w, grads[k][i], eg, ex, learning_rate=hyper["learning_rate"],
                                rho=hyper["rho"], epsilon=hyper["epsilon"], convention=form)
            misses += int((r.accumulated_grad != slots["accumulated_grad"][k][i]).sum())
            misses += int((r.accumulated_delta != slots["accumulated_delta"][k][i]).sum())
    return misses


def test_tf_keras_and_keras3_round_the_squares_differently():
    # tf_keras: (1 - rho) * g * g evaluates ((1-rho)*g)*g; Keras 3: (1-rho)*square(g). Each
    # recorded trajectory is reproduced by its own form only.
    assert _misses("tf_keras/adadelta_f32", "tf_keras") == 0
    assert _misses("keras3/adadelta_f32", "keras3") == 0
    assert _misses("tf_keras/adadelta_f32", "keras3") > 0
    assert _misses("keras3/adadelta_f32", "tf_keras") > 0


def test_tf_kernel_rounds_rho_through_float32():
    # Keras 2 and TF1 hand the kernel rho as a float32 tensor cast to float64; E_g of the
    # float64 golden case (no rsqrt involved) is reproduced only with that rho.
    entry, (init, grads, params, slots) = _golden("keras2/adadelta_f64")
    g, eg = grads[0][0], slots["accumulated_grad"][0][0]
    rho32 = F64(F32(0.95))
    assert np.array_equal(eg, np.square(g) * (F64(1) - rho32))
    assert not np.array_equal(eg, np.square(g) * (F64(1) - F64(0.95)))


def test_optax_fuses_the_moment_sums():
    # (1-rho)*g**2 + rho*e_g under jit is fma(1-rho, g*g, rho*e_g): bit for bit on the
    # recorded E_g, where the unfused sum misses
    entry, (init, grads, params, slots) = _golden("optax/adadelta_f32")
    c, r = F32(1 - 0.9), F32(0.9)
    fused = plain = 0
    for k in range(1, entry["steps"]):
        g, eg0, want = grads[k][1], slots["accumulated_grad"][k - 1][1], \
            slots["accumulated_grad"][k][1]
        fused += int((fma(c, g * g, r * eg0) != want).sum())
        plain += int((c * (g * g) + r * eg0 != want).sum())
    assert fused == 0 and plain > 0


def test_torch_weight_decay_is_the_fused_l2_term():
    w, g = np.array([1.5, -2.0], F32), np.array([0.25, 0.125], F32)
    r = adadelta_update(w, l2_torch(g, w, 0.1), *_state(w), learning_rate=1.0, rho=0.9,
                        epsilon=1e-6, convention="torch")
    r2 = adadelta_update(w, fma(w, F32(0.1), g), *_state(w), learning_rate=1.0, rho=0.9,
                         epsilon=1e-6, convention="torch")
    assert np.array_equal(r.param, r2.param)


def test_which_forms_are_lazy():
    assert [f for f in FORMS if is_lazy_sparse(f)] == ["keras2", "tf1"]


def _table():
    w = np.arange(1.0, 13.0, dtype=F32).reshape(4, 3) / 8
    eg = np.arange(1.0, 13.0, dtype=F32).reshape(4, 3) / F32(7)
    ex = np.arange(1.0, 13.0, dtype=F32).reshape(4, 3) / F32(1100)
    g = IndexedSlices(np.ones((3, 3), F32), np.array([2, 0, 2]), (4, 3))
    return w, g, eg, ex


@pytest.mark.parametrize("form", ["keras2", "tf1"])
def test_tf_kernel_forms_move_only_the_present_rows(form):
    w, g, eg, ex = _table()
    r = adadelta_update(w, g, eg, ex, learning_rate=1.0, rho=0.9, epsilon=1e-6, convention=form)
    for a, b in zip(r, (w, eg, ex)):
        assert np.array_equal(a[[1, 3]], b[[1, 3]])  # absent rows: not touched
        assert not np.array_equal(a[[0, 2]], b[[0, 2]])
    dense = adadelta_update(w[[0, 2]], np.array([[1, 1, 1], [2, 2, 2]], F32), eg[[0, 2]],
                            ex[[0, 2]], learning_rate=1.0, rho=0.9, epsilon=1e-6,
                            convention=form)
    for a, b in zip(r, dense):  # present rows: the dense kernel on the summed rows
        assert np.array_equal(a[[0, 2]], b)


def test_tf_keras_sparse_branch_decays_every_row():
    # E_g <- E_g + (rho - 1)*E_g everywhere, then (1-rho)*v^2 added on the present rows;
    # E_x decays on every row (the step is computed densely); w of an absent row stays.
    w, g, eg, ex = _table()
    rho = 0.9
    r = adadelta_update(w, g, eg, ex, learning_rate=1.0, rho=rho, epsilon=1e-6)
    decayed = eg + F32(rho - 1) * eg
    assert np.array_equal(r.accumulated_grad[[1, 3]], decayed[[1, 3]])
    assert not np.array_equal(decayed, F32(rho) * eg)  # not the dense form's rho*E_g
    assert np.array_equal(r.accumulated_grad[0], decayed[0] + F32(1 - rho) * F32(1))
    assert np.array_equal(r.accumulated_delta[[1, 3]], F32(rho) * ex[[1, 3]])
    assert np.array_equal(r.param[[1, 3]], w[[1, 3]])
    assert not np.array_equal(r.param[[0, 2]], w[[0, 2]])


def test_keras3_sparse_without_its_square_knob_is_the_dense_step_on_the_summed_gradient():
    w, g, eg, ex = _table()
    kw = dict(learning_rate=1.0, rho=0.9, epsilon=1e-6,
              convention=get_convention("keras3", keras3_sparse_square=False))
    r = adadelta_update(w, g, eg, ex, **kw)
    d = adadelta_update(w, g.to_dense(), eg, ex, **kw)
    for a, b in zip(r, d):
        assert np.array_equal(a, b)


def test_keras3_sparse_square_knob_is_what_keras3_printed():
    # keras.optimizers.Adadelta(learning_rate=0.1) (3.15.1, TF backend) on a 3x2 table of
    # ones with raw IndexedSlices [[1, 2], [3, 4]] at rows [1, 1] printed row 1 of the
    # variable [0.999821126461029, 0.9998102784156799] and accumulated_grad [0.5, 1.0]
    # (sum of (1-rho)*g_i**2: 0.05*(1 + 9), 0.05*(4 + 16)); tf_keras [0.99985856, ...]
    w, eg, ex = np.ones((3, 2), F32), np.zeros((3, 2), F32), np.zeros((3, 2), F32)
    g = IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], F32), np.array([1, 1]), (3, 2))
    conv = get_convention("keras3", keras3_sparse_square=True)
    r = adadelta_update(w, g, eg, ex, learning_rate=0.1, rho=0.95, epsilon=1e-7,
                        convention=conv)
    assert r.param[1].tolist() == [0.999821126461029, 0.9998102784156799]
    assert r.accumulated_grad[1].tolist() == [0.5, 1.0]
    assert np.array_equal(r.param[[0, 2]], w[[0, 2]])
    r = adadelta_update(w, g, eg, ex, learning_rate=0.1, rho=0.95, epsilon=1e-7)
    assert r.param[1].tolist() == [0.999858558177948, 0.999858558177948]
    # the "keras3" preset is Keras 3's (the knob on)
    r = adadelta_update(w, g, eg, ex, learning_rate=0.1, rho=0.95, epsilon=1e-7,
                        convention="keras3")
    assert r.param[1].tolist() == [0.999821126461029, 0.9998102784156799]


@pytest.mark.parametrize("form", ["torch", "optax"])
def test_torch_and_optax_refuse_sparse_gradients(form):
    w, g, eg, ex = _table()
    with pytest.raises(TypeError, match="no sparse gradient.*IndexedSlices"):
        adadelta_update(w, g, eg, ex, learning_rate=1.0, rho=0.9, epsilon=1e-6,
                        convention=form)


def test_returns_new_arrays_and_leaves_inputs_alone():
    for form in ("tf_keras", "keras2"):
        w, g, eg, ex = _table()
        before = [a.copy() for a in (w, eg, ex)]
        for grad in (g, g.to_dense()):
            r = adadelta_update(w, grad, eg, ex, learning_rate=1.0, rho=0.9, epsilon=1e-6,
                                convention=form)
            for a, b in zip((w, eg, ex), before):
                assert np.array_equal(a, b)
            assert not any(np.shares_memory(x, y) for x in r for y in (w, eg, ex))


def test_reference_errors_name_the_argument_and_value():
    w = np.ones(3, F32)
    kw = dict(learning_rate=1.0, rho=0.9, epsilon=1e-6)
    with pytest.raises(ValueError, match=r"`rho` must be in \[0, 1\]. Received: rho=1.5"):
        adadelta_update(w, w, w, w, **dict(kw, rho=1.5))
    with pytest.raises(ValueError, match="epsilon.*Received: epsilon=-1"):
        adadelta_update(w, w, w, w, **dict(kw, epsilon=-1))
    with pytest.raises(ValueError, match="learning_rate.*Received: learning_rate=-1"):
        adadelta_update(w, w, w, w, **dict(kw, learning_rate=-1))
    with pytest.raises(TypeError, match="rho.*real number"):
        adadelta_update(w, w, w, w, **dict(kw, rho="0.9"))
    with pytest.raises(ValueError, match="accumulated_delta.*shape"):
        adadelta_update(w, w, w, np.ones(2, F32), **kw)
    with pytest.raises(ValueError, match="accumulated_grad.*dtype"):
        adadelta_update(w, w, w.astype(F64), w, **kw)
    with pytest.raises(ValueError, match="adadelta_form='none'"):
        adadelta_update(w, w, w, w, convention=get_convention("torch", adadelta_form="none"),
                        **kw)


def test_class_applies_l2_under_torch_and_optax_and_refuses_it_on_sparse_rows():
    for conv in ("torch", "optax"):
        w = np.array([1.5, -2.0], F32)
        opt = refopt.Adadelta(learning_rate=1.0, weight_decay=0.1, convention=conv)
        g = np.array([0.25, 0.125], F32)
        want = adadelta_update(w, fma(w, F32(0.1), g), *_state(w), learning_rate=1.0,
                               rho=0.9, epsilon=1e-6, convention=conv)
        opt.apply_gradients([(g, w)])
        assert np.array_equal(w, want.param)


def test_tf_keras_weight_decay_covers_every_row_of_a_sparse_variable():
    w, g, _, _ = _table()
    opt = refopt.Adadelta(learning_rate=1.0, weight_decay=0.5)
    opt.apply_gradients([(g, w)])
    w0 = _table()[0]
    assert np.array_equal(w[1], apply_weight_decay(w0[1], learning_rate=1.0, weight_decay=0.5))


def test_config_round_trip():
    for kw in ({}, dict(convention="torch", weight_decay=0.1),
               dict(convention="optax", learning_rate=0.5, rho=0.8, epsilon=1e-4)):
        opt = refopt.Adadelta(**kw)
        again = refopt.Adadelta.from_config(opt.get_config())
        assert again.get_config() == opt.get_config()
        assert (again.rho, again.epsilon) == (opt.rho, opt.epsilon)


@pytest.mark.parametrize("module", [adadelta_module, adadelta_class_module])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


# ----------------------------------------------------------------------------- (b) golden
# bfloat16 cases: computed op by op in the optimizer's step (refopt.reference.bf16,
# bf16_generic), replayed by tests/test_conformance.py; the reference takes float16/32/64
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Adadelta"
            and replayed_by_functions(e)]


def replay_max_ulp(entry):
    """Replay one golden case through adadelta_update (the pipeline's weight decay by hand),
    resyncing to the recorded state before every step; return (max ulp, where)."""
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = dict(adadelta_defaults(conv), **entry["hyperparameters"])
    init, grads, params, slots = load_case(entry)
    worst, where = 0.0, "all equal"
    for i, w0 in enumerate(init):
        w, (eg, ex) = w0.copy(), _state(w0)
        for k in range(entry["steps"]):
            if k > 0:  # resync: the bound is per step
                w = params[k - 1][i].copy()
                eg = slots["accumulated_grad"][k - 1][i].copy()
                ex = slots["accumulated_delta"][k - 1][i].copy()
            g = grads[k][i]
            wd = hyper.get("weight_decay")
            if wd is not None and conv.adadelta_form in ("torch", "optax"):
                g = l2_torch(g, w, wd)
            elif wd is not None:
                w = apply_weight_decay(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
            out = adadelta_update(w, g, eg, ex, learning_rate=hyper["learning_rate"],
                                  rho=hyper["rho"], epsilon=hyper["epsilon"], convention=conv)
            for name, got, want in (
                    ("param", out.param, params[k][i]),
                    ("accumulated_grad", out.accumulated_grad, slots["accumulated_grad"][k][i]),
                    ("accumulated_delta", out.accumulated_delta,
                     slots["accumulated_delta"][k][i])):
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
        assert {f"{form}/adadelta_f32", f"{form}/adadelta_f64", f"{form}/adadelta_opts_f32"} <= ids
    assert {f"{form}/adadelta_sparse_f32"
            for form in ("tf_keras", "keras3", "keras2", "tf1")} <= ids


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_adadelta_replay(entry):
    worst, where = replay_max_ulp(entry)
    assert worst <= entry["tolerance_ulp"], (
        f"{entry['id']}: {worst} ulp > tolerance {entry['tolerance_ulp']} ({where})")
