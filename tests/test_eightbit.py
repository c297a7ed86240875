"""8-bit optimizer state (issue 17 item 5): refopt.reference.eightbit against bitsandbytes 0.50.2.

The golden files in conformance/bnb/ were recorded from bitsandbytes' own CPU optimizers by
conformance/generators/gen_bnb.py (never computed by refopt): its quantization maps, and after
every step the parameter, the uint8 codes and the block maxima.
"""

import glob
import json
import os

import numpy as np
import pytest

from refopt._mkl import mkl_available, mkl_sqrt
from refopt.reference import eightbit as E

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, "conformance", "bnb")
FILES = sorted(glob.glob(os.path.join(ROOT, "*.npz")))
needs_mkl = pytest.mark.skipif(not mkl_available(), reason="needs torch or the mkl wheel")


def _case(path):
    d = np.load(path)
    return d, json.loads(str(d["config"]))


def _run(d, cfg, sqrt):
    """Free-running trajectory from the recorded start and gradients."""
    kw = cfg["defaults"]
    lion = cfg["optimizer"].startswith("Lion")
    p = d["param0"]
    st = (E.lion8bit_initial_state if lion else E.adam8bit_initial_state)(
        p, cfg["min_8bit_size"])
    for t in range(1, cfg["steps"] + 1):
        g = d[f"grad/{t}"]
        if lion:
            p, st = E.lion8bit_update(p, g, st, t, kw["lr"], kw["betas"][0], kw["betas"][1],
                                      kw["weight_decay"])
        else:
            p, st = E.adam8bit_update(p, g, st, t, kw["lr"], kw["betas"][0], kw["betas"][1],
                                      kw["eps"], kw["weight_decay"], sqrt=sqrt)
        yield t, p, st


def _bits(a):
    return np.asarray(a).view(np.uint8 if np.asarray(a).dtype == np.uint8 else np.uint32)


def test_every_recorded_case_is_here():
    ids = sorted(_case(f)[1]["id"] for f in FILES)
    assert ids == ["adam8bit_f32", "adam8bit_nonfinite_f32", "adam8bit_nonfinite_small_f32",
                   "adam8bit_opts_f32", "adam8bit_small_f32", "adamw8bit_f32", "lion8bit_f32",
                   "lion8bit_nonfinite_f32", "lion8bit_nonfinite_small_f32", "lion8bit_opts_f32"]


def test_dynamic_maps_are_bitsandbytes_maps():
    d, _ = _case(os.path.join(ROOT, "adam8bit_f32.npz"))
    assert np.array_equal(_bits(E.create_dynamic_map(True)), _bits(d["qmap1"]))
    assert np.array_equal(_bits(E.create_dynamic_map(False)), _bits(d["qmap2"]))


@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.basename(p)[:-4])
def test_state_bit_identical_to_bitsandbytes_every_step(path):
    """The codes, block maxima (and 32-bit moments) do not depend on the square root: equal
    at every step with IEEE sqrt too; Lion's parameters as well."""
    d, cfg = _case(path)
    for t, p, st in _run(d, cfg, "ieee"):
        for key in ("state1", "state2", "absmax1", "absmax2"):
            if f"{key}/{t}" in d:
                assert np.array_equal(_bits(getattr(st, key)), _bits(d[f"{key}/{t}"])), (key, t)
        if cfg["optimizer"].startswith("Lion"):
            assert np.array_equal(_bits(p), _bits(d[f"param/{t}"])), t
        else:  # IEEE sqrt: the parameters are within a few float32 ulp of 1 (absolute)
            np.testing.assert_allclose(p, d[f"param/{t}"], rtol=0, atol=2e-6)


@needs_mkl
@pytest.mark.parametrize("path", [f for f in FILES if "adam" in os.path.basename(f)],
                         ids=lambda p: os.path.basename(p)[:-4])
def test_adam_parameters_bit_identical_with_mkl_sqrt(path):
    d, cfg = _case(path)
    for t, p, _ in _run(d, cfg, "mkl"):
        assert np.array_equal(_bits(p), _bits(d[f"param/{t}"])), t


@needs_mkl
def test_mkl_sqrt_is_torchs_cpu_sqrt():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = (rng.random(20001) * 10.0 ** rng.uniform(-30, 30, 20001)).astype(np.float32)
    for arr in (x, x.astype(np.float64) * 1.0000001, x[3:10]):
        got = mkl_sqrt(arr)
        want = torch.from_numpy(np.ascontiguousarray(arr)).sqrt().numpy()
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.mean(mkl_sqrt(x) != np.sqrt(x)) > 0.05  # it is not IEEE's


def test_quantize_blockwise_rules():
    code = E.create_dynamic_map(True)
    x = np.array([0.0] * 256 + [1.0, -0.5, 0.25] + [0.0] * 3, np.float32)
    q, absmax = E.quantize_blockwise(x, code)
    assert absmax.tolist() == [0.0, 1.0]  # two blocks, the second short
    assert (q[:256] == 0).all()           # an all-zero block stores byte 0
    assert code[q[256]] == 1.0
    assert q[257] == np.argmin(np.abs(code + 0.5)) and q[258] == np.argmin(np.abs(code - 0.25))
    back = E.dequantize_blockwise(q, absmax, code)
    assert back[256] == 1.0 and np.all(back[:256] == 0)


def test_state_memory_is_about_two_bytes_per_element():
    p = np.zeros(1_000_000, np.float32)
    st = E.adam8bit_initial_state(p)
    nbytes = sum(a.nbytes for a in st)
    assert nbytes == 2 * 1_000_000 + 2 * 4 * 3907  # 3907 blocks of 256
    small = E.adam8bit_initial_state(np.zeros(4095, np.float32))  # under min_8bit_size
    assert small.state1.dtype == np.float32 and small.absmax1 is None


def test_bad_input_is_refused_naming_the_argument():
    p = np.zeros(5000, np.float32)
    st = E.adam8bit_initial_state(p)
    with pytest.raises(TypeError, match="float32"):
        E.adam8bit_update(p.astype(np.float64), p.astype(np.float64), st, 1)
    with pytest.raises(ValueError, match="sqrt"):
        E.adam8bit_update(p, p, st, 1, sqrt="fast")
    with pytest.raises(ValueError, match="beta_1"):
        E.adam8bit_update(p, p, st, 1, beta_1=1.5)
    with pytest.raises(ValueError, match="step"):
        E.lion8bit_update(p, p, E.lion8bit_initial_state(p), 0)
    with pytest.raises(TypeError, match="state"):
        E.adam8bit_update(p, p, (st.state1, st.state2), 1)
    with pytest.raises(ValueError, match="block_size=100"):  # a state of blocks of 256
        E.adam8bit_update(p, p, st, 1, block_size=100)
    with pytest.raises(ValueError, match="state1"):
        E.adam8bit_update(p, p, E.adam8bit_initial_state(np.zeros(4096, np.float32)), 1)
