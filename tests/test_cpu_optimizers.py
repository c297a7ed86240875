"""The optimizers with backend="cpu" against backend="reference", bit for bit, step by step.

The CPU backend keeps the slots in flat buffers and updates the variables in place with fused
kernels (refopt/executors/cpu.py); these tests compare every variable, slot, EMA average
and the counter after every step with the reference optimizer fed the same gradients
(identical bit patterns), over random configurations: clipping of each kind, weight decay
(with exclusions), EMA with overwrites, AMSGrad, Nesterov, schedules, LazyAdam with duplicate
and empty sparse gradients, None gradients, float16 variables (the reference's fallback),
mixed dtypes and gradients with NaN or infinities (NaN positions agree; the sign and payload
bits of a NaN are not compared, see ``assert_states_equal``). Where a norm is involved the two
backends may differ by an ulp of the norm on another machine; the tests then fall back to a
tolerance (on this project's machines the norms agree exactly and the comparison is bitwise).
"""

import os
import subprocess
import sys
import textwrap
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_properties import (
    FAILURES,
    _bad_pairs,
    _dense_or_sparse_for,
    adam_hparams,
    assert_bits_equal_nan_aware,
    assert_states_bits_equal,
    dense_shapes,
    float_arrays,
    nonempty_table_shapes,
    opt_state,
    poisoned,
    sgd_hparams,
    slices_for,
    table_shapes,
    weight_decays,
)

import refopt
from refopt import IndexedSlices, schedules
from refopt.kernels import cpu

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
KINDS = ("adam", "adamw", "lazy_adam", "sgd")
CLASSES = {"adam": refopt.Adam, "adamw": refopt.AdamW, "lazy_adam": refopt.LazyAdam,
           "sgd": refopt.SGD}


def _values(g):
    return g.values if isinstance(g, IndexedSlices) else g


def norms_agree(grads):
    """Whether the CPU sums of squares equal NumPy's for these gradients (plain and halved)."""
    for g in grads:
        if g is None or _values(g).dtype == F16:
            continue
        v = _values(g)
        with np.errstate(all="ignore"):
            plain = np.sum(v * v, dtype=v.dtype)
            half = np.sum(v * v * v.dtype.type(0.5), dtype=v.dtype)
        if not (cpu.clipping.sums_of_squares([v], v.dtype)[0] == plain
                and cpu.clipping.sums_of_squares([v], v.dtype, half=True)[0] == half):
            return False
    return True


def assert_states_equal(actual, expected, exact):
    """Bit for bit (NaN positions included; not the sign or payload bits of a NaN, which LLVM
    does not preserve: it may fold ``(-g) * lr + m`` into ``m - g * lr``, the same value for
    every number but a NaN of the other sign), or, when a norm differed by an ulp, close."""
    if exact:
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_bits_equal_nan_aware(actual[key], expected[key], key)
    else:  # a norm differed by an ulp: the clipped steps differ by a few ulps
        for key in expected:
            np.testing.assert_allclose(actual[key], expected[key], rtol=1e-4, atol=0,
                                       err_msg=key)


@st.composite
def optimizer_configs(draw, kind, dtype):
    cfg = draw(st.fixed_dictionaries({
        "weight_decay": st.none() | weight_decays,
        "use_ema": st.booleans(),
        "ema_momentum": st.floats(0.0, 1.0),
        "ema_overwrite_frequency": st.none() | st.integers(1, 3),
    }))
    if kind == "adamw" and cfg["weight_decay"] is None:
        cfg["weight_decay"] = 0.004
    clip = draw(st.sampled_from((None, "clipnorm", "clipvalue", "global_clipnorm")))
    if clip is not None:
        cfg[clip] = draw(st.floats(1e-3, 1e3))
    if kind == "sgd":
        cfg.update(draw(sgd_hparams()))
    else:
        cfg.update(draw(adam_hparams(dtype)), amsgrad=draw(st.booleans()))
    if draw(st.booleans()):
        cfg["learning_rate"] = schedules.ExponentialDecay(draw(st.floats(1e-4, 1.0)), 2, 0.5)
    return cfg


@given(data=st.data(), kind=st.sampled_from(KINDS), dtype=st.sampled_from((F32, F64)),
       n_vars=st.integers(1, 4), n_steps=st.integers(1, 4), mixed=st.booleans())
def test_cpu_optimizer_bit_identical_to_reference(data, kind, dtype, n_vars, n_steps, mixed):
    cfg = data.draw(optimizer_configs(kind, dtype))
    dtypes = [data.draw(st.sampled_from((F16, F32, F64))) if mixed else dtype
              for _ in range(n_vars)]
    shapes = [data.draw(table_shapes if data.draw(st.booleans()) else dense_shapes)
              for _ in range(n_vars)]
    w_cpu = [data.draw(float_arrays(dt, s)) for dt, s in zip(dtypes, shapes)]
    w_ref = [w.copy() for w in w_cpu]
    opt_cpu = CLASSES[kind](backend="cpu", **cfg)
    opt_ref = CLASSES[kind](backend="reference", **cfg)
    if data.draw(st.booleans()) and cfg.get("weight_decay") is not None:
        k = data.draw(st.integers(0, n_vars - 1))
        opt_cpu.exclude_from_weight_decay([w_cpu[k]])
        opt_ref.exclude_from_weight_decay([w_ref[k]])
    opt_cpu.build(w_cpu)
    opt_ref.build(w_ref)
    for _ in range(n_steps):
        grads = []
        for dt, s in zip(dtypes, shapes):
            choice = data.draw(st.sampled_from(("dense", "sparse", "none", "poisoned")))
            if choice == "poisoned" and int(np.prod(s)) > 0:  # NaN, inf or -inf somewhere
                grads.append(data.draw(poisoned(dt, s)))
            elif choice == "sparse" and len(s) >= 1:
                grads.append(data.draw(slices_for(s, dt, force_duplicates=data.draw(
                    st.booleans()))))
            elif choice == "none":
                grads.append(None)
            else:
                grads.append(data.draw(float_arrays(dt, s)))
        outcomes = []
        for opt, ws in ((opt_cpu, w_cpu), (opt_ref, w_ref)):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)  # None gradients
                    opt.apply_gradients(list(zip(grads, ws)))
                outcomes.append(None)
            except (TypeError, ValueError) as e:  # mixed dtypes with global_clipnorm, all None
                outcomes.append((type(e), str(e)))
        assert outcomes[0] == outcomes[1]
        exact = norms_agree(grads) or not (cfg.get("clipnorm") or cfg.get("global_clipnorm"))
        assert_states_equal(opt_state(opt_cpu, w_cpu), opt_state(opt_ref, w_ref), exact)
        assert opt_cpu.learning_rate == opt_ref.learning_rate


@given(data=st.data(), dtype=st.sampled_from((F32, F64)), kind=st.sampled_from(KINDS),
       failure=st.sampled_from(sorted(FAILURES)), n_warmup=st.integers(0, 3))
def test_cpu_failed_apply_gradients_changes_nothing(data, dtype, kind, failure, n_warmup):
    # The fast path validates everything before its first in-place write: a raising call
    # leaves variables, slots, averages, learning rate and counter exactly as they were.
    shapes = data.draw(st.lists(nonempty_table_shapes, min_size=2, max_size=3))
    cfg = data.draw(optimizer_configs(kind, dtype))
    cfg["learning_rate"] = schedules.ExponentialDecay(0.1, 2, 0.5)
    opt = CLASSES[kind](backend="cpu", **cfg)
    twin = CLASSES[kind](backend="cpu", **cfg)
    variables = [data.draw(float_arrays(dtype, s)) for s in shapes]
    twin_vars = [v.copy() for v in variables]
    opt.build(variables)
    twin.build(twin_vars)

    def draw_grads():
        return [_dense_or_sparse_for(data, dtype, s) for s in shapes]

    for _ in range(n_warmup):
        grads = draw_grads()
        opt.apply_gradients(list(zip(grads, variables)))
        twin.apply_gradients(list(zip(grads, twin_vars)))
    before, lr_before = opt_state(opt, variables), opt.learning_rate
    with pytest.raises(FAILURES[failure]):
        opt.apply_gradients(_bad_pairs(failure, draw_grads(), variables))
    assert_states_bits_equal(opt_state(opt, variables), before)
    assert opt.learning_rate == lr_before
    grads = draw_grads()
    opt.apply_gradients(list(zip(grads, variables)))
    twin.apply_gradients(list(zip(grads, twin_vars)))
    assert_states_bits_equal(opt_state(opt, variables), opt_state(twin, twin_vars))


def test_cpu_global_clipnorm_mixed_dtypes_raises_before_any_write():
    w32, w64 = np.ones(3, np.float32), np.ones(2, np.float64)
    opt = refopt.Adam(backend="cpu", global_clipnorm=1.0)
    opt.build([w32, w64])
    before = opt_state(opt, [w32, w64])
    with pytest.raises(TypeError, match="same dtype"):
        opt.apply_gradients([(np.ones(3, np.float32), w32), (np.ones(2, np.float64), w64)])
    assert_states_bits_equal(opt_state(opt, [w32, w64]), before)


# Regression (found by the dev profile): a NaN gradient with learning rate 0 gives a NaN of the
# other sign than the reference's in SGD (a folded negation); NaN positions, EMA included, agree.
def test_sgd_nan_gradient_gives_nan_in_the_same_places():
    states = []
    for backend in ("cpu", "reference"):
        w = np.array([0.0, 1.0], np.float32)
        opt = refopt.SGD(learning_rate=0.0, backend=backend, use_ema=True, ema_momentum=0.0)
        opt.apply_gradients([(np.array([np.nan, 2.0], np.float32), w)])
        states.append(opt_state(opt, [w]))
    assert_states_equal(*states, exact=True)
    assert np.isnan(states[0]["var0"][0]) and states[0]["var0"][1] == 1.0


# --------------------------------------------------------------------------- aliasing
# Regression: the in-place kernels read a gradient while writing the variables; a gradient
# that *is* another variable (or this one) must see the values from before the step, as in the
# reference, which computes everything into new arrays first.
@pytest.mark.parametrize("kind", KINDS)
def test_gradient_aliasing_a_variable_matches_reference(kind):
    results = []
    for backend in ("cpu", "reference"):
        a = np.linspace(-1, 1, 7).astype(np.float32)
        b = np.linspace(2, 3, 7).astype(np.float32)
        opt = CLASSES[kind](backend=backend, learning_rate=0.1, use_ema=True)
        for _ in range(3):
            opt.apply_gradients([(b, a), (a, b)])
            opt.apply_gradients([(a, a), (b, b)])
        results.append([a, b, opt.get_slot(a, "m"), opt.get_slot(b, "average")])
    for x, y in zip(*results):
        np.testing.assert_array_equal(x.view(np.uint32), y.view(np.uint32))


def test_overlapping_variables_match_reference():
    # Two variables viewing the same memory: the reference computes both from the old values
    # and commits in order; the CPU backend then uses its staged path to do the same.
    results = []
    for backend in ("cpu", "reference"):
        buf = np.linspace(-1, 1, 10).astype(np.float64)
        u, w = buf[:6], buf[4:]
        opt = refopt.SGD(backend=backend, learning_rate=0.5, momentum=0.9)
        for k in range(3):
            opt.apply_gradients([(np.full(6, k + 1.0), u), (np.full(6, -2.0), w)])
        results.append(buf.copy())
    np.testing.assert_array_equal(results[0].view(np.uint64), results[1].view(np.uint64))


def test_subclass_with_its_own_update_takes_the_staged_path():
    # Regression guard: a subclass that rewrites _update_step must not silently get the fused
    # kernel of its parent's math.
    class SignSGD(refopt.SGD):
        def _update_step(self, param, grad, slots, learning_rate, step):
            new = param - np.sign(grad).astype(param.dtype) * param.dtype.type(learning_rate)
            return new, {"m": slots["m"]}

    results = []
    for backend in ("cpu", "reference"):
        w = np.array([1.0, -2.0, 3.0], np.float32)
        opt = SignSGD(learning_rate=0.5, backend=backend)
        opt.apply_gradients([(np.array([0.1, -5.0, 0.0], np.float32), w)])
        results.append(w)
    np.testing.assert_array_equal(results[0], [0.5, -1.5, 3.0])
    np.testing.assert_array_equal(results[0], results[1])


# --------------------------------------------------------------------------- layout, calls
def test_many_small_tensors_take_one_kernel_call_per_dtype(monkeypatch):
    from refopt.executors import cpu as _cpu

    rng = np.random.default_rng(0)
    ws = [rng.standard_normal(rng.integers(0, 50)).astype(np.float32 if i % 3 else np.float64)
          for i in range(300)]
    opt = refopt.Adam(backend="cpu", weight_decay=0.01, clipnorm=1.0)
    grads = [rng.standard_normal(w.shape).astype(w.dtype) for w in ws]
    opt.apply_gradients(zip(grads, ws))  # compile/load outside the count
    calls = []
    real = _cpu.launch

    def counting(kernel, args, n):
        calls.append((kernel.__name__, args[0].shape[0]))
        return real(kernel, args, n)

    monkeypatch.setattr(_cpu, "launch", counting)
    opt.apply_gradients(zip(grads, ws))
    # one fused call per dtype, covering every tensor
    assert sorted(calls) == [("dense", 100), ("dense", 200)]


def test_slots_are_views_of_one_flat_buffer_per_dtype():
    ws = [np.ones((2, 3), np.float32), np.ones(4, np.float64), np.ones((), np.float32)]
    opt = refopt.Adam(backend="cpu", amsgrad=True, use_ema=True)
    opt.apply_gradients([(np.full_like(w, 0.5), w) for w in ws])
    flat = opt._state.buffers
    for w in ws:
        for name in ("m", "v", "vhat", "average"):
            slot = opt.get_slot(w, name)
            assert slot.shape == w.shape and slot.dtype == w.dtype
            assert np.shares_memory(slot, flat[w.dtype][name])
    ref = refopt.Adam(amsgrad=True, use_ema=True)
    ws_ref = [np.ones((2, 3), np.float32), np.ones(4, np.float64), np.ones((), np.float32)]
    ref.apply_gradients([(np.full_like(w, 0.5), w) for w in ws_ref])
    assert len(opt.variables) == len(ref.variables)
    for a, b in zip(opt.variables, ref.variables):
        np.testing.assert_array_equal(a, b)
    opt.finalize_variable_values(ws)
    ref.finalize_variable_values(ws_ref)
    for a, b in zip(ws, ws_ref):
        np.testing.assert_array_equal(a, b)


def test_lazy_step_costs_the_rows_not_the_table():
    # A 64 MB table and a 16-row gradient: the in-place lazy path must not allocate anything of
    # the table's size (the reference backend gathers and scatters rows too, but a whole-table
    # copy anywhere would show here).
    table = np.zeros((1 << 18, 64), np.float32)
    opt = refopt.LazyAdam(backend="cpu", learning_rate=0.1, weight_decay=0.01, clipnorm=1.0)
    g = IndexedSlices(np.ones((16, 64), np.float32), np.arange(16) * 1000 % table.shape[0],
                      table.shape)
    opt.apply_gradients([(g, table)])  # build (allocates m and v once) and compile/load
    tracemalloc.start()
    try:
        opt.apply_gradients([(g, table)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < table.nbytes // 100, peak
    assert (table[1:1000] == 0).all() and (table[0] != 0).all()


# --------------------------------------------------------------------------- processes
_THREADS_SCRIPT = textwrap.dedent("""
    import hashlib, numpy as np, refopt
    rng = np.random.default_rng(7)
    ws = [rng.standard_normal(n).astype(np.float32) for n in (2_500_000, 3, 70_000)]
    table = rng.standard_normal((30_000, 64)).astype(np.float32)
    dense = refopt.Adam(backend="cpu", amsgrad=True, use_ema=True, weight_decay=0.1,
                        global_clipnorm=10.0)
    lazy = refopt.LazyAdam(backend="cpu", clipvalue=0.5, use_ema=True,
                           ema_overwrite_frequency=2)
    h = hashlib.sha256()
    for step in range(3):
        dense.apply_gradients([(rng.standard_normal(w.shape).astype(np.float32), w) for w in ws])
        idx = rng.zipf(1.2, 40_000) % table.shape[0]  # 2.56e6 elements: parallel
        g = refopt.IndexedSlices(rng.standard_normal((idx.size, 64)).astype(np.float32), idx,
                                 table.shape)
        lazy.apply_gradients([(g, table)])
    for a in ws + [table] + dense.variables[1:] + lazy.variables[1:]:
        h.update(np.ascontiguousarray(a).tobytes())
    print(hashlib.sha256(h.digest()).hexdigest())
""")


def _run(script, **env):
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_results_do_not_depend_on_the_thread_count():
    # Large enough for the kernels to run in parallel (>= PARALLEL_MIN_ELEMENTS elements).
    one = _run(_THREADS_SCRIPT, NUMBA_NUM_THREADS="1")
    two = _run(_THREADS_SCRIPT, NUMBA_NUM_THREADS="2")
    assert one == two and len(one) == 64


def test_import_compiles_nothing():
    script = textwrap.dedent("""
        import sys
        import refopt
        assert "numba" not in sys.modules, "import refopt imported numba"
        opt = refopt.Adam(backend="cpu")  # imports the kernels, compiles nothing
        from refopt.kernels.cpu import _kernels as K
        compiled = [d.py_func.__name__ for d in K.DISPATCHERS if d.signatures]
        assert not compiled, compiled
        print("ok")
    """)
    assert _run(script) == "ok"


# --- regressions from a user trying to break the CPU backend -------------------------------

@pytest.mark.parametrize("kwargs", [{"clipnorm": 1.0}, {"global_clipnorm": 1.0}])
def test_cpu_equals_reference_for_transposed_gradients_with_norm_clipping(kwargs):
    # The reference summed a transposed gradient in memory order (NumPy's rule), the CPU path in
    # C order: a 1-ulp norm difference moved the weights. Both now sum in C order, as TF.
    g = np.random.default_rng(3).standard_normal((20, 30)).astype(np.float32).T
    out = {}
    for backend in ("reference", "cpu"):
        w = np.zeros((30, 20), np.float32)
        opt = refopt.Adam(0.1, backend=backend, **kwargs)
        opt.apply_gradients([(g, w)])
        out[backend] = (w, opt.get_slot(w, "m"), opt.get_slot(w, "v"))
    for a, b in zip(out["reference"], out["cpu"]):
        np.testing.assert_array_equal(a, b)  # elementwise after the same norm: bit-identical
    assert refopt.reference.global_norm([g]) == refopt.reference.global_norm([np.ascontiguousarray(g)])


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix itself warns
def test_matrix_gradients_are_elementwise_on_both_backends():
    # np.matrix makes * a matrix product; gradients are viewed as plain ndarrays.
    slots = {}
    for backend in ("reference", "cpu"):
        w = np.ones((2, 2))
        opt = refopt.Adam(0.1, clipnorm=1.0, backend=backend)
        opt.apply_gradients([(np.matrix([[1.0, 2.0], [3.0, 4.0]]), w)])
        slots[backend] = opt.get_slot(w, "v").copy()
    # clipnorm 1 on [[1, 2], [3, 4]] (norm sqrt(30)): v = 0.001 * g**2 / 30
    np.testing.assert_allclose(slots["reference"], 0.001 * np.array([[1, 4], [9, 16]]) / 30, rtol=1e-12)
    np.testing.assert_array_equal(slots["reference"], slots["cpu"])


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_variable_that_changed_shape_or_dtype_after_build_is_refused(backend):
    w = np.arange(4, dtype=np.float32)
    opt = refopt.Adam(0.1, backend=backend)
    opt.apply_gradients([(np.ones(4, np.float32), w)])
    before = w.copy()
    w.shape = (2, 2)
    with pytest.raises(ValueError, match=r"built with shape=\(4,\), dtype=float32"):
        opt.apply_gradients([(np.ones((2, 2), np.float32), w)])
    np.testing.assert_array_equal(w.ravel(), before)
    assert opt.iterations == 1


def test_cpu_variable_whose_buffer_moved_takes_the_safe_path():
    ws = {}
    for backend in ("reference", "cpu"):
        w = np.arange(8, dtype=np.float32)
        opt = refopt.Adam(0.1, backend=backend)
        opt.apply_gradients([(np.ones(8, np.float32), w)])
        w.resize(8, refcheck=False)  # may reallocate: build-time addresses are stale
        w.resize(16, refcheck=False)
        w.resize(8, refcheck=False)
        opt.apply_gradients([(np.full(8, 0.5, np.float32), w)])
        ws[backend] = w.copy()
    np.testing.assert_array_equal(ws["reference"], ws["cpu"])
