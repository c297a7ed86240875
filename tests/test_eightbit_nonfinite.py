"""bitsandbytes' 8-bit optimizers on NaN and infinite values (user test findings F4, F5).

The quantization values below were measured from bitsandbytes 0.50.2's CPU
``quantize_blockwise`` (``torch.ops.bitsandbytes.quantize_blockwise`` with its own
``create_dynamic_map``), never computed by refopt. The trajectories with NaN / inf gradients
(``conformance/bnb/*_nonfinite*.npz``, recorded by ``conformance/generators/gen_bnb.py``) are
replayed bit for bit through the classes on every backend by
``tests/test_eightbit_optimizers.py`` and through the functions by ``tests/test_eightbit.py``;
here they are checked to hold what they are meant to exercise.
"""

import os

import numpy as np
import pytest

from refopt.reference import eightbit as E

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, "conformance", "bnb")
INF_BITS = 0x7F800000


def _q(values, signed):
    q, absmax = E.quantize_blockwise(np.array(values, np.float32),
                                     E.create_dynamic_map(signed))
    return q.tolist(), absmax.view(np.uint32).tolist()


@pytest.mark.parametrize("pos, absmax_bits", [(0, 1074850018), (1, 1074850018),
                                              (127, 1074850018), (255, 1074779879)])
def test_a_nan_never_sets_the_block_maximum_and_stores_byte_0(pos, absmax_bits):
    x = np.linspace(-2, 3, 300).astype(np.float32)
    clean, _ = _q(x, True)
    x[pos] = np.nan
    q, absmax = _q(x, True)
    assert absmax == [absmax_bits, 0x40400000]  # bnb: the others' maximum; block 1: 3.0
    assert q[pos] == 0
    if pos != 255:  # x[255] is block 0's maximum: without it the others' bytes move
        assert q[:pos] + q[pos + 1:] == clean[:pos] + clean[pos + 1:]


def test_a_block_of_nan_only_has_maximum_0_and_bytes_0():
    x = np.linspace(-2, 3, 300).astype(np.float32)
    clean, _ = _q(x, True)
    x[:256] = np.nan
    q, absmax = _q(x, True)
    assert absmax == [0, 0x40400000] and set(q[:256]) == {0} and q[256:] == clean[256:]


@pytest.mark.parametrize("signed, finite_byte", [(True, 131), (False, 7)])
def test_an_infinite_maximum(signed, finite_byte):
    """Maximum inf: every finite element scales to 0 (grid point 32768), the non-finite ones
    to NaN (byte 0)."""
    q, absmax = _q([np.nan, 0.5, -0.25, np.inf, -np.inf, 0.0, -0.0, 3.0], signed)
    b = finite_byte
    assert absmax == [INF_BITS] and q == [0, b, b, 0, 0, b, b, b]
    back = E.dequantize_blockwise(np.array(q, np.uint8), np.float32([np.inf]),
                                  E.create_dynamic_map(signed))
    assert np.isinf(back[1:3]).all() and np.isinf(back[0]) == signed


@pytest.mark.parametrize("signed", [True, False])
def test_a_subnormal_maximum_whose_reciprocal_overflows(signed):
    q, absmax = _q([1e-40, -3e-41, 0.0, 1e-45, -0.0, np.nan], signed)
    assert absmax == [71362] and q == [255, 0, 0, 255, 0, 0]  # 0 * inf is NaN: byte 0


def test_lion_sign_is_torchs():
    torch = pytest.importorskip("torch")
    x = np.float32([np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 2.0, -3.0, 1e-45] * 3)
    want = torch.sign(torch.from_numpy(x)).numpy()
    assert np.array_equal(E._torch_sign(x).view(np.uint32), want.view(np.uint32))


def test_the_nonfinite_goldens_hold_what_they_are_meant_to():
    """bitsandbytes' own trajectories: in Adam one NaN gradient makes one NaN weight (not the
    block's 256); Lion never makes a NaN weight; an infinite moment keeps its block's maximum
    infinite (m) or restarts it at 0 two steps later (v)."""
    adam = np.load(os.path.join(ROOT, "adam8bit_nonfinite_f32.npz"))
    assert np.isnan(adam["grad/2"]).sum() == 1 and np.isinf(adam["grad/2"]).sum() == 1
    assert [int(np.isnan(adam[f"param/{t}"][:256]).sum()) for t in (2, 3, 4, 5)] == [1, 2, 2, 2]
    assert adam["state1/2"][0] == 0 and adam["state1/3"][255] == 0
    assert [adam[f"absmax1/{t}"][2] for t in (2, 3, 4, 5)] == [np.inf] * 4
    assert [float(adam[f"absmax2/{t}"][1]) for t in (3, 4, 5)] == [np.inf, np.inf, 0.0]
    assert adam["absmax1/3"][3] == 0 and (adam["state1/3"][768:] == 0).all()
    for name in ("lion8bit_nonfinite_f32", "lion8bit_nonfinite_small_f32"):
        lion = np.load(os.path.join(ROOT, f"{name}.npz"))
        steps = 5 if "small" not in name else 4
        assert np.isnan(lion["grad/3"]).any()
        assert not any(np.isnan(lion[f"param/{t}"]).any() for t in range(1, steps + 1))
    small = np.load(os.path.join(ROOT, "lion8bit_nonfinite_small_f32.npz"))
    # the NaN gradient's weight only decays (sign 0): w * (1 - lr * wd), lr 1e-2, wd 0.1
    w1, w2 = small["param/1"][0], small["param/2"][0]
    assert w2 == np.float32(w1 * np.float32(1 - 1e-2 * 0.1))
