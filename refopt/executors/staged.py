"""The staged step: the reference executor's whole step, written once in NumPy.

Owns the arithmetic order of one step after validation (``tf_keras/optimizers/optimizer.py``,
``apply_gradients`` / ``_distributed_apply_gradients_fn``), as each convention has it:

1. clip (``clipnorm`` per tensor, else ``global_clipnorm``, else ``clipvalue``; Keras 2 all
   three in sequence);
2. sum duplicate indices of ``IndexedSlices`` gradients (after clipping, as tf-keras);
3. weight decay as the convention couples it (decoupled before the update, or an L2 term
   inside it);
4. the optimizer's own update (``Optimizer._update_step``, with ``t`` = the step count + 1,
   per variable under PyTorch's counters), on the present rows only for a lazy sparse step;
5. the EMA of the weights and, every ``ema_overwrite_frequency`` steps, the overwrite.

:func:`compute` returns new arrays and modifies nothing; :func:`commit` writes them into the
variables and slots and cannot fail. The reference executor runs both; the ``cpu`` executor
runs them (with the CPU kernels' pure functions) for what its fused kernels do not take; the
``cuda`` executor runs them on host copies for what one fused pass cannot express. The pure
functions come from ``opt._kernels`` (the executor's table: :mod:`refopt.reference` or
:mod:`refopt.kernels.cpu`), so the numbers are the reference's on every backend.
"""

from __future__ import annotations

import numpy as np

from refopt import precision as _precision
from refopt.indexed_slices import IndexedSlices
from refopt.reference import bf16 as _loop_bf16
from refopt.reference import bf16_generic as _bf16_generic
from refopt.reference import variants as _variants

__all__ = ["compute", "commit", "clip", "decay", "average"]


def clip(opt, grads):
    """The gradients clipped as ``opt``'s convention selects and computes (new objects)."""
    k = opt._kernels
    conv = opt.convention
    if conv.clip_formula == "tf":
        by_norm = k.clip_by_norm
        by_global = lambda gs, c: k.clip_by_global_norm(gs, c)[0]  # noqa: E731
    else:
        by_norm = lambda g, c: _variants.clip_norm_variant(g, c, conv)  # noqa: E731
        by_global = lambda gs, c: _variants.clip_global_norm_variant(gs, c, conv)  # noqa
    if conv.clip_selection == "legacy":  # Keras 2: clipvalue, then clipnorm, then global
        grads = list(grads)
        if opt.clipvalue is not None:
            grads = [k.clip_by_value(g, opt.clipvalue) for g in grads]
        if opt.clipnorm is not None:
            grads = [by_norm(g, opt.clipnorm) for g in grads]
        if opt.global_clipnorm is not None:
            grads = by_global(grads, opt.global_clipnorm)
        return grads

    def on(c):  # tf's formula: <= 0 means no clipping; torch/optax apply any value
        return c is not None and (c > 0 if conv.clip_formula == "tf" else True)

    if on(opt.clipnorm):
        return [by_norm(g, opt.clipnorm) for g in grads]
    if on(opt.global_clipnorm):
        return by_global(grads, opt.global_clipnorm)
    if opt.clipvalue and opt.clipvalue > 0:
        return [k.clip_by_value(g, opt.clipvalue) for g in grads]
    return list(grads)


def decay(opt, param, lr_value):
    """``param`` after the weight decay applied before the update (a new array, or ``param``)."""
    mode = opt._decay_mode()
    if mode in ("decoupled", "tfa"):  # TF-Addons: w - wd*w, i.e. Keras' with a rate of 1
        return opt._kernels.apply_weight_decay(
            param, learning_rate=1.0 if mode == "tfa" else lr_value,
            weight_decay=opt.weight_decay
        )
    if mode == "torch":
        return _variants.decay_torch(
            param, learning_rate=lr_value, weight_decay=opt.weight_decay
        )
    return param  # "l2" and "optax" act inside the update


def average(opt, i, new_param):
    """The new EMA average of variable ``i`` given its new value (a new array)."""
    conv = opt.convention
    if conv.ema == "copy":
        return opt._kernels.ema_update(
            opt._averages[i], new_param, ema_momentum=opt.ema_momentum
        )
    if _loop_bf16.takes_average(opt, opt._averages[i].dtype):  # AveragedModel on float16
        return _loop_bf16.ema_torch(opt._averages[i], new_param, opt.ema_momentum,
                                    first_step=opt._iterations == 0)
    with np.errstate(all="ignore"):
        return np.asarray(_variants.ema_variant(
            opt._averages[i], new_param, ema_momentum=opt.ema_momentum,
            first_step=opt._iterations == 0, convention=conv, num_averaged=opt._iterations,
        ))


def _expand_rows(opt, i, rows, param_rows, slot_rows):
    """Whole new arrays from row-wise results (copies; nothing is modified)."""
    param = opt._vars[i].copy()
    param[rows] = param_rows
    slots = {}
    for name, arr in slot_rows.items():
        slots[name] = opt._slots[name][i].copy()
        slots[name][rows] = arr
    return param, slots


def compute(opt, present, lr_value, dedup=None):
    """One step of ``opt`` for the ``(gradient, variable)`` pairs ``present``, into new arrays.

    ``dedup``: the function that sums duplicate rows (default
    :meth:`IndexedSlices.deduplicate`; a backend may pass a faster one with the same bits).

    Returns
    -------
    dict
        ``id(variable) -> (param, slots, average, rows)``: the new variable (or its rows), the
        new slots (dict), the new EMA average (or None), and the rows a lazy step computed
        (None: whole arrays). Nothing has been modified; :func:`commit` writes it.
    """
    grads = [g for g, _ in present]
    variables = [v for _, v in present]
    conv = opt.convention
    with _bf16_generic.reference_context(opt, variables):  # bfloat16 in its dtype: no-op else
        grads = clip(opt, grads)
    # the Keras 3 bug and the optimizers that apply each occurrence in turn (FBGEMM's
    # approximate row-wise Adagrad: RowWiseAdagrad(exact=False)) need the raw duplicates
    keeps = getattr(opt, "_keeps_duplicates", None)
    in_turn = keeps is not None and keeps()
    if not (conv.keras3_sparse_square or in_turn):
        dedup = dedup or IndexedSlices.deduplicate
        grads = [dedup(g) if isinstance(g, IndexedSlices) else g for g in grads]
    # an optimizer that applies the occurrences in turn to the present rows only
    # (``_rows_in_turn``): lazy rows, given an IndexedSlices over the gathered rows
    in_turn = in_turn and getattr(opt, "_rows_in_turn", False)
    overwrite = bool(opt.ema_overwrite_frequency
                     and (opt._iterations + 1) % opt.ema_overwrite_frequency == 0)
    out = {}
    for grad, var in zip(grads, variables):
        i = opt._index[id(var)]
        step = (opt._var_steps[i] if conv.step_counter == "per_variable"
                else opt._iterations) + 1
        decays = opt._weight_decay_acts() and id(var) not in opt._exclude_ids
        if (opt._is_lazy() or in_turn) and isinstance(grad, IndexedSlices):
            # Lazy rows: gather the present (unique) rows of the variable and its slots,
            # run the dense update on them, scatter back at commit. Cost ~ rows touched.
            if in_turn:  # the unique rows (ascending); the occurrences kept, in order
                rows, local = np.unique(grad.indices, return_inverse=True)
                grad = IndexedSlices(grad.values, local.reshape(-1),
                                     (rows.shape[0],) + grad.dense_shape[1:])
            else:
                rows = grad.indices
                grad = grad.values
            param = var[rows]
            slots = {name: opt._slots[name][i][rows] for name in opt._slot_names()}
        else:
            rows = None
            param = var
            slots = {name: opt._slots[name][i] for name in opt._slot_names()}
        if _loop_bf16.takes(opt, var.dtype, sparse=rows is not None or isinstance(
                grad, IndexedSlices)):  # bfloat16/float16 op by op: refopt.reference.bf16
            new_param, new_slots = _loop_bf16.update(opt, param, grad, slots, lr_value, step,
                                                     decays, sparse=rows is not None,
                                                     decay=decay)
            avg = None
            if opt.use_ema:  # dense (rows None); bfloat16: tf_keras/Keras 3 only
                with _bf16_generic.reference_context(opt, [var]):
                    avg = average(opt, i, new_param)
                if overwrite:
                    new_param = avg
            out[id(var)] = (new_param, new_slots, avg, rows)
            continue
        extra = {}
        # float16/bfloat16 under low_precision_compute="float32" (PyTorch's opmath): decay
        # and update in float32 on exact copies, each result rounded once (refopt.precision)
        low = _precision.compute_dtype(conv, var.dtype, opt)
        if low is not None:
            param, grad = _precision.upcast(param, low), _precision.upcast(grad, low)
            slots = {name: _precision.upcast(a, low) for name, a in slots.items()}
        if decays and (rows is not None or isinstance(grad, IndexedSlices)) and (
                opt._decay_mode() == "tfa"):  # TF-Addons decays only the present rows
            if not getattr(opt, "_decays_sparse", True):  # SGDW without momentum: never
                pass
            elif rows is not None:  # the gathered rows are the present ones
                param = decay(opt, param, lr_value)
            else:
                param = param.copy()
                param[grad.indices] = decay(opt, param[grad.indices], lr_value)
        elif decays:
            param = decay(opt, param, lr_value)
            if opt._decay_mode() in ("l2", "optax"):  # inside the update
                if isinstance(grad, IndexedSlices):
                    raise TypeError(
                        f"convention={conv.name!r}: this weight decay needs dense "
                        "gradients (the framework refuses sparse ones). Received an "
                        f"IndexedSlices for the variable at position {i}."
                    )
                extra["weight_decay"] = opt.weight_decay
        if rows is not None:
            extra["lazy_rows"] = True
        if getattr(opt, "_decays_in_update", False) and id(var) in opt._exclude_ids:
            # an optimizer whose update applies its own weight decay (FBGEMM's): told that
            # exclude_from_weight_decay names this variable
            extra["decay_excluded"] = True
        new_param, new_slots = opt._update_step(param, grad, slots, lr_value, step, **extra)
        if low is not None:
            new_param = _precision.round_to(new_param, var.dtype)
            new_slots = {name: _precision.round_to(a, opt._slots[name][i].dtype)
                         for name, a in new_slots.items()}
        avg = None
        if opt.use_ema:
            # The EMA averages every row, so with EMA a lazy step commits whole arrays.
            if rows is not None:
                new_param, new_slots = _expand_rows(opt, i, rows, new_param, new_slots)
                rows = None
            avg = average(opt, i, new_param)
            if overwrite:
                new_param = avg
        out[id(var)] = (new_param, new_slots, avg, rows)
    if opt.use_ema and conv.ema in ("keras3", "torch"):
        # Keras 3 and AveragedModel average every built variable, not only this call's
        for i, var in enumerate(opt._vars):
            if id(var) in out:
                continue
            with _bf16_generic.reference_context(opt, [var]):
                avg = average(opt, i, var)
            out[id(var)] = (avg if overwrite else var, {}, avg, None)
    return out


def commit(opt, new_values):
    """Write :func:`compute`'s result into the variables, slots and averages (cannot fail)."""
    for var, (param, slots, avg, rows) in new_values.items():
        i = opt._index[var]
        if avg is not None:
            np.copyto(opt._averages[i], avg)
        if rows is None:
            np.copyto(opt._vars[i], param)
            for name, arr in slots.items():
                np.copyto(opt._slots[name][i], arr)
        else:  # lazy: only the rows of the sparse gradient were computed
            opt._vars[i][rows] = param
            for name, arr in slots.items():
                opt._slots[name][i][rows] = arr
