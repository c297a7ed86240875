"""Record the golden data of the optax cases (convention "optax") with the real optax on JAX CPU.

Run from the repository root, in the environment of ``requirements-optax.txt``::

    python conformance/generators/gen_optax.py [--only SUBSTRING]

For every case of ``cases.py`` whose convention is "optax", "optax_eager" or "optax_jit_step"
(and whose id contains SUBSTRING), the inputs of :func:`cases.make_inputs` are fed as a list
pytree of jnp arrays. The convention (``cases.OPTAX_MODES``; a ``knobs["optax_jit"]`` overrides
it) says what runs under ``jax.jit``: "optax" (mode ``update``) runs the transformation's
``update`` under ``jax.jit`` and then ``optax.apply_updates`` outside jit; "optax_eager"
(``eager``) runs both eagerly; "optax_jit_step" (``step``) jits the whole step
``params = apply_updates(params, update(grads, state, params))`` (:func:`make_step`).
Recorded state, under refopt's names:

* ``optax.adam`` / ``adamw``: ``mu`` -> ``m``, ``nu`` -> ``v``
* ``optax.amsgrad``:          ``mu`` -> ``m``, ``nu`` -> ``v``, ``nu_max`` -> ``vhat``
                              (optax's maximum is over the *bias-corrected* nu)
* ``optax.sgd`` with momentum: ``trace`` -> ``m``
* ``optax.rmsprop``:          ``nu`` -> ``velocity``; centered (``scale_by_stddev``) ``mu`` ->
                              ``average_gradient``; with momentum ``trace`` -> ``momentum``
                              (``rho`` is optax's ``decay``; ``variant`` may set ``eps_in_sqrt``)
* ``optax.adagrad``:          ``sum_of_squares`` (``scale_by_rss``) -> ``accumulator``
* ``optax.lion``:             ``ScaleByLionState.mu`` -> ``m``
* ``optax.radam``:            ``mu`` -> ``m``, ``nu`` -> ``v`` (``ScaleByAdamState``)

float64 cases need ``jax_enable_x64``, which must be set before JAX computes anything and which
also changes how Python-float hyperparameters promote (the float32 cases must run without it).
So the script records the float32 cases in this process and the float64 cases in a child
process started with ``--x64``.

A ``learning_rate`` given as a serialized ``refopt.optax_schedules`` schedule becomes the optax
schedule of the same name and keywords (:func:`optax_schedule`); its value at each step is
recorded as ``state/learning_rate``. ``--schedules`` records only the schedule values of
``cases.OPTAX_SCHEDULE_VALUES`` (``jax.jit(schedule)(jnp.int32(step))``, float32 bits) into
``conformance/schedules/optax.json``.

Hyperparameters use refopt/Keras names in ``cases.py``; they are translated here. One the case
omits takes optax's own default (e.g. ``eps=1e-8``, adamw ``weight_decay=1e-4``).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys

if "--x64" in sys.argv:  # before anything touches JAX
    import jax

    jax.config.update("jax_enable_x64", True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import store  # noqa: E402

_ADAM_KEYS = {"learning_rate": "learning_rate", "beta_1": "b1", "beta_2": "b2",
              "epsilon": "eps"}
_RMSPROP_KEYS = {"learning_rate": "learning_rate", "rho": "decay", "epsilon": "eps",
                 "momentum": "momentum", "centered": "centered", "eps_in_sqrt": "eps_in_sqrt"}
_ADAGRAD_KEYS = {"learning_rate": "learning_rate",
                 "initial_accumulator_value": "initial_accumulator_value", "epsilon": "eps"}
_WRAPPER_KEYS = {"global_clipnorm", "clipvalue"}


def versions():
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "optax": optax.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


def _kwargs(case, keymap):
    out = {}
    for key, value in case["hyperparameters"].items():
        if key in _WRAPPER_KEYS or key == "amsgrad":
            continue
        if key not in keymap:
            raise ValueError(f"{case['id']}: hyperparameter {key!r} has no optax mapping here")
        if key == "learning_rate" and isinstance(value, dict):
            value = optax_schedule(value)  # refopt.optax_schedules' serialized form
        elif key == "learning_rate" and not isinstance(value, (int, float)):
            raise ValueError(f"{case['id']}: learning-rate schedules are not mapped for optax")
        out[keymap[key]] = value
    out.update(case["variant"])
    return out


# refopt.optax_schedules' class names -> optax's schedule functions (same keywords)
_OPTAX_SCHEDULES = {
    "OptaxConstantSchedule": "constant_schedule",
    "OptaxLinearSchedule": "linear_schedule",
    "OptaxPolynomialSchedule": "polynomial_schedule",
    "OptaxExponentialDecay": "exponential_decay",
    "OptaxCosineDecaySchedule": "cosine_decay_schedule",
    "OptaxWarmupCosineDecaySchedule": "warmup_cosine_decay_schedule",
    "OptaxWarmupExponentialDecaySchedule": "warmup_exponential_decay_schedule",
    "OptaxPiecewiseConstantSchedule": "piecewise_constant_schedule",
    "OptaxJoinSchedules": "join_schedules",
}


def optax_schedule(spec):
    """The optax schedule of a serialized refopt.optax_schedules schedule (a dict)."""
    name = spec["class_name"]
    if name not in _OPTAX_SCHEDULES:
        raise ValueError(f"schedule {name!r} is not an optax schedule")
    kw = dict(spec["config"])
    if name == "OptaxJoinSchedules":
        kw["schedules"] = [optax_schedule(s) for s in kw["schedules"]]
    if name == "OptaxPiecewiseConstantSchedule" and kw.get("boundaries_and_scales") is not None:
        kw["boundaries_and_scales"] = {int(b): s for b, s in kw["boundaries_and_scales"]}
    return getattr(optax, _OPTAX_SCHEDULES[name])(**kw)


def record_schedule_values(specs, path):
    """Write ``{id: {schedule, steps, bits}}`` of optax's schedules under ``jax.jit``.

    Each schedule is evaluated as optax's ``scale_by_schedule`` does inside a jitted update:
    ``jax.jit(schedule)`` on an int32 count; ``bits`` are the float32 results as uint32.
    """
    import json

    out = {}
    for spec in specs:
        fn = jax.jit(optax_schedule(spec["schedule"]))
        values = [np.float32(fn(jnp.int32(k))) for k in spec["steps"]]
        assert all(np.asarray(v).dtype == np.float32 for v in values)
        out[spec["id"]] = dict(spec, bits=[int(np.asarray(v).view(np.uint32)) for v in values])
    payload = {"framework_version": versions(), "mode": "jax.jit(schedule)(jnp.int32(step))",
               "schedules": out}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
        f.write("\n")
    return len(out)


def build_transformation(case):
    """The optax GradientTransformation of ``case``; raises on anything it cannot map."""
    hyper = case["hyperparameters"]
    name = case["optimizer"]
    if name == "MultiSteps":  # optax.MultiSteps around the inner optimizer's transformation
        inner = hyper["inner_optimizer"]
        skip = hyper.get("should_skip_update_fn")
        return optax.MultiSteps(
            build_transformation(dict(case, optimizer=inner["class_name"],
                                      hyperparameters=inner["config"])),
            every_k_schedule=hyper["every_k_schedule"],
            use_grad_mean=hyper.get("use_grad_mean", True),
            should_skip_update_fn={None: None, "skip_not_finite": optax.skip_not_finite}[skip])
    if name == "Adam":
        if hyper.get("weight_decay"):
            raise ValueError("optax.adam has no L2 weight decay")
        fn = optax.amsgrad if hyper.get("amsgrad") else optax.adam
        tx = fn(**_kwargs(case, dict(_ADAM_KEYS, nesterov="nesterov", eps_root="eps_root")))
    elif name == "AdamW":
        if hyper.get("amsgrad"):
            raise ValueError("optax.adamw has no amsgrad")
        tx = optax.adamw(**_kwargs(case, dict(_ADAM_KEYS, weight_decay="weight_decay",
                                              eps_root="eps_root", nesterov="nesterov")))
    elif name == "SGD":
        tx = optax.sgd(**_kwargs(case, {"learning_rate": "learning_rate", "momentum": "momentum",
                                         "nesterov": "nesterov"}))
    elif name == "RMSprop":
        if hyper.get("momentum", None) == 0.0:
            # optax would still chain trace(decay=0); Keras' momentum=0 means no momentum at all
            raise ValueError(f"{case['id']}: leave momentum out (optax's None) instead of 0")
        tx = optax.rmsprop(**_kwargs(case, _RMSPROP_KEYS))
    elif name == "Adagrad":
        tx = optax.adagrad(**_kwargs(case, _ADAGRAD_KEYS))
    elif name == "Lion":
        tx = optax.lion(**_kwargs(case, {"learning_rate": "learning_rate", "beta_1": "b1",
                                          "beta_2": "b2", "weight_decay": "weight_decay"}))
    elif name == "RAdam":
        tx = optax.radam(**_kwargs(case, dict(_ADAM_KEYS, epsilon_root="eps_root",
                                              threshold="threshold")))
    elif name == "Adamax":
        tx = optax.adamax(**_kwargs(case, _ADAM_KEYS))
    elif name == "Nadam":  # adam(nesterov=True); slots mu -> m, nu -> v
        tx = optax.nadam(**_kwargs(case, dict(_ADAM_KEYS, eps_root="eps_root")))
    elif name == "Lamb":
        tx = optax.lamb(**_kwargs(case, dict(_ADAM_KEYS, eps_root="eps_root",
                                             weight_decay="weight_decay")))
    elif name == "Adafactor":
        kw = _kwargs(case, _ADAFACTOR_KEYS)
        if "beta_2_decay" in kw:  # refopt's (Keras') exponent -> optax's decay_rate
            kw["decay_rate"] = -kw.pop("beta_2_decay")
        tx = optax.adafactor(**kw)
    elif name == "Adadelta":
        tx = optax.adadelta(**_kwargs(case, {"learning_rate": "learning_rate", "rho": "rho",
                                             "epsilon": "eps", "weight_decay": "weight_decay"}))
    else:
        raise ValueError(f"{case['id']}: optimizer {name!r} is not mapped for optax")
    before = []
    if "global_clipnorm" in hyper:
        before.append(optax.clip_by_global_norm(hyper["global_clipnorm"]))
    if "clipvalue" in hyper:
        before.append(optax.clip(hyper["clipvalue"]))
    return optax.chain(*before, tx) if before else tx


def _walk_states(state):
    """Every optimizer-state node inside an optax state (chains are nested tuples)."""
    yield state
    if isinstance(state, tuple) and not hasattr(state, "_fields"):
        for s in state:
            yield from _walk_states(s)


# refopt's Adafactor names -> optax.adafactor's (beta_2_decay is negated into decay_rate)
_ADAFACTOR_KEYS = {"learning_rate": "learning_rate", "beta_2_decay": "beta_2_decay",
                   "epsilon_1": "eps", "clip_threshold": "clipping_threshold",
                   "min_dim_size_to_factor": "min_dim_size_to_factor",
                   "decay_offset": "decay_offset", "factored": "factored",
                   "multiply_by_parameter_scale": "multiply_by_parameter_scale",
                   "weight_decay": "weight_decay_rate"}


def record_slots(state, n, optimizer=None):
    """refopt slot name -> list (variables) of ndarray, from the optax state.

    For ``optimizer == "RMSprop"`` the names are RMSprop's: ``nu`` -> ``velocity``, the
    centered ``mu`` -> ``average_gradient``, ``trace`` -> ``momentum``.
    """
    found = {}
    rms = optimizer == "RMSprop"

    def put(name, leaves):
        assert name not in found, f"two states give slot {name!r}"
        assert len(leaves) == n
        found[name] = [np.array(x) for x in leaves]

    for s in _walk_states(state):
        if optimizer == "Adamax":  # scale_by_adamax keeps ScaleByAdamState: nu is u
            if isinstance(s, optax.ScaleByAdamState):
                put("m", s.mu), put("u", s.nu)
            elif getattr(s, "_fields", ()):
                raise ValueError(f"unexpected optax state {type(s).__name__} in adamax")
        elif optimizer == "Adadelta":
            if isinstance(s, optax.ScaleByAdaDeltaState):
                put("accumulated_grad", s.e_g), put("accumulated_delta", s.e_x)
            elif getattr(s, "_fields", ()):
                raise ValueError(f"unexpected optax state {type(s).__name__} in adadelta")
        elif optimizer == "Adafactor":
            # FactoredState: v_row, v_col (factored leaves), v (the others); each leaf's
            # unused entries are zeros((1,)) placeholders, not recorded (no case has a
            # one-element variable)
            if type(s).__name__ == "FactoredState":
                for name, leaves in (("velocity_row", s.v_row), ("velocity_col", s.v_col),
                                     ("velocity", s.v)):
                    assert name not in found and len(leaves) == n
                    found[name] = [None if np.shape(x) == (1,) else np.array(x)
                                   for x in leaves]
            elif getattr(s, "_fields", ()):
                raise ValueError(f"unexpected optax state {type(s).__name__} in adafactor")
        elif optimizer == "Lion":
            if isinstance(s, optax.ScaleByLionState):
                put("m", s.mu)
            elif getattr(s, "_fields", ()):
                raise ValueError(f"unexpected optax state {type(s).__name__} in lion")
        elif optimizer == "Adagrad":
            if isinstance(s, optax.ScaleByRssState):
                put("accumulator", s.sum_of_squares)
            elif getattr(s, "_fields", ()):
                raise ValueError(f"unexpected optax state {type(s).__name__} in adagrad")
        elif rms and isinstance(s, optax.ScaleByRmsState):
            put("velocity", s.nu)
        elif rms and isinstance(s, optax.ScaleByRStdDevState):
            put("average_gradient", s.mu), put("velocity", s.nu)
        elif rms and isinstance(s, optax.TraceState):
            put("momentum", s.trace)
        elif rms and getattr(s, "_fields", ()):  # EmptyState has no fields
            raise ValueError(f"unexpected optax state {type(s).__name__} in rmsprop")
        elif isinstance(s, optax.ScaleByAmsgradState):
            put("m", s.mu), put("v", s.nu), put("vhat", s.nu_max)
        elif isinstance(s, optax.ScaleByAdamState):
            put("m", s.mu), put("v", s.nu)
        elif isinstance(s, optax.TraceState):
            put("m", s.trace)
    return found


def jit_mode(case):
    """``"update"``, ``"eager"`` or ``"step"``: what the case runs under ``jax.jit``."""
    return case.get("knobs", {}).get("optax_jit", cases.OPTAX_MODES[case["convention"]])


def make_step(tx, mode):
    """``step(grads, state, params) -> (params, state)`` with ``mode``'s part under jit."""
    def whole(g, state, params):
        updates, state = tx.update(g, state, params)
        return optax.apply_updates(params, updates), state

    if mode == "step":
        return jax.jit(whole)
    if mode == "eager":
        return whole
    update = jax.jit(tx.update)

    def jit_update(g, state, params):
        updates, state = update(g, state, params)
        return optax.apply_updates(params, updates), state

    return jit_update


def _from_bits(a):
    """``make_inputs``' uint16 arrays are bfloat16 bits (cases.bfloat16_bits): as bfloat16."""
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a


def _to_bits(a):
    """A recorded bfloat16 array as its uint16 bits (store.storage_dtype); others as they are."""
    if a is None:
        return None
    a = np.asarray(a)
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def run_case(case):
    dtype = np.dtype(case["dtype"])
    init, grads = cases.make_inputs(case)
    params = [jnp.asarray(_from_bits(a)) for a in init]
    for p in params:
        assert p.dtype == dtype, (case["id"], p.dtype)
    tx = build_transformation(case)
    state = tx.init(params)
    step = make_step(tx, jit_mode(case))

    recorded_params = []
    slots = {}
    lr_spec = case["hyperparameters"].get("learning_rate")
    lr_fn = jax.jit(optax_schedule(lr_spec)) if isinstance(lr_spec, dict) else None
    state_lr = []  # the schedule's value at each step's count (0-based), as optax computes it
    for k, row in enumerate(grads, start=1):
        if lr_fn is not None:
            state_lr.append(np.array(lr_fn(jnp.int32(k - 1))))
        if any(g is None or isinstance(g, tuple) for g in row):
            raise ValueError(f"{case['id']}: optax takes dense gradients for every leaf only")
        g = [jnp.asarray(_from_bits(x)) for x in row]
        params, state = step(g, state, params)
        recorded_params.append([_to_bits(np.array(p)) for p in params])
        opt_name, inner_state = case["optimizer"], state
        if case["optimizer"] == "MultiSteps":  # the inner optimizer's state
            opt_name = case["hyperparameters"]["inner_optimizer"]["class_name"]
            inner_state = state.inner_opt_state
        for name, per_var in record_slots(inner_state, len(params), opt_name).items():
            per_var = [_to_bits(s) for s in per_var]
            slots.setdefault(name, [[None] * len(params)] * (k - 1)).append(per_var)
    store.save_case(case, framework="optax", versions=versions(), init=init, grads=grads,
                    params=recorded_params, slots=slots,
                    state={"learning_rate": state_lr} if state_lr else None)
    return sorted(slots)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="record only cases whose id contains this")
    parser.add_argument("--x64", action="store_true",
                        help="(internal) record the float64 cases, with jax_enable_x64")
    parser.add_argument("--schedules", action="store_true",
                        help="record only the schedule values (conformance/schedules/optax.json)")
    args = parser.parse_args(argv)
    if args.schedules:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                            "schedules", "optax.json")
        n = record_schedule_values(cases.OPTAX_SCHEDULE_VALUES, path)
        print(f"recorded {n} optax schedules into {os.path.normpath(path)}")
        return 0
    todo = [c for c in cases.cases_for(set(cases.OPTAX_MODES)) if args.only in c["id"]]
    if not todo:
        sys.exit(f"no optax case matches {args.only!r}")
    wide = [c for c in todo if c["dtype"] == "float64"]
    mine = wide if args.x64 else [c for c in todo if c["dtype"] != "float64"]
    failed = []
    for case in mine:
        try:
            names = run_case(case)
        except Exception as exc:  # report, go on with the others
            failed.append(case["id"])
            print(f"SKIPPED {case['id']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"recorded {case['id']}  slots={names}  (x64={jax.config.jax_enable_x64})")
    rc = 1 if failed else 0
    if wide and not args.x64:
        child = [sys.executable, os.path.abspath(__file__), "--x64", "--only", args.only]
        rc |= subprocess.call(child)
    if not args.x64:
        print(f"optax {optax.__version__} / jax {jax.__version__}: done, "
              f"{'some cases FAILED' if rc else 'all recorded'}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
