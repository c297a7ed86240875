"""The CPU kernels (refopt.kernels.cpu) against the reference, function by function.

Elementwise results are compared bit for bit (``assert_bits_equal``: values and bit patterns,
so -0.0 vs +0.0 counts) in float32 and float64, step by step over several steps, on the
parameters and every state array. Norms (reductions) are compared with a tolerance of one ulp
of the output dtype. float16 is computed by the reference itself (documented fallback).
With NaN in the inputs, NaN positions are compared and every other bit, but not the sign and
payload bits of a NaN: LLVM may rewrite ``(-g) * lr + m`` as ``m - g * lr``, equal for every
number, not for the sign of a NaN (IEEE 754 leaves those bits unspecified too).
"""

import inspect
import os
import platform
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from test_properties import (
    REFERENCE_FUNCTIONS,
    _assert_inputs_unchanged,
    _copy_inputs,
    _float_arrays_in,
    _reference_call,
    adam_hparams,
    adam_states,
    assert_bits_equal,
    assert_bits_equal_nan_aware,
    dense_shapes,
    float_arrays,
    poisoned,
    rmsprop_call,
    sgd_hparams,
    slices_for,
    table_shapes,
)

from refopt import IndexedSlices
from refopt import reference as ref
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
FAST = (F32, F64)


def assert_results_bits_equal(actual, expected, what=""):
    """Every field of two AdamResult/SGDResult, bit for bit (None must match None)."""
    assert type(actual) is type(expected)
    for name, a, e in zip(expected._fields, actual, expected):
        if e is None:
            assert a is None, (what, name)
        else:
            assert_bits_equal(a, e, f"{what} {name}")


def assert_within_one_ulp(actual, expected, what=""):
    """Norms: same dtype, NaN where NaN, otherwise |a - e| <= spacing(|e|) of the dtype."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype, what
    if np.isnan(expected):
        assert np.isnan(actual), what
        return
    if np.isinf(expected):
        assert actual == expected, what
        return
    assert abs(actual - expected) <= np.spacing(abs(expected)), (what, actual, expected)


def test_same_public_functions_and_signatures_as_reference():
    assert sorted(cpu.__all__) == sorted(ref.__all__)
    for name in ref.__all__:
        r, c = getattr(ref, name), getattr(cpu, name)
        if inspect.isfunction(r):
            assert inspect.signature(c) == inspect.signature(r), name
        else:  # the result types and adam_scalars are shared, not copied
            assert c is r, name


# --------------------------------------------------------------------------- Adam / lazy Adam
@given(data=st.data(), dtype=st.sampled_from(FAST), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans(), sparse=st.booleans(),
       step0=st.integers(1, 1000))
def test_adam_update_bit_identical_over_steps(data, dtype, shape, n_steps, amsgrad, sparse,
                                              step0):
    hp = data.draw(adam_hparams(dtype))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    r_ref = r_cpu = ref.AdamResult(p, m, v, vhat)
    for step in range(step0, step0 + n_steps):
        g = data.draw(slices_for(shape, dtype) if sparse else float_arrays(dtype, shape))
        r_ref = ref.adam_update(*r_ref[:1], g, *r_ref[1:], step=step, **hp)
        r_cpu = cpu.adam_update(*r_cpu[:1], g, *r_cpu[1:], step=step, **hp)
        assert_results_bits_equal(r_cpu, r_ref, f"step {step}")


@given(data=st.data(), dtype=st.sampled_from(FAST), shape=table_shapes,
       n_steps=st.integers(1, 4), amsgrad=st.booleans(), cover=st.booleans(),
       step0=st.integers(1, 1000))
def test_lazy_adam_update_bit_identical_over_steps(data, dtype, shape, n_steps, amsgrad, cover,
                                                   step0):
    hp = data.draw(adam_hparams(dtype))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    r_ref = r_cpu = ref.AdamResult(p, m, v, vhat)
    for step in range(step0, step0 + n_steps):
        if cover:  # every row, once or more, in a random order
            idx = data.draw(st.permutations(list(range(shape[0])) * 2))
            g = IndexedSlices(data.draw(float_arrays(dtype, (len(idx),) + shape[1:])),
                              np.array(idx, np.int64), shape)
        else:  # possibly empty, possibly with duplicates
            g = data.draw(slices_for(shape, dtype, force_duplicates=data.draw(st.booleans())))
        r_ref = ref.lazy_adam_update(*r_ref[:1], g, *r_ref[1:], step=step, **hp)
        r_cpu = cpu.lazy_adam_update(*r_cpu[:1], g, *r_cpu[1:], step=step, **hp)
        assert_results_bits_equal(r_cpu, r_ref, f"step {step}")


# --------------------------------------------------------------------------- SGD
@given(data=st.data(), dtype=st.sampled_from(FAST), shape=table_shapes,
       n_steps=st.integers(1, 4), sparse=st.booleans())
def test_sgd_update_bit_identical_over_steps(data, dtype, shape, n_steps, sparse):
    hp = data.draw(sgd_hparams())
    p = data.draw(float_arrays(dtype, shape))
    m = data.draw(float_arrays(dtype, shape))
    r_ref = r_cpu = ref.SGDResult(p, m)
    for _ in range(n_steps):
        g = data.draw(slices_for(shape, dtype) if sparse else float_arrays(dtype, shape))
        r_ref = ref.sgd_update(r_ref.param, g, r_ref.m, **hp)
        r_cpu = cpu.sgd_update(r_cpu.param, g, r_cpu.m, **hp)
        assert_results_bits_equal(r_cpu, r_ref)


# --------------------------------------------------------------------------- EMA, decay, clips
@given(data=st.data(), dtype=st.sampled_from(FAST), shape=dense_shapes, n_steps=st.integers(1, 4))
def test_ema_and_weight_decay_bit_identical_over_steps(data, dtype, shape, n_steps):
    mu = data.draw(st.floats(0.0, 1.0))
    lr, wd = data.draw(st.floats(0.0, 1.0)), data.draw(st.floats(0.0, 1.0))
    a_ref = a_cpu = data.draw(float_arrays(dtype, shape))
    w_ref = w_cpu = data.draw(float_arrays(dtype, shape))
    for _ in range(n_steps):
        w_ref = ref.apply_weight_decay(w_ref, learning_rate=lr, weight_decay=wd)
        w_cpu = cpu.apply_weight_decay(w_cpu, learning_rate=lr, weight_decay=wd)
        assert_bits_equal(w_cpu, w_ref, "weight decay")
        a_ref = ref.ema_update(a_ref, w_ref, ema_momentum=mu)
        a_cpu = cpu.ema_update(a_cpu, w_cpu, ema_momentum=mu)
        assert_bits_equal(a_cpu, a_ref, "ema")


def _values(g):
    return g.values if isinstance(g, IndexedSlices) else g


def _assert_same_kind(a, e):
    assert type(a) is type(e)
    if isinstance(e, IndexedSlices):
        assert a.dense_shape == e.dense_shape
        np.testing.assert_array_equal(a.indices, e.indices)


@given(data=st.data(), dtype=st.sampled_from(FAST), shape=table_shapes, sparse=st.booleans(),
       c=st.floats(0.0, 100.0), wild=st.booleans())
def test_clip_by_value_bit_identical(data, dtype, shape, sparse, c, wild):
    elements = st.floats(width=8 * dtype.itemsize) if wild else None  # NaN, +-inf, +-0
    g = data.draw(slices_for(shape, dtype) if sparse else float_arrays(dtype, shape))
    if elements is not None:
        g = data.draw(hnp.arrays(dtype, _values(g).shape, elements=elements))
    a, e = cpu.clip_by_value(g, c), ref.clip_by_value(g, c)
    _assert_same_kind(a, e)
    assert_bits_equal(_values(a), _values(e), "clip_by_value")


@given(data=st.data(), dtype=st.sampled_from(FAST), shape=table_shapes, sparse=st.booleans(),
       c=st.floats(-1.0, 100.0), big=st.booleans())
def test_clip_by_norm_norm_within_one_ulp_and_elementwise_exact(data, dtype, shape, sparse, c,
                                                                 big):
    if big:  # long enough for NumPy's pairwise summation to recurse (> 128 terms)
        shape, sparse = (data.draw(st.integers(129, 3000)),), False
    g = data.draw(slices_for(shape, dtype) if sparse else float_arrays(dtype, shape))
    vals = _values(g)
    s_cpu = cpu.clipping.sums_of_squares([vals], dtype)[0]
    s_ref = np.sum(vals * vals, dtype=dtype)
    assert_within_one_ulp(s_cpu, s_ref, "sum of squares")
    a, e = cpu.clip_by_norm(g, c), ref.clip_by_norm(g, c)
    _assert_same_kind(a, e)
    if s_cpu == s_ref:  # the same norm: the elementwise part must agree bit for bit
        assert_bits_equal_nan_aware(_values(a), _values(e), "clip_by_norm")
    else:  # one ulp of the norm moves each element by at most a couple of ulps
        np.testing.assert_allclose(_values(a), _values(e), rtol=4 * np.finfo(dtype).eps)


@given(data=st.data(), dtype=st.sampled_from(FAST), n=st.integers(0, 4), big=st.booleans(),
       with_none=st.booleans(), use_norm=st.none() | st.floats(0.0, 100.0),
       c=st.floats(1e-3, 100.0))
def test_global_norm_within_one_ulp_and_scaling_exact(data, dtype, n, big, with_none, use_norm,
                                                      c):
    grads = []
    for _ in range(n):
        shape = (data.draw(st.integers(129, 2000)),) if big else data.draw(table_shapes)
        sparse = not big and data.draw(st.booleans())
        grads.append(data.draw(slices_for(shape, dtype) if sparse else float_arrays(dtype, shape)))
    if with_none:
        grads.append(None)
    n_cpu, n_ref = cpu.global_norm(grads), ref.global_norm(grads)
    assert_within_one_ulp(n_cpu, n_ref, "global norm")
    given_norm = n_ref if use_norm is None else use_norm
    a, na = cpu.clip_by_global_norm(grads, c, use_norm=given_norm)
    e, ne = ref.clip_by_global_norm(grads, c, use_norm=given_norm)
    assert_bits_equal(na, ne, "returned norm")
    assert len(a) == len(e)
    for x, y in zip(a, e):  # with the same norm, the scaling is elementwise: bit for bit
        if y is None:
            assert x is None
        else:
            _assert_same_kind(x, y)
            assert_bits_equal_nan_aware(_values(x), _values(y), "clip_by_global_norm")


# NumPy's float sum is a pairwise summation; the kernel walks the same tree, so on this
# machine the sums agree exactly (recorded here as a regression test of the tree walk: an
# off-by-one in the split or the 8-way leaf would show at these lengths).
@pytest.mark.parametrize("dtype", FAST)
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 127, 128, 129, 136, 255, 256, 1000, 8193, 100003])
def test_sum_of_squares_follows_numpy_pairwise_tree(dtype, n):
    x = np.random.default_rng(n).standard_normal(n).astype(dtype) * 3
    got = cpu.clipping.sums_of_squares([x, x], dtype, half=True)
    want = np.sum(x * x * dtype.type(0.5), dtype=dtype)
    assert_within_one_ulp(got[0], want, "half sum")
    assert_bits_equal(got[0], got[1], "the same input twice")


@given(idx=st.lists(st.integers(0, 40), max_size=60), big=st.booleans())
def test_stable_order_is_a_stable_argsort(idx, big):
    from refopt.kernels.cpu._common import stable_order

    idx = np.array(idx, np.int64)
    if big:  # rows too large to pack with the positions: the np.argsort fallback
        idx = idx + (1 << 60)
    order, srows = stable_order(idx)
    want = np.argsort(idx, kind="stable")
    np.testing.assert_array_equal(order, want)
    np.testing.assert_array_equal(srows, idx[want])
    assert order.dtype == srows.dtype == np.int64


# --------------------------------------------------------------------------- wild inputs
@pytest.mark.parametrize("name", REFERENCE_FUNCTIONS)
@given(data=st.data())
def test_every_function_matches_reference_on_wild_inputs_and_is_pure(name, data):
    # NaN, +-inf, -0.0, huge values anywhere, every dtype (float16: the reference's own result).
    fn_ref, args, kwargs = data.draw(_reference_call(name))
    fn_cpu = getattr(cpu, name)
    before = _copy_inputs(args)
    with np.errstate(all="ignore"):
        expected = fn_ref(*args, **kwargs)
    got = fn_cpu(*args, **kwargs)
    _assert_inputs_unchanged(args, before, name)
    for result in _float_arrays_in(got if isinstance(got, (list, tuple)) else [got]):
        for arr in _float_arrays_in(args):
            assert not np.shares_memory(result, arr), f"{name} returned a view of an input"
    if name == "global_norm":
        assert_within_one_ulp(got, expected, name)
        return
    if name == "clip_by_global_norm":
        assert_within_one_ulp(got[1], expected[1], name)
        if got[1] != expected[1]:
            return
        got, expected = got[0], expected[0]
    got_arrays = _float_arrays_in(got if isinstance(got, (list, tuple)) else [got])
    exp_arrays = _float_arrays_in(expected if isinstance(expected, (list, tuple)) else [expected])
    assert len(got_arrays) == len(exp_arrays)
    for a, e in zip(got_arrays, exp_arrays):
        if name == "clip_by_norm":
            # The norm may differ by an ulp: compare NaN/inf patterns, values closely.
            np.testing.assert_array_equal(np.isnan(a), np.isnan(e))
            np.testing.assert_allclose(a, e, rtol=4 * np.finfo(e.dtype).eps)
        else:
            assert_bits_equal_nan_aware(a, e, name)


@pytest.mark.parametrize("dtype", FAST)
@given(data=st.data(), shape=st.sampled_from([(1,), (3,), (2, 2)]), amsgrad=st.booleans())
def test_nonfinite_gradients_propagate_as_in_reference(dtype, data, shape, amsgrad):
    g = data.draw(poisoned(dtype, shape))
    p = data.draw(float_arrays(dtype, shape))
    m, v, vhat = data.draw(adam_states(dtype, shape, amsgrad))
    hp = dict(data.draw(adam_hparams(dtype)), step=data.draw(st.integers(1, 50)))
    # NaN where the reference has NaN, the same infinities, every other bit identical (the sign
    # and payload of a NaN are not preserved by LLVM's folding of negations, nor compared).
    for a, e in zip(cpu.adam_update(p, g, m, v, vhat, **hp),
                    ref.adam_update(p, g, m, v, vhat, **hp)):
        if e is not None:
            assert_bits_equal_nan_aware(a, e, "adam")
    sgd_hp = data.draw(sgd_hparams())
    for a, e in zip(cpu.sgd_update(p, g, m, **sgd_hp), ref.sgd_update(p, g, m, **sgd_hp)):
        assert_bits_equal_nan_aware(a, e, "sgd")


# --------------------------------------------------------------------------- float16, errors
def test_float16_is_computed_by_the_reference():
    p = np.array([1.0, -2.0, 0.5], F16)
    g = np.array([0.25, 1.0, -3.0], F16)
    z = np.zeros(3, F16)
    kw = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-3, step=2)
    assert_results_bits_equal(cpu.adam_update(p, g, z, z, z, **kw),
                              ref.adam_update(p, g, z, z, z, **kw))
    assert_bits_equal(cpu.clip_by_norm(g, 1.0), ref.clip_by_norm(g, 1.0))
    assert_bits_equal(cpu.global_norm([g]), ref.global_norm([g]))


@pytest.mark.parametrize("call", [
    lambda m: m.adam_update(np.zeros(2, np.float32), np.zeros(3, np.float32),
                            np.zeros(2, np.float32), np.zeros(2, np.float32),
                            learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1),
    lambda m: m.adam_update(np.zeros(2, np.float32), np.zeros(2, np.float32),
                            np.zeros(2, np.float32), np.zeros(2, np.float32),
                            learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=0),
    lambda m: m.sgd_update(np.zeros(2, np.float64), np.zeros(2, np.float64),
                           np.zeros(2, np.float64), learning_rate="0.1", momentum=0.9),
    lambda m: m.lazy_adam_update(np.zeros((2, 1), np.float32),
                                 IndexedSlices(np.zeros((1, 1), np.float64), [0], (2, 1)),
                                 np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32),
                                 learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                                 step=1),
    lambda m: m.ema_update(np.zeros(2, np.float32), np.zeros(2, np.float64), ema_momentum=0.9),
    lambda m: m.apply_weight_decay([1.0], learning_rate=0.1, weight_decay=0.1),
    lambda m: m.clip_by_value(np.zeros(2, np.int32), 1.0),
    lambda m: m.clip_by_norm(np.zeros(2, np.float32), None),
    lambda m: m.global_norm([np.zeros(2, np.float32), np.zeros(2, np.float64)]),
    lambda m: m.clip_by_global_norm([np.zeros(2, np.float32)], "1"),
])
def test_errors_are_the_references(call):
    with pytest.raises(Exception) as want:
        call(ref)
    with pytest.raises(want.type) as got:
        call(cpu)
    assert str(got.value) == str(want.value)


# Regression: NumPy's maximum/minimum return the *second* operand of two equal values, so
# np.maximum(+0.0, -0.0) is -0.0. The first kernels returned the first operand and turned
# clip_by_value(0.0, 0) into +0.0 where the reference gives -0.0 (found by Hypothesis).
@pytest.mark.parametrize("dtype", FAST)
def test_signed_zeros_follow_numpy_maximum_and_minimum(dtype):
    g = np.array([0.0, -0.0, 0.0, -0.0], dtype)
    for c in (0.0, -0.0, 1.0):
        assert_bits_equal(cpu.clip_by_value(g, c), ref.clip_by_value(g, c), f"c={c}")
    z, nz = np.zeros(4, dtype), np.full(4, -0.0, dtype)
    kw = dict(learning_rate=0.0, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=1)
    for vhat in (z, nz):  # AMSGrad's max(vhat, v) with v = +0.0
        assert_results_bits_equal(cpu.adam_update(z, nz, z, z, vhat, **kw),
                                  ref.adam_update(z, nz, z, z, vhat, **kw))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 assembly")
def test_hot_kernels_are_vectorised_without_fma():
    # fastmath is off, so LLVM must not contract a * b + c into an FMA (one rounding instead of
    # two would change the bits); and the loops must still vectorise (packed mul/div/sqrt). The
    # rule drivers' element loops of Adam and SGD with the optimizers' rule calls (their
    # _span compiles every _loop the dense kernel runs), compiled afresh in a subprocess with
    # empty caches (cached code cannot be inspected).
    script = textwrap.dedent("""
        import numpy as np
        from numba import types
        import refopt
        from refopt.kernels.cpu import drivers
        from refopt.rules.steps import N_PSC
        x = np.ones(64, np.float32)
        for opt in (refopt.Adam(0.1), refopt.SGD(0.1, momentum=0.9)):
            rc = opt.update_rule(np.float32, 0.1, 1)
            mod = drivers.kernels(rc.rule, rc.fl, 0, bool(rc.tail_lanes))
            slots = [x.copy() for _ in rc.rule.slots]
            one = np.float32(1)
            mod._span(x.copy(), x, *slots, x.copy(), 0, 64, 0, 0, 0, 0, 64, one, one, one,
                      False, np.zeros(N_PSC, np.float32), rc.sc, tuple(int(f) for f in rc.fl))
            for sig in mod._loop.signatures:
                asm = mod._loop.inspect_asm(sig)
                fma = sum(asm.count(op) for op in ("vfmadd", "vfmsub", "vfnmadd", "vfnmsub"))
                # _loop(P, G, *slots, A, cmode, dmode, emode, c, d, s, ow, psc, sc, fl, tail)
                common = all(isinstance(t, types.Literal) for t in sig[-11:-8])
                print(rc.rule.name, int(common), fma, asm.count("vmulps"), asm.count("vdivps"),
                      asm.count("vsqrtps"))
    """)
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                             env={**os.environ, "NUMBA_CACHE_DIR": cache,
                                  "REFOPT_KERNEL_CACHE": cache}, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = set()
    for line in out.stdout.splitlines():
        rule, common, fma, mul, div, sqrt = line.split()
        assert int(fma) == 0, f"the {rule} loop has FMA instructions"
        if common == "1":  # the common case's loop (literal modes) vectorises
            seen.add(rule)
            assert int(mul) > 0, f"the {rule} loop is not vectorised"
            if rule == "adam":
                assert int(div) > 0 and int(sqrt) > 0, "the adam loop is not vectorised"
    assert seen == {"adam", "sgd"}


@pytest.mark.parametrize("dtype", FAST)
def test_non_contiguous_inputs_match_reference(dtype):
    # The reference accepts any memory layout; the kernels work on C-contiguous copies.
    rng = np.random.default_rng(3)
    base = [rng.standard_normal((6, 8)).astype(dtype) for _ in range(5)]
    p, m = base[0].T, base[2].T  # transposed views
    g = np.asfortranarray(base[1].T)  # Fortran order
    v, vhat = np.abs(base[3]).T, np.abs(base[4]).T + 1
    kw = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.99, epsilon=1e-7, step=4)
    assert_results_bits_equal(cpu.adam_update(p, g, m, v, vhat, **kw),
                              ref.adam_update(p, g, m, v, vhat, **kw))
    assert_results_bits_equal(cpu.sgd_update(p, g, m, learning_rate=0.1, momentum=0.9),
                              ref.sgd_update(p, g, m, learning_rate=0.1, momentum=0.9))
    strided = base[1][:, ::2]
    assert_bits_equal(cpu.clip_by_value(strided, 0.5), ref.clip_by_value(strided, 0.5))
    assert_bits_equal(cpu.ema_update(p, m, ema_momentum=0.9),
                      ref.ema_update(p, m, ema_momentum=0.9))
    table = base[0][:, ::2]  # (6, 4), strided rows
    sl = IndexedSlices(base[2][:3, ::2], [5, 0, 5], table.shape)
    zeros = np.zeros_like(table)
    assert_results_bits_equal(cpu.lazy_adam_update(table, sl, zeros, zeros, **kw),
                              ref.lazy_adam_update(table, sl, zeros, zeros, **kw))


# --------------------------------------------------------------------------- RMSprop
@given(data=st.data(), dtype=st.sampled_from(FAST), shape=dense_shapes, n_steps=st.integers(1, 3))
def test_rmsprop_update_bit_identical_every_form(data, dtype, shape, n_steps):
    """The rule-built kernel against the reference's NumPy, every convention's form, over
    several steps (elementwise: bit for bit, NaN positions included)."""
    kw, (v, b, a) = data.draw(rmsprop_call(dtype, shape))
    p = data.draw(float_arrays(dtype, shape))
    r_ref = r_cpu = ref.RMSpropResult(p, v, b, a)
    for _ in range(n_steps):
        g = data.draw(float_arrays(dtype, shape))
        r_ref = ref.rmsprop_update(r_ref.param, g, r_ref.velocity, r_ref.momentum,
                                   r_ref.average_gradient, **kw)
        r_cpu = cpu.rmsprop_update(r_cpu.param, g, r_cpu.velocity, r_cpu.momentum,
                                   r_cpu.average_gradient, **kw)
        assert_results_bits_equal(r_cpu, r_ref, f"{kw['convention']}")
