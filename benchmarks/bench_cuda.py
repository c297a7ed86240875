"""GPU benchmark of backend="cuda" (needs an NVIDIA GPU; run by scripts/gpu_check.sh).

Bytes model (float32, one fused pass, DRAM traffic):
  dense Adam: reads p, g, m, v and writes p, m, v = 28 B/elem;
  ceiling:    a device-to-device copy (kc.copy, cudaMemcpy), 8 B/elem, in the same run;
  GB/s = bytes_model * elements / seconds; "ratio" = Adam GB/s / copy GB/s (target >= 0.8).
  torch.optim.Adam(fused=True), when torch with CUDA is present: same 28 B/elem model.
  many small tensors: one Adam(backend="cuda").apply_gradients over 500 float32 tensors of
  20,000 elements (21 multi-tensor launches of up to 24 tensors), host overhead included,
  against the same 1e7 elements as one tensor (one launch).
  lazy Adam: 4e6 x 64 table, 16384 Zipf(1.1) indices; bytes = 4*N*D (gradient rows) +
  28*U*D (U unique rows) + index arrays; the host sort and the index copies are included.
Timing: warm-up first, then one pair of cuda events around all the repeats back to back,
divided by the count (events around a single launch on an idle GPU would also count the host
launch overhead, ~0.3 ms per call through numba, comparable to the 0.65 ms kernel); torch
likewise. The lazy step and the many-small-tensor step are wall time (host work included).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _mean_ms(fn, cuda, repeats):
    """Device time per call: ``repeats`` calls queued back to back between two events."""
    fn()
    cuda.synchronize()
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return cuda.event_elapsed_time(start, end) / repeats


def many_small(cuda, rng, repeats, tensors=500, size=20_000):
    """Wall time of one optimizer step over many small tensors vs one tensor of the same size."""
    import refopt

    def run(shapes):
        ws = [cuda.to_device(rng.standard_normal(s, dtype=np.float32)) for s in shapes]
        gs = [cuda.to_device(rng.standard_normal(s, dtype=np.float32)) for s in shapes]
        opt = refopt.Adam(learning_rate=1e-4, backend="cuda")
        opt.apply_gradients(zip(gs, ws))  # build, tables, compile
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            opt.apply_gradients(zip(gs, ws))
        cuda.synchronize()
        return (time.perf_counter() - t0) / repeats * 1e3

    small = run([(size,)] * tensors)
    one = run([(size * tensors,)])
    print(f"Adam step, {tensors} x {size} float32: {small:8.3f} ms wall; one tensor of "
          f"{size * tensors}: {one:8.3f} ms wall; ratio {small / one:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=float, default=1e8)
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        raise SystemExit("bench_cuda.py needs a GPU: unset NUMBA_ENABLE_CUDASIM")
    from numba import cuda

    from refopt.kernels import cuda as kc

    n = int(args.elements)
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n, dtype=np.float32)
    p, g, m = (cuda.to_device(host) for _ in range(3))
    v = cuda.to_device(np.abs(host))
    dst = cuda.device_array(n, np.float32)
    copy_ms = _mean_ms(lambda: kc.copy(dst, p), cuda, args.repeats)
    copy_gbs = 8 * n / copy_ms / 1e6
    step = [0]

    def adam():
        step[0] += 1
        kc.adam_dense(p, g, m, v, learning_rate=1e-4, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                      step=step[0])

    adam_ms = _mean_ms(adam, cuda, args.repeats)
    adam_gbs = 28 * n / adam_ms / 1e6
    print(f"device copy      : {copy_ms:8.3f} ms  {copy_gbs:8.1f} GB/s (8 B/elem, ceiling)")
    print(f"refopt dense Adam: {adam_ms:8.3f} ms  {adam_gbs:8.1f} GB/s (28 B/elem)  "
          f"ratio to copy {adam_gbs / copy_gbs:.3f}")
    dst = None  # free the device memory (the closures above are not called again)
    try:
        import torch
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    if have_torch:
        tw = torch.from_numpy(host).cuda().requires_grad_()
        tw.grad = torch.from_numpy(host).cuda()
        opt = torch.optim.Adam([tw], lr=1e-4, fused=True)
        opt.step()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(args.repeats):
            opt.step()
        e.record()
        e.synchronize()
        tms = s.elapsed_time(e) / args.repeats
        print(f"torch fused Adam : {tms:8.3f} ms  {28 * n / tms / 1e6:8.1f} GB/s  "
              f"refopt/torch time ratio {adam_ms / tms:.3f}")
        del tw, opt
    else:
        print("torch with CUDA not present: no torch comparison")
    p = g = m = v = None
    many_small(cuda, rng, args.repeats)
    rows, width, lookups = 4_000_000, 64, 16384
    table = cuda.to_device(np.zeros((rows, width), np.float32))
    mt = cuda.to_device(np.zeros((rows, width), np.float32))
    vt = cuda.to_device(np.zeros((rows, width), np.float32))
    idx = (rng.zipf(1.1, lookups * 4) - 1)
    idx = idx[idx < rows][:lookups].astype(np.int64)
    vals = cuda.to_device(rng.standard_normal((idx.size, width), dtype=np.float32))
    uniq = np.unique(idx).size
    step = [0]

    def lazy():
        step[0] += 1
        kc.lazy_adam_rows(table, mt, vt, None, vals, idx, learning_rate=1e-3, beta_1=0.9,
                          beta_2=0.999, epsilon=1e-7, step=step[0])

    lazy()
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(args.repeats):
        lazy()
    cuda.synchronize()
    lms = (time.perf_counter() - t0) / args.repeats * 1e3
    lbytes = 4 * idx.size * width + 28 * uniq * width + 3 * 8 * idx.size
    print(f"lazy Adam        : {lms:8.3f} ms wall per step (host sort + copies included), "
          f"{idx.size} lookups, {uniq} unique rows, {lbytes / lms / 1e6:8.1f} GB/s "
          f"(model), ratio to copy {lbytes / lms / 1e6 / copy_gbs:.3f}")


if __name__ == "__main__":
    main()
