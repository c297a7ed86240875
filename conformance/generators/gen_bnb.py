"""Record bitsandbytes' 8-bit optimizers on the CPU (golden data for refopt's 8-bit state).

Run from the repository root in an environment made from ``requirements-bnb.txt``::

    python conformance/generators/gen_bnb.py

Writes ``conformance/bnb/<case>.npz``, one file per case, each holding:

- ``config``: a JSON string with the optimizer, its keywords, the library versions, the CPU
  capability torch dispatches to and whether MKL is on;
- ``qmap1``, ``qmap2``: bitsandbytes' own quantization maps, as its optimizer stores them
  (``create_dynamic_map(signed=True)`` and ``signed=False``), float32;
- ``param0`` (the starting parameter), ``grad/<t>`` (the gradient of step ``t``, 1-based);
- after each step ``t``: ``param/<t>``, ``state1/<t>``, ``state2/<t>`` (uint8 codes on the
  8-bit path, float32 on the 32-bit path for tensors under ``min_8bit_size``),
  ``absmax1/<t>``, ``absmax2/<t>`` (float32, one per block of 256, 8-bit path only).

Nothing here imports refopt: the values are bitsandbytes', never refopt's. The inputs are
drawn with NumPy (``default_rng(seed)``) with gradients spanning several decades, so that the
blocks' absolute maxima differ and small values land in the dynamic map's fine region.
"""

from __future__ import annotations

import json
import os
import platform

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "bnb")

#: (case id, optimizer class name, keywords, number of elements, steps, seed)
CASES = [
    ("adam8bit_f32", "Adam8bit", {"lr": 1e-3}, 5000, 6, 0),
    ("adam8bit_opts_f32", "Adam8bit", {"lr": 2e-2, "betas": (0.8, 0.99), "eps": 1e-6,
                                       "weight_decay": 0.1}, 4352, 5, 1),
    ("adamw8bit_f32", "AdamW8bit", {"lr": 1e-2}, 4096, 5, 2),
    ("adam8bit_small_f32", "Adam8bit", {"lr": 1e-2, "weight_decay": 0.05}, 1000, 5, 3),
    ("lion8bit_f32", "Lion8bit", {"lr": 1e-3}, 4500, 6, 4),
    ("lion8bit_opts_f32", "Lion8bit", {"lr": 3e-3, "betas": (0.95, 0.98),
                                       "weight_decay": 0.5}, 4096, 5, 5),
    # non-finite gradients (see _NONFINITE); min_8bit_size lowered to keep them small
    ("adam8bit_nonfinite_f32", "Adam8bit", {"lr": 1e-2, "min_8bit_size": 256}, 1024, 5, 6),
    ("lion8bit_nonfinite_f32", "Lion8bit", {"lr": 1e-2, "weight_decay": 0.1,
                                            "min_8bit_size": 256}, 1024, 5, 7),
    ("adam8bit_nonfinite_small_f32", "Adam8bit", {"lr": 1e-2}, 300, 4, 8),
    ("lion8bit_nonfinite_small_f32", "Lion8bit", {"lr": 1e-2, "weight_decay": 0.1}, 300, 4, 9),
]


def _nonfinite_8bit(grads):
    """Four blocks of 256: NaN first and last in block 0 (on different steps), a gradient
    whose square overflows (v infinite, m finite) in block 1, +inf then -inf in block 2, a
    block of NaN only in block 3."""
    grads[1][0] = np.nan
    grads[1][512 + 5] = np.inf
    grads[2][255] = np.nan
    grads[2][256 + 10] = 1e25
    grads[2][600] = -np.inf
    grads[2][768:] = np.nan


def _nonfinite_32bit(grads):
    """Under min_8bit_size (float32 moments): NaN, +inf, an overflowing square, -inf."""
    grads[1][0] = np.nan
    grads[1][5] = np.inf
    grads[2][10] = 1e25
    grads[2][11] = -np.inf
    grads[2][299] = np.nan


_NONFINITE = {
    "adam8bit_nonfinite_f32": _nonfinite_8bit, "lion8bit_nonfinite_f32": _nonfinite_8bit,
    "adam8bit_nonfinite_small_f32": _nonfinite_32bit,
    "lion8bit_nonfinite_small_f32": _nonfinite_32bit,
}


def _inputs(n, steps, seed):
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(n).astype(np.float32)
    scales = 10.0 ** rng.uniform(-4, 1, size=n)
    grads = [(rng.standard_normal(n) * scales).astype(np.float32) for _ in range(steps)]
    grads[1][: n // 7] = 0.0  # a run of zero gradients (blocks whose moment decays only)
    return p0, grads


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="record only cases whose id contains this")
    only = ap.parse_args(argv).only
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import bitsandbytes as bnb
    import torch

    torch.set_num_threads(1)
    os.makedirs(OUT, exist_ok=True)
    for case_id, cls_name, kw, n, steps, seed in CASES:
        if only is not None and only not in case_id:
            continue
        p0, grads = _inputs(n, steps, seed)
        if case_id in _NONFINITE:
            _NONFINITE[case_id](grads)
        p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
        opt = getattr(bnb.optim, cls_name)([p], **kw)
        out = {"param0": p0}
        for t, g in enumerate(grads, start=1):
            p.grad = torch.from_numpy(g.copy())
            opt.step()
            st = opt.state[p]
            out[f"grad/{t}"] = g
            out[f"param/{t}"] = p.detach().numpy().copy()
            for key in ("state1", "state2", "absmax1", "absmax2"):
                if key in st and st[key] is not None:
                    out[f"{key}/{t}"] = st[key].numpy().copy()
            if "qmap1" in st:
                out["qmap1"] = st["qmap1"].numpy().copy()
            if "qmap2" in st:
                out["qmap2"] = st["qmap2"].numpy().copy()
        group = opt.param_groups[0]
        config = {
            "id": case_id, "optimizer": cls_name, "keywords": {k: v for k, v in kw.items()},
            "defaults": {k: group[k] for k in ("lr", "betas", "eps", "weight_decay")
                         if k in group},
            "optim_bits": opt.args.optim_bits, "min_8bit_size": opt.args.min_8bit_size,
            "block_size": 256,
            "n": n, "steps": steps, "seed": seed,
            "bitsandbytes": bnb.__version__, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl": torch.backends.mkl.is_available(), "machine": platform.machine(),
        }
        out["config"] = np.array(json.dumps(config, default=list))
        np.savez_compressed(os.path.join(OUT, f"{case_id}.npz"), **out)
        print(case_id, "8-bit" if "qmap1" in out else "32-bit", "steps", steps)


if __name__ == "__main__":
    main()
