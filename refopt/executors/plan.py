"""The host side of a fused step: what the drivers apply around a rule, as numbers.

Shared by the ``cpu`` and ``cuda`` executors. For one dtype group of one step it decides
the clip mode of every tensor (and its denominator or scale: the norms are reduced by the
executor, passed in as sums of squares), the weight-decay mode and the EMA mode, and rounds
the pipeline's scalars (``psc``, layout :mod:`refopt.rules.steps`) as the convention does.
It returns ``None`` for what a single fused pass cannot express (Keras 2's several clips in
sequence, optax's decay with excluded variables); the executor then takes the staged path.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from refopt.reference._common import lr_cast, scalar, tf_cast
from refopt.rules import steps as S

_DECAY = {"decoupled": 1, "torch": 2, "l2": 3, "tfa": 1}  # tfa: mode 1 with a rate of 1


@dataclass
class Plan:
    """The pipeline's part of a fused step for one dtype group.

    Attributes
    ----------
    psc : ndarray of the dtype, shape (8,)
    dmode, emode : int
        Decay and EMA modes (compile-time constants of the kernel).
    overwrite : bool
        Overwrite the weights with their averages in this step.
    cmode : int64 ndarray (T,)
    cden, cscale : ndarray of the dtype (T,)
    optax_weight_decay : float or None
        optax ``adamw``'s decay, applied inside the rule.
    """

    psc: np.ndarray
    dmode: int
    emode: int
    overwrite: bool
    cmode: np.ndarray
    cden: np.ndarray
    cscale: np.ndarray
    optax_weight_decay: float | None


def clip_kind(opt):
    """``(kind, c)``: the one clipping a step applies (``"value"``, ``"norm"``, ``"global"``)
    or ``(None, None)``; ``("several", None)`` for Keras 2's sequence of clips."""
    conv = opt.convention
    given = [(k, getattr(opt, k)) for k in ("clipvalue", "clipnorm", "global_clipnorm")
             if getattr(opt, k) is not None]
    if conv.clip_selection == "legacy":
        if len(given) > 1:
            return "several", None
        if not given:
            return None, None
        k, c = given[0]
        return {"clipvalue": "value", "clipnorm": "norm", "global_clipnorm": "global"}[k], c

    def on(c):
        return c is not None and (c > 0 if conv.clip_formula == "tf" else True)

    if on(opt.clipnorm):
        return "norm", opt.clipnorm
    if on(opt.global_clipnorm):
        return "global", opt.global_clipnorm
    if opt.clipvalue and opt.clipvalue > 0:
        return "value", opt.clipvalue
    return None, None


def needs_sums(opt):
    """Whether the plan needs the gradients' sums of squares (norm clipping)."""
    return clip_kind(opt)[0] in ("norm", "global")


def clip_arrays(opt, dtype, n, sums=None, global_norm=None, norms=None):
    """``(cmode, cden, cscale, c)`` for ``n`` tensors of ``dtype``.

    ``sums``: the tensors' sums of squares (NumPy's pairwise order), for norm clipping;
    ``global_norm``: for TF's global clipping, the global norm (TF's formula, computed over
    every gradient of the step by the caller); ``norms``: under PyTorch's formula, the
    tensors' ``torch.linalg.vector_norm`` (PyTorch's order of addition, e.g.
    :func:`refopt.kernels.cpu.clipping.torch_norms`), used instead of ``sqrt(sums)``.
    """
    dtype = np.dtype(dtype)
    kind, c = clip_kind(opt)
    formula = opt.convention.clip_formula
    cmode = np.zeros(n, np.int64)
    cden = np.ones(n, dtype)
    cscale = np.ones(n, dtype)
    cv = dtype.type(0)
    if kind is None:
        return cmode, cden, cscale, cv
    with np.errstate(all="ignore"):
        if kind == "value":
            cmode[:] = 1
            return cmode, cden, cscale, scalar(dtype, c)
        cv = scalar(dtype, c)
        if formula == "tf":
            if kind == "norm":
                from refopt.kernels.cpu.clipping import norm_denominators

                cmode[:] = 2
                cden[:] = norm_denominators(np.asarray(sums, dtype), cv)
            else:
                from refopt.kernels.cpu.clipping import global_scale

                cmode[:] = 3
                cscale[:] = global_scale(global_norm, c)[1]
            return cmode, cden, cscale, cv
        if formula == "torch":
            from refopt.reference.reductions import torch_clip_coef, torch_vector_norm

            norms = np.sqrt(np.asarray(sums, dtype)) if norms is None else np.asarray(
                norms, dtype)
            if kind == "norm":
                totals = norms
            else:  # the norm of the stacked norms, in PyTorch's order
                totals = np.full(n, torch_vector_norm(norms), dtype)
            coef = torch_clip_coef(totals, c, dtype)
            cmode[:] = 3
            cscale[:] = coef
            return cmode, cden, cscale, cv
        # optax
        sums = np.asarray(sums, dtype)
        if kind == "norm":
            totals = np.sqrt(sums)
        else:
            totals = np.full(n, np.sqrt(np.sum(sums, dtype=dtype)), dtype)
        clipped = ~(totals < cv)
        if opt.convention.optax_jit == "eager":  # eager XLA: g * (1/N), then times c
            cmode[clipped] = 5
            cden[:] = dtype.type(1) / totals
        else:
            cmode[clipped] = 4
            cden[:] = totals
        return cmode, cden, cscale, cv


def plan(opt, dtype, lr_value, step, n, sums=None, global_norm=None):
    """The :class:`Plan` of one dtype group of ``n`` tensors, or ``None`` (staged path).

    Without norms (``sums`` and ``global_norm`` None) the plan depends only on the
    hyperparameters, the learning rate and whether this is the first step or an overwrite
    step; it is then kept in ``opt._state.plans`` under those (its ``psc`` is a fresh copy
    each call: the executors write the clip scalar into it).
    """
    cache = getattr(opt._state, "plans", None) if sums is None and global_norm is None else None
    if cache is None:
        return _plan(opt, dtype, lr_value, n, sums, global_norm)
    freq = opt.ema_overwrite_frequency
    key = (dtype, lr_value, n, opt.convention, opt.weight_decay, bool(opt._exclude_ids),
           opt.clipvalue, opt.clipnorm, opt.global_clipnorm, opt.use_ema, opt.ema_momentum,
           opt._iterations == 0, bool(freq and (opt._iterations + 1) % freq == 0),
           type(opt))
    pl = cache.get(key)
    if pl is None:
        if len(cache) >= 64:
            cache.clear()
        pl = cache[key] = _plan(opt, dtype, lr_value, n, sums, global_norm)
    if pl is None:
        return None
    return Plan(pl.psc.copy(), pl.dmode, pl.emode, pl.overwrite, pl.cmode, pl.cden,
                pl.cscale, pl.optax_weight_decay)


def _plan(opt, dtype, lr_value, n, sums, global_norm):
    dtype = np.dtype(dtype)
    conv = opt.convention
    kind, _ = clip_kind(opt)
    if kind == "several":
        return None
    psc = np.zeros(S.N_PSC, dtype)
    dmode = 0
    optax_wd = None
    with np.errstate(all="ignore"):
        if opt._weight_decay_acts():
            mode = opt._decay_mode()
            if mode == "optax":
                if opt._exclude_ids:
                    return None
                optax_wd = opt.weight_decay
            else:
                dmode = _DECAY[mode]
                if dmode == 1:  # TF-Addons' w - wd*w: Keras' w - (w*wd)*lr with lr = 1
                    psc[S.P_LR] = lr_cast(dtype, 1.0 if mode == "tfa" else lr_value)
                    psc[S.P_WD] = tf_cast(dtype, opt.weight_decay)
                elif dmode == 2:
                    psc[S.P_WD] = scalar(dtype, 1.0 - float(lr_value) * float(opt.weight_decay))
                else:
                    psc[S.P_WD] = scalar(dtype, opt.weight_decay)
        emode = 0
        overwrite = False
        if opt.use_ema:
            mu = opt.ema_momentum
            if conv.ema == "copy":
                emode = 1
                psc[S.P_MU] = scalar(dtype, mu)
                psc[S.P_OMU] = scalar(dtype, 1 - mu)
            elif conv.ema == "keras3":
                emode = 1
                m = scalar(dtype, 0.0 if opt._iterations == 0 else mu)
                psc[S.P_MU] = m
                psc[S.P_OMU] = scalar(dtype, 1) - m
            elif opt._iterations == 0:  # torch: the first update copies
                emode = 2
            else:
                w = scalar(dtype, 1 - mu)
                psc[S.P_W] = w
                psc[S.P_W1] = w - scalar(dtype, 1)
                emode = 3 if abs(float(w)) < 0.5 else 4
            overwrite = bool(opt.ema_overwrite_frequency
                             and (opt._iterations + 1) % opt.ema_overwrite_frequency == 0)
    cmode, cden, cscale, cv = clip_arrays(opt, dtype, n, sums, global_norm)
    psc[S.P_CLIP] = cv
    return Plan(psc, dmode, emode, overwrite, cmode, cden, cscale, optax_wd)
