"""Run under ``mpiexec -n R``: ShardedEmbedding against the single-process sparse step.

Every rank runs a plain refopt optimizer on the concatenation of the K micro-batch
IndexedSlices (micro-batch order) and the row-sharded table, and compares the whole table
after every step, every slot at the end, and lookups, bit for bit. Rank 0 prints a JSON line.
"""

import argparse
import json

import numpy as np

import refopt
from refopt.distributed import MPIComm, ShardedEmbedding

K = 12
V, D = 53, 5  # 53 rows: no R in 1..4 divides it


def micro_grad(step, k, dtype):
    rng = np.random.default_rng([step, k, 11])
    n = int(rng.integers(0, 9))  # some micro-batches are empty
    idx = rng.integers(0, V // 2, n)  # low rows repeat often; high rows never move
    return refopt.IndexedSlices((rng.standard_normal((n, D)) * 2).astype(dtype), idx, (V, D))


# (class, kwargs, convention, dtype[, table excluded from weight decay]): every lazy
# optimizer ShardedEmbedding supports
CASES = [
    ("LazyAdam", {"learning_rate": 0.05, "clipvalue": 1.0, "use_ema": True, "weight_decay": 0.01},
     "tf_keras", "float32"),
    ("LazyAdam", {"learning_rate": 0.05, "amsgrad": True}, "keras2", "float64"),
    ("LazyAdam", {"learning_rate": 0.05, "weight_decay": 0.1}, "keras3", "float32", True),
    ("Adagrad", {"learning_rate": 0.1}, "tf_keras", "float32"),
    ("Adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.1}, "torch", "float32"),
    # per-row accumulators: a slot of shape (V,)
    ("RowWiseAdagrad", {"learning_rate": 0.1, "weight_decay": 0.01,
                        "weight_decay_mode": "decoupled"}, "fbgemm", "float32"),
    ("RowWiseAdagrad", {"learning_rate": 0.1, "weight_decay": 0.01,
                        "weight_decay_mode": "l2", "clipvalue": 0.5}, "fbgemm", "float64"),
    ("Ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01}, "tf1", "float32"),
    ("Adadelta", {"learning_rate": 1.0}, "keras2", "float32"),
    ("Adamax", {"learning_rate": 0.05}, "keras2", "float64"),
    ("SGD", {"learning_rate": 0.05, "momentum": 0.9, "nesterov": True}, "tf1", "float32"),
    ("ProximalAdagrad", {"learning_rate": 0.1, "l1_regularization_strength": 0.01}, "tf1",
     "float32"),
    ("ProximalGradientDescent", {"learning_rate": 0.1, "l2_regularization_strength": 0.01},
     "tf1", "float32"),
]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    comm = MPIComm()
    report = []
    for name, kwargs, convention, dtype, *exclude in CASES:
        cls = getattr(refopt, name)
        table = np.random.default_rng(3).standard_normal((V, D)).astype(dtype)
        single_table = table.copy()
        single = cls(**kwargs, convention=convention, backend=args.backend)
        opt = cls(**kwargs, convention=convention, backend=args.backend)
        if exclude:
            single.exclude_from_weight_decay([single_table])
            opt.exclude_from_weight_decay([table])
        emb = ShardedEmbedding(opt, table, micro_batches=K, comm=comm)
        for step in range(args.steps):
            grads = [micro_grad(step, k, dtype) for k in range(K)]
            cat = refopt.IndexedSlices(np.concatenate([g.values for g in grads]),
                                       np.concatenate([g.indices for g in grads]), (V, D))
            single.apply_gradients([(cat, single_table)])
            emb.apply_gradients([grads[k] for k in emb.micro_batch_ids])
            if emb.gather_table().tobytes() != single_table.tobytes():
                raise AssertionError(f"{name}/{convention}: table differs at step {step}")
        for slot in single.slot_names:
            full, want = emb.gather_table(slot), single.get_slot(single_table, slot)
            if full.shape != want.shape or full.tobytes() != want.tobytes():
                raise AssertionError(f"{name}/{convention}: slot {slot} differs")
        asked = np.random.default_rng(comm.rank).integers(0, V, 17)
        if emb.lookup(asked).tobytes() != single_table[asked].tobytes():
            raise AssertionError("lookup differs")
        report.append({"case": f"{name}/{convention}", "local_rows": comm.allgather_obj(
            int(emb.local.shape[0]))})
    # a zero-width table: steps, lookups and gathers of (V, 0) arrays
    emb = ShardedEmbedding(refopt.LazyAdam(backend=args.backend), np.zeros((V, 0), "float32"),
                           micro_batches=K, comm=comm)
    emb.apply_gradients([refopt.IndexedSlices(np.zeros((2, 0), "float32"), np.array([1, 52]),
                                              (V, 0)) for _ in emb.micro_batch_ids])
    shapes = [emb.gather_table().shape, emb.gather_table("v").shape,
              emb.lookup(np.array([0, 52, 7])).shape]
    if shapes != [(V, 0), (V, 0), (3, 0)] or emb.iterations != 1:
        raise AssertionError(f"zero-width table: {shapes}")
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "cases": report}), flush=True)


if __name__ == "__main__":
    main()
