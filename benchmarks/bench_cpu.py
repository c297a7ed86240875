"""Benchmark of the CPU backend (not a test): dense Adam, lazy Adam, many small tensors.

Run ``python benchmarks/bench_cpu.py`` (about two minutes, < 8 GiB of memory). Everything is
measured in the same run, on the same machine and thread count:

1. Dense Adam, float32, n = 1e5, 1e6, 1e7, 3e7: ``refopt.Adam(backend="cpu")`` vs
   ``backend="reference"`` vs ``torch.optim.Adam(fused=True)`` (when torch is installed) vs the
   bandwidth ceiling, an in-place ``a += s * b`` Numba kernel. GB/s are counted at 28 bytes
   per element for Adam (read p, g, m, v; write p, m, v) and 12 for the ceiling (read a, b;
   write a).
2. Lazy Adam on a V x 64 float32 table, V = 1e5, 1e6, 4e6, a batch of 16384 Zipf(1.2) row
   indices (many duplicates): ``refopt.LazyAdam(backend="cpu")`` vs the reference backend vs
   ``torch.optim.SparseAdam``.
3. 500 tensors of 2000 float32 elements: ``refopt.Adam(backend="cpu")`` vs torch fused Adam.
4. Every convention (Adam, AdamW, RMSprop, SGD with momentum) at n = 1e7 on ``backend="cpu"``,
   against tf_keras' time in the same run.
5. The dense optimizers (Adam, SGD with momentum, RMSprop, Adagrad) at n = 1e7 against the
   same-run ceiling scaled to their bytes per element, and torch's default (single-tensor)
   and fused steps where torch has them.
6. First-step times in fresh processes: cold (empty Numba cache: compiles) and warm (cache).

Times are medians of repeated steps after warm-up, the contenders timed in alternating
rounds (the machine this project runs on is shared and noisy; best times are printed too).
torch's Adam differs numerically from tf-keras' (epsilon placement): this compares speed only.
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import tempfile
import textwrap
import time

import numba
import numpy as np
from numba import njit, prange

import refopt
from refopt.kernels.cpu._common import launch

try:
    import torch
except ImportError:  # the torch columns are left out
    torch = None


@njit(parallel=True, cache=True, error_model="numpy")
def _axpy_inplace(a, b, s):
    for i in prange(a.shape[0]):
        a[i] += s * b[i]


def timeit(fn, reps, warmup=2):
    """(median, best) seconds of ``reps`` calls of ``fn`` after ``warmup`` calls."""
    return interleaved([fn], reps, warmup)[0]


def interleaved(fns, reps, warmup=2):
    """[(median, best)] seconds per function, timed in rounds (one call of each per round).

    Rounds put every contender under the same conditions on a shared, noisy machine: a burst
    of load from another process hits all of them instead of one.
    """
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


def fmt_ms(t):
    return f"{t * 1e3:9.3f}"


def _dense_times(n, rng, with_reference):
    """(ceiling, cpu, torch or None, reference or None) (median, best) times at size n."""
    reps = max(15, int(4e8 // (28 * n)))
    g = rng.standard_normal(n, dtype=np.float32)
    a = rng.standard_normal(n, dtype=np.float32)  # the ceiling's array
    w = rng.standard_normal(n, dtype=np.float32)
    opt = refopt.Adam(learning_rate=1e-3, backend="cpu")
    pairs = [(g, w)]
    s = np.float32(1e-6)
    # The ceiling follows the same thread rule as the optimizer's kernels (one thread below
    # 2**21 elements): an in-place pass with the same access pattern.
    fns = [lambda: launch(_axpy_inplace, (a, g, s), n), lambda: opt.apply_gradients(pairs)]
    if torch is not None:
        p = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).requires_grad_()
        p.grad = torch.from_numpy(g)
        fns.append(torch.optim.Adam([p], lr=1e-3, fused=True).step)
    results = interleaved(fns, reps) + [None] * (3 - len(fns))
    fns = opt = p = a = w = None  # free before the reference allocates its own
    gc.collect()
    if with_reference:
        w = rng.standard_normal(n, dtype=np.float32)
        ref = refopt.Adam(learning_rate=1e-3, backend="reference")
        results.append(timeit(lambda: ref.apply_gradients([(g, w)]), 3, 1))
    else:
        results.append(None)
    return results, reps


def bench_dense(sizes, reference_max):
    print("\n## Dense Adam, float32 (median ms of repeated steps; GB/s at 28 B/elem, "
          "ceiling at 12 B/elem)\n")
    head = ("| n | cpu ms | cpu GB/s | ceiling GB/s | cpu/ceiling | reference ms | cpu speed-up "
            "vs reference | torch fused ms | torch GB/s | cpu speed-up vs torch |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    rng = np.random.default_rng(0)
    for n in sizes:
        (ceil_t, cpu_t, torch_t, ref_t), reps = _dense_times(n, rng, n <= reference_max)
        gc.collect()
        t_cpu, t_ceil = cpu_t[0], ceil_t[0]
        gbs = 28 * n / t_cpu / 1e9
        ceil = 12 * n / t_ceil / 1e9
        cells = [f"{n:.0e}", fmt_ms(t_cpu), f"{gbs:6.1f}", f"{ceil:6.1f}", f"{gbs / ceil:5.2f}"]
        cells += [fmt_ms(ref_t[0]), f"{ref_t[0] / t_cpu:6.1f}x"] if ref_t else ["-", "-"]
        if torch_t:
            cells += [fmt_ms(torch_t[0]), f"{28 * n / torch_t[0] / 1e9:6.1f}",
                      f"{torch_t[0] / t_cpu:5.2f}x"]
        else:
            cells += ["-", "-", "-"]
        print("| " + " | ".join(cells) + " |")
        print(f"<!-- n={n:.0e}: best cpu {fmt_ms(cpu_t[1])} ms, best ceiling "
              f"{fmt_ms(ceil_t[1])} ms, reps {reps} -->")


def _lazy_times(V, batch, dim, rng):
    """(unique rows, cpu, torch or None, reference) (median, best) times for a V-row table."""
    idx = (rng.zipf(1.2, batch) - 1) % V
    vals = rng.standard_normal((batch, dim), dtype=np.float32)
    g = refopt.IndexedSlices(vals, idx, (V, dim))
    table = np.zeros((V, dim), np.float32)
    opt = refopt.LazyAdam(learning_rate=1e-3, backend="cpu")
    fns = [lambda: opt.apply_gradients([(g, table)])]
    if torch is not None:
        p = torch.zeros((V, dim), dtype=torch.float32, requires_grad=True)
        sg = torch.sparse_coo_tensor(torch.from_numpy(idx[None].astype(np.int64)),
                                     torch.from_numpy(vals), (V, dim))
        topt = torch.optim.SparseAdam([p], lr=1e-3)

        def tstep():
            p.grad = sg
            topt.step()

        fns.append(tstep)
    results = interleaved(fns, 30) + [None] * (2 - len(fns))
    fns = opt = p = sg = topt = None  # free before the reference allocates its own state
    gc.collect()
    ref = refopt.LazyAdam(learning_rate=1e-3, backend="reference")
    results.append(timeit(lambda: ref.apply_gradients([(g, table)]), 5, 1))
    return np.unique(idx).size, results


def bench_lazy(tables, batch, dim):
    print(f"\n## Lazy Adam, V x {dim} float32 table, {batch} Zipf(1.2) indices "
          "(median ms of one step)\n")
    print("| V | unique rows | cpu ms | reference ms | torch SparseAdam ms | cpu speed-up vs "
          "SparseAdam | cpu time / time at smallest V |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    first = None
    for V in tables:
        unique, (cpu_t, torch_t, ref_t) = _lazy_times(V, batch, dim, rng)
        gc.collect()
        t_cpu = cpu_t[0]
        first = first or t_cpu
        cells = [f"{V:.0e}", str(unique), fmt_ms(t_cpu), fmt_ms(ref_t[0])]
        cells += ([fmt_ms(torch_t[0]), f"{torch_t[0] / t_cpu:5.1f}x"] if torch_t
                  else ["-", "-"])
        cells.append(f"{t_cpu / first:5.2f}")
        print("| " + " | ".join(cells) + " |")
        print(f"<!-- V={V:.0e}: best cpu {fmt_ms(cpu_t[1])} ms -->")


def bench_small(n_tensors, size):
    print(f"\n## {n_tensors} tensors of {size} float32 elements (median ms of one step)\n")
    rng = np.random.default_rng(2)
    ws = [rng.standard_normal(size, dtype=np.float32) for _ in range(n_tensors)]
    gs = [rng.standard_normal(size, dtype=np.float32) for _ in range(n_tensors)]
    opt = refopt.Adam(learning_rate=1e-3, backend="cpu")
    pairs = list(zip(gs, ws))
    fns = [lambda: opt.apply_gradients(pairs)]
    if torch is not None:
        ps = [torch.from_numpy(w.copy()).requires_grad_() for w in ws]
        for p, g in zip(ps, gs):
            p.grad = torch.from_numpy(g)
        topt = torch.optim.Adam(ps, lr=1e-3, fused=True)
        fns.append(topt.step)
    results = interleaved(fns, 200)
    t_cpu, b_cpu = results[0]
    ref = refopt.Adam(learning_rate=1e-3, backend="reference")
    wr = [w.copy() for w in ws]
    t_ref, _ = timeit(lambda: ref.apply_gradients(list(zip(gs, wr))), 10)
    row = f"| {fmt_ms(t_cpu)} | {fmt_ms(t_ref)} | {t_ref / t_cpu:5.1f}x |"
    head = "| cpu ms | reference ms | cpu speed-up vs reference |"
    if torch is not None:
        t_torch = results[1][0]
        head += " torch fused ms | cpu speed-up vs torch |"
        row += f" {fmt_ms(t_torch)} | {t_torch / t_cpu:5.2f}x |"
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    print(row)
    print(f"<!-- best cpu {fmt_ms(b_cpu)} ms -->")


_FIRST_STEP = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import numpy as np, refopt
    t1 = time.perf_counter()
    w = np.ones(1000, np.float32)
    refopt.{cls}(backend="cpu").apply_gradients([({grad}, w)])
    t2 = time.perf_counter()
    print(f"{{t1 - t0:.3f}} {{t2 - t1:.3f}}")
""")


def bench_first_step():
    print("\n## First step in a fresh process (s): import refopt, then the first "
          "apply_gradients (compile or cache load)\n")
    print("| optimizer | cache | import s | first step s |")
    print("|---|---|---|---|")
    cases = [("Adam", "np.ones(1000, np.float32)"),
             ("LazyAdam", ("refopt.IndexedSlices(np.ones((3, 1), np.float32), [1, 5, 1], "
                           "(1000, 1))"))]
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "REFOPT_KERNEL_CACHE": cache}
        for cls, grad in cases:
            script = _FIRST_STEP.format(cls=cls, grad=grad)
            if cls == "LazyAdam":
                script = script.replace("np.ones(1000, np.float32)", "np.ones((1000, 1), "
                                        "np.float32)", 1)
            for label in ("cold (empty cache)", "warm (cached)"):
                out = subprocess.run([sys.executable, "-c", script], env=env, text=True,
                                     capture_output=True, check=True).stdout.split()
                print(f"| {cls} | {label} | {out[0]} | {out[1]} |")


def bench_conventions(n, conventions=("tf_keras", "keras3", "keras2", "tf1", "torch", "optax")):
    print(f"\n## Every convention on backend='cpu', float32, n = {n:.0e} (median ms of one step; "
          "same run)\n")
    print("| optimizer | " + " | ".join(conventions) + " | slowest / tf_keras |")
    print("|---" * (len(conventions) + 2) + "|")
    rng = np.random.default_rng(3)
    g = rng.standard_normal(n, dtype=np.float32)
    for label, make in (("Adam", lambda c: refopt.Adam(convention=c, backend="cpu")),
                        ("AdamW", lambda c: refopt.AdamW(convention=c, backend="cpu")),
                        ("RMSprop", lambda c: refopt.RMSprop(learning_rate=1e-3, convention=c,
                                                             backend="cpu")),
                        ("SGD momentum", lambda c: refopt.SGD(momentum=0.9, convention=c,
                                                              backend="cpu"))):
        fns, names = [], []
        for conv in conventions:
            try:
                opt = make(conv)
            except ValueError:  # AdamW does not exist under keras2/tf1
                continue
            w = rng.standard_normal(n, dtype=np.float32)
            pairs = [(g, w)]
            opt.apply_gradients(pairs)  # build and compile outside the timing
            fns.append(lambda opt=opt, pairs=pairs: opt.apply_gradients(pairs))
            names.append(conv)
        times = dict(zip(names, (t for t, _ in interleaved(fns, 10))))
        cells = [fmt_ms(times[c]) if c in times else "-" for c in conventions]
        print(f"| {label} | " + " | ".join(cells) +
              f" | {max(times.values()) / times['tf_keras']:.2f} |")


#: (label, bytes per float32 element (reads + writes of param, grad, slots), refopt factory,
#: torch factory taking (params, **kw) or None)
def _catalogue():
    out = [
        ("Adam", 28, lambda: refopt.Adam(learning_rate=1e-3, backend="cpu"),
         (lambda ps, **kw: torch.optim.Adam(ps, lr=1e-3, **kw)) if torch else None),
        ("SGD momentum", 20, lambda: refopt.SGD(momentum=0.9, backend="cpu"),
         (lambda ps, **kw: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, **kw)) if torch else None),
        ("RMSprop", 20, lambda: refopt.RMSprop(learning_rate=1e-3, backend="cpu"),
         (lambda ps, **kw: torch.optim.RMSprop(ps, lr=1e-3, **kw)) if torch else None),
        ("Adagrad", 20, lambda: refopt.Adagrad(learning_rate=1e-2, backend="cpu"),
         (lambda ps, **kw: torch.optim.Adagrad(ps, lr=1e-2, **kw)) if torch else None),
    ]
    # The rest of the catalogue, as each lands: (class name, bytes per float32 element moved by
    # one step: 4 read + 4 written per parameter and slot, 4 read for the gradient; refopt
    # keywords; torch.optim class name or None; torch keywords)
    more = [
        ("Adamax", 28, {}, "Adamax", {}),
        ("Adadelta", 28, {"learning_rate": 1.0}, "Adadelta", {"lr": 1.0}),
        ("Nadam", 28, {}, "NAdam", {}),
        ("Lion", 20, {"learning_rate": 1e-4}, None, {}),
        ("RAdam", 28, {"convention": "torch"}, "RAdam", {}),
        ("ASGD", 20, {"convention": "torch"}, "ASGD", {}),
        ("Rprop", 28, {"convention": "torch"}, "Rprop", {}),
        ("Ftrl", 28, {}, None, {}),
        # Lamb is two passes with the trust-ratio norms between them (its in-place step):
        # read g, m, v, write m, v and the direction u (24); the norms read w, u (8, each a
        # serial sum in Keras 3's order, on two threads); the step reads w, u, writes w (12)
        ("Lamb", 44, {"convention": "keras3"}, None, {}),
        # on a vector Adafactor keeps one unfactored second moment; its in-place step is two
        # passes with two norms between them: read g, v, write v and the direction u (16);
        # the norms read w, u (8, each serial in PyTorch's order, on two threads); the
        # step reads w, u, writes w (12)
        ("Adafactor", 36, {"convention": "torch"}, "Adafactor", {}),
    ]
    for name, nbytes, kwargs, tname, tkwargs in more:
        cls = getattr(refopt, name, None)
        if cls is None:
            continue
        tcls = getattr(torch.optim, tname, None) if (torch and tname) else None
        out.append((name, nbytes,
                    lambda cls=cls, kwargs=kwargs: cls(backend="cpu", **kwargs),
                    (lambda ps, tcls=tcls, tkwargs=tkwargs, **kw: tcls(ps, **tkwargs, **kw))
                    if tcls is not None else None))
    # the staged step (new arrays, committed at the end): the phased optimizers' path before
    # their in-place step, and still with clipping or EMA
    for name, nbytes, kwargs in (("Lamb", 44, {"convention": "keras3"}),
                                 ("Adafactor", 36, {"convention": "torch"})):
        cls = getattr(refopt, name, None)
        if cls is None:
            continue

        def staged(cls=cls, kwargs=kwargs):
            opt = cls(backend="cpu", **kwargs)
            opt._in_place_step = None  # the CPU executor's hook then passes it by
            return opt

        out.append((f"{name} (staged step)", nbytes, staged, None))
    return out


def bench_catalogue(n, only=None):
    print(f"\n## The dense optimizers at n = {n:.0e}, float32, backend='cpu' (median ms; same "
          "run): against the bandwidth ceiling for their bytes per element, and torch's default "
          "(single-tensor, foreach=False) and fused steps\n")
    head = ("| optimizer | bytes/elem | cpu ms | ceiling ms (same bytes) | cpu/ceiling | torch "
            "default ms | torch fused ms | cpu speed-up vs torch default | vs fused |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    rng = np.random.default_rng(5)
    g = rng.standard_normal(n, dtype=np.float32)
    a = rng.standard_normal(n, dtype=np.float32)
    s = np.float32(1e-6)
    for label, nbytes, make, make_torch in _catalogue():
        if only and not any(o.lower() in label.lower() for o in only):
            continue
        w = rng.standard_normal(n, dtype=np.float32)
        opt = make()
        pairs = [(g, w)]
        opt.apply_gradients(pairs)  # build and compile outside the timing
        fns = [lambda: launch(_axpy_inplace, (a, g, s), n),
               lambda opt=opt, pairs=pairs: opt.apply_gradients(pairs)]
        names = ["ceiling", "cpu"]
        if make_torch is not None:
            for kw, name in ((dict(foreach=False), "default"), (dict(fused=True), "fused")):
                p = torch.from_numpy(rng.standard_normal(n, dtype=np.float32)).requires_grad_()
                p.grad = torch.from_numpy(g)
                try:
                    topt = make_torch([p], **kw)
                    topt.step()
                except (RuntimeError, TypeError, ValueError):  # no fused form
                    continue
                fns.append(topt.step)
                names.append(name)
        t = {k: v for k, (v, _) in zip(names, interleaved(fns, 10))}
        ceil = t["ceiling"] * nbytes / 12  # the ceiling's pass moves 12 bytes per element
        cells = [label, str(nbytes), fmt_ms(t["cpu"]), fmt_ms(ceil), f"{t['cpu'] / ceil:5.2f}",
                 fmt_ms(t["default"]) if "default" in t else "-",
                 fmt_ms(t["fused"]) if "fused" in t else "-",
                 f"{t['default'] / t['cpu']:5.2f}x" if "default" in t else "-",
                 f"{t['fused'] / t['cpu']:5.2f}x" if "fused" in t else "-"]
        print("| " + " | ".join(cells) + " |")
        fns = opt = w = None
        gc.collect()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument("--dense-only", metavar="N", type=float, nargs="+",
                        help="only the dense Adam table, at these sizes (e.g. 1e4 1e5 1e6)")
    parser.add_argument("--catalogue-only", metavar="N", type=float,
                        help="only the dense optimizers' table, at this size (e.g. 1e7)")
    parser.add_argument("--only", metavar="NAME", nargs="+",
                        help="with --catalogue-only: the rows whose label contains one of "
                             "these (e.g. Lamb Adafactor)")
    args = parser.parse_args(argv)
    print(f"# refopt {refopt.__version__} CPU benchmark: numba {numba.__version__} "
          f"({numba.config.THREADING_LAYER} layer, {numba.get_num_threads()} threads), "
          f"numpy {np.__version__}, torch "
          f"{torch.__version__ + f' ({torch.get_num_threads()} threads)' if torch else 'absent'}"
          f", {os.cpu_count()} CPUs")
    if args.dense_only:
        bench_dense([int(n) for n in args.dense_only], 0)
        return
    if args.catalogue_only:
        bench_catalogue(int(args.catalogue_only), args.only)
        return
    if args.quick:
        bench_dense([10**5, 10**6], 10**6)
        bench_lazy([10**4, 10**5], 4096, 64)
        bench_small(50, 2000)
        bench_conventions(10**6)
        bench_catalogue(10**6)
    else:
        bench_dense([10**5, 10**6, 10**7, 3 * 10**7], 3 * 10**7)
        bench_lazy([10**5, 10**6, 4 * 10**6], 16384, 64)
        bench_small(500, 2000)
        bench_conventions(10**7)
        bench_catalogue(10**7)
    bench_first_step()


if __name__ == "__main__":
    main()
