"""Gradient accumulation as each framework does it.

- Keras 3 (``convention="keras3"``): ``gradient_accumulation_steps=k`` on any optimizer; the
  step of the pipeline for it is :func:`apply_gradients` here (``refopt.pipeline`` hands over
  to it). Followed: ``keras/src/optimizers/base_optimizer.py`` (``_backend_apply_gradients``,
  ``iterations``, ``_update_model_variables_moving_average``; Keras 3.15).
- torch: no accumulation in ``torch.optim``; the user sums the micro-batch gradients (or
  divides the loss by ``k``): :func:`torch_accumulate`.

Keras 3's order, per ``apply_gradients`` call (``n`` the raw call counter, ``k`` the steps)::

    lr = schedule(n)                                # the raw counter, not divided by k
    if (n + 1) % k == 0:                            # the update step
        g = (g + acc) / k                           # in the variable's dtype
        clip(g); weight decay; update with t = n // k + 1; acc = 0 (every accumulator)
    else:
        acc = acc + g                               # no clip, no decay, no update
    EMA of every variable with momentum ema_momentum * (n // k != 0), every call;
    overwrite when (n // k + 1) % ema_overwrite_frequency == 0, every call
    n = n + 1                                       # iterations = n // k

A sparse gradient (:class:`~refopt.IndexedSlices`) is added to the accumulator densely
(duplicates summed), as TensorFlow's ``IndexedSlices + Tensor``; the update step then sees a
dense gradient.
"""

from __future__ import annotations

import warnings

import numpy as np

from refopt import _foreign
from refopt import schedules as _schedules
from refopt.indexed_slices import IndexedSlices
from refopt.reference import variants as _variants

__all__ = ["apply_gradients", "torch_accumulate"]


def _host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def _put(dst, src):
    if isinstance(dst, np.ndarray):
        np.copyto(dst, src)
    else:
        dst.copy_to_device(np.ascontiguousarray(src))


def _dense(g, shape, dtype):
    if isinstance(g, IndexedSlices):
        return np.asarray(g.to_dense(), dtype)
    return _host(g)


def _device_like(var, a):
    if isinstance(var, np.ndarray):
        return a
    from refopt.kernels import cuda as _kc

    return _kc.to_device(np.ascontiguousarray(a))


def allocate(opt):
    """Zero accumulators for the built variables (host arrays, the variables' dtypes)."""
    opt._grad_accumulators = [np.zeros(tuple(s), d) for s, d in opt._var_specs]


def apply_gradients(opt, grads_and_vars):
    """:meth:`refopt.Optimizer.apply_gradients` with ``gradient_accumulation_steps`` set."""
    k = opt.gradient_accumulation_steps
    is_schedule = isinstance(opt._learning_rate, _schedules.LearningRateSchedule)
    lr_value = (opt._evaluate_schedule(opt._learning_rate, opt._micro_steps) if is_schedule
                else opt._learning_rate)
    ex = opt._executor
    grads_and_vars = _foreign.pairs(opt, list(grads_and_vars))
    pairs = ex.check_pairs(grads_and_vars)
    if not pairs:
        if is_schedule:
            opt._current_learning_rate = lr_value
        return opt._iterations
    if opt._built:
        for j, (_, var, (shape, dtype)) in enumerate(pairs):
            built_shape, built_dtype = opt._var_specs[opt._position(var)]
            if shape != built_shape or dtype != built_dtype:
                raise ValueError(
                    f"The variable at position {j} now has shape={shape}, dtype={dtype}, but "
                    f"the optimizer was built with shape={built_shape}, dtype={built_dtype} "
                    "for it; a variable cannot change shape or dtype after build.")
    present = [(g, v) for g, v, _ in pairs if g is not None]
    if not present:
        raise ValueError("No gradients provided for any variable (every gradient is None). "
                         f"Received {len(pairs)} (gradient, variable) pairs.")
    if len(present) < len(pairs):
        missing = [j for j, (g, _, _) in enumerate(pairs) if g is None]
        warnings.warn(f"Gradients do not exist for the variables at positions {missing}; "
                      "they are skipped in this step.", UserWarning, stacklevel=3)
    building = not opt._built
    if building:
        opt.build([v for _, v, _ in pairs])
    try:
        accumulators(opt)
        positions = [opt._index[id(v)] for _, v in present]
        with np.errstate(all="ignore"):
            dense = [_dense(g, opt._var_specs[i][0], opt._var_specs[i][1])
                     for (g, _), i in zip(present, positions)]
            sums = [opt._grad_accumulators[i] + d for d, i in zip(dense, positions)]
        if (opt._micro_steps + 1) % k == 0:  # the update step: the mean, then the step
            with np.errstate(all="ignore"):
                means = [s / s.dtype.type(k) for s in sums]
            grads = [_device_like(opt._vars[i], m) for m, i in zip(means, positions)]
            ex.run_step(opt, positions, grads, lr_value)
            for acc in opt._grad_accumulators:  # Keras resets every accumulator
                acc[...] = 0
        else:
            averages = _ema_only(opt) if opt.use_ema else None
            for s, i in zip(sums, positions):
                opt._grad_accumulators[i][...] = s
            if averages is not None:
                overwrite = bool(opt.ema_overwrite_frequency and (opt._iterations + 1)
                                 % opt.ema_overwrite_frequency == 0)
                for i, avg in enumerate(averages):
                    _put(opt._averages[i], avg)
                    if overwrite:
                        _put(opt._vars[i], avg)
    except BaseException:
        if building:
            opt._reset_state()
        raise
    opt._micro_steps += 1
    opt._iterations = opt._micro_steps // k
    if is_schedule:
        opt._current_learning_rate = lr_value
    _foreign.stepped(opt, positions)
    return opt._iterations


def _ema_only(opt):
    """Keras 3's EMA of every built variable on a call that does not update (new arrays)."""
    out = []
    with np.errstate(all="ignore"):
        for i, var in enumerate(opt._vars):
            out.append(np.asarray(_variants.ema_variant(
                _host(opt._averages[i]), _host(var), ema_momentum=opt.ema_momentum,
                first_step=opt._iterations == 0, convention=opt.convention)))
    return out


def torch_accumulate(micro_grads, mean=False):
    r"""Sum (or average) micro-batch gradients as a torch training loop does.

    torch has no accumulation option: calling ``loss.backward()`` on ``k`` micro-batches
    without ``zero_grad()`` adds each new gradient into ``.grad`` (``grad += g_j``, in order,
    in the gradient's dtype), then one ``optimizer.step()``. The usual recipe divides each
    micro-batch loss by ``k``: autograd then starts the backward pass from ``1/k`` (rounded
    to the loss dtype) instead of 1, so each micro-gradient is ``g_j * fl(1/k)``, **not**
    ``g_j / k`` (measured on torch 2.13: 412 of 1000 float32 elements differ between the
    two for k = 3). This helper multiplies by ``fl(1/k)`` as a linear last layer does; in a
    deeper graph the factor is rounded into each product along the way, which only the
    framework reproduces.

    Parameters
    ----------
    micro_grads : sequence of ndarray
        The ``k >= 1`` micro-batch gradients of one variable, all of one shape and dtype.
    mean : bool, default False
        ``False``: ``((g_1 + g_2) + ...) + g_k``. ``True``: ``((g_1 r + g_2 r) + ...) + g_k r``
        with ``r = fl(1/k)`` in the gradients' dtype (the loss divided by ``k``).

    Returns
    -------
    ndarray
        A new array, the gradient to pass to the optimizer.

    Raises
    ------
    ValueError
        No micro-gradient (an accumulation count < 1), or micro-gradients of different
        shapes or dtypes (the message names the first that differs).

    Examples
    --------
    >>> import numpy as np
    >>> from refopt.accumulation import torch_accumulate
    >>> g = [np.float32([0.1, 1.0]), np.float32([0.2, 3.0]), np.float32([0.3, -1.0])]
    >>> torch_accumulate(g).tolist(), torch_accumulate(g, mean=True).tolist()
    ([0.6000000238418579, 3.0], [0.20000001788139343, 1.0])
    """
    grads = [np.asarray(g) for g in micro_grads]
    if len(grads) < 1:
        raise ValueError("`micro_grads` must hold at least one gradient (the accumulation "
                         "count must be >= 1). Received: 0 gradients")
    shape, dtype = grads[0].shape, grads[0].dtype
    for j, g in enumerate(grads):
        if g.shape != shape or g.dtype != dtype:
            raise ValueError(f"`micro_grads[{j}]` has shape {g.shape} and dtype {g.dtype}; "
                             f"`micro_grads[0]` has shape {shape} and dtype {dtype}.")
    inv = dtype.type(1) / dtype.type(len(grads))  # autograd's seed d(loss/k)/d(loss)
    with np.errstate(all="ignore"):
        total = grads[0] * inv if mean else grads[0].copy()
        for g in grads[1:]:
            total = total + (g * inv if mean else g)
    return total


# ---------------------------------------------------------------- used by refopt.Optimizer
def check_steps(conv, value):
    """``gradient_accumulation_steps`` as the optimizer keeps it (None: off)."""
    import numbers

    if value is None or (value == 0 and not isinstance(value, bool)):
        return None  # Keras 3: 0 and None mean no accumulation
    if (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
            or value < 2):
        raise ValueError("`gradient_accumulation_steps` must be an integer >= 2 (or None). "
                         f"Received: gradient_accumulation_steps={value!r}")
    if conv.name != "keras3":
        raise ValueError(
            f"convention={conv.name!r} ({conv.framework}) has no gradient_accumulation_steps "
            "(Keras 3's option; optax: refopt.accumulation.MultiSteps is not built yet; "
            "torch: refopt.accumulation.torch_accumulate). Received: "
            f"gradient_accumulation_steps={value!r}")
    return int(value)


def accumulators(opt):
    """The live accumulators of a built optimizer (allocated on first use)."""
    if len(opt._grad_accumulators) != len(opt._vars):
        allocate(opt)
    return opt._grad_accumulators


def state(opt):
    """``state_dict``'s entry: ``{"gradient_accumulation": {"micro_steps", "accumulators"}}``
    with ``gradient_accumulation_steps`` set, else ``{}``."""
    if not opt.gradient_accumulation_steps:
        return {}
    accs = [a.copy() for a in accumulators(opt)] if opt._built else []
    return {"gradient_accumulation": {"micro_steps": int(opt._micro_steps),
                                      "accumulators": accs}}


def load_values(opt, sd, built, iterations):
    """The checked ``(micro_steps, accumulators)`` of a state dict, or None (nothing to load).

    Called once the optimizer is built for the state; raises ValueError (nothing written)."""
    import numbers

    k = opt.gradient_accumulation_steps
    entry = sd.get("gradient_accumulation")
    if not k:
        if entry is not None:
            raise ValueError("`state_dict['gradient_accumulation']` is present but this "
                             "optimizer has no gradient_accumulation_steps.")
        return None
    if not isinstance(entry, dict) or "micro_steps" not in entry:
        raise ValueError("`state_dict['gradient_accumulation']` must be a dict with "
                         f"'micro_steps' and 'accumulators'. Received: {entry!r}")
    micro = entry["micro_steps"]
    if (not isinstance(micro, numbers.Integral) or isinstance(micro, (bool, np.bool_))
            or micro < 0 or micro // k != iterations):
        raise ValueError(f"`state_dict['gradient_accumulation']['micro_steps']` must be an "
                         f"integer >= 0 with micro_steps // {k} == iterations ({iterations}). "
                         f"Received: {micro!r}")
    accs = list(entry.get("accumulators", []))
    if not built:
        return int(micro), None
    if len(accs) != len(opt._var_specs):
        raise ValueError(f"`state_dict['gradient_accumulation']['accumulators']` must hold "
                         f"{len(opt._var_specs)} arrays. Received: {len(accs)}")
    out = []
    for i, (a, (shape, dtype)) in enumerate(zip(accs, opt._var_specs)):
        a = np.asarray(a)
        if a.shape != tuple(shape) or a.dtype != np.dtype(dtype):
            raise ValueError(f"`state_dict['gradient_accumulation']['accumulators'][{i}]` has "
                             f"shape {a.shape} and dtype {a.dtype}; variable {i} is {dtype} "
                             f"of shape {tuple(shape)}.")
        out.append(a.copy())
    return int(micro), out


def restore(opt, values):
    """Write :func:`load_values`' result (cannot fail)."""
    if values is None:
        return
    micro, accs = values
    opt._micro_steps = micro
    opt._grad_accumulators = accs if accs is not None else []
