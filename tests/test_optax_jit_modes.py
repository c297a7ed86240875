import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import refopt
from refopt.conventions import PRESETS, get_convention

MODES = ("optax", "optax_eager", "optax_jit_step")


def f32(*values):
    return np.array(values, np.float32)


def run(cls, kwargs, convention, backend, init, grads):
    variables = [np.array(w, copy=True) for w in init]
    opt = cls(convention=convention, backend=backend, **kwargs)
    for row in grads:
        opt.apply_gradients(list(zip(row, variables)))
    slots = {name: [np.array(opt.get_slot(v, name)) for v in variables]
             for name in opt.slot_names}
    return variables, slots


def test_the_three_presets_differ_only_in_optax_jit():
    assert PRESETS["optax"].optax_jit == "update"
    assert PRESETS["optax_eager"].differences(PRESETS["optax"]) == {
        "optax_jit": ("eager", "update")}
    assert PRESETS["optax_jit_step"].differences(PRESETS["optax"]) == {
        "optax_jit": ("step", "update")}
    assert get_convention("optax", optax_jit="step").knobs() == {
        **PRESETS["optax_jit_step"].knobs(), "name": "optax",
        "framework": PRESETS["optax"].framework}


def test_unknown_jit_mode_is_refused_naming_the_knob():
    with pytest.raises(ValueError, match=r"optax_jit.*Received: optax_jit='jit'"):
        get_convention("optax", optax_jit="jit")


# Values recorded from optax 0.2.8 / jax 0.10.2 on XLA:CPU (not from refopt): optax.adam(0.1),
# two one-element leaves, one step; optax.radam(0.1), the same gradient six times. Each mode's
# new first weight; conformance/README.md's table "optax's three jit modes".
ADAM_W0 = {"optax_eager": "0x1.3755cp-6", "optax": "0x1.3755c8p-6",
           "optax_jit_step": "0x1.3755cap-6"}
RADAM_W0 = {"optax_eager": "0x1.7eb178p-1", "optax": "0x1.7eaf7cp-1",
            "optax_jit_step": "0x1.7eaf7ap-1"}


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("convention", MODES)
def test_adam_one_step_has_each_modes_framework_value(convention, backend):
    init = [f32(-0.08099695295095444), f32(-0.641957700252533)]
    grads = [[f32(-0.9083381295204163), f32(-0.384430468082428)]]
    w, _ = run(refopt.Adam, dict(learning_rate=0.1), convention, backend, init, grads)
    assert float(w[0][0]) == float.fromhex(ADAM_W0[convention])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("convention", MODES)
def test_radam_eager_rectifier_takes_square_and_multiply_power(convention, backend):
    init = [f32(1.0), f32(-2.0)]
    grads = [[f32(0.5), f32(0.25)]] * 6
    w, _ = run(refopt.RAdam, dict(learning_rate=0.1), convention, backend, init, grads)
    assert float(w[0][0]) == float.fromhex(RADAM_W0[convention])


# (class, keywords): every elementwise optax optimizer refopt reproduces in each mode
OPTIMIZERS = [
    (refopt.Adam, dict(learning_rate=0.1)),
    (refopt.Adam, dict(learning_rate=0.1, amsgrad=True)),
    (refopt.Adam, dict(learning_rate=0.1, nesterov=True)),
    (refopt.AdamW, dict(learning_rate=0.1, weight_decay=0.5)),
    (refopt.SGD, dict(learning_rate=0.1, momentum=0.9, nesterov=True)),
    (refopt.SGD, dict(learning_rate=0.1, global_clipnorm=0.5)),
    (refopt.RMSprop, dict(learning_rate=0.1, momentum=0.5, centered=True)),
    (refopt.RMSprop, dict(learning_rate=0.1)),
    (refopt.Adagrad, dict(learning_rate=0.1)),
    (refopt.Adadelta, dict(learning_rate=1.0)),
    (refopt.Adamax, dict(learning_rate=0.1)),
    (refopt.Nadam, dict(learning_rate=0.1)),
    (refopt.Lion, dict(learning_rate=0.1)),
    (refopt.RAdam, dict(learning_rate=0.1)),
]

_values = arrays(np.float32, 6, elements=st.floats(-4, 4, width=32))


@settings(max_examples=4, deadline=None)
@given(w=_values, g1=_values, g2=_values)
@pytest.mark.parametrize("convention", ["optax_eager", "optax_jit_step"])
@pytest.mark.parametrize("cls,kwargs", OPTIMIZERS, ids=lambda x: getattr(x, "__name__", ""))
def test_cpu_backend_is_bit_identical_to_the_reference(cls, kwargs, convention, w, g1, g2):
    init = [w[:4], w[4:]]  # two leaves, as the recorded cases
    grads = [[g1[:4], g1[4:]], [g2[:4], g2[4:]]]
    ref_w, ref_s = run(cls, kwargs, convention, "reference", init, grads)
    cpu_w, cpu_s = run(cls, kwargs, convention, "cpu", init, grads)
    for a, b in zip(ref_w, cpu_w):
        np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32))
    for name in ref_s:
        for a, b in zip(ref_s[name], cpu_s[name]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cls,kwargs", [
    (refopt.Adam, dict(learning_rate=0.1)),
    (refopt.SGD, dict(learning_rate=0.1, momentum=0.9)),
], ids=["adam", "sgd"])
def test_modes_change_the_bits_but_not_the_math(cls, kwargs):
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(64).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    grads = [[rng.standard_normal(64).astype(np.float32),
              rng.standard_normal(5).astype(np.float32)] for _ in range(3)]
    out = {c: run(cls, kwargs, c, "reference", init, grads)[0][0] for c in MODES}
    # each mode rounds differently somewhere on 64 elements ...
    assert not np.array_equal(out["optax_eager"], out["optax"])
    assert not np.array_equal(out["optax_jit_step"], out["optax"])
    # ... by a few ulp only (after three steps)
    for c in ("optax_eager", "optax_jit_step"):
        ulp = np.abs(out[c].view(np.int32).astype(np.int64) - out["optax"].view(np.int32))
        assert ulp.max() <= 64


# the recorded mode cases on backend="cuda" (numba's simulator, tests/conftest.py): the
# first steps of one case per new branch (the whole set: `refopt conformance --backend cuda
# --filter optax_`)
CUDA_CASES = ["optax_eager/adamw_f32", "optax_jit_step/adam_nesterov_f32",
              "optax_eager/clip_by_global_norm_nonfinite_f32", "optax_eager/radam_f32",
              "optax_jit_step/lion_f32"]


@pytest.mark.parametrize("case", CUDA_CASES)
def test_recorded_modes_replay_on_cuda(case, monkeypatch):
    from refopt import conformance

    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    entry = next(e for e in conformance.load_manifest() if e["id"] == case)
    assert entry["tolerance_ulp"] == 0
    steps = 8 if "radam" in case else 4  # RAdam's eager rectifier starts at step 6
    r = conformance.replay(dict(entry, steps=steps), backend="cuda")
    assert r.passed and r.max_ulp == 0, r.detail
