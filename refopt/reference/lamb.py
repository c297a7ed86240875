"""Lamb, as Keras 3 and optax compute it (``Convention.lamb_form``).

Lamb (You et al., 2019) is Adam with a per-tensor *trust ratio*: each variable's Adam
direction is rescaled by ``||w|| / ||u||`` (the norms of the whole variable and of its
update), so every tensor moves by a step proportional to its own size. The two frameworks
that have it agree on that and differ in everything around it: Keras 3 updates the moments
in its own form (``m + (g - m)*(1 - b1)``), divides the bias corrections out one at a time and
adds epsilon 1e-7 to the corrected root; its weight decay is the base optimizer's decoupled
decay before the step (the norms see the decayed ``w``). optax chains ``scale_by_adam``
(epsilon 1e-6, ``eps_root`` inside the root), ``add_decayed_weights`` (the decay *inside* the
direction, so it enters the trust ratio), ``scale_by_trust_ratio`` and ``-lr``, under
``jax.jit``. :func:`lamb_update` writes each out as readable NumPy in the variable dtype.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
keras3      ``keras/src/optimizers/lamb.py`` (``update_step``), ``keras/src/optimizers/
            base_optimizer.py`` (``_apply_weight_decay``), TensorFlow backend
optax       ``optax/_src/alias.py`` (``lamb``), ``optax/_src/transform.py``
            (``scale_by_adam``, ``add_decayed_weights``, ``scale_by_trust_ratio``),
            ``optax/_src/numerics.py`` (``safe_norm``), under ``jax.jit`` on XLA:CPU
==========  ===============================================================================

torch has no Lamb; tf_keras, Keras 2 and TF1 neither (TF-Addons' ``LAMB`` is not reproduced).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.conventions import Convention, get_convention
from refopt.reference._common import (
    as_float_array,
    check_hyper,
    check_like,
    check_real,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.adafactor import eigen_sum, xla_sum_squares
from refopt.reference.variants import fma

__all__ = [
    "LambResult",
    "check_lamb_args",
    "lamb_defaults",
    "lamb_initial_state",
    "lamb_update",
    "trust_ratio",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

#: Each framework's Lamb defaults, under refopt's (Keras') names.
_DEFAULTS = {
    "keras3": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                   eps_root=None),
    "optax": dict(learning_rate=None, beta_1=0.9, beta_2=0.999, epsilon=1e-6, eps_root=0.0),
}


class LambResult(NamedTuple):
    """New arrays after one Lamb step: ``param``, ``m`` (first moment; Keras' "momentum",
    optax's ``mu``) and ``v`` (second moment; "velocity", ``nu``)."""

    param: np.ndarray
    m: np.ndarray
    v: np.ndarray


def _convention(convention):
    if convention is None:
        return get_convention("keras3")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (keras3), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def _form(conv):
    form = conv.lamb_form
    if form == "none":
        raise ValueError(
            f"convention={conv.name!r} has no Lamb ({conv.framework}); Lamb exists under "
            "'keras3' and 'optax'."
        )
    return form


def lamb_defaults(convention=None):
    """The framework's Lamb constructor defaults, under refopt's argument names.

    Returns
    -------
    dict
        ``learning_rate`` (0.001 Keras 3; None for optax, which requires one), ``beta_1``
        0.9, ``beta_2`` 0.999, ``epsilon`` (**1e-7** Keras 3, **1e-6** optax) and
        ``eps_root`` (optax's epsilon inside the root, 0; None for Keras 3, which has none).

    Raises
    ------
    ValueError
        The convention has no Lamb.
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def lamb_initial_state(param):
    """``(m, v)``: zeros like ``param`` (both frameworks start both moments at zero)."""
    param = as_float_array("param", param)
    return np.zeros_like(param), np.zeros_like(param)


def trust_ratio(w_norm, u_norm, dtype):
    """``||w|| / ||u||``, or 1 when either norm is 0 (both frameworks), in ``dtype``.

    A NaN norm is not 0: Keras 3 tests ``> 0`` (a NaN norm gives 1 there), optax tests
    ``== 0`` (NaN gives NaN); the callers apply their own test, this is the common case.
    """
    one = scalar(dtype, 1)
    if w_norm == 0 or u_norm == 0:
        return one
    return w_norm / u_norm


def _keras3(w, g, m, v, lr, b1, b2, eps, t):
    dt = w.dtype
    one = scalar(dt, 1)
    from refopt import _libm

    p1 = _libm.power(dt, tf_cast(dt, b1), scalar(dt, t))  # ops.power(cast(beta), t)
    p2 = _libm.power(dt, tf_cast(dt, b2), scalar(dt, t))
    m = m + (g - m) * scalar(dt, 1 - b1)      # 1 - beta: a Python float meeting a tensor
    v = v + (g * g - v) * scalar(dt, 1 - b2)
    m_hat = m / (one - p1)
    root = np.sqrt(v / (one - p2)) + scalar(dt, eps)
    u = m_hat / root
    # sqrt(sum(power(x, 2))): Eigen's full reduction order (eigen_sum); its vectorised
    # pow(x, 2) is not always x*x (an ulp off on whole packets), which refopt does not emulate
    w_norm = np.sqrt(eigen_sum(w * w))
    u_norm = np.sqrt(eigen_sum(u * u))
    ratio = w_norm / u_norm if (w_norm > 0 and u_norm > 0) else one  # NaN: 1
    return w - (ratio * lr_cast(dt, lr)) * u, m, v


def _optax(w, g, m, v, lr, b1, b2, eps, eps_root, t, wd):
    dt = w.dtype
    one = scalar(dt, 1)
    work = _F64 if dt == _F64 else _F32
    from refopt import _libm

    # optax's bias correction: 1 - b**count in float32 (float64 with x64), cast to dtype
    bc1 = scalar(dt, work.type(1) - _libm.power(work, work.type(b1), work.type(t)))
    bc2 = scalar(dt, work.type(1) - _libm.power(work, work.type(b2), work.type(t)))
    # (1-b)*g + b*m: XLA contracts it into one FMA under jit
    m = fma(scalar(dt, 1 - b1), g, scalar(dt, b1) * m)
    v = fma(scalar(dt, 1 - b2), g * g, scalar(dt, b2) * v)
    # XLA rewrites (m/bc1) / (sqrt(v/bc2 + eps_root) + eps) into one division (as for adam)
    u = m / (bc1 * (np.sqrt(v / bc2 + scalar(dt, eps_root)) + scalar(dt, eps)))
    if wd is not None:
        u = fma(scalar(dt, wd), w, u)   # add_decayed_weights: u + wd*w, contracted
    w_norm = np.sqrt(xla_sum_squares(w))
    u_norm = np.sqrt(xla_sum_squares(u))
    if w_norm == 0 or u_norm == 0:
        ratio = one
    else:
        ratio = w_norm / (u_norm + scalar(dt, 0))
    u = (u * ratio) * scalar(dt, -float(lr))
    return w + u, m, v


def lamb_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None):
    r"""One Lamb step for one variable, as ``convention.lamb_form`` computes it.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64
        The variable (after the decoupled weight decay of Keras 3, which the pipeline applies
        before this step).
    grad : ndarray, like ``param``
        The dense gradient (neither framework takes sparse gradients for Lamb here).
    m, v : ndarray, like ``param``
        The first and second moments.
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        The 1-based step ``t``.
    convention : None, str or Convention
        ``lamb_form`` ``"keras3"`` (the default) or ``"optax"``.
    eps_root : float or None
        optax's epsilon inside the root (``sqrt(v_hat + eps_root)``); optax only.
    weight_decay : float or None
        optax's ``add_decayed_weights`` rate, added to the direction before the trust
        ratio (``u + wd*w``); optax only (Keras 3's decay is decoupled, outside this step).

    Returns
    -------
    LambResult
        New arrays ``param``, ``m``, ``v``.

    Notes
    -----
    With :math:`\hat m = m_t/(1-\beta_1^t)`, :math:`\hat v = v_t/(1-\beta_2^t)`:

    .. math::

        u = \frac{\hat m}{\sqrt{\hat v + \epsilon_{root}} + \epsilon}\ (+\ wd\,w),\qquad
        r = \begin{cases}\lVert w\rVert/\lVert u\rVert & \lVert w\rVert>0,\ \lVert u\rVert>0
        \\ 1 & \text{otherwise}\end{cases},\qquad w \leftarrow w - r\,lr\,u

    Keras 3 (``lamb.py``): ``m += (g - m)*(1-b1)``, ``v += (g^2 - v)*(1-b2)`` (``1 - beta``
    rounded once from the Python float), ``beta**t`` by ``powf``/``pow`` of the float32
    ``beta`` cast to the dtype, ``m_hat = m/(1 - b1^t)``, ``sqrt(v/(1 - b2^t)) + eps``,
    ``w - (r*lr)*u``; the ratio is 1 unless both norms are ``> 0`` (a NaN norm gives 1).
    optax (``lamb`` under ``jit``): ``fma(1-b, g, b*m)`` moments, ``1 - b**t`` in float32
    (float64 with x64), ``m / (bc1 * (sqrt(v/bc2 + eps_root) + eps))`` (XLA's rewrite), ``fma(wd, w, u)``,
    ``r = ||w|| / (||u|| + 0)`` unless a norm is ``== 0`` (a NaN norm gives NaN),
    ``w + (u*r)*(-lr)``. The norms are ``sqrt`` of NumPy's pairwise sum of squares; the
    frameworks' own reductions add in another order on tensors of 8 elements or more, which
    moves a norm by an ulp (see the golden cases' tolerances).

    .. warning:: Keras 3's default epsilon is 1e-7, optax's 1e-6, and only optax puts the
       weight decay inside the trust ratio.
    """
    param, grad, m, v, conv = check_lamb_args(
        param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, step=step, convention=convention, eps_root=eps_root,
        weight_decay=weight_decay)
    with np.errstate(all="ignore"):
        if conv.lamb_form == "keras3":
            p, m2, v2 = _keras3(param, grad, m, v, learning_rate, beta_1, beta_2, epsilon,
                                step)
        else:
            p, m2, v2 = _optax(param, grad, m, v, learning_rate, beta_1, beta_2, epsilon,
                               0.0 if eps_root is None else eps_root, step, weight_decay)
    dt = param.dtype
    return LambResult(np.asarray(p, dt), np.asarray(m2, dt), np.asarray(v2, dt))


def check_lamb_args(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                    convention, eps_root=None, weight_decay=None):
    """Validate :func:`lamb_update`'s arguments; return ``(param, grad, m, v, convention)``."""
    conv = _convention(convention)
    form = _form(conv)
    param = as_float_array("param", param)
    if not isinstance(grad, np.ndarray):
        raise TypeError(
            f"Lamb takes dense gradients only (convention={conv.name!r}). Received: grad of "
            f"type {type(grad).__name__}")
    grad = check_like(param, "grad", grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    for name, x in (("learning_rate", learning_rate), ("beta_1", beta_1), ("beta_2", beta_2),
                    ("epsilon", epsilon)):
        check_hyper(name, x)
    check_step(step)
    if form != "optax":
        for name, x in (("eps_root", eps_root), ("weight_decay", weight_decay)):
            if x is not None:
                check_real(name, x, low=0)  # a bad type first, as refopt.Lamb
                raise ValueError(
                    f"`{name}` is optax's; convention={conv.name!r} has none for Lamb. "
                    f"Received: {name}={x!r}")
    else:
        for name, x in (("eps_root", eps_root), ("weight_decay", weight_decay)):
            if x is not None:
                check_real(name, x, low=0)
    return param, grad, m, v, conv
