"""refopt.kernels.cpu.halfbits: float16/bfloat16 bits <-> float32 in Numba, against NumPy's
float16 casts and ml_dtypes' bfloat16 casts (what refopt.precision.round_to and the reference
use): every one of the 65,536 inputs of the loads; for the stores, every float32 at and next to
each rounding boundary (the midpoints between neighbouring low-precision values), the
overflow and subnormal ranges, NaN payloads of both signs, and 2**20 random bit patterns."""

import ml_dtypes
import numpy as np
import pytest
from numba import njit

from refopt.kernels.cpu import halfbits as H
from refopt.precision import round_to

F16 = np.dtype(np.float16)
BF16 = np.dtype(ml_dtypes.bfloat16)
FORMATS = [(F16, H.KIND_F16), (BF16, H.KIND_BF16)]
IDS = ["float16", "bfloat16"]


@njit
def load_all(h, kind):
    out = np.empty(h.shape[0], np.float32)
    for i in range(h.shape[0]):
        out[i] = H.load(h[i], kind)
    return out


@njit
def store_all(x, kind):
    out = np.empty(x.shape[0], np.uint16)
    for i in range(x.shape[0]):
        out[i] = H.store(x[i], kind)
    return out


ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def f32(bits):
    return np.asarray(bits, np.uint32).view(np.float32)


def boundaries(dtype):
    """float32 values at and around every rounding boundary of ``dtype``: the exact midpoint
    of each pair of neighbouring finite values (a tie), and the float32 on either side."""
    with np.errstate(invalid="ignore"):  # ml_dtypes warns casting its NaNs
        vals = ALL16.view(dtype).astype(np.float64)
    pos = np.sort(vals[np.isfinite(vals) & (vals >= 0)])
    pos = np.unique(pos)
    mids = ((pos[:-1] + pos[1:]) / 2).astype(np.float32)  # exact: a few more bits than dtype
    assert np.array_equal(mids.astype(np.float64), (pos[:-1] + pos[1:]) / 2)
    top = pos[-1] + (pos[-1] - pos[-2]) / 2  # half an ulp past the largest: overflows (tie)
    mids = np.append(mids, np.float32(top))
    near = [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0))]
    x = np.concatenate(near + [pos.astype(np.float32)])
    return np.concatenate([x, -x])


def special_f32():
    bits = [0, 1, 2, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x7F800000,  # 0, subnormals, max, inf
            0x7F800001, 0x7F801FFF, 0x7F802000, 0x7FA00000, 0x7FC00000, 0x7FFFFFFF,  # NaNs
            0x33000000, 0x33000001, 0x32FFFFFF, 0x477FEFFF, 0x477FF000, 0x477FF001]
    bits = np.array(bits, np.uint32)
    return f32(np.concatenate([bits, bits | np.uint32(0x80000000)]))


def random_f32(n=1 << 20, seed=0):
    rng = np.random.default_rng(seed)
    return f32(rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32))


def expected_bits(x, dtype):
    return round_to(x, dtype).view(np.uint16)


@pytest.mark.parametrize("dtype, kind", FORMATS, ids=IDS)
def test_loads_are_exact_on_all_65536_inputs(dtype, kind):
    got = load_all(ALL16, kind).view(np.uint32)
    want = ALL16.view(dtype).astype(np.float32).view(np.uint32)
    assert np.array_equal(got, want)  # NaN payloads and signs included
    # unjitted (the Python forms of the same functions), on a sample
    sample = ALL16[::257].tolist() + [0x0001, 0x03FF, 0x7C00, 0x7C01, 0xFE00, 0xFF81]
    with np.errstate(all="ignore"):  # NumPy scalars warn where the bit arithmetic wraps
        for h in sample:
            assert np.float32(H.load(h, kind)).view(np.uint32) == want[h], hex(h)


@pytest.mark.parametrize("dtype, kind", FORMATS, ids=IDS)
def test_stores_round_to_nearest_even_as_numpy_and_ml_dtypes(dtype, kind):
    x = np.concatenate([boundaries(dtype), special_f32(), random_f32()])
    got = store_all(x, kind)
    want = expected_bits(x, dtype)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(x.view(np.uint32)[i])), hex(int(got[i])), hex(int(want[i])))
                           for i in bad[:5]]
    with np.errstate(all="ignore"):
        for v in special_f32():
            assert H.store(v, kind) == expected_bits(np.array([v]), dtype)[0], v


@pytest.mark.parametrize("dtype, kind", FORMATS, ids=IDS)
def test_load_then_store_gives_the_bits_back(dtype, kind):
    back = store_all(load_all(ALL16, kind), kind)
    nan = np.isnan(ALL16.view(dtype).astype(np.float32))
    assert np.array_equal(back[~nan], ALL16[~nan])
    # a NaN stays a NaN of its sign; float16 keeps its payload, bfloat16 is quieted (0x7FC0)
    assert np.isnan(back[nan].view(dtype).astype(np.float32)).all()
    assert np.array_equal(back[nan] >> 15, ALL16[nan] >> 15)
    if dtype == F16:
        assert np.array_equal(back, ALL16)


@np.errstate(all="ignore")
def test_ties_and_edges_by_hand():
    assert H.f32_to_f16(np.float32(1 + 2.0**-11)) == 0x3C00  # tie to even: 1.0
    assert H.f32_to_f16(np.float32(1 + 3 * 2.0**-11)) == 0x3C02  # tie to even: up
    assert H.f32_to_f16(np.float32(65519.998)) == 0x7BFF and H.f32_to_f16(65520.0) == 0x7C00
    assert H.f32_to_f16(np.float32(2.0**-25)) == 0  # half the smallest subnormal: 0 (even)
    assert H.f32_to_f16(np.float32(-3 * 2.0**-25)) == 0x8002  # 1.5 subnormals: tie up to 2
    assert H.f32_to_bf16(np.float32(1 + 2.0**-8)) == 0x3F80
    assert H.f32_to_bf16(np.float32(-np.nan)) == 0xFFC0
    assert H.kind_of(F16) == H.KIND_F16 and H.kind_of(BF16) == H.KIND_BF16
    assert H.kind_of(np.float32) == 0
