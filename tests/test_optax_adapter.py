import doctest
import subprocess
import sys

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
import jax.numpy as jnp

import refopt
import refopt.optax as ro

BACKEND = "reference"  # the class and the transform both pass it explicitly


def bits(a):
    a = np.asarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def assert_bits(actual, expected):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    np.testing.assert_array_equal(bits(actual), bits(expected))


def grads_sequence(shapes, steps, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [{k: rng.normal(size=s).astype(dtype) for k, s in shapes.items()}
            for _ in range(steps)]


def class_trajectory(cls, kwargs, params, grads_seq):
    """The stateful class on copies of ``params`` (a dict): params after each step, and the
    optimizer itself, with its variables in the dict's key order (JAX's leaf order)."""
    keys = sorted(params)
    variables = {k: np.array(params[k], copy=True) for k in keys}
    opt = cls(backend=BACKEND, **kwargs)
    out = []
    for grads in grads_seq:
        opt.apply_gradients([(np.asarray(grads[k]), variables[k]) for k in keys])
        out.append({k: v.copy() for k, v in variables.items()})
    return out, opt, variables


def run_transform(tx, params, grads_seq, jit):
    update = jax.jit(tx.update) if jit else tx.update
    state = tx.init(params)
    out = []
    for grads in grads_seq:
        updates, state = update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(params)
    return out, state


def assert_state_is_class(state, opt, variables):
    host = ro.host_state(state)
    keys = sorted(variables)
    assert int(host["iterations"]) == opt.iterations
    if opt.learning_rate is not None:
        assert float(host["learning_rate"]) == opt.learning_rate
    assert sorted(host["slots"]) == sorted(opt.slot_names)
    for name in opt.slot_names:
        for i, k in enumerate(keys):
            assert_bits(host["slots"][name][i], opt.get_slot(variables[k], name))
    sd = opt.state_dict()
    assert [int(s) for s in host["variable_steps"]] == sd["variable_steps"]


PARAMS = {"w": np.array([[0.5, -1.0, 2.0], [1.5, -0.25, 0.75]], np.float32),
          "b": np.array([1.0, -2.0], np.float32)}
SHAPES = {k: v.shape for k, v in PARAMS.items()}


# ----------------------------------------------------------------- trajectories
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("cls,kwargs", [
    (refopt.Adam, {"learning_rate": 0.01, "convention": "tf_keras"}),
    (refopt.Adam, {"learning_rate": 0.01, "convention": "torch", "amsgrad": True}),
    (refopt.AdamW, {"learning_rate": 0.01, "convention": "optax"}),
    (refopt.SGD, {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True, "convention": "keras3"}),
    (refopt.RMSprop, {"learning_rate": 0.01, "centered": True, "convention": "tf_keras"}),
], ids=["adam-tf_keras", "amsgrad-torch", "adamw-optax", "sgd-keras3", "rmsprop-tf_keras"])
def test_trajectory_equals_the_class(cls, kwargs, jit):
    # weights of order one moved by 1e-2 steps: p/2 <= n <= 2p, so params + updates is exact
    grads_seq = grads_sequence(SHAPES, 4)
    expected, opt, variables = class_trajectory(cls, kwargs, PARAMS, grads_seq)
    tx = ro.transform(cls, backend=BACKEND, **kwargs)
    params = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    got, state = run_transform(tx, params, [{k: jnp.asarray(v) for k, v in g.items()}
                                             for g in grads_seq], jit)
    for step_got, step_expected in zip(got, expected):
        for k in PARAMS:
            assert_bits(step_got[k], step_expected[k])
    assert_state_is_class(state, opt, variables)


def test_a_float64_learning_rate_is_carried_exactly_without_x64():
    tx = ro.sgd(learning_rate=0.1, convention="torch", backend=BACKEND)  # a Python float
    with jax.enable_x64(False):
        state = tx.init({k: jnp.asarray(v) for k, v in PARAMS.items()})
    assert state["learning_rate"].dtype == np.uint32 and state["learning_rate"].shape == (2,)
    host = ro.host_state(state)
    assert host["learning_rate"].dtype == np.float64 and float(host["learning_rate"]) == 0.1
    assert host["iterations"].dtype == np.int64


def test_float64_under_x64_equals_the_class():
    with jax.enable_x64(True):
        params = {k: jnp.asarray(v.astype(np.float64)) for k, v in PARAMS.items()}
        grads_seq = grads_sequence(SHAPES, 3, np.float64)
        kwargs = {"learning_rate": 0.01, "convention": "keras2"}
        expected, opt, variables = class_trajectory(
            refopt.Adam, kwargs, {k: np.asarray(v) for k, v in params.items()}, grads_seq)
        tx = ro.adam(backend=BACKEND, **kwargs)
        got, state = run_transform(tx, params, grads_seq, jit=True)
        assert state["iterations"].dtype == np.int64
        for k in PARAMS:
            assert_bits(got[-1][k], expected[-1][k])
        assert_state_is_class(state, opt, variables)


def test_inside_optax_chain_after_clip_by_global_norm():
    kwargs = {"learning_rate": 0.01, "convention": "torch"}
    tx = optax.chain(optax.clip_by_global_norm(1.0), ro.adam(backend=BACKEND, **kwargs))
    # global norms 4 and 8 (squares summing to 16, 64): optax's clipping is exact (g / 4, g / 8)
    # in any order of operations, eager or fused by XLA, so the class gets the same numbers
    rng = np.random.default_rng(1)
    steps = []
    for values in ([3, 1, 1, 1, 1, 1, 1, 1], [2, 2, 2, 2, 0, 0, 0, 0], [4, 4, 4, 4, 0, 0, 0, 0]):
        flat = rng.permutation(np.array(values, np.float32)) * rng.choice([-1, 1], 8)
        steps.append({"w": flat[:6].reshape(2, 3), "b": flat[6:]})
    grads_seq = [{k: jnp.asarray(v) for k, v in g.items()} for g in steps]
    clip = optax.clip_by_global_norm(1.0)
    clipped = [{k: np.asarray(v) for k, v in clip.update(g, clip.init(g))[0].items()}
               for g in grads_seq]
    assert np.array_equal(clipped[0]["w"], steps[0]["w"] / 4)
    expected, opt, variables = class_trajectory(refopt.Adam, kwargs, PARAMS, clipped)
    params = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    got, state = run_transform(tx, params, grads_seq, jit=True)
    for k in PARAMS:
        assert_bits(got[-1][k], expected[-1][k])
    assert_state_is_class(state[1], opt, variables)


def test_nested_params_tree_and_leaf_order():
    params = {"layer": [jnp.asarray(PARAMS["w"]), jnp.asarray(PARAMS["b"])],
              "scale": jnp.float32(2.0)}
    rng = np.random.default_rng(3)
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), p.dtype), params)
    tx = ro.adam(learning_rate=0.1, global_clipnorm=0.5, backend=BACKEND)  # mixes the leaves
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    leaves = [np.array(v, copy=True) for v in jax.tree.leaves(params)]
    opt = refopt.Adam(learning_rate=0.1, global_clipnorm=0.5, backend=BACKEND)
    opt.apply_gradients(zip([np.asarray(g) for g in jax.tree.leaves(grads)], leaves))
    assert jax.tree.structure(state["slots"]["m"]) == jax.tree.structure(params)
    for got, want in zip(jax.tree.leaves(optax.apply_updates(params, updates)), leaves):
        assert_bits(got, want)


def test_zero_gradient_is_an_ordinary_step():
    kwargs = {"learning_rate": 0.01, "convention": "tf_keras"}
    grads_seq = grads_sequence(SHAPES, 1) + [{k: np.zeros(s, np.float32)
                                              for k, s in SHAPES.items()}]
    expected, opt, variables = class_trajectory(refopt.Adam, kwargs, PARAMS, grads_seq)
    got, state = run_transform(ro.adam(backend=BACKEND, **kwargs), PARAMS, grads_seq, jit=True)
    assert int(ro.host_state(state)["iterations"]) == 2
    assert not np.array_equal(expected[1]["w"], expected[0]["w"])  # m still moves it
    for k in PARAMS:
        assert_bits(got[1][k], expected[1][k])
    assert_state_is_class(state, opt, variables)


def test_float16_and_use_ema_and_the_state_under_vmap():
    params = {"h": jnp.asarray(np.array([1.0, -0.5, 0.25], np.float16))}
    g = np.array([0.5, 0.25, -1.0], np.float16)
    tx = ro.sgd(learning_rate=0.125, use_ema=True, backend=BACKEND)
    updates, state = jax.jit(tx.update)({"h": jnp.asarray(g)}, tx.init(params), params)
    w = np.asarray(params["h"]).copy()
    opt = refopt.SGD(learning_rate=0.125, use_ema=True, backend=BACKEND)
    opt.apply_gradients([(g, w)])
    assert_bits(optax.apply_updates(params, updates)["h"], w)
    assert_bits(ro.host_state(state)["slots"]["average"][0], opt.get_slot(w, "average"))

    # vmap: one refopt step per batch element, in turn
    batch = {"h": jnp.stack([params["h"], 2 * params["h"]])}
    gb = {"h": jnp.stack([jnp.asarray(g), -jnp.asarray(g)])}
    ub, sb = jax.jit(jax.vmap(tx.update))(gb, jax.vmap(tx.init)(batch), batch)
    for i in range(2):
        one = {"h": batch["h"][i]}
        u1, s1 = tx.update({"h": gb["h"][i]}, tx.init(one), one)
        assert_bits(ub["h"][i], u1["h"])
        assert_bits(sb["slots"]["average"]["h"][i], s1["slots"]["average"]["h"])


def test_host_state_of_a_vmapped_state_has_the_batch_dimensions_first():
    # without x64 the int64 counters are stored as uint32 pairs: decoding must keep the batch
    tx = ro.adam(learning_rate=0.01, backend=BACKEND)
    batch = {"w": np.ones((3, 2, 2), np.float32), "b": np.zeros(3, np.float32)}
    grads = {k: np.arange(v.size, dtype=v.dtype).reshape(v.shape) for k, v in batch.items()}
    _, state = jax.vmap(tx.update)(grads, jax.vmap(tx.init)(batch), batch)
    host = ro.host_state(state)
    assert host["iterations"].shape == (3,) and host["iterations"].dtype == np.int64
    for i in range(3):
        one = ro.host_state(jax.tree.map(lambda x, i=i: np.asarray(x)[i], state))
        assert int(host["iterations"][i]) == int(one["iterations"]) == 1
        assert_bits(host["learning_rate"][i], one["learning_rate"])
        for name in ("m", "v"):
            for a, b in zip(host["slots"][name], one["slots"][name]):
                assert_bits(a[i], b)
    moved = jax.tree.map(lambda x: np.moveaxis(np.asarray(x), 0, -1), state)
    with pytest.raises(ValueError, match="batch dimensions first"):
        ro.host_state(moved)


def test_inject_hyperparams_is_refused_with_a_hint():
    tx = optax.inject_hyperparams(ro.adam)(learning_rate=1e-3)
    with pytest.raises(TypeError, match=r"inject_hyperparams is not supported.*refopt\.schedules"):
        tx.init({"w": jnp.ones(2)})


def test_python_number_leaves_are_refused_naming_the_leaf():
    tx = ro.adam(backend=BACKEND)
    with pytest.raises(TypeError, match=r"params\['w'\] = 1\.0 \(float\).*jnp\.asarray"):
        tx.init({"w": 1.0, "b": jnp.ones(2)})
    with pytest.raises(TypeError, match=r"Received: params = 2 \(int\)"):
        tx.init(2)
    state = tx.init({"w": jnp.ones(2)})
    with pytest.raises(TypeError, match=r"updates\['w'\] = 0\.5"):
        tx.update({"w": 0.5}, state, {"w": jnp.ones(2)})


def test_empty_params_is_a_no_op():
    tx = ro.adam(backend=BACKEND)
    state = tx.init({})
    updates, state2 = jax.jit(tx.update)({}, state, {})
    assert updates == {} and int(ro.host_state(state2)["iterations"]) == 0


# ----------------------------------------------------------------- exactness of p + u
def test_a_step_that_crosses_zero_rounds_in_optax_apply_updates_and_keep_params_fixes_it():
    # AdamW under tf_keras decays the weight, then steps: two roundings. From p = 1e-4 the
    # first step of about -lr crosses zero to -0.00089999055, and fl(p + fl(n - p)) misses n
    p = np.array([1e-4, 0.5], np.float32)
    g = np.ones(2, np.float32)
    opt = refopt.AdamW(learning_rate=1e-3, convention="tf_keras", backend=BACKEND)
    n = p.copy()
    opt.apply_gradients([(g, n)])
    tx = ro.adamw(learning_rate=1e-3, convention="tf_keras", backend=BACKEND, keep_params=True)
    params = {"p": jnp.asarray(p)}
    updates, state = jax.jit(tx.update)({"p": jnp.asarray(g)}, tx.init(params), params)
    plain = np.asarray(optax.apply_updates(params, updates)["p"])
    assert bits(plain)[0] != bits(n)[0]  # the documented counterexample: one ulp off
    assert abs(int(bits(plain)[0]) - int(bits(n)[0])) == 1
    assert_bits(plain[1:], n[1:])  # 0.5 -> 0.499: Sterbenz, exact
    assert_bits(state["params"]["p"], n)
    assert_bits(jax.jit(ro.apply_updates)(params, updates, state)["p"], n)


def test_subnormal_weights_are_flushed_by_xla_and_kept_by_apply_updates():
    p = np.array([1e-39, 1.0], np.float32)  # 1e-39 is subnormal in float32
    assert 0 < p[0] < np.finfo(np.float32).tiny
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     ro.sgd(learning_rate=0.1, backend=BACKEND, keep_params=True))
    params = {"p": jnp.asarray(p)}
    grads = {"p": jnp.asarray(np.array([0.0, 1.0], np.float32))}
    updates, state = jax.jit(tx.update)(grads, tx.init(params), params)
    assert np.asarray(optax.apply_updates(params, updates)["p"])[0] == 0  # XLA flushed it
    exact = ro.apply_updates(params, updates, state)["p"]
    assert_bits(np.asarray(exact)[0], p[0])


def test_refopt_keeps_subnormals_inside_the_callback():
    # XLA runs callbacks with subnormals flushed; v = (1 - beta_2) * g**2 = 1e-43 is subnormal
    w = np.array([0.5, -0.25], np.float32)
    g = np.array([1e-20, -3e-21], np.float32)
    opt = refopt.Adam(learning_rate=0.01, backend=BACKEND)
    expected = w.copy()
    opt.apply_gradients([(g, expected)])
    v = opt.get_slot(expected, "v")
    assert 0 < v[0] < np.finfo(np.float32).tiny
    tx = ro.adam(learning_rate=0.01, backend=BACKEND)
    params = [jnp.asarray(w)]
    updates, state = jax.jit(tx.update)([jnp.asarray(g)], tx.init(params), params)
    assert_bits(ro.host_state(state)["slots"]["v"][0], v)
    assert_bits(optax.apply_updates(params, updates)[0], expected)


def test_apply_updates_falls_back_to_plus_where_a_later_transform_changed_the_update():
    tx = optax.chain(ro.sgd(learning_rate=0.1, backend=BACKEND, keep_params=True),
                     optax.scale(0.5))
    params = {"p": jnp.asarray(np.array([1.0, 2.0], np.float32))}
    updates, state = tx.update({"p": jnp.ones(2)}, tx.init(params), params)
    assert_bits(ro.apply_updates(params, updates, state)["p"],
                optax.apply_updates(params, updates)["p"])


# ----------------------------------------------------------------- errors
def test_bad_optimizer_and_hyperparameters_raise_at_once():
    with pytest.raises(TypeError, match="optimizer"):
        ro.transform("adam")
    with pytest.raises(TypeError, match="Pass the class"):
        ro.transform(refopt.Adam())
    with pytest.raises(ValueError, match="learning_rate"):
        ro.adam(learning_rate=-1.0)
    with pytest.raises(TypeError, match="lr"):
        ro.adam(lr=0.1)
    with pytest.raises(TypeError, match="learning_rate"):
        ro.adam(learning_rate=optax.constant_schedule(0.1))
    with pytest.raises(TypeError, match="keep_params"):
        ro.adam(keep_params="yes")
    with pytest.raises(TypeError, match="traced JAX value"):
        jax.jit(lambda lr: ro.adam(learning_rate=lr) and lr)(0.1)
    tx = ro.adam(jnp.float32(0.25), backend=BACKEND)  # a concrete JAX scalar is its value
    params = {"w": jnp.ones(2)}
    updates, _ = tx.update(params, tx.init(params), params)
    w = np.ones(2, np.float32)
    refopt.Adam(learning_rate=0.25, backend=BACKEND).apply_gradients([(np.ones(2, np.float32), w)])
    assert_bits(optax.apply_updates(params, updates)["w"], w)


def test_bad_updates_params_and_state_are_named():
    tx = ro.adam(backend=BACKEND)
    params = {k: jnp.asarray(v) for k, v in PARAMS.items()}
    grads = jax.tree.map(jnp.ones_like, params)
    state = tx.init(params)
    with pytest.raises(ValueError, match="needs `params`"):
        tx.update(grads, state)
    with pytest.raises(ValueError, match="same structure"):
        tx.update({"w": grads["w"], "b": None}, state, params)
    with pytest.raises(ValueError, match=r"\['b'\] has shape \(3,\)"):
        tx.update({"w": grads["w"], "b": jnp.ones(3)}, state, params)
    with pytest.raises(TypeError, match="RefoptState"):
        tx.update(grads, optax.EmptyState(), params)
    with pytest.raises(ValueError, match="init"):
        tx.update({"w": grads["w"]}, state, {"w": params["w"]})
    with pytest.raises(TypeError, match="bfloat16"):
        tx.init({"w": jnp.ones(2, jnp.bfloat16)})
    with pytest.raises(TypeError, match="int32"):
        tx.init({"w": jnp.ones(2, jnp.int32)})
    with pytest.raises(TypeError, match="jax_enable_x64"):
        tx.init({"w": np.ones(2, np.float64)})
    with pytest.raises(ValueError, match="keep_params=True"):
        ro.apply_updates(params, grads, state)
    with pytest.raises(TypeError, match="RefoptState"):
        ro.host_state({"iterations": 0})


# ----------------------------------------------------------------- packaging and docs
def test_import_refopt_does_not_import_jax():
    code = "import sys, refopt; assert 'jax' not in sys.modules and 'optax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docstring_examples_run():
    result = doctest.testmod(ro, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_a_shortcut_for_every_optimizer_class():
    for name in refopt.__all__:
        cls = getattr(refopt, name)
        if isinstance(cls, type) and issubclass(cls, refopt.Optimizer) and cls is not refopt.Optimizer:
            assert getattr(ro, name.lower()).__name__ == name.lower()
