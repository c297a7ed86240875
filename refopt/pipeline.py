"""The pipeline: the order of one ``apply_gradients`` call, written once for every backend.

One call does, in this order (``tf_keras/optimizers/optimizer.py``, ``apply_gradients``):

1. evaluate the learning-rate schedule at the pre-increment ``iterations``;
2. validate the pairs (the executor's checks: host arrays, or device arrays for ``cuda``);
   an empty ``grads_and_vars`` is a no-op; a built optimizer refuses unknown variables
   (``KeyError``) and variables that changed shape or dtype;
3. skip ``None`` gradients with a warning (every gradient ``None`` is an error);
4. build the state on the first call (EMA averages start as a *copy* of each variable, or
   zero under Keras 3);
5. the executor's step: clip, sum duplicate indices, weight decay, the optimizer's update,
   the EMA and its overwrite (:mod:`refopt.executors.staged` has this order in NumPy; the
   fused executors run it in one pass from the rules);
6. count: ``iterations += 1`` (and PyTorch's per-variable counters).

Atomic: every executor raises before it changes anything, and a call that built the state
and then raised forgets the build, so a raising call changes nothing. A built optimizer's
common step may take the executor's quick path (:meth:`Executor.quick_step`: cheap checks,
then the fused step); anything unusual falls through to the full validation above.
"""

from __future__ import annotations

import warnings

import numpy as np

from refopt import _foreign
from refopt import schedules as _schedules
from refopt.executors.checks import _INT64_MAX
from refopt.indexed_slices import IndexedSlices

__all__ = ["apply_gradients"]


def _count(opt, positions, lr_value, is_schedule):
    if opt.convention.step_counter == "per_variable":
        for i in positions:
            opt._var_steps[i] += 1
    opt._iterations += 1
    if is_schedule:
        opt._current_learning_rate = lr_value
    _foreign.stepped(opt, positions)  # torch tensors written in place: bump their versions
    return opt._iterations


def _negated(g):
    """``-g`` for a gradient of any accepted kind (new arrays; the caller's are untouched);
    anything else is returned as it is, for the checks to refuse."""
    if g is None:
        return None
    if isinstance(g, IndexedSlices):
        return IndexedSlices(_negated(g.values), g.indices, g.dense_shape)
    if isinstance(g, np.ndarray):
        return np.negative(g)
    if _foreign.is_torch_tensor(g):
        return -g
    if hasattr(g, "copy_to_host"):  # a numba device array (backend "cuda")
        from refopt.kernels import cuda as kc

        return kc.to_device(np.negative(g.copy_to_host()))
    if hasattr(g, "__cuda_array_interface__") and hasattr(g, "__neg__"):  # CuPy
        return -g
    if any(hasattr(g, a) for a in ("__dlpack__", "__array__", "__array_interface__")):
        return np.negative(np.asarray(g))
    return g


def _negated_pairs(grads_and_vars):
    return [(_negated(p[0]), p[1]) if isinstance(p, (tuple, list)) and len(p) == 2 else p
            for p in grads_and_vars]


def apply_gradients(opt, grads_and_vars):
    """:meth:`refopt.Optimizer.apply_gradients` (see there for arguments and errors)."""
    if opt.gradient_accumulation_steps:  # Keras 3's accumulation: its own order of a step
        from refopt import accumulation

        return accumulation.apply_gradients(opt, grads_and_vars)
    is_schedule = isinstance(opt._learning_rate, _schedules.LearningRateSchedule)
    lr_value = opt._evaluate_schedule(opt._learning_rate) if is_schedule else opt._learning_rate
    rate = opt._step_rate(lr_value)  # Keras 2's legacy decay (keras2), else lr_value
    ex = opt._executor
    if getattr(opt, "maximize", False):  # PyTorch's maximize: g <- -g first (exact)
        grads_and_vars = _negated_pairs(grads_and_vars)
    # a state that some gradients cannot meet (torch's sparse momentum buffers): no quick path
    quick = opt._built and not opt._grads_checked_against_state()
    if quick:
        if not isinstance(grads_and_vars, list):
            grads_and_vars = list(grads_and_vars)
        positions = ex.quick_step(opt, grads_and_vars, rate)
        if positions is not None:
            return _count(opt, positions, lr_value, is_schedule)
    if not isinstance(grads_and_vars, list):
        grads_and_vars = list(grads_and_vars)
    foreign = _foreign.pairs(opt, grads_and_vars)  # torch tensors etc. -> views, same list if none
    if foreign is not grads_and_vars:
        grads_and_vars = foreign
        if quick:
            positions = ex.quick_step(opt, grads_and_vars, rate)
            if positions is not None:
                return _count(opt, positions, lr_value, is_schedule)
    pairs = ex.check_pairs(grads_and_vars)
    if not pairs:
        if is_schedule:
            opt._current_learning_rate = lr_value  # tf-keras evaluates it before the check
        return opt._iterations
    if opt._iterations >= _INT64_MAX:
        raise OverflowError(
            f"`iterations` is {opt._iterations}; one more step would overflow tf-keras' "
            "int64 counter."
        )
    if opt._built:
        for k, (_, var, (shape, dtype)) in enumerate(pairs):
            built_shape, built_dtype = opt._var_specs[opt._position(var)]
            if shape != built_shape or dtype != built_dtype:
                raise ValueError(
                    f"The variable at position {k} now has shape={shape}, dtype={dtype}, but "
                    f"the optimizer was built with shape={built_shape}, dtype={built_dtype} "
                    "for it; a variable cannot change shape or dtype after build."
                )
    opt._check_grads_against_state(pairs)  # built or not (torch's SparseAdam: dense refused)
    present = [(g, v) for g, v, _ in pairs if g is not None]
    if not present:
        raise ValueError(
            "No gradients provided for any variable (every gradient is None). Received "
            f"{len(pairs)} (gradient, variable) pairs."
        )
    if len(present) < len(pairs):
        missing = [i for i, (g, _, _) in enumerate(pairs) if g is None]
        warnings.warn(
            f"Gradients do not exist for the variables at positions {missing}; they are "
            "skipped in this step.",
            UserWarning,
            stacklevel=3,
        )
    building = not opt._built
    if building:
        opt.build([v for _, v, _ in pairs])
    positions = [opt._index[id(v)] for _, v in present]
    try:
        ex.run_step(opt, positions, [g for g, _ in present], rate)
    except BaseException:
        if building:  # the call changes nothing, not even the build
            opt._reset_state()
        raise
    return _count(opt, positions, lr_value, is_schedule)
