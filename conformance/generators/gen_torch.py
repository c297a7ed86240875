"""Record the golden data of the PyTorch cases (convention "torch") with the real torch.optim.

Run from the repository root, in the environment of ``requirements-torch.txt``::

    python conformance/generators/gen_torch.py [--only SUBSTRING]

For every case of ``cases.py`` whose convention is "torch" (and whose id contains SUBSTRING):
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

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}

# Keras/refopt name -> torch keyword, per optimizer. "betas" is assembled from beta_1/beta_2.
_ADAM_KEYS = {"learning_rate": "lr", "epsilon": "eps", "weight_decay": "weight_decay",
              "amsgrad": "amsgrad"}
_OPTIMIZERS = {
    # refopt optimizer -> (torch class, its keyword map, takes betas)
    "Adam": (torch.optim.Adam, _ADAM_KEYS, True),
    "AdamW": (torch.optim.AdamW, _ADAM_KEYS, True),
    "LazyAdam": (torch.optim.SparseAdam, {"learning_rate": "lr", "epsilon": "eps"}, True),
    "SGD": (torch.optim.SGD, {"learning_rate": "lr", "momentum": "momentum",
                              "nesterov": "nesterov"}, False),
    "RMSprop": (torch.optim.RMSprop, {"learning_rate": "lr", "rho": "alpha", "epsilon": "eps",
                                      "momentum": "momentum", "centered": "centered"}, False),
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
        if key not in keymap:
            raise ValueError(f"{case['id']}: hyperparameter {key!r} has no {cls.__name__} mapping")
        value = hyper[key]
        if key == "learning_rate" and not isinstance(value, (int, float)):
            raise ValueError(f"{case['id']}: learning-rate schedules are not mapped for torch")
        kwargs[keymap[key]] = value
    kwargs.update(case["variant"])
    return cls(params, **kwargs)


def to_torch_grad(g, shape, dtype):
    if g is None:
        return None
    if isinstance(g, tuple):  # ("sparse", indices, values) -> uncoalesced COO, as nn.Embedding
        _, idx, values = g
        return torch.sparse_coo_tensor(torch.from_numpy(np.asarray(idx, np.int64)[None].copy()),
                                       torch.from_numpy(np.asarray(values).copy()),
                                       tuple(shape), dtype=dtype)
    return torch.from_numpy(np.asarray(g).copy())


def run_case(case):
    hyper = case["hyperparameters"]
    dtype = TORCH_DTYPES[case["dtype"]]
    init, grads = cases.make_inputs(case)
    params = [torch.nn.Parameter(torch.from_numpy(np.asarray(a).copy())) for a in init]
    for p in params:
        assert p.dtype == dtype
    optimizer = build_optimizer(case, params)
    if isinstance(optimizer, torch.optim.SparseAdam) and len(params) != 1:
        raise ValueError("SparseAdam takes only the table (all gradients must be sparse)")
    ema = None
    if hyper.get("use_ema"):
        model = torch.nn.ParameterList(params)
        decay = {"decay": hyper["ema_momentum"]} if "ema_momentum" in hyper else {}
        ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(**decay))
    sparse_expected = isinstance(optimizer, torch.optim.SparseAdam)
    either = isinstance(optimizer, torch.optim.Adagrad)  # takes dense and sparse gradients

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
        optimizer.step()
        if ema is not None:
            ema.update_parameters(model)

        recorded_params.append([p.detach().numpy().copy() for p in params])
        per_slot = {name: [None] * len(params) for name in slots}
        for i, p in enumerate(params):
            for key, value in optimizer.state.get(p, {}).items():
                if key in state_slots and isinstance(value, torch.Tensor):
                    per_slot[state_slots[key]][i] = value.detach().numpy().copy()
        if ema is not None:
            for i, a in enumerate(ema.module.parameters()):
                per_slot["average"][i] = a.detach().numpy().copy()
        for name in slots:
            slots[name].append(per_slot[name])
        if case["optimizer"] == "Nadam":  # NAdam's per-parameter scalar mu_product
            state.setdefault("mu_product", []).append(
                [optimizer.state[p]["mu_product"].detach().numpy().copy()
                 if "mu_product" in optimizer.state.get(p, {}) else None for p in params])
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="record only cases whose id contains this")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Sparse invariant checks")
    todo = [c for c in cases.cases_for({cases.TORCH}) if args.only in c["id"]]
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
