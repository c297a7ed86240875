"""Record the golden data of the FBGEMM cases (convention "fbgemm") with the real fbgemm_gpu.

Run from the repository root, in the environment of ``requirements-fbgemm.txt``::

    python conformance/generators/gen_fbgemm.py [--only SUBSTRING]

For every case of ``cases.py`` whose convention is "fbgemm" (and whose id contains
SUBSTRING): each variable is one table of its own ``SplitTableBatchedEmbeddingBagsCodegen``
(FBGEMM's table-batched embedding, ``EmbeddingLocation.HOST``/``ComputeDevice.CPU``,
float32 weights, ``PoolingMode.NONE``: one output row per looked-up index, the backward of
TorchRec's ``EmbeddingCollection``). One step = a forward on the step's indices and a
backward with the step's gradient rows as the output gradient, which runs FBGEMM's fused
optimizer. An ``IndexedSlices`` gradient is its indices and rows as given (duplicates
included: FBGEMM coalesces them itself); a dense gradient is every row once, in order; an
empty gradient is no lookup at all (nothing moves). Recorded after each step: the weights
(``split_embedding_weights()``) and ``momentum1`` (``split_optimizer_states()``) ->
``accumulator``.

Hyperparameters use refopt's names (``epsilon`` -> ``eps``, ``weight_decay_mode`` ->
``WeightDecayMode``); omitted ones take FBGEMM's defaults (lr 0.01, eps 1e-8).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys

import numpy as np

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import fbgemm_gpu
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from fbgemm_gpu.tbe.config.optimizer_config import WeightDecayMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases
import store

_MODES = {"none": WeightDecayMode.NONE, "l2": WeightDecayMode.L2,
          "decoupled": WeightDecayMode.DECOUPLE}


def versions():
    return {"fbgemm_gpu": fbgemm_gpu.__version__, "torch": torch.__version__,
            "numpy": np.__version__, "python": platform.python_version()}


#: refopt's optimizer -> (FBGEMM's EmbOptimType, refopt's slot names in the order of
#: ``split_optimizer_states()``)
_OPTIMIZERS = {"RowWiseAdagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, ("accumulator",)),
               "PartialRowWiseAdam": (EmbOptimType.PARTIAL_ROWWISE_ADAM, ("m", "v"))}


def build_table(case, init):
    """One ``SplitTableBatchedEmbeddingBagsCodegen`` holding ``init``.

    ``PartialRowWiseAdam`` (``PARTIAL_ROWWISE_ADAM``) has no CPU kernel in FBGEMM
    (fbgemm-gpu-cpu 1.8 asserts "Optimizer partial_row_wise_adam is not supported in CPU
    mode"): its table is built with ``EmbeddingLocation.DEVICE``/``ComputeDevice.CUDA``,
    which needs FBGEMM's CUDA build (``fbgemm-gpu``, not ``fbgemm-gpu-cpu``), a GPU, and
    ``CUDA_VISIBLE_DEVICES`` set when this script runs (it defaults to hiding the GPUs).
    No such case is in ``cases.py`` yet: this branch has never run (no CUDA build here).
    Hyperparameters: ``beta_1`` -> ``beta1``, ``beta_2`` -> ``beta2``, ``epsilon`` -> ``eps``,
    ``weight_decay`` (no mode: FBGEMM's rule has none); slots ``momentum1`` -> ``m`` and
    ``momentum2`` -> ``v``.
    """
    if case["optimizer"] not in _OPTIMIZERS:
        raise NotImplementedError(case["optimizer"])
    partial = case["optimizer"] == "PartialRowWiseAdam"
    h = dict(case["hyperparameters"])
    kw = dict(optimizer=_OPTIMIZERS[case["optimizer"]][0])
    for ours, theirs in (("beta_1", "beta1"), ("beta_2", "beta2")):
        if partial and ours in h:
            kw[theirs] = h.pop(ours)
    if "learning_rate" in h:
        kw["learning_rate"] = h.pop("learning_rate")
    if "epsilon" in h:
        kw["eps"] = h.pop("epsilon")
    if "weight_decay" in h:
        kw["weight_decay"] = h.pop("weight_decay")
    if "weight_decay_mode" in h and not partial:
        kw["weight_decay_mode"] = _MODES[h.pop("weight_decay_mode")]
    if h:
        raise NotImplementedError(f"hyperparameters {sorted(h)}")
    if case["dtype"] != "float32":
        raise NotImplementedError("FBGEMM tables are recorded in float32 only")
    V, D = init.shape
    where = ((EmbeddingLocation.DEVICE, ComputeDevice.CUDA) if partial  # no CPU kernel
             else (EmbeddingLocation.HOST, ComputeDevice.CPU))
    emb = SplitTableBatchedEmbeddingBagsCodegen(
        [(V, D) + where], pooling_mode=PoolingMode.NONE,
        weights_precision=SparseType.FP32, **kw)
    with torch.no_grad():
        emb.split_embedding_weights()[0].copy_(torch.from_numpy(init))
    return emb


def step(emb, indices, values):
    n = len(indices)
    if n == 0:
        if emb.optimizer == EmbOptimType.PARTIAL_ROWWISE_ADAM:
            # FBGEMM's ``iter`` (the bias corrections' t) advances at every forward, and
            # refopt's step count at every empty gradient: an empty step would need a
            # forward/backward of an empty batch, not written (nothing to check it on)
            raise NotImplementedError("an empty gradient under PARTIAL_ROWWISE_ADAM")
        return  # no lookup: FBGEMM's backward never runs
    dev = emb.current_device  # the GPU for PARTIAL_ROWWISE_ADAM's CUDA-only table
    out = emb(torch.as_tensor(indices, dtype=torch.int64, device=dev),
              torch.arange(n + 1, dtype=torch.int64, device=dev))
    out.backward(torch.from_numpy(np.ascontiguousarray(values)).to(dev).reshape(out.shape))


def run_case(case):
    init, grads = cases.make_inputs(case)
    tables = [build_table(case, a) for a in init]
    names = _OPTIMIZERS[case["optimizer"]][1]
    params, states = [], {name: [] for name in names}
    for row in grads:
        for emb, a, g in zip(tables, init, row):
            if isinstance(g, tuple):
                step(emb, g[1], g[2])
            elif g is not None:
                step(emb, np.arange(a.shape[0]), g)
        params.append([e.split_embedding_weights()[0].detach().cpu().numpy().copy()
                       for e in tables])
        for k, name in enumerate(names):  # momentum1 (, momentum2)
            states[name].append([e.split_optimizer_states()[0][k].detach().cpu().numpy().copy()
                                 for e in tables])
    store.save_case(case, framework="fbgemm_gpu", versions=versions(), init=init, grads=grads,
                    params=params, slots=states)
    return list(names)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="record only cases whose id contains this")
    args = parser.parse_args(argv)
    todo = [c for c in cases.cases_for({cases.FBGEMM}) if args.only in c["id"]]
    if not todo:
        sys.exit(f"no fbgemm case matches {args.only!r}")
    torch.set_num_threads(1)
    failed = []
    for case in todo:
        try:
            names = run_case(case)
        except Exception as exc:  # report, go on with the others
            failed.append(case["id"])
            print(f"SKIPPED {case['id']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"recorded {case['id']}  slots={names}")
    print(f"fbgemm_gpu {fbgemm_gpu.__version__}: {len(todo) - len(failed)} recorded, "
          f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
