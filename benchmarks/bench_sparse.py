"""Benchmark of the sparse optimizers on ``backend="cpu"`` (not a test; issue 14, item 3).

Run ``python benchmarks/bench_sparse.py`` (a few minutes; up to about 5 GiB of memory at
V = 4e6). For each sparse optimizer: one step on a V x 64 float32 table with a gradient of
16384 Zipf(1.2) row indices (many duplicates, unsorted: what an embedding's backward gives),
at V = 1e5 and V = 4e6 (``--tables`` to change), and where PyTorch has the same update its
sparse implementation in the same run:

- ``Adagrad(convention="torch")`` vs ``torch.optim.Adagrad`` on a sparse COO gradient;
- ``LazyAdam(convention="torch")`` (SparseAdam) and ``LazyAdam`` (tf_keras) vs ``torch.optim.SparseAdam``;
- ``SGD(convention="torch")`` (plain and with momentum, where torch takes a sparse gradient)
  vs ``torch.optim.SGD``;
- ``Adagrad`` (tf_keras), ``Ftrl`` (keras2), ``ProximalAdagrad``,
  ``ProximalGradientDescent`` (tf1), ``SGD(momentum=0.9, convention="tf1")``,
  ``RowWiseAdagrad`` (exact and approximate), ``PartialRowWiseAdam``: refopt alone.

The torch gradient is ``torch.sparse_coo_tensor`` over the raw (repeated, unsorted) indices,
uncoalesced, as ``nn.Embedding(sparse=True)`` produces it; torch coalesces it inside the step,
so that cost is in its time, as the duplicate summing is in refopt's.

Times are medians (and, in parentheses, best) of repeated steps after warm-up, refopt and
torch timed in alternating rounds (the machine is shared). Printed: a markdown table with
refopt's time at each V, the ratio of its time at the largest V to the smallest (the target:
at most 1.3), and torch's time over refopt's at each V (the target: at least 3).
``--only TEXT`` measures the optimizers whose label contains TEXT.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import numpy as np

import refopt

try:
    import torch
except ImportError:  # the torch columns are left out
    torch = None


def interleaved(fns, reps, warmup=2):
    """[(median, best)] seconds per function, one call of each per round."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    return [(float(np.median(ts)), float(min(ts))) for ts in times]


def _torch_adagrad(p):
    return torch.optim.Adagrad([p], lr=0.01)


def _torch_sparse_adam(p):
    return torch.optim.SparseAdam([p], lr=1e-3)


def _torch_sgd(p):
    return torch.optim.SGD([p], lr=0.01)


def _torch_sgd_momentum(p):
    return torch.optim.SGD([p], lr=0.01, momentum=0.9)


#: (label, refopt factory, torch factory or None)
CASES = [
    ("LazyAdam tf_keras", lambda: refopt.LazyAdam(learning_rate=1e-3, backend="cpu"),
     _torch_sparse_adam),
    ("LazyAdam torch (SparseAdam)",
     lambda: refopt.LazyAdam(learning_rate=1e-3, convention="torch", backend="cpu"),
     _torch_sparse_adam),
    ("Adagrad torch", lambda: refopt.Adagrad(learning_rate=0.01, convention="torch",
                                             backend="cpu"), _torch_adagrad),
    ("Adagrad tf_keras", lambda: refopt.Adagrad(learning_rate=0.01, backend="cpu"), None),
    ("Ftrl keras2", lambda: refopt.Ftrl(learning_rate=0.01, convention="keras2",
                                        backend="cpu"), None),
    ("ProximalAdagrad tf1", lambda: refopt.ProximalAdagrad(
        learning_rate=0.01, l1_regularization_strength=1e-4,
        l2_regularization_strength=1e-4, backend="cpu"), None),
    ("ProximalGradientDescent tf1", lambda: refopt.ProximalGradientDescent(
        learning_rate=0.01, l1_regularization_strength=1e-4,
        l2_regularization_strength=1e-4, backend="cpu"), None),
    ("SGD momentum tf1", lambda: refopt.SGD(learning_rate=0.01, momentum=0.9,
                                            convention="tf1", backend="cpu"), None),
    ("SGD torch", lambda: refopt.SGD(learning_rate=0.01, convention="torch", backend="cpu"),
     _torch_sgd),
    ("SGD momentum torch", lambda: refopt.SGD(learning_rate=0.01, momentum=0.9,
                                              convention="torch", backend="cpu"),
     _torch_sgd_momentum),
    ("RowWiseAdagrad exact", lambda: refopt.RowWiseAdagrad(learning_rate=0.01, backend="cpu"),
     None),
    ("RowWiseAdagrad approx", lambda: refopt.RowWiseAdagrad(learning_rate=0.01, exact=False,
                                                            backend="cpu"), None),
    ("PartialRowWiseAdam", lambda: refopt.PartialRowWiseAdam(learning_rate=0.01,
                                                             backend="cpu"), None),
]


def gradient(V, batch, dim, seed=1):
    rng = np.random.default_rng(seed)
    idx = (rng.zipf(1.2, batch) - 1) % V
    vals = rng.standard_normal((batch, dim), dtype=np.float32)
    return idx.astype(np.int64), vals


def one(label, make, make_torch, V, batch, dim, reps):
    """((median, best) refopt, (median, best) torch or None, unique rows)."""
    idx, vals = gradient(V, batch, dim)
    g = refopt.IndexedSlices(vals, idx, (V, dim))
    table = np.zeros((V, dim), np.float32)
    opt = make()
    fns = [lambda: opt.apply_gradients([(g, table)])]
    if torch is not None and make_torch is not None:
        p = torch.zeros((V, dim), dtype=torch.float32, requires_grad=True)
        sg = torch.sparse_coo_tensor(torch.from_numpy(idx[None]), torch.from_numpy(vals),
                                     (V, dim))
        topt = make_torch(p)

        def tstep():
            p.grad = sg
            topt.step()

        try:
            tstep()
        except RuntimeError as e:  # torch refuses this sparse update
            print(f"<!-- {label}: torch refuses: {str(e).splitlines()[0]} -->")
        else:
            fns.append(tstep)
    res = interleaved(fns, reps)
    return res[0], (res[1] if len(res) > 1 else None), int(np.unique(idx).size)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=float, nargs="+", default=[1e5, 4e6])
    parser.add_argument("--batch", type=int, default=16384)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--only", default=None, help="substring of the optimizers' labels")
    args = parser.parse_args(argv)
    tables = [int(v) for v in args.tables]
    import numba

    print(f"# refopt sparse steps, V x {args.dim} float32, {args.batch} Zipf(1.2) indices; "
          f"numba threads {numba.get_num_threads()}, torch "
          f"{torch.__version__ if torch else '-'} threads "
          f"{torch.get_num_threads() if torch else '-'}\n")
    head = ["optimizer"] + [f"cpu ms V={v:.0e}" for v in tables]
    head += [f"time V={tables[-1]:.0e} / V={tables[0]:.0e}"]
    head += [f"torch / cpu V={v:.0e}" for v in tables]
    print("| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for label, make, make_torch in CASES:
        if args.only and args.only.lower() not in label.lower():
            continue
        cpu, tor = [], []
        for V in tables:
            c, t, u = one(label, make, make_torch, V, args.batch, args.dim, args.reps)
            gc.collect()
            cpu.append(c)
            tor.append(t)
            print(f"<!-- {label} V={V:.0e}: unique {u}, cpu best {c[1] * 1e3:.3f} ms"
                  + (f", torch median {t[0] * 1e3:.3f} best {t[1] * 1e3:.3f} ms" if t else "")
                  + " -->", flush=True)
        # median (best): on a shared machine the best of the rounds is the less noisy figure
        cells = [label] + [f"{c[0] * 1e3:.2f} ({c[1] * 1e3:.2f})" for c in cpu]
        cells.append(f"{cpu[-1][0] / cpu[0][0]:.2f} ({cpu[-1][1] / cpu[0][1]:.2f})")
        cells += [f"{t[0] / c[0]:.1f}x ({t[1] / c[1]:.1f}x)" if t else "-"
                  for c, t in zip(cpu, tor)]
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
