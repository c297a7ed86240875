"""The backend of an optimizer created without ``backend=`` (issue #15 item 8)."""

import logging

import numpy as np
import pytest

import refopt
from refopt import executors


@pytest.fixture
def fresh_notice(monkeypatch):
    monkeypatch.setattr(executors, "_NOTICE_GIVEN", False)


def test_default_is_cpu_with_one_notice(monkeypatch, fresh_notice, caplog):
    monkeypatch.delenv("REFOPT_BACKEND", raising=False)
    with caplog.at_level(logging.WARNING, logger="refopt"):
        a = refopt.Adam()
        b = refopt.SGD()
    assert a.backend == b.backend == "cpu"
    assert a.get_config()["backend"] == "cpu"
    notes = [r for r in caplog.records if r.name == "refopt"]
    assert len(notes) == 1  # said once per process
    assert "compile on their first step" in notes[0].getMessage()
    assert "backend='reference'" in notes[0].getMessage()


def test_default_cpu_gives_the_reference_bits(monkeypatch, fresh_notice):
    monkeypatch.delenv("REFOPT_BACKEND", raising=False)
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(37).astype(np.float32)
    grads = rng.standard_normal((3, 37)).astype(np.float32)
    out = []
    for backend in (None, "reference"):
        w = w0.copy()
        opt = refopt.Adam(learning_rate=0.01, backend=backend)
        for g in grads:
            opt.apply_gradients([(g, w)])
        out.append((w, opt.get_slot(w, "m").copy(), opt.get_slot(w, "v").copy()))
    for got, want in zip(out[0], out[1]):
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("name", ["reference", "cpu"])
def test_environment_chooses_the_default(monkeypatch, fresh_notice, caplog, name):
    monkeypatch.setenv("REFOPT_BACKEND", name)
    with caplog.at_level(logging.WARNING, logger="refopt"):
        assert refopt.Adagrad().backend == name
    assert not [r for r in caplog.records if r.name == "refopt"]  # chosen: nothing to say
    assert refopt.Adagrad(backend="reference").backend == "reference"  # explicit wins


def test_unknown_environment_value_is_refused(monkeypatch):
    monkeypatch.setenv("REFOPT_BACKEND", "gpu")
    with pytest.raises(ValueError, match=r"REFOPT_BACKEND must be one of .*'gpu'"):
        refopt.Adam()
