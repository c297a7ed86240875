"""Adafactor, as tf_keras, Keras 3, PyTorch and optax compute it (``Convention.adafactor_form``).

Adafactor (Shazeer & Stern, 2018) keeps no first moment and, for a matrix, no full second
moment either: the running means of ``g^2`` over its rows and over its columns
(``velocity_row``, ``velocity_col``) stand for it, their outer product divided by the mean
of the row statistics. A vector keeps the full ``velocity``. The step is scaled by the
variable's own root mean square (at least ``epsilon_2``) times a relative step
``min(lr, 1/sqrt(t))``, and the update is clipped to an RMS of ``clip_threshold``.

The frameworks agree on that much and on little of the detail: Keras (tf_keras, Keras 3)
factors the last two axes of every variable of rank >= 2 and adds ``epsilon_1`` (1e-30) to
``g^2``; tf_keras multiplies by ``rsqrt`` where Keras 3 divides by ``sqrt``; PyTorch clamps
instead of adding (``epsilon_1`` defaults to the dtype's machine epsilon), computes the means
as squared norms, updates the moments with ``lerp`` and has its own weight decay, after the
scale is taken; optax factors only the two *largest* axes and only when the second largest
has at least ``min_dim_size_to_factor`` (128) elements, has no relative step (no learning
rate at all by default), and computes its decay in float32. :func:`adafactor_update` writes
each out as readable NumPy in the variable dtype.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/adafactor.py`` (``build``, ``_rms``, ``update_step``)
keras3      ``keras/src/optimizers/adafactor.py`` (``build``, ``_rms``, ``update_step``),
            TensorFlow backend
torch       ``torch/optim/_adafactor.py`` (``_init_group``, ``_single_tensor_adafactor``,
            the default for-loop path on CPU)
optax       ``optax/_src/alias.py`` (``adafactor``), ``optax/_src/factorized.py``
            (``scale_by_factored_rms``, ``_factored_dims``, ``_decay_rate_pow``),
            ``optax/transforms/_clipping.py`` (``clip_by_block_rms``),
            ``optax/_src/transform.py`` (``scale_by_param_block_rms``,
            ``add_decayed_weights``), ``optax/_src/numerics.py``
            (``safe_root_mean_squares``), under ``jax.jit`` on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.conventions import Convention, get_convention
from refopt.reference._common import (
    as_float_array,
    check_hyper,
    check_like,
    check_scalar,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)
from refopt.reference.reductions import torch_vector_norm
from refopt.reference.rmsprop import rsqrt
from refopt.reference.variants import fma

__all__ = [
    "AdafactorResult",
    "adafactor_defaults",
    "adafactor_initial_state",
    "adafactor_slot_shapes",
    "adafactor_update",
    "check_adafactor_args",
    "factored_axes",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

SLOTS = ("velocity_row", "velocity_col", "velocity")

#: Each framework's Adafactor defaults, under refopt's (Keras') names; optax's own knobs under
#: optax's names. ``epsilon_1=None`` (torch): the dtype's machine epsilon.
_DEFAULTS = {
    "tf_keras": dict(learning_rate=0.001, beta_2_decay=-0.8, epsilon_1=1e-30, epsilon_2=1e-3,
                     clip_threshold=1.0, relative_step=True),
    "keras3": dict(learning_rate=0.001, beta_2_decay=-0.8, epsilon_1=1e-30, epsilon_2=1e-3,
                   clip_threshold=1.0, relative_step=True),
    "torch": dict(learning_rate=0.01, beta_2_decay=-0.8, epsilon_1=None, epsilon_2=1e-3,
                  clip_threshold=1.0),
    # learning_rate None: optax chains no scale_by_learning_rate (refopt multiplies by 1.0,
    # the same bits); clip_threshold math.inf: no clip_by_block_rms (optax's None)
    "optax": dict(learning_rate=None, beta_2_decay=-0.8, epsilon_1=1e-30, epsilon_2=1e-3,
                  clip_threshold=1.0, min_dim_size_to_factor=128, decay_offset=0,
                  multiply_by_parameter_scale=True, factored=True),
}

#: The options only optax has.
OPTAX_ONLY = ("min_dim_size_to_factor", "decay_offset", "multiply_by_parameter_scale",
              "factored")


class AdafactorResult(NamedTuple):
    """New arrays after one Adafactor step: ``param``, ``velocity_row`` and
    ``velocity_col`` (the factored second moments: Keras' ``r``/``c``, torch's
    ``row_var``/``col_var``, optax's ``v_row``/``v_col``) and ``velocity`` (the full second
    moment: Keras' ``v``, torch's ``variance``, optax's ``v``). The moments a variable does
    not use keep their placeholder value."""

    param: np.ndarray
    velocity_row: np.ndarray
    velocity_col: np.ndarray
    velocity: np.ndarray


def _convention(convention):
    if convention is None:
        return get_convention("tf_keras")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (tf_keras), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def _form(conv):
    form = conv.adafactor_form
    if form == "none":
        raise ValueError(
            f"convention={conv.name!r} has no Adafactor ({conv.framework}); Adafactor exists "
            "under 'tf_keras', 'keras3', 'torch' and 'optax'."
        )
    return form


def adafactor_defaults(convention=None):
    """The framework's Adafactor defaults (refopt's names; optax's own knobs by optax's).

    ``learning_rate`` 0.001 Keras, **0.01** torch, None optax (no learning-rate scaling);
    ``epsilon_1`` 1e-30, torch None (the dtype's machine epsilon, a clamp); ``epsilon_2``
    1e-3; ``beta_2_decay`` -0.8 (optax's ``decay_rate`` 0.8); ``clip_threshold`` 1.0
    (torch's ``d``, optax's ``clipping_threshold``).
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def factored_axes(shape, convention=None, *, factored=True, min_dim_size_to_factor=128):
    """``(row_axis, col_axis)``: the axes ``velocity_row`` and ``velocity_col`` average over
    (``g^2``'s mean over ``row_axis`` is ``velocity_row``), or None for a full ``velocity``.

    Keras and torch: the last two axes of a variable of rank >= 2, ``(-1, -2)`` as positive
    axes. optax: the two largest axes (``np.argsort`` of the shape: the largest is averaged
    for the rows), when ``factored`` and the second largest has at least
    ``min_dim_size_to_factor`` elements.
    """
    shape = tuple(shape)
    form = _form(_convention(convention))
    n = len(shape)
    if form != "optax":
        return (n - 1, n - 2) if n >= 2 else None
    if not factored or n < 2:
        return None
    order = np.argsort(shape)
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return int(order[-1]), int(order[-2])


def adafactor_slot_shapes(shape, convention=None, **optax_options):
    """``{slot: shape}`` of a variable of ``shape``: the framework's own shapes.

    The moments a variable does not use are placeholders, as the framework keeps them:
    Keras' and torch's ``()`` (Keras' scalar variable 0; torch keeps none, refopt a 0-d
    zero), optax's ``(1,)`` zeros. Keras keeps the full ``velocity`` of a factored variable
    too (it stores the estimate it divides by). Factored moments: Keras ``shape[:-1]`` and
    ``shape[:-2] + shape[-1:]``; torch the same with the reduced axis kept as 1; optax the
    shape without its row (resp. column) axis.
    """
    shape = tuple(shape)
    conv = _convention(convention)
    form = _form(conv)
    axes = factored_axes(shape, conv, **optax_options)
    hole = (1,) if form == "optax" else ()
    if axes is None:
        return {"velocity_row": hole, "velocity_col": hole, "velocity": shape}
    ra, ca = axes
    if form == "torch":
        row = shape[:ra] + (1,) + shape[ra + 1:]
        col = shape[:ca] + (1,) + shape[ca + 1:]
    else:
        row = shape[:ra] + shape[ra + 1:]
        col = shape[:ca] + shape[ca + 1:]
    # Keras also stores the estimate V (full size) it divides by; torch and optax do not
    full = shape if form in ("tf_keras", "keras3") else hole
    return {"velocity_row": row, "velocity_col": col, "velocity": full}


def adafactor_initial_state(param, convention=None, **optax_options):
    """``(velocity_row, velocity_col, velocity)``: zeros of :func:`adafactor_slot_shapes`."""
    param = as_float_array("param", param)
    shapes = adafactor_slot_shapes(param.shape, convention, **optax_options)
    return tuple(np.zeros(shapes[name], param.dtype) for name in SLOTS)


# ----------------------------------------------------------------------------- reductions
def eigen_sum(x):
    """A full ``tf.reduce_sum`` of a small tensor as TensorFlow's CPU kernel adds it.

    Eigen's inner reducer: whole packets (32 bytes: 8 float32 or 4 float64 lanes) summed lane
    by lane, the remaining elements summed from ``+0`` in order, then those added to the
    lanes folded in halves (``predux``). Measured equal to TF 2.21 for up to three packets
    (and used for any size here; longer tensors, which Eigen unrolls over several packet
    accumulators, may differ by an ulp).
    """
    flat = np.ascontiguousarray(x).reshape(1, -1)
    return eigen_sum_rows(flat)[0]


def eigen_sum_rows(x):
    """:func:`eigen_sum` of every row (the last axis) of ``x``: TensorFlow's inner-axis
    ``reduce_sum`` on short rows. Returns an array of ``x.shape[:-1]``."""
    x = np.ascontiguousarray(x)
    dt = x.dtype
    n = x.shape[-1]
    lanes = 32 // dt.itemsize if dt in (_F32, _F64) else 1
    whole = (n // lanes) * lanes
    with np.errstate(all="ignore"):
        tail = np.zeros(x.shape[:-1], dt)
        for j in range(whole, n):  # fewer than `lanes` terms, from +0 in order
            tail = tail + x[..., j]
        if whole == 0:
            return tail
        # the packets added lane by lane in order (a reduction over a non-contiguous axis
        # adds in index order), then each row's lanes folded in halves
        acc = np.add.reduce(x[..., :whole].reshape(x.shape[:-1] + (whole // lanes, lanes)),
                            axis=-2)
        while acc.shape[-1] > 1:
            half = acc.shape[-1] // 2
            acc = acc[..., :half] + acc[..., half:]
        return tail + acc[..., 0]


def _seq_sum(x, axis):
    """Sum along ``axis`` in index order from ``+0`` (Eigen's and XLA's order on short
    axes), keeping no dimension."""
    x = np.moveaxis(x, axis, 0)
    acc = np.zeros(x.shape[1:], x.dtype)
    for k in range(x.shape[0]):
        acc = acc + x[k]
    return acc


def _inner_sum(x):
    """Sum along the last (contiguous) axis as Eigen reduces each row: :func:`eigen_sum`."""
    return eigen_sum_rows(x)


def _mean(x, axis, keepdims=False, eigen=False, xla=False):
    """``reduce_mean`` along one axis of a small tensor: the sum (in index order; with
    ``eigen`` the last axis as Eigen's packets add it), then ``/ n`` (``xla``: times the
    rounded ``1/n``, as XLA rewrites the division)."""
    if xla:
        dt = x.dtype
        out = _seq_sum(x, axis) * (scalar(dt, 1) / scalar(dt, x.shape[axis]))
    elif eigen and axis in (-1, x.ndim - 1):
        out = _inner_sum(x) / scalar(x.dtype, x.shape[axis])
    else:
        out = _seq_sum(x, axis) / scalar(x.dtype, x.shape[axis])
    return np.expand_dims(out, axis) if keepdims else out


def _rms_tf(x):
    """``sqrt(reduce_mean(square(x)))`` over the whole tensor (Keras' ``_rms``)."""
    dt = x.dtype
    return np.sqrt(dt.type(eigen_sum(x * x) / scalar(dt, x.size)))


# ----------------------------------------------------------------------------- the forms
def _keras(w, g, r, c, v, lr, b2d, e1, e2, clip, t, form):
    dt = w.dtype
    one = scalar(dt, 1)
    tt = scalar(dt, t)
    lr = lr_cast(dt, lr)
    inv = one / np.sqrt(tt)                       # 1/sqrt(t); tf_keras' scalar rsqrt is too
    rho = min(lr, inv)                            # min(min(lr, inv), inv): the same
    eps2 = tf_cast(dt, e2)                        # ops.cast / tf.cast of a Python float
    alpha = np.maximum(eps2, _rms_tf(w)) * rho  # ops.maximum: a NaN RMS propagates
    gsq = g * g + scalar(dt, e1)
    b2t = one - _libm.power(dt, tt, scalar(dt, b2d))
    if w.ndim >= 2:
        r = b2t * r + (one - b2t) * _mean(gsq, -1, eigen=True)
        c = b2t * c + (one - b2t) * _mean(gsq, -2)
        vv = np.expand_dims(r / _mean(r, -1, keepdims=True, eigen=True), -1) * np.expand_dims(
            c, -2)
        v_out = vv
    else:
        vv = b2t * v + (one - b2t) * gsq
        v_out = vv
    u = g * rsqrt(vv) if form == "tf_keras" else g / np.sqrt(vv)
    uhat = u / np.maximum(one, _rms_tf(u) / scalar(dt, clip))
    return w - alpha * uhat, r, c, v_out


def _torch_lerp(a, b, weight):
    """``a.lerp_(b, weight)`` with a Python-float weight, as PyTorch's CPU kernel (one FMA)."""
    dt = a.dtype
    w = scalar(dt, weight)
    d = b - a
    if abs(float(w)) < 0.5:
        return fma(w, d, a)
    return fma(w - scalar(dt, 1), d, b)


def _torch_norm_axis(x, axis):
    """``torch.norm(x, dim=axis, keepdim=True)``: each line's ``vector_norm``."""
    moved = np.moveaxis(x, axis, -1)
    out = np.empty(moved.shape[:-1], x.dtype)
    for idx in np.ndindex(out.shape):
        out[idx] = torch_vector_norm(moved[idx])
    return np.expand_dims(out, axis)


def _torch_col_norm(x):
    """``torch.norm(x, dim=-2, keepdim=True)``: an outer (strided) reduction, which PyTorch
    adds row after row (each square rounded, no FMA: measured), then the root."""
    acc = np.zeros(x.shape[:-2] + (1,) + x.shape[-1:], x.dtype)
    for k in range(x.shape[-2]):
        row = x[..., k:k + 1, :]
        acc = acc + row * row
    return np.sqrt(acc)



def _torch(w, g, r, c, v, lr, b2d, e1, e2, d, t, wd):
    dt = w.dtype
    step = float(t)
    b = step ** b2d                                   # "one_minus_beta2_t", a Python float
    rho = min(lr, 1 / (step ** 0.5))
    alpha = max(e2, float(torch_vector_norm(w)) / (w.size ** 0.5)) * rho
    if wd:
        w = w * scalar(dt, 1 - lr * wd)
    eps1 = float(np.finfo(dt).eps) if e1 is None else e1
    if w.ndim > 1:
        row_mean = np.square(_torch_norm_axis(g, -1)) / scalar(dt, g.shape[-1])
        r = _torch_lerp(r, row_mean, b)
        col_mean = np.square(_torch_col_norm(g)) / scalar(dt, g.shape[-2])
        c = _torch_lerp(c, col_mean, b)
        est = r * c                                   # row_var @ col_var: k = 1, one product
        est = est / np.maximum(_mean(r, -2, keepdims=True), scalar(dt, eps1))
        v_out = v
    else:
        v = _torch_lerp(v, g * g, b)
        est = v
        v_out = v
    upd = (scalar(dt, 1) / np.sqrt(np.maximum(est, scalar(dt, eps1 * eps1)))) * g
    denom = max(1.0, float(torch_vector_norm(upd)) / ((upd.size ** 0.5) * d))
    return fma(upd, scalar(dt, -alpha / denom), w), r, c, v_out


def _optax(w, g, r, c, v, lr, b2d, e1, e2, clip, t, wd, axes, offset, param_scale):
    dt = w.dtype
    # 1 - (count + 1 - offset) ** -decay_rate, always in float32 (jnp.array(..., float32))
    tt = np.float32(t - offset)
    dec32 = np.float32(1.0) - _libm.power(_F32, tt, np.float32(b2d))
    dec = scalar(dt, dec32)
    omd = scalar(dt, np.float32(1.0) - dec32)
    gsq = fma(g, g, scalar(dt, e1))                  # |g|^2 + eps, contracted under jit
    if axes is not None:
        ra, ca = axes
        r = fma(dec, r, omd * _mean(gsq, ra, xla=True))
        c = fma(dec, c, omd * _mean(gsq, ca, xla=True))
        rc = ca - 1 if ca > ra else ca
        row_factor = rsqrt(r / _mean(r, rc, keepdims=True, xla=True))
        col_factor = rsqrt(c)
        u = (g * np.expand_dims(row_factor, ra)) * np.expand_dims(col_factor, ca)
        v_out = v
    else:
        v = fma(dec, v, omd * gsq)
        u = g * rsqrt(v)
        v_out = v
    if clip is not None and clip != np.inf:  # inf: optax's None, no clip_by_block_rms
        u = u / np.maximum(scalar(dt, 1), np.sqrt(_xla_mean_squares(u)) / scalar(dt, clip))
    if lr is not None:
        u = u * scalar(dt, lr)
    if param_scale:
        rms = np.sqrt(_xla_mean_squares(w))
        u = u * (scalar(dt, e2) if rms <= scalar(dt, e2) else rms)  # NaN rms: NaN  # noqa: FURB136
    if wd is not None:
        u = fma(scalar(dt, wd), w, u)
    return w + (-u), r, c, v_out


_F32_PACK = struct.Struct("f")


def _round_f32(v):
    """A Python float rounded to float32 (returned as a Python float)."""
    try:
        return _F32_PACK.unpack(_F32_PACK.pack(v))[0]
    except OverflowError:  # beyond float32's range: inf, as a float32 operation gives
        return math.copysign(math.inf, v)


def _fma64(a, b, c):
    """``a*b + c`` rounded once, Python floats: :func:`refopt.reference.variants.fma`'s
    float64 method (Dekker's product, Knuth's sum), falling back to ``a*b + c`` as it does."""
    p = a * b
    split = 134217729.0  # 2**27 + 1
    ta = split * a
    ah = ta - (ta - a)
    al = a - ah
    tb = split * b
    bh = tb - (tb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    s = p + c
    bb = s - p
    f = (p - (s - bb)) + (c - bb)
    out = s + (f + e)
    if math.isfinite(out) and math.isfinite(p) and abs(p) < 1e300:
        return out
    return a * b + c


def xla_sum_squares(x):
    """``jnp.sum(x * x)`` under ``jit`` as far as measured on XLA:CPU: in order, each square
    contracted into an FMA with the running sum (``fma(x, x, acc)`` from ``+0``). It matches
    XLA for most small tensors, not all (an ulp of the sum now and then: the golden cases'
    tolerances). Python floats, one element at a time (a sequence of FMAs has no vector form
    in NumPy)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    dt = flat.dtype
    with np.errstate(all="ignore"):
        if dt == _F32:
            acc = 0.0
            for a in flat.astype(_F64).tolist():
                acc = _round_f32(a * a + acc)  # a*a is exact in float64: fma's rounding
            return dt.type(acc)
        if dt == _F64:
            acc = 0.0
            for a in flat.tolist():
                acc = _fma64(a, a, acc)
            return dt.type(acc)
        acc = dt.type(0)
        for a in flat:
            acc = fma(a, a, acc)
        return dt.type(acc)


def _xla_mean_squares(x):
    """``jnp.mean(x * x)`` under ``jit`` on XLA:CPU, as far as measured: the squares summed
    in order with each one contracted into an FMA, times the rounded reciprocal of the
    count (XLA turns the division into that multiplication). It matches XLA for most
    small tensors, not all (an ulp of the sum now and then: the golden cases' tolerance)."""
    dt = np.asarray(x).dtype
    with np.errstate(all="ignore"):
        return dt.type(xla_sum_squares(x) * (scalar(dt, 1) / scalar(dt, np.size(x))))


def adafactor_update(param, grad, velocity_row, velocity_col, velocity, *, learning_rate,
                     step, convention=None, beta_2_decay=None, epsilon_1=None, epsilon_2=None,
                     clip_threshold=None, weight_decay=None, min_dim_size_to_factor=None,
                     decay_offset=None, multiply_by_parameter_scale=None, factored=None):
    r"""One Adafactor step for one variable, as ``convention.adafactor_form`` computes it.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64
        The variable (after Keras' decoupled weight decay, which the pipeline applies first).
    grad : ndarray, like ``param``
        The dense gradient.
    velocity_row, velocity_col, velocity : ndarray
        The moments, in the shapes of :func:`adafactor_slot_shapes` (placeholders for the
        ones the variable does not use).
    learning_rate : float or None
        None only under optax (no learning-rate scaling).
    step : int
        The 1-based step ``t``.
    convention : None, str or Convention
        ``adafactor_form``: ``"tf_keras"`` (default), ``"keras3"``, ``"torch"``, ``"optax"``.
    beta_2_decay, epsilon_1, epsilon_2, clip_threshold : float, optional
        Default (None): the framework's (:func:`adafactor_defaults`); under torch
        ``epsilon_1`` defaults to the dtype's machine epsilon. ``clip_threshold=math.inf``
        under optax: no clipping (optax's ``clipping_threshold=None``).
    weight_decay : float or None
        torch's decay ``w *= 1 - lr*wd`` (after the scale is taken from ``w``) or optax's
        ``weight_decay_rate`` (``u + wd*w``, not multiplied by the learning rate). Keras'
        decay is the pipeline's (decoupled, before the step).
    min_dim_size_to_factor, decay_offset, multiply_by_parameter_scale, factored
        optax's options (its defaults 128, 0, True, True); refused under the other forms.

    Returns
    -------
    AdafactorResult

    Notes
    -----
    With :math:`G = g^2 + \epsilon_1`, :math:`\hat\beta_t = 1 - t^{\,\text{beta\_2\_decay}}`,
    :math:`\rho_t = \min(lr, 1/\sqrt t)`, :math:`\alpha_t = \max(\epsilon_2, RMS(w))\rho_t`:

    .. math::

        R \leftarrow \hat\beta_t R + (1-\hat\beta_t)\,\mathrm{mean}_{row}(G),\quad
        C \leftarrow \hat\beta_t C + (1-\hat\beta_t)\,\mathrm{mean}_{col}(G),\quad
        V = \frac{R\,C^\top}{\mathrm{mean}(R)}

    (a vector keeps :math:`V \leftarrow \hat\beta_t V + (1-\hat\beta_t)G`),
    :math:`u = g/\sqrt V`, :math:`\hat u = u/\max(1, RMS(u)/d)`,
    :math:`w \leftarrow w - \alpha_t \hat u`.

    - Keras 3: exactly that, in the dtype; ``1/sqrt``; factors the last two axes of every
      variable of rank >= 2 and keeps the full ``velocity`` too (it stores ``V``).
      ``relative_step`` changes nothing (``rho`` takes the minimum anyway).
    - tf_keras: the same with ``g * rsqrt(V)``.
    - torch: :math:`\epsilon_1` is a clamp (``mean(R)`` at least :math:`\epsilon_1`, ``V``
      at least :math:`\epsilon_1^2`), not added; the row and column means are squared
      ``torch.norm`` divided by the count; the moments move by ``lerp(mean, 1 - beta)``
      (one FMA); ``alpha`` and the clip denominator are Python floats from
      ``vector_norm(w)/sqrt(n)``; the weight decay ``w *= 1 - lr*wd`` comes after ``alpha``;
      ``w += (-alpha/den) * u`` is one FMA; ``rsqrt`` is ``1/sqrt``.
    - optax: no relative step (``lr`` multiplies, or nothing), the decay
      :math:`1 - (t - offset)^{-0.8}` in float32, factoring of the two largest axes only
      from ``min_dim_size_to_factor`` on, :math:`u\cdot\max(RMS(w), \epsilon_2)` *after*
      the clip, the FMAs XLA contracts under ``jit``.

    The means are ordered sums (:func:`eigen_sum` for TensorFlow's whole-tensor means);
    the recorded golden cases state where the frameworks' reductions differ by an ulp.
    """
    (param, grad, r, c, v, conv, form, opts) = check_adafactor_args(
        param, grad, velocity_row, velocity_col, velocity, learning_rate=learning_rate,
        step=step, convention=convention, beta_2_decay=beta_2_decay, epsilon_1=epsilon_1,
        epsilon_2=epsilon_2, clip_threshold=clip_threshold, weight_decay=weight_decay,
        min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset,
        multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored)
    o = opts
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3"):
            out = _keras(param, grad, r, c, v, learning_rate, o["beta_2_decay"],
                         o["epsilon_1"], o["epsilon_2"], o["clip_threshold"], step, form)
        elif form == "torch":
            out = _torch(param, grad, r, c, v, float(learning_rate), o["beta_2_decay"],
                         o["epsilon_1"], o["epsilon_2"], o["clip_threshold"], step,
                         weight_decay)
        else:
            axes = factored_axes(param.shape, conv, factored=o["factored"],
                                 min_dim_size_to_factor=o["min_dim_size_to_factor"])
            out = _optax(param, grad, r, c, v, learning_rate, o["beta_2_decay"],
                         o["epsilon_1"], o["epsilon_2"], o["clip_threshold"], step,
                         weight_decay, axes, o["decay_offset"],
                         o["multiply_by_parameter_scale"])
    dt = param.dtype
    p, r2, c2, v2 = out
    # new arrays always (a slot a form leaves alone is not handed back as the input itself)
    return AdafactorResult(np.array(p, dt), np.array(r2, dt).reshape(r.shape),
                           np.array(c2, dt).reshape(c.shape),
                           np.array(v2, dt).reshape(v.shape))


def check_adafactor_args(param, grad, velocity_row, velocity_col, velocity, *, learning_rate,
                         step, convention, **options):
    """Validate :func:`adafactor_update`'s arguments; return ``(param, grad, velocity_row,
    velocity_col, velocity, convention, form, options)`` with the framework's defaults filled
    in ``options``."""
    conv = _convention(convention)
    form = _form(conv)
    param = as_float_array("param", param)
    if not isinstance(grad, np.ndarray):
        raise TypeError(
            f"Adafactor takes dense gradients only (convention={conv.name!r}). Received: grad "
            f"of type {type(grad).__name__}")
    grad = check_like(param, "grad", grad)
    if form == "torch" and param.size == 0:
        # torch.optim.Adafactor divides by sqrt(numel) in Python: ZeroDivisionError
        raise ValueError(
            "convention='torch': PyTorch's Adafactor cannot step a variable without elements "
            "(it divides its norm by sqrt(numel) and raises ZeroDivisionError). Received: "
            f"param of shape {param.shape}")
    defaults = _DEFAULTS[form]
    opts = {}
    wd = options.pop("weight_decay", None)
    for name, value in options.items():
        if name not in defaults:
            if value is not None:
                raise ValueError(
                    f"`{name}` is optax's; convention={conv.name!r} has no such Adafactor "
                    f"option. Received: {name}={value!r}")
            continue
        opts[name] = defaults[name] if value is None else value
    for name in ("beta_2_decay", "epsilon_2"):
        check_scalar(name, opts[name])
    if opts["epsilon_1"] is not None:
        check_scalar("epsilon_1", opts["epsilon_1"])
    if opts["clip_threshold"] is not None:
        check_scalar("clip_threshold", opts["clip_threshold"])
    elif form != "optax":
        raise ValueError(f"`clip_threshold` must be a number under convention={conv.name!r}. "
                         "Received: clip_threshold=None")
    if learning_rate is None:
        if form != "optax":
            raise ValueError(f"`learning_rate` must be a number under convention={conv.name!r}."
                             " Received: learning_rate=None")
    else:
        check_hyper("learning_rate", learning_rate)
    if wd is not None:
        if form not in ("torch", "optax"):
            raise ValueError(
                f"convention={conv.name!r}: Adafactor's weight decay is the optimizer's "
                f"decoupled one, not part of this step. Received: weight_decay={wd!r}")
        check_scalar("weight_decay", wd)
    check_step(step)
    axes_opts = {}
    if form == "optax":
        axes_opts = dict(factored=opts["factored"],
                         min_dim_size_to_factor=opts["min_dim_size_to_factor"])
    shapes = adafactor_slot_shapes(param.shape, conv, **axes_opts)
    arrays = []
    for name, a in zip(SLOTS, (velocity_row, velocity_col, velocity)):
        a = as_float_array(name, a)
        if a.shape != shapes[name] or a.dtype != param.dtype:
            raise ValueError(
                f"`{name}` must have shape {shapes[name]} and dtype {param.dtype} for a variable "
                f"of shape {param.shape} under convention={conv.name!r}. Received: {name} with "
                f"shape={a.shape}, dtype={a.dtype}")
        arrays.append(a)
    return (param, grad, *arrays, conv, form, opts)

