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


def test_partial_rowwise_adam_example(tmp_path, monkeypatch):
    code = "import numpy as np, refopt\n" + _block("refopt.PartialRowWiseAdam(learning_rate=0.1)")
    out = _run(code, tmp_path, monkeypatch)
    # by hand: v = f32(0 + 12.5 * (1.0 - double(f32(0.999)))) = f32(0.0124998390674591...)
    assert out.split("#")[0].strip() == "[0.012499839067459106, 0.0]"


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


def test_torch_options_example(tmp_path, monkeypatch):
    out = _run(_block("from refopt.lr_scheduler import CosineAnnealingLR"), tmp_path, monkeypatch)
    assert out.strip() == "[0.01045365877844014]"  # torch 2.13's value


def test_optax_schedules_example(tmp_path, monkeypatch):
    out = _run(_block("from refopt.optax_schedules import"), tmp_path, monkeypatch)
    assert out.strip() == "0.0005000000237487257 0.0"  # optax 0.2.8's values under jit


def test_keras_and_tfa_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.SGDW(weight_decay=0.1"), tmp_path, monkeypatch).split("\n")
    assert out[0] == "[0.8628787398338318, 2.2742421627044678]"  # TF 2.15
    assert out[1] == "[0.7999999523162842, 1.6999999284744263]"  # TF-Addons 0.23
    assert out[2] == "0.09779754"                                # Keras


def test_tfa_averaging_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.MovingAverage("), tmp_path, monkeypatch).split("\n")
    assert out[0] == "[0.9438999891281128, 2.0561001300811768]"  # TF-Addons 0.23
    assert out[1] == "[0.7878680229187012, 2.212131977081299]"   # TF-Addons 0.23


def test_optax_jit_modes_example(tmp_path, monkeypatch):
    code = "\n".join(line[2:] for line in _block('for conv in ("optax_eager"').split("\n"))
    out = _run(code, tmp_path, monkeypatch).split("\n")
    assert [line.split()[1] for line in out[:3]] == [  # optax 0.2.8, in each jit mode
        "0x1.3755c00000000p-6", "0x1.3755c80000000p-6", "0x1.3755ca0000000p-6"]


def test_torch_adapter_example(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    out = _run(_block("def train(model, opt, steps=200)"), tmp_path, monkeypatch).split("\n")
    loop = "w[0,:3]=[0.5225340723991394, 0.15435117483139038, -0.9214924573898315]"
    fused = "w[0,:3]=[0.5225344896316528, 0.1543513536453247, -0.9214925765991211]"
    assert out[1].startswith("torch ") and out[1].endswith(loop)
    assert out[2].startswith("torch_fused") and out[2].endswith(fused)
    assert out[3].startswith("torch.optim") and out[3].endswith(loop)  # torch.optim.Adam()


def test_torch_fused_sgd_example(tmp_path, monkeypatch):
    out = _run(_block("one AVX2 vector of 8"), tmp_path, monkeypatch).split("\n")
    assert [line.split()[1] for line in out[:2]] == [  # torch 2.13: for-loop, fused=True
        "0x1.8e66aa0000000p-8", "0x1.8e66780000000p-8"]


def test_low_precision_example(tmp_path, monkeypatch):
    pytest.importorskip("ml_dtypes")
    code = _block("refopt.MasterWeights(") + "\nprint(w.tolist(), b.tolist())\n"
    out = _run(code, tmp_path, monkeypatch)
    # torch 2.13's Adam(fused=True) on these float16 values (its default loop gives -inf)
    assert out.strip() == "[0.990234375, -0.489990234375, 0.239990234375] [1.0, 2.0]"


def test_loss_scale_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.LossScaleOptimizer("), tmp_path, monkeypatch)
    assert out.strip() == "4.0 2"


def test_eightbit_example(tmp_path, monkeypatch):
    out = _run(_block("from refopt.reference import eightbit as E"), tmp_path, monkeypatch)
    assert out.strip() == "uint8 (20,)"


def test_eightbit_class_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.AdamW8bit(learning_rate=1e-3)"), tmp_path, monkeypatch)
    assert out.split("\n")[:3] == ["('m', 'v', 'm_absmax', 'v_absmax')", "uint8 (20,)",
                                    "2.032"]


def test_bf16_in_dtype_example(tmp_path, monkeypatch):
    out = _run(_block("torch.optim.Adam's for-loop"), tmp_path, monkeypatch)
    assert out.split("\n")[:2] == ["[16251, 48888, 15984]",
                                   "[16251, 48866, 15605]"]  # torch 2.13's bits


def test_cuda_bf16_example(tmp_path, monkeypatch):
    out = _run(_block("from refopt.kernels import cuda as kc             # NUMBA"),
               tmp_path, monkeypatch)
    assert out.strip() == "[16208, 49136, 16088]"  # torch 2.13 Adam(fused=True)'s bits


def test_torch_sparse_momentum_example(tmp_path, monkeypatch):
    code = "import numpy as np, refopt\n" + _block('refopt.SGD(learning_rate=0.1, momentum=0.9, '
                                                  'convention="torch")')
    out = _run(code, tmp_path, monkeypatch)
    assert out.split() == ["[-0.16000003", "-0.74", "]", "[1", "1]"]  # torch 2.13's


def test_cuda_rowwise_adagrad_example(tmp_path, monkeypatch):
    out = _run(_block("refopt.RowWiseAdagrad(learning_rate=0.1, backend=\"cuda\")"),
               tmp_path, monkeypatch)
    assert out.split() == ["[", "0.", "12.5", "0.", "0.", "]"]  # mean of (3^2, 4^2)


def test_f16_loop_example(tmp_path, monkeypatch):
    code = "\n".join(line[2:] for line in _block("# 32 in the AVX2 body").splitlines())
    out = _run(code, tmp_path, monkeypatch)
    assert out.strip() == "[43214, 43105]"  # torch 2.13's bits


def test_lamb_in_place_example(tmp_path, monkeypatch):
    assert _run(_block("refopt.Lamb(learning_rate=1e-3, backend=\"cpu\")"), tmp_path,
                monkeypatch) == ""  # its assert held: cpu's bits are the reference's


def test_torch_sparse_sgd_example(tmp_path, monkeypatch):
    code = "import numpy as np, refopt\n" + _block("refopt.SGD(learning_rate=0.1, convention=\"torch\")")
    out = _run(code, tmp_path, monkeypatch)
    assert out.split() == ["[", "0.19999996", "-0.2", "]"]  # torch 2.13's values
