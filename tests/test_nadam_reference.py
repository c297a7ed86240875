# The Nadam reference (refopt/reference/nadam.py) and class under every nadam_form.
#
# (a) Small cases whose expected values come from the update rules in the frameworks' sources
#     (restated in ../shared/semantics/catalogue.md section 5), evaluated here by hand, or
#     from numbers the frameworks printed (the catalogue's appendix, the recorded golden
#     trajectories); never from nadam_update itself.
# (b) Every recorded Nadam golden case (conformance/data/*nadam*), replayed step by step
#     through nadam_update with a resync to the recorded state before each step: max ulp
#     <= the case's tolerance (the optimizer-level replay is tests/test_conformance.py); and
#     the momentum products the frameworks stored (``state/`` in the files: Keras'
#     u_product / momentum_cache, torch's per-parameter mu_product), bit for bit.
import doctest
import os

import numpy as np
import pytest
from lowp_cases import replayed_by_functions

import refopt
import refopt.optimizers.nadam as nadam_class_module
import refopt.reference.nadam as nadam_module
from refopt import IndexedSlices
from refopt.conformance import load_case, load_manifest
from refopt.conventions import get_convention
from refopt.reference import (
    NadamResult,
    apply_weight_decay,
    nadam_initial_state,
    nadam_update,
)
from refopt.reference.nadam import momentum_product, nadam_defaults, nadam_schedule
from refopt.reference.variants import decay_torch, l2_torch
from refopt.testing.conformance import ulp_distance

F16, F32, F64 = np.float16, np.float32, np.float64
FORMS = ("tf_keras", "keras3", "keras2", "torch", "optax")
HYPER = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7)


def _step(form, w, g, m, v, step=1, **kw):
    return nadam_update(w, g, m, v, **dict(HYPER, **kw), step=step, convention=form)


# ----------------------------------------------------------------------------- (a) by hand
def test_defaults_per_convention():
    assert nadam_defaults("tf_keras") == nadam_defaults("keras3") == nadam_defaults("keras2")
    assert nadam_defaults("keras3") == dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999,
                                            epsilon=1e-7, momentum_decay=None)
    assert nadam_defaults("torch") == dict(learning_rate=0.002, beta_1=0.9, beta_2=0.999,
                                           epsilon=1e-8, momentum_decay=0.004)
    assert nadam_defaults("optax")["learning_rate"] is None
    with pytest.raises(ValueError, match="convention='tf1' has no Nadam"):
        nadam_defaults("tf1")
    opt = refopt.Nadam(convention="torch")
    assert (opt.learning_rate, opt.epsilon, opt.momentum_decay) == (0.002, 1e-8, 0.004)
    assert opt.decoupled_weight_decay is False
    assert refopt.Nadam(convention="keras2", epsilon=0.0).epsilon == 1e-7  # epsilon or 1e-7


# The catalogue's appendix (measured in each framework, printed to 9 digits): w0 = [1, -2,
# 0.5], three gradients, lr 0.1, the framework's defaults otherwise.
_APPENDIX = {
    "keras3": [0.897942603, -1.9979614, 0.390408039],
    "tf_keras": [0.897942662, -1.9979614, 0.390408039],
    "keras2": [0.899901092, -2.00113678, 0.394885987],
    "torch": [0.899901152, -2.00113702, 0.394885749],
    # one leaf: XLA multiplies by the bias corrections' reciprocals (refopt divides, as with
    # several leaves): 1 ulp on the last element
    "optax": [0.812182009, -1.97438216, 0.27724129],
}


@pytest.mark.parametrize("form", FORMS)
def test_catalogue_appendix_values(form):
    w = np.array([1, -2, 0.5], F32)
    opt = refopt.Nadam(learning_rate=0.1, convention=form)
    for g in ([0.3, -0.2, 0.7], [-0.1, 0.4, 0.2], [0.05, 0.05, -0.3]):
        opt.apply_gradients([(np.array(g, F32), w)])
    want = np.array(_APPENDIX[form], F32)
    assert ulp_distance(w, want).max() <= (1 if form == "optax" else 0), (form, w)


def test_keras3_first_step_by_hand():
    # g = 1 from zero moments: m = 1 - f32(0.9), v = 1 - f32(0.999); mu_1 = 0.9*(1 - 0.48),
    # mu_2 = 0.9*(1 - 0.5*0.9216); the product P_1 = mu_1, P_2 = mu_1*mu_2; v_hat = 1 exactly
    # up to rounding; m_hat = mu_2 m / (1 - P_2) + (1 - mu_1) / (1 - P_1) = 1.0628 (float64
    # estimate; refopt's float32 within 2 ulp of it)
    w, g = np.array([1.0], F32), np.array([1.0], F32)
    m, v = nadam_initial_state(w)
    r = _step("keras3", w, g, m, v)
    assert r.m[0] == F32(1) - F32(0.9) and r.v[0] == F32(1) - F32(0.999)
    mu1, mu2 = 0.9 * (1 - 0.5 * 0.96), 0.9 * (1 - 0.5 * 0.96 ** 2)
    m_hat = mu2 * 0.1 / (1 - mu1 * mu2) + (1 - mu1) / (1 - mu1)
    assert abs(float(r.param[0]) - (1 - 0.1 * m_hat)) < 2e-7


def test_schedules_differ_by_their_exponent():
    # Keras 3 / tf_keras: 0.96**t; Keras 2: 0.96**(0.004 t); torch: 0.96**(psi t)
    k3 = nadam_schedule(1, beta_1=0.9, convention="keras3", dtype=F64)
    k2 = nadam_schedule(1, beta_1=0.9, convention="keras2", dtype=F64)
    th = nadam_schedule(1, beta_1=0.9, convention="torch")
    b1 = float(F32(0.9))  # tf.cast(0.9, float64)
    assert k3.mu == b1 * (1 - 0.5 * float(F32(0.96)))
    assert abs(k2.mu - b1 * (1 - 0.5 * float(F32(0.96)) ** 0.004)) < 1e-15
    assert th.mu == 0.9 * (1 - 0.5 * 0.96 ** 0.004)
    tk = nadam_schedule(1, beta_1=0.9, convention="tf_keras", dtype=F64)
    assert tk.product == tk.mu and th.product == float(F32(th.mu))  # P_1 = mu_1
    # Keras 3's float64 product takes 0.9 and 0.96 exactly, its mu their float32 roundings
    assert k3.product == 0.9 * (1 - 0.5 * 0.96) != k3.mu
    assert type(th.product) is float and isinstance(k3.product, F64)


def test_momentum_products_round_as_each_framework():
    # Keras 3: (u * 0.9) * (1 - 0.5*0.96**t) with 0.9, 0.96 straight in float64; tf_keras:
    # u * mu_t with mu_t's float32 roundings of 0.9 and 0.96 -> different float64 bits
    k3 = momentum_product(1, convention="keras3", dtype=F64)
    tk = momentum_product(1, convention="tf_keras", dtype=F64)
    assert k3 == 0.9 * (1 - 0.5 * 0.96)
    assert tk == float(F32(0.9)) * (1 - 0.5 * float(F32(0.96)))
    # torch: a float32 tensor, whatever the parameters' dtype
    p = momentum_product(3, convention="torch")
    assert isinstance(p, F32)
    assert momentum_product(0, convention="torch") == 1 and momentum_product(0) == 1
    with pytest.raises(ValueError, match="no momentum schedule"):
        momentum_product(1, convention="optax")
    with pytest.raises(ValueError, match="momentum_decay.*PyTorch"):
        momentum_product(1, convention="keras3", momentum_decay=0.1)


def test_torch_adds_the_two_terms_separately():
    # w + (c_g g)/d, then + (c_m m)/d: two roundings into w (catalogue section 5)
    w, g = np.array([0.3], F32), np.array([0.7], F32)
    m, v = nadam_initial_state(w)
    r = _step("torch", w, g, m, v, epsilon=1e-8)
    sch = nadam_schedule(1, beta_1=0.9, convention="torch")
    m1 = F32(0.1) * g  # lerp from zero: fma(0.1, g - 0, 0)
    v1 = (F32(1 - 0.999) * g) * g
    d = np.sqrt(v1 / F32(1 - 0.999)) + F32(1e-8)
    cg = F32(-0.1 * (1 - sch.mu) / (1 - sch.product))
    cm = F32((-0.1 * sch.mu_next) / (1 - sch.product_next))
    want = (w + (cg * g) / d) + (cm * m1) / d
    assert r.param[0] == want[0]


def test_optax_has_no_schedule():
    # optax.nadam: b1 * m / (1 - b1^(t+1)) + (1 - b1) g / (1 - b1^t); at t = 1 from zero
    # moments m = 0.1 g, so m_hat = g (0.09/0.19 + 1) ~= 1.4737 g
    w, g = np.array([0.0], F32), np.array([1.0], F32)
    m, v = nadam_initial_state(w)
    r = _step("optax", w, g, m, v, epsilon=0.0)
    # (float32 roundings of 0.9 and 0.999 inside 1 - b and 1 - b**t: ~1e-5 relative)
    assert abs(float(r.param[0]) + 0.1 * (0.09 / 0.19 + 1)) < 2e-6
    # with the schedule (Keras 3) the first step's m_hat is 1.0628 g, not 1.4737 g
    assert abs(float(_step("keras3", w, g, m, v, epsilon=0.0).param[0]) + 0.10628) < 1e-5


def test_sparse_forms():
    table = np.arange(12, dtype=F32).reshape(4, 3) / 10
    m0 = np.full((4, 3), 0.5, F32)
    v0 = np.full((4, 3), 0.25, F32)
    g = IndexedSlices(np.ones((3, 3), F32), np.array([1, 1, 2]), (4, 3))
    # Keras 2: moments decay everywhere (m * b1), the variable moves on the rows only
    r = _step("keras2", table, g, m0, v0, step=2)
    assert np.array_equal(r.param[[0, 3]], table[[0, 3]])
    assert np.array_equal(r.m[0], m0[0] * F32(0.9)) and np.array_equal(r.v[3], v0[3] * F32(0.999))
    assert not np.array_equal(r.param[1], table[1])
    # tf_keras: m + (-m)(1 - b1) on absent rows, and every row moves (the dense update)
    r = _step("tf_keras", table, g, m0, v0, step=2)
    c1 = F32(1) - F32(0.9)
    assert np.array_equal(r.m[0], m0[0] + (-m0[0]) * c1)
    assert not np.array_equal(r.param[0], table[0])
    # Keras 3 without the knob: its dense step on the summed gradient
    summed = get_convention("keras3", keras3_sparse_square=False)
    dense = _step(summed, table, g.deduplicate().to_dense(), m0, v0, step=2)
    for a, b in zip(_step(summed, table, g, m0, v0, step=2), dense):
        assert np.array_equal(a, b)
    # the "keras3" preset squares each occurrence (row 1 has two): v differs there only
    k3 = _step("keras3", table, g, m0, v0, step=2)
    assert not np.array_equal(k3.v[1], dense.v[1]) and np.array_equal(k3.v[2], dense.v[2])
    for form in ("torch", "optax"):
        with pytest.raises(TypeError, match="no sparse gradient"):
            _step(form, table, g, m0, v0)


def test_returns_new_arrays_and_leaves_inputs_alone():
    w, g = np.ones(3, F32), np.full(3, 0.5, F32)
    m, v = nadam_initial_state(w)
    before = [a.copy() for a in (w, g, m, v)]
    for form in FORMS:
        r = _step(form, w, g, m, v)
        assert isinstance(r, NadamResult)
        assert all(x is not y for x in r for y in (w, g, m, v))
    for a, b in zip((w, g, m, v), before):
        assert np.array_equal(a, b)


def test_reference_errors_name_the_argument_and_value():
    w = np.ones(2, F32)
    with pytest.raises(ValueError, match=r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"):
        _step("keras3", w, w, w, w, beta_1=1.0)
    with pytest.raises(ValueError, match=r"epsilon.*>= 0"):
        _step("torch", w, w, w, w, epsilon=-1.0)
    with pytest.raises(ValueError, match=r"momentum_decay.*PyTorch"):
        _step("keras2", w, w, w, w, momentum_decay=0.1)
    with pytest.raises(ValueError, match=r"step.*>= 1"):
        _step("keras3", w, w, w, w, step=0)
    with pytest.raises(ValueError, match=r"`m` must have the shape"):
        _step("keras3", w, w, np.ones(3, F32), w)
    with pytest.raises(ValueError, match="convention='tf1' has no Nadam"):
        _step("tf1", w, w, w, w)


def test_class_torch_weight_decays():
    # L2: g + wd*w as one FMA (torch's grad.add(param, alpha=wd)); decoupled: w * (1 - lr*wd)
    w0, g = np.array([0.5, -1.5], F32), np.array([0.25, 0.75], F32)
    m, v = nadam_initial_state(w0)
    for decoupled in (False, True):
        w = w0.copy()
        opt = refopt.Nadam(learning_rate=0.1, weight_decay=0.2, convention="torch",
                           decoupled_weight_decay=decoupled)
        opt.apply_gradients([(g, w)])
        if decoupled:
            want = nadam_update(decay_torch(w0, learning_rate=0.1, weight_decay=0.2), g, m, v,
                                learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                                step=1, convention="torch")
        else:
            want = nadam_update(w0, l2_torch(g, w0, 0.2), m, v, learning_rate=0.1,
                                beta_1=0.9, beta_2=0.999, epsilon=1e-8, step=1,
                                convention="torch")
        assert np.array_equal(w, want.param), decoupled


def test_keras_product_is_in_the_first_variables_dtype():
    # Keras 3 keeps one _u_product in var_list[0]'s dtype and casts it for the others
    a, b = np.ones(2, F32), np.ones(2, F64)
    opt = refopt.Nadam(learning_rate=0.1, convention="keras3")
    opt.apply_gradients([(np.full(2, 0.5, F32), a), (np.full(2, 0.5, F64), b)])
    m, v = nadam_initial_state(np.ones(2, F64))
    want = nadam_update(np.ones(2, F64), np.full(2, 0.5, F64), m, v, learning_rate=0.1,
                        beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1, convention="keras3",
                        product_dtype=F32)
    assert np.array_equal(b, want.param)


def test_config_round_trip():
    opt = refopt.Nadam(learning_rate=0.01, beta_1=0.8, convention="torch", momentum_decay=0.01,
                       weight_decay=0.1, decoupled_weight_decay=True)
    again = refopt.Nadam.from_config(opt.get_config())
    assert again.get_config() == opt.get_config()
    assert "momentum_decay" not in refopt.Nadam().get_config()


@pytest.mark.parametrize("conv", ["torch", "keras3", "keras2"])
def test_checkpoint_resume_is_bit_identical(conv, tmp_path):
    # the momentum product is a function of the (per-variable, under torch) step counts,
    # which the checkpoint holds: a resumed run continues the same products
    rng = np.random.default_rng(7)
    grads = [[rng.standard_normal(4).astype(F32), rng.standard_normal(3).astype(F32)]
             for _ in range(6)]
    grads[1][1] = None  # torch: variable 1 falls one step behind
    init = [np.linspace(-1, 1, 4).astype(F32), np.linspace(0, 2, 3).astype(F32)]

    def run(steps, opt, vs):
        for row in steps:
            with pytest.warns(UserWarning) if any(g is None for g in row) else _nothing():
                opt.apply_gradients(zip(row, vs))

    straight = [a.copy() for a in init]
    run(grads, refopt.Nadam(learning_rate=0.1, convention=conv), straight)
    first = [a.copy() for a in init]
    opt = refopt.Nadam(learning_rate=0.1, convention=conv)
    run(grads[:3], opt, first)
    refopt.save_checkpoint(tmp_path / "ckpt.npz", opt, first)
    resumed = [np.zeros_like(a) for a in init]
    opt2 = refopt.Nadam(learning_rate=0.1, convention=conv)
    refopt.load_checkpoint(tmp_path / "ckpt.npz", opt2, resumed)
    run(grads[3:], opt2, resumed)
    for a, b in zip(resumed, straight):
        assert np.array_equal(a, b) and a.tobytes() == b.tobytes(), conv


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_a_failing_step_changes_nothing():
    w = [np.ones(3, F32), np.ones(2, F32)]
    opt = refopt.Nadam(learning_rate=0.1, convention="torch")
    opt.apply_gradients([(np.full(3, 0.5, F32), w[0]), (np.full(2, 0.5, F32), w[1])])
    before = [a.copy() for a in w] + [opt.get_slot(a, s).copy() for a in w for s in "mv"]
    with pytest.raises(ValueError):
        opt.apply_gradients([(np.full(3, 0.5, F32), w[0]), (np.ones(3, F32), w[1])])
    after = [a for a in w] + [opt.get_slot(a, s) for a in w for s in "mv"]
    assert all(np.array_equal(a, b) for a, b in zip(after, before))
    assert opt.iterations == 1 and opt._var_steps == [1, 1]


def test_docstring_examples_run():
    for module in (nadam_module, nadam_class_module):
        result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ----------------------------------------------------------------------------- (b) golden
# bfloat16 cases: computed op by op in the optimizer's step (refopt.reference.bf16,
# bf16_generic), replayed by tests/test_conformance.py; nadam_update takes float16/32/64
_ENTRIES = [e for e in load_manifest() if e["optimizer"] == "Nadam"
            and replayed_by_functions(e)]
_DATA = os.path.join(os.path.dirname(refopt.conformance.__file__), "conformance_data")


def _hyper(entry, conv):
    hyper = dict(nadam_defaults(conv), **entry["hyperparameters"])
    if conv.epsilon_zero_is_default and hyper["epsilon"] == 0:
        hyper["epsilon"] = 1e-7
    return hyper


def replay_max_ulp(entry):
    """Replay one golden case through nadam_update (the pipeline's weight decay by hand),
    resyncing to the recorded state before every step; return (max ulp, where)."""
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = _hyper(entry, conv)
    init, grads, params, slots = load_case(entry)
    worst, where = 0.0, "all equal"
    for i, w0 in enumerate(init):
        w = w0.copy()
        m, v = nadam_initial_state(w)
        step = 0
        for k in range(entry["steps"]):
            if k > 0:  # resync: the bound is per step
                w, m, v = (params[k - 1][i].copy(), slots["m"][k - 1][i].copy(),
                           slots["v"][k - 1][i].copy())
            g = grads[k][i]
            if g is None:
                continue
            step += 1
            t = step if conv.step_counter == "per_variable" else k + 1
            wd = hyper.get("weight_decay")
            if wd is not None and conv.nadam_form == "torch":
                if hyper.get("decoupled_weight_decay"):
                    w = decay_torch(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
                else:
                    g = l2_torch(g, w, wd)
            elif wd is not None:
                w = apply_weight_decay(w, learning_rate=hyper["learning_rate"], weight_decay=wd)
            if isinstance(g, IndexedSlices) and not conv.keras3_sparse_square:
                g = g.deduplicate()
            out = nadam_update(w, g, m, v, learning_rate=hyper["learning_rate"],
                               beta_1=hyper["beta_1"], beta_2=hyper["beta_2"],
                               epsilon=hyper["epsilon"], step=t, convention=conv,
                               momentum_decay=hyper["momentum_decay"],
                               eps_root=hyper.get("eps_root"))  # optax's option
            for name, got, want in (("param", out.param, params[k][i]),
                                    ("m", out.m, slots["m"][k][i]),
                                    ("v", out.v, slots["v"][k][i])):
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
        assert {f"{form}/nadam_f32", f"{form}/nadam_f64", f"{form}/nadam_opts_f32"} <= ids
    assert {f"{form}/nadam_sparse_f32" for form in ("tf_keras", "keras3", "keras2")} <= ids


@pytest.mark.parametrize("entry", _ENTRIES, ids=[e["id"] for e in _ENTRIES])
def test_golden_nadam_replay(entry):
    worst, where = replay_max_ulp(entry)
    assert worst <= entry["tolerance_ulp"], (
        f"{entry['id']}: {worst} ulp > tolerance {entry['tolerance_ulp']} ({where})")


@pytest.mark.parametrize("entry", [e for e in _ENTRIES if not e["convention"].startswith("optax")],
                         ids=[e["id"] for e in _ENTRIES if not e["convention"].startswith("optax")])
def test_recorded_momentum_products_bit_for_bit(entry):
    conv = get_convention(entry["convention"], **entry.get("knobs", {}))
    hyper = _hyper(entry, conv)
    _, grads, _, _ = load_case(entry)
    with np.load(os.path.join(_DATA, entry["file"])) as z:
        state = {k: z[k] for k in z.files if k.startswith("state/")}
    assert state, entry["id"]
    steps = [0] * len(grads[0])
    for k in range(entry["steps"]):
        for i, g in enumerate(grads[k]):
            steps[i] += g is not None
            key = f"state/mu_product/{k + 1}/{i}"  # torch: per parameter, float32
            if key in state:
                got = momentum_product(steps[i], beta_1=hyper["beta_1"], convention=conv,
                                       momentum_decay=hyper["momentum_decay"])
                assert got.dtype == state[key].dtype and got == state[key], (key, got)
        key = f"state/u_product/{k + 1}"  # Keras: one per optimizer, the variables' dtype
        if key in state:
            got = momentum_product(k + 1, beta_1=hyper["beta_1"], convention=conv,
                                   dtype=entry["dtype"])
            assert got.dtype == state[key].dtype and got == state[key], (key, got)
