"""Run under ``mpiexec -n R``: bad input on one rank, and sharded checkpoints across R.

Options combine, in this order. ``--faults``: rank R-1 (or the only rank) passes a gradient of the wrong shape; every rank
must raise the same ValueError and keep its variables and state. ``--save DIR``: two steps,
then save. ``--kill-rank r``: then rank r kills itself (SIGKILL) in the middle of the
third step, inside its first exchange (the other ranks are then waiting in it); rank 0 has
printed its JSON line before. ``--resume DIR``: load (saved with any R), two more steps, compare with four
single-process steps bit for bit. ``--expect-load-error DIR...``: loading each must raise on every
rank (the same message) and change nothing (a directory named ``*tensor*`` is loaded by the
Adafactor of the "tensor" layout). ``--checks``: settings that differ on one rank
(at construction and between steps) must raise the same ValueError on every rank; zero-size
and 0-d variables (NumPy scalar gradients), an empty variable list, a schedule class of the
user's own and a learning rate changed between steps must give the single-process bits.
Rank 0 prints one JSON line.
"""

import argparse
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from zero_trajectories import SCALE, K, add_up, micro_grads, summed, variables

import refopt
from refopt.distributed import MPIComm, ShardedEmbedding, ShardedOptimizer


def new_optimizers(convention="tf_keras"):
    """The checkpointed optimizers: the "slice" layout (the "tensor" layout under
    ``convention="torch"``), and the "tensor" layout (Adafactor's factored slots, PyTorch's
    global norm), whose order of tensors depends on R."""
    return [refopt.Adam(learning_rate=0.01, global_clipnorm=1.0, use_ema=True, amsgrad=True,
                        backend="reference", convention=convention),
            refopt.Adafactor(convention="torch", global_clipnorm=1.0, backend="reference")]


def make(comm, which=0):
    dv = variables(["float32"])
    return ShardedOptimizer(new_optimizers()[which], dv, micro_batches=K, comm=comm), dv


def step(dist, dv, s):
    dist.apply_gradients([micro_grads(dv, s, k, SCALE) for k in dist.micro_batch_ids])


def snapshot(dist, dv):
    return [v.copy() for v in dv] + [x for s in dist.slot_names for x in dist.gather_slot(s)]


def same(a, b):
    return all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def same_error(comm, fn, types=(ValueError,)):
    """Run ``fn``; it must raise one of ``types`` with the same message on every rank."""
    try:
        fn()
        message = None
    except types as exc:
        message = f"{type(exc).__name__}: {exc}"
    messages = comm.allgather_obj(message)
    if None in messages or len(set(messages)) != 1:
        raise AssertionError(f"not the same error on every rank: {messages}")
    return messages[0]


class Warmup(refopt.schedules.LearningRateSchedule):
    """A schedule of the user's own (not known to refopt.schedules.deserialize)."""

    def __call__(self, step):
        return np.float32(0.01) * np.float32(step + 1)

    def get_config(self):
        return {}


def run_pair(comm, make, like, steps, change=None):
    """``steps`` steps of one process and of ShardedOptimizer from ``make()`` on copies of
    ``like`` (micro-batch k's gradient ``k - 1.5``, NumPy scalars for 0-d variables);
    ``change(opt, step)`` before each step on both optimizers. Returns whether every
    variable and slot is bit-identical."""
    single, sv = make(), [v.copy() for v in like]
    dv = [v.copy() for v in like]
    dist = ShardedOptimizer(make(), dv, micro_batches=K, comm=comm)

    def grad(v, k):
        return v.dtype.type(k - 1.5) if v.ndim == 0 else np.full(v.shape, k - 1.5, v.dtype)

    for step in range(steps):
        if change is not None:
            change(single, step)
            change(dist.optimizer, step)
        if sv:
            total = add_up([[np.asarray(grad(v, k)) for v in sv] for k in range(K)])
            single.apply_gradients(zip(total, sv))
        dist.apply_gradients([[grad(v, k) for v in dv] for k in dist.micro_batch_ids])
    return (same(sv, dv) and dist.iterations == single.iterations and all(
        same([single.get_slot(v, s) for v in sv], dist.gather_slot(s))
        for s in dist.slot_names))


def checks(comm):
    """Settings mismatches (one rank differs) and the edge cases; returns the messages."""
    last = comm.size - 1
    odd = comm.rank == last
    out = {}

    def opt(**kw):
        kw = {"learning_rate": 0.01, "backend": "reference", **kw}
        return refopt.Adam(**kw)

    def construct(o=None, dv=None, **kw):
        ShardedOptimizer(o or opt(), dv or variables(["float32"]), micro_batches=K,
                         comm=comm, **kw)

    def with_iterations():
        o = opt()
        o.iterations = 5 if odd else 0
        construct(o)

    def with_exclusion():
        dv = variables(["float32"])
        o = opt(weight_decay=0.1)
        o.exclude_from_weight_decay(dv[1:2] if odd else dv[:1])
        construct(o, dv)

    def with_values():
        dv = variables(["float32"])
        dv[3][...] += np.float32(odd)
        construct(dv=dv)

    mismatches = {
        "mode": lambda: construct(mode="fast" if odd else "exact"),
        "clip": lambda: construct(opt(global_clipnorm=1.0 if odd else None)),
        "lr": lambda: construct(opt(learning_rate=0.1 if odd else 0.01)),
        "iterations": with_iterations,
        "exclusion": with_exclusion,
        "values": with_values,
        "reduction": lambda: construct(reduction="mean" if odd else "sum"),
    }
    for key, fn in mismatches.items():
        out[key] = same_error(comm, fn)
    # between steps: a learning rate set on one rank only is refused, nothing moves; a
    # configuration change on every rank is refused
    dv = variables(["float32"])
    dist = ShardedOptimizer(opt(), dv, micro_batches=K, comm=comm)
    before = [v.copy() for v in dv]
    dist.optimizer.learning_rate = 0.5 if odd else 0.01
    out["step lr"] = same_error(comm, lambda: step(dist, dv, 0))
    dist.optimizer.learning_rate = 0.01
    dist.optimizer.beta_1 = 0.5
    out["step config"] = same_error(comm, lambda: step(dist, dv, 0))
    if not same(before, dv) or dist.iterations != 0:
        raise AssertionError("a refused step changed something")
    # ShardedEmbedding: a table that differs on one rank
    table = np.zeros((9, 3), np.float32)
    table[4, 1] = float(odd)
    out["table"] = same_error(comm, lambda: ShardedEmbedding(
        refopt.LazyAdam(backend="reference"), table, micro_batches=K, comm=comm))
    table[4, 1] = 0.0
    emb = ShardedEmbedding(refopt.LazyAdam(backend="reference"), table, micro_batches=K,
                           comm=comm)
    emb.optimizer.learning_rate = 0.5 if odd else 0.01
    grads = [refopt.IndexedSlices(np.ones((1, 3), np.float32), np.array([4]), (9, 3))
             for _ in emb.micro_batch_ids]
    out["embedding step lr"] = same_error(comm, lambda: emb.apply_gradients(grads))
    if emb.iterations != 0 or emb.gather_table().any():
        raise AssertionError("a refused embedding step changed something")
    # edge cases against one process, bit for bit: a (0, 5) variable, a 0-d one (NumPy
    # scalar gradients), in the "slice" and "tensor" layouts (Adafactor's factored slots of
    # the (0, 5) variable have 5 elements; PyTorch's global norm stacks every tensor's)
    edge = [np.zeros((0, 5), np.float32), np.full((), 2.0, np.float32),
            np.arange(3, dtype=np.float32)]
    out["edge"] = [run_pair(comm, make, edge, 2) for make in [
        lambda: opt(global_clipnorm=0.5),
        lambda: refopt.Adafactor(convention="keras3", backend="reference"),
        lambda: refopt.SGD(momentum=0.9, global_clipnorm=0.5, convention="torch",
                           backend="reference")]]
    out["empty"] = run_pair(comm, opt, [], 2)  # no variables: a no-op, as one process
    out["schedule"] = run_pair(comm, lambda: opt(learning_rate=Warmup()), edge, 3)
    out["lr changed"] = run_pair(comm, opt, edge, 3, change=lambda o, s: setattr(
        o, "learning_rate", 0.01 / (s + 1)))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--faults", action="store_true")
    p.add_argument("--save")
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--resume")
    p.add_argument("--expect-load-error", nargs="+", default=[])
    p.add_argument("--checks", action="store_true")
    args = p.parse_args()
    comm = MPIComm()
    dist, dv = make(comm)
    out = {"ranks": comm.size}
    if args.checks:
        out["checks"] = checks(comm)
    if args.faults:
        step(dist, dv, 0)
        before = snapshot(dist, dv)
        grads = [micro_grads(dv, 1, k, SCALE) for k in dist.micro_batch_ids]
        if comm.rank == comm.size - 1:
            grads[-1][2] = np.zeros((6,), np.float32)  # variable 2 has shape (5,)
        try:
            dist.apply_gradients(grads)
            message = None
        except ValueError as exc:
            message = str(exc)
        messages = comm.allgather_obj(message)
        if None in messages or len(set(messages)) != 1:
            raise AssertionError(f"not the same error on every rank: {messages}")
        if not same(before, snapshot(dist, dv)) or dist.iterations != 1:
            raise AssertionError("a refused step changed something")
        out["message"] = messages[0]
    if args.save:
        for s in range(dist.iterations, 2):
            step(dist, dv, s)
        dist.save(args.save)
        other, other_dv = make(comm, 1)
        step(other, other_dv, 0)
        step(other, other_dv, 1)
        other.save(args.save + "-tensor")
    if args.kill_rank is not None:
        if comm.rank == 0:
            print(json.dumps(out), flush=True)
        if comm.rank == args.kill_rank:
            def die(*_):
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no MPI_Finalize
            dist.comm.alltoallv = die
        step(dist, dv, 2)
        raise AssertionError("a step went through with a rank killed")
    if args.resume:
        for which, directory in enumerate([args.resume, args.resume + "-tensor"]):
            d, d_vars = (dist, dv) if which == 0 else make(comm, 1)
            d.load(directory)
            if which == 0:  # across layouts: "slice" -> "tensor" (PyTorch's norm) -> "slice"
                x_vars = variables(["float32"])
                x = ShardedOptimizer(new_optimizers(convention="torch")[0], x_vars,
                                     micro_batches=K, comm=comm)
                x.load(directory)
                x.save(directory + "-as-tensor")
                y, y_vars = make(comm)
                y.load(directory + "-as-tensor")
                if (x.layout, y.layout) != ("tensor", "slice") or not (
                        same(snapshot(d, d_vars), snapshot(x, x_vars))
                        and same(snapshot(d, d_vars), snapshot(y, y_vars))):
                    raise AssertionError("a load across layouts differs")
            step(d, d_vars, 2)
            step(d, d_vars, 3)
            single_vars = variables(["float32"])
            single = new_optimizers()[which]
            for s in range(4):
                single.apply_gradients(zip(summed(single_vars, s, "sum"), single_vars))
            expect = [v.copy() for v in single_vars] + [
                single.get_slot(v, s) for s in d.slot_names for v in single_vars]
            if not same(expect, snapshot(d, d_vars)) or d.iterations != 4:
                raise AssertionError(f"resumed run {which} differs from the single-process run")
        out["resumed"] = True
    out["load_errors"] = []
    for directory in args.expect_load_error:
        # a directory named "*tensor*" holds an Adafactor checkpoint (the "tensor" layout)
        d, d_vars = make(comm, 1) if "tensor" in os.path.basename(directory) else (dist, dv)
        before, iterations = snapshot(d, d_vars), d.iterations
        try:
            d.load(directory)
            message = None
        except (ValueError, FileNotFoundError) as exc:
            message = f"{type(exc).__name__}: {exc}"
        messages = comm.allgather_obj(message)
        if None in messages or len(set(messages)) != 1:
            raise AssertionError(f"not the same error on every rank: {messages}")
        if not same(before, snapshot(d, d_vars)) or d.iterations != iterations:
            raise AssertionError("a refused load changed something")
        out["load_errors"].append(messages[0])
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
