"""Golden data of Keras 3's mixed-precision policies (what the optimizer sees and does).

Run from the repository root with the environment of ``requirements-tf.txt``::

    python conformance/generators/gen_mixed_precision.py

Under ``mixed_float16`` and ``mixed_bfloat16`` a ``keras.layers.Dense(3)`` keeps float32
variables (kernel 4x3, bias 3) and computes in float16/bfloat16; the loss
``sum(float32(y)**2) * 0.5`` is differentiated by ``tf.GradientTape`` and the gradients
(float32: the gradient of the autocast) go to ``keras.optimizers.Adam(0.01)`` (no loss
scaling: the optimizer is not wrapped). Recorded per policy and step ``k`` (1-based), for
variable ``i``: ``{policy}/grad/{k}/{i}`` (float32), ``{policy}/param/{k}/{i}`` (the float32
variable after the step), ``{policy}/cast/{k}/{i}`` (the variable as the layer reads it under
autocast: ``keras.ops.cast`` to the compute dtype; bfloat16 stored as its uint16 bits), and
``{policy}/init/{i}``, ``{policy}/slot/{m,v}/{k}/{i}``, ``{policy}/dtypes`` (the dtypes seen:
variable, gradient, slots, layer output). Writes ``conformance/precision/keras3_mixed.npz``.
``tests/test_low_precision.py`` replays it with ``refopt.MasterWeights``.
"""

from __future__ import annotations

import os
import sys

import numpy as np

# Before TensorFlow is imported (in main): CPU only, no oneDNN re-association, Keras 3 on TF.
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "precision",
                   "keras3_mixed.npz")
STEPS = 8


def _bits(t):
    a = np.asarray(t)
    return a.view(np.uint16) if a.dtype.itemsize == 2 and a.dtype.kind == "V" else a


def record(policy, keras, tf):
    rng = np.random.default_rng(11)
    init = [rng.standard_normal((4, 3)).astype(np.float32),
            rng.standard_normal(3).astype(np.float32)]
    x = tf.constant(rng.standard_normal((6, 4)) * 3, tf.float32)
    keras.mixed_precision.set_global_policy(policy)
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    for v, a in zip(layer.trainable_variables, init):
        v.assign(a)
    opt = keras.optimizers.Adam(learning_rate=0.01)
    out = {f"{policy}/init/{i}": a for i, a in enumerate(init)}
    compute = layer.compute_dtype
    for k in range(1, STEPS + 1):
        with tf.GradientTape() as tape:
            y = layer(x)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2) * 0.5
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        for i, (g, v) in enumerate(zip(grads, layer.trainable_variables)):
            out[f"{policy}/grad/{k}/{i}"] = g.numpy()
            out[f"{policy}/param/{k}/{i}"] = v.numpy()
            out[f"{policy}/cast/{k}/{i}"] = _bits(keras.ops.cast(v.value, compute).numpy())
            out[f"{policy}/slot/m/{k}/{i}"] = opt._momentums[i].numpy()
            out[f"{policy}/slot/v/{k}/{i}"] = opt._velocities[i].numpy()
    out[f"{policy}/dtypes"] = np.array([
        str(layer.trainable_variables[0].dtype), str(grads[0].dtype.name),
        str(opt._momentums[0].dtype), str(y.dtype.name)])
    keras.mixed_precision.set_global_policy("float32")
    return out


def main():
    import keras
    import tensorflow as tf

    assert keras.backend.backend() == "tensorflow"
    arrays = {}
    for policy in ("mixed_float16", "mixed_bfloat16"):
        arrays.update(record(policy, keras, tf))
        print(policy, arrays[f"{policy}/dtypes"].tolist())
    arrays["versions"] = np.array([f"keras {keras.__version__}", f"tensorflow {tf.__version__}"])
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    np.savez_compressed(OUT, **arrays)
    print("wrote", os.path.relpath(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
