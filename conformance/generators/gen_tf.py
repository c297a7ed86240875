"""Golden data for conventions ``tf_keras`` (tf_keras 2.11+ optimizers) and ``keras3`` (Keras 3, TF backend).

Run from the repository root with the environment of ``requirements-tf.txt``::

    python conformance/generators/gen_tf.py [--only SUBSTRING]

Eager mode, CPU only, oneDNN off. Writes ``conformance/data/<id>.npz`` and the manifest entries
through ``store.save_case``.
"""

from __future__ import annotations

import argparse
import os
import sys

# Before TensorFlow is imported: CPU only, no oneDNN re-association, Keras 3 on TensorFlow.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import cases  # noqa: E402
import store  # noqa: E402

CONVENTIONS = (cases.TF, cases.K3)


def _import_frameworks():
    import tensorflow as tf
    import tf_keras
    import keras

    assert keras.backend.backend() == "tensorflow", keras.backend.backend()
    return tf, tf_keras, keras


def _from_bits(a):
    """``make_inputs``' uint16 arrays are bfloat16 bits (cases.bfloat16_bits): as bfloat16."""
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:
        import ml_dtypes

        return a.view(ml_dtypes.bfloat16)
    return a


def _to_bits(a):
    """A recorded bfloat16 array as its uint16 bits (store.storage_dtype); others as they are."""
    return a.view(np.uint16) if a.dtype.name == "bfloat16" else a


def _tf_grad(tf, g, dtype, shape):
    """One entry of ``make_inputs``' gradient row as what a TF program would hand the optimizer."""
    if g is None:
        return None
    if isinstance(g, tuple):
        _, idx, values = g
        return tf.IndexedSlices(tf.constant(_from_bits(values), dtype=dtype),
                                tf.constant(idx, dtype=tf.int64),
                                tf.constant(shape, dtype=tf.int64))
    return tf.constant(_from_bits(g), dtype=dtype)


def _build_optimizer(case, tf_keras, keras):
    hyper = dict(case["hyperparameters"])
    conv = case["convention"]
    mod = tf_keras.optimizers if conv == cases.TF else keras.optimizers
    lr = hyper.get("learning_rate")
    if isinstance(lr, dict):  # a serialized schedule
        # refopt's `convention` keyword (a tf-keras schedule with decay_steps <= 0) is not Keras'
        lr = dict(lr, config={k: v for k, v in lr["config"].items() if k != "convention"})
        hyper["learning_rate"] = mod.schedules.deserialize(lr)
    cls = {"Adam": mod.Adam, "AdamW": mod.AdamW, "SGD": mod.SGD,
           "RMSprop": mod.RMSprop, "Adagrad": mod.Adagrad, "Adadelta": mod.Adadelta,
           "Adamax": mod.Adamax, "Ftrl": mod.Ftrl, "Nadam": mod.Nadam,
           "Adafactor": mod.Adafactor, "Lamb": getattr(mod, "Lamb", None),
           "Lion": mod.Lion}[case["optimizer"]]
    return cls(**hyper)


def _slot_index(opt, var, conv):
    if conv == cases.TF:
        return opt._index_dict[opt._var_key(var)]
    return opt._get_variable_index(var)


def _record_slots(case, opt, variables):
    """State after a step, keyed by refopt's slot names; one entry per variable."""
    conv = case["convention"]
    hyper = case["hyperparameters"]
    out = {}
    idx = [_slot_index(opt, v, conv) for v in variables]
    if case["optimizer"] in ("Adam", "AdamW"):
        out["m"] = [opt._momentums[i] for i in idx]
        out["v"] = [opt._velocities[i] for i in idx]
        if hyper.get("amsgrad", False):
            out["vhat"] = [opt._velocity_hats[i] for i in idx]
    elif case["optimizer"] == "SGD":
        if hyper.get("momentum", 0.0) != 0.0:
            out["m"] = [opt.momentums[i] for i in idx]
    elif case["optimizer"] == "RMSprop":
        # Both create velocities always, momentums only with momentum > 0, average_gradients
        # only when centered (an empty list otherwise).
        out["velocity"] = [opt._velocities[i] for i in idx]
        if opt._momentums:
            out["momentum"] = [opt._momentums[i] for i in idx]
        if opt._average_gradients:
            out["average_gradient"] = [opt._average_gradients[i] for i in idx]
    elif case["optimizer"] == "Adagrad":
        out["accumulator"] = [opt._accumulators[i] for i in idx]
    elif case["optimizer"] == "Lion":  # tf_keras `momentums`, Keras 3 `_momentums`
        moms = opt.momentums if conv == cases.TF else opt._momentums
        out["m"] = [moms[i] for i in idx]
    elif case["optimizer"] == "Adadelta":  # both: _accumulated_grads, _accumulated_delta_vars
        out["accumulated_grad"] = [opt._accumulated_grads[i] for i in idx]
        out["accumulated_delta"] = [opt._accumulated_delta_vars[i] for i in idx]
    elif case["optimizer"] == "Adamax":  # both name them _m and _u
        out["m"] = [opt._m[i] for i in idx]
        out["u"] = [opt._u[i] for i in idx]
    elif case["optimizer"] == "Ftrl":  # both keep _accumulators and _linears
        out["accumulator"] = [opt._accumulators[i] for i in idx]
        out["linear"] = [opt._linears[i] for i in idx]
    elif case["optimizer"] == "Nadam":  # both: _momentums, _velocities (+ shared _u_product)
        out["m"] = [opt._momentums[i] for i in idx]
        out["v"] = [opt._velocities[i] for i in idx]
    elif case["optimizer"] == "Lamb":  # Keras 3: _momentums, _velocities
        out["m"] = [opt._momentums[i] for i in idx]
        out["v"] = [opt._velocities[i] for i in idx]
    elif case["optimizer"] == "Adafactor":  # _r, _c (scalar placeholders below rank 2), _v
        out["velocity_row"] = [opt._r[i] if len(v.shape) >= 2 else None
                               for i, v in zip(idx, variables)]
        out["velocity_col"] = [opt._c[i] if len(v.shape) >= 2 else None
                               for i, v in zip(idx, variables)]
        out["velocity"] = [opt._v[i] for i in idx]
    else:
        raise ValueError(case["optimizer"])
    if hyper.get("use_ema", False):
        out["average"] = [opt._model_variables_moving_average[i] for i in idx]
    recorded = {}
    for name, slot_vars in out.items():
        row = []
        for s, v in zip(slot_vars, variables):
            if s is None:  # a placeholder the framework never updates: not recorded
                row.append(None)
                continue
            a = np.array(s.numpy())
            free = name in ("velocity_row", "velocity_col")  # Adafactor's factored shapes
            assert (free or a.shape == tuple(v.shape)) and a.dtype == np.dtype(case["dtype"]), (
                name, a.dtype)
            row.append(_to_bits(a))
        recorded[name] = row
    return recorded


def run_loss_scale_case(case, tf, tf_keras, keras):
    """A LossScaleOptimizer case: the inner optimizer's slots, plus the scale and counter per
    step (``state/loss_scale``, ``state/counter``). tf_keras: the user unscales
    (``get_unscaled_gradients``) before ``apply_gradients``; Keras 3 unscales in ``apply``."""
    conv, dtype = case["convention"], case["dtype"]
    hyper = case["hyperparameters"]
    inner_case = dict(case, optimizer=hyper["inner_optimizer"]["class_name"],
                      hyperparameters=hyper["inner_optimizer"]["config"])
    inner = _build_optimizer(inner_case, tf_keras, keras)
    init, grads = cases.make_inputs(case)
    if conv == cases.TF:
        variables = [tf.Variable(_from_bits(a), dtype=dtype, name=f"var{i}")
                     for i, a in enumerate(init)]
        versions = {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__}
        opt = tf_keras.mixed_precision.LossScaleOptimizer(
            inner, initial_scale=hyper["initial_scale"],
            dynamic_growth_steps=hyper["dynamic_growth_steps"])
    else:
        variables = [keras.Variable(_from_bits(a), dtype=dtype, name=f"var{i}")
                     for i, a in enumerate(init)]
        versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
        opt = keras.optimizers.LossScaleOptimizer(
            inner, initial_scale=hyper["initial_scale"],
            dynamic_growth_steps=hyper["dynamic_growth_steps"])
    versions["numpy"] = np.__version__
    params, slots, state = [], {}, {}
    for row in grads:
        tg = [_tf_grad(tf, g, dtype, a.shape) for g, a in zip(row, init)]
        if conv == cases.TF:
            tg = opt.get_unscaled_gradients(tg)
            opt.apply_gradients(list(zip(tg, variables)))
            scale, counter = opt.loss_scale, opt.dynamic_counter
        else:
            opt.apply_gradients(list(zip(tg, variables)))
            scale, counter = opt.dynamic_scale, opt.step_counter
        params.append([_to_bits(np.array(v.numpy())) for v in variables])
        for name, vals in _record_slots(inner_case, inner, variables).items():
            slots.setdefault(name, []).append(vals)
        state.setdefault("loss_scale", []).append(np.array(np.asarray(scale), np.float32))
        state.setdefault("counter", []).append(np.array(int(np.asarray(counter)), np.int64))
        state.setdefault("iterations", []).append(
            np.array(int(np.asarray(inner.iterations)), np.int64))
    store.save_case(case, framework="tensorflow", versions=versions, init=init, grads=grads,
                    params=params, slots=slots, state=state)
    return params[-1]


def run_case(case, tf, tf_keras, keras):
    if case["optimizer"] == "LossScaleOptimizer":
        return run_loss_scale_case(case, tf, tf_keras, keras)
    conv = case["convention"]
    dtype = case["dtype"]
    init, grads = cases.make_inputs(case)
    if conv == cases.TF:
        variables = [tf.Variable(_from_bits(a), dtype=dtype, name=f"var{i}")
                     for i, a in enumerate(init)]
        versions = {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__}
    else:
        variables = [keras.Variable(_from_bits(a), dtype=dtype, name=f"var{i}")
                     for i, a in enumerate(init)]
        versions = {"tensorflow": tf.__version__, "keras": keras.__version__}
    versions["numpy"] = np.__version__
    opt = _build_optimizer(case, tf_keras, keras)
    params, slots = [], {}
    state = {}  # optimizer state that is not a slot (Nadam's u_product)
    for row in grads:
        tg = [_tf_grad(tf, g, dtype, a.shape) for g, a in zip(row, init)]
        opt.apply_gradients(list(zip(tg, variables)))
        params.append([_to_bits(np.array(v.numpy())) for v in variables])
        for name, vals in _record_slots(case, opt, variables).items():
            slots.setdefault(name, []).append(vals)
        if case["optimizer"] == "Nadam":  # one scalar shared by every variable
            state.setdefault("u_product", []).append(np.array(opt._u_product.numpy()))
    store.save_case(case, framework="tensorflow", versions=versions, init=init, grads=grads,
                    params=params, slots=slots, **({"state": state} if state else {}))
    return params[-1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run only the case ids containing this")
    args = ap.parse_args(argv)
    todo = [c for c in cases.cases_for(CONVENTIONS) if args.only is None or args.only in c["id"]]
    if not todo:
        print("no case matches", file=sys.stderr)
        return 1
    tf, tf_keras, keras = _import_frameworks()
    for case in todo:
        last = run_case(case, tf, tf_keras, keras)
        print(f"{case['id']}: recorded {case['steps']} steps; var0[:3] = "
              f"{np.ravel(last[0])[:3].tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
