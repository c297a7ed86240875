"""The README's Python examples of the new features run as written (and print what it says)."""

import contextlib
import io
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _block(marker):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    found = [b for b in blocks if marker in b]
    assert len(found) == 1, marker
    return found[0]


def _run(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    return out.getvalue()


def test_functional_and_checkpoint_example(tmp_path, monkeypatch):
    out = _run(_block("from refopt import functional as F"), tmp_path, monkeypatch)
    assert out == ""
    assert (tmp_path / "state.npz").exists() and (tmp_path / "run.npz").exists()


def test_rowwise_adagrad_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.RowWiseAdagrad(learning_rate=1.0)"), tmp_path, monkeypatch)
    assert out.strip() == "[-2.0, 0.0, 0.0, 0.0] [1.0, 0.0]"


def test_proximal_adagrad_example(tmp_path, monkeypatch):
    code = "import numpy as np, refopt\n" + _block("refopt.ProximalAdagrad(learning_rate=0.1")
    out = _run(code, tmp_path, monkeypatch)
    assert out.split() == ["[0.8968299", "0.89781207]", "[16.1", "36.1]"]  # TF 2.15's values


def test_explain_example(tmp_path, monkeypatch):
    pytest.importorskip("hypothesis")
    out = _run(_block("result = explain(my_adam)"), tmp_path, monkeypatch)
    assert "matches tf_keras with slip epsilon_inside_root (0 ulp over 20 steps)" in out


def test_optax_example(tmp_path, monkeypatch):
    pytest.importorskip("optax")
    code = _block("refopt.optax.adam(learning_rate=0.1") + "\nprint(params['w'])\n"
    out = _run(code, tmp_path, monkeypatch)
    assert out.strip() == "[0.900002 1.099998 0.900001]"
