"""Hypothesis properties of backend="cuda" and of refopt.kernels.cuda, against the reference.

Everything runs on numba's CUDA simulator (``tests/conftest.py``), or on a GPU when
``NUMBA_ENABLE_CUDASIM=0`` (``scripts/gpu_check.sh``), with
``config.THREADS_PER_BLOCK = 4``, ``ITEMS_PER_THREAD = 2`` (chunks of 8 elements) and
``TENSORS_PER_LAUNCH = 3``, so that tiny arrays span several blocks and chunks and a dtype
group of four tensors already needs two launches. Each property draws few elements (shapes
up to 4 x 4 or tables up to 6 x 4) and runs ``CUDA_EXAMPLES`` examples (60, 15 for the properties that reduce norms; 200 with
``REFOPT_HYPOTHESIS_PROFILE=dev``): the simulator runs every thread in Python. The whole
file takes about 15 s on a 2-core machine.

What is compared, and how exactly:

In float16, float32 and float64 (float16 runs in float32 on the device, rounded to float16
after each operation, which is NumPy's float16 arithmetic).

- **Bit-identical** (NaN positions compared, not a NaN's sign or payload bits): every
  elementwise result, i.e. the optimizers' variables, every slot and EMA average and the
  counter after every step, and the mirror functions ``adam_update``, ``lazy_adam_update``,
  ``sgd_update``, ``apply_weight_decay``, ``clip_by_value``, ``ema_update`` and the scaling
  step of ``clip_by_global_norm`` (given the same norm, ``use_norm``). The simulator executes
  a kernel's Python code with NumPy scalars of the array dtype, so each operation is the
  same IEEE operation, in the same order, as the reference's array arithmetic. On a GPU
  each is an explicitly rounded ``mul.rn``/``add.rn``/``sub.rn`` (never fused into an FMA),
  ``div.rn`` or ``sqrt.rn`` (audited in ``tests/test_cuda_ptx.py``), so the same holds.
- **Within ``n + 2`` ulp** (``n`` elements summed): ``global_norm``, the norm returned by
  ``clip_by_global_norm`` and the result of ``clip_by_norm``. The kernel rounds each square
  to the dtype as the reference does but adds them in float64 in fixed tiles and rounds the
  total once; the reference adds in the dtype in NumPy's pairwise order, whose own error
  bound is about ``n`` ulp of the sum, half of that on the square root, plus an ulp for each
  rounding of the root and of the division.
- **Optimizers with clipnorm / global_clipnorm** are compared bit for bit on gradients whose
  sums of squares are exact in both (multiples of 1/16 up to 8 in magnitude, or inf/NaN):
  then both norms are the correctly rounded root of the same number. With arbitrary
  gradients a norm may differ by an ulp and the following Adam steps amplify it through
  cancellation, so that case is covered by the norm properties above instead.
"""

import os
import warnings

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import refopt
from refopt import IndexedSlices
from refopt import reference as R
from refopt.testing import strategies as rs

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")

pytestmark = pytest.mark.skipif(not kc.simulator and not kc.cuda.is_available(),
                                reason="needs numba's CUDA simulator or an NVIDIA GPU")

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
# REFOPT_CUDA_EXAMPLES overrides the count (scripts/gpu_check.sh uses fewer on a device).
CUDA_EXAMPLES = int(os.environ.get(
    "REFOPT_CUDA_EXAMPLES", 200 if os.environ.get("REFOPT_HYPOTHESIS_PROFILE") == "dev" else 60))
examples = settings(max_examples=CUDA_EXAMPLES)
# The norm reductions synchronise threads, slow on the simulator: fewer examples there.
few_examples = settings(max_examples=max(15, CUDA_EXAMPLES // 4))
CLASSES = {"Adam": refopt.Adam, "AdamW": refopt.AdamW, "LazyAdam": refopt.LazyAdam,
           "SGD": refopt.SGD}


@pytest.fixture(autouse=True)
def small_launches(monkeypatch):
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    monkeypatch.setattr(kc.config, "TENSORS_PER_LAUNCH", 3)


# --------------------------------------------------------------------------- helpers
def assert_bits_equal_nan_aware(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, (what, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(actual[~nan].view(f"u{actual.itemsize}"),
                                  expected[~nan].view(f"u{expected.itemsize}"),
                                  err_msg=f"{what}: bits")


def ulps_apart(a, b):
    """Distance in representable numbers between same-sign or zero floats of one dtype."""
    a, b = np.asarray(a), np.asarray(b)
    ia = a.view(f"i{a.itemsize}").astype(np.int64)
    ib = b.view(f"i{b.itemsize}").astype(np.int64)
    return np.abs(ia - ib)


def assert_within_ulp(actual, expected, maxulp, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected), err_msg=what)
    fin = np.isfinite(expected)
    np.testing.assert_array_equal(actual[~fin & ~np.isnan(expected)],
                                  expected[~fin & ~np.isnan(expected)], err_msg=what)
    a, e = actual[fin], expected[fin]
    same_sign = (np.signbit(a) == np.signbit(e)) | (a == 0) | (e == 0)
    assert same_sign.all(), (what, a, e)
    a, e = np.abs(a), np.abs(e)
    assert (ulps_apart(a, e) <= maxulp).all(), (what, a, e, ulps_apart(a, e), maxulp)


def host_state(opt, dvars):
    state = {"iterations": np.array(opt.iterations, np.int64)}
    for i, d in enumerate(dvars):
        state[f"var{i}"] = d.copy_to_host()
        for name in opt.slot_names if opt.built else ():
            state[f"{name}{i}"] = opt.get_slot(d, name).copy_to_host()
    return state


def ref_state(opt, hvars):
    state = {"iterations": np.array(opt.iterations, np.int64)}
    for i, h in enumerate(hvars):
        state[f"var{i}"] = h.copy()
        for name in opt.slot_names if opt.built else ():
            state[f"{name}{i}"] = np.asarray(opt.get_slot(h, name)).copy()
    return state


def assert_states_equal(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        assert_bits_equal_nan_aware(actual[key], expected[key], key)


def sixteenths(dtype):
    # k/16 with |k| <= 128: squares are multiples of 2**-8 up to 64 (half squares 2**-9, 32).
    # At most 4 tensors of at most 28 values (sparse rows) are summed: < 2**13 in steps of
    # 2**-9, 22 significant bits, so every partial sum is exact in float32 and float64 and
    # both backends take the square root of the same number.
    return st.integers(-128, 128).map(lambda k: dtype.type(k / 16))


@st.composite
def gradient(draw, shape, dtype, *, sparse_ok, exact_norms):
    """A dense, sparse (lazy or not), None or NaN/inf-poisoned gradient for a variable."""
    kinds = ["dense", "none", "poisoned"] + (["sparse"] if sparse_ok and shape else [])
    kind = draw(st.sampled_from(kinds))
    elements = sixteenths(dtype) if exact_norms else rs._elements(
        dtype, max_magnitude=None, allow_nonfinite=False, extreme=False)
    if kind == "none":
        return None
    if kind == "sparse":
        g = draw(rs.indexed_slices(dense_shape=shape, dtype=dtype, max_magnitude=8.0 if
                                   exact_norms else None))
        if exact_norms:
            g = IndexedSlices(draw(hnp.arrays(dtype, g.values.shape, elements=elements)),
                              g.indices, g.dense_shape)
        return g
    g = draw(hnp.arrays(dtype, shape, elements=elements))
    if kind == "poisoned" and g.size:
        flat = g.reshape(-1)
        for pos in draw(st.lists(st.integers(0, flat.size - 1), min_size=1, max_size=2,
                                 unique=True)):
            flat[pos] = draw(st.sampled_from((np.nan, np.inf, -np.inf)))
    return g


def to_device_grad(g):
    return g if g is None or isinstance(g, IndexedSlices) else kc.to_device(g)


# --------------------------------------------------------------------------- optimizers
@examples
@given(data=st.data(), name=st.sampled_from(sorted(CLASSES)), n_vars=st.integers(1, 4),
       n_steps=st.integers(1, 3), dtype=st.sampled_from((F16, F32, F64)), mixed=st.booleans())
def test_cuda_optimizer_matches_reference_step_by_step(data, name, n_vars, n_steps, dtype,
                                                        mixed):
    cfg = data.draw(rs.hyperparameters(optimizer=name, dtype=dtype, schedules=True))
    exact_norms = bool(cfg.get("clipnorm") or cfg.get("global_clipnorm"))
    event(f"{name}, clip: {[k for k in ('clipnorm', 'global_clipnorm', 'clipvalue') if k in cfg]}")
    dtypes = [data.draw(st.sampled_from((F16, F32, F64))) if mixed else dtype
              for _ in range(n_vars)]
    lazy = name == "LazyAdam"
    shapes = [data.draw(rs.shapes(min_dims=1 if lazy else 0, max_dims=2, min_side=0))
              for _ in range(n_vars)]
    host = [data.draw(rs.float_arrays(shape=s, dtype=dt)) for s, dt in zip(shapes, dtypes)]
    dev = [kc.to_device(h) for h in host]
    ref_opt = CLASSES[name](backend="reference", **cfg)
    cuda_opt = CLASSES[name](backend="cuda", **cfg)
    if cfg.get("weight_decay") is not None and data.draw(st.booleans()):
        k = data.draw(st.integers(0, n_vars - 1))
        ref_opt.exclude_from_weight_decay([host[k]])
        cuda_opt.exclude_from_weight_decay([dev[k]])
    for step in range(n_steps):
        grads = [data.draw(gradient(s, dt, sparse_ok=True, exact_norms=exact_norms))
                 for s, dt in zip(shapes, dtypes)]
        outcomes = []
        for opt, ws, gs in ((ref_opt, host, grads),
                            (cuda_opt, dev, [to_device_grad(g) for g in grads])):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # None gradients
                    opt.apply_gradients(list(zip(gs, ws)))
                outcomes.append(None)
            except (TypeError, ValueError) as e:  # all None; mixed dtypes with a global norm
                outcomes.append(type(e))
        assert outcomes[0] == outcomes[1], (step, outcomes)
        event(f"outcome: {outcomes[1].__name__ if outcomes[1] else 'stepped'}")
        event(f"gradients: {sorted({type(g).__name__ for g in grads})}")
        assert_states_equal(host_state(cuda_opt, dev), ref_state(ref_opt, host))
        assert cuda_opt.learning_rate == ref_opt.learning_rate


@examples
@given(data=st.data(), dtype=st.sampled_from((F16, F32, F64)), n_vars=st.integers(1, 4))
def test_cuda_ema_finalize_matches_reference(data, dtype, n_vars):
    cfg = data.draw(rs.hyperparameters(optimizer="Adam", dtype=dtype, clipping=False,
                                       fixed={"use_ema": True}))
    shapes = [data.draw(rs.shapes(min_side=0)) for _ in range(n_vars)]
    host = [data.draw(rs.float_arrays(shape=s, dtype=dtype)) for s in shapes]
    dev = [kc.to_device(h) for h in host]
    ref_opt = refopt.Adam(backend="reference", **cfg)
    cuda_opt = refopt.Adam(backend="cuda", **cfg)
    grads = [data.draw(rs.dense_gradients(shape=s, dtype=dtype)) for s in shapes]
    ref_opt.apply_gradients(zip(grads, host))
    cuda_opt.apply_gradients(zip([kc.to_device(g) for g in grads], dev))
    ref_opt.finalize_variable_values(host)
    cuda_opt.finalize_variable_values(dev)
    assert_states_equal(host_state(cuda_opt, dev), ref_state(ref_opt, host))


@few_examples
@given(data=st.data(), dtype=st.sampled_from((F16, F32, F64)),
       failure=st.sampled_from(("shape", "dtype", "host", "twice")))
def test_cuda_failing_step_changes_nothing(data, dtype, failure):
    cfg = data.draw(rs.hyperparameters(optimizer="Adam", dtype=dtype))
    shapes = [data.draw(rs.shapes()) for _ in range(3)]
    dev = [kc.to_device(data.draw(rs.float_arrays(shape=s, dtype=dtype))) for s in shapes]
    opt = refopt.Adam(backend="cuda", **cfg)
    grads = [kc.to_device(data.draw(rs.dense_gradients(shape=s, dtype=dtype)))
             for s in shapes]
    opt.apply_gradients(zip(grads, dev))
    before = host_state(opt, dev)
    bad = list(zip(grads, dev))
    k = data.draw(st.integers(0, 2))
    if failure == "shape":
        bad[k] = (kc.to_device(np.zeros(shapes[k] + (2,), dtype)), dev[k])
    elif failure == "dtype":
        other = F64 if dtype == F32 else F32
        bad[k] = (kc.to_device(np.zeros(shapes[k], other)), dev[k])
    elif failure == "host":
        bad[k] = (np.zeros(shapes[k], dtype), dev[k])
    else:
        bad.append(bad[k])
    with pytest.raises((TypeError, ValueError)):
        opt.apply_gradients(bad)
    assert_states_equal(host_state(opt, dev), before)


# --------------------------------------------------------------------------- the mirror
small_shapes = rs.shapes(min_dims=0, max_dims=2, min_side=0)
table_shapes = rs.shapes(min_dims=1, max_dims=2, min_side=1)
all_dtypes = st.sampled_from((F16, F32, F64))  # float16: float32 rounded after each op


def arrays(dtype, shape, nonfinite=False):
    return rs.float_arrays(shape=shape, dtype=dtype, allow_nonfinite=nonfinite)


def assert_results_equal(got, want):
    assert type(got) is type(want)
    if isinstance(want, tuple):
        for g, w, field in zip(got, want, want._fields):
            if w is None:
                assert g is None, field
            else:
                assert_bits_equal_nan_aware(g, w, field)
    elif isinstance(want, IndexedSlices):
        np.testing.assert_array_equal(got.indices, want.indices)
        assert got.dense_shape == want.dense_shape
        assert_bits_equal_nan_aware(got.values, want.values)
    else:
        assert_bits_equal_nan_aware(got, want)


def unchanged(before, after):
    for b, a in zip(before, after):
        if isinstance(b, IndexedSlices):
            b, a = b.values, a.values
        if b is not None:
            assert_bits_equal_nan_aware(a, b, "input modified")


@examples
@given(data=st.data(), dtype=all_dtypes, shape=small_shapes, ams=st.booleans(),
       sparse=st.booleans())
def test_mirror_adam_update(data, dtype, shape, ams, sparse):
    hp = {k: v for k, v in data.draw(rs.hyperparameters(
        optimizer="Adam", dtype=dtype, weight_decay=False, clipping=False, ema=False)).items()
        if k != "amsgrad"}
    step = data.draw(st.integers(1, 5))
    p, g, m = (data.draw(arrays(dtype, shape, nonfinite=k == 1)) for k in range(3))
    if sparse and shape:  # tf-keras' non-lazy sparse update of the whole table
        g = data.draw(rs.indexed_slices(dense_shape=shape, dtype=dtype, allow_nonfinite=True))
    v, h = (np.asarray(np.abs(data.draw(arrays(dtype, shape)))) for _ in range(2))
    args = (p, g, m, v, h if ams else None)
    copies = [None if a is None else (a.values.copy() if isinstance(a, IndexedSlices)
                                      else a.copy()) for a in args]
    got = kc.adam_update(*args, step=step, **hp)
    with np.errstate(all="ignore"):  # IndexedSlices.deduplicate sums inf and -inf
        want = R.adam_update(*args, step=step, **hp)
    assert_results_equal(got, want)
    unchanged(copies, [a.values if isinstance(a, IndexedSlices) else a for a in args])


@examples
@given(data=st.data(), dtype=all_dtypes, shape=table_shapes, ams=st.booleans(),
       dense=st.booleans())
def test_mirror_lazy_adam_update(data, dtype, shape, ams, dense):
    hp = {k: v for k, v in data.draw(rs.hyperparameters(
        optimizer="LazyAdam", dtype=dtype, weight_decay=False, clipping=False,
        ema=False)).items() if k != "amsgrad"}
    p, m = (data.draw(arrays(dtype, shape)) for _ in range(2))
    v, h = (np.asarray(np.abs(data.draw(arrays(dtype, shape)))) for _ in range(2))
    g = (data.draw(arrays(dtype, shape, nonfinite=True)) if dense else
         data.draw(rs.indexed_slices(dense_shape=shape, dtype=dtype, allow_nonfinite=True)))
    args = (p, g, m, v, h if ams else None)
    copies = [None if a is None else (a.values.copy() if isinstance(a, IndexedSlices)
                                      else a.copy()) for a in args]
    got = kc.lazy_adam_update(*args, step=3, **hp)
    with np.errstate(all="ignore"):  # IndexedSlices.deduplicate sums inf and -inf
        want = R.lazy_adam_update(*args, step=3, **hp)
    assert_results_equal(got, want)
    unchanged(copies, [a.values if isinstance(a, IndexedSlices) else a for a in args])


@examples
@given(data=st.data(), dtype=all_dtypes, shape=small_shapes, sparse=st.booleans())
def test_mirror_sgd_update(data, dtype, shape, sparse):
    hp = data.draw(rs.hyperparameters(optimizer="SGD", dtype=dtype, weight_decay=False,
                                      clipping=False, ema=False))
    p, m = (data.draw(arrays(dtype, shape)) for _ in range(2))
    if sparse and shape:  # tf-keras' sparse SGD of the whole table (sgd_sparse_table)
        g = data.draw(rs.indexed_slices(dense_shape=shape, dtype=dtype))
    else:
        g = data.draw(arrays(dtype, shape, nonfinite=True))
    got = kc.sgd_update(p, g, m, **hp)
    assert_results_equal(got, R.sgd_update(p, g, m, **hp))


@examples
@given(data=st.data(), dtype=all_dtypes, shape=small_shapes,
       lr=st.floats(0, 1), wd=st.floats(0, 1), mu=st.floats(0, 1))
def test_mirror_weight_decay_and_ema(data, dtype, shape, lr, wd, mu):
    p, a = (data.draw(arrays(dtype, shape, nonfinite=True)) for _ in range(2))
    assert_results_equal(kc.apply_weight_decay(p, learning_rate=lr, weight_decay=wd),
                         R.apply_weight_decay(p, learning_rate=lr, weight_decay=wd))
    assert_results_equal(kc.ema_update(a, p, ema_momentum=mu),
                         R.ema_update(a, p, ema_momentum=mu))


@st.composite
def gradients(draw, dtype, shape, nonfinite=True):
    if shape and draw(st.booleans()):
        return draw(rs.indexed_slices(dense_shape=shape, dtype=dtype,
                                      allow_nonfinite=nonfinite))
    return draw(arrays(dtype, shape, nonfinite=nonfinite))


def n_elements(g):
    return (g.values if isinstance(g, IndexedSlices) else g).size


@examples
@given(data=st.data(), dtype=all_dtypes, shape=small_shapes, c=st.floats(-1, 1e3))
def test_mirror_clip_by_value_and_by_norm(data, dtype, shape, c):
    g = data.draw(gradients(dtype, shape))
    assert_results_equal(kc.clip_by_value(g, c), R.clip_by_value(g, c))
    got, want = kc.clip_by_norm(g, c), R.clip_by_norm(g, c)
    assert type(got) is type(want)
    vals = (lambda x: x.values) if isinstance(g, IndexedSlices) else (lambda x: x)
    assert_within_ulp(vals(got), vals(want), n_elements(g) + 2)


@examples
@given(data=st.data(), dtype=all_dtypes, n=st.integers(0, 4), c=st.floats(1e-3, 1e3))
def test_mirror_global_norm_and_clip_by_global_norm(data, dtype, n, c):
    grads = [None if data.draw(st.booleans()) and k else
             data.draw(gradients(dtype, data.draw(small_shapes), nonfinite=k == 1))
             for k in range(n)]
    total = sum(n_elements(g) for g in grads if g is not None)
    bound = total + 2 + n
    assert_within_ulp(kc.global_norm(grads), R.global_norm(grads), bound)
    (got, got_n), (want, want_n) = (kc.clip_by_global_norm(grads, c),
                                    R.clip_by_global_norm(grads, c))
    assert_within_ulp(got_n, want_n, bound)
    # Given the same norm, the scaling is bit-identical.
    got, _ = kc.clip_by_global_norm(grads, c, use_norm=want_n)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
        else:
            assert_results_equal(a, b)


@few_examples
@given(data=st.data(), dtype=st.sampled_from((F16, F32, F64)), shape=small_shapes)
def test_mirror_norms_are_deterministic(data, dtype, shape):
    g = data.draw(arrays(dtype, shape))
    first = kc.global_norm([g])
    assert all(kc.global_norm([g]).tobytes() == first.tobytes() for _ in range(2))


# --------------------------------------------------------------------------- argument errors
P = np.ones(3, np.float32)
HP = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1)
SL = IndexedSlices(np.ones((1, 2), np.float32), [0], (3, 2))
ERROR_CASES = [
    ("adam_update", ([1.0, 2.0], P, P, P), HP),
    ("adam_update", (P.astype(np.int32), P, P, P), HP),
    ("adam_update", (P, np.ones(4, np.float32), P, P), HP),
    ("adam_update", (P, P, P.astype(np.float64), P), HP),
    ("adam_update", (P, P, P, P, np.ones(2, np.float32)), HP),
    ("adam_update", (P, P, P, P), dict(HP, step=0)),
    ("adam_update", (P, P, P, P), dict(HP, beta_1=True)),
    ("adam_update", (P, P, P, P), dict(HP, step=2.5)),
    ("adam_update", (P, P, P, P), dict(HP, learning_rate="0.1")),
    ("lazy_adam_update", (np.ones((3, 2), np.float32), SL, P, P), HP),
    ("lazy_adam_update", (np.ones((2, 2), np.float32), SL, np.ones((2, 2), np.float32),
                          np.ones((2, 2), np.float32)), HP),
    ("sgd_update", (P, P, P), dict(learning_rate=0.1, momentum=0.9, nesterov=1)),
    ("sgd_update", (P, P, P), dict(learning_rate=None, momentum=0.9)),
    ("sgd_update", (P, "g", P), dict(learning_rate=0.1, momentum=0.9)),
    ("apply_weight_decay", (P,), dict(learning_rate=0.1, weight_decay="x")),
    ("apply_weight_decay", (P.astype(np.int64),), dict(learning_rate=0.1, weight_decay=0.1)),
    ("ema_update", (P, np.ones(2, np.float32)), dict(ema_momentum=0.9)),
    ("ema_update", (P, P), dict(ema_momentum=[0.9])),
    ("clip_by_value", ([1.0], 1.0), {}),
    ("clip_by_value", (P, "1"), {}),
    ("clip_by_norm", (P.astype(np.int32), 1.0), {}),
    ("clip_by_norm", (P, None), {}),
    ("global_norm", (P,), {}),
    ("global_norm", ([P, P.astype(np.float64)],), {}),
    ("global_norm", ([P, "x"],), {}),
    ("clip_by_global_norm", ([P], "1"), {}),
    ("clip_by_global_norm", ([P], 1.0, "n"), {}),
    ("clip_by_global_norm", ([P, np.ones(2)], 1.0), {}),
]


@pytest.mark.parametrize("fn,args,kwargs", ERROR_CASES,
                         ids=[f"{c[0]}-{k}" for k, c in enumerate(ERROR_CASES)])
def test_mirror_argument_errors_are_the_references(fn, args, kwargs):
    with pytest.raises(Exception) as want:
        getattr(R, fn)(*args, **kwargs)
    assert want.type in (TypeError, ValueError)
    with pytest.raises(want.type) as got:
        getattr(kc, fn)(*args, **kwargs)
    assert str(got.value) == str(want.value)


def test_mirror_exposes_the_reference_functions_with_their_signatures():
    import inspect

    for name in R.__all__:
        ours, theirs = getattr(kc, name), getattr(R, name)
        if inspect.isfunction(theirs):
            assert inspect.signature(ours) == inspect.signature(theirs), name
        else:
            assert ours is theirs, name
