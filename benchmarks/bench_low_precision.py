"""Same-run ratios: float16/bfloat16 Adam on backend="cpu" (issue #17 item 1).

Adam under ``"torch_fused"`` (torch's fused kernel: float16/bfloat16 computed in float32,
rounded once per stored tensor) on one variable of ``n`` elements, timed in one process,
interleaved, best of ``--repeats``:

- float32 on the fused kernel (the reference point);
- float16 and bfloat16 on the fused low-precision kernel (uint16 bits, float32 compute);
- float16 and bfloat16 on the staged step (what ``backend="cpu"`` ran before: the fast path
  switched off in this process only, ``refopt.executors.cpu.try_fast_step``).

    python benchmarks/bench_low_precision.py [--n 1e6] [--repeats 7]
"""

from __future__ import annotations

import argparse
import time

import ml_dtypes
import numpy as np

import refopt
from refopt.conventions import PRESETS
from refopt.executors import cpu as C

BF16 = np.dtype(ml_dtypes.bfloat16)
CONVENTION = "torch_fused" if "torch_fused" in PRESETS else "torch"


def setup(dtype, n):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(n).astype(np.float32).astype(dtype)
    g = (rng.standard_normal(n) * 0.1).astype(np.float32).astype(dtype)
    opt = refopt.Adam(learning_rate=1e-3, convention=CONVENTION, backend="cpu")
    for _ in range(2):  # build, compile (or load) the kernels
        opt.apply_gradients([(g, w)])
    return opt, w, g


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=float, default=1e6)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--steps", type=int, default=5, help="steps per timing")
    args = ap.parse_args(argv)
    n = int(args.n)
    runs = {"float32 fused": (np.float32, True), "float16 fused": (np.float16, True),
            "bfloat16 fused": (BF16, True), "float16 staged": (np.float16, False),
            "bfloat16 staged": (BF16, False)}
    fast = C.try_fast_step

    def off(*a, **k):
        return False

    state = {}
    best = dict.fromkeys(runs, float("inf"))
    try:
        for name, (dtype, on) in runs.items():
            C.try_fast_step = fast if on else off
            state[name] = setup(dtype, n)
        for _ in range(args.repeats):
            for name, (_, on) in runs.items():
                C.try_fast_step = fast if on else off
                opt, w, g = state[name]
                t = time.perf_counter()
                for _ in range(args.steps):
                    opt.apply_gradients([(g, w)])
                best[name] = min(best[name], (time.perf_counter() - t) / args.steps)
    finally:
        C.try_fast_step = fast
    ref = best["float32 fused"]
    print(f"Adam, convention={CONVENTION!r}, n={n}, best of {args.repeats} x {args.steps} steps")
    for name in runs:
        print(f"  {name:16s} {best[name] * 1e3:8.2f} ms/step   {best[name] / ref:5.2f} x float32")
    for fmt in ("float16", "bfloat16"):
        print(f"  {fmt}: staged / fused = {best[fmt + ' staged'] / best[fmt + ' fused']:.1f}")


if __name__ == "__main__":
    main()
