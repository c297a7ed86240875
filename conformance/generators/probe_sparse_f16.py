"""Measure the torch ops of ``refopt.reference.bf16_torch_more`` on float16 and bfloat16.

Run with the environment of ``requirements-torch.txt`` (torch 2.13 CPU, AVX2)::

    python conformance/generators/probe_sparse_f16.py

For each op it draws 200,000 random inputs, runs the torch op, and prints how many results
differ from each candidate float32 model (``R``: rounding to the tensor's dtype; a model
with 0 differences is the one ``bf16_torch_more`` writes), then one input where the models
disagree, with torch's result bits (the tests hold these):

- ``y.add_(sparse, alpha)`` of a dense float16 table and a sparse COO tensor (1-D and rows):
  ``c10::Half`` arithmetic, ``R(y + R(R(alpha) * x))``;
- ``coalesce`` of duplicate float16 rows: summed one at a time in order, each sum rounded;
- ``s / a`` (``Tensor.__rtruediv__``): ``R(1 / a)`` then ``* f32(s)``;
- ``a.mul_(t)`` by a float32 0-d tensor ``t``: ``a * f32(t)``, not ``a * R(t)``;
- ``a.clamp_(lo, hi)``: ``min(max(a, f32(lo)), f32(hi))`` rounded.
"""

import numpy as np
import torch

F32 = np.float32
N = 200_000


def bits(t):
    return t.view(torch.int16).numpy().astype(np.int32) & 0xFFFF


def from_f32(x, dtype):
    """float32 ``x`` rounded to ``dtype`` by torch (nearest even)."""
    return torch.from_numpy(np.asarray(x, F32)).to(dtype)


def f32(t):
    return t.float().numpy()


def report(name, got, models, inputs):
    got_bits = bits(got)
    line = {}
    first = None
    for label, model in models.items():
        diff = bits(model) != got_bits
        line[label] = int(diff.sum())
        if first is None and diff.any():
            first = int(np.argmax(diff))
    print(f"{name}: {line}")
    if first is not None:
        shown = ", ".join(f"{k}={int(bits(v.reshape(-1)[first:first + 1])[0])}"
                          for k, v in inputs.items())
        print(f"    e.g. {shown} -> torch {int(got_bits.reshape(-1)[first])}")


def main():
    rng = np.random.default_rng(0)
    half = torch.float16
    for shape in ((N,), (N // 4, 4)):
        y = from_f32(rng.standard_normal(shape) * rng.uniform(0.1, 10, shape), half)
        x = from_f32(rng.standard_normal(shape) * 1e-2, half)
        alpha = -0.0123456789
        out = y.clone()
        idx = torch.arange(shape[0]).unsqueeze(0)
        out.add_(torch.sparse_coo_tensor(idx, x, shape), alpha=alpha)
        ra = f32(from_f32(np.float32(alpha), half))
        yf, xf = f32(y), f32(x)
        report(f"dense.add_(sparse, alpha) {shape}", out, {
            "R(y+R(R(a)x))": from_f32(yf + f32(from_f32(ra * xf, half)), half),
            "fma(f32(a),x,y)": from_f32((yf.astype(np.float64) * 0 + xf.astype(np.float64)
                                         * np.float64(F32(alpha)) + yf).astype(F32), half),
            "R(y+f32(a)x)": from_f32(yf + F32(alpha) * xf, half),
        }, {"y": y, "x": x})
    ind = np.array([1, 1, 1, 3, 1, 3, 3, 1, 5, 5, 1, 1])
    vals = from_f32(rng.standard_normal((ind.size, 3)) * 100, half)
    got = torch.sparse_coo_tensor(torch.from_numpy(ind).unsqueeze(0), vals,
                                  (8, 3)).coalesce()._values()
    sums = {}
    for r, v in zip(ind, f32(vals)):
        sums[r] = v if r not in sums else f32(from_f32(sums[r] + v, half))
    report("coalesce (12 entries)", got, {
        "in order, each sum rounded": from_f32(np.stack([sums[r] for r in sorted(sums)]),
                                              half)}, {"v0": vals[0]})
    for dtype in (half, torch.bfloat16):
        a = from_f32(rng.uniform(1e-3, 1e3, N), dtype)
        b = from_f32(rng.standard_normal(N), dtype)
        s = 0.0377777777
        af, bf = f32(a), f32(b)
        report(f"{dtype} s / a", s / a, {
            "R(R(1/a) f32(s))": from_f32(f32(from_f32(F32(1) / af, dtype)) * F32(s), dtype),
            "R(f32(s) / a)": from_f32(F32(s) / af, dtype)}, {"a": a})
        t = torch.tensor(1 / 3, dtype=torch.float32)
        report(f"{dtype} a.mul_(float32 0-d)", b.clone().mul_(t), {
            "R(a f32(t))": from_f32(bf * F32(1 / 3), dtype),
            "R(a R(t))": from_f32(bf * f32(from_f32(F32(1 / 3), dtype)), dtype)}, {"a": b})
        report(f"{dtype} a * b, a / b, a - b", torch.cat([a * b, b / a, a - b]), {
            "R(f32 op)": from_f32(np.concatenate([af * bf, bf / af, af - bf]), dtype)},
            {"a": a})
        lo, hi = 1.000001e-2, 0.3333333
        c = from_f32(rng.uniform(0, 0.5, N), dtype)
        report(f"{dtype} clamp_", c.clone().clamp_(lo, hi), {
            "R(clamp f32)": from_f32(np.clip(f32(c), F32(lo), F32(hi)), dtype)}, {"a": c})


if __name__ == "__main__":
    main()
