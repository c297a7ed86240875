"""The golden trajectories recorded from the frameworks, replayed through every backend.

Each case in ``refopt/conformance_data/manifest.json`` was recorded by a generator in
``conformance/generators/`` running the real framework (TensorFlow 2.21 with tf_keras and
Keras 3, TensorFlow 2.15 with TF-Addons, PyTorch 2.13 CPU, optax 0.2.8 on jax 0.10.2). The
manifest states each case's tolerance in ulp per step and why; this file enforces it: 0 means
bit-identical over the whole trajectory (variables and every recorded slot), more means within
that many ulp after resyncing to the recorded state before each step.
"""

import collections

import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.cli import main
from refopt.conventions import PRESETS

ENTRIES = conformance.load_manifest()
IDS = [e["id"] for e in ENTRIES]


def test_manifest_covers_every_convention_and_states_its_tolerances():
    by_conv = collections.Counter(e["convention"] for e in ENTRIES)
    assert set(by_conv) == set(PRESETS)
    assert all(n >= 6 for n in by_conv.values()), by_conv
    for e in ENTRIES:
        assert e["framework_version"] and e["api"], e["id"]
        assert isinstance(e["tolerance_ulp"], int) and e["tolerance_ulp"] >= 0
        if e["tolerance_ulp"]:
            assert e["tolerance_reason"], f"{e['id']} needs a reason for its tolerance"
    # Bit-identical is the rule for the Keras/TF families and torch's fused path.
    exact = [e["id"] for e in ENTRIES if e["tolerance_ulp"] == 0]
    assert len(exact) >= 50
    assert all(i in exact for i in IDS if i.startswith("torch/") and "fused" in i)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("entry", ENTRIES, ids=IDS)
def test_replay_within_tolerance(entry, backend):
    r = conformance.replay(entry, backend=backend)
    assert r.passed, f"{r.case} on {backend}: max {r.max_ulp} ulp > {r.tolerance_ulp}: {r.detail}"
    assert r.max_ulp <= entry["tolerance_ulp"]


def test_a_wrong_convention_fails_the_replay():
    """The replay is not vacuous: replaying torch's data with Keras numerics fails."""
    entry = dict(next(e for e in ENTRIES if e["id"] == "torch/adam_fused_f32"))
    entry["convention"] = "tf_keras"
    entry["hyperparameters"] = dict(entry["hyperparameters"])
    r = conformance.replay(entry)
    assert not r.passed and r.max_ulp > 1000


# one or two per convention, dense and sparse, every optimizer (the whole set replays with
# `refopt conformance --backend cuda`; on the simulator that takes minutes)
CUDA_CASES = ["tf_keras/adam_f32", "tf_keras/sgd_momentum_f32", "tf_keras/amsgrad_f32",
              "tf_keras/adagrad_sparse_f32", "keras3/ema_adam_f32", "keras2/lazyadam_dup",
              "tf1/rmsprop_centered_momentum_f32", "torch/clip_grad_norm_nonfinite_f32",
              "torch/sparseadam_f32", "optax/adamw_f32",
              # one case of each optimizer of the catalogue
              "keras3/adadelta_f32", "keras2/adamax_sparse_f32", "optax/nadam_f32",
              "tf_keras/lion_sparse_f32", "torch/radam_f32", "torch/asgd_t0_f32",
              "torch/rprop_nonfinite_f32", "keras2/ftrl_reg_sparse_f32", "keras3/lamb_f32",
              "torch/adafactor_f32"]
CUDA_CASES += ["tf1/proximal_adagrad_sparse_f64", "tf1/proximal_sgd_sparse_f32"]


@pytest.mark.parametrize("case", CUDA_CASES)
def test_replay_cuda_subset(case, monkeypatch):
    """backend="cuda" on numba's simulator (tests/conftest.py), a subset (it is slow)."""
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    entry = next(e for e in ENTRIES if e["id"] == case)
    entry = dict(entry, steps=min(5, entry["steps"]))  # the first steps of the trajectory
    r = conformance.replay(entry, backend="cuda")
    assert r.passed, r.detail


def test_cli_conformance_prints_a_table_and_exit_status(capsys):
    assert main(["conformance", "--filter", "tf1/"]) == 0
    out = capsys.readouterr().out
    assert "tf1/adam_f64_100" in out and "tensorflow 2.15.1" in out and "pass" in out
    n = sum(e["id"].startswith("tf1/") for e in ENTRIES)
    assert n >= 34 and f"{n} of {n} cases pass" in out
    assert main(["conformance", "--filter", "no-such-case"]) == 2
    assert main(["conformance", "--list", "--filter", "optax/"]) == 0
    assert "optax.adam (jit)" in capsys.readouterr().out


def test_cli_conformance_exit_1_on_a_failure(capsys, monkeypatch):
    def broken(entry, backend="reference"):
        return conformance.ReplayResult(entry["id"], "torch", "torch 2.13.0", "Adam", "torch",
                                        backend, 1, 3.0, 0, False, "step 1: differs")

    monkeypatch.setattr(conformance, "replay", broken)
    assert main(["conformance", "--filter", "torch/adam_fused_f32"]) == 1
    assert "FAIL torch/adam_fused_f32" in capsys.readouterr().out


def test_load_case_gives_the_recorded_inputs():
    entry = next(e for e in ENTRIES if e["id"] == "keras3/adam_sparse_dup_f32")
    init, grads, params, slots = conformance.load_case(entry)
    g = grads[0][0]
    assert isinstance(g, refopt.IndexedSlices) and g.indices.tolist() == [1, 1]
    np.testing.assert_array_equal(init[0], np.ones((3, 2), np.float32))
    # Keras 3's squared-slices bug (semantics notes 2.1): v row 1 = 0.001 * (1+4, 4+16)
    np.testing.assert_allclose(slots["v"][0][0][1], [0.01, 0.02], rtol=1e-5)
