"""Benchmark of refopt.distributed (not a test): step time, state memory and traffic per rank.

Run ``python benchmarks/bench_mpi.py`` (needs ``pip install "refopt[mpi]"``; about two
minutes and ~6 GiB of memory at the default sizes; ``--n``, ``--rows`` shrink them). Everything
is measured in the same run on the same machine, and printed as ratios to the same run's
single-process step:

1. Dense Adam, float32, ``n`` = 1e7 elements in 4 tensors, K = 4 micro-batches per step:
   the single-process step (``refopt.Adam(backend="cpu")`` on the summed gradient; also with
   the K - 1 additions that form it), then :class:`~refopt.distributed.ShardedOptimizer`
   under ``mpiexec -n R`` for R = 1, 2 in ``mode="exact"`` and ``mode="fast"``.
2. A ``rows`` x 64 float32 table (default 4e6 rows, 1 GiB) with LazyAdam, 16384 Zipf(1.2)
   row indices per step in K = 4 micro-batches: the single-process lazy step against
   :class:`~refopt.distributed.ShardedEmbedding` (the step, and the lookup of the batch's
   rows) for R = 1, 2.

Per rank: the step time (median over steps of the slowest rank, each step started together
after a barrier; best in brackets), the optimizer state held (slots, and the table's rows for
the embedding), and the elements this rank exchanged in one step, counted by a wrapper around
the communicator: received from other ranks (all-to-all and all-gather) and sent to them
(all-to-all), plus the pickled metadata (error agreement, norm parts).

The single-process steps run in this process with every core; each of R ranks gets
``cores // R`` Numba threads (``NUMBA_NUM_THREADS``), so the ratios compare the same cores.
MPICH's ranks busy-poll while they wait, so on a shared or oversubscribed machine the
distributed times are pessimistic.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import refopt

K = 4  # micro-batches per step: R = 1, 2, 4 divide it
BATCH = 16384  # table rows per step (all micro-batches), as bench_cpu's lazy benchmark
N_TENSORS = 4  # the dense model's tensors


class CountingComm:
    """A :class:`~refopt.distributed.Communicator` that counts the elements it moves."""

    def __init__(self, inner):
        from refopt.distributed import Communicator

        class _Counting(Communicator):
            rank, size, engine = inner.rank, inner.size, inner.engine

            def allgather_obj(s, obj):
                s.meta += len(pickle.dumps(obj))
                return inner.allgather_obj(obj)

            def bcast_obj(s, obj, root=0):
                s.meta += len(pickle.dumps(obj))
                return inner.bcast_obj(obj, root)

            def alltoallv(s, send, send_counts, recv, recv_counts):
                r = inner.rank
                s.sent += (sum(send_counts) - send_counts[r]) * send.itemsize
                s.received += (sum(recv_counts) - recv_counts[r]) * recv.itemsize
                inner.alltoallv(send, send_counts, recv, recv_counts)

            def allgatherv(s, send, recv, counts):
                s.received += (sum(counts) - counts[inner.rank]) * recv.itemsize
                inner.allgatherv(send, recv, counts)

            def barrier(s):
                inner.barrier()

            def abort(s, code=1):
                inner.abort(code)

        self.comm = _Counting()
        self.reset()

    def reset(self):
        self.comm.sent = self.comm.received = self.comm.meta = 0

    def counts(self):
        return {"sent": int(self.comm.sent), "received": int(self.comm.received),
                "meta": int(self.comm.meta)}


def median_best(times):
    return float(np.median(times)), float(np.min(times))


def timed_steps(comm, step, reps, warmup=2):
    """Per step, the slowest rank's seconds (every rank starts after a barrier)."""
    mine = []
    for k in range(warmup + reps):
        comm.barrier()
        t = time.perf_counter()
        step()
        if k >= warmup:
            mine.append(time.perf_counter() - t)
    every = np.array(comm.allgather_obj(mine))
    return median_best(every.max(axis=0))


def dense_model(n, seed=0):
    rng = np.random.default_rng(seed)
    sizes = [n // N_TENSORS + (1 if k < n % N_TENSORS else 0) for k in range(N_TENSORS)]
    variables = [rng.standard_normal(s, dtype=np.float32) for s in sizes]
    grads = [[rng.standard_normal(s, dtype=np.float32) for s in sizes] for _ in range(K)]
    return variables, grads


def table_batches(rows, dim, seed=0):
    """K micro-batch gradients of BATCH Zipf(1.2) rows in all."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(K):
        idx = (rng.zipf(1.2, BATCH // K) - 1) % rows
        vals = rng.standard_normal((idx.size, dim), dtype=np.float32)
        out.append(refopt.IndexedSlices(vals, idx, (rows, dim)))
    return out


# --------------------------------------------------------------------------- single process
def single_process(args):
    out = _single_dense(args)
    out.update(_single_table(args))
    return out


def _single_dense(args):
    variables, grads = dense_model(args.n)
    opt = refopt.Adam(learning_rate=1e-3, backend="cpu")
    total = [g.copy() for g in grads[0]]

    def summed_step():
        for t, g0 in zip(total, grads[0]):
            t[:] = g0
        for g in grads[1:]:
            for t, x in zip(total, g):
                np.add(t, x, out=t)
        opt.apply_gradients(zip(total, variables))

    step_only = _times(lambda: opt.apply_gradients(zip(total, variables)), args.reps)
    with_sum = _times(summed_step, args.reps)
    state = sum(opt.get_slot(v, s).nbytes for v in variables for s in opt.slot_names)
    return {"dense_step": step_only, "dense_sum_step": with_sum, "dense_state": state}


def _single_table(args):
    table = np.zeros((args.rows, args.dim), np.float32)
    micro = table_batches(args.rows, args.dim)
    cat = refopt.IndexedSlices(np.concatenate([g.values for g in micro]),
                               np.concatenate([g.indices for g in micro]), table.shape)
    lazy = refopt.LazyAdam(learning_rate=1e-3, backend="cpu")
    lazy_step = _times(lambda: lazy.apply_gradients([(cat, table)]), args.reps)
    lazy_state = sum(lazy.get_slot(table, s).nbytes for s in lazy.slot_names) + table.nbytes
    return {"table_step": lazy_step, "table_state": lazy_state,
            "unique_rows": int(np.unique(cat.indices).size)}


def _times(fn, reps, warmup=2):
    out = []
    for k in range(warmup + reps):
        t = time.perf_counter()
        fn()
        if k >= warmup:
            out.append(time.perf_counter() - t)
    return median_best(out)


# --------------------------------------------------------------------------- one mpiexec run
def worker(args):
    from refopt.distributed import MPIComm

    comm = MPIComm()
    counting = CountingComm(comm)
    out = {"ranks": comm.size, "threads": int(os.environ.get("NUMBA_NUM_THREADS", "0"))}
    for mode in ("exact", "fast"):
        out[f"dense_{mode}"] = _worker_dense(args, comm, counting, mode)
    out["table"] = _worker_table(args, comm, counting)
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


def _worker_dense(args, comm, counting, mode):
    from refopt.distributed import ShardedOptimizer

    variables, grads = dense_model(args.n)
    dist = ShardedOptimizer(refopt.Adam(learning_rate=1e-3, backend="cpu"), variables,
                            micro_batches=K, comm=counting.comm, mode=mode)
    mine = [grads[k] for k in dist.micro_batch_ids]
    dist.apply_gradients(mine)
    counting.reset()
    dist.apply_gradients(mine)
    traffic = counting.counts()
    return {"step": timed_steps(comm, lambda: dist.apply_gradients(mine), args.reps),
            "state": comm.allgather_obj(dist.state_nbytes()),
            "traffic": comm.allgather_obj(traffic)}


def _worker_table(args, comm, counting):
    from refopt.distributed import ShardedEmbedding

    emb = ShardedEmbedding(refopt.LazyAdam(learning_rate=1e-3, backend="cpu"),
                           np.zeros((args.rows, args.dim), np.float32), micro_batches=K,
                           comm=counting.comm)
    micro = table_batches(args.rows, args.dim)
    mine = [micro[k] for k in emb.micro_batch_ids]
    asked = np.concatenate([g.indices for g in mine])
    emb.apply_gradients(mine)
    counting.reset()
    emb.apply_gradients(mine)
    step_traffic = counting.counts()
    counting.reset()
    emb.lookup(asked)
    lookup_traffic = counting.counts()
    state = emb.local.nbytes + sum(emb.optimizer.get_slot(emb.local, s).nbytes
                                   for s in emb.optimizer.slot_names)
    return {"step": timed_steps(comm, lambda: emb.apply_gradients(mine), args.reps),
            "lookup": timed_steps(comm, lambda: emb.lookup(asked), args.reps),
            "state": comm.allgather_obj(state),
            "traffic": comm.allgather_obj(step_traffic),
            "lookup_traffic": comm.allgather_obj(lookup_traffic)}


def launch(ranks, args):
    mpiexec = Path(sys.executable).parent / "mpiexec"
    threads = max(1, (os.cpu_count() or 1) // ranks)
    cmd = [str(mpiexec), "-launcher", "fork", "-n", str(ranks), sys.executable, "-m", "mpi4py",
           __file__, "--worker", "--n", str(args.n), "--rows", str(args.rows), "--dim",
           str(args.dim), "--reps", str(args.reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False,
                          env={**os.environ, "NUMBA_NUM_THREADS": str(threads)})
    if proc.returncode:
        sys.exit(f"mpiexec -n {ranks} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _mib(b):
    return f"{b / 2**20:,.1f} MiB"


def _ms(t):
    return f"{1e3 * t[0]:8.2f} ms ({1e3 * t[1]:.2f})"


def report(args, single, runs):
    n, rows, dim = args.n, args.rows, args.dim
    print(f"refopt.distributed benchmark: {os.cpu_count()} cores, K = {K} micro-batches, "
          f"medians of {args.reps} steps (best in brackets)")
    print(f"\n1. Dense Adam, float32, n = {n:,} in {N_TENSORS} tensors")
    print(f"  one process, step only          {_ms(single['dense_step'])}   state "
          f"{_mib(single['dense_state'])}")
    base = single["dense_sum_step"][0]
    print(f"  one process, sum K + step       {_ms(single['dense_sum_step'])}   (the "
          "baseline of the ratios)")
    for run in runs:
        R = run["ranks"]
        for mode in ("exact", "fast"):
            d = run[f"dense_{mode}"]
            t = d["traffic"]
            recv = max(x["received"] for x in t) / 4
            sent = max(x["sent"] for x in t) / 4
            model_sent = (K // R if mode == "exact" else 1) * n * (R - 1) / R
            model_recv = model_sent + n * (R - 1) / R
            print(f"  R = {R} {mode:5s} ({run['threads']} thr/rank) {_ms(d['step'])}   "
                  f"x{d['step'][0] / base:5.2f}   state/rank "
                  f"{', '.join(_mib(s) for s in d['state'])} "
                  f"(x{max(d['state']) / single['dense_state']:.2f})")
            print(f"      per rank per step: sent {sent / n:.3f} N, received {recv / n:.3f} N "
                  f"(model {model_sent / n:.3f} N, {model_recv / n:.3f} N), metadata "
                  f"{max(x['meta'] for x in t):,} B")
    print(f"\n2. LazyAdam table {rows:,} x {dim} float32, {BATCH} Zipf(1.2) rows per step "
          f"({single['unique_rows']:,} distinct)")
    base = single["table_step"][0]
    print(f"  one process, step               {_ms(single['table_step'])}   table + state "
          f"{_mib(single['table_state'])}")
    for run in runs:
        d = run["table"]
        R = run["ranks"]
        recv = max(x["received"] for x in d["traffic"])
        lk = max(x["received"] for x in d["lookup_traffic"])
        print(f"  R = {R} step   ({run['threads']} thr/rank) {_ms(d['step'])}   "
              f"x{d['step'][0] / base:5.2f}   table + state/rank "
              f"{', '.join(_mib(s) for s in d['state'])} "
              f"(x{max(d['state']) / single['table_state']:.2f})")
        print(f"  R = {R} lookup               {_ms(d['lookup'])}")
        model = BATCH / R * (R - 1) / R * (dim * 4 + 8)  # uniform rows; Zipf's are skewed
        print(f"      per rank per step: received {_mib(recv)} (indices and rows of the "
              f"gradient), lookup received {_mib(lk)}; model (B/R)(R-1)/R (8 + 4D) = "
              f"{_mib(model)} each way")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=float, default=1e7, help="dense elements (default 1e7)")
    p.add_argument("--rows", type=float, default=4e6, help="table rows (default 4e6)")
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--ranks", default="1,2", help="comma-separated R (default 1,2)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.n, args.rows = int(args.n), int(args.rows)
    if args.worker:
        return worker(args)
    single = single_process(args)
    runs = [launch(int(r), args) for r in args.ranks.split(",")]
    report(args, single, runs)


if __name__ == "__main__":
    main()
