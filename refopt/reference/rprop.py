"""Rprop (resilient backpropagation) as PyTorch computes it (``Convention.rprop_form``).

Only PyTorch has Rprop (``torch.optim.Rprop``); every other convention's ``rprop_form`` is
``"none"`` and is refused. Each element keeps its own step size, grown by ``etaplus`` while
the gradient keeps its sign, shrunk by ``etaminus`` when it flips (and that step skipped),
clamped to ``step_sizes``; the variable moves by the step size against the gradient's sign.
The learning rate is only the step sizes' start.

Source (read for facts only; nothing here is copied from it):

======  ====================================================================================
form    framework file
======  ====================================================================================
torch   ``torch/optim/rprop.py`` (``Rprop._init_group``, ``_single_tensor_rprop`` with
        ``differentiable=False``: the default for-loop path on CPU), torch 2.13
======  ====================================================================================
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import as_float_array, check_like, check_scalar, scalar

__all__ = [
    "RpropResult",
    "rprop_defaults",
    "rprop_initial_state",
    "rprop_update",
    "torch_sign",
]

_DEFAULTS = {
    "torch": dict(learning_rate=0.01, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0)),
}


class RpropResult(NamedTuple):
    """New arrays after one Rprop step: ``param``, ``prev`` (the gradient kept for the next
    sign comparison, zero where the sign flipped) and ``step_size`` (per element), under
    torch's state names."""

    param: np.ndarray
    prev: np.ndarray
    step_size: np.ndarray


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
    if conv.rprop_form == "none":
        raise ValueError(
            f"Rprop does not exist under convention={conv.name!r} ({conv.framework} has "
            f"no Rprop; only PyTorch does: rprop_form='none'). Received: "
            f"convention={conv.name!r}"
        )
    return conv.rprop_form


def rprop_defaults(convention=None):
    """``torch.optim.Rprop``'s constructor defaults under refopt's names:
    ``learning_rate`` 0.01, ``etas`` (0.5, 1.2), ``step_sizes`` (1e-6, 50). ``convention``:
    None means torch; a convention without Rprop raises ValueError."""
    return dict(_DEFAULTS[_form(convention)])


def _pair(name, value):
    if (isinstance(value, (str, bytes)) or not hasattr(value, "__len__")
            or len(value) != 2):
        raise TypeError(f"`{name}` must be a pair of real numbers. Received: {name}={value!r}")
    a, b = value
    for x in (a, b):
        if not isinstance(x, numbers.Real) or isinstance(x, (bool, np.bool_)):
            raise TypeError(
                f"`{name}` must be a pair of real numbers. Received: {name}={value!r}")
        if not math.isfinite(float(x)):
            raise ValueError(f"`{name}` must be finite. Received: {name}={value!r}")
    return a, b


def check_etas(etas):
    """``(etaminus, etaplus)`` with ``0 < etaminus < 1 < etaplus`` (torch's check), finite;
    returned as a tuple."""
    em, ep = _pair("etas", etas)
    if not 0.0 < em < 1.0 < ep:
        raise ValueError(
            "`etas` must be (etaminus, etaplus) with 0 < etaminus < 1 < etaplus. "
            f"Received: etas={etas!r}"
        )
    return (em, ep)


def check_step_sizes(step_sizes):
    """``(min, max)`` with ``0 <= min <= max``, finite; returned as a tuple."""
    lo, hi = _pair("step_sizes", step_sizes)
    if not 0 <= lo <= hi:
        raise ValueError(
            "`step_sizes` must be (min, max) with 0 <= min <= max. "
            f"Received: step_sizes={step_sizes!r}"
        )
    return (lo, hi)


def rprop_initial_state(param, *, learning_rate, convention=None):
    """Fresh ``(prev, step_size)`` for ``param``: zeros, and the learning rate in the dtype
    everywhere (torch's ``full_like(grad, lr)``), new arrays of ``param``'s shape and dtype."""
    param = as_float_array("param", param)
    _form(convention)
    check_scalar("learning_rate", learning_rate)
    return (np.zeros(param.shape, param.dtype),
            np.full(param.shape, scalar(param.dtype, learning_rate), param.dtype))


def torch_sign(x):
    """``torch.sign`` on CPU: 1 where ``x > 0``, -1 where ``x < 0``, else +0 (so
    ``sign(NaN) = 0`` and ``sign(-0.0) = +0``; NumPy's ``np.sign`` gives NaN and -0.0)."""
    dt = x.dtype
    return np.where(x > 0, dt.type(1), np.where(x < 0, dt.type(-1), dt.type(0))).astype(dt)


def check_rprop_args(param, grad, prev, step_size, *, etas, step_sizes, convention):
    """Validate :func:`rprop_update`'s arguments (its Raises section); return
    ``(param, grad, prev, step_size, etas, step_sizes)``. Shared with the fast backends."""
    param = as_float_array("param", param)
    _form(convention)
    if isinstance(grad, IndexedSlices):
        raise TypeError(
            "torch.optim.Rprop does not support sparse gradients; pass grad.to_dense(). "
            "Received: grad of type IndexedSlices"
        )
    grad = check_like(param, "grad", grad)
    prev = check_like(param, "prev", prev)
    step_size = check_like(param, "step_size", step_size)
    return (param, grad, prev, step_size, check_etas(etas), check_step_sizes(step_sizes))


def rprop_update(param, grad, prev, step_size, *, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0),
                 convention=None):
    r"""One Rprop step as ``torch.optim.Rprop`` computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``
        The gradient :math:`g` (dense; torch refuses sparse gradients).
    prev : ndarray like ``param``
        The previous step's gradient :math:`p` (zero where its sign had flipped; zeros at
        the start).
    step_size : ndarray like ``param``
        The per-element step sizes :math:`s` (the learning rate at the start:
        :func:`rprop_initial_state`).
    etas : (float, float), default (0.5, 1.2)
        :math:`(\eta^-, \eta^+)`, ``0 < etaminus < 1 < etaplus``.
    step_sizes : (float, float), default (1e-6, 50)
        :math:`(s_{min}, s_{max})`, ``0 <= min <= max``.
    convention : None, str or refopt.conventions.Convention
        None means torch; a convention whose ``rprop_form`` is ``"none"`` raises.

    Returns
    -------
    RpropResult
        ``(param, prev, step_size)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; an IndexedSlices gradient; ``etas`` or
        ``step_sizes`` not a pair of real numbers; ``convention`` of the wrong type.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; ``etas`` or
        ``step_sizes`` out of range or not finite; a convention without Rprop.

    Notes
    -----
    In the dtype of ``param``, each operation rounded once; :math:`\bar x` is a Python float
    converted to the dtype; :math:`\mathrm{sign}` is ``torch.sign`` (:func:`torch_sign`:
    ``sign(NaN) = 0``):

    .. math::

        f &= \mathrm{sign}(g\,p) \text{ with } 1 \mapsto \bar\eta^+,\
             -1 \mapsto \bar\eta^-,\ 0 \mapsto 1
             \quad\text{(replaced in that order)} \\
        s &\leftarrow \min(\max(s f, \bar s_{min}), \bar s_{max}) \\
        g' &= 0 \text{ where } f = \bar\eta^-, \text{ else } g \\
        w &\leftarrow w + (-\mathrm{sign}(g'))\, s \quad
             \text{(exact product: one rounding)}, \qquad p \leftarrow g'

    The mask compares the *factor* with :math:`\bar\eta^-` (as torch's
    ``sign.eq(etaminus)``), and the replacements run in order: with an ``etaminus`` that
    rounds to 1 in the dtype (say ``1 - 1e-9`` in float32) the zero-sign elements are masked
    too, and one that rounds to 0 is replaced by 1 again. A NaN gradient gives
    :math:`\mathrm{sign} = 0`: factor 1, no move, and ``prev`` becomes NaN (so the next
    step's product is NaN again: factor 1). The first step (``prev = 0``) is
    :math:`w - \overline{lr}\,\mathrm{sign}(g)`. The learning rate plays no other part.

    float16: each operation rounded to float16; not checked against torch.

    Examples
    --------
    >>> import numpy as np
    >>> w = np.array([1.0, -2.0, 0.3], np.float32)
    >>> prev, s = rprop_initial_state(w, learning_rate=0.15)
    >>> rprop_update(w, np.array([1.0, 2.0, 0.0], np.float32), prev, s).param
    array([ 0.85, -2.15,  0.3 ], dtype=float32)

    References
    ----------
    Riedmiller & Braun, "A direct adaptive method for faster backpropagation learning: the
    RPROP algorithm", IEEE ICNN (1993).
    """
    param, grad, prev, step_size, (em, ep), (lo, hi) = check_rprop_args(
        param, grad, prev, step_size, etas=etas, step_sizes=step_sizes, convention=convention)
    dt = param.dtype
    em_, ep_ = scalar(dt, em), scalar(dt, ep)
    with np.errstate(all="ignore"):
        f = torch_sign(grad * prev)
        f = np.where(f > 0, ep_, f).astype(dt)  # sign[sign.gt(0)] = etaplus
        f = np.where(f < 0, em_, f).astype(dt)  # sign[sign.lt(0)] = etaminus
        f = np.where(f == 0, dt.type(1), f).astype(dt)  # sign[sign.eq(0)] = 1
        s = np.minimum(np.maximum(step_size * f, scalar(dt, lo)), scalar(dt, hi))
        g = np.where(f == em_, dt.type(0), grad).astype(dt)  # grad[sign.eq(etaminus)] = 0
        w = param + (dt.type(-1) * torch_sign(g)) * s  # addcmul_(value=-1): exact product
    return RpropResult(np.asarray(w, dt), np.asarray(g, dt), np.asarray(s, dt))
