import json
import re
import subprocess
import sys

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt.cli import main
from refopt.testing import check_trajectory, run_reference
from refopt.testing.golden import FORMAT_VERSION, make_trajectory, read_golden, write_golden

HEX = re.compile(r"^-?0x[01]\.[0-9a-f]{13}p[+-]\d+$|^-?0x0\.0p\+0$|^-?inf$|^nan$")


# --------------------------------------------------------------------------- naive reader
# What a reader in another language does: parse the JSON, float.fromhex every string, reshape.
def naive_json_arrays(doc):
    dtype = np.dtype(doc["dtype"])

    def arr(values, shape):
        for v in values:
            assert HEX.match(v), v
        return np.array([float.fromhex(v) for v in values]).astype(dtype).reshape(shape)

    shapes = [tuple(s) for s in doc["shapes"]]
    params = [[arr(p, s) for p, s in zip(doc["initial"]["params"], shapes)]]
    slots = {n: [[arr(a, s) for a, s in zip(doc["initial"]["slots"][n], shapes)]]
             for n in doc["slots"]}
    grads = []
    for entry in doc["trajectory"]:
        params.append([arr(p, s) for p, s in zip(entry["params"], shapes)])
        for n in doc["slots"]:
            slots[n].append([arr(a, s) for a, s in zip(entry["slots"][n], shapes)])
        step = []
        for g, s in zip(entry["gradients"], shapes):
            if "indices" in g:
                rows = (len(g["indices"]),) + s[1:]
                step.append((np.array(g["indices"]), arr(g["values"], rows)))
            else:
                step.append(arr(g["values"], s))
        grads.append(step)
    return params, slots, grads


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def assert_same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(bits(a), bits(b))


def golden(tmp_path, *args):
    prefix = str(tmp_path / "g")
    assert main(["golden", "--out", prefix, *args]) == 0
    with open(prefix + ".json", encoding="utf-8") as f:
        doc = json.load(f)
    return prefix, doc


# --------------------------------------------------------------------------- refopt golden
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_golden_json_and_npz_hold_refopt_trajectory_bit_for_bit(tmp_path, capsys, dtype):
    prefix, doc = golden(tmp_path, "--optimizer", "Adam", "--set", "learning_rate=0.01",
                         "--set", "amsgrad=true", "--set", "use_ema=true", "--dtype", dtype,
                         "--shape", "3,4", "--shape", "5", "--shape", "scalar", "--seed", "7",
                         "--steps", "4")
    assert "wrote" in capsys.readouterr().out
    assert doc["format"] == "refopt-golden" and doc["format_version"] == FORMAT_VERSION
    assert doc["refopt_version"] == refopt.__version__
    assert (doc["optimizer"], doc["convention"], doc["dtype"], doc["seed"], doc["steps"]) == \
        ("Adam", "tf_keras", dtype, 7, 4)
    assert doc["config"]["amsgrad"] is True and doc["config"]["use_ema"] is True
    assert doc["config"]["learning_rate"] == float(np.float32(0.01))
    assert doc["slots"] == ["m", "v", "vhat", "average"]
    assert doc["shapes"] == [[3, 4], [5], []]

    expected = run_reference(make_trajectory(
        config={"learning_rate": 0.01, "amsgrad": True, "use_ema": True}, dtype=dtype,
        shapes=[(3, 4), (5,), ()], steps=4, seed=7))
    params, slots, _ = naive_json_arrays(doc)
    with np.load(prefix + ".npz") as z:
        assert json.loads(str(z["meta"]))["config"] == doc["config"]
        for k, state in enumerate(expected):
            for i in range(3):
                assert_same_bits(params[k][i], state.params[i])
                assert_same_bits(z[f"params_{i}"][k], state.params[i])
                for n in doc["slots"]:
                    assert_same_bits(slots[n][k][i], state.slots[n][i])
                    assert_same_bits(z[f"slot_{n}_{i}"][k], state.slots[n][i])
        np.testing.assert_array_equal(z["learning_rate"], [s.learning_rate for s in expected[1:]])
    assert [float.fromhex(e["learning_rate"]) for e in doc["trajectory"]] == \
        [s.learning_rate for s in expected[1:]]


def test_golden_sparse_gradients_with_duplicates_replay_exactly(tmp_path):
    prefix, doc = golden(tmp_path, "--optimizer", "LazyAdam", "--shape", "6,2", "--shape", "4",
                         "--sparse", "--steps", "6", "--seed", "3")
    assert doc["gradient_kinds"] == ["sparse", "sparse"]
    _, _, grads = naive_json_arrays(doc)
    indices = [g[0].tolist() for step in grads for g in step]
    assert any(len(set(i)) < len(i) for i in indices)  # duplicates occur
    for path in (prefix + ".json", prefix + ".npz"):
        g = read_golden(path)
        assert all(isinstance(x, IndexedSlices) for step in g.trajectory.gradients for x in step)
        for want, got in zip(g.states, run_reference(g.trajectory)):
            for a, b in zip(want.params, got.params):
                assert_same_bits(a, b)
        check_trajectory(refopt.LazyAdam, g.trajectory)


def test_golden_hex_floats_round_trip_special_values(tmp_path):
    w = np.array([0.0, -0.0, 1e-45, 3.4028235e38, 0.1], np.float32)
    g = np.array([np.nan, np.inf, -np.inf, 1e-40, -2.5], np.float32)
    t = refopt.testing.Trajectory("SGD", {"learning_rate": 0.5}, "float32", [w], [[g]])
    doc = write_golden(t, json_path=tmp_path / "s.json", npz_path=tmp_path / "s.npz")
    assert doc["initial"]["params"][0][:2] == ["0x0.0p+0", "-0x0.0p+0"]
    assert doc["trajectory"][0]["gradients"][0]["values"][:3] == ["nan", "inf", "-inf"]
    for path in ("s.json", "s.npz"):
        back = read_golden(tmp_path / path)
        assert_same_bits(back.states[0].params[0], w)
        got = back.trajectory.gradients[0][0]
        assert np.isnan(got[0]) and (bits(got[1:]) == bits(g[1:])).all()


def test_golden_schedule_and_json_only(tmp_path):
    schedule = '{"class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.1, ' \
               '"decay_steps": 1, "decay_rate": 0.5}}'
    prefix, doc = golden(tmp_path, "--optimizer", "SGD", "--set", f"learning_rate={schedule}",
                         "--set", "momentum=0.9", "--format", "json", "--steps", "3")
    assert not (tmp_path / "g.npz").exists()
    assert doc["config"]["learning_rate"]["class_name"] == "ExponentialDecay"
    assert [float.fromhex(e["learning_rate"]) for e in doc["trajectory"]] == \
        [float(np.float32(0.1 * 0.5**k)) for k in range(3)]
    check_trajectory(refopt.SGD, read_golden(prefix + ".json").trajectory)


def test_read_golden_refuses_newer_versions_and_other_files(tmp_path):
    _, doc = golden(tmp_path, "--steps", "1")
    doc["format_version"] = FORMAT_VERSION + 1
    (tmp_path / "new.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="format_version=2.*Upgrade refopt"):
        read_golden(tmp_path / "new.json")
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(ValueError, match="not a refopt golden file"):
        read_golden(tmp_path / "other.json")
    with pytest.raises(ValueError, match="dense gradients at some steps"):
        t = refopt.testing.Trajectory(
            "Adam", {}, "float32", [np.zeros(2, np.float32)],
            [[np.zeros(2, np.float32)], [IndexedSlices(np.zeros((1,), np.float32), [0], (2,))]])
        write_golden(t, json_path=tmp_path / "mixed.json")


@pytest.mark.parametrize("args, message", [
    (["--set", "learning_rate"], "expected KEY=VALUE"),
    (["--shape", "3,x"], "comma-separated sizes"),
    (["--shape", "-1"], "sizes must be >= 0"),
    (["--optimizer", "Shampoo"], "invalid choice"),
    (["--set", "beta_1=2"], "beta_1=2"),
    (["--set", "lr=0.1"], "unexpected keyword argument 'lr'"),
    (["--convention", "jax"], "convention='jax'"),
    (["--steps", "0"], "must be at least 1"),
])
def test_golden_usage_errors_exit_2(tmp_path, capsys, args, message):
    assert main(["golden", "--out", str(tmp_path / "g"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_golden_missing_directory_is_created(tmp_path, capsys):
    assert main(["golden", "--out", str(tmp_path / "nope" / "g")]) == 0
    assert (tmp_path / "nope" / "g.json").is_file()


# --------------------------------------------------------------------------- refopt check
WRONG_PORT = '''
import numpy as np

def adam_paper_epsilon(params, grads, state, hyper, t):
    """Adam with the paper's epsilon placement: not tf-keras."""
    out_p, out_s = [], []
    for w, g, s in zip(params, grads, state):
        f = w.dtype.type
        b1, b2 = f(np.float32(hyper["beta_1"])), f(np.float32(hyper["beta_2"]))
        m = s["m"] + (g - s["m"]) * f(1 - hyper["beta_1"])
        v = s["v"] + (g * g - s["v"]) * f(1 - hyper["beta_2"])
        mhat, vhat = m / (f(1) - b1 ** f(t)), v / (f(1) - b2 ** f(t))
        out_p.append(w - f(hyper["learning_rate"]) * mhat / (np.sqrt(vhat) + f(hyper["epsilon"])))
        out_s.append({"m": m, "v": v})
    return out_p, out_s

NOT_CALLABLE = 3
'''


def test_check_passes_for_refopt_and_exits_0(capsys):
    assert main(["check", "refopt:SGD", "--optimizer", "SGD", "--max-examples", "10",
                 "--vary", "ema,clipping", "--set", "nesterov=true"]) == 0
    out = capsys.readouterr().out
    assert "refopt check: refopt:SGD conforms to refopt SGD (tf_keras, float32, tolerance 0 ulp" \
        in out


def test_check_reports_divergence_and_exits_1(tmp_path, capsys, monkeypatch):
    (tmp_path / "wrong_port.py").write_text(WRONG_PORT)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    assert main(["check", "wrong_port:adam_paper_epsilon", "--max-examples", "30",
                 "--steps", "2", "--set", "amsgrad=false"]) == 1
    out = capsys.readouterr().out
    assert "DIVERGES from refopt Adam" in out
    assert re.search(r"first divergence at step \d of \d", out)
    assert "params:" in out and "ulp" in out and "input:" in out
    # The same module by file path; and a tolerance it cannot meet either.
    assert main(["check", str(tmp_path / "wrong_port.py") + ":adam_paper_epsilon",
                 "--max-examples", "5", "--tolerance-ulp", "2", "--set", "amsgrad=false"]) == 1


@pytest.mark.parametrize("target, message", [
    ("no_such_module_xyz:f", "cannot import no_such_module_xyz"),
    ("refopt", "expected MODULE:OBJECT"),
    ("refopt:NoSuchThing", "has no attribute 'NoSuchThing'"),
    ("refopt:__version__", "not a factory or step function"),
    ("missing/port.py:f", "no such file"),
])
def test_check_bad_targets_exit_2(capsys, target, message):
    assert main(["check", target, "--max-examples", "1"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--vary", "momentum"], "--vary momentum"),
    (["--set", "epsilon=-1"], "epsilon=-1"),
    (["--slot-map", "m"], "REF=CANDIDATE"),
    (["--tolerance-ulp", "-1"], "non-negative"),
])
def test_check_bad_options_exit_2(capsys, args, message):
    assert main(["check", "refopt:Adam", *args]) == 2
    assert message in capsys.readouterr().err


def test_check_through_the_entry_point_sets_the_exit_status(tmp_path):
    (tmp_path / "wrong_port.py").write_text(WRONG_PORT)
    run = subprocess.run([sys.executable, "-m", "refopt", "check", "wrong_port:adam_paper_epsilon",
                          "--max-examples", "5", "--set", "amsgrad=false"], cwd=tmp_path,
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stderr
    assert "DIVERGES" in run.stdout


def test_golden_reports_a_schedule_that_fails_mid_trajectory_without_a_traceback(tmp_path, capsys):
    sched = '{"class_name":"ExponentialDecay","config":{"initial_learning_rate":0.1,"decay_steps":1,"decay_rate":2.0}}'
    assert main(["golden", "--set", f"learning_rate={sched}", "--steps", "200",
                 "--out", str(tmp_path / "x")]) == 2
    assert "returned inf at step 128" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_golden_refuses_a_directory_as_out(tmp_path, capsys):
    assert main(["golden", "--out", str(tmp_path) + "/"]) == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("out, fmt, written", [
    ("x.npz", "npz", ["x.npz"]), ("x.json", "json", ["x.json"]),
    ("x.npz", "both", ["x.json", "x.npz"]), ("x.json", "npz", ["x.json.npz"]),
    ("x", "npz", ["x.npz"]),
])
def test_golden_out_with_the_formats_suffix_names_the_file_itself(tmp_path, capsys, out, fmt,
                                                                    written):
    assert main(["golden", "--out", str(tmp_path / "gold" / out), "--format", fmt]) == 0
    assert sorted(p.name for p in (tmp_path / "gold").iterdir()) == written


@pytest.mark.parametrize("out", ["", "  "])
def test_golden_empty_out_is_a_usage_error(tmp_path, capsys, monkeypatch, out):
    monkeypatch.chdir(tmp_path)
    assert main(["golden", "--out", out]) == 2
    assert "argument --out: expected a file prefix" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_convention_help_gives_each_optimizers_default_from_its_constructor(capsys):
    from refopt.testing.trajectory import default_convention

    assert main(["golden", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert default_convention("Lamb") == "keras3"  # Keras 3 and optax have Lamb, tf_keras not
    assert "keras3 for Lamb" in out and "torch for RAdam, ASGD, Rprop" in out
    assert main(["check", "--help"]) == 0
    assert "keras3 for Lamb" in " ".join(capsys.readouterr().out.split())
