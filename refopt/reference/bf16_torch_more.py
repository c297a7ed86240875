"""torch's other for-loop optimizers on bfloat16 and float16, op by op: ``Adamax``,
``NAdam``, ``RAdam``, ``Adadelta``, ``ASGD`` and ``Rprop`` (issue 17 item 1).

The op model is :mod:`refopt.reference.bf16`'s (torch 2.13 on CPU, AVX2): each torch op
loads its bfloat16/float16 operands exactly into float32, computes there and rounds its
result once to the tensor's dtype (``R``); ``lerp_`` and ``addcmul_`` are one FMA,
``addcdiv_`` is not, ``add_(b, alpha)`` is an FMA except on the scalar tail (``numel % 32``)
where the product is rounded first; a Python scalar of ``mul_``/``div`` stays float32,
one of ``add_(s)`` is rounded to the dtype first. The ops these optimizers add:

=======================================  ==================================================
torch op                                 float32 computation, then ``R``
=======================================  ==================================================
``a.abs()``, ``-a``                      exact
``a.sign()``                             1, -1, +0 (a zero, NaN)
``a * b``, ``a / b``, ``a - b``          ``a * b``, ``a / b``, ``a - b`` (tensors)
``s / a`` (``Tensor.__rtruediv__``)      ``R(1 / a)`` (``reciprocal``), then ``* f32(s)``
``a.mul_(t)``, ``t`` a float32 0-d       ``a * f32(t)`` (ASGD's ``mu``)
tensor
``a.clamp_(lo, hi)``                     ``min(max(a, f32(lo)), f32(hi))``
``s[mask] = x``, ``a.eq(x)``             ``x`` rounded to the dtype
=======================================  ==================================================

Python scalars (``lr / bias_correction1``, RAdam's rectification, NAdam's ``mu``) are
computed in float64 as torch's Python code computes them; NAdam's ``mu_product`` and ASGD's
``eta``/``mu`` are float32 0-d tensors (:func:`refopt.reference.nadam.nadam_schedule`,
:meth:`refopt.ASGD._scalars`). Source: ``torch/optim/{adamax,nadam,radam,adadelta,asgd,
rprop}.py`` (2.13, ``_single_tensor_*``), ``torch/_tensor.py`` (``__rdiv__``). Golden
cases ``torch/*_loopx_bf16`` and ``torch/*_loopx_f16`` (three shapes crossing the 32-lane
tail, 20 steps, weight decay and ``maximize``), bit for bit.

:func:`kind` names the update of an optimizer (None when it is none of these);
:func:`update` runs one step. :mod:`refopt.reference.bf16` dispatches here.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import bf16 as _ops

__all__ = ["KINDS", "adadelta", "adagrad_rows", "adamax", "asgd", "kind", "nadam", "radam",
           "rprop", "sign", "sparse_adam_rows", "takes_sparse_f16", "update", "update_sparse_f16"]

#: The kinds this module runs (:func:`kind`).
KINDS = ("adamax", "nadam", "radam", "adadelta", "asgd", "rprop")

_F32 = np.dtype(np.float32)


# ------------------------------------------------------------------------------ the ops
def _f(a):
    return np.asarray(a).astype(_F32)


def _r(x, dtype):
    return _ops._r(x, dtype)


def mul(a, b):
    """``a * b`` of two tensors."""
    return _r(_f(a) * _f(b), a.dtype)


def div(a, b):
    """``a / b`` of two tensors."""
    return _r(_f(a) / _f(b), a.dtype)


def sub(a, b):
    """``a - b`` of two tensors."""
    return _r(_f(a) - _f(b), a.dtype)


def rdiv_s(s, a):
    """``s / a`` for a Python number ``s``: ``a.reciprocal() * s``."""
    return _ops.mul_s(_r(np.float32(1) / _f(a), a.dtype), s)


def sign(a):
    """``a.sign()``: 1, -1, or +0 for a zero and for NaN (torch's, not NumPy's)."""
    return np.where(a > 0, 1, np.where(a < 0, -1, 0)).astype(a.dtype)


def clamp_s(a, lo, hi):
    """``a.clamp_(lo, hi)`` with Python bounds (NaN propagates)."""
    x = _f(a)
    return _r(np.where(np.isnan(x), x, np.minimum(np.maximum(x, np.float32(lo)),
                                                  np.float32(hi))), a.dtype)


# ------------------------------------------------------------------------- the updates
def _decay(param, grad, weight_decay, decoupled, lr):
    """torch's weight decay: ``param.mul_(1 - lr*wd)`` (decoupled) or ``grad.add(param,
    alpha=wd)``; ``(param, grad)``."""
    if weight_decay is None:
        return param, grad
    if decoupled:
        return _ops.mul_s(param, 1 - float(lr) * float(weight_decay)), grad
    return param, _ops.add(grad, param, alpha=weight_decay)


def adamax(param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step,
           weight_decay=None):
    """``torch.optim.Adamax`` (``_single_tensor_adamax``), one step: ``(param, m, u)``.

    Every array here and below: bfloat16 or float16, one shape; new arrays are returned,
    the inputs are not modified; the ops as in the module's table.

    ``m.lerp_(g, 1-b1)``; ``u = maximum(u * b2, |g| + eps)``; ``param.addcdiv_(m, u,
    value=-lr/(1-b1**t))``.
    """
    param, grad = _decay(param, grad, weight_decay, False, learning_rate)
    m = _ops.lerp(m, grad, 1 - float(beta_1))
    u = _ops.maximum(_ops.mul_s(u, beta_2), _ops.add_s(np.abs(grad), epsilon))
    clr = float(learning_rate) / (1 - float(beta_1) ** step)
    return _ops.addcdiv(param, m, u, -clr), m, u


def nadam(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step, schedule,
          weight_decay=None, decoupled=False):
    """``torch.optim.NAdam`` (``_single_tensor_nadam``), one step: ``(param, m, v)``.

    ``schedule``: :func:`refopt.reference.nadam.nadam_schedule`'s torch values (``mu``,
    ``mu_next``, the float32 ``mu_product`` after this step and its product with
    ``mu_next``, as Python floats).
    """
    lr = float(learning_rate)
    param, grad = _decay(param, grad, weight_decay, decoupled, lr)
    b2 = float(beta_2)
    bc2 = 1 - b2 ** step
    m = _ops.lerp(m, grad, 1 - float(beta_1))
    v = _ops.addcmul(_ops.mul_s(v, b2), grad, grad, 1 - b2)
    denom = _ops.add_s(_ops.sqrt(_ops.div_s(v, bc2)), epsilon)
    s = schedule
    param = _ops.addcdiv(param, grad, denom, -lr * (1.0 - s.mu) / (1.0 - s.product))
    param = _ops.addcdiv(param, m, denom, (-lr * s.mu_next) / (1.0 - s.product_next))
    return param, m, v


def radam(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
          weight_decay=None, decoupled=False):
    """``torch.optim.RAdam`` (``_single_tensor_radam``), one step: ``(param, m, v)``.

    ``m.lerp_``, ``v.mul_(b2).addcmul_``; ``mhat = m / bc1``; rectified (``rho_t > 5``):
    ``param.add_(((mhat * lr) * (sqrt(bc2) / (sqrt(v) + eps))) * rect, alpha=-1)``, else
    ``param.add_(mhat * lr, alpha=-1)``.
    """
    lr = float(learning_rate)
    param, grad = _decay(param, grad, weight_decay, decoupled, lr)
    b1, b2 = float(beta_1), float(beta_2)
    m = _ops.lerp(m, grad, 1 - b1)
    v = _ops.addcmul(_ops.mul_s(v, b2), grad, grad, 1 - b2)
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    mhat = _ops.div_s(m, bc1)
    rho_inf = 2 / (1 - b2) - 1
    rho_t = rho_inf - 2 * step * (b2 ** step) / bc2
    if rho_t > 5.0:
        rect = ((rho_t - 4) * (rho_t - 2) * rho_inf
                / ((rho_inf - 4) * (rho_inf - 2) * rho_t)) ** 0.5
        adaptive = rdiv_s(bc2 ** 0.5, _ops.add_s(_ops.sqrt(v), epsilon))
        upd = _ops.mul_s(mul(_ops.mul_s(mhat, lr), adaptive), rect)
    else:
        upd = _ops.mul_s(mhat, lr)
    return _ops.add(param, upd, alpha=-1.0), m, v


def adadelta(param, grad, eg, ex, *, learning_rate, rho, epsilon, weight_decay=None):
    """``torch.optim.Adadelta`` (``_single_tensor_adadelta``), one step: ``(param, eg,
    ex)`` (``square_avg``, ``acc_delta``).

    ``eg.mul_(rho).addcmul_(g, g, 1-rho)``; ``delta = sqrt(ex + eps) / sqrt(eg + eps) * g``;
    ``ex.mul_(rho).addcmul_(delta, delta, 1-rho)``; ``param.add_(delta, alpha=-lr)``.
    """
    param, grad = _decay(param, grad, weight_decay, False, learning_rate)
    rho = float(rho)
    eg = _ops.addcmul(_ops.mul_s(eg, rho), grad, grad, 1 - rho)
    std = _ops.sqrt(_ops.add_s(eg, epsilon))
    delta = mul(div(_ops.sqrt(_ops.add_s(ex, epsilon)), std), grad)
    ex = _ops.addcmul(_ops.mul_s(ex, rho), delta, delta, 1 - rho)
    return _ops.add(param, delta, alpha=-float(learning_rate)), eg, ex


def asgd(param, grad, ax, *, eta, mu, lambd, weight_decay=None):
    """``torch.optim.ASGD`` (``_single_tensor_asgd``), one step: ``(param, ax)``; ``eta``,
    ``mu``: the float32 0-d state before this step (Python floats).

    ``param.mul_(1 - lambd*eta).add_(g, alpha=-eta)``; ``ax.add_((param - ax) * mu)``, or
    ``ax = param`` when ``mu`` is 1.
    """
    param, grad = _decay(param, grad, weight_decay, False, eta)
    param = _ops.mul_s(param, 1 - float(lambd) * float(eta))
    param = _ops.add(param, grad, alpha=-float(eta))
    if float(mu) != 1:
        ax = _ops.add(ax, _ops.mul_s(sub(param, ax), np.float32(mu)))
    else:
        ax = param.copy()
    return param, ax


def rprop(param, grad, prev, step_size, *, etas, step_sizes):
    """``torch.optim.Rprop`` (``_single_tensor_rprop``), one step: ``(param, prev,
    step_size)``.

    ``sign = sign(g * prev)`` mapped to ``R(eta+)``, ``R(eta-)``, 1;
    ``step_size = clamp(step_size * sign, lo, hi)``; ``g = 0`` where ``sign == R(eta-)``;
    ``param.addcmul_(sign(g), step_size, value=-1)``; ``prev = g``.
    """
    dt = param.dtype
    eta_minus, eta_plus = (float(e) for e in etas)
    lo, hi = (float(s) for s in step_sizes)
    sgn = sign(mul(grad, prev))
    minus, plus = _r(np.float32(eta_minus), dt), _r(np.float32(eta_plus), dt)
    out = np.ones_like(sgn)
    out[sgn > 0] = plus
    out[sgn < 0] = minus
    step_size = clamp_s(mul(step_size, out), lo, hi)
    grad = np.where(out == minus, np.zeros_like(grad), grad)
    param = _ops.addcmul(param, sign(grad), step_size, -1)
    return param, grad, step_size


# ------------------------------------------------------- sparse gradients of float16 tables
def _axpy_half(y, x, alpha):
    """``y.add_(sparse, alpha)`` of a dense float16 ``y`` and the (coalesced) rows ``x``:
    ATen's dense-sparse add runs in ``c10::Half`` arithmetic, ``R(y + R(R(alpha) * x))``
    (measured on torch 2.13: ``conformance/generators/probe_sparse_f16.py``)."""
    dt = y.dtype
    prod = _r(_f(_r(np.float32(alpha), dt)) * _f(x), dt)
    return _r(_f(y) + _f(prod), dt)


def adagrad_rows(param, grad, acc, *, learning_rate, epsilon, lr_decay, step):
    """``torch.optim.Adagrad``'s sparse branch on the coalesced rows of a float16 table:
    ``(param, acc)``.

    ``acc.add_(sparse(g.pow(2)))``; ``std = acc.sparse_mask(g).sqrt_().add_(eps)``;
    ``param.add_(sparse(g / std), alpha=-clr)``, ``clr = lr / (1 + (t-1) lr_decay)``.
    """
    acc = _axpy_half(acc, mul(grad, grad), 1.0)
    std = _ops.add_s(_ops.sqrt(acc), epsilon)
    clr = float(learning_rate) / (1 + (step - 1) * float(lr_decay))
    return _axpy_half(param, div(grad, std), -clr), acc


def sparse_adam_rows(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step):
    """``torch.optim.SparseAdam`` on the coalesced rows of a float16 table: ``(param, m,
    v)``.

    ``um = (g - m) * (1-b1)``; ``m.add_(sparse(um))``; ``uv = (g.pow(2) - v) * (1-b2)``;
    ``v.add_(sparse(uv))``; ``param.add_(sparse(-step_size * ((um + m_old) /
    (sqrt(uv + v_old) + eps))))``, ``step_size = lr sqrt(bc2) / bc1``.
    """
    b1, b2 = float(beta_1), float(beta_2)
    um = _ops.mul_s(sub(grad, m), 1 - b1)
    m = _axpy_half(m, um, 1.0)
    uv = _ops.mul_s(sub(mul(grad, grad), v), 1 - b2)
    v = _axpy_half(v, uv, 1.0)
    denom = _ops.add_s(_ops.sqrt(v), epsilon)
    step_size = float(learning_rate) * (1 - b2 ** step) ** 0.5 / (1 - b1 ** step)
    return _axpy_half(param, _ops.mul_s(div(m, denom), -step_size), 1.0), m, v


def takes_sparse_f16(opt):
    """Whether the gathered rows of a sparse gradient of a float16 table of ``opt`` run
    here: torch's ``SparseAdam`` (``LazyAdam`` under ``lazy_update="torch_sparse"``) and
    ``Adagrad``'s sparse branch, without weight decay (torch refuses it; the ordinary path
    raises) or EMA, under an unchanged preset."""
    from refopt.conventions import PRESETS
    from refopt.reference.bf16 import optimizer_class_name

    conv = opt.convention
    if PRESETS.get(conv.name) != conv or opt._uses_update_step() or (
            opt._weight_decay_acts()) or opt.use_ema:
        return False
    cls = optimizer_class_name(opt)
    if cls == "LazyAdam":
        return conv.lazy_update == "torch_sparse"
    return cls == "Adagrad" and conv.adagrad_form == "torch" and conv.sqrt == "mkl"


def update_sparse_f16(opt, param_rows, grad_rows, slots, learning_rate, step):
    """One step of ``opt`` (:func:`takes_sparse_f16`) on the rows a sparse gradient of a
    float16 table touches: :func:`sparse_adam_rows` or :func:`adagrad_rows`.

    Parameters
    ----------
    opt : refopt.LazyAdam or refopt.Adagrad
        Under torch's forms (``SparseAdam``; ``Adagrad``'s sparse branch).
    param_rows : ndarray of float16, shape ``(rows, ...)``
        The table's rows at the gradient's unique indices (not modified).
    grad_rows : ndarray of float16, the shape of ``param_rows``
        Their gradient rows, duplicates summed one at a time in order of appearance (as
        torch's ``coalesce`` sums up to 16 entries; README, known differences).
    slots : dict of str to ndarray of float16, the shape of ``param_rows``
        ``m`` and ``v`` (LazyAdam) or ``accumulator`` (Adagrad), gathered likewise.
    learning_rate : float
    step : int
        The 1-based step count.

    Returns
    -------
    (ndarray, dict)
        The new rows of the table and of its slots (new float16 arrays).
    """
    with np.errstate(all="ignore"):
        if "accumulator" in slots:
            p, acc = adagrad_rows(param_rows, grad_rows, slots["accumulator"],
                                  learning_rate=learning_rate, epsilon=opt.epsilon,
                                  lr_decay=opt.lr_decay, step=step)
            return p, {"accumulator": acc}
        p, m, v = sparse_adam_rows(param_rows, grad_rows, slots["m"], slots["v"],
                                   learning_rate=learning_rate, beta_1=opt.beta_1,
                                   beta_2=opt.beta_2, epsilon=opt.epsilon, step=step)
    return p, {"m": m, "v": v}


# ------------------------------------------------------------------------ the dispatch
def kind(opt):
    """This module's update for ``opt`` (one of :data:`KINDS`), or None: torch's form of
    the optimizer (``convention.<name>_form == "torch"``), not rewritten with
    ``update_step``. The caller checks the convention is an unchanged preset."""
    from refopt.reference.bf16 import optimizer_class_name

    conv = opt.convention
    this = optimizer_class_name(opt)
    for cls, name, form in (("Adamax", "adamax", conv.adamax_form),
                            ("Nadam", "nadam", conv.nadam_form),
                            ("RAdam", "radam", conv.radam_form),
                            ("Adadelta", "adadelta", conv.adadelta_form),
                            ("ASGD", "asgd", conv.asgd_form),
                            ("Rprop", "rprop", conv.rprop_form)):
        if this == cls:
            if form != "torch" or opt._uses_update_step():
                return None
            return name
    return None


def update(opt, kind_, param, grad, slots, learning_rate, step, decays):
    """One step of ``opt`` on one bfloat16 or float16 variable, torch's for-loop op by op.

    Parameters
    ----------
    opt : refopt.Adamax, Nadam, RAdam, Adadelta, ASGD or Rprop
        Under a convention with torch's form of it (:func:`kind`).
    kind_ : str
        ``kind(opt)``, one of :data:`KINDS`.
    param : ndarray of bfloat16 (``ml_dtypes``) or float16, any shape
        The variable (not modified).
    grad : ndarray, the dtype and shape of ``param``
        Its dense gradient, already negated under ``maximize`` (exact).
    slots : dict of str to ndarray, the dtype and shape of ``param``
        The optimizer's slots for this variable (not modified): Adamax ``m``, ``u``;
        Nadam/RAdam ``m``, ``v``; Adadelta ``accumulated_grad``, ``accumulated_delta``;
        ASGD ``ax``; Rprop ``prev``, ``step_size``.
    learning_rate : float
    step : int
        The variable's 1-based step count (torch's per-parameter ``step``).
    decays : bool
        Whether weight decay applies to this variable (``opt.weight_decay``: torch's L2
        term ``grad.add(param, alpha=wd)``, or ``param.mul_(1 - lr*wd)`` first for
        ``decoupled_weight_decay=True``).

    Returns
    -------
    (ndarray, dict)
        The new variable and the new slots (new arrays, the dtype of ``param``).

    Raises
    ------
    ValueError
        ``kind_`` is not one of :data:`KINDS`; nothing has changed.
    """
    wd = opt.weight_decay if decays else None
    decoupled = opt._decay_mode() == "torch"
    with np.errstate(all="ignore"):
        if kind_ == "adamax":
            p, m, u = adamax(param, grad, slots["m"], slots["u"], learning_rate=learning_rate,
                             beta_1=opt.beta_1, beta_2=opt.beta_2, epsilon=opt.epsilon,
                             step=step, weight_decay=wd)
            return p, {"m": m, "u": u}
        if kind_ == "nadam":
            from refopt.reference.nadam import nadam_schedule

            sch = nadam_schedule(step, beta_1=opt.beta_1, convention=opt.convention,
                                 momentum_decay=opt.momentum_decay)
            p, m, v = nadam(param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
                            beta_1=opt.beta_1, beta_2=opt.beta_2, epsilon=opt.epsilon,
                            step=step, schedule=sch, weight_decay=wd, decoupled=decoupled)
            return p, {"m": m, "v": v}
        if kind_ == "radam":
            p, m, v = radam(param, grad, slots["m"], slots["v"], learning_rate=learning_rate,
                            beta_1=opt.beta_1, beta_2=opt.beta_2, epsilon=opt.epsilon,
                            step=step, weight_decay=wd, decoupled=decoupled)
            return p, {"m": m, "v": v}
        if kind_ == "adadelta":
            p, eg, ex = adadelta(param, grad, slots["accumulated_grad"],
                                 slots["accumulated_delta"], learning_rate=learning_rate,
                                 rho=opt.rho, epsilon=opt.epsilon, weight_decay=wd)
            return p, {"accumulated_grad": eg, "accumulated_delta": ex}
        if kind_ == "asgd":
            eta, mu = opt._scalars(learning_rate, step)
            p, ax = asgd(param, grad, slots["ax"], eta=eta, mu=mu, lambd=opt.lambd,
                         weight_decay=wd)
            return p, {"ax": ax}
        if kind_ == "rprop":
            p, prev, size = rprop(param, grad, slots["prev"], slots["step_size"],
                                  etas=opt.etas, step_sizes=opt.step_sizes)
            return p, {"prev": prev, "step_size": size}
    raise ValueError(f"`kind_` must be one of {KINDS}. Received: kind_={kind_!r}")
