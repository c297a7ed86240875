import json
import os
import subprocess
import sys
from pathlib import Path

from refopt.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def _info_json(capsys):
    assert main(["info", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_info_json_reports_versions_backends_and_threads(capsys):
    import numba
    import numpy

    import refopt

    info = _info_json(capsys)
    assert info["refopt"] == refopt.__version__
    assert info["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["packages"]["numpy"] == numpy.__version__
    assert info["packages"]["numba"] == numba.__version__
    assert info["backends"]["reference"]["available"] is True
    assert info["backends"]["cpu"]["available"] is True
    assert set(info["backends"]) == {"reference", "cpu", "cuda"}
    assert info["numba_threads"]["threads"] == numba.get_num_threads()
    assert info["numba_threads"]["max"] == numba.config.NUMBA_NUM_THREADS


def test_info_lists_every_preset_and_where_each_optimizer_exists(capsys):
    from refopt.conventions import PRESETS

    info = _info_json(capsys)
    assert list(info["conventions"]) == list(PRESETS)
    assert info["conventions"]["torch"] == PRESETS["torch"].framework
    # facts of the frameworks: RAdam, ASGD and Rprop are torch's; Lamb Keras 3's and optax's;
    # TF1 has no AdamW, Keras 2's AdamW and SGDW are TF-Addons' (issue 12 item 9); Ftrl is
    # TensorFlow's only
    assert info["optimizers"]["ASGD"] == {"conventions": ["torch", "torch_fused"],
                                          "default": "torch"}
    assert info["optimizers"]["Lamb"]["conventions"] == ["keras3", "optax", "optax_eager",
                                                         "optax_jit_step"]
    assert "keras2" in info["optimizers"]["AdamW"]["conventions"]
    assert info["optimizers"]["SGDW"] == {"conventions": ["keras2"], "default": "keras2"}
    assert "tf1" not in info["optimizers"]["AdamW"]["conventions"]
    assert info["optimizers"]["Ftrl"]["conventions"] == ["tf_keras", "keras3", "keras2", "tf1"]
    assert info["optimizers"]["Adam"]["conventions"] == list(PRESETS)
    assert info["optimizers"]["Adam"]["default"] == "tf_keras"


def test_info_counts_the_bundled_golden_cases(capsys):
    from refopt import conformance

    entries = conformance.load_manifest()
    info = _info_json(capsys)
    assert info["golden_cases"]["total"] == len(entries) > 0
    assert sum(info["golden_cases"]["by_convention"].values()) == len(entries)
    assert info["golden_cases"]["bit_identical"] == sum(e["tolerance_ulp"] == 0 for e in entries)


def test_info_kernel_cache_follows_refopt_kernel_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("REFOPT_KERNEL_CACHE", str(tmp_path / "kc"))
    info = _info_json(capsys)
    assert info["kernel_cache"] == {"path": str(tmp_path / "kc"), "source": "REFOPT_KERNEL_CACHE",
                                    "env": str(tmp_path / "kc"), "files": 0, "bytes": 0,
                                    "env_unusable": False}


def test_info_kernel_cache_size_and_how_to_clean_it(tmp_path, monkeypatch, capsys):
    kc = tmp_path / "kc"
    (kc / "sub").mkdir(parents=True)
    (kc / "a.py").write_bytes(b"x" * 1_500_000)
    (kc / "sub" / "b.nbc").write_bytes(b"y" * 1_000_000)
    monkeypatch.setenv("REFOPT_KERNEL_CACHE", str(kc))
    info = _info_json(capsys)
    assert info["kernel_cache"]["files"] == 2 and info["kernel_cache"]["bytes"] == 2_500_000
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "2 files, 2.5 MB; safe to delete to clean it" in out
    assert "not usable" not in out


def test_info_says_when_refopt_kernel_cache_is_set_but_unusable(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "kc"  # under a file: cannot be created
    monkeypatch.setenv("REFOPT_KERNEL_CACHE", str(bad))
    info = _info_json(capsys)
    assert info["kernel_cache"]["env_unusable"] is True
    assert info["kernel_cache"]["path"] != str(bad)
    assert main(["info"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"REFOPT_KERNEL_CACHE={bad} is set but not usable" in out
    assert f"using {info['kernel_cache']['path']} instead" in out


def test_info_reports_a_bad_refopt_backend_instead_of_failing(monkeypatch, capsys):
    monkeypatch.setenv("REFOPT_BACKEND", "tpu")
    info = _info_json(capsys)
    assert info["default_backend"].startswith("error:") and "tpu" in info["default_backend"]


def test_info_cuda_without_numba_cuda_names_the_extra(monkeypatch, capsys):
    from refopt import cli

    real = cli._dist_version
    monkeypatch.setattr(cli, "_dist_version", lambda n: None if n == "numba-cuda" else real(n))
    cuda = _info_json(capsys)["backends"]["cuda"]
    assert cuda["available"] is False and cuda["numba_cuda"] is None
    assert 'pip install "refopt[cuda]"' in cuda["detail"]


def test_info_text_names_each_section(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for heading in ("refopt ", "python ", "backends ", "  reference yes", "threads ",
                    "kernels ", "conventions", "optimizers", "golden "):
        assert heading in out, heading
    assert "RAdam" in out and "torch (default)" in out


def _run_module(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "refopt", *args], check=False,
                          capture_output=True, text=True,
                          cwd=REPO_ROOT, env=env, timeout=120)


def test_python_dash_m_refopt_without_arguments_prints_help_and_exits_0():
    proc = _run_module()
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: refopt")
    for command in ("demo", "golden", "check", "conformance", "info"):
        assert command in proc.stdout
    assert proc.stderr == ""
