"""ASGD (averaged stochastic gradient descent) as PyTorch computes it (``Convention.asgd_form``).

Only PyTorch has ASGD (``torch.optim.ASGD``); every other convention's ``asgd_form`` is
``"none"`` and is refused. The step decays the variable, takes a gradient step of size
:math:`\\eta_t`, and keeps ``ax``, a running average of the variables that starts averaging
after ``t0`` steps (before that it is a copy of the variable). The step size and the
averaging weight are per-variable scalars torch keeps in float32 0-d tensors (``eta``,
``mu``) and recomputes in Python floats at the end of every step; :func:`asgd_scalars` gives
the values they hold before step ``t`` under a constant learning rate.

Source (read for facts only; nothing here is copied from it):

======  ====================================================================================
form    framework file
======  ====================================================================================
torch   ``torch/optim/asgd.py`` (``ASGD._init_group``, ``_single_tensor_asgd`` with
        ``capturable=False``: the default for-loop path on CPU), torch 2.13
======  ====================================================================================
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_hyper,
    check_like,
    check_scalar,
    check_step,
    scalar,
)
from refopt.reference.variants import fma

__all__ = [
    "ASGDResult",
    "asgd_defaults",
    "asgd_initial_state",
    "asgd_scalars",
    "asgd_update",
]

#: torch counts steps in a float32 0-d tensor: ``step += 1`` stops moving at 2**24.
TORCH_STEP_LIMIT = 2 ** 24

_DEFAULTS = {
    "torch": dict(learning_rate=0.01, lambd=1e-4, alpha=0.75, t0=1e6),
}


class ASGDResult(NamedTuple):
    """New values after one ASGD step.

    ``param`` and ``ax`` (the average of the variables) are new arrays; ``eta`` and ``mu``
    are the step size and averaging weight torch stores at the end of the step for the
    *next* one (Python floats holding float32 values, as torch's float32 0-d tensors).
    """

    param: np.ndarray
    ax: np.ndarray
    eta: float
    mu: float


def _convention(convention):
    if convention is None:
        return get_convention("torch")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (torch), a preset name or a refopt.conventions.Convention. "
        f"Received: convention={convention!r}"
    )


def _form(convention):
    conv = _convention(convention)
    if conv.asgd_form == "none":
        raise ValueError(
            f"ASGD does not exist under convention={conv.name!r} ({conv.framework} has "
            f"no ASGD; only PyTorch does: asgd_form='none'). Received: "
            f"convention={conv.name!r}"
        )
    return conv.asgd_form


def asgd_defaults(convention=None):
    """``torch.optim.ASGD``'s constructor defaults under refopt's names: ``learning_rate``
    0.01, ``lambd`` 1e-4, ``alpha`` 0.75, ``t0`` 1e6 (``weight_decay`` 0 is the optimizer's
    L2 term, applied by the pipeline). ``convention``: None means torch; a convention
    without ASGD raises ValueError."""
    return dict(_DEFAULTS[_form(convention)])


def _f32(x):
    """A Python float rounded to float32, as ``torch.as_tensor(x)`` and ``copy_`` into a
    float32 0-d tensor do (overflow gives inf)."""
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _torch_step(t):
    """The value of torch's float32 step counter after ``t`` increments."""
    return float(min(int(t), TORCH_STEP_LIMIT))


def _next_eta(learning_rate, lambd, alpha, t):
    """``lr / (1 + lambd*lr*t)**alpha`` in Python floats, then float32: what torch stores at
    the end of step ``t``. A power too large for a float is inf (Python would raise
    OverflowError; the limit, a step of 0, is kept)."""
    lr = float(learning_rate)
    base = 1 + float(lambd) * lr * _torch_step(t)
    try:
        den = base ** float(alpha)
    except OverflowError:
        den = math.inf
    with np.errstate(all="ignore"):
        return _f32(lr / den) if den != 0 else _f32(math.copysign(math.inf, lr) if lr else
                                                     math.nan)


def _next_mu(t0, t):
    """``1 / max(1, t - t0)`` in Python floats, then float32 (end of step ``t``)."""
    return _f32(1 / max(1, _torch_step(t) - float(t0)))


def asgd_scalars(learning_rate, lambd, alpha, t0, step):
    """The ``(eta, mu)`` torch uses at 1-based step ``step`` under a constant learning rate.

    Step 1 uses ``eta = float32(lr)`` (set when the state is created) and ``mu = 1``; step
    ``t > 1`` the values stored at the end of step ``t - 1``: ``eta =
    float32(lr / (1 + lambd*lr*(t-1))**alpha)`` and ``mu = float32(1 / max(1, (t-1) - t0))``,
    computed in Python floats (torch's ``_get_value(step)`` is a Python float; the counter
    is a float32 tensor that stops at 2**24).

    Returns
    -------
    (float, float)
        Python floats holding float32 values.
    """
    check_step(step)
    if step == 1:
        return _f32(learning_rate), 1.0
    return _next_eta(learning_rate, lambd, alpha, step - 1), _next_mu(t0, step - 1)


def asgd_initial_state(param, *, convention=None):
    """A fresh average ``ax`` for ``param``: zeros of its shape and dtype (torch's
    ``zeros_like``). torch's scalar state starts at ``step = 0``, ``eta = lr``, ``mu = 1``:
    :func:`asgd_scalars` for step 1."""
    param = as_float_array("param", param)
    _form(convention)
    return np.zeros(param.shape, param.dtype)


def check_asgd_args(param, grad, ax, *, learning_rate, lambd, alpha, t0, step, eta, mu,
                    convention):
    """Validate :func:`asgd_update`'s arguments (its Raises section); return
    ``(param, grad, ax, form)``. Shared with the fast backends' ``asgd_update``."""
    param = as_float_array("param", param)
    form = _form(convention)
    if isinstance(grad, IndexedSlices):
        raise TypeError(
            "torch.optim.ASGD does not support sparse gradients; pass grad.to_dense(). "
            "Received: grad of type IndexedSlices"
        )
    grad = check_like(param, "grad", grad)
    ax = check_like(param, "ax", ax)
    for name, value in (("learning_rate", learning_rate), ("lambd", lambd),
                        ("alpha", alpha), ("t0", t0)):
        check_hyper(name, value)
        if not math.isfinite(float(value)):
            raise ValueError(f"`{name}` must be finite. Received: {name}={value!r}")
    if not learning_rate >= 0:
        raise ValueError(f"`learning_rate` must be >= 0. Received: learning_rate={learning_rate!r}")
    if not lambd >= 0:
        raise ValueError(f"`lambd` must be >= 0. Received: lambd={lambd!r}")
    for name, value in (("eta", eta), ("mu", mu)):
        if value is not None:
            check_scalar(name, value)
    check_step(step)
    return param, grad, ax, form


def _torch(w, g, ax, eta, mu, lambd):
    """``_single_tensor_asgd``'s arithmetic with the scalars already in hand."""
    dt = w.dtype
    w = w * scalar(dt, 1 - float(lambd) * eta)  # mul_ by a Python float
    w = fma(scalar(dt, -eta), g, w)  # add_(grad, alpha=-eta): one FMA
    if mu != 1:
        ax = ax + (w - ax) * scalar(dt, mu)  # add_ of sub().mul_(mu), alpha 1: exact add
    else:
        ax = w.copy()  # ax.copy_(param)
    return w, ax


def asgd_update(param, grad, ax, *, learning_rate, lambd, alpha, t0, step, eta=None,
                mu=None, convention=None):
    r"""One ASGD step as ``torch.optim.ASGD`` computes it; returns new arrays and scalars.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``
        The gradient :math:`g` (PyTorch's L2 term, if any, already added: the pipeline's
        ``fma(w, wd, g)``). Sparse gradients are refused, as torch does.
    ax : ndarray like ``param``
        The average :math:`a` (a fresh one: :func:`asgd_initial_state`, zeros).
    learning_rate : float
        :math:`\gamma` (torch's ``lr``, a Python float), >= 0.
    lambd : float
        The decay term :math:`\lambda \ge 0`.
    alpha : float
        The power :math:`\alpha` of the step-size schedule.
    t0 : float
        The step :math:`t_0` after which the averaging starts.
    step : int
        The 1-based step :math:`t` of this variable (torch counts per parameter).
    eta, mu : float or None
        torch's ``eta`` and ``mu`` before this step (its state); None: the values a constant
        learning rate gives, :func:`asgd_scalars`. Pass the previous result's ``eta`` and
        ``mu`` to follow torch exactly when the learning rate changes between steps.
    convention : None, str or refopt.conventions.Convention
        None means torch; a convention whose ``asgd_form`` is ``"none"`` raises.

    Returns
    -------
    ASGDResult
        ``(param, ax, eta, mu)``: new arrays of the input dtype and shape, and the scalars
        torch stores for the next step (computed with this call's ``learning_rate``).

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; an IndexedSlices gradient; a hyperparameter not
        a real number; ``convention`` of the wrong type.
    ValueError
        A gradient or average whose shape or dtype differs from ``param``'s; a negative or
        non-finite learning rate or ``lambd``; ``alpha``, ``t0`` not finite; ``step`` not an
        integer >= 1; a convention without ASGD. Messages name the argument and the value
        received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once: torch's vectorised
    ``add(alpha=)``); :math:`\bar x` is a Python float converted to the dtype. The scalars
    :math:`\eta, \mu` are float32 (torch's 0-d state tensors, the default dtype), computed
    in Python floats (float64):

    .. math::

        w &\leftarrow w \cdot \overline{1 - \lambda\eta} \\
        w &\leftarrow \mathrm{fma}(\overline{-\eta}, g, w) \\
        a &\leftarrow a + (w - a)\,\bar\mu \quad\text{if } \mu \ne 1,
            \text{ else } a \leftarrow w \\
        \eta &\leftarrow \mathrm{f32}\big(\gamma / (1 + \lambda\gamma t)^{\alpha}\big), \qquad
        \mu \leftarrow \mathrm{f32}\big(1 / \max(1, t - t_0)\big)

    with :math:`\eta = \mathrm{f32}(\gamma)` and :math:`\mu = 1` at the first step, so the
    step size of step :math:`t` is computed at the end of step :math:`t-1` (with the learning
    rate of *that* step: a learning rate that changes acts one step late) and the average is a
    plain copy of the variable until :math:`t - 1 - t_0 > 1`. torch's step counter is a
    float32 tensor: from :math:`2^{24}` on it no longer moves, and neither do
    :math:`\eta, \mu`.

    float16: each operation rounded to float16; not checked against torch (which computes
    float16 in float32 inside its kernels).

    Examples
    --------
    One step from ``w = 1`` with ``g = 0.5`` (torch: ``w = 1*(1 - 1e-4*0.01) - 0.01*0.5``):

    >>> import numpy as np
    >>> w = np.array([1.0], np.float32)
    >>> r = asgd_update(w, np.array([0.5], np.float32), asgd_initial_state(w),
    ...                 learning_rate=0.01, lambd=1e-4, alpha=0.75, t0=1e6, step=1)
    >>> r.param, r.ax
    (array([0.994999], dtype=float32), array([0.994999], dtype=float32))

    References
    ----------
    Polyak & Juditsky, "Acceleration of stochastic approximation by averaging", SIAM J.
    Control Optim. 30(4) (1992).
    """
    param, grad, ax, _ = check_asgd_args(
        param, grad, ax, learning_rate=learning_rate, lambd=lambd, alpha=alpha, t0=t0,
        step=step, eta=eta, mu=mu, convention=convention)
    eta0, mu0 = asgd_scalars(learning_rate, lambd, alpha, t0, step)
    eta = eta0 if eta is None else float(eta)
    mu = mu0 if mu is None else float(mu)
    with np.errstate(all="ignore"):
        w, a = _torch(param, grad, ax, eta, mu, lambd)
    return ASGDResult(np.asarray(w), np.asarray(a), _next_eta(learning_rate, lambd, alpha, step),
                      _next_mu(t0, step))
