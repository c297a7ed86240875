"""Golden data for conventions ``keras2`` (Keras 2 legacy ``OptimizerV2`` + TF-Addons) and ``tf1``.

Run from the repository root with the environment of ``requirements-tf-legacy.txt``::

    python conformance/generators/gen_tf_legacy.py [--only SUBSTRING]

``keras2`` cases run eagerly (``tf.keras.optimizers.legacy.*``, ``tfa.optimizers.LazyAdam``).
``tf1`` cases run in graph mode (``tf.compat.v1.disable_eager_execution()`` + a ``Session``); since
eager execution cannot be switched off once a process has run eager ops, they run in a child
process of this script (``--graph-mode``). CPU only, oneDNN off.

TF1 contrib's ``LazyAdamOptimizer`` no longer exists: case ``tf1/lazyadam_f32`` uses
:class:`EmulatedLazyAdamOptimizer`, a subclass of ``tf.compat.v1.train.AdamOptimizer`` whose sparse
apply is rewritten with TF ops after the contrib semantics (recorded with ``emulated=True``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import cases  # noqa: E402
import store  # noqa: E402

CONVENTIONS = (cases.K2, cases.TF1)


def _selected(conventions, only):
    return [c for c in cases.cases_for(conventions) if only is None or only in c["id"]]


# --------------------------------------------------------------------------------------- keras2

def _keras2_optimizer(case, tf, tfa):
    hyper = dict(case["hyperparameters"])
    lr = hyper.get("learning_rate")
    if isinstance(lr, dict):
        hyper["learning_rate"] = tf.keras.optimizers.schedules.deserialize(lr)
    cls = {"Adam": tf.keras.optimizers.legacy.Adam, "SGD": tf.keras.optimizers.legacy.SGD,
           "RMSprop": tf.keras.optimizers.legacy.RMSprop,
           "Adagrad": tf.keras.optimizers.legacy.Adagrad,
           "Adadelta": tf.keras.optimizers.legacy.Adadelta,
           "Adamax": tf.keras.optimizers.legacy.Adamax,
           "Nadam": tf.keras.optimizers.legacy.Nadam,
           "Ftrl": tf.keras.optimizers.legacy.Ftrl,
           "LazyAdam": tfa.optimizers.LazyAdam,
           "AdamW": tfa.optimizers.AdamW, "SGDW": tfa.optimizers.SGDW}[case["optimizer"]]
    return cls(**hyper)  # epsilon=0.0 goes in as is (legacy Adam turns it into 1e-7)


def _keras2_slot_names(case):
    """(framework slot name, refopt slot name) pairs."""
    hyper = case["hyperparameters"]
    if case["optimizer"] in ("Adam", "LazyAdam", "AdamW"):
        names = [("m", "m"), ("v", "v")]
        if hyper.get("amsgrad", False):
            names.append(("vhat", "vhat"))
        return names
    if case["optimizer"] in ("SGD", "SGDW"):
        return [("momentum", "m")] if hyper.get("momentum", 0.0) != 0.0 else []
    if case["optimizer"] == "RMSprop":
        # legacy RMSprop: "rms" always, "momentum" only with momentum > 0, "mg" if centered
        names = [("rms", "velocity")]
        if hyper.get("momentum", 0.0) != 0.0:
            names.append(("momentum", "momentum"))
        if hyper.get("centered", False):
            names.append(("mg", "average_gradient"))
        return names
    if case["optimizer"] == "Adagrad":
        return [("accumulator", "accumulator")]
    if case["optimizer"] == "Adadelta":  # legacy slots "accum_grad" and "accum_var"
        return [("accum_grad", "accumulated_grad"), ("accum_var", "accumulated_delta")]
    if case["optimizer"] == "Nadam":  # legacy slots "m", "v" (+ the weight momentum_cache)
        return [("m", "m"), ("v", "v")]
    if case["optimizer"] == "Adamax":  # legacy slots "m" and "v" (v is the infinity norm u)
        return [("m", "m"), ("v", "u")]
    if case["optimizer"] == "Ftrl":
        return [("accumulator", "accumulator"), ("linear", "linear")]
    raise ValueError(case["optimizer"])


def _tf_grad(tf, g, dtype, shape):
    if g is None:
        return None
    if isinstance(g, tuple):
        _, idx, values = g
        return tf.IndexedSlices(tf.constant(values, dtype=dtype), tf.constant(idx, dtype=tf.int64),
                                tf.constant(shape, dtype=tf.int64))
    return tf.constant(g, dtype=dtype)


def _inner_case(case):
    """A LossScaleOptimizer (or TF-Addons MovingAverage/SWA) case as the case of its inner
    optimizer; other cases as they are."""
    if case["optimizer"] in _TFA_AVERAGING:
        inner = case["hyperparameters"]["optimizer"]
        return dict(case, optimizer=inner["class_name"], hyperparameters=inner["config"])
    if case["optimizer"] != "LossScaleOptimizer":
        return case
    inner = case["hyperparameters"]["inner_optimizer"]
    return dict(case, optimizer=inner["class_name"], hyperparameters=inner["config"])


_TFA_AVERAGING = ("MovingAverage", "SWA")  # tfa.optimizers wrappers: slot "average"


def _tfa_averaging(case, opt, tfa):
    """The TF-Addons averaging wrapper of a MovingAverage/SWA case around ``opt`` (else None)."""
    if case["optimizer"] not in _TFA_AVERAGING:
        return None
    hyper = {k: v for k, v in case["hyperparameters"].items() if k != "optimizer"}
    return getattr(tfa.optimizers, case["optimizer"])(opt, **hyper)


def run_keras2(case):
    import keras
    import tensorflow as tf
    import tensorflow_addons as tfa

    dtype = case["dtype"]
    init, grads = cases.make_inputs(case)
    variables = [tf.Variable(a, dtype=dtype, name=f"var{i}") for i, a in enumerate(init)]
    opt = _keras2_optimizer(_inner_case(case), tf, tfa)
    names = _keras2_slot_names(_inner_case(case))
    lso = None  # tf.keras.mixed_precision.LossScaleOptimizer: the user unscales, it skips
    if case["optimizer"] == "LossScaleOptimizer":
        hyper = case["hyperparameters"]
        lso = tf.keras.mixed_precision.LossScaleOptimizer(
            opt, initial_scale=hyper["initial_scale"],
            dynamic_growth_steps=hyper["dynamic_growth_steps"])
    averaging = _tfa_averaging(case, opt, tfa)
    params, slots = [], {ref: [] for _, ref in names}
    state = {}  # optimizer state that is not a slot (Nadam's momentum_cache)
    for row in grads:
        tg = [_tf_grad(tf, g, dtype, a.shape) for g, a in zip(row, init)]
        if lso is not None:
            lso.apply_gradients(list(zip(lso.get_unscaled_gradients(tg), variables)))
            state.setdefault("loss_scale", []).append(np.array(lso.loss_scale.numpy()))
            state.setdefault("counter", []).append(np.array(lso.dynamic_counter.numpy()))
            state.setdefault("iterations", []).append(np.array(opt.iterations.numpy()))
        elif averaging is not None:  # the wrapper steps the inner optimizer, then averages
            averaging.apply_gradients(list(zip(tg, variables)))
        else:
            opt.apply_gradients(list(zip(tg, variables)))
        params.append([np.array(v.numpy()) for v in variables])
        for fw, ref in names:
            slots[ref].append([np.array(opt.get_slot(v, fw).numpy()) for v in variables])
        if averaging is not None:
            slots.setdefault("average", []).append(
                [np.array(averaging.get_slot(v, "average").numpy()) for v in variables])
        if case["optimizer"] == "Nadam":  # the shared weight "momentum_cache"
            state.setdefault("u_product", []).append(np.array(opt._m_cache.numpy()))
    versions = {"tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__}
    if case["optimizer"] in ("LazyAdam", "AdamW", "SGDW") + _TFA_AVERAGING:
        versions["tensorflow_addons"] = tfa.__version__
    store.save_case(case, framework="tensorflow", versions=versions, init=init, grads=grads,
                    params=params, slots=slots, **({"state": state} if state else {}))
    return params[-1]


# ------------------------------------------------------------------------------------------ tf1

def _emulated_lazy_adam_class(tf):
    """TF1 contrib ``LazyAdamOptimizer`` semantics on top of TF 2.x's ``AdamOptimizer``.

    Only the sparse apply changes; the base class still sums duplicate indices first and advances
    the shared ``beta1_power`` / ``beta2_power`` accumulators in ``_finish``. Dense gradients keep
    the fused ``ApplyAdam`` kernel of the parent.
    """

    class EmulatedLazyAdamOptimizer(tf.compat.v1.train.AdamOptimizer):

        def _lazy_rows(self, values, var, indices):
            dt = var.dtype.base_dtype
            beta1_power, beta2_power = self._get_beta_accumulators()
            beta1_power = tf.cast(beta1_power, dt)
            beta2_power = tf.cast(beta2_power, dt)
            lr = tf.cast(self._lr_t, dt)
            beta1 = tf.cast(self._beta1_t, dt)
            beta2 = tf.cast(self._beta2_t, dt)
            eps = tf.cast(self._epsilon_t, dt)
            lr_c = lr * tf.sqrt(1 - beta2_power) / (1 - beta1_power)
            m = self.get_slot(var, "m")
            v = self.get_slot(var, "v")
            m_rows = beta1 * tf.gather(m, indices) + (1 - beta1) * values
            v_rows = beta2 * tf.gather(v, indices) + (1 - beta2) * tf.square(values)
            m_update = tf.compat.v1.scatter_update(m, indices, m_rows, use_locking=self._use_locking)
            v_update = tf.compat.v1.scatter_update(v, indices, v_rows, use_locking=self._use_locking)
            with tf.control_dependencies([m_update, v_update]):
                var_update = tf.compat.v1.scatter_sub(
                    var, indices, lr_c * m_rows / (tf.sqrt(v_rows) + eps),
                    use_locking=self._use_locking)
            return tf.group(var_update, m_update, v_update)

        def _apply_sparse(self, grad, var):  # reference variables; grad already de-duplicated
            return self._lazy_rows(grad.values, var, grad.indices)

        def _resource_apply_sparse(self, grad, var, indices):  # resource variables
            return self._lazy_rows(grad, var, indices)

    return EmulatedLazyAdamOptimizer


def _tf1_optimizer(case, tf):
    hyper = dict(case["hyperparameters"])
    known = {"learning_rate", "beta_1", "beta_2", "epsilon", "momentum", "nesterov",
             "global_clipnorm", "rho", "centered", "initial_accumulator_value"}
    known |= {"learning_rate_power", "l1_regularization_strength", "l2_regularization_strength",
              "l2_shrinkage_regularization_strength", "beta"}  # Ftrl (same names in TF1)
    unknown = set(hyper) - known
    if unknown:
        raise ValueError(f"{case['id']}: no TF1 equivalent for {sorted(unknown)}")
    if isinstance(hyper.get("learning_rate"), dict):
        raise ValueError(f"{case['id']}: schedules are not recorded for tf1")
    if case["optimizer"] in ("Adam", "LazyAdam"):
        kw = {"learning_rate": hyper["learning_rate"]}
        for ours, theirs in (("beta_1", "beta1"), ("beta_2", "beta2"), ("epsilon", "epsilon")):
            if ours in hyper:
                kw[theirs] = hyper[ours]
        cls = (tf.compat.v1.train.AdamOptimizer if case["optimizer"] == "Adam"
               else _emulated_lazy_adam_class(tf))
        return cls(**kw), [("m", "m"), ("v", "v")]
    if case["optimizer"] == "RMSprop":
        kw = {"learning_rate": hyper["learning_rate"]}
        for ours, theirs in (("rho", "decay"), ("momentum", "momentum"), ("epsilon", "epsilon"),
                             ("centered", "centered")):
            if ours in hyper:
                kw[theirs] = hyper[ours]
        # TF1 always creates "rms" (initialised to ones) and "momentum"; "mg" when centered.
        names = [("rms", "velocity"), ("momentum", "momentum")]
        if hyper.get("centered", False):
            names.append(("mg", "average_gradient"))
        return tf.compat.v1.train.RMSPropOptimizer(**kw), names
    if case["optimizer"] == "Adadelta":  # slots "accum" (E[g^2]) and "accum_update" (E[dx^2])
        kw = {"learning_rate": hyper["learning_rate"]}
        for key in ("rho", "epsilon"):
            if key in hyper:
                kw[key] = hyper[key]
        return (tf.compat.v1.train.AdadeltaOptimizer(**kw),
                [("accum", "accumulated_grad"), ("accum_update", "accumulated_delta")])
    if case["optimizer"] == "Adagrad":
        kw = {"learning_rate": hyper["learning_rate"]}
        if "initial_accumulator_value" in hyper:
            kw["initial_accumulator_value"] = hyper["initial_accumulator_value"]
        if "epsilon" in hyper:
            raise ValueError(f"{case['id']}: TF1's AdagradOptimizer has no epsilon")
        return tf.compat.v1.train.AdagradOptimizer(**kw), [("accumulator", "accumulator")]
    if case["optimizer"] in ("ProximalAdagrad", "ProximalGradientDescent"):
        # TF1's dense proximal optimizers do not cast their hyperparameters to the variable's
        # dtype: for float64, float64 NumPy scalars of the float32-rounded values (the values
        # the resource sparse path's tf.cast gives, and refopt's)
        kw = dict(hyper)
        if case["dtype"] == "float64":
            kw.setdefault("l1_regularization_strength", 0.0)
            kw.setdefault("l2_regularization_strength", 0.0)
            kw = {k: (np.float64(np.float32(v)) if k != "initial_accumulator_value" else v)
                  for k, v in kw.items()}
        if case["optimizer"] == "ProximalAdagrad":
            return (tf.compat.v1.train.ProximalAdagradOptimizer(**kw),
                    [("accumulator", "accumulator")])
        return tf.compat.v1.train.ProximalGradientDescentOptimizer(**kw), []
    if case["optimizer"] == "Ftrl":  # FtrlOptimizer's slots are "accum" and "linear"
        return (tf.compat.v1.train.FtrlOptimizer(**hyper),
                [("accum", "accumulator"), ("linear", "linear")])
    if case["optimizer"] == "SGD":
        momentum = hyper.get("momentum", 0.0)
        if momentum == 0.0:
            if hyper.get("nesterov", False):
                raise ValueError(f"{case['id']}: nesterov without momentum")
            return tf.compat.v1.train.GradientDescentOptimizer(hyper["learning_rate"]), []
        opt = tf.compat.v1.train.MomentumOptimizer(
            hyper["learning_rate"], momentum, use_nesterov=hyper.get("nesterov", False))
        return opt, [("momentum", "m")]
    raise ValueError(case["optimizer"])


def run_tf1(case, use_resource=False):
    """One case in graph mode; ``use_resource=False`` gives TF 1.x's default reference variables."""
    import tensorflow as tf

    dtype = tf.as_dtype(case["dtype"])
    init, grads = cases.make_inputs(case)
    clip = case["hyperparameters"].get("global_clipnorm")
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.Variable(a, dtype=dtype, name=f"var{i}",
                                           use_resource=use_resource)
                     for i, a in enumerate(init)]
        opt, names = _tf1_optimizer(_inner_case(case), tf)
        lso = None  # MixedPrecisionLossScaleOptimizer: gradients unscaled as its
        if case["optimizer"] == "LossScaleOptimizer":  # compute_gradients does
            hyper = case["hyperparameters"]
            lso = tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                opt, tf.compat.v1.mixed_precision.DynamicLossScale(
                    initial_loss_scale=hyper["initial_scale"],
                    increment_period=hyper["dynamic_growth_steps"]))
        # One placeholder per (variable, gradient kind); one train op per pattern of None grads.
        feeds = []
        for i, a in enumerate(init):
            if any(isinstance(row[i], tuple) for row in grads):
                values = tf.compat.v1.placeholder(dtype, (None,) + a.shape[1:], name=f"values{i}")
                indices = tf.compat.v1.placeholder(tf.int64, (None,), name=f"indices{i}")
                feeds.append(("sparse", values, indices,
                              tf.IndexedSlices(values, indices,
                                               tf.constant(a.shape, dtype=tf.int64))))
            else:
                ph = tf.compat.v1.placeholder(dtype, a.shape, name=f"grad{i}")
                feeds.append(("dense", ph, None, ph))
        train_ops = {}
        for row in grads:
            pattern = tuple(g is not None for g in row)
            if pattern in train_ops:
                continue
            gs = [f[3] if present else None for f, present in zip(feeds, pattern)]
            if clip is not None:
                gs, _ = tf.clip_by_global_norm(gs, clip)
            if lso is not None:
                train_ops[pattern] = lso.apply_gradients(
                    list(zip(lso._unscale_grads(gs), variables)))
            else:
                train_ops[pattern] = opt.apply_gradients(list(zip(gs, variables)))
        scale_vars = ([] if lso is None else
                      [lso._loss_scale._current_loss_scale, lso._loss_scale._num_good_steps])
        slot_vars = {ref: [opt.get_slot(v, fw) for v in variables] for fw, ref in names}
        init_op = tf.compat.v1.global_variables_initializer()
    graph.finalize()
    params, slots, state = [], {ref: [] for ref in slot_vars}, {}
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init_op)
        for row in grads:
            feed = {}
            for f, g in zip(feeds, row):
                if g is None:
                    continue
                if f[0] == "sparse":
                    feed[f[1]] = g[2]
                    feed[f[2]] = g[1]
                else:
                    feed[f[1]] = g
            sess.run(train_ops[tuple(g is not None for g in row)], feed_dict=feed)
            params.append([np.array(x) for x in sess.run(variables)])
            for ref, svs in slot_vars.items():
                slots[ref].append([np.array(x) for x in sess.run(svs)])
            if scale_vars:
                scale, good = sess.run(scale_vars)
                state.setdefault("loss_scale", []).append(np.array(scale))
                state.setdefault("counter", []).append(np.array(good))
    versions = {"tensorflow": tf.__version__, "numpy": np.__version__}
    store.save_case(case, framework="tensorflow", versions=versions, init=init, grads=grads,
                    params=params, slots=slots, emulated=case["optimizer"] == "LazyAdam",
                    **({"state": state} if state else {}))
    return params[-1]


# ----------------------------------------------------------------------------------------- main

def _report(case, last):
    print(f"{case['id']}: recorded {case['steps']} steps; var0[:3] = "
          f"{np.ravel(last[0])[:3].tolist()}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run only the case ids containing this")
    ap.add_argument("--graph-mode", action="store_true",
                    help="(internal) run the tf1 cases in this process, in graph mode")
    args = ap.parse_args(argv)
    if args.graph_mode:
        import tensorflow as tf

        tf.compat.v1.disable_eager_execution()
        for case in _selected((cases.TF1,), args.only):
            # the loss-scale wrapper's update ops take resource variables only
            _report(case, run_tf1(case, use_resource=case["optimizer"] == "LossScaleOptimizer"))
        return 0
    todo = _selected(CONVENTIONS, args.only)
    if not todo:
        print("no case matches", file=sys.stderr)
        return 1
    for case in todo:
        if case["convention"] == cases.K2:
            _report(case, run_keras2(case))
    if any(c["convention"] == cases.TF1 for c in todo):
        cmd = [sys.executable, os.path.abspath(__file__), "--graph-mode"]
        if args.only is not None:
            cmd += ["--only", args.only]
        return subprocess.run(cmd, check=False).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
