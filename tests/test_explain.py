import os
from typing import ClassVar

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.cli import main
from refopt.conventions import PRESETS, get_convention
from refopt.testing.explain import (
    SLIPS,
    Recording,
    adam_step_with_slips,
    explain,
    load_recording,
    record_candidate,
)
from refopt.testing.golden import make_trajectory, write_golden

FAST = {"steps": 8, "shapes": ((5,), (4, 3))}  # enough steps for every slip to show


# --------------------------------------------------------------------------- naive ports
# Adam as a port to NumPy would write it from tf.keras' formulas, with one switch per slip.
def numpy_adam(*, eps_in_root=False, no_bias=False, moments="keras", t_offset=0,
               amsgrad_unused=False, f32_powers=False, l2=False, lr_factor=1):
    def step(params, grads, state, hyper, t):
        out_p, out_s = [], []
        for w, g, s in zip(params, grads, state):
            dt = w.dtype.type
            b1, b2 = hyper["beta_1"], hyper["beta_2"]
            lr = dt(np.float32(hyper["learning_rate"])) * dt(lr_factor)
            eps = dt(hyper["epsilon"])
            if l2:
                g = g + w * dt(hyper["weight_decay"])
            c1, c2 = dt(1 - b1), dt(1 - b2)
            m, v = s["m"], s["v"]
            if moments == "keras":
                m = m + (g - m) * c1
                v = v + (g * g - v) * c2
            else:
                m = dt(np.float32(b1)) * m + c1 * g
                v = dt(np.float32(b2)) * v + c2 * (g * g)
            tt = t + t_offset
            if f32_powers:
                p1 = dt(np.float32(b1) ** np.float32(tt))
                p2 = dt(np.float32(b2) ** np.float32(tt))
            else:
                p1, p2 = dt(np.float32(b1)) ** dt(tt), dt(np.float32(b2)) ** dt(tt)
            with np.errstate(all="ignore"):
                alpha = lr if no_bias else lr * np.sqrt(dt(1) - p2) / (dt(1) - p1)
            new = {"m": m, "v": v}
            d = v
            if "vhat" in s:
                new["vhat"] = np.maximum(s["vhat"], v)
                if not amsgrad_unused:
                    d = new["vhat"]
            denom = np.sqrt(d + eps) if eps_in_root else np.sqrt(d) + eps
            out_p.append(w - (m * alpha) / denom)
            out_s.append(new)
        return out_p, out_s

    return step


def numpy_sgd(*, form="keras", ignore_nesterov=False):
    def step(params, grads, state, hyper, t):
        out_p, out_s = [], []
        for w, g, s in zip(params, grads, state):
            dt = w.dtype.type
            lr, mu = dt(np.float32(hyper["learning_rate"])), dt(np.float32(hyper["momentum"]))
            nesterov = hyper["nesterov"] and not ignore_nesterov
            if form == "keras":  # velocity m = m*mu - g*lr; w += m
                m = (-g) * lr + s["m"] * mu
                w = w + ((-g) * lr + m * mu) if nesterov else w + m
            else:  # TF1's accumulator a = a*mu + g; w -= a*lr
                m = s["m"] * mu + g
                w = w - (g * lr + m * mu * lr) if nesterov else w - m * lr
            out_p.append(w)
            out_s.append({"m": m})
        return out_p, out_s

    return step


class StatefulNaiveAdam:
    """The same port as a stateful optimizer, with torch's slot names and no AMSGrad slot."""

    slot_map: ClassVar[dict] = {"m": "exp_avg", "v": "exp_avg_sq", "vhat": "max_exp_avg_sq"}

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 amsgrad=False, **kwargs):
        self.hyper = {"learning_rate": learning_rate, "beta_1": beta_1, "beta_2": beta_2,
                      "epsilon": epsilon}
        self.step_fn = numpy_adam(eps_in_root=True)
        self.state, self.t = {}, 0

    def apply_gradients(self, pairs):
        self.t += 1
        for g, w in pairs:
            s = self.state.setdefault(id(w), {"m": np.zeros_like(w), "v": np.zeros_like(w)})
            (new_w,), (new_s,) = self.step_fn([w], [g], [s], self.hyper, self.t)
            np.copyto(w, new_w)
            self.state[id(w)] = new_s

    def get_slot(self, var, name):
        return self.state[id(var)][{"exp_avg": "m", "exp_avg_sq": "v"}[name]]


def own_convention_matches(result, entry):
    """The case's own convention (with its knobs) is among the simplest matching settings."""
    preset = get_convention(entry["convention"])
    knobs = {k: v for k, v in (entry.get("knobs") or {}).items()  # the preset's own values
             if getattr(preset, k) != v}                          # are the preset
    fewest = min((c.changes for c in result.candidates if c.matches), default=None)
    names = [d for c in result.candidates if c.matches and c.changes == fewest
             for d in (c.description,) + c.same_as]
    if knobs:
        return any(d.startswith(entry["convention"] + " ") and all(k in d for k in knobs)
                   for d in names)
    return entry["convention"] in names


# --------------------------------------------------------------------------- Adam with slips
@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("amsgrad", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_adam_step_without_slips_is_refopts_adam(preset, amsgrad, dtype):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 3)).astype(dtype)
    opt = refopt.Adam(learning_rate=0.01, epsilon=1e-7, amsgrad=amsgrad, convention=preset,
                      backend="reference")
    ref_w = w.copy()
    m, v = np.zeros_like(w), np.zeros_like(w)
    vhat = np.zeros_like(w) if amsgrad else None
    for t in range(1, 6):
        g = (0.1 * rng.standard_normal(w.shape)).astype(dtype)
        opt.apply_gradients([(g, ref_w)])
        w, m, v, vhat = adam_step_with_slips(
            w, g, m, v, vhat, learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
            step=t, convention=PRESETS[preset])
        np.testing.assert_array_equal(w, ref_w)
        np.testing.assert_array_equal(m, opt.get_slot(ref_w, "m"))
        np.testing.assert_array_equal(v, opt.get_slot(ref_w, "v"))
        if amsgrad:
            np.testing.assert_array_equal(vhat, opt.get_slot(ref_w, "vhat"))


def test_adam_step_slips_change_the_numbers():
    w = np.array([1.0, -2.0, 0.5], np.float64)
    g = np.array([0.1, 0.2, -0.3], np.float64)
    z = np.zeros_like(w)
    big = np.full(3, 0.5)  # an AMSGrad maximum above v, so that using it matters
    kw = {"learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "step": 2,
          "convention": PRESETS["torch"]}
    plain = adam_step_with_slips(w, g, z, z, big, **kw)[0]
    for flag in ("epsilon_inside_root", "no_bias_correction", "float32_powers",
                 "amsgrad_max_unused"):
        slipped = adam_step_with_slips(w, g, z, z, big, slips={flag}, **kw)[0]
        assert not np.array_equal(slipped, plain), flag


# --------------------------------------------------------------------------- wrong ports
def test_the_naive_port_without_slips_is_tf_keras():
    result = explain(numpy_adam(), **FAST)
    assert result.match is not None and result.match.changes == 0
    assert "tf_keras" in result.match.presets and result.match.max_ulp == 0
    assert result.summary().startswith("matches tf_keras")


@pytest.mark.parametrize("port, options, knobs, slips", [
    (numpy_adam(eps_in_root=True), {}, {}, {"epsilon_inside_root"}),
    (numpy_adam(no_bias=True), {}, {}, {"no_bias_correction"}),
    (numpy_adam(moments="ema"), {}, {"moment_update": "ema"}, set()),
    (numpy_adam(t_offset=1), {}, {}, {"step_plus_one"}),
    (numpy_adam(t_offset=-1), {}, {}, {"step_minus_one"}),
    (numpy_adam(f32_powers=True), {"dtype": "float64"}, {}, {"float32_powers"}),
    (numpy_adam(amsgrad_unused=True), {"config": {"amsgrad": True}}, {},
     {"amsgrad_max_unused"}),
    (numpy_adam(l2=True), {"optimizer": "AdamW", "config": {"weight_decay": 0.05}}, {},
     {"coupled_weight_decay"}),
    # two slips at once: found by the pairs
    (numpy_adam(eps_in_root=True, no_bias=True), {}, {},
     {"epsilon_inside_root", "no_bias_correction"}),
], ids=["eps_in_root", "no_bias", "ema_moments", "t_plus_1", "t_minus_1", "f32_powers",
        "amsgrad_unused", "adamw_coupled", "two_slips"])
def test_a_port_with_a_slip_is_explained_by_that_slip(port, options, knobs, slips):
    result = explain(port, **{**FAST, **options})
    match = result.match
    assert match is not None, result.report()
    assert match.preset == "tf_keras"
    assert match.knobs == knobs and set(match.slips) == slips
    assert match.max_ulp == 0 and match.complete
    assert result.summary().startswith(f"matches {match.description} (0 ulp over 8 steps")


def with_average_from_zero(step_fn):
    """The port of step_fn with a weight average that starts at zero (tf-keras copies)."""
    def step(params, grads, state, hyper, t):
        new_params, new_state = step_fn(params, grads, state, hyper, t)
        for w, s, new in zip(new_params, state, new_state):
            dt = w.dtype.type
            avg = np.zeros_like(w) if t == 1 else s["average"]
            new["average"] = dt(hyper["ema_momentum"]) * avg + dt(1 - hyper["ema_momentum"]) * w
        return new_params, new_state

    return step


def with_global_clip_always(step_fn):
    """The port of step_fn rescaling the gradients to global_clipnorm even when below it."""
    def step(params, grads, state, hyper, t):
        c = grads[0].dtype.type(hyper["global_clipnorm"])
        norm = np.sqrt(sum(np.sum(g * g) for g in grads))
        return step_fn(params, [g * c / norm for g in grads], state, hyper, t)

    return step


@pytest.mark.parametrize("port, config, slip", [
    (with_average_from_zero(numpy_adam()), {"use_ema": True}, "ema_starts_at_zero"),
    (with_global_clip_always(numpy_adam()), {"global_clipnorm": 10.0}, "clip_always_rescales"),
], ids=["ema", "clip"])
def test_pipeline_slips(port, config, slip):
    result = explain(port, config=config, steps=5, shapes=((5,), (4, 3)))
    assert result.match is not None, result.report()
    assert result.match.slips == (slip,) and result.match.preset == "tf_keras"


def test_the_nearest_setting_is_reported_when_nothing_matches():
    result = explain(numpy_adam(lr_factor=2), pairs=False, **FAST)
    assert result.match is None
    best = result.best
    assert best.max_ulp > 0 and not best.matches
    assert best.first_divergence.step == 1
    assert best.first_divergence.array in ("params", "m", "v")
    assert result.summary().startswith("no exact match; nearest: ")
    assert "first diverges at step 1" in result.summary()


def test_sgd_ports():
    result = explain(numpy_sgd(ignore_nesterov=True), optimizer="SGD",
                     config={"momentum": 0.9, "nesterov": True}, **FAST)
    assert result.match is not None and result.match.slips == ("nesterov_flipped",)
    assert result.match.preset == "tf_keras"
    result = explain(numpy_sgd(form="tf1"), optimizer="SGD", config={"momentum": 0.9},
                     **FAST)
    assert result.match is not None and "tf1" in result.match.presets


def test_a_stateful_port_without_an_amsgrad_slot():
    rec = record_candidate(StatefulNaiveAdam, config={"amsgrad": True}, **FAST)
    assert "vhat" not in rec.slots and set(rec.slots) == {"m", "v"}
    assert any("'vhat'" in note for note in rec.notes)
    # the port ignores amsgrad: what reproduces it is plain Adam, i.e. the max never used
    result = explain(rec)
    assert result.match is not None
    assert set(result.match.slips) == {"epsilon_inside_root", "amsgrad_max_unused"}
    assert "no slot 'vhat'" in result.report()


def test_a_candidate_that_raises():
    def broken(params, grads, state, hyper, t):
        raise ZeroDivisionError("oops")

    with pytest.raises(RuntimeError, match="raised at step 1: ZeroDivisionError: oops"):
        explain(broken, **FAST)


# --------------------------------------------------------------------------- framework cases
# One case per framework family (and a stated-tolerance case, a knob case); all 309: slow.
REPRESENTATIVE = ["tf_keras/adam_f32", "keras3/adamw_f32", "keras2/sgd_nesterov_f32",
                  "tf1/adam_f32", "torch/amsgrad_fused_f32", "optax/adam_f64",
                  "torch/adam_default_f32", "keras3/adam_sparse_dup_f32"]
MANIFEST = {e["id"]: e for e in conformance.load_manifest()}


@pytest.mark.parametrize("case", REPRESENTATIVE)
def test_a_framework_case_is_explained_by_its_own_convention(case):
    entry = MANIFEST[case]
    result = explain(case)
    assert result.match is not None, result.report()
    assert result.tolerance_ulp == entry["tolerance_ulp"]
    assert own_convention_matches(result, entry), result.report()


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("REFOPT_EXPLAIN_ALL") != "1",
                    reason="all 309 cases take about 4 CPU minutes: set REFOPT_EXPLAIN_ALL=1")
def test_every_framework_case_is_explained_by_its_own_convention():
    wrong = [case for case, entry in sorted(MANIFEST.items())
             if not own_convention_matches(explain(entry), entry)]
    assert not wrong


def test_a_bundled_case_file_and_its_id_read_the_same():
    entry = MANIFEST["tf1/adam_f32"]
    path = str(conformance._data() / entry["file"])
    by_file, by_id = load_recording(path), load_recording("tf1/adam_f32")
    assert by_file.declared == by_id.declared == "tf1"
    np.testing.assert_array_equal(by_file.params[-1][0], by_id.params[-1][0])


@pytest.mark.parametrize("fmt", ["npz", "json"])
def test_a_golden_file_is_explained_by_its_convention(tmp_path, fmt):
    trajectory = make_trajectory(optimizer="Adam", convention="torch", steps=6,
                                 shapes=((4,), (2, 3)), seed=5)
    path = tmp_path / f"g.{fmt}"
    write_golden(trajectory, **{f"{fmt}_path": path})
    result = explain(path)
    assert result.match is not None and "torch" in result.match.presets
    assert result.declared == "torch" and result.steps == 6


# --------------------------------------------------------------------------- errors
def test_bad_sources_and_arguments():
    with pytest.raises(FileNotFoundError, match="no/such/case"):
        explain("no/such/case")
    with pytest.raises(TypeError, match="source=123"):
        explain(123)
    with pytest.raises(TypeError, match="candidate implementation only"):
        explain("tf1/adam_f32", steps=3)
    with pytest.raises(ValueError, match="top=0"):
        explain("tf1/adam_f32", top=0)
    with pytest.raises(ValueError, match="tolerance_ulp=-1"):
        explain("tf1/adam_f32", tolerance_ulp=-1)
    w = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="Received: 2 and 1 steps"):
        Recording("Adam", {}, "float32", [w], [[w], [w]], [[w]])


def test_slips_are_documented():
    for name, slip in SLIPS.items():
        assert slip.name == name and len(slip.text) > 20


# --------------------------------------------------------------------------- CLI
PORT = '''
import numpy as np

def adam(params, grads, state, hyper, t):
    out_p, out_s = [], []
    for w, g, s in zip(params, grads, state):
        lr, eps = np.float32(hyper["learning_rate"]) * np.float32({factor}), np.float32(hyper["epsilon"])
        m = s["m"] + (g - s["m"]) * np.float32(1 - hyper["beta_1"])
        v = s["v"] + (g * g - s["v"]) * np.float32(1 - hyper["beta_2"])
        p1 = np.float32(hyper["beta_1"]) ** np.float32(t)
        p2 = np.float32(hyper["beta_2"]) ** np.float32(t)
        alpha = lr * np.sqrt(np.float32(1) - p2) / (np.float32(1) - p1)
        out_p.append(w - (m * alpha) / np.sqrt(v + eps))
        out_s.append({{"m": m, "v": v}})
    return out_p, out_s
'''


def test_cli_explains_a_case(capsys):
    assert main(["explain", "keras2/adam_f32", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "MATCH     matches keras2 (0 ulp over 20 steps)" in out
    assert " 2. " in out and " 3. " not in out


def test_cli_explains_a_candidate(tmp_path, capsys):
    (tmp_path / "port.py").write_text(PORT.format(factor=1))
    (tmp_path / "bad.py").write_text(PORT.format(factor=3))
    assert main(["explain", f"{tmp_path / 'port.py'}:adam", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "matches tf_keras with slip epsilon_inside_root (0 ulp over 5 steps)" in out
    assert "slip epsilon_inside_root: epsilon inside the square root" in out
    assert main(["explain", f"{tmp_path / 'bad.py'}:adam", "--steps", "5", "--no-pairs"]) == 1
    assert "NO MATCH  no exact match; nearest: " in capsys.readouterr().out


def test_cli_usage_errors(tmp_path, capsys):
    assert main(["explain", "no/such/case"]) == 2
    assert "no such file or bundled golden case" in capsys.readouterr().err
    assert main(["explain", "tf1/adam_f32", "--set", "amsgrad=true"]) == 2
    assert "only for a candidate" in capsys.readouterr().err
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    assert main(["explain", str(junk)]) == 2
    assert "not a refopt golden file" in capsys.readouterr().err
