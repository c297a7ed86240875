import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.conventions import PRESETS, get_convention

# the presets that are not optax (optax's three jit modes all have nesterov and eps_root)
OTHERS = sorted(name for name in PRESETS
                if set(PRESETS[name].differences(PRESETS["optax"])) - {"optax_jit"})
ENTRIES = {e["id"]: e for e in conformance.load_manifest()}


def problem(dtype=np.float32, steps=4, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(dtype) for s in ((5,), (3, 2))]
    grads = [[(rng.standard_normal(w.shape) * 10.0 ** rng.uniform(-4, 1)).astype(dtype)
              for w in init] for _ in range(steps)]
    return init, grads


def run(opt, init, grads):
    ws = [w.copy() for w in init]
    for row in grads:
        opt.apply_gradients([(g.copy(), w) for g, w in zip(row, ws)])
    return ws


def same_bits(xs, ys):
    return all(x.tobytes() == y.tobytes() for x, y in zip(xs, ys))


# ---------------------------------------------------------------------------------------------
# Adam(nesterov=True): optax.adam(nesterov=True)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adam_nesterov_is_optax_nadam_bit_for_bit(dtype):
    init, grads = problem(dtype)
    a = run(refopt.Adam(learning_rate=0.05, nesterov=True, convention="optax",
                        backend="reference"), init, grads)
    b = run(refopt.Nadam(learning_rate=0.05, convention="optax", backend="reference"),
            init, grads)
    plain = run(refopt.Adam(learning_rate=0.05, convention="optax", backend="reference"),
                init, grads)
    assert same_bits(a, b) and not same_bits(a, plain)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_adam_nesterov_eps_root_fast_paths_match_the_reference(backend):
    init, grads = problem(np.float32, steps=3, seed=1)
    kw = {"learning_rate": 0.05, "nesterov": True, "eps_root": 1e-6, "convention": "optax"}
    want = run(refopt.Adam(**kw, backend="reference"), init, grads)
    if backend == "cuda":
        kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
        opt = refopt.Adam(**kw, backend="cuda")
        ws = [kc.to_device(w) for w in init]
        for row in grads:
            opt.apply_gradients([(kc.to_device(g), w) for g, w in zip(row, ws)])
        got = [w.copy_to_host() for w in ws]
    else:
        got = run(refopt.Adam(**kw, backend="cpu"), init, grads)
    assert same_bits(got, want)


@pytest.mark.parametrize("conv", OTHERS)
def test_nesterov_is_refused_outside_optax_naming_the_convention(conv):
    with pytest.raises(ValueError, match=f"convention='{conv}'.*nesterov=True"):
        refopt.Adam(nesterov=True, convention=conv)


def test_nesterov_with_amsgrad_is_refused_as_optax_has_none():
    with pytest.raises(ValueError, match="amsgrad=True"):
        refopt.Adam(nesterov=True, amsgrad=True, convention="optax")


def test_adamw_nesterov_decays_inside_the_nesterov_update():
    init, grads = problem()
    kw = {"learning_rate": 0.05, "weight_decay": 0.1, "convention": "optax",
          "backend": "reference"}
    both = run(refopt.AdamW(nesterov=True, **kw), init, grads)
    assert not same_bits(both, run(refopt.AdamW(**kw), init, grads))
    assert not same_bits(both, run(refopt.Adam(nesterov=True, learning_rate=0.05,
                                               convention="optax", backend="reference"),
                                   init, grads))
    assert refopt.AdamW.from_config(refopt.AdamW(nesterov=True, **kw).get_config()).nesterov


def test_nesterov_must_be_a_bool():
    with pytest.raises(TypeError, match="nesterov"):
        refopt.Adam(nesterov=1, convention="optax")


def test_a_custom_convention_with_optax_nadam_form_takes_nesterov():
    conv = get_convention("tf_keras", nadam_form="optax")
    assert refopt.Adam(nesterov=True, convention=conv).nesterov is True


# ---------------------------------------------------------------------------------------------
# eps_root (Adam, AMSGrad, AdamW, Nadam under optax)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, kw", [(refopt.Adam, {}), (refopt.Adam, {"amsgrad": True}),
                                     (refopt.AdamW, {}), (refopt.Nadam, {}),
                                     (refopt.Adam, {"nesterov": True})])
def test_eps_root_zero_is_the_plain_update_and_nonzero_damps_small_gradients(cls, kw):
    init, grads = problem()
    tiny = [[g * np.float32(1e-3) for g in row] for row in grads]
    base = dict(learning_rate=0.01, convention="optax", backend="reference", **kw)
    plain = run(cls(**base), init, tiny)
    zero = run(cls(eps_root=0.0, **base), init, tiny)
    damped = run(cls(eps_root=1e-4, **base), init, tiny)
    assert same_bits(plain, zero)
    moved = [np.abs(d - w0).sum() for d, w0 in zip(damped, init)]
    moved_plain = [np.abs(p - w0).sum() for p, w0 in zip(plain, init)]
    assert all(a < b for a, b in zip(moved, moved_plain))


@pytest.mark.parametrize("conv", OTHERS)
def test_eps_root_is_refused_outside_optax_naming_the_convention(conv):
    with pytest.raises(ValueError, match=f"convention='{conv}'.*eps_root=1e-06"):
        refopt.Adam(eps_root=1e-6, convention=conv)


@pytest.mark.parametrize("conv", ["tf_keras", "keras3", "torch"])
def test_nadam_eps_root_is_refused_outside_optax(conv):
    with pytest.raises(ValueError, match="eps_root=1e-06"):
        refopt.Nadam(eps_root=1e-6, convention=conv)


@pytest.mark.parametrize("value, error", [(-1e-8, ValueError), (float("inf"), ValueError),
                                          ("1e-8", TypeError)])
def test_bad_eps_root_raises_naming_it(value, error):
    with pytest.raises(error, match="eps_root"):
        refopt.Adam(eps_root=value, convention="optax")


def test_nadam_reference_function_checks_eps_root():
    from refopt.reference.nadam import nadam_update

    w = np.ones(3, np.float32)
    z = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="eps_root=1e-06 with nadam_form='keras3'"):
        nadam_update(w, w, z, z, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                     step=1, convention="keras3", eps_root=1e-6)


def test_config_round_trip_keeps_optax_options():
    opt = refopt.Adam(learning_rate=0.01, nesterov=True, eps_root=1e-7, convention="optax")
    config = opt.get_config()
    assert config["nesterov"] is True and config["eps_root"] == 1e-7
    assert refopt.Adam.from_config(config).get_config() == config
    assert "nesterov" not in refopt.Adam().get_config()  # Keras' config keys unchanged
    assert "eps_root" not in refopt.Nadam(convention="optax", learning_rate=0.1).get_config()
    nadam = refopt.Nadam(learning_rate=0.1, eps_root=1e-7, convention="optax")
    assert refopt.Nadam.from_config(nadam.get_config()).eps_root == 1e-7


# ---------------------------------------------------------------------------------------------
# The golden cases recorded for these options exist and say bit-identical
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ["optax/adam_nesterov_f32", "optax/adam_nesterov_f64",
                                  "optax/adamw_nesterov_f32",
                                  "optax/adam_eps_root_f32", "optax/amsgrad_eps_root_f32",
                                  "optax/adamw_eps_root_f32", "optax/nadam_eps_root_f32",
                                  "optax/adam_nesterov_eps_root_f64",
                                  "optax/adam_sched_join_f32"])
def test_golden_cases_of_the_options_are_recorded_bit_identical(case):
    entry = ENTRIES[case]
    assert entry["framework"] == "optax" and entry["tolerance_ulp"] == 0
    r = conformance.replay(dict(entry, steps=3), backend="reference")
    assert r.passed and r.max_ulp == 0, r.detail
