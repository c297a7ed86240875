"""Run under ``mpiexec -n R``: ShardedOptimizer trajectories against the single-process run.

For each case, every rank runs the single-process optimizer (a plain refopt optimizer on the
micro-batch gradients summed in micro-batch order) and the sharded one, and compares the
variables after every step and every slot (and EMA average) at the end, bit for bit. Rank 0
prints one JSON line: the cases and each rank's state bytes. Any mismatch raises (``python -m
mpi4py`` then aborts every rank, so mpiexec exits non-zero).
"""

import argparse
import json

import numpy as np

import refopt
from refopt.distributed import MPIComm, ShardedOptimizer

K = 12  # micro-batches per step: R = 1, 2, 3, 4 all divide it
SHAPES = [(7, 13), (300,), (5,), (1,), (2, 3, 4), (700,)]  # 700 > 2 * 128: a deep norm tree


def variables(dtypes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtypes[k % len(dtypes)])
            for k, s in enumerate(SHAPES)]


def micro_grads(like, step, k, scale):
    rng = np.random.default_rng([step, k, 7])
    return [(rng.standard_normal(v.shape) * scale).astype(v.dtype) for v in like]


def add_up(parts):
    total = None
    for g in parts:
        total = [x.copy() for x in g] if total is None else [t + x for t, x in zip(total, g)]
    return total


def summed(like, step, reduction, groups=1):
    """The step's gradient: the K micro-batch gradients added left to right; with ``groups``
    (fast mode's R), each group's own left-to-right sum first, then the groups in order."""
    per = K // groups
    total = add_up([add_up([micro_grads(like, step, k, SCALE)
                            for k in range(r * per, (r + 1) * per)]) for r in range(groups)])
    if reduction == "mean":
        total = [t / t.dtype.type(K) for t in total]
    return total


SCALE = 3.0  # large enough that a global clip norm of 1 clips every step

CASES = [
    ("Adam", {"global_clipnorm": 1.0, "use_ema": True, "ema_overwrite_frequency": 3,
                  "weight_decay": 0.01, "amsgrad": True}, "tf_keras", ["float32"], "sum"),
    ("AdamW", {"use_ema": True, "weight_decay": 0.1}, "torch", ["float32", "float64"], "mean"),
    ("SGD", {"momentum": 0.9, "nesterov": True, "clipnorm": 0.5, "use_ema": True}, "keras3",
     ["float32"], "sum"),
    ("RMSprop", {"centered": True, "momentum": 0.5, "global_clipnorm": 2.0}, "optax", ["float64"],
     "sum"),
    ("Lion", {"clipvalue": 0.3, "use_ema": True}, "keras3", ["float32"], "sum"),
    ("Adagrad", {"clipnorm": 1.0}, "tf1", ["float32"], "sum"),
    ("RAdam", {"weight_decay": 0.01}, "torch", ["float32"], "sum"),
    ("Nadam", {"global_clipnorm": 1.0}, "keras3", ["float32"], "sum"),
    ("Adadelta", {"learning_rate": 1.0}, "tf_keras", ["float32"], "sum"),
    ("Adamax", {"clipnorm": 1.0}, "keras2", ["float32"], "sum"),
    ("Ftrl", {"l1_regularization_strength": 0.01}, "keras2", ["float32"], "sum"),
    ("Rprop", {}, "torch", ["float32"], "sum"),
    ("ASGD", {}, "torch", ["float64"], "mean"),
    # PyTorch's norm clipping: lanes across a whole tensor, so the "tensor" layout
    ("AdamW", {"clipnorm": 0.5}, "torch", ["float32"], "sum"),
    ("SGD", {"momentum": 0.9, "global_clipnorm": 1.0}, "torch", ["float32", "float64"],
     "sum"),
    # per-tensor updates: the "tensor" layout
    ("Lamb", {"global_clipnorm": 1.0, "use_ema": True, "weight_decay": 0.01}, "keras3",
     ["float32"], "sum"),
    ("Lamb", {"weight_decay": 0.01, "global_clipnorm": 1.0}, "optax", ["float32", "float64"],
     "mean"),
    ("Adafactor", {"clipnorm": 1.0, "weight_decay": 0.01}, "tf_keras", ["float32"], "sum"),
    ("Adafactor", {"use_ema": True}, "keras3", ["float64"], "sum"),
    ("Adafactor", {"global_clipnorm": 1.0, "weight_decay": 0.01}, "torch", ["float32"],
     "sum"),
    ("Adafactor", {"min_dim_size_to_factor": 4, "learning_rate": None}, "optax",
     ["float32"], "sum"),
    ("RowWiseAdagrad", {"weight_decay": 0.1, "weight_decay_mode": "decoupled",
                        "global_clipnorm": 1.0}, "fbgemm", ["float32"], "sum"),
    # the sparse family's dense steps: elementwise (TF1's proximal ops)
    ("ProximalAdagrad", {"l1_regularization_strength": 0.01,
                         "l2_regularization_strength": 0.1, "clipnorm": 1.0}, "tf1",
     ["float32", "float64"], "sum"),
    ("ProximalGradientDescent", {"l1_regularization_strength": 0.05}, "tf1", ["float32"],
     "mean"),
]


def run_case(comm, name, kwargs, convention, dtypes, reduction, backend, steps, mode):
    kwargs = dict(kwargs)
    kwargs.setdefault("learning_rate", 0.01)
    if kwargs["learning_rate"] is None:  # optax's Adafactor: no learning-rate scaling
        del kwargs["learning_rate"]
    cls = getattr(refopt, name)
    single_vars = variables(dtypes)
    dist_vars = variables(dtypes)
    single = cls(**kwargs, convention=convention, backend=backend)
    dist = ShardedOptimizer(cls(**kwargs, convention=convention, backend=backend), dist_vars,
                            micro_batches=K, comm=comm, mode=mode, reduction=reduction)
    for step in range(steps):
        groups = comm.size if mode == "fast" else 1
        single.apply_gradients(zip(summed(single_vars, step, reduction, groups), single_vars))
        dist.apply_gradients([micro_grads(dist_vars, step, k, SCALE)
                              for k in dist.micro_batch_ids])
        for i, (a, b) in enumerate(zip(single_vars, dist_vars)):
            if a.tobytes() != b.tobytes():
                raise AssertionError(f"{name}/{convention}: variable {i} differs at step {step}")
    for slot in dist.slot_names:
        for i, (v, full) in enumerate(zip(single_vars, dist.gather_slot(slot))):
            if single.get_slot(v, slot).tobytes() != full.tobytes():
                raise AssertionError(f"{name}/{convention}: slot {slot} of variable {i} differs")
    if dist.iterations != single.iterations:
        raise AssertionError("iterations differ")
    single_bytes = sum(single.get_slot(v, s).nbytes for v in single_vars
                       for s in single.slot_names)
    return dist.state_nbytes(), single_bytes, dist.layout


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--cases", default="all", help="comma-separated optimizer names")
    parser.add_argument("--mode", default="exact",
                        help="fast: compare with the gradients pre-summed per rank")
    args = parser.parse_args()
    comm = MPIComm()
    report = []
    for case in CASES:
        if args.cases != "all" and case[0] not in args.cases.split(","):
            continue
        mine, single, layout = run_case(comm, *case, args.backend, args.steps, args.mode)
        report.append({"case": f"{case[0]}/{case[2]}", "state_bytes": comm.allgather_obj(mine),
                       "single_bytes": single, "layout": layout})
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "cases": report}), flush=True)


if __name__ == "__main__":
    main()
