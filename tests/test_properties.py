import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import refopt
from refopt import IndexedSlices, schedules
from refopt import reference as ref

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FLOATS = (F16, F32, F64)

# Largest magnitude of drawn weights and gradient rows. Adam squares gradients after summing
# duplicates (at most 11 rows here), so float16 data stays at 16: (11 * 16)^2 = 30976 < 65504.
BOUND = {F16: 16.0, F32: 1024.0, F64: 1024.0}

INDEX_DTYPES = (np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64)
ROW_TAILS = ((), (1,), (3,), (2, 2), (0,))

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# --------------------------------------------------------------------------- naive helpers
def naive_presum(slices):
    """Sum duplicate rows from zero in order of appearance; unique indices in first-appearance order."""
    row_shape = slices.dense_shape[1:]
    order, sums = [], {}
    for i, r in enumerate(slices.indices.tolist()):
        if r not in sums:
            order.append(r)
            sums[r] = np.zeros(row_shape, slices.dtype)
        sums[r] = sums[r] + slices.values[i]
    values = np.array([sums[r] for r in order], dtype=slices.dtype).reshape(
        (len(order),) + row_shape
    )
    return IndexedSlices(values, np.array(order, dtype=np.int64), slices.dense_shape)


def naive_dense(slices):
    out = np.zeros(slices.dense_shape, slices.dtype)
    for i, r in enumerate(slices.indices.tolist()):
        out[r] = out[r] + slices.values[i]
    return out


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(_UINT[a.dtype.itemsize])


def assert_bits_equal(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    np.testing.assert_array_equal(actual, expected, err_msg=what)  # NaN == NaN, -0.0 == +0.0
    np.testing.assert_array_equal(
        bits(actual), bits(expected), err_msg=f"{what}: equal values, different bits"
    )


def assert_bits_equal_nan_aware(actual, expected, what=""):
    """Bit-identical except that any NaN equals any NaN (payloads are not compared)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    nan = np.isnan(actual)
    np.testing.assert_array_equal(nan, np.isnan(expected), err_msg=f"{what}: NaN positions")
    assert_bits_equal(actual[~nan], expected[~nan], what)


def cuda_or_skip():
    """``refopt.kernels.cuda``, or a skip where neither numba-cuda's simulator nor a GPU is
    there (the catalogue's ``tests/test_<name>_fast.py`` share it)."""
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("needs numba's CUDA simulator or an NVIDIA GPU")
    return kc


def slot_names(opt):
    if isinstance(opt, refopt.SGD):
        return ("m",)
    return ("m", "v", "vhat") if opt.amsgrad else ("m", "v")


def opt_state(opt, variables):
    """Copies of everything an optimizer step may change, in a dict of labelled arrays."""
    state = {"iterations": np.array(opt.iterations, np.int64)}
    for i, var in enumerate(variables):
        state[f"var{i}"] = var.copy()
        for name in slot_names(opt):
            state[f"{name}{i}"] = opt.get_slot(var, name).copy()
        if opt.use_ema:
            state[f"average{i}"] = opt.get_slot(var, "average").copy()
    return state


def assert_states_bits_equal(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        if key == "iterations":
            assert int(actual[key]) == int(expected[key])
        else:
            assert_bits_equal(actual[key], expected[key], key)


def rows_mask(n_rows, indices):
    mask = np.zeros(n_rows, bool)
    mask[np.asarray(indices, dtype=np.int64)] = True
    return mask


# --------------------------------------------------------------------------- strategies
def elements(dtype, bound=None, *, min_magnitude=None):
    dtype = np.dtype(dtype)
    b = BOUND[dtype] if bound is None else bound
    floats = st.floats(-b, b, width=8 * dtype.itemsize, allow_nan=False, allow_infinity=False)
    if min_magnitude is None:
        return floats
    mag = st.floats(min_magnitude, b, width=8 * dtype.itemsize)
    return st.tuples(mag, st.sampled_from((-1.0, 1.0))).map(lambda t: t[0] * t[1])


def float_arrays(dtype, shape, bound=None, *, nonneg=False, min_magnitude=None):
    arrays = hnp.arrays(dtype, shape, elements=elements(dtype, bound, min_magnitude=min_magnitude))
    return arrays.map(np.abs) if nonneg else arrays


table_shapes = st.tuples(st.integers(0, 6), st.sampled_from(ROW_TAILS)).map(
    lambda t: (t[0],) + t[1]
)
nonempty_table_shapes = st.tuples(st.integers(1, 6), st.sampled_from(ROW_TAILS)).map(
    lambda t: (t[0],) + t[1]
)
dense_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=4)

learning_rates = st.floats(0.0, 1.0)
weight_decays = st.floats(0.0, 1.0)
momentums = st.floats(0.0, 1.0)


def betas(dtype):
    # float16 rounds 0.9999 to 1.0 (its spacing just below 1 is 2**-11); 1 - beta**t would be 0 and
    # Adam's alpha infinite. 0.999 rounds to 0.99902, still below 1.
    return st.floats(0.0, 0.999 if np.dtype(dtype) == F16 else 0.9999)


def epsilons(dtype):
    # 1e-8 rounds to 0 in float16 (smallest subnormal 2**-24 ~ 6e-8); 1e-7 rounds to 2**-23.
    return st.floats(1e-7 if np.dtype(dtype) == F16 else 1e-8, 1e-3)


def adam_hparams(dtype):
    return st.fixed_dictionaries(
        {
            "learning_rate": learning_rates,
            "beta_1": betas(dtype),
            "beta_2": betas(dtype),
            "epsilon": epsilons(dtype),
        }
    )


def sgd_hparams():
    return st.fixed_dictionaries(
        {"learning_rate": learning_rates, "momentum": momentums, "nesterov": st.booleans()}
    )


@st.composite
def adam_states(draw, dtype, shape, amsgrad):
    """A valid Adam state: any finite m, v >= 0, vhat >= v (AMSGrad) or None."""
    m = draw(float_arrays(dtype, shape))
    v = draw(float_arrays(dtype, shape, nonneg=True))
    vhat = None
    if amsgrad:
        vhat = np.maximum(v, draw(float_arrays(dtype, shape, nonneg=True)))
    return m, v, vhat


@st.composite
def slices_for(draw, shape, dtype, *, force_duplicates=False, rows=None, max_n=8, bound=None,
               min_magnitude=None):
    """An IndexedSlices for a table of `shape`: up to max_n + 3 indices drawn from `rows` (default:
    all rows), duplicates allowed (at least one with force_duplicates), possibly none."""
    candidates = list(range(shape[0])) if rows is None else list(rows)
    if not candidates:
        idx = []
    else:
        base = draw(st.lists(st.sampled_from(candidates), max_size=max_n))
        extra = []
        if base:
            extra = draw(st.lists(st.sampled_from(base), min_size=int(force_duplicates), max_size=3))
        idx = draw(st.permutations(base + extra))
    index_dtype = draw(st.sampled_from(INDEX_DTYPES))
    values = draw(
        float_arrays(dtype, (len(idx),) + tuple(shape[1:]), bound, min_magnitude=min_magnitude)
    )
    return IndexedSlices(values, np.array(idx, dtype=index_dtype), shape)


def make_adam(cls, hp, amsgrad, **extra):
    return cls(amsgrad=amsgrad, **hp, **extra)


# =========================================================================== 1. full-cover LazyAdam
# A LazyAdam gradient whose indices are a permutation of all rows must give *bit-identical*
# params and slots to Adam on the dense gradient: the same elementwise operations run in the same
# order on every element (deduplicating unique indices only computes 0 + g, which turns -0.0 into
# +0.0, and that cannot change m + (g - m)(1 - b1) nor g * g). Clipping by norm is left out: the
# norm of the permuted rows is summed in another order and may differ in the last ulp.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans())
def test_lazy_adam_full_permutation_bit_identical_to_dense_adam(data, dtype, shape, n_steps,
                                                                amsgrad):
    hp = data.draw(adam_hparams(dtype))
    extra = data.draw(st.fixed_dictionaries({
        "weight_decay": st.none() | weight_decays,
        "clipvalue": st.none() | st.floats(0.01, 100.0),
        "use_ema": st.booleans(),
        "ema_momentum": st.floats(0.0, 1.0),
        "ema_overwrite_frequency": st.none() | st.integers(1, 3),
    }))
    w0 = data.draw(float_arrays(dtype, shape))
    w_lazy, w_dense = w0.copy(), w0.copy()
    lazy = make_adam(refopt.LazyAdam, hp, amsgrad, **extra)
    adam = make_adam(refopt.Adam, hp, amsgrad, **extra)
    lazy.build([w_lazy])
    adam.build([w_dense])
    for _ in range(n_steps):
        g = data.draw(float_arrays(dtype, shape))
        perm = np.array(data.draw(st.permutations(range(shape[0]))), dtype=np.int64)
        lazy.apply_gradients([(IndexedSlices(g[perm], perm, shape), w_lazy)])
        adam.apply_gradients([(g, w_dense)])
        assert_states_bits_equal(opt_state(lazy, [w_lazy]), opt_state(adam, [w_dense]))


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans(), step0=st.integers(1, 1000))
def test_lazy_adam_update_full_permutation_bit_identical_to_adam_update(data, dtype, shape,
                                                                        n_steps, amsgrad, step0):
    hp = data.draw(adam_hparams(dtype))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    lazy = dense = ref.AdamResult(p, m, v, vhat)
    for step in range(step0, step0 + n_steps):
        g = data.draw(float_arrays(dtype, shape))
        perm = np.array(data.draw(st.permutations(range(shape[0]))), dtype=np.int64)
        lazy = ref.lazy_adam_update(lazy.param, IndexedSlices(g[perm], perm, shape), lazy.m,
                                    lazy.v, lazy.vhat, step=step, **hp)
        dense = ref.adam_update(dense.param, g, dense.m, dense.v, dense.vhat, step=step, **hp)
        for name in ("param", "m", "v", "vhat"):
            if getattr(dense, name) is None:
                assert getattr(lazy, name) is None
            else:
                assert_bits_equal(getattr(lazy, name), getattr(dense, name), name)


# =========================================================================== 2. duplicates
# Duplicate indices mean "sum": an IndexedSlices with duplicates must give bit-identical results
# to the same gradient pre-summed (from zero, in order of appearance) by naive_presum. Clipping is
# left out on purpose: tf-keras clips the raw rows before summing them.
def _sparse_optimizer_factory(kind, data, dtype):
    wd = data.draw(st.none() | weight_decays)
    if kind == "sgd":
        hp = data.draw(sgd_hparams())
        return lambda: refopt.SGD(weight_decay=wd, **hp)
    cls = refopt.LazyAdam if kind == "lazy_adam" else refopt.Adam
    hp = data.draw(adam_hparams(dtype))
    amsgrad = data.draw(st.booleans())
    return lambda: make_adam(cls, hp, amsgrad, weight_decay=wd)


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("lazy_adam", "adam", "sgd")), n_steps=st.integers(1, 3))
def test_duplicate_indices_equal_presummed_gradient(data, dtype, shape, kind, n_steps):
    factory = _sparse_optimizer_factory(kind, data, dtype)
    opt_dup, opt_sum = factory(), factory()
    w0 = data.draw(float_arrays(dtype, shape))
    w_dup, w_sum = w0.copy(), w0.copy()
    opt_dup.build([w_dup])
    opt_sum.build([w_sum])
    for _ in range(n_steps):
        g = data.draw(slices_for(shape, dtype, force_duplicates=True))
        opt_dup.apply_gradients([(g, w_dup)])
        opt_sum.apply_gradients([(naive_presum(g), w_sum)])
        assert_states_bits_equal(opt_state(opt_dup, [w_dup]), opt_state(opt_sum, [w_sum]))


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("lazy_adam", "adam", "sgd")), step=st.integers(1, 1000))
def test_reference_duplicate_indices_equal_presummed_gradient(data, dtype, shape, kind, step):
    p = data.draw(float_arrays(dtype, shape))
    g = data.draw(slices_for(shape, dtype, force_duplicates=True))
    presummed = naive_presum(g)
    if kind == "sgd":
        hp = data.draw(sgd_hparams())
        m = data.draw(float_arrays(dtype, shape))
        a = ref.sgd_update(p, g, m, **hp)
        b = ref.sgd_update(p, presummed, m, **hp)
    else:
        fn = ref.lazy_adam_update if kind == "lazy_adam" else ref.adam_update
        hp = data.draw(adam_hparams(dtype))
        m, v, vhat = data.draw(adam_states(dtype, shape, data.draw(st.booleans())))
        a = fn(p, g, m, v, vhat, step=step, **hp)
        b = fn(p, presummed, m, v, vhat, step=step, **hp)
    for name, x, y in zip(a._fields, a, b):
        if y is None:
            assert x is None
        else:
            assert_bits_equal(x, y, name)


# =========================================================================== 3. absent rows
# LazyAdam leaves the rows absent from a sparse gradient bit for bit unchanged: params, m, v and
# vhat, whatever the clipping and (lazy) weight decay. EMA is left out: the average covers every
# row, and an overwrite copies it into absent rows too.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans(),
       clip=st.sampled_from((None, "clipnorm", "clipvalue", "global_clipnorm")))
def test_lazy_adam_absent_rows_bit_identical(data, dtype, shape, n_steps, amsgrad, clip):
    hp = data.draw(adam_hparams(dtype))
    extra = {"weight_decay": data.draw(st.none() | weight_decays)}
    if clip is not None:
        extra[clip] = data.draw(st.floats(1e-3, 1e3))
    opt = make_adam(refopt.LazyAdam, hp, amsgrad, **extra)
    w = data.draw(float_arrays(dtype, shape))
    opt.build([w])
    for _ in range(n_steps):
        before = opt_state(opt, [w])
        g = data.draw(slices_for(shape, dtype))  # possibly zero indices, possibly duplicates
        opt.apply_gradients([(g, w)])
        after = opt_state(opt, [w])
        absent = ~rows_mask(shape[0], g.indices)
        for key in before:
            if key != "iterations":
                assert_bits_equal(after[key][absent], before[key][absent], key)
        assert int(after["iterations"]) == int(before["iterations"]) + 1


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       amsgrad=st.booleans(), step=st.integers(1, 1000))
def test_lazy_adam_update_absent_rows_bit_identical(data, dtype, shape, amsgrad, step):
    hp = data.draw(adam_hparams(dtype))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    g = data.draw(slices_for(shape, dtype))
    r = ref.lazy_adam_update(p, g, m, v, vhat, step=step, **hp)
    absent = ~rows_mask(shape[0], g.indices)
    for name, new, old in zip(r._fields, r, (p, m, v, vhat)):
        if old is None:
            assert new is None
        else:
            assert_bits_equal(new[absent], old[absent], name)


# The stateful LazyAdam (which gathers the present rows itself) and the reference function agree bit
# for bit on arbitrary index subsets: lazy weight decay of the present (deduplicated) rows with
# apply_weight_decay, then lazy_adam_update at the global step t = iterations + 1, with the learning
# rate the optimizer stores (rounded to float32).
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans())
def test_lazy_adam_optimizer_equals_reference_composition(data, dtype, shape, n_steps, amsgrad):
    hp = data.draw(adam_hparams(dtype))
    wd = data.draw(st.none() | weight_decays)
    opt = make_adam(refopt.LazyAdam, hp, amsgrad, weight_decay=wd)
    w = data.draw(float_arrays(dtype, shape))
    opt.build([w])
    r = ref.AdamResult(w.copy(), np.zeros(shape, dtype), np.zeros(shape, dtype),
                       np.zeros(shape, dtype) if amsgrad else None)
    ref_hp = dict(hp, learning_rate=float(np.float32(hp["learning_rate"])))
    for step in range(1, n_steps + 1):
        g = data.draw(slices_for(shape, dtype))
        opt.apply_gradients([(g, w)])
        p = r.param
        if wd is not None:
            rows = naive_presum(g).indices
            p = p.copy()
            p[rows] = ref.apply_weight_decay(p[rows], learning_rate=ref_hp["learning_rate"],
                                             weight_decay=wd)
        r = ref.lazy_adam_update(p, g, r.m, r.v, r.vhat, step=step, **ref_hp)
        assert_bits_equal(w, r.param, "param")
        for name in slot_names(opt):
            assert_bits_equal(opt.get_slot(w, name), getattr(r, name), name)


# The present rows do move. Checked on the first step from a fresh optimizer where the result is
# predictable: m = g (1 - b1), v = g^2 (1 - b2) and the weight moves by about
# lr |g| sqrt(1 - b2) / (|g| sqrt(1 - b2) + eps) >= 0.76 lr >= 0.0076 for |g| >= 0.1, lr >= 0.01,
# b2 <= 0.999, eps <= 1e-3 — more than half an ulp of any |w| <= 1 (2**-11 in float16).
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonempty_table_shapes,
       amsgrad=st.booleans())
def test_lazy_adam_present_rows_move_where_gradient_nonzero(data, dtype, shape, amsgrad):
    hp = {
        "learning_rate": data.draw(st.floats(0.01, 1.0)),
        "beta_1": data.draw(st.floats(0.0, 0.99)),
        "beta_2": data.draw(st.floats(0.0, 0.999)),
        "epsilon": data.draw(epsilons(dtype)),
    }
    opt = make_adam(refopt.LazyAdam, hp, amsgrad)
    w = data.draw(float_arrays(dtype, shape, bound=1.0))
    w0 = w.copy()
    g = data.draw(slices_for(shape, dtype, min_magnitude=0.125))
    summed = naive_dense(g).astype(np.float64)
    present = rows_mask(shape[0], g.indices)
    moving = (np.abs(summed) >= 0.1) & present.reshape((-1,) + (1,) * (len(shape) - 1))
    assume(moving.any())
    opt.apply_gradients([(g, w)])
    assert (opt.get_slot(w, "m")[moving] != 0).all()
    assert (opt.get_slot(w, "v")[moving] != 0).all()
    assert (w[moving] != w0[moving]).all()
    assert (np.sign(w0[moving] - w[moving]) == np.sign(summed[moving])).all()


# =========================================================================== 4. huge clip thresholds
# "Huge" thresholds, finite in the dtype and far above any norm drawn here (|g| <= BOUND, at most
# 44 elements: norm < 16 sqrt(44) < 107 in float16, < 6.8e3 otherwise), with g * c still finite
# (16 * 1000 < 65504; 1024 * 1e30 < 3.4e38). g * c is normal for float32/64 (2**-149 * 1e30 is far
# above 2**-126); in float16 it can be subnormal, but its absolute error (<= 2**-25) divided by c
# stays far below half the spacing of g, so the 1-ulp bound below still holds.
HUGE = {F16: 1000.0, F32: 1e30, F64: 1e30}
# Powers of two: g * c and (g * c) / c are exact scalings, and c * (1 / c) == 1, so clipping is
# exactly the identity (16 * 2**11 = 2**15 < 65504; 1024 * 2**100 < 2**128).
HUGE_POW2 = {F16: 2.0**11, F32: 2.0**100, F64: 2.0**100}


def _as_values(g):
    return g.values if isinstance(g, IndexedSlices) else g


def _dense_or_sparse(data, dtype):
    if data.draw(st.booleans()):
        return data.draw(slices_for(data.draw(table_shapes), dtype))
    return data.draw(float_arrays(dtype, data.draw(dense_shapes)))


# clip_by_norm with n < c computes (g * c) / c. x = fl(g c) = g c (1 + d) with |d| <= u = eps/2, so
# the exact x / c is within u |g| of g. For 2**k <= |g| < 2**(k+1), ulp(g) = 2**k * 2u > u |g| (and
# below 2**k the spacing 2**k * u is still >= u |g| when |g| = 2**k), so rounding x / c gives g or
# one of its neighbours: at most 1 ulp. (Subnormal g: g c is normal and the error u |g| is far
# below half the subnormal spacing.)
@given(data=st.data(), dtype=st.sampled_from(FLOATS), pow2=st.booleans())
def test_clip_by_norm_huge_threshold_is_identity(data, dtype, pow2):
    g = _dense_or_sparse(data, dtype)
    c = (HUGE_POW2 if pow2 else HUGE)[dtype]
    out = ref.clip_by_norm(g, c)
    assert type(out) is type(g)
    if pow2:
        assert_bits_equal(_as_values(out), _as_values(g))
    else:
        np.testing.assert_array_max_ulp(_as_values(out), _as_values(g), maxulp=1)
    if isinstance(g, IndexedSlices):
        np.testing.assert_array_equal(out.indices, g.indices)


# clip_by_global_norm with N < c: scale = c * min(1/N, 1/c) + (N - N) = fl(c * fl(1/c)), which is 1
# or a neighbour of 1 (1 - u or 1 + 2u; float64 1e30 gives 1 - 2**-53). g * scale then lies within
# one ulp of g, and rounding keeps it within 1 ulp.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), pow2=st.booleans(),
       n=st.integers(1, 3), with_none=st.booleans())
def test_clip_by_global_norm_huge_threshold_is_identity(data, dtype, pow2, n, with_none):
    grads = [_dense_or_sparse(data, dtype) for _ in range(n)]
    if with_none:
        grads.insert(data.draw(st.integers(0, n)), None)
    c = (HUGE_POW2 if pow2 else HUGE)[dtype]
    clipped, norm = ref.clip_by_global_norm(grads, c)
    assert norm < c
    assert len(clipped) == len(grads)
    for out, g in zip(clipped, grads):
        if g is None:
            assert out is None
            continue
        assert type(out) is type(g)
        if pow2:
            assert_bits_equal(_as_values(out), _as_values(g))
        else:
            np.testing.assert_array_max_ulp(_as_values(out), _as_values(g), maxulp=1)


# min(g, c) and max(., -c) are exact selections: with c >= max|g| (c rounded to the dtype stays
# >= max|g| because max|g| is representable) every element comes back unchanged, -0.0 included.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), factor=st.floats(1.0, 1e6))
def test_clip_by_value_at_or_above_max_abs_is_exact_identity(data, dtype, factor):
    g = _dense_or_sparse(data, dtype)
    values = _as_values(g)
    top = float(np.max(np.abs(values))) if values.size else 0.0
    c = min(top * factor, float(np.finfo(dtype).max)) if data.draw(st.booleans()) else top
    if c == 0.0:
        c = 1.0
    out = ref.clip_by_value(g, c)
    assert type(out) is type(g)
    assert_bits_equal(_as_values(out), values)


# Through the optimizer: a power-of-two threshold makes clipping exactly the identity, so whole
# trajectories (params and every slot) are bit-identical to no clipping.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("adam", "lazy_adam", "sgd")),
       mode=st.sampled_from(("clipnorm", "global_clipnorm")), n_steps=st.integers(1, 3))
def test_optimizer_with_power_of_two_huge_clip_equals_no_clipping(data, dtype, shape, kind, mode,
                                                                 n_steps):
    factory = _sparse_optimizer_factory(kind, data, dtype)
    plain = factory()
    config = plain.get_config()
    config[mode] = HUGE_POW2[dtype]
    clipped = type(plain).from_config(config)
    w0 = data.draw(float_arrays(dtype, shape))
    w_plain, w_clip = w0.copy(), w0.copy()
    plain.build([w_plain])
    clipped.build([w_clip])
    for _ in range(n_steps):
        g = _dense_or_sparse_for(data, dtype, shape)
        plain.apply_gradients([(g, w_plain)])
        clipped.apply_gradients([(g, w_clip)])
        assert_states_bits_equal(opt_state(clipped, [w_clip]), opt_state(plain, [w_plain]))


def _dense_or_sparse_for(data, dtype, shape):
    if data.draw(st.booleans()):
        return data.draw(slices_for(shape, dtype))
    return data.draw(float_arrays(dtype, shape))


# With a non-power-of-two threshold the clipped gradient is within 1 ulp of g (above). SGD with
# lr = 1, momentum 0 and w = 0 turns one step into w = 0 + (-g) * 1 = -g exactly, so the weights
# after one step are within 1 ulp of those without clipping.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=dense_shapes,
       mode=st.sampled_from(("clipnorm", "global_clipnorm")))
def test_sgd_with_huge_clip_within_one_ulp_of_no_clipping(data, dtype, shape, mode):
    g = data.draw(float_arrays(dtype, shape))
    w_plain, w_clip = np.zeros(shape, dtype), np.zeros(shape, dtype)
    refopt.SGD(learning_rate=1.0).apply_gradients([(g, w_plain)])
    refopt.SGD(learning_rate=1.0, **{mode: HUGE[dtype]}).apply_gradients([(g, w_clip)])
    np.testing.assert_array_equal(w_plain, -g)
    np.testing.assert_array_max_ulp(w_clip, w_plain, maxulp=1)


# =========================================================================== 5. constant schedules
# A schedule that is constant gives exactly the trajectory of the float learning rate. The optimizer
# stores a float learning rate rounded to float32, and the schedules compute in float32; drawing
# lr as a float32-representable number (width=32) makes both exactly lr, with no question of a
# double rounding. Each schedule below returns lr * 1, lr / 1 or a selected lr, i.e. lr exactly.
# lr is 0 or a *normal* float32: refopt.schedules flushes subnormal float32 results to zero (as
# TensorFlow's CPU kernels do; ExponentialDecay(1e-45, 10, 1.0) returns 0.0) while a float
# learning rate is kept as is, so the property does not hold for lr in (0, 2**-126) by design.
CONSTANT_LR = st.just(0.0) | st.floats(float(np.finfo(np.float32).tiny), 1.0, width=32)
CONSTANT_SCHEDULES = {
    "piecewise": lambda lr: schedules.PiecewiseConstantDecay(boundaries=[2], values=[lr, lr]),
    "exponential": lambda lr: schedules.ExponentialDecay(lr, 10, 1.0),
    "inverse_time": lambda lr: schedules.InverseTimeDecay(lr, 10, 0.0),
}


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("adam", "lazy_adam", "sgd")),
       schedule=st.sampled_from(sorted(CONSTANT_SCHEDULES)),
       lr=CONSTANT_LR, n_steps=st.integers(1, 5))
def test_constant_schedule_equals_float_learning_rate(data, dtype, shape, kind, schedule, lr,
                                                      n_steps):
    factory = _sparse_optimizer_factory(kind, data, dtype)
    config = factory().get_config()
    config["learning_rate"] = lr
    cls = {"adam": refopt.Adam, "lazy_adam": refopt.LazyAdam, "sgd": refopt.SGD}[kind]
    fixed = cls.from_config(config)
    config["learning_rate"] = CONSTANT_SCHEDULES[schedule](lr)
    scheduled = cls.from_config(config)
    w0 = data.draw(float_arrays(dtype, shape))
    w_fixed, w_sched = w0.copy(), w0.copy()
    fixed.build([w_fixed])
    scheduled.build([w_sched])
    for _ in range(n_steps):  # crosses the piecewise boundary (iterations 0..4)
        g = _dense_or_sparse_for(data, dtype, shape)
        fixed.apply_gradients([(g, w_fixed)])
        scheduled.apply_gradients([(g, w_sched)])
        assert scheduled.learning_rate == fixed.learning_rate == lr
        assert_states_bits_equal(opt_state(scheduled, [w_sched]), opt_state(fixed, [w_fixed]))


# =========================================================================== 6. EMA with momentum 0
# avg <- 0 * avg + 1 * w. For finite values 0 * avg is +-0 and +-0 + w == w; the only bit-level
# exception is w == -0.0 with avg >= +0 (+0 + -0 = +0, as in TensorFlow), which an optimizer
# trajectory never produces (a weight only becomes -0.0 from -0.0, and avg is the previous weight).
def _ema_factory(data, dtype, kind):
    wd = data.draw(st.none() | weight_decays)
    if kind == "sgd":
        hp = data.draw(sgd_hparams())
        return lambda **kw: refopt.SGD(weight_decay=wd, **hp, **kw)
    cls = refopt.LazyAdam if kind == "lazy_adam" else refopt.Adam
    hp = data.draw(adam_hparams(dtype))
    amsgrad = data.draw(st.booleans())
    return lambda **kw: make_adam(cls, hp, amsgrad, weight_decay=wd, **kw)


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("adam", "lazy_adam", "sgd")), n_steps=st.integers(1, 4))
def test_ema_momentum_zero_average_equals_weights(data, dtype, shape, kind, n_steps):
    factory = _ema_factory(data, dtype, kind)
    opt = factory(use_ema=True, ema_momentum=0.0)
    w = data.draw(float_arrays(dtype, shape))
    opt.build([w])
    assert_bits_equal(opt.get_slot(w, "average"), w, "average at build")
    for _ in range(n_steps):
        opt.apply_gradients([(_dense_or_sparse_for(data, dtype, shape), w)])
        assert_bits_equal(opt.get_slot(w, "average"), w, "average")


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       kind=st.sampled_from(("adam", "lazy_adam", "sgd")), n_steps=st.integers(1, 4))
def test_ema_overwrite_every_step_with_momentum_zero_equals_no_ema(data, dtype, shape, kind,
                                                                  n_steps):
    factory = _ema_factory(data, dtype, kind)
    with_ema = factory(use_ema=True, ema_momentum=0.0, ema_overwrite_frequency=1)
    without = factory()
    w0 = data.draw(float_arrays(dtype, shape))
    w_ema, w_plain = w0.copy(), w0.copy()
    with_ema.build([w_ema])
    without.build([w_plain])
    for _ in range(n_steps):
        g = _dense_or_sparse_for(data, dtype, shape)
        with_ema.apply_gradients([(g, w_ema)])
        without.apply_gradients([(g, w_plain)])
        state = opt_state(with_ema, [w_ema])
        assert_bits_equal(state.pop("average0"), w_ema, "average")
        assert_states_bits_equal(state, opt_state(without, [w_plain]))


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=dense_shapes)
def test_ema_update_momentum_zero_returns_weights(data, dtype, shape):
    average = data.draw(float_arrays(dtype, shape))
    w = data.draw(float_arrays(dtype, shape))
    out = ref.ema_update(average, w, ema_momentum=0.0)
    np.testing.assert_array_equal(out, w)  # value equality: -0.0 may come back as +0.0 (see above)
    signed_zero = (w == 0) & np.signbit(w) & ~np.signbit(average)
    assert_bits_equal(out[~signed_zero], w[~signed_zero])


# =========================================================================== 7. sparse Adam vs dense
# tf-keras' non-lazy sparse path computes, for a present element,
#     sparse: m_s = fl(fl(m + fl(-m c)) + fl(g c))      (4 roundings)
#     dense:  m_d = fl(m + fl(fl(g - m) c))              (3 roundings)
# (c = 1 - b1; the same with q = fl(g^2) and c = 1 - b2 for v). With unit roundoff u = eps/2 and
# each rounding fl(x) = x (1 + d), |d| <= u, the errors against the exact m + (g - m) c are at most
#     sparse: u (|m c| + |m (1 - c)| + |g c| + |m_s|)      dense: u (2 |g - m| c + |m_d|)
# to first order, so
#     |m_s - m_d| <= u (|m| + c |g| + 2 c |g - m| + |m_s| + |m_d|)                          (B1)
# plus at most 3.5 smallest subnormals of absolute error from underflowing roundings. A bound
# relative to m_new itself (a fixed number of ulps) does not exist: m (1 - c) and g c can cancel.
# vhat = max(vhat, v) is exact and 1-Lipschitz: |vhat_s - vhat_d| <= |v_s - v_d|.
# The weight step U = fl(fl(m a) / fl(fl(sqrt(w)) + eps)) (w = v or vhat) has relative error <= 4u
# (no cancellation: sqrt(w) and eps are >= 0), and exactly
#     m_s/D_s - m_d/D_d = (m_s - m_d)/D_s + m_d (D_d - D_s)/(D_s D_d),  D = sqrt(w) + eps,
#     |D_s - D_d| = |w_s - w_d| / (sqrt(w_s) + sqrt(w_d)),
# so |p_s - p_d| <= a |m_s - m_d| / D_s + a |m_d| |D_s - D_d| / (D_s D_d)
#                   + 4u (|U_s| + |U_d|) + u (|p_s| + |p_d|)                                   (B2)
# plus the underflow terms (an underflowing m a is off by half a subnormal, then divided by D).
# Both bounds get a 1 % margin for the second-order terms.
def _moment_bound(dtype, old, q, c, new_s, new_d):
    u = float(np.finfo(dtype).eps) / 2
    tiny = float(np.finfo(dtype).smallest_subnormal)
    old, q = old.astype(np.float64), q.astype(np.float64)
    f = lambda a: np.abs(np.asarray(a, np.float64))
    return 1.01 * u * (f(old) + c * f(q) + 2 * c * f(q - old) + f(new_s) + f(new_d)) + 4 * tiny


def _param_bound(dtype, alpha, eps, m_s, m_d, w_s, w_d, p_s, p_d):
    u = float(np.finfo(dtype).eps) / 2
    tiny = float(np.finfo(dtype).smallest_subnormal)
    m_s, m_d, w_s, w_d, p_s, p_d = (np.asarray(a, np.float64) for a in (m_s, m_d, w_s, w_d, p_s, p_d))
    r_s, r_d = np.sqrt(w_s), np.sqrt(w_d)
    d_s, d_d = r_s + eps, r_d + eps
    with np.errstate(divide="ignore", invalid="ignore"):
        dr = np.where(r_s + r_d > 0, np.abs(w_s - w_d) / (r_s + r_d), 0.0)
    du = alpha * np.abs(m_s - m_d) / d_s + alpha * np.abs(m_d) * dr / (d_s * d_d)
    u_s, u_d = alpha * np.abs(m_s) / d_s, alpha * np.abs(m_d) / d_d
    rounding = 4 * u * (u_s + u_d) + u * (np.abs(p_s) + np.abs(p_d))
    underflow = tiny * (1 / d_s + 1 / d_d) + 4 * tiny
    return 1.01 * (du + rounding) + underflow


@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes,
       amsgrad=st.booleans(), step=st.integers(1, 1000))
def test_adam_sparse_path_close_to_dense_summed_gradient(data, dtype, shape, amsgrad, step):
    hp = data.draw(adam_hparams(dtype))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    g = data.draw(slices_for(shape, dtype))
    dense_g = g.to_dense()
    s = ref.adam_update(p, g, m, v, vhat, step=step, **hp)
    d = ref.adam_update(p, dense_g, m, v, vhat, step=step, **hp)
    sc = ref.adam_scalars(dtype, step=step, **hp)
    c1, c2 = float(sc.one_minus_beta_1), float(sc.one_minus_beta_2)

    # Absent rows: dense computes m + (0 - m) c, sparse m + (-m) c; 0 - m == -m bit for bit (signed
    # zeros included, after adding to m), likewise for v with 0^2 = 0: bit-identical.
    absent = ~rows_mask(shape[0], g.indices)
    for name, x, y in zip(s._fields, s, d):
        if y is None:
            assert x is None
        else:
            assert_bits_equal(x[absent], y[absent], name)

    def diff(a, b):
        with np.errstate(invalid="ignore"):  # inf - inf where both overflowed (float16)
            return np.abs(a.astype(np.float64) - b.astype(np.float64))

    assert (diff(s.m, d.m) <= _moment_bound(dtype, m, dense_g, c1, s.m, d.m)).all()
    q = np.square(dense_g)
    assert (diff(s.v, d.v) <= _moment_bound(dtype, v, q, c2, s.v, d.v)).all()
    w_s, w_d = s.v, d.v
    if amsgrad:
        assert (diff(s.vhat, d.vhat) <= diff(s.v, d.v)).all()
        w_s, w_d = s.vhat, d.vhat
    bound = _param_bound(dtype, float(sc.alpha), float(sc.epsilon), s.m, d.m, w_s, w_d,
                         s.param, d.param)
    # (Equal results pass as such: float16 steps can overflow to the same infinity in both.)
    assert ((s.param == d.param) | (diff(s.param, d.param) <= bound)).all()


# Over several steps, rows never named by the sparse gradients evolve through the same elementwise
# operations in both optimizers (weight decay, moment decay, AMSGrad maximum, weight step, EMA), so
# they stay bit-identical to Adam on the dense (summed) gradient.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonempty_table_shapes,
       amsgrad=st.booleans(), n_steps=st.integers(1, 4))
def test_adam_sparse_path_cold_rows_bit_identical_over_steps(data, dtype, shape, amsgrad,
                                                             n_steps):
    hp = data.draw(adam_hparams(dtype))
    extra = data.draw(st.fixed_dictionaries({
        "weight_decay": st.none() | weight_decays,
        "use_ema": st.booleans(),
        "ema_momentum": st.floats(0.0, 1.0),
    }))
    hot = data.draw(st.lists(st.integers(0, shape[0] - 1), unique=True, max_size=shape[0] - 1))
    cold = ~rows_mask(shape[0], hot)
    sparse_opt = make_adam(refopt.Adam, hp, amsgrad, **extra)
    dense_opt = make_adam(refopt.Adam, hp, amsgrad, **extra)
    w0 = data.draw(float_arrays(dtype, shape))
    w_s, w_d = w0.copy(), w0.copy()
    sparse_opt.build([w_s])
    dense_opt.build([w_d])
    for _ in range(n_steps):
        g = data.draw(slices_for(shape, dtype, rows=hot))
        sparse_opt.apply_gradients([(g, w_s)])
        dense_opt.apply_gradients([(g.to_dense(), w_d)])
        a, b = opt_state(sparse_opt, [w_s]), opt_state(dense_opt, [w_d])
        for key in a:
            if key != "iterations":
                assert_bits_equal(a[key][cold], b[key][cold], key)


# =========================================================================== 8. inputs never mutated
def _copy_inputs(x):
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, IndexedSlices):
        return IndexedSlices(x.values.copy(), x.indices.copy(), x.dense_shape)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a NamedTuple (SparseMomentumBuffer)
        return type(x)(*(_copy_inputs(e) for e in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_copy_inputs(e) for e in x)
    return x


def _assert_inputs_unchanged(after, before, what):
    if isinstance(before, np.ndarray):
        assert_bits_equal(after, before, what)
    elif isinstance(before, IndexedSlices):
        assert_bits_equal(after.values, before.values, f"{what}.values")
        assert_bits_equal(after.indices, before.indices, f"{what}.indices")
        assert after.dense_shape == before.dense_shape
    elif isinstance(before, (list, tuple)):
        assert len(after) == len(before)
        for i, (a, b) in enumerate(zip(after, before)):
            _assert_inputs_unchanged(a, b, f"{what}[{i}]")


def _float_arrays_in(x):
    if isinstance(x, np.ndarray):
        return [x] if x.dtype.kind == "f" else []
    if isinstance(x, IndexedSlices):
        return [x.values]
    if isinstance(x, (list, tuple)):
        return [a for e in x for a in _float_arrays_in(e)]
    return []


@st.composite
def _reference_call(draw, name):
    """(function, args, kwargs) for one reference function, inputs possibly non-finite."""
    dtype = draw(st.sampled_from(FLOATS))
    shape = draw(table_shapes)
    wild = st.floats(width=8 * dtype.itemsize)  # NaN and infinities included
    p = draw(hnp.arrays(dtype, shape, elements=wild))
    if draw(st.booleans()):
        g = draw(slices_for(shape, dtype))
        if draw(st.booleans()):
            g = g.deduplicate()  # an already-deduplicated gradient takes shortcuts
    else:
        g = draw(hnp.arrays(dtype, shape, elements=wild))
    if name in ("sgd_sparse_torch_update", "sgd_sparse_scatter_update"):  # rows, in turn
        if not shape:
            shape = (3,)
            p = draw(hnp.arrays(dtype, shape, elements=wild))
        g = draw(slices_for(shape, dtype))
        return getattr(ref, name), (p, g), {"learning_rate": draw(learning_rates)}
    if name == "sgd_sparse_torch_momentum_update":  # torch's sparse buffer, or none yet
        if not shape:
            shape = (3,)
            p = draw(hnp.arrays(dtype, shape, elements=wild))
        g = draw(slices_for(shape, dtype))
        buf = None
        if draw(st.booleans()):
            b = draw(slices_for(shape, dtype))
            buf = ref.SparseMomentumBuffer(np.asarray(b.indices), np.asarray(b.values))
        kw = {"learning_rate": draw(learning_rates), "momentum": draw(st.floats(0.1, 0.99)),
              "dampening": draw(st.floats(0.0, 0.5)), "nesterov": draw(st.booleans())}
        return ref.sgd_sparse_torch_momentum_update, (p, g, buf), kw
    if name in ("adam_update", "lazy_adam_update"):
        m, v, vhat = draw(adam_states(dtype, shape, draw(st.booleans())))
        kw = dict(draw(adam_hparams(dtype)), step=draw(st.integers(1, 100)))
        return getattr(ref, name), (p, g, m, v, vhat), kw
    if name == "sgd_update":
        m = draw(float_arrays(dtype, shape))
        return ref.sgd_update, (p, g, m), draw(sgd_hparams())
    if name == "rmsprop_update":
        g = draw(hnp.arrays(dtype, shape, elements=wild))  # dense only
        kw, args = draw(rmsprop_call(dtype, shape))
        return ref.rmsprop_update, (p, g) + args, kw
    if name == "rmsprop_initial_state":
        kw, _ = draw(rmsprop_call(dtype, shape))
        return ref.rmsprop_initial_state, (p,), {
            "momentum": kw["momentum"], "centered": kw["centered"],
            "convention": kw["convention"]}
    if name == "adagrad_update":
        kw, acc = draw(adagrad_call(dtype, shape))
        if str(kw["convention"]).startswith("optax") or not shape:  # no sparse gradients
            g = draw(hnp.arrays(dtype, shape, elements=wild))
        return ref.adagrad_update, (p, g, acc), kw
    if name == "adagrad_initial_state":
        kw, _ = draw(adagrad_call(dtype, shape))
        return ref.adagrad_initial_state, (p,), {
            "initial_accumulator_value": draw(st.sampled_from([None, 0.0, 0.1, 1.0])),
            "convention": kw["convention"]}
    if name in ("asgd_update", "rprop_update"):  # torch only, dense only
        g = draw(hnp.arrays(dtype, shape, elements=wild))
        if name == "asgd_update":
            return ref.asgd_update, (p, g, draw(float_arrays(dtype, shape))), dict(
                learning_rate=draw(learning_rates), lambd=draw(st.sampled_from([0.0, 1e-4])),
                alpha=0.75, t0=draw(st.sampled_from([0.0, 1e6])), step=draw(st.integers(1, 9)))
        prev = draw(hnp.arrays(dtype, shape, elements=wild))
        return ref.rprop_update, (p, g, prev, draw(float_arrays(dtype, shape, nonneg=True))), {}
    if name == "asgd_initial_state":
        return ref.asgd_initial_state, (p,), {}
    if name == "rprop_initial_state":
        return ref.rprop_initial_state, (p,), {"learning_rate": draw(learning_rates)}
    if name == "adamax_update":
        conv = draw(st.sampled_from(["tf_keras", "keras3", "keras2", "torch", "optax"]))
        if conv in ("torch", "optax") or not shape:  # no sparse gradients there
            g = draw(hnp.arrays(dtype, shape, elements=wild))
        m = draw(float_arrays(dtype, shape))
        u = draw(float_arrays(dtype, shape, nonneg=True))
        return ref.adamax_update, (p, g, m, u), dict(
            draw(adam_hparams(dtype)), step=draw(st.integers(1, 100)), convention=conv)
    if name == "adamax_initial_state":
        return ref.adamax_initial_state, (p,), {}
    if name == "ftrl_update":
        conv = draw(st.sampled_from(["tf_keras", "keras3", "keras2", "tf1"]))
        n = draw(float_arrays(dtype, shape, nonneg=True))
        return ref.ftrl_update, (p, g, n, draw(float_arrays(dtype, shape))), dict(
            learning_rate=draw(st.floats(1e-3, 1.0)), convention=conv,
            learning_rate_power=draw(st.sampled_from([-0.5, -0.3])),
            l2_shrinkage_regularization_strength=draw(st.sampled_from([0.0, 0.1])))
    if name == "ftrl_initial_state":
        return ref.ftrl_initial_state, (p,), {}
    if name.endswith("_initial_state") and name[:-len("_initial_state")] in (
            "adadelta", "lamb", "lion", "nadam", "radam", "adafactor"):
        return getattr(ref, name), (p,), {}
    dense = hnp.arrays(dtype, shape, elements=wild)
    if name.startswith("partial_rowwise_adam"):  # FBGEMM's: float32 tables only, v per row
        f32 = np.dtype(np.float32)
        p = draw(hnp.arrays(f32, shape, elements=st.floats(width=32)))
        if name == "partial_rowwise_adam_initial_state":
            return ref.partial_rowwise_adam_initial_state, (p,), {}
        g = draw(hnp.arrays(f32, shape, elements=st.floats(width=32)))
        if shape and name == "partial_rowwise_adam_update" and draw(st.booleans()):
            g = draw(slices_for(shape, f32))
        m = draw(float_arrays(f32, shape))
        v = draw(float_arrays(f32, shape[:1], nonneg=True))
        kw = dict(learning_rate=draw(learning_rates), beta_1=draw(st.sampled_from([0.0, 0.9])),
                  beta_2=draw(st.sampled_from([0.5, 0.999])),
                  epsilon=draw(st.sampled_from([1e-8, 1e-3])),
                  weight_decay=draw(st.sampled_from([0.0, 0.1])), step=draw(st.integers(1, 100)))
        return getattr(ref, name), (p, g, m, v), kw
    if name.startswith("rowwise_adagrad"):  # FBGEMM's: one accumulator per row
        acc = draw(float_arrays(dtype, shape[:1], nonneg=True))
        mode = draw(st.sampled_from(["none", "l2", "decoupled"]))
        kw = dict(learning_rate=draw(learning_rates), epsilon=draw(st.sampled_from([1e-8, 1e-3])),
                  # a decay under "none" is refused (FBGEMM would ignore it)
                  weight_decay=0.0 if mode == "none" else draw(st.sampled_from([0.0, 0.1])),
                  weight_decay_mode=mode)
        if name == "rowwise_adagrad_initial_state":
            return ref.rowwise_adagrad_initial_state, (p,), {}
        if name == "rowwise_adagrad_rows" or not shape:
            g = draw(dense)
        return getattr(ref, name), (p, g, acc), kw
    if name.startswith("proximal_"):  # TF1's: any strengths, an accumulator of any sign
        kw = dict(learning_rate=draw(learning_rates),
                  l1_regularization_strength=draw(st.sampled_from([0.0, 0.05])),
                  l2_regularization_strength=draw(st.sampled_from([0.0, 0.1])))
        if name == "proximal_adagrad_initial_state":
            return ref.proximal_adagrad_initial_state, (p,), {}
        if name == "proximal_gradient_descent_update":
            return ref.proximal_gradient_descent_update, (p, g), kw
        return ref.proximal_adagrad_update, (p, g, draw(dense)), kw
    if name == "adadelta_update":
        conv = draw(st.sampled_from(["tf_keras", "keras3", "keras2", "tf1", "torch", "optax"]))
        if conv in ("torch", "optax") or not shape:  # no sparse gradients there
            g = draw(dense)
        acc_g, acc_d = (draw(float_arrays(dtype, shape, nonneg=True)) for _ in range(2))
        return ref.adadelta_update, (p, g, acc_g, acc_d), dict(
            learning_rate=draw(learning_rates), rho=draw(st.sampled_from([0.0, 0.9, 0.95])),
            epsilon=draw(st.sampled_from([1e-7, 1e-3])), convention=conv)
    if name in ("nadam_update", "lamb_update", "radam_update"):
        conv = draw(st.sampled_from({"nadam_update": ["tf_keras", "keras3", "keras2", "torch",
                                                      "optax"],
                                     "lamb_update": ["keras3", "optax"],
                                     "radam_update": ["torch", "optax"]}[name]))
        if conv in ("torch", "optax") or name != "nadam_update" or not shape:
            g = draw(dense)
        m = draw(float_arrays(dtype, shape))
        v = draw(float_arrays(dtype, shape, nonneg=True))
        hp = draw(adam_hparams(dtype))
        hp.pop("amsgrad", None)
        return getattr(ref, name), (p, g, m, v), dict(hp, step=draw(st.integers(1, 100)),
                                                      convention=conv)
    if name == "lion_update":
        conv = draw(st.sampled_from(["tf_keras", "keras3", "optax"]))
        if conv == "optax" or not shape:
            g = draw(dense)
        return ref.lion_update, (p, g, draw(float_arrays(dtype, shape))), dict(
            learning_rate=draw(learning_rates), convention=conv)
    if name == "adafactor_update":
        conv = draw(st.sampled_from(["tf_keras", "keras3", "optax"] + (
            ["torch"] if p.size else [])))  # torch raises on a variable without elements
        state = ref.adafactor_initial_state(p, convention=conv)
        return ref.adafactor_update, (draw(float_arrays(dtype, shape)), draw(dense)) + tuple(
            state), dict(learning_rate=draw(learning_rates), step=draw(st.integers(1, 9)),
                         convention=conv)
    if name == "ema_update":
        return ref.ema_update, (p, draw(float_arrays(dtype, shape))), {
            "ema_momentum": draw(st.floats(0.0, 1.0))}
    if name == "apply_weight_decay":
        return ref.apply_weight_decay, (p,), {
            "learning_rate": draw(learning_rates), "weight_decay": draw(weight_decays)}
    if name == "clip_by_value":
        return ref.clip_by_value, (g, draw(st.floats(0.0, 100.0))), {}
    if name == "clip_by_norm":
        return ref.clip_by_norm, (g, draw(st.floats(-1.0, 100.0))), {}
    grads = [g, None, p] if draw(st.booleans()) else [g]
    if name == "global_norm":
        return ref.global_norm, (grads,), {}
    assert name == "clip_by_global_norm"
    use_norm = draw(st.none() | st.floats(0.0, 100.0))
    return ref.clip_by_global_norm, (grads, draw(st.floats(1e-3, 100.0))), {"use_norm": use_norm}


REFERENCE_FUNCTIONS = (
    "adam_update", "lazy_adam_update", "sgd_update", "ema_update", "apply_weight_decay",
    "clip_by_value", "clip_by_norm", "clip_by_global_norm", "global_norm", "rmsprop_update",
    "rmsprop_initial_state", "adagrad_update", "adagrad_initial_state",
)
REFERENCE_FUNCTIONS += ("adamax_update", "adamax_initial_state")
REFERENCE_FUNCTIONS += ("asgd_update", "asgd_initial_state", "rprop_update",
                        "rprop_initial_state")
REFERENCE_FUNCTIONS += ("ftrl_update", "ftrl_initial_state")
REFERENCE_FUNCTIONS += tuple(f"{n}_{kind}" for n in ("adadelta", "lamb", "lion", "nadam",
                                                      "radam", "adafactor")
                             for kind in ("update", "initial_state"))
REFERENCE_FUNCTIONS += ("proximal_adagrad_update", "proximal_adagrad_initial_state",
                        "proximal_gradient_descent_update")
REFERENCE_FUNCTIONS += ("rowwise_adagrad_update", "rowwise_adagrad_sequential_update",
                        "rowwise_adagrad_initial_state", "rowwise_adagrad_rows")
REFERENCE_FUNCTIONS += ("partial_rowwise_adam_update", "partial_rowwise_adam_initial_state",
                        "partial_rowwise_adam_rows")
REFERENCE_FUNCTIONS += ("sgd_sparse_torch_update", "sgd_sparse_scatter_update",
                        "sgd_sparse_torch_momentum_update")


@st.composite
def rmsprop_call(draw, dtype, shape):
    """(keyword arguments, (velocity, momentum_buf, average_gradient)) of a valid RMSprop call
    under any convention's form."""
    from refopt.conventions import PRESETS

    conv = draw(st.sampled_from(sorted(PRESETS)))
    momentum = draw(st.sampled_from([0.0, 0.5, 0.9]))
    centered = draw(st.booleans())
    kw = {"learning_rate": draw(learning_rates), "rho": draw(st.sampled_from([0.0, 0.5, 0.9, 0.99])),
          "momentum": momentum, "epsilon": draw(st.sampled_from([1e-7, 1e-3, 0.0])),
          "centered": centered, "convention": conv}
    if conv == "optax" and draw(st.booleans()):
        kw["eps_in_sqrt"] = draw(st.booleans())
    v = np.asarray(draw(float_arrays(dtype, shape, nonneg=True)))  # np.abs of 0-d is a scalar
    keep = momentum > 0 or conv == "tf1" or draw(st.booleans())
    b = draw(float_arrays(dtype, shape)) if keep else None
    a = draw(float_arrays(dtype, shape)) if centered else None
    return kw, (v, b, a)


@st.composite
def adagrad_call(draw, dtype, shape):
    """(keyword arguments, accumulator) of a valid Adagrad call under any convention's form
    (the accumulator any non-negative array: a sum of squares)."""
    from refopt.conventions import PRESETS, get_convention

    conv = draw(st.sampled_from(sorted(PRESETS)))
    kw = {"learning_rate": draw(learning_rates),
          "epsilon": None if conv == "tf1" else draw(st.sampled_from([1e-7, 1e-10, 1e-3, 0.0])),
          "convention": conv}
    if conv == "torch":
        kw["lr_decay"] = draw(st.sampled_from([0.0, 0.1]))
        kw["step"] = draw(st.integers(1, 5))
    if conv == "keras3" and draw(st.booleans()):
        kw["convention"] = get_convention("keras3", keras3_sparse_square=True)
    acc = np.asarray(draw(float_arrays(dtype, shape, nonneg=True)))  # np.abs of 0-d: scalar
    return kw, acc


def test_reference_function_list_is_complete():
    # adam_scalars takes only a dtype and Python numbers: nothing it could mutate.
    public = {n for n in ref.__all__ if callable(getattr(ref, n)) and n[0].islower()}
    # initial_velocity and initial_accumulator take only a convention, a dtype and a number.
    assert public - {"adam_scalars", "initial_velocity", "initial_accumulator"} == set(
        REFERENCE_FUNCTIONS)


@pytest.mark.parametrize("name", REFERENCE_FUNCTIONS)
@given(data=st.data())
def test_reference_functions_never_mutate_inputs_and_return_new_arrays(name, data):
    fn, args, kwargs = data.draw(_reference_call(name))
    before = _copy_inputs(args)
    out = fn(*args, **kwargs)
    _assert_inputs_unchanged(args, before, name)
    inputs = _float_arrays_in(args)
    for result in _float_arrays_in(out if isinstance(out, (list, tuple)) else [out]):
        for arr in inputs:
            assert not np.shares_memory(result, arr), f"{name} returned a view of an input"


# =========================================================================== 9. non-finite gradients
@st.composite
def poisoned(draw, dtype, shape):
    """A finite gradient of `shape` with at least one NaN, inf or -inf; shape has an element."""
    g = draw(float_arrays(dtype, shape))
    flat = g.reshape(-1)
    positions = draw(st.lists(st.integers(0, flat.size - 1), min_size=1, max_size=3, unique=True))
    for pos in positions:
        flat[pos] = draw(st.sampled_from((np.nan, np.inf, -np.inf)))
    return g


nonempty_dense_shapes = hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=4)


# One Adam step from a fresh state (notes 3.3): m = 0 + (g - 0) c is NaN where g is NaN and +-inf
# where g is +-inf (c = 1 - b1 > 0); v = inf there; the step m a / (sqrt(v) + eps) is NaN/x or
# inf/inf (or inf * 0 when lr = 0): the weight is NaN exactly where g is not finite, and finite
# elsewhere.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonempty_dense_shapes,
       amsgrad=st.booleans())
def test_adam_nonfinite_gradient_gives_nan_weights_exactly_there(data, dtype, shape, amsgrad):
    hp = data.draw(adam_hparams(dtype))
    g = data.draw(poisoned(dtype, shape))
    w = data.draw(float_arrays(dtype, shape))
    opt = make_adam(refopt.Adam, hp, amsgrad)
    opt.apply_gradients([(g, w)])
    bad = ~np.isfinite(g)
    np.testing.assert_array_equal(np.isnan(w), bad)
    assert np.isfinite(w[~bad]).all()
    m = opt.get_slot(w, "m")
    np.testing.assert_array_equal(np.isnan(m), np.isnan(g))
    np.testing.assert_array_equal(m[np.isinf(g)], g[np.isinf(g)])
    assert np.isposinf(opt.get_slot(w, "v")[np.isinf(g)]).all()


# global_clipnorm (notes 3.3, 4): one inf or NaN anywhere makes the global norm N non-finite, the
# scale c min(1/N, 1/c) + (N - N) NaN, and every gradient NaN: an SGD step then writes NaN into
# every element of every variable that had a dense gradient ((-NaN) lr + m mu is NaN even for
# lr = 0). A sparse gradient stays sparse (tf.clip_by_global_norm keeps IndexedSlices): only its
# rows turn NaN, the others keep their values (m = 0 * mu there). A None gradient skips its variable.
@given(data=st.data(), dtype=st.sampled_from(FLOATS),
       shapes=st.lists(nonempty_dense_shapes, min_size=1, max_size=3),
       with_sparse=st.booleans(), with_none=st.booleans())
def test_global_clipnorm_nonfinite_anywhere_makes_every_variable_nan(data, dtype, shapes,
                                                                    with_sparse, with_none):
    opt = refopt.SGD(global_clipnorm=data.draw(st.floats(1e-3, 1e3)), **data.draw(sgd_hparams()))
    variables = [data.draw(float_arrays(dtype, s)) for s in shapes]
    bad_at = data.draw(st.integers(0, len(shapes) - 1))
    grads = [data.draw(poisoned(dtype, s)) if i == bad_at else data.draw(float_arrays(dtype, s))
             for i, s in enumerate(shapes)]
    if with_sparse:
        table_shape = data.draw(nonempty_table_shapes)
        variables.append(data.draw(float_arrays(dtype, table_shape)))
        grads.append(data.draw(slices_for(table_shape, dtype)))
    if with_none:
        variables.append(data.draw(float_arrays(dtype, data.draw(dense_shapes))))
        grads.append(None)
    before = [v.copy() for v in variables]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Gradients do not exist for ..."
        opt.apply_gradients(list(zip(grads, variables)))
    for g, w, w0 in zip(grads, variables, before):
        if g is None:
            assert_bits_equal(w, w0, "variable without gradient")
        elif isinstance(g, IndexedSlices):
            present = rows_mask(w.shape[0], g.indices)
            assert np.isnan(w[present]).all()
            np.testing.assert_array_equal(w[~present], w0[~present])
        else:
            assert np.isnan(w).all()


# clipnorm clips each tensor on its own (notes 3.3 "Non-finite inputs"): a tensor with a NaN has a
# NaN norm and becomes NaN everywhere; a tensor with +-inf (and no NaN) has norm inf and becomes NaN
# at the infinities (inf c / inf) and +-0 elsewhere (g c / inf). The other tensors are untouched:
# their variables end bit-identical to a run where the poisoned gradient is None.
@given(data=st.data(), dtype=st.sampled_from(FLOATS),
       shapes=st.lists(nonempty_dense_shapes, min_size=2, max_size=3))
def test_clipnorm_nonfinite_affects_only_that_tensor(data, dtype, shapes):
    c = data.draw(st.floats(1e-3, 1e3))
    hp = data.draw(sgd_hparams())
    variables = [data.draw(float_arrays(dtype, s)) for s in shapes]
    bad_at = data.draw(st.integers(0, len(shapes) - 1))
    grads = [data.draw(poisoned(dtype, s)) if i == bad_at else data.draw(float_arrays(dtype, s))
             for i, s in enumerate(shapes)]
    g_bad = grads[bad_at]
    if np.isnan(g_bad).any():
        expected_nan = np.ones(g_bad.shape, bool)
    else:
        expected_nan = np.isinf(g_bad)
    clipped = ref.clip_by_norm(g_bad, c)
    np.testing.assert_array_equal(np.isnan(clipped), expected_nan)
    np.testing.assert_array_equal(clipped[~expected_nan], 0)

    twin_vars = [v.copy() for v in variables]
    opt, twin = refopt.SGD(clipnorm=c, **hp), refopt.SGD(clipnorm=c, **hp)
    opt.build(variables)
    twin.build(twin_vars)
    w_bad0 = variables[bad_at].copy()
    opt.apply_gradients(list(zip(grads, variables)))
    twin_grads = [None if i == bad_at else g for i, g in enumerate(grads)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "Gradients do not exist for ..."
        twin.apply_gradients(list(zip(twin_grads, twin_vars)))
    w_bad = variables[bad_at]
    np.testing.assert_array_equal(np.isnan(w_bad), expected_nan)
    # Fresh momentum: w + ((-0) lr + 0 mu) keeps the value where the clipped gradient is +-0.
    np.testing.assert_array_equal(w_bad[~expected_nan], w_bad0[~expected_nan])
    for i, (w, w_twin) in enumerate(zip(variables, twin_vars)):
        if i != bad_at:
            assert_bits_equal(w, w_twin, f"variable {i}")
            assert_bits_equal(opt.get_slot(w, "m"), twin.get_slot(w_twin, "m"), f"m {i}")


# clip_by_value (notes 3.3): inf -> c, -inf -> -c, NaN stays NaN, finite values clipped.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=nonempty_dense_shapes)
def test_clip_by_value_nonfinite_pattern(data, dtype, shape):
    g = data.draw(poisoned(dtype, shape))
    c = data.draw(st.floats(1e-3, 1e3))
    out = ref.clip_by_value(g, c)
    cd = dtype.type(c)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(g))
    assert (out[np.isposinf(g)] == cd).all()
    assert (out[np.isneginf(g)] == -cd).all()
    finite = np.isfinite(g)
    assert_bits_equal(out[finite], np.clip(g[finite], -cd, cd))


# =========================================================================== 10. atomicity
FAILURES = {
    "wrong_shape": ValueError,
    "wrong_dtype": TypeError,
    "unknown_variable": KeyError,
    "slices_wrong_dense_shape": ValueError,
    "slices_wrong_dtype": TypeError,
    "same_variable_twice": ValueError,
    "not_a_gradient": TypeError,
    "not_a_pair": TypeError,
    "all_none": ValueError,
}


def _bad_pairs(failure, grads, variables):
    """A grads_and_vars list whose first pair is valid and whose second pair is not."""
    pairs = list(zip(grads, variables))
    g1, v1 = pairs[1]
    other = F64 if v1.dtype != F64 else F32
    if failure == "wrong_shape":
        pairs[1] = (np.zeros(v1.shape + (1,), v1.dtype), v1)
    elif failure == "wrong_dtype":
        pairs[1] = (np.zeros(v1.shape, other), v1)
    elif failure == "unknown_variable":
        pairs[1] = (g1, v1.copy())
    elif failure == "slices_wrong_dense_shape":
        shape = (v1.shape[0] + 1,) + v1.shape[1:]
        pairs[1] = (IndexedSlices(np.zeros((1,) + v1.shape[1:], v1.dtype), [0], shape), v1)
    elif failure == "slices_wrong_dtype":
        pairs[1] = (IndexedSlices(np.zeros((1,) + v1.shape[1:], other), [0], v1.shape), v1)
    elif failure == "same_variable_twice":
        pairs[1] = pairs[0]
    elif failure == "not_a_gradient":
        pairs[1] = (np.zeros(v1.shape, v1.dtype).tolist(), v1)
    elif failure == "not_a_pair":
        pairs[1] = (v1,)
    else:
        assert failure == "all_none"
        pairs = [(None, v) for v in variables]
    return pairs


@given(data=st.data(), dtype=st.sampled_from(FLOATS),
       kind=st.sampled_from(("adam", "lazy_adam", "adamw", "sgd")),
       failure=st.sampled_from(sorted(FAILURES)), n_warmup=st.integers(0, 3))
def test_failed_apply_gradients_changes_nothing(data, dtype, kind, failure, n_warmup):
    shapes = data.draw(st.lists(nonempty_table_shapes, min_size=2, max_size=3))
    extra = data.draw(st.fixed_dictionaries({
        "weight_decay": weight_decays,
        "use_ema": st.booleans(),
        "ema_momentum": st.floats(0.0, 1.0),
        "ema_overwrite_frequency": st.none() | st.integers(1, 3),
        "clipnorm": st.none() | st.floats(1e-3, 1e3),
    }))
    # A decaying schedule: a committed learning rate would show.
    lr = schedules.ExponentialDecay(data.draw(st.floats(1e-4, 1.0)), 2, 0.5)
    if kind == "sgd":
        hp = data.draw(sgd_hparams())
        hp.pop("learning_rate")
        factory = lambda: refopt.SGD(learning_rate=lr, **hp, **extra)
    else:
        cls = {"adam": refopt.Adam, "lazy_adam": refopt.LazyAdam, "adamw": refopt.AdamW}[kind]
        hp = data.draw(adam_hparams(dtype))
        hp.pop("learning_rate")
        amsgrad = data.draw(st.booleans())
        factory = lambda: cls(learning_rate=lr, amsgrad=amsgrad, **hp, **extra)
    opt, twin = factory(), factory()
    variables = [data.draw(float_arrays(dtype, s)) for s in shapes]
    twin_vars = [v.copy() for v in variables]
    opt.build(variables)
    twin.build(twin_vars)

    def draw_grads():
        return [_dense_or_sparse_for(data, dtype, s) for s in shapes]

    for _ in range(n_warmup):  # reach a random valid state
        grads = draw_grads()
        opt.apply_gradients(list(zip(grads, variables)))
        twin.apply_gradients(list(zip(grads, twin_vars)))
    before, lr_before = opt_state(opt, variables), opt.learning_rate

    with pytest.raises(FAILURES[failure]):
        opt.apply_gradients(_bad_pairs(failure, draw_grads(), variables))
    assert_states_bits_equal(opt_state(opt, variables), before)
    assert opt.learning_rate == lr_before

    # And the next valid step is the one the optimizer would have taken without the failed call.
    grads = draw_grads()
    opt.apply_gradients(list(zip(grads, variables)))
    twin.apply_gradients(list(zip(grads, twin_vars)))
    assert_states_bits_equal(opt_state(opt, variables), opt_state(twin, twin_vars))
    assert opt.learning_rate == twin.learning_rate


# =========================================================================== 11. IndexedSlices
# to_dense() scatter-adds onto zeros in input order, exactly the naive loop. deduplicate() sums
# each index's rows from zero in the same order, so 0 + (0 + a + b + ...) == 0 + a + b + ... bit
# for bit (a sum started from +0.0 is never -0.0). Values may be huge (sums overflow to inf, and
# inf - inf gives NaN): NaN payloads are not compared against the Python-level naive loop.
@given(data=st.data(), dtype=st.sampled_from(FLOATS), shape=table_shapes)
def test_indexed_slices_to_dense_and_deduplicate(data, dtype, shape):
    huge = st.floats(width=8 * dtype.itemsize, allow_nan=False)
    slices = data.draw(slices_for(shape, dtype, max_n=10, bound=float(np.finfo(dtype).max)))
    if data.draw(st.booleans()):  # sometimes with infinities
        slices = IndexedSlices(
            data.draw(hnp.arrays(dtype, slices.values.shape, elements=huge)),
            slices.indices, shape)
    before = _copy_inputs(slices)
    with np.errstate(over="ignore", invalid="ignore"):
        dense = slices.to_dense()
        naive = naive_dense(slices)
        dedup = slices.deduplicate()
        expected = naive_presum(slices)
        dedup_dense = dedup.to_dense()
    assert dense.dtype == dtype and dense.shape == shape
    assert_bits_equal_nan_aware(dense, naive, "to_dense vs naive loop")

    assert dedup.dense_shape == shape
    np.testing.assert_array_equal(dedup.indices, expected.indices)
    assert_bits_equal_nan_aware(dedup.values, expected.values, "deduplicate vs naive_presum")
    assert len(np.unique(dedup.indices)) == len(dedup.indices)
    assert_bits_equal(dedup_dense, dense, "deduplicate().to_dense() vs to_dense()")
    _assert_inputs_unchanged(slices, before, "slices")
