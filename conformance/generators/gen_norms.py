"""Record the frameworks' own norms of large gradients (golden data for refopt's reductions).

Run from the repository root, once per framework, each in its own environment::

    python conformance/generators/gen_norms.py --framework torch   # requirements-torch.txt
    python conformance/generators/gen_norms.py --framework tf      # requirements-tf.txt
    python conformance/generators/gen_norms.py --framework optax   # requirements-optax.txt

Writes ``conformance/norms/<framework>.json``. The inputs are not stored: each is
``np.random.default_rng(seed).standard_normal(n) * scale`` cast to its dtype, and its
SHA-256 is recorded so that a reader regenerating it can tell that its NumPy produced the
same array. Every value is stored as the hex of its bits (``"0x3f800000"``). Nothing here
imports refopt: the values are the frameworks', never refopt's.

- **torch** (``torch.linalg.vector_norm(g, 2.0)``, what ``clip_grad_norm_`` takes per
  gradient; and ``torch.nn.utils.clip_grad_norm_`` itself on lists of gradients: the total
  norm and the SHA-256 of each clipped gradient). Every value is computed with
  ``torch.set_num_threads(1)`` and with 2 threads (this machine's default) and must agree;
  the CPU capability PyTorch dispatches to is recorded (the lane count of its kernels
  depends on it).
- **tf** (TensorFlow 2.21, CPU, oneDNN off): ``tf.reduce_sum(g * g)`` (``clip_by_norm``'s
  sum), ``tf.nn.l2_loss(g)`` and ``tf.linalg.global_norm([g])``.
- **optax** (optax on jax, CPU): ``jnp.sum(g * g)`` eagerly and under ``jax.jit``, and
  ``optax.global_norm([g])`` under ``jax.jit``; float64 with ``jax_enable_x64`` (the
  generator starts itself again with ``--x64`` for those).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "norms")

#: (dtype, n, seed, scale): sizes around 1e3..1e6, none a multiple of 8 except 1000 and
#: 65536 (the lane counts), several that are neither multiples of 8 nor of 128.
NORM_INPUTS = [(dt, n, seed, scale)
               for dt in ("float32", "float64")
               for seed, (n, scale) in enumerate([(1000, 3.0), (1001, 0.5), (4097, 1.0),
                                                 (12345, 7.0), (65536, 0.01), (100003, 2.0),
                                                 (262147, 1.0), (1000003, 0.1)])]

#: clip_grad_norm_ cases: (dtypes per gradient, sizes, first seed, scale, max_norm).
CLIP_CASES = [
    (["float32"] * 4, [1000, 4097, 1, 100003], 100, 1.0, 1.0),
    (["float32"] * 3, [3, 4099, 65537], 200, 0.01, 1e-3),
    (["float64"] * 3, [1000, 7, 100003], 300, 1.0, 1.0),
    (["float32", "float64", "float32", "float64"], [513, 1000, 4097, 9], 400, 1.0, 0.5),
]


def make_input(dtype, n, seed, scale):
    """The input array of one record (the readers regenerate it the same way)."""
    return (np.random.default_rng(seed).standard_normal(n) * scale).astype(dtype)


def sha256(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def bits(x, dtype):
    x = np.asarray(x, dtype).reshape(())
    return hex(int(x.view(np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint64)))


def record_torch():
    import torch

    def both_thread_counts(fn):
        values = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            values.append(fn())
        if values[0] != values[1]:
            raise RuntimeError(f"the result depends on the thread count: {values}")
        return values[0]

    norms = []
    for dt, n, seed, scale in NORM_INPUTS:
        x = make_input(dt, n, seed, scale)
        value = both_thread_counts(
            lambda: bits(torch.linalg.vector_norm(torch.from_numpy(x), 2.0).numpy(), dt))
        norms.append(dict(dtype=dt, n=n, seed=seed, scale=scale, sha256=sha256(x),
                          vector_norm=value))
    clips = []
    for dts, sizes, seed, scale, max_norm in CLIP_CASES:
        grads = [make_input(dt, n, seed + k, scale) for k, (dt, n) in enumerate(zip(dts, sizes))]

        def clip():
            params = [torch.nn.Parameter(torch.zeros(g.shape, dtype=getattr(torch, dt)))
                      for g, dt in zip(grads, dts)]
            for p, g in zip(params, grads):
                p.grad = torch.from_numpy(g.copy())
            total = torch.nn.utils.clip_grad_norm_(params, max_norm)
            return (bits(total.numpy(), str(total.dtype).replace("torch.", "")),
                    tuple(sha256(p.grad.numpy()) for p in params))

        total, hashes = both_thread_counts(clip)
        clips.append(dict(dtypes=dts, sizes=sizes, seeds=[seed + k for k in range(len(sizes))],
                          scale=scale, max_norm=max_norm, inputs_sha256=[sha256(g) for g in grads],
                          total_norm=total, clipped_sha256=list(hashes)))
    torch.set_num_threads(2)
    return dict(versions=dict(torch=torch.__version__),
                cpu_capability=torch.backends.cpu.get_cpu_capability(),
                threads_checked=[1, 2], norms=norms, clip_grad_norm_=clips)


def record_tf():
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"
    import tensorflow as tf

    norms = []
    for dt, n, seed, scale in NORM_INPUTS:
        x = make_input(dt, n, seed, scale)
        t = tf.constant(x)
        norms.append(dict(dtype=dt, n=n, seed=seed, scale=scale, sha256=sha256(x),
                          reduce_sum_squares=bits(tf.reduce_sum(t * t).numpy(), dt),
                          l2_loss=bits(tf.nn.l2_loss(t).numpy(), dt),
                          global_norm=bits(tf.linalg.global_norm([t]).numpy(), dt)))
    return dict(versions=dict(tensorflow=tf.__version__), norms=norms)


def record_optax(x64):
    import jax

    jax.config.update("jax_enable_x64", x64)
    import jax.numpy as jnp
    import optax

    sumsq = jax.jit(lambda v: jnp.sum(v * v))
    gnorm = jax.jit(lambda v: optax.global_norm([v]))
    norms = []
    for dt, n, seed, scale in NORM_INPUTS:
        if (dt == "float64") != x64:
            continue
        x = make_input(dt, n, seed, scale)
        v = jnp.asarray(x)
        norms.append(dict(dtype=dt, n=n, seed=seed, scale=scale, sha256=sha256(x),
                          sum_squares_eager=bits(np.asarray(jnp.sum(v * v)), dt),
                          sum_squares_jit=bits(np.asarray(sumsq(v)), dt),
                          global_norm_jit=bits(np.asarray(gnorm(v)), dt)))
    return dict(versions=dict(jax=jax.__version__, optax=optax.__version__), norms=norms)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", required=True, choices=("torch", "tf", "optax"))
    ap.add_argument("--x64", action="store_true", help=argparse.SUPPRESS)  # internal
    args = ap.parse_args(argv)
    if args.framework == "optax" and args.x64:  # the float64 half, for the parent process
        print(json.dumps(record_optax(True)))
        return 0
    if args.framework == "torch":
        record = record_torch()
    elif args.framework == "tf":
        record = record_tf()
    else:
        record = record_optax(False)
        child = subprocess.run([sys.executable, os.path.abspath(__file__), "--framework",
                                "optax", "--x64"], check=True, capture_output=True, text=True)
        record["norms"] += json.loads(child.stdout)["norms"]
    record = dict(framework=args.framework, generator="conformance/generators/gen_norms.py",
                  python=platform.python_version(), numpy=np.__version__,
                  machine=platform.machine(),
                  inputs="np.random.default_rng(seed).standard_normal(n) * scale, "
                         "then .astype(dtype)", **record)
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{args.framework}.json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(path)}: {len(record['norms'])} norms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
