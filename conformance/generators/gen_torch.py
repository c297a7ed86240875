"""Record the golden data of the PyTorch cases (conventions "torch", "torch_fused") with torch.optim.

Run from the repository root, in the environment of ``requirements-torch.txt``::

    python conformance/generators/gen_torch.py [--only SUBSTRING]

For every case of ``cases.py`` whose convention is "torch" or "torch_fused" (``fused=True`` in its
``variant``) and whose id contains SUBSTRING:
the inputs of :func:`cases.make_inputs` are fed to the torch optimizer named by the case, one
``step()`` per recorded step, and the parameters and optimizer state after each step are written
with :func:`store.save_case` under refopt's slot names:

* Adam / AdamW: ``exp_avg`` -> ``m``, ``exp_avg_sq`` -> ``v``, ``max_exp_avg_sq`` -> ``vhat``
* SparseAdam:   ``exp_avg`` -> ``m``, ``exp_avg_sq`` -> ``v``
* SGD:          ``momentum_buffer`` -> ``m`` (torch creates it at the first step with momentum)
* RMSprop:      ``square_avg`` -> ``velocity``, ``momentum_buffer`` -> ``momentum`` (momentum > 0),
                ``grad_avg`` -> ``average_gradient`` (centered); ``rho`` is torch's ``alpha``
* Adagrad:      ``sum`` -> ``accumulator`` (dense or sparse COO gradients)
* ASGD:         ``ax`` -> ``ax``; its float32 0-d ``eta`` and ``mu`` -> ``state/eta``,
                ``state/mu`` (per parameter and step; not slots: refopt derives them)
* Rprop:        ``prev`` -> ``prev``, ``step_size`` -> ``step_size`` (torch's names kept)
* RAdam:        ``exp_avg`` -> ``m``, ``exp_avg_sq`` -> ``v`` (``decoupled_weight_decay`` by name)
* EMA:          the parameters of ``AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(d))``,
                updated after every optimizer step -> ``average``
* lr_scheduler: a case's ``lr_scheduler`` (a torch.optim.lr_scheduler class and keywords) is
                stepped after every optimizer step; the group's ``lr`` used at each step
                -> ``state/lr``. ``maximize`` and ``dampening`` pass to torch by name.

``--lr-sequences`` records ``cases.LR_SEQUENCES`` instead: the learning rates (and OneCycleLR's
momentum) of torch's schedulers, as exact Python floats, into ``conformance/lr_scheduler/torch.json``.

State is recorded as it exists after each step: a parameter that has not yet had a gradient
has no state (``None``); a parameter skipped at a step (``grad is None``) keeps its old state.

Hyperparameters use refopt/Keras names in ``cases.py``; they are translated here. A
hyperparameter the case omits takes torch's own default. ``variant`` holds extra keyword
arguments of the torch optimizer (e.g. ``fused=True``); without it the default implementation
runs (the single-tensor for-loop on CPU).
"""

from __future__ import annotations

import argparse
import inspect
import os
import platform
import sys
import warnings

import numpy as np
import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cases  # noqa: E402
import store  # noqa: E402

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                "float32": torch.float32, "float64": torch.float64}


def _from_numpy(a):
    """A torch tensor of ``a``; uint16 arrays are bfloat16 bits (cases.bfloat16_bits)."""
    a = np.asarray(a).copy()
    if a.dtype == np.uint16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_numpy(t):
    """``t`` as a NumPy array; bfloat16 as its uint16 bits (store.storage_dtype)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16).copy()
    return t.numpy().copy()

# Keras/refopt name -> torch keyword, per optimizer. "betas" is assembled from beta_1/beta_2.
_ADAM_KEYS = {"learning_rate": "lr", "epsilon": "eps", "weight_decay": "weight_decay",
              "amsgrad": "amsgrad"}
_OPTIMIZERS = {
    # refopt optimizer -> (torch class, its keyword map, takes betas)
    "Adam": (torch.optim.Adam, _ADAM_KEYS, True),
    "AdamW": (torch.optim.AdamW, _ADAM_KEYS, True),
    "LazyAdam": (torch.optim.SparseAdam, {"learning_rate": "lr", "epsilon": "eps"}, True),
    "SGD": (torch.optim.SGD, {"learning_rate": "lr", "momentum": "momentum",
                              "nesterov": "nesterov", "weight_decay": "weight_decay"}, False),
    "RMSprop": (torch.optim.RMSprop, {"learning_rate": "lr", "rho": "alpha", "epsilon": "eps",
                                      "momentum": "momentum", "centered": "centered",
                                      "weight_decay": "weight_decay"}, False),
    "RAdam": (torch.optim.RAdam, {"learning_rate": "lr", "epsilon": "eps",
                                  "weight_decay": "weight_decay",
                                  "decoupled_weight_decay": "decoupled_weight_decay"}, True),
    "Adagrad": (torch.optim.Adagrad, {"learning_rate": "lr", "epsilon": "eps",
                                      "initial_accumulator_value": "initial_accumulator_value",
                                      "lr_decay": "lr_decay", "weight_decay": "weight_decay"},
                False),
    "Adadelta": (torch.optim.Adadelta, {"learning_rate": "lr", "rho": "rho", "epsilon": "eps",
                                        "weight_decay": "weight_decay"}, False),
    "Nadam": (torch.optim.NAdam, {"learning_rate": "lr", "epsilon": "eps",
                                  "weight_decay": "weight_decay",
                                  "momentum_decay": "momentum_decay",
                                  "decoupled_weight_decay": "decoupled_weight_decay"}, True),
    "Adamax": (torch.optim.Adamax, {"learning_rate": "lr", "epsilon": "eps",
                                    "weight_decay": "weight_decay"}, True),
    # epsilon_1/epsilon_2 are assembled into eps=(eps1, eps2) in build_optimizer
    "Adafactor": (torch.optim.Adafactor, {"learning_rate": "lr", "beta_2_decay": "beta2_decay",
                                          "clip_threshold": "d",
                                          "weight_decay": "weight_decay"}, False),
    "ASGD": (torch.optim.ASGD, {"learning_rate": "lr", "lambd": "lambd", "alpha": "alpha",
                                "t0": "t0", "weight_decay": "weight_decay"}, False),
    "Rprop": (torch.optim.Rprop, {"learning_rate": "lr", "etas": "etas",
                                  "step_sizes": "step_sizes"}, False),
}
# Handled around the optimizer rather than passed to it.
_WRAPPER_KEYS = {"global_clipnorm", "clipvalue", "use_ema", "ema_momentum"}
# refopt keywords with torch's name, passed as they are (maximize: every torch optimizer;
# dampening: SGD)
_SAME_NAME = {"maximize", "dampening"}

# torch state name -> refopt slot name
_STATE_SLOTS = {"exp_avg": "m", "exp_avg_sq": "v", "max_exp_avg_sq": "vhat",
                "momentum_buffer": "m"}
# RMSprop's state under refopt's RMSprop slot names
_RMSPROP_SLOTS = {"square_avg": "velocity", "momentum_buffer": "momentum",
                  "grad_avg": "average_gradient"}
# Adagrad's state: "sum" (created in the constructor, filled with initial_accumulator_value)
_ADAGRAD_SLOTS = {"sum": "accumulator"}
# Adamax's state: "exp_avg" -> "m", "exp_inf" (the infinity norm) -> "u"
_ADAMAX_SLOTS = {"exp_avg": "m", "exp_inf": "u"}
# Adafactor's state: row_var/col_var (dim > 1, torch's keepdim shapes), variance (dim <= 1)
_ADAFACTOR_SLOTS = {"row_var": "velocity_row", "col_var": "velocity_col",
                    "variance": "velocity"}
# Adadelta's state: "square_avg" (E[g^2]) and "acc_delta" (E[dx^2])
_ADADELTA_SLOTS = {"square_avg": "accumulated_grad", "acc_delta": "accumulated_delta"}
# ASGD's average "ax" (its scalars eta and mu are recorded as state/eta, state/mu); Rprop's
# "prev" and "step_size" (refopt keeps torch's names)
_ASGD_SLOTS = {"ax": "ax"}
_RPROP_SLOTS = {"prev": "prev", "step_size": "step_size"}


def versions():
    return {"torch": torch.__version__, "numpy": np.__version__,
            "python": platform.python_version()}


def build_optimizer(case, params):
    """The torch optimizer of ``case`` over ``params``; raises on anything it cannot map."""
    hyper = dict(case["hyperparameters"])
    cls, keymap, takes_betas = _OPTIMIZERS[case["optimizer"]]
    kwargs = {}
    if takes_betas and ("beta_1" in hyper or "beta_2" in hyper):
        b1, b2 = inspect.signature(cls).parameters["betas"].default  # torch's own defaults
        kwargs["betas"] = (hyper.pop("beta_1", b1), hyper.pop("beta_2", b2))
    if cls is torch.optim.Adafactor and ("epsilon_1" in hyper or "epsilon_2" in hyper):
        e1, e2 = inspect.signature(cls).parameters["eps"].default  # torch's (None, 1e-3)
        kwargs["eps"] = (hyper.pop("epsilon_1", e1), hyper.pop("epsilon_2", e2))
    for key in list(hyper):
        if key in _WRAPPER_KEYS:
            continue
        if key not in keymap and key not in _SAME_NAME:
            raise ValueError(f"{case['id']}: hyperparameter {key!r} has no {cls.__name__} mapping")
        value = hyper[key]
        if key == "learning_rate" and not isinstance(value, (int, float)):
            raise ValueError(f"{case['id']}: learning-rate schedules are not mapped for torch")
        kwargs[keymap.get(key, key)] = value
    kwargs.update(case["variant"])
    return cls(params, **kwargs)


def to_torch_grad(g, shape, dtype):
    if g is None:
        return None
    if isinstance(g, tuple):  # ("sparse", indices, values) -> uncoalesced COO, as nn.Embedding
        _, idx, values = g
        return torch.sparse_coo_tensor(torch.from_numpy(np.asarray(idx, np.int64)[None].copy()),
                                       _from_numpy(values),
                                       tuple(shape), dtype=dtype)
    return _from_numpy(g)


def run_loss_scale_case(case):
    """A LossScaleOptimizer case: ``torch.amp.GradScaler`` around the inner optimizer, one
    ``scaler.step(opt); scaler.update()`` per step on the recorded (scaled) gradients; the
    scale and growth tracker per step go to ``state/loss_scale``, ``state/counter``."""
    from torch.amp import GradScaler

    hyper = case["hyperparameters"]
    dtype = TORCH_DTYPES[case["dtype"]]
    inner_case = dict(case, optimizer=hyper["inner_optimizer"]["class_name"],
                      hyperparameters=hyper["inner_optimizer"]["config"])
    init, grads = cases.make_inputs(case)
    params = [torch.nn.Parameter(_from_numpy(a)) for a in init]
    optimizer = build_optimizer(inner_case, params)
    scaler = GradScaler("cpu", init_scale=hyper["initial_scale"],
                        growth_interval=hyper["dynamic_growth_steps"])
    recorded, slots, state = [], {}, {}
    for row in grads:
        for p, g in zip(params, row):
            p.grad = to_torch_grad(g, p.shape, dtype)
        scaler.scale(torch.ones((), dtype=dtype))  # creates the scale, as scaler.scale(loss)
        scaler.step(optimizer)
        scaler.update()
        recorded.append([p.detach().numpy().copy() for p in params])
        per_slot = {}
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                if key in _STATE_SLOTS and isinstance(value, torch.Tensor):
                    per_slot.setdefault(_STATE_SLOTS[key], [None] * len(params))[i] = (
                        value.detach().numpy().copy())
        for name in set(slots) | set(per_slot):
            slots.setdefault(name, [[None] * len(params)] * (len(recorded) - 1)).append(
                per_slot.get(name, [None] * len(params)))
        state.setdefault("loss_scale", []).append(scaler._scale.detach().numpy().copy())
        state.setdefault("counter", []).append(
            np.array(int(scaler._growth_tracker), np.int64))
    store.save_case(case, framework="torch", versions=versions(), init=init, grads=grads,
                    params=recorded, slots=slots, state=state)
    return sorted(slots)


def run_case(case):
    if case["optimizer"] == "LossScaleOptimizer":
        return run_loss_scale_case(case)
    hyper = case["hyperparameters"]
    dtype = TORCH_DTYPES[case["dtype"]]
    init, grads = cases.make_inputs(case)
    params = [torch.nn.Parameter(_from_numpy(a)) for a in init]
    for p in params:
        assert p.dtype == dtype
    optimizer = build_optimizer(case, params)
    if isinstance(optimizer, torch.optim.SparseAdam) and len(params) != 1:
        raise ValueError("SparseAdam takes only the table (all gradients must be sparse)")
    ema = None
    if hyper.get("use_ema"):
        model = torch.nn.ParameterList(params)
        decay = {"decay": hyper["ema_momentum"]} if "ema_momentum" in hyper else {}
        if decay.get("decay", 0.0) is None:  # AveragedModel's default equal-weight average
            ema = AveragedModel(model)
        else:
            ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(**decay))
    scheduler = None
    if case.get("lr_scheduler"):  # stepped after every optimizer step; lr of each step kept
        scheduler = build_scheduler(optimizer, case["lr_scheduler"])
    sparse_expected = isinstance(optimizer, torch.optim.SparseAdam)
    # Adagrad and SGD take dense and sparse gradients
    either = isinstance(optimizer, (torch.optim.Adagrad, torch.optim.SGD))

    recorded_params = []
    state = {}  # optimizer state that is not a slot (NAdam's mu_product)
    state_slots = {"RMSprop": _RMSPROP_SLOTS, "Adagrad": _ADAGRAD_SLOTS,
                   "Adamax": _ADAMAX_SLOTS, "Adadelta": _ADADELTA_SLOTS,
                   "Adafactor": _ADAFACTOR_SLOTS,
                   "ASGD": _ASGD_SLOTS, "Rprop": _RPROP_SLOTS}.get(
        case["optimizer"], _STATE_SLOTS)
    slots = {name: [] for name in (*sorted(set(state_slots.values())), "average")}
    for row in grads:
        for p, g in zip(params, row):
            if isinstance(g, tuple) != sparse_expected and g is not None and not either:
                raise ValueError(f"{case['id']}: gradient kind does not fit {type(optimizer)}")
            p.grad = to_torch_grad(g, p.shape, dtype)
        if "global_clipnorm" in hyper:
            torch.nn.utils.clip_grad_norm_(params, hyper["global_clipnorm"])
        if "clipvalue" in hyper:
            torch.nn.utils.clip_grad_value_(params, hyper["clipvalue"])
        if scheduler is not None:
            state.setdefault("lr", []).append(np.float64(optimizer.param_groups[0]["lr"]))
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        if ema is not None:
            ema.update_parameters(model)

        recorded_params.append([_to_numpy(p) for p in params])
        per_slot = {name: [None] * len(params) for name in slots}
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                if key in state_slots and isinstance(value, torch.Tensor):
                    # SGD's sparse momentum buffer (sparse gradients): its torch.to_dense()
                    per_slot[state_slots[key]][i] = _to_numpy(
                        value.to_dense() if value.is_sparse else value)
        if ema is not None:
            for i, a in enumerate(ema.module.parameters()):
                per_slot["average"][i] = _to_numpy(a)
        for name in slots:
            slots[name].append(per_slot[name])
        if case["optimizer"] == "Nadam":  # NAdam's per-parameter scalar mu_product
            state.setdefault("mu_product", []).append(
                [optimizer.state[p]["mu_product"].detach().numpy().copy()
                 if "mu_product" in optimizer.state.get(p, {}) else None for p in params])
        if case["optimizer"] == "SGD":  # the sparse momentum buffer as torch keeps it (issue 14)
            bufs = [optimizer.state.get(p, {}).get("momentum_buffer") for p in params]
            if any(b is not None and b.is_sparse for b in bufs):
                for key, part in (("sparse_m_indices", lambda b: b._indices()[0]),
                                  ("sparse_m_values", lambda b: b._values())):
                    state.setdefault(key, []).append(
                        [_to_numpy(part(b)) if b is not None and b.is_sparse else None
                         for b in bufs])
        if case["optimizer"] == "ASGD":  # ASGD's per-parameter scalars (float32 0-d tensors)
            for key in ("eta", "mu"):
                state.setdefault(key, []).append(
                    [optimizer.state[p][key].detach().numpy().copy()
                     if key in optimizer.state.get(p, {}) else None for p in params])
    slots = {n: rows for n, rows in slots.items()
             if any(s is not None for r in rows for s in r)}
    store.save_case(case, framework="torch", versions=versions(), init=init, grads=grads,
                    params=recorded_params, slots=slots, **({"state": state} if state else {}))
    return sorted(slots)


def build_scheduler(optimizer, spec):
    """torch.optim.lr_scheduler's ``spec["class_name"]`` on ``optimizer`` (nested schedulers
    of SequentialLR / ChainedScheduler built first, in order)."""
    cls = getattr(torch.optim.lr_scheduler, spec["class_name"], None) or getattr(
        torch.optim.swa_utils, spec["class_name"])
    kwargs = dict(spec["config"])
    if "schedulers" in kwargs:
        kwargs["schedulers"] = [build_scheduler(optimizer, s) for s in kwargs["schedulers"]]
    if cls is torch.optim.lr_scheduler.ChainedScheduler:
        return cls(optimizer=optimizer, **kwargs)
    return cls(optimizer, **kwargs)


def record_lr_sequences(only=""):
    """Write ``conformance/lr_scheduler/torch.json``: for each of ``cases.LR_SEQUENCES`` the
    learning rate (and momentum / beta1) of the group after construction and after every
    ``scheduler.step()``, as Python floats (JSON keeps every bit)."""
    import json

    out = []
    for seq in cases.LR_SEQUENCES:
        if only not in seq["id"]:
            continue
        name, kw = seq.get("optimizer", ("SGD", {}))
        p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
        opt = getattr(torch.optim, name)([p], lr=seq["lr"], **kw)
        sched = build_scheduler(opt, seq["scheduler"])

        def momentum(opt):
            g = opt.param_groups[0]
            return g["betas"][0] if "betas" in g else g.get("momentum")

        lrs, moms = [sched.get_last_lr()[0]], [momentum(opt)]
        for k in range(seq["steps"]):
            p.grad = torch.zeros_like(p)
            opt.step()
            if "metrics" in seq:
                sched.step(seq["metrics"][k])
            else:
                sched.step()
            lrs.append(sched.get_last_lr()[0])
            moms.append(momentum(opt))
        assert all(type(x) is float for x in lrs), seq["id"]
        out.append(dict(seq, lrs=lrs, momentum=moms, framework_version=versions()))
        print(f"recorded lr sequence {seq['id']}")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.makedirs(os.path.join(root, "lr_scheduler"), exist_ok=True)
    path = os.path.join(root, "lr_scheduler", "torch.json")
    if only and os.path.exists(path):
        with open(path) as f:
            kept = [s for s in json.load(f)["sequences"] if only not in s["id"]]
        out = sorted(kept + out, key=lambda s: [x["id"] for x in cases.LR_SEQUENCES].index(
            s["id"]))
    with open(path, "w") as f:
        json.dump({"format": 1, "sequences": out}, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="record only cases whose id contains this")
    parser.add_argument("--lr-sequences", action="store_true",
                        help="record cases.LR_SEQUENCES into conformance/lr_scheduler/torch.json")
    args = parser.parse_args(argv)
    if args.lr_sequences:
        return record_lr_sequences(args.only)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    todo = [c for c in cases.cases_for({cases.TORCH, cases.TORCH_FUSED})
            if args.only in c["id"]]
    if not todo:
        sys.exit(f"no torch case matches {args.only!r}")
    failed = []
    for case in todo:
        try:
            names = run_case(case)
        except Exception as exc:  # report, go on with the others
            failed.append(case["id"])
            print(f"SKIPPED {case['id']}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"recorded {case['id']}  slots={names}")
    print(f"torch {torch.__version__}: {len(todo) - len(failed)} recorded, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
