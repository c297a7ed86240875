"""What a new user tripped on (issue 15 item 7), each kept fixed."""

import inspect
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import refopt
from refopt import reference as R
from refopt.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]

SMALL_DEMO = ["demo", "--max-tokens", "3000", "--epochs", "1", "--quiet",
              "--no-compare"]


# ------------------------------------------------------------------ refopt golden --out folder

def test_golden_out_creates_missing_folders(tmp_path, capsys):
    prefix = tmp_path / "golden" / "nested" / "adam"
    assert main(["golden", "--steps", "2", "--out", str(prefix)]) == 0
    doc = json.loads((tmp_path / "golden" / "nested" / "adam.json").read_text())
    assert doc["steps"] == 2 and (tmp_path / "golden" / "nested" / "adam.npz").is_file()


def test_golden_out_under_a_file_is_one_error_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["golden", "--out", str(blocker / "adam")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refopt golden: error: --out") and "cannot create directory" in err
    assert err.count("\n") == 1


def test_golden_help_names_every_convention(capsys):
    assert main(["golden", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for name in ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax"):
        assert name in out
    assert "missing folders are created" in out


# ------------------------------------------------- a backend without a device: one error line

@pytest.fixture
def no_gpu(monkeypatch):
    """REFOPT_BACKEND=cuda on a machine where backend='cuda' cannot start."""
    from refopt.optimizers import base

    real = base.get_executor

    def get_executor(backend):
        if backend == "cuda":
            raise RuntimeError("backend='cuda' needs an NVIDIA GPU (test stand-in)")
        return real(backend)

    monkeypatch.setattr(base, "get_executor", get_executor)
    monkeypatch.setenv("REFOPT_BACKEND", "cuda")


def test_golden_and_check_validate_on_the_reference_backend(no_gpu, tmp_path, capsys):
    assert main(["golden", "--steps", "1", "--out", str(tmp_path / "g")]) == 0
    capsys.readouterr()
    # refopt check validates --set first (a refopt optimizer), then imports the candidate
    assert main(["check", "no_such_module_here:Port", "--set", "amsgrad=true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refopt check: error: cannot import no_such_module_here")
    assert err.count("\n") == 1


def test_demo_backend_cuda_is_one_error_line(capsys):
    assert main(["demo", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refopt demo: error: --backend cuda") and err.count("\n") == 1


# ---------------------------------------------------------------- Hypothesis not installed

_WITHOUT_HYPOTHESIS = r"""
import json, sys
sys.modules["hypothesis"] = None  # as if not installed: importing it raises ModuleNotFoundError
import numpy as np
import refopt
from refopt.testing import Trajectory, assert_conforms, run_reference
out = {}
try:
    import refopt.testing.strategies
except ModuleNotFoundError as exc:
    out["strategies"] = [str(exc), exc.name]
try:
    assert_conforms(refopt.Adam, max_examples=1)
except ModuleNotFoundError as exc:
    out["assert_conforms"] = [str(exc), exc.name]
t = Trajectory("SGD", {"learning_rate": 0.5}, "float32", [np.ones(2, np.float32)],
               [[np.ones(2, np.float32)]])
out["run_reference"] = run_reference(t, backend="reference")[1].params[0].tolist()
print(json.dumps(out))
"""


def test_refopt_testing_without_hypothesis_names_the_extra():
    # In a subprocess: pytest's Hypothesis plugin needs Hypothesis in this one.
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _WITHOUT_HYPOTHESIS], check=False,
                          capture_output=True,
                          text=True, cwd=REPO_ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    for what in ("strategies", "assert_conforms"):
        message, name = out[what]
        assert name == "hypothesis"
        assert f"refopt.testing.{what} needs Hypothesis" in message
        assert 'pip install "refopt[testing]"' in message
    assert out["run_reference"] == [0.5, 0.5]  # the rest works without it


# -------------------------------------------------------- a candidate without refopt's slot

class _AdamWithoutVhat:
    """refopt's Adam, except that it keeps no AMSGrad maximum under that name."""

    def __init__(self, **config):
        self.opt = refopt.Adam(**config, backend="reference")

    def apply_gradients(self, grads_and_vars):
        return self.opt.apply_gradients(grads_and_vars)

    def get_slot(self, var, name):
        if name == "vhat":
            raise KeyError(name)
        return self.opt.get_slot(var, name)


def _step_without_vhat(params, grads, state, hyper, t):
    return params, [{k: v for k, v in s.items() if k != "vhat"} for s in state]


@pytest.mark.parametrize("candidate", [_AdamWithoutVhat, _step_without_vhat])
def test_a_missing_slot_is_a_hint_not_a_divergence(candidate):
    from refopt.testing import ConformanceError, assert_conforms

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match=r"has no slot 'vhat'.*slot_map=\{'vhat': "
                           r"'max_exp_avg_sq'\}.*slot_map=\{'vhat': None\}") as info:
            assert_conforms(candidate, config={"amsgrad": True}, max_examples=2, steps=1)
    assert not isinstance(info.value, ConformanceError)


def test_a_missing_slot_mapped_to_none_conforms():
    from refopt.testing import assert_conforms

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_conforms(_AdamWithoutVhat, config={"amsgrad": True}, slot_map={"vhat": None},
                        max_examples=2, steps=1)


def test_refopt_check_reports_a_missing_slot_in_one_line(tmp_path, monkeypatch, capsys):
    module = tmp_path / "port_without_vhat.py"
    module.write_text(
        "import refopt\n"
        "class Port:\n"
        "    def __init__(self, **config):\n"
        "        self.opt = refopt.Adam(**config, backend='reference')\n"
        "    def apply_gradients(self, pairs):\n"
        "        return self.opt.apply_gradients(pairs)\n"
        "    def get_slot(self, var, name):\n"
        "        return {'m': self.opt.get_slot(var, 'm'), 'v': self.opt.get_slot(var, 'v')}[name]\n"
    )
    assert main(["check", f"{module}:Port", "--set", "amsgrad=true", "--max-examples", "2",
                 "--steps", "1"]) == 2
    captured = capsys.readouterr()
    assert "DIVERGES" not in captured.out
    assert captured.err.startswith("refopt check: error: candidate Port has no slot 'vhat'")
    assert "--slot-map REF=NAME" in captured.err and captured.err.count("\n") == 1


# ------------------------------- the reference functions refuse what the classes refuse, alike

def _z():
    return np.zeros(3, np.float32)


def _g():
    return np.full(3, 0.5, np.float32)


# (reference function with valid arguments, its class's constructor keyword arguments)
REFERENCE_PAIRS = {
    "Adam": (lambda **kw: R.adam_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "step": 1,
        **kw}), {}),
    "LazyAdam": (lambda **kw: R.lazy_adam_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "step": 1,
        **kw}), {}),
    "SGD": (lambda **kw: R.sgd_update(_z(), _g(), _z(), **{
        "learning_rate": 0.01, "momentum": 0.9, **kw}), {}),
    "RMSprop": (lambda **kw: R.rmsprop_update(_z(), _g(), _z(), **{
        "learning_rate": 0.01, "rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False,
        **kw}), {}),
    "Adagrad": (lambda **kw: R.adagrad_update(_z(), _g(), _z(), **{
        "learning_rate": 0.01, "epsilon": 1e-7, **kw}), {}),
    "Adadelta": (lambda **kw: R.adadelta_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "rho": 0.95, "epsilon": 1e-7, **kw}), {}),
    "Adamax": (lambda **kw: R.adamax_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, **kw}), {}),
    "Nadam": (lambda **kw: R.nadam_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "step": 1,
        **kw}), {}),
    "Lion": (lambda **kw: R.lion_update(_z(), _g(), _z(), **{"learning_rate": 0.01, **kw}), {}),
    "Lamb": (lambda **kw: R.lamb_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-6, "step": 1,
        "convention": "keras3", **kw}), {"convention": "keras3"}),
    "Ftrl": (lambda **kw: R.ftrl_update(_z(), _g(), _z() + 0.1, _z(), **{
        "learning_rate": 0.01, **kw}), {}),
    "RAdam": (lambda **kw: R.radam_update(_z(), _g(), _z(), _z(), **{
        "learning_rate": 0.01, "convention": "torch", **kw}), {"convention": "torch"}),
    "ASGD": (lambda **kw: R.asgd_update(_z(), _g(), _z(), **{
        "learning_rate": 0.01, "lambd": 1e-4, "alpha": 0.75, "t0": 1e6, "step": 1, "eta": 0.01,
        "mu": 1.0, "convention": "torch", **kw}), {"convention": "torch"}),
}

BAD_VALUES = {
    "learning_rate": [-0.1, float("nan"), float("inf"), "0.1", True, np.array(0.1)],
    "beta_1": [1.0, -0.5, float("nan"), "0.9", True, np.array(0.9)],
    "beta_2": [1.5, -0.5, float("inf"), "0.9"],
    "epsilon": [-1e-7, float("inf"), "1e-7", False, np.array(1e-7)],
}


def _cases():
    for name in REFERENCE_PAIRS:
        for hp, values in BAD_VALUES.items():
            if hp not in inspect.signature(getattr(refopt, name)).parameters:
                continue
            if name == "Lion" and hp == "beta_1" and values is BAD_VALUES["beta_1"]:
                values = [v for v in values if v != 1.0]  # Lion's beta_1 is in (0, 1]
            for v in values:
                yield pytest.param(name, hp, v, id=f"{name}-{hp}={v!r}")


def _raised(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            call()
        except (TypeError, ValueError) as exc:
            return type(exc), str(exc)
    return None, None


@pytest.mark.parametrize(("name", "hp", "value"), list(_cases()))
def test_reference_function_and_class_refuse_alike(name, hp, value):
    fn, class_kwargs = REFERENCE_PAIRS[name]
    assert _raised(fn) == (None, None)  # the valid call works
    cls = getattr(refopt, name)
    ref_type, ref_msg = _raised(lambda: fn(**{hp: value}))
    cls_type, _ = _raised(lambda: cls(**{hp: value}, backend="reference", **class_kwargs))
    assert cls_type is not None, "the class accepts it"
    assert ref_type is cls_type, ref_msg
    assert f"`{hp}`" in ref_msg and "Received" in ref_msg


def _stores_the_rate_in_float32(name):
    from refopt.conventions import get_convention

    _, class_kwargs = REFERENCE_PAIRS[name]
    return get_convention(class_kwargs.get("convention", "tf_keras")).learning_rate_cast == "float32"


@pytest.mark.parametrize("name", [n for n in REFERENCE_PAIRS if _stores_the_rate_in_float32(n)])
def test_a_rate_not_finite_in_float32_is_refused_alike(name):
    fn, class_kwargs = REFERENCE_PAIRS[name]
    cls = getattr(refopt, name)
    for call in (lambda: fn(learning_rate=1e40),
                 lambda: cls(learning_rate=1e40, backend="reference", **class_kwargs)):
        kind, message = _raised(call)
        assert kind is ValueError and "`learning_rate` must be finite in float32" in message
        assert "Received: learning_rate=1e+40" in message
    assert _raised(lambda: fn(learning_rate=3e38)) == (None, None)  # below float32's max


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan"), "0.5", True, np.array(0.5)])
def test_ema_update_refuses_an_ema_momentum_like_the_classes(value):
    ref_type, ref_msg = _raised(lambda: R.ema_update(_z(), _g(), ema_momentum=value))
    cls_type, cls_msg = _raised(lambda: refopt.Adam(use_ema=True, ema_momentum=value,
                                                    backend="reference"))
    assert ref_type is cls_type is not None and ref_msg == cls_msg
    assert R.ema_update(_z(), _g(), ema_momentum=1).dtype == _z().dtype  # 1 and 0: the ends


def test_weight_decay_reference_refuses_a_negative_learning_rate_like_the_classes():
    with pytest.raises(ValueError, match=r"`learning_rate` must be >= 0.*learning_rate=-0.1"):
        R.apply_weight_decay(_g(), learning_rate=-0.1, weight_decay=0.01)
    with pytest.raises(ValueError, match=r"`weight_decay` must be >= 0"):
        R.apply_weight_decay(_g(), learning_rate=0.1, weight_decay=-0.01)
    with pytest.raises(ValueError, match=r"weight_decay.*>= 0"):
        refopt.Adam(weight_decay=-0.01, backend="reference")


def test_the_optimizers_and_the_reference_share_one_check():
    from refopt.optimizers import base
    from refopt.reference import _common

    assert base.check_real is _common.check_real


# ------------------------------------------------------- refopt conformance, full columns

def test_conformance_prints_every_framework_package(capsys):
    assert main(["conformance", "--filter", "keras2/lazyadam_f32"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("keras2/"))
    assert "keras 2.15.0, tensorflow 2.15.1, tensorflow_addons 0.23.0 " in line
    assert line.rstrip().endswith("pass")


# ---------------------------------------------------- the demo says when it is undertrained

def test_mean_cosine_similarity_by_hand():
    from refopt.demo import mean_cosine_similarity

    # pairs: (x, y) 0, (x, x+y) 1/sqrt(2), (y, x+y) 1/sqrt(2); the zero row is left out
    e = np.array([[2.0, 0.0], [0.0, 3.0], [1.0, 1.0], [0.0, 0.0]])
    assert mean_cosine_similarity(e) == pytest.approx(2 / np.sqrt(2) / 3, rel=1e-12)
    assert mean_cosine_similarity(np.ones((4, 3))) == pytest.approx(1.0)
    assert np.isnan(mean_cosine_similarity(np.zeros((3, 2))))


def test_demo_with_few_epochs_says_the_model_is_undertrained(capsys):
    assert main(SMALL_DEMO) == 0
    out = capsys.readouterr().out
    assert "note        the model is undertrained" in out and "--epochs" in out


def test_demo_note_is_absent_when_words_are_spread(monkeypatch, capsys):
    from refopt import demo

    monkeypatch.setattr(demo, "mean_cosine_similarity", lambda e: 0.1)
    assert main(SMALL_DEMO) == 0
    assert "undertrained" not in capsys.readouterr().out


# ---------------------------------------------- the docstrings name every backend and convention

def test_run_reference_runs_on_the_cpu_backend_too():
    from refopt.testing import Trajectory, run_reference

    rng = np.random.default_rng(0)
    t = Trajectory("Adam", {"learning_rate": 0.01}, "float32",
                   [rng.standard_normal(5).astype(np.float32)],
                   [[rng.standard_normal(5).astype(np.float32)] for _ in range(3)],
                   convention="torch")
    ref, cpu = run_reference(t), run_reference(t, backend="cpu")
    for a, b in zip(ref, cpu):
        np.testing.assert_array_equal(a.params[0], b.params[0])
    assert "only ``\"reference\"`` exists" not in run_reference.__doc__
    assert "``\"torch\"``" in Trajectory.__doc__


@pytest.mark.parametrize("make", [
    lambda: refopt.Adam(learning_rate=1e-50, backend="reference"),
    lambda: refopt.Lamb(learning_rate=1e-50, convention="keras3", backend="reference"),
    lambda: refopt.Adam.from_config({"learning_rate": 1e-50, "backend": "reference"}),
    lambda: setattr(refopt.SGD(0.1, backend="reference"), "learning_rate", 1e-50),
], ids=["constructor", "subclass constructor", "from_config", "setter"])
def test_learning_rate_underflow_warning_points_at_the_users_line(make):
    with pytest.warns(UserWarning, match="underflows to 0 in float32") as record:
        make()
    assert [w.filename for w in record] == [__file__]
