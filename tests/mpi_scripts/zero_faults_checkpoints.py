"""Run under ``mpiexec -n R``: bad input on one rank, and sharded checkpoints across R.

Options combine, in this order. ``--faults``: rank R-1 (or the only rank) passes a gradient of the wrong shape; every rank
must raise the same ValueError and keep its variables and state. ``--save DIR``: two steps,
then save. ``--kill-rank r``: then rank r kills itself (SIGKILL) in the middle of the
third step, inside its first exchange (the other ranks are then waiting in it); rank 0 has
printed its JSON line before. ``--resume DIR``: load (saved with any R), two more steps, compare with four
single-process steps bit for bit. ``--expect-load-error DIR...``: loading each must raise on every
rank (the same message) and change nothing. Rank 0 prints one JSON line.
"""

import argparse
import json
import os
import signal
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from zero_trajectories import SCALE, K, micro_grads, summed, variables

import refopt
from refopt.distributed import MPIComm, ShardedOptimizer


def new_optimizers():
    """The checkpointed optimizers: the "slice" layout, and the "tensor" layout (Adafactor's
    factored slots, PyTorch's global norm), whose order of tensors depends on R."""
    return [refopt.Adam(learning_rate=0.01, global_clipnorm=1.0, use_ema=True, amsgrad=True,
                        backend="reference"),
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--faults", action="store_true")
    p.add_argument("--save")
    p.add_argument("--kill-rank", type=int)
    p.add_argument("--resume")
    p.add_argument("--expect-load-error", nargs="+", default=[])
    args = p.parse_args()
    comm = MPIComm()
    dist, dv = make(comm)
    out = {"ranks": comm.size}
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
        before, iterations = snapshot(dist, dv), dist.iterations
        try:
            dist.load(directory)
            message = None
        except (ValueError, FileNotFoundError) as exc:
            message = f"{type(exc).__name__}: {exc}"
        messages = comm.allgather_obj(message)
        if None in messages or len(set(messages)) != 1:
            raise AssertionError(f"not the same error on every rank: {messages}")
        if not same(before, snapshot(dist, dv)) or dist.iterations != iterations:
            raise AssertionError("a refused load changed something")
        out["load_errors"].append(messages[0])
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
