"""The executor of ``backend="reference"``: plain NumPy, one array per variable and slot.

A step is the staged step (:func:`refopt.executors.staged.compute`: every result into new
arrays) and then its commit, so a step that raises changes nothing.
"""

from __future__ import annotations

import numpy as np

from refopt import precision as _precision
from refopt.executors import Executor, staged
from refopt.executors.checks import check_host_pairs, check_host_variable, describe

__all__ = ["ReferenceExecutor", "HostState", "check_var_list"]


def check_var_list(var_list, what):
    """``var_list`` as a list of valid host variables, each once (TypeError, ValueError)."""
    if isinstance(var_list, np.ndarray):
        raise TypeError(
            f"`{what}` must be a list of arrays, not a single array. Received: "
            f"{describe(var_list)}"
        )
    var_list = list(var_list)
    seen = set()
    for i, var in enumerate(var_list):
        check_host_variable(var, f"{what}[{i}]")
        if id(var) in seen:
            raise ValueError(
                f"`{what}` lists the same variable twice (position {i}, {describe(var)})."
            )
        seen.add(id(var))
    return var_list


def host_checkpoint_arrays(variables):
    if isinstance(variables, np.ndarray) or variables is None:
        raise TypeError(
            "`variables` must be a list of the optimizer's variables (ndarrays), in a fixed "
            f"order. Received: {type(variables).__name__}"
        )
    variables = list(variables)
    for i, v in enumerate(variables):
        if not isinstance(v, np.ndarray):
            raise TypeError(f"`variables[{i}]` must be an ndarray. Received: {type(v).__name__}")
    return variables, variables


class HostState:
    """One NumPy array per variable and slot (started at the optimizer's initial value), and
    the EMA averages (copies of the variables; zeros under Keras 3). ``specs``: each
    variable's ``(shape, dtype)`` at build time."""

    def __init__(self, opt, var_list):
        self.specs = [(v.shape, v.dtype) for v in var_list]
        self.averages = []
        if opt.use_ema:
            self.averages = [np.zeros_like(v) if opt.convention.ema == "keras3" else v.copy()
                             for v in var_list]
        self.slots = {
            name: [np.full(opt.slot_shape(name, v.shape),
                           _precision.slot_initial_value(opt, name, sdt), sdt)
                   for v in var_list
                   for sdt in (np.dtype(opt.slot_dtype(name, v.shape, v.dtype)),)]
            for name in opt._slot_names()
        }


class ReferenceExecutor(Executor):
    """NumPy: :mod:`refopt.reference`'s functions, the staged step, then the commit."""

    name = "reference"

    def __init__(self):
        from refopt import reference

        self.kernels = reference

    def check_var_list(self, var_list, what):
        return check_var_list(var_list, what)

    def check_pairs(self, grads_and_vars):
        return [(g, v, (v.shape, v.dtype)) for g, v in check_host_pairs(grads_and_vars)]

    def allocate(self, opt, var_list):
        return HostState(opt, var_list)

    def run_step(self, opt, positions, grads, lr_value):
        with np.errstate(all="ignore"):  # NaN and inf propagate silently, as in TensorFlow
            new_values = staged.compute(
                opt, [(g, opt._vars[i]) for g, i in zip(grads, positions)], lr_value)
        staged.commit(opt, new_values)

    def finalize(self, opt, positions):
        for i in positions:
            np.copyto(opt._vars[i], opt._averages[i])

    def checkpoint_arrays(self, variables):
        return host_checkpoint_arrays(variables)
