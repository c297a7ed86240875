"""RMSprop, dense, as each framework computes it (``Convention.rmsprop_form``).

Six frameworks, six different RMSprop steps. They differ in where epsilon sits (inside or
outside the square root), in ``rsqrt`` against ``sqrt`` and a division, in how ``1 - rho`` is
rounded, in the order of the centered denominator, in what the momentum buffer holds, in
fused multiply-adds, and even in the first value of the second moment (TF1 starts it at one).
:func:`rmsprop_update` writes each of them out as readable NumPy in the variable dtype with the
rounding points of the framework; the Notes of its docstring give the six formulas.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/rmsprop.py`` (``RMSprop.update_step``, dense branch)
keras3      ``keras/src/optimizers/rmsprop.py`` (``RMSprop.update_step``)
keras2      ``tf_keras/optimizers/legacy/rmsprop.py`` (``_resource_apply_dense``) and, for
            momentum > 0, TensorFlow's ``core/kernels/training_ops.cc`` (``ApplyRMSProp`` /
            ``ApplyCenteredRMSProp`` on CPU)
tf1         ``tensorflow/python/training/rmsprop.py`` (``RMSPropOptimizer``) and the same
            kernels
torch       ``torch/optim/rmsprop.py`` (``_single_tensor_rmsprop``, the default for-loop path
            on CPU)
optax       ``optax/_src/alias.py`` (``rmsprop``), ``optax/_src/transform.py``
            (``scale_by_rms``, ``scale_by_stddev``, ``scale_by_learning_rate``),
            ``optax/transforms/_accumulation.py`` (``trace``), under ``jax.jit`` on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    _EXTRA_DTYPES,
    as_float_array,
    check_flag,
    check_hyper,
    check_like,
    check_scalar,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.variants import fma as _fma_f32_f64
from refopt.reference.sqrt import sqrt_function
from refopt.reference.variants import optax_apply, two_prod

__all__ = [
    "RMSpropResult",
    "rmsprop_update",
    "initial_velocity",
    "rmsprop_initial_state",
    "rmsprop_defaults",
    "rsqrt",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


class RMSpropResult(NamedTuple):
    """New arrays after one RMSprop step.

    ``param``; ``velocity`` (the moving average of ``g**2``: Keras' "velocity", TF's "rms"/"ms",
    torch's "square_avg", optax's "nu"); ``momentum`` (the momentum buffer, None when there is
    none); ``average_gradient`` (the centered form's moving average of ``g``: TF's "mg", torch's
    "grad_avg", optax's "mu"; None when not centered).
    """

    param: np.ndarray
    velocity: np.ndarray
    momentum: Optional[np.ndarray]
    average_gradient: Optional[np.ndarray]


# The constructors' defaults. ``None``: the framework has no default (TF1 and optax require a
# learning rate). optax's ``momentum=None`` (no trace) is momentum 0 here.
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False),
    "keras3": dict(learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False),
    "keras2": dict(learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False),
    "tf1": dict(learning_rate=None, rho=0.9, momentum=0.0, epsilon=1e-10, centered=False),
    "torch": dict(learning_rate=0.01, rho=0.99, momentum=0.0, epsilon=1e-8, centered=False),
    "optax": dict(learning_rate=None, rho=0.9, momentum=0.0, epsilon=1e-8, centered=False),
}


def _convention(convention):
    if convention is None:
        return get_convention("tf_keras")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf_keras), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def rmsprop_defaults(convention=None):
    """The framework's RMSprop constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.rmsprop_form``.

    Returns
    -------
    dict
        ``learning_rate`` (None where the framework requires one: TF1, optax), ``rho`` (torch's
        ``alpha``, TF1's and optax's ``decay``), ``momentum``, ``epsilon`` and ``centered``.
        Epsilon: 1e-7 (tf_keras, Keras 3, Keras 2), **1e-10** (TF1), 1e-8 (torch, optax);
        rho: 0.9, but **0.99** for torch. Keras 2 also turns ``epsilon=0`` (or None) into
        1e-7 (``epsilon or backend.epsilon()``); that substitution belongs to the optimizer,
        :func:`rmsprop_update` uses the epsilon it is given.
    """
    return dict(_DEFAULTS[_convention(convention).rmsprop_form])


def initial_velocity(convention=None, dtype=np.float32):
    """The value the framework fills the ``velocity`` slot with before the first step.

    ``1`` for TF1 (``tf.compat.v1.train.RMSPropOptimizer`` creates its "rms" slot with a
    ones initializer, ``tensorflow/python/training/rmsprop.py``, ``_create_slots``); ``0`` for
    every other form (optax's default ``initial_scale=0.0``; ``initial_scale=1.0`` reproduces
    TF1's start). :func:`rmsprop_update` cannot see the start, so a caller starting from fresh
    state must use this value.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras.
    dtype : numpy dtype
        float16, float32 or float64.

    Returns
    -------
    numpy.floating
        The value, in ``dtype``.
    """
    dtype = np.dtype(dtype)
    if dtype not in (_F16, _F32, _F64):
        raise TypeError(f"`dtype` must be float16, float32 or float64. Received: dtype={dtype}")
    form = _convention(convention).rmsprop_form
    return dtype.type(1 if form == "tf1" else 0)


def rmsprop_initial_state(param, *, momentum, centered, convention=None):
    """Fresh slots for ``param`` as the framework creates them: ``(velocity, momentum, average)``.

    ``velocity`` is filled with :func:`initial_velocity`; the momentum buffer is zeros when
    ``momentum > 0``, and always for TF1 (its "momentum" slot exists even with momentum 0),
    else None; ``average_gradient`` is zeros when ``centered``, else None. New arrays of
    ``param``'s shape and dtype.
    """
    param = as_float_array("param", param)
    check_scalar("momentum", momentum)
    centered = check_flag("centered", centered)
    conv = _convention(convention)
    velocity = np.full(param.shape, initial_velocity(conv, param.dtype), param.dtype)
    keeps_buffer = momentum > 0 or conv.rmsprop_form == "tf1"
    buf = np.zeros_like(param) if keeps_buffer else None
    avg = np.zeros_like(param) if centered else None
    return velocity, buf, avg


# ----------------------------------------------------------------------------- rsqrt
def _reduce(x64):
    """``x = f * 2**e`` with ``f`` in [0.5, 2) and ``e`` even (exact), so ``rsqrt(x) =
    rsqrt(f) * 2**(-e/2)`` and the work on ``f`` can neither overflow nor underflow."""
    f, e = np.frexp(x64)
    odd = (e % 2) != 0
    return np.where(odd, f * 2.0, f), np.where(odd, e - 1, e)


def _residual(m, f):
    """The sign of ``m*m*f - 1`` (exact) for float64 ``m`` of at most 26 bits, ``f`` near
    ``1/m**2``: ``m*m`` is exact, ``(m*m)*f == p + e`` exactly and ``p - 1`` is exact
    (Sterbenz), so the rounded sum ``(p - 1) + e`` has the sign of the exact value."""
    p, e = two_prod(m * m, f)
    return (p - 1.0) + e


def _rsqrt_positive(x):
    """Correctly rounded ``1/sqrt(x)`` for finite ``x > 0`` (a 1-D array)."""
    dtype = x.dtype
    f, e = _reduce(x.astype(_F64))
    if dtype == _F16:
        # 1/sqrt in float64 is within 2**-52 (relative) of the root, and no float16 midpoint
        # comes that close to 1/sqrt of a float16, so one rounding to float16 is correct.
        y = 1.0 / np.sqrt(f)
        return np.ldexp(y, -(e // 2)).astype(_F16)
    if dtype == _F32:
        # float64 first, then at most a one-ulp correction decided exactly at the midpoints.
        y = (1.0 / np.sqrt(f)).astype(_F32)
        up = np.nextafter(y, np.float32(np.inf))
        down = np.nextafter(y, np.float32(0))
        y64 = y.astype(_F64)
        mid_up = (y64 + up.astype(_F64)) * 0.5  # 25 bits: exact
        mid_down = (y64 + down.astype(_F64)) * 0.5
        y = np.where(_residual(mid_up, f) < 0, up, y)  # root above the upper midpoint
        y = np.where(_residual(mid_down, f) > 0, down, y)  # root below the lower midpoint
        return np.ldexp(y.astype(_F64), -(e // 2)).astype(_F32)
    # float64: one Newton step on y0 = 1/sqrt(f) with the residual z = y0*y0*f - 1 computed
    # to about 2**-104 by error-free products, then y0*(1 - z/2 + 3z^2/8) rounded once.
    y0 = 1.0 / np.sqrt(f)
    a, b = two_prod(y0, y0)
    c, d = two_prod(a, f)
    z = ((c - 1.0) + d) + b * f
    y = y0 + y0 * (z * (0.375 * z - 0.5))
    return np.ldexp(y, -(e // 2))


def rsqrt(x):
    r"""The correctly rounded reciprocal square root :math:`1/\sqrt{x}`, elementwise.

    Parameters
    ----------
    x : ndarray of float16, float32 or float64 (or a NumPy scalar of those)

    Returns
    -------
    ndarray of the same dtype and shape
        ``0 -> inf``, ``-0 -> -inf``, ``inf -> 0``, negative or NaN ``-> NaN`` (IEEE
        ``1/sqrt(x)``).

    Notes
    -----
    float16: ``1/sqrt`` in float64 rounded once (always correct: no float16 midpoint lies
    within float64's error of a float16's reciprocal root). float32: the same, then a
    correction by at most one ulp decided *exactly* at the midpoints ``m`` between float32
    neighbours (the sign of ``m^2 x - 1`` from an error-free product), so every result is
    correctly rounded. float64: ``y0 = 1/sqrt(x)`` refined by one Newton step whose residual
    ``y0^2 x - 1`` is computed with error-free products (about 2**-104 accurate), rounded once;
    correct except where the root lies within about 2**-104 (relative) of a midpoint between
    doubles (none known; a double-precision hard case would be needed). Arguments are first
    scaled by an even power of two, so no step overflows or underflows.

    The frameworks' ``rsqrt`` is *not* correctly rounded: TF's CPU ``tf.math.rsqrt`` (Eigen,
    hardware estimate plus a Newton step) is off by up to about 3 ulp in float32, XLA:CPU's
    ``lax.rsqrt`` by 1 ulp; golden cases that use it carry a tolerance.
    """
    x = np.asarray(x)
    if x.dtype in _EXTRA_DTYPES.get():  # bfloat16 in its dtype: the float32 root, rounded once
        return rsqrt(x.astype(_F32)).astype(x.dtype)
    if x.dtype not in (_F16, _F32, _F64):
        raise TypeError(f"`x` must have dtype float16, float32 or float64. Received: {x.dtype}")
    with np.errstate(all="ignore"):
        out = np.asarray(np.divide(x.dtype.type(1), np.sqrt(x))).copy()
        flat = out.reshape(-1)
        xf = x.reshape(-1)
        ok = np.isfinite(xf) & (xf > 0)
        if ok.any():
            flat[ok] = _rsqrt_positive(xf[ok])
    return out


# ----------------------------------------------------------------------------- FMA
def _fma(a, b, c):
    """``a*b + c`` rounded once to the dtype (float16: through float64, where the product of
    two float16 is exact)."""
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    dtype = np.result_type(a, b, c)
    if dtype == _F16:
        with np.errstate(all="ignore"):
            return (a.astype(_F64) * b.astype(_F64) + c.astype(_F64)).astype(_F16)
    return np.asarray(_fma_f32_f64(a, b, c))


def _lerp(start, end, weight):
    """PyTorch's ``start.lerp_(end, weight)`` on CPU: one FMA, branch on ``|weight| < 0.5``."""
    d = end - start
    if abs(float(weight)) < 0.5:
        return _fma(weight, d, start)
    return _fma(weight - weight.dtype.type(1), d, end)


# ----------------------------------------------------------------------------- the forms
def _keras(w, g, v, mom, avg, lr, rho, momentum, eps, centered, use_rsqrt):
    """tf_keras 2.11+ (``use_rsqrt``) and Keras 3 (sqrt and a division)."""
    dt = w.dtype
    lr = lr_cast(dt, lr)  # a float32 variable, cast to the dtype
    r, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)  # Python floats
    v = r * v + c * np.square(g)
    if centered:
        avg = r * avg + c * g
        den = (v - np.square(avg)) + e
    else:
        den = v + e
    if use_rsqrt:
        inc = (lr * g) * rsqrt(den)
    else:
        inc = (lr * g) / np.sqrt(den)
    if momentum > 0:
        mom = scalar(dt, momentum) * mom + inc
        return w - mom, v, mom, avg
    return w - inc, v, (None if mom is None else mom.copy()), avg


def _kernel(w, g, v, mom, avg, lr, rho, momentum, eps, centered):
    """TensorFlow's ``ApplyRMSProp`` / ``ApplyCenteredRMSProp`` CPU kernels (scalars already
    in the dtype): epsilon inside the root, ``1 - rho`` in the dtype, a true division."""
    c = scalar(w.dtype, 1) - rho
    v = v + (np.square(g) - v) * c
    if centered:
        avg = avg + (g - avg) * c
        den = (v - np.square(avg)) + eps
    else:
        den = v + eps
    mom = mom * momentum + (g * lr) / np.sqrt(den)
    return w - mom, v, mom, avg


def _keras2(w, g, v, mom, avg, lr, rho, momentum, eps, centered):
    """Keras 2 legacy ``RMSprop``: the kernel when momentum > 0, else its Python branch."""
    dt = w.dtype
    # lr, rho and momentum are float32 hyperparameter variables cast to the dtype
    lr_t, r, mu = lr_cast(dt, lr), lr_cast(dt, rho), lr_cast(dt, momentum)
    e = scalar(dt, eps)  # tf.convert_to_tensor(epsilon, var_dtype)
    if momentum > 0:
        return _kernel(w, g, v, mom, avg, lr_t, r, mu, e, centered)
    c = scalar(dt, 1) - r
    v = r * v + c * np.square(g)
    den = v
    if centered:
        avg = r * avg + c * g
        den = v - np.square(avg)
    w = w - (lr_t * g) / (np.sqrt(den) + e)  # epsilon OUTSIDE the root
    return w, v, (None if mom is None else mom.copy()), avg


def _tf1(w, g, v, mom, avg, lr, rho, momentum, eps, centered):
    """TF1 ``RMSPropOptimizer``: always the kernel; every scalar via a float32 tensor."""
    dt = w.dtype
    return _kernel(w, g, v, mom, avg, tf_cast(dt, lr), tf_cast(dt, rho),
                   tf_cast(dt, momentum), tf_cast(dt, eps), centered)


def _torch(w, g, v, mom, avg, lr, rho, momentum, eps, centered, sqrt=np.sqrt):
    """PyTorch ``_single_tensor_rmsprop`` on CPU: Python-float scalars, FMA primitives;
    ``sqrt``: the convention's root (MKL's under ``sqrt="mkl"``, refopt.reference.sqrt)."""
    dt = w.dtype
    a, c = scalar(dt, rho), scalar(dt, 1 - rho)  # alpha; 1 - alpha in float64, then cast
    v = v * a  # square_avg.mul_(alpha)
    v = _fma(c * g, g, v)  # .addcmul_(g, g, value=1-alpha): value*g rounded, then one FMA
    if centered:
        avg = _lerp(avg, g, c)  # grad_avg.lerp_(g, 1-alpha)
        root = sqrt(_fma(-avg, avg, v))  # square_avg.addcmul(ga, ga, value=-1).sqrt_()
    else:
        root = sqrt(v)  # square_avg.sqrt()   (MKL's sqrt in torch: see Notes)
    den = root + scalar(dt, eps)  # avg.add_(eps): epsilon OUTSIDE the root
    neg_lr = scalar(dt, -float(lr))
    if momentum > 0:
        mom = mom * scalar(dt, momentum) + g / den  # buf.mul_(momentum).addcdiv_(g, avg)
        return _fma(neg_lr, mom, w), v, mom, avg  # param.add_(buf, alpha=-lr)
    w = w + (neg_lr * g) / den  # param.addcdiv_(g, avg, value=-lr)
    return w, v, (None if mom is None else mom.copy()), avg


def _optax(w, g, v, mom, avg, lr, rho, momentum, eps, centered, eps_in_sqrt, jit="update"):
    """optax ``rmsprop`` under ``jax.jit`` (XLA:CPU contracts ``a*x + b*y`` into one FMA),
    then ``optax.apply_updates`` outside jit (``w + u``, one rounding). ``jit``
    (``Convention.optax_jit``): ``"eager"`` rounds every operation (no FMA); ``"step"``
    also fuses ``w + (-lr)*u`` into one FMA (without momentum)."""
    dt = w.dtype
    d, c, e = scalar(dt, rho), scalar(dt, 1 - rho), scalar(dt, eps)
    eager = jit == "eager"
    v = c * np.square(g) + d * v if eager else _fma(c, np.square(g), d * v)
    if centered:
        avg = c * g + d * avg if eager else _fma(c, g, d * avg)  # (1-decay)*g + decay*mu
        # nu - |mu|**2, contracted under jit
        second = v - avg * avg if eager else _fma(-avg, avg, v)
    else:
        second = v
    if eps_in_sqrt:
        s = rsqrt(second + e)  # lax.rsqrt(n + eps)   (XLA's rsqrt: see Notes)
    else:
        s = scalar(dt, 1) / (np.sqrt(second) + e)  # 1 / (sqrt(n) + eps)
    if mom is None:  # scale_by_learning_rate: (-lr) * updates, then apply_updates
        return optax_apply(w, s * g, scalar(dt, -float(lr)), jit), v, None, avg
    u = scalar(dt, -float(lr)) * (s * g)
    # trace(decay=momentum): t = u + momentum*t, one FMA on momentum*t under jit
    mom = u + scalar(dt, momentum) * mom if eager else _fma(scalar(dt, momentum), mom, u)
    return w + mom, v, mom, avg


_FORM_FUNCTIONS = {
    "keras2": _keras2,
    "tf1": _tf1,
    "torch": _torch,
}


def rmsprop_update(param, grad, velocity, momentum_buf=None, average_gradient=None, *,
                   learning_rate, rho, momentum, epsilon, centered, convention=None,
                   eps_in_sqrt=None):
    r"""One RMSprop step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``
        The gradient :math:`g` (dense only: an IndexedSlices raises NotImplementedError;
        sparse RMSprop comes with the sparse family of reference functions).
    velocity : ndarray like ``param``
        The moving average of :math:`g^2`, :math:`v` (Keras "velocity", TF "rms", torch
        "square_avg", optax "nu"). A fresh one is filled with :func:`initial_velocity`:
        **ones for TF1**, zeros otherwise.
    momentum_buf : ndarray like ``param``, or None
        The momentum buffer :math:`b`, in the framework's own units (see Notes). Required when
        ``momentum > 0``, and always for TF1 (whose "momentum" slot always exists and is
        always updated). With ``momentum == 0`` it may be None; if given it is returned
        unchanged (tf_keras, Keras 3, Keras 2, torch never touch it then), or updated as the
        framework does (TF1's kernel; optax's ``trace`` with ``momentum=0.0``, which is not
        optax's default ``momentum=None``).
    average_gradient : ndarray like ``param``, or None
        The centered form's moving average of :math:`g`, :math:`a` (TF "mg", torch
        "grad_avg", optax "mu"). Required when ``centered``, must be None otherwise.
    learning_rate : float
        :math:`\eta`.
    rho : float
        The decay of the moving averages, :math:`\rho` (torch's ``alpha``, TF1's and optax's
        ``decay``).
    momentum : float
        :math:`\mu \ge 0`; ``0`` means no momentum.
    epsilon : float
        :math:`\epsilon`, used as given (see :func:`rmsprop_defaults` for each framework's
        default and Keras 2's ``epsilon=0`` substitution).
    centered : bool
        Divide by an estimate of the standard deviation, :math:`\sqrt{v - a^2}`, instead of
        :math:`\sqrt{v}`.
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.rmsprop_form``.
    eps_in_sqrt : bool or None
        optax only: its ``rmsprop(eps_in_sqrt=...)`` (default True). None means the
        framework's own placement; another form with a bool raises ValueError (their
        placement is fixed).

    Returns
    -------
    RMSpropResult
        ``(param, velocity, momentum, average_gradient)``, new arrays of the input dtype and
        shape; ``momentum`` is None when ``momentum_buf`` was None, ``average_gradient`` when
        not centered.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``centered`` or ``eps_in_sqrt`` not a bool; ``convention`` of the wrong type.
    ValueError
        A state array whose shape or dtype differs from ``param``'s; ``momentum < 0``;
        ``momentum_buf`` missing when it is needed; ``average_gradient`` missing when
        ``centered`` or given when not; ``eps_in_sqrt`` for a form other than optax.
        Messages name the argument and the value received.
    NotImplementedError
        ``grad`` is an IndexedSlices.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once, unless written
    :math:`\mathrm{fma}(a, b, c)` (:math:`ab + c` rounded once). :math:`\eta_{32}` is the
    learning rate rounded to float32 and then to the dtype (the float32 variable of Keras);
    :math:`[x]_{32}` a number converted as ``tf.cast`` of a float32 tensor does
    (:func:`refopt.reference._common.tf_cast`); :math:`\bar x` a Python number converted
    straight to the dtype; :math:`\overline{1-\rho}` the difference taken in float64, then
    converted; :math:`(1 - \rho)_T` the difference taken in the dtype. :math:`\mathrm{rsqrt}`
    is :func:`rsqrt` (correctly rounded).

    **tf_keras** (tf.keras 2.11+; ``jit_compile`` is ignored without a GPU, so these are
    TensorFlow's eager CPU ops):

    .. math::

        v &\leftarrow \bar\rho v + \overline{1-\rho}\, g^2 \\
        a &\leftarrow \bar\rho a + \overline{1-\rho}\, g, \quad
        d = (v - a^2) + \bar\epsilon \quad\text{(centered; else } d = v + \bar\epsilon) \\
        i &= (\eta_{32} g)\,\mathrm{rsqrt}(d) \\
        b &\leftarrow \bar\mu b + i, \quad w \leftarrow w - b \quad (\mu > 0;
        \text{ else } w \leftarrow w - i)

    TensorFlow's CPU ``rsqrt`` is not correctly rounded (float32: a hardware estimate refined
    by Eigen, up to about 3 ulp off; float64: ``1/sqrt`` rounded twice, which the golden
    case ``tf_keras/rmsprop_f64`` matches exactly). The reference rounds it correctly, so
    ``i`` (hence ``w`` and ``b``) may differ from tf_keras in the last bits, more ulp of ``w``
    or ``b`` where ``w - i`` or ``\mu b + i`` cancels; the golden cases carry that tolerance
    (each differing element of them is reproduced exactly with the rsqrt moved by 1 ulp).

    **keras3** (Keras 3, TensorFlow backend): as tf_keras with :math:`i = (\eta_{32} g) /
    \sqrt{d}` (``ops.sqrt`` and ``ops.divide``, both correctly rounded).

    **keras2** (Keras 2 legacy ``OptimizerV2``): :math:`\eta`, :math:`\rho`, :math:`\mu` are
    float32 hyperparameter variables cast to the dtype (:math:`\eta_{32}, \rho_{32},
    \mu_{32}`), :math:`(1-\rho)_T = 1 - \rho_{32}` in the dtype, :math:`\bar\epsilon` straight.
    With :math:`\mu = 0`, the optimizer's Python code, **epsilon outside the root**:

    .. math::

        v &\leftarrow \rho_{32} v + (1-\rho)_T\, g^2, \quad
        a \leftarrow \rho_{32} a + (1-\rho)_T\, g \\
        w &\leftarrow w - (\eta_{32} g) / (\sqrt{d} + \bar\epsilon), \quad
        d = v - a^2 \text{ (centered) or } v

    With :math:`\mu > 0`, the ``ResourceApply[Centered]RMSProp`` kernel, **epsilon inside**:

    .. math::

        v &\leftarrow v + (g^2 - v)(1-\rho)_T, \quad a \leftarrow a + (g - a)(1-\rho)_T \\
        d &= (v - a^2) + \bar\epsilon \text{ (centered) or } v + \bar\epsilon \\
        b &\leftarrow b\mu_{32} + (g\eta_{32}) / \sqrt{d}, \quad w \leftarrow w - b

    **tf1** (``tf.compat.v1.train.RMSPropOptimizer``): always the kernel above, momentum 0
    included, with every scalar :math:`[\cdot]_{32}` (:math:`[\eta]_{32}, [\rho]_{32},
    [\mu]_{32}, [\epsilon]_{32}`: ``convert_to_tensor`` makes a float32 tensor, then
    ``tf.cast``), so a float64 variable sees ``float32(epsilon)``. Its "rms" slot starts at
    **one** (:func:`initial_velocity`) and its "momentum" slot always exists; default epsilon
    1e-10.

    **torch** (``torch.optim.RMSprop``, single-tensor for-loop path, CPU): Python-float scalars
    converted to the dtype where each primitive applies them; ``addcmul`` rounds
    ``value*t1`` and then does one FMA, ``lerp`` is one FMA (branch on the weight),
    ``add(alpha=)`` one FMA, ``addcdiv`` rounds ``value*t1``, divides, then adds; **epsilon
    outside the root**:

    .. math::

        v &\leftarrow \mathrm{fma}(\overline{1-\rho}\, g,\ g,\ v\bar\rho) \\
        a &\leftarrow \mathrm{lerp}(a, g, \overline{1-\rho}), \quad
        d = \sqrt{\mathrm{fma}(-a, a, v)} + \bar\epsilon
        \quad\text{(centered; else } d = \sqrt{v} + \bar\epsilon) \\
        b &\leftarrow b\bar\mu + g/d, \quad w \leftarrow \mathrm{fma}(\overline{-\eta}, b, w)
        \quad (\mu > 0;\ \text{else } w \leftarrow w + (\overline{-\eta} g)/d)

    torch's CPU ``sqrt`` goes through MKL's vector math and is not correctly rounded (about
    17% of float32 results 1 ulp off, 1.3% of float64); the reference's is, so ``w`` and
    ``b`` may differ in the last bits (the golden cases differ only where that sqrt is 1 ulp
    off, amplified where the update cancels). The momentum buffer holds
    :math:`\sum \mu^k g/d`, without the learning rate.

    **optax** (``optax.rmsprop`` = ``scale_by_rms`` or ``scale_by_stddev``, then
    ``scale_by_learning_rate``, then ``trace`` when momentum is set; the update under
    ``jax.jit``, where XLA:CPU contracts multiply-adds into one FMA, on the product written
    inside the fma below (confirmed bit for bit by the golden cases), and ``apply_updates``
    outside):

    .. math::

        v &\leftarrow \mathrm{fma}(\overline{1-\rho},\ g^2,\ \bar\rho v), \quad
        a \leftarrow \mathrm{fma}(\overline{1-\rho},\ g,\ \bar\rho a) \\
        s &= \mathrm{rsqrt}(q + \bar\epsilon) \text{ (eps\_in\_sqrt, default)}
        \quad\text{or}\quad s = 1 / (\sqrt{q} + \bar\epsilon), \quad
        q = \mathrm{fma}(-a, a, v) \text{ (centered) or } v \\
        u &= \overline{-\eta}\,(s g), \quad
        t \leftarrow \mathrm{fma}(\bar\mu,\ t,\ u), \quad
        w \leftarrow w + t \quad (\text{momentum; else } w \leftarrow w + u)

    XLA:CPU's ``rsqrt`` is not correctly rounded (1 ulp on about 14% of float32 values; the
    golden cases differ only there, amplified where the update cancels). The momentum
    buffer (optax's trace) holds the **negative, learning-rate-scaled** update:
    :math:`w \leftarrow w + t`, whereas Keras, TF and torch subtract theirs.

    Where the forms differ, in short: epsilon inside the root (tf_keras, Keras 3, Keras 2 with
    momentum, TF1, optax by default) or outside (Keras 2 without momentum, torch, optax with
    ``eps_in_sqrt=False``); ``1 - rho`` from float64 (tf_keras, Keras 3, torch, optax) or in
    the dtype (Keras 2, TF1); the centered denominator :math:`(v - a^2) + \epsilon` in every
    form that adds epsilon inside; the momentum buffer in parameter units (Keras, TF), in
    gradient units (torch) or negated (optax); TF1's ones start; the defaults (torch
    ``alpha=0.99``, ``eps=1e-8``; TF1 ``epsilon=1e-10``).

    float16: every form is evaluated with each operation rounded to float16 (as TensorFlow's
    Eigen and NumPy do); the FMA steps round once from float64. Not checked against torch or
    optax, which compute some float16 primitives in float32.

    Examples
    --------
    The Keras docstring example (``RMSprop(learning_rate=0.1)``, ``var = 10``,
    ``loss = var**2 / 2``):

    >>> import numpy as np
    >>> w, z = np.array([10.0], np.float32), np.zeros(1, np.float32)
    >>> r = rmsprop_update(w, w.copy(), z, learning_rate=0.1, rho=0.9, momentum=0.0,
    ...                    epsilon=1e-7, centered=False)
    >>> r.param, r.velocity
    (array([9.683772], dtype=float32), array([10.], dtype=float32))

    References
    ----------
    Hinton, Srivastava & Swersky, "Neural Networks for Machine Learning", lecture 6e (2012).
    Graves, "Generating Sequences With Recurrent Neural Networks", arXiv:1308.0850 (centered).
    """
    param, grad, velocity, momentum_buf, average_gradient, form = check_rmsprop_args(
        param, grad, velocity, momentum_buf, average_gradient, learning_rate=learning_rate,
        rho=rho, momentum=momentum, epsilon=epsilon, centered=centered, convention=convention,
        eps_in_sqrt=eps_in_sqrt)
    args = (param, grad, velocity, momentum_buf, average_gradient, learning_rate, rho,
            momentum, epsilon, centered)
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3"):
            out = _keras(*args, use_rsqrt=(form == "tf_keras"))
        elif form == "optax":
            out = _optax(*args, eps_in_sqrt=True if eps_in_sqrt is None else eps_in_sqrt,
                         jit=_convention(convention).optax_jit)
        elif form == "torch":  # the convention's root (knob `sqrt`: MKL's, torch.sqrt on CPU)
            out = _torch(*args, sqrt=sqrt_function(_convention(convention)))
        else:
            out = _FORM_FUNCTIONS[form](*args)
    w, v, b, a = out
    return RMSpropResult(
        np.asarray(w), np.asarray(v),
        None if b is None else np.asarray(b),
        None if a is None else np.asarray(a),
    )


def check_rmsprop_args(param, grad, velocity, momentum_buf, average_gradient, *, learning_rate,
                       rho, momentum, epsilon, centered, convention, eps_in_sqrt):
    """Validate :func:`rmsprop_update`'s arguments (its Raises section); return
    ``(param, grad, velocity, momentum_buf, average_gradient, form)``. Shared with the fast
    backends' ``rmsprop_update`` so that they raise the same errors."""
    param = as_float_array("param", param)
    if isinstance(grad, IndexedSlices):
        raise NotImplementedError(
            "rmsprop_update takes dense gradients only; sparse RMSprop (IndexedSlices) comes "
            "with the sparse family of reference functions. Received: grad of type "
            "IndexedSlices"
        )
    grad = check_like(param, "grad", grad)
    velocity = check_like(param, "velocity", velocity)
    for name, value in (("learning_rate", learning_rate), ("rho", rho),
                        ("momentum", momentum), ("epsilon", epsilon)):
        check_hyper(name, value)
    if not momentum >= 0:
        raise ValueError(f"`momentum` must be >= 0. Received: momentum={momentum!r}")
    centered = check_flag("centered", centered)
    conv = _convention(convention)
    form = conv.rmsprop_form
    if eps_in_sqrt is not None:
        eps_in_sqrt = check_flag("eps_in_sqrt", eps_in_sqrt)
        if form != "optax":
            raise ValueError(
                "`eps_in_sqrt` is optax's option; the other frameworks fix where epsilon "
                f"goes. Received: eps_in_sqrt={eps_in_sqrt!r} with rmsprop_form={form!r}"
            )
    if momentum_buf is not None:
        momentum_buf = check_like(param, "momentum_buf", momentum_buf)
    elif momentum > 0 or form == "tf1":
        why = ("TF1 always keeps (and updates) a momentum slot" if form == "tf1"
               else "momentum > 0 needs the buffer")
        raise ValueError(
            f"`momentum_buf` must be an array like the variable: {why} "
            f"(rmsprop_form={form!r}). Received: momentum_buf=None with momentum={momentum!r}"
        )
    if centered:
        if average_gradient is None:
            raise ValueError(
                "`average_gradient` must be an array like the variable when centered=True. "
                "Received: average_gradient=None"
            )
        average_gradient = check_like(param, "average_gradient", average_gradient)
    elif average_gradient is not None:
        raise ValueError(
            "`average_gradient` must be None when centered=False. Received: an array of "
            f"shape {np.shape(average_gradient)}"
        )

    return param, grad, velocity, momentum_buf, average_gradient, form
