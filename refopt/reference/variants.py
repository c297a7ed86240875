"""The other frameworks' numerics: Adam, SGD, clipping and EMA under a :class:`Convention`.

The tf.keras 2.11+ functions of this package (:func:`refopt.reference.adam_update` and the
others) are the default; each takes ``convention=`` and hands the step here when the
convention's knobs differ from tf-keras'. Every function below is readable NumPy in the
variable dtype, with the rounding points of the framework it reproduces written out. What
"rounding point" means for each framework is in ``conformance/README.md``.

Fused multiply-add
    PyTorch's vectorised CPU kernels (``lerp``, ``add(alpha=)``, ``addcmul``) and XLA under
    ``jit`` round ``a*b + c`` once; :func:`fma` reproduces that in float32 and float64.
"""

from __future__ import annotations

import math

import numpy as np

from refopt import _libm
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import _EXTRA_DTYPES, lr_cast, scalar, tf_cast
from refopt.reference.sqrt import convention_sqrt

__all__ = [
    "fma", "adam_variant", "lazy_rows_torch", "sgd_variant", "clip_norm_variant",
    "clip_global_norm_variant", "ema_variant", "decay_torch", "is_tf_keras_adam",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)


def fma(a, b, c):
    """``a*b + c`` rounded once, elementwise, for float32 and float64 arrays or scalars.

    float32 and float16: the product is exact in float64, and the float64 sum is rounded once
    to the dtype
    (double rounding could differ in rare halfway cases; none showed up in the golden cases).
    float64: an error-free transformation (Dekker's product, Knuth's sum) gives ``a*b + c``
    as ``s + e`` exactly up to the last step's rounding, which is correct except in rare
    double-rounding cases. Non-finite inputs fall back to ``a*b + c``.
    """
    a, b, c = np.asarray(a), np.asarray(b), np.asarray(c)
    dtype = np.result_type(a, b, c)
    with np.errstate(all="ignore"):
        if dtype in (_F32, _F16):  # the product of two float32/float16 is exact in float64
            # np.asarray: a 0-d result stays an array (NumPy's arithmetic on 0-d arrays
            # returns scalars, which callers could not write into)
            return np.asarray((a.astype(_F64) * b.astype(_F64) + c.astype(_F64)).astype(dtype))
        if dtype != _F64:
            return np.asarray(a * b + c)
        p, e = two_prod(a, b)  # Dekker: a*b = p + e exactly
        # Knuth: p + c = s + f exactly
        s = p + c
        bb = s - p
        f = (p - (s - bb)) + (c - bb)
        out = s + (f + e)
        plain = a * b + c
        ok = np.isfinite(out) & np.isfinite(p) & (np.abs(p) < 1e300)
        return np.asarray(np.where(ok, out, plain))


def two_prod(a, b):
    """``(p, e)`` with ``a*b == p + e`` exactly (Dekker's product, Veltkamp split into 26-bit
    halves), float64 arrays or scalars, where nothing overflows."""
    p = a * b
    split = 134217729.0  # 2**27 + 1
    ta = split * a
    ah = ta - (ta - a)
    al = a - ah
    tb = split * b
    bh = tb - (tb - b)
    bl = b - bh
    e = ((ah * bh - p) + ah * bl + al * bh) + al * bl
    return p, e


def is_tf_keras_adam(conv):
    """Whether ``conv`` computes Adam's dense step exactly as tf-keras does."""
    return conv is None or (
        conv.epsilon_placement == "hat" and conv.bias_correction == "pow"
        and conv.one_minus_beta == "float64" and conv.moment_update == "keras"
        and conv.amsgrad_maximum == "raw" and conv.learning_rate_cast == "float32"
        and conv.epsilon_cast == "dtype"
    )


# ----------------------------------------------------------------------------- scalars
def lr_value(dtype, lr, conv):
    """The learning rate as the framework holds it (see ``Convention.learning_rate_cast``)."""
    if conv.learning_rate_cast == "float32":
        return lr_cast(dtype, lr)
    if conv.learning_rate_cast == "float64":
        return float(lr)
    return scalar(dtype, lr)


def beta(dtype, b, conv):
    """``beta`` in the variable dtype as the moment update multiplies by it."""
    if conv.one_minus_beta == "dtype" or conv.moment_update in ("keras", "ema"):
        return tf_cast(dtype, b)  # a float32 hyperparameter tensor, cast
    return scalar(dtype, b)  # a Python float meeting a tensor


def one_minus(dtype, b, conv):
    """``1 - beta`` in the variable dtype, rounded as the convention does."""
    if conv.one_minus_beta == "dtype":
        return scalar(dtype, 1) - tf_cast(dtype, b)
    return scalar(dtype, 1 - b)


def beta_power(dtype, b, t, conv):
    """``b**t`` as the convention computes it, returned in ``dtype`` (or float64 for torch)."""
    how = conv.bias_correction
    if how == "pow":
        return _libm.power(dtype, tf_cast(dtype, b), scalar(dtype, t))
    if how == "accumulator":
        # TF1: a float32 variable initialised to beta, multiplied by beta after every step.
        acc = np.float32(b)
        factor = np.float32(b)
        for _ in range(t - 1):
            acc = np.float32(acc * factor)
        return scalar(dtype, acc)
    if how == "float64":
        return float(b) ** t
    # optax: a Python float to an int32 count -> float32 (float64 with x64) pow
    work = _F64 if dtype == _F64 else _F32
    return scalar(dtype, _libm.power(work, work.type(b), work.type(t)))


def eps_value(dtype, eps, conv):
    """Epsilon in ``dtype``: straight from the Python float, or through float32 (TF1)."""
    return tf_cast(dtype, eps) if conv.epsilon_cast == "float32" else scalar(dtype, eps)


# ----------------------------------------------------------------------------- Adam
def _moments(m, v, g, dtype, b1, b2, conv, g_squared=None):
    c1, c2 = one_minus(dtype, b1, conv), one_minus(dtype, b2, conv)
    gg = np.square(g) if g_squared is None else g_squared
    how = conv.moment_update
    if how == "keras":
        return m + (g - m) * c1, v + (gg - v) * c2
    if how == "ema":
        return beta(dtype, b1, conv) * m + c1 * g, beta(dtype, b2, conv) * v + c2 * gg
    if how in ("torch_fma", "torch_loop"):
        # m.lerp_(g, w) as PyTorch's CPU kernels (fused and for-loop): one FMA, branch on
        # |w| < 0.5; v.mul_(b2).addcmul_(g, g, value=1-b2): fma((1-b2)*g, g, v*b2)
        w = c1
        d = g - m
        m_new = fma(w, d, m) if abs(float(w)) < 0.5 else fma(w - scalar(dtype, 1), d, g)
        b2d = beta(dtype, b2, conv)
        v_new = fma(c2 * g, g, v * b2d)
        # the kernel's scalar tail (the last numel mod (32 bytes / itemsize) elements: 8
        # float32, 4 float64) is contracted the other way round
        tail = v.size % (32 // dtype.itemsize) if how == "torch_fma" else 0
        if tail and dtype in (_F32, _F64):
            vt = v_new.reshape(-1)
            gt, old = g.reshape(-1)[-tail:], v.reshape(-1)[-tail:]
            vt[-tail:] = fma(old, b2d, (c2 * gt) * gt)
        return m_new, v_new
    if conv.optax_jit == "eager":  # optax's (1-b)*g + b*m, every jnp op rounded on its own
        return (c1 * g + beta(dtype, b1, conv) * m, c2 * gg + beta(dtype, b2, conv) * v)
    # optax under jit: (1-b)*g + b*m contracted into one FMA by XLA
    return (fma(c1, g, beta(dtype, b1, conv) * m),
            fma(c2, gg, beta(dtype, b2, conv) * v))


def adam_variant(param, grad, m, v, vhat, *, learning_rate, beta_1, beta_2, epsilon, step,
                 convention, weight_decay=None, eps_root=None):
    """One Adam step under ``convention``; arguments as :func:`refopt.reference.adam_update`.

    ``grad`` is an ndarray, or an IndexedSlices when ``convention.sparse_adam`` allows one
    (already checked by the caller). ``weight_decay`` is used only by optax's ``adamw``
    (``u = -lr*(adam_u + wd*w)``); the other couplings are separate steps. ``eps_root``
    (optax's term inside the root, ``sqrt(v_hat + eps_root)``) is used by the optax form only.

    Returns ``(param, m, v, vhat)`` as new arrays.
    """
    conv = convention
    dtype = param.dtype
    b1, b2, t = beta_1, beta_2, step
    g_squared = None
    if isinstance(grad, IndexedSlices):
        if conv.sparse_adam in ("tf1", "keras2"):
            return _adam_scatter(param, grad, m, v, vhat, learning_rate, b1, b2, epsilon, t,
                                 conv)
        # "densify" (Keras 3): the update runs on the densified gradient
        if conv.keras3_sparse_square:
            sq = IndexedSlices(np.square(grad.values), grad.indices, grad.dense_shape)
            g_squared = sq.to_dense()
        grad = grad.to_dense()
    eps = eps_value(dtype, epsilon, conv)
    lr = lr_value(dtype, learning_rate, conv)
    m_new, v_new = _moments(m, v, grad, dtype, b1, b2, conv, g_squared)
    one = scalar(dtype, 1)
    if conv.epsilon_placement == "hat":
        p1 = beta_power(dtype, b1, t, conv)
        p2 = beta_power(dtype, b2, t, conv)
        if conv.bias_correction == "float64":
            p1, p2 = scalar(dtype, p1), scalar(dtype, p2)
        alpha = scalar(dtype, lr) * np.sqrt(one - p2) / (one - p1)
        vhat_new = None if vhat is None else np.maximum(vhat, v_new)
        denom_v = v_new if vhat is None else vhat_new
        param_new = param - (m_new * alpha) / (np.sqrt(denom_v) + eps)
        return param_new, m_new, v_new, vhat_new
    if conv.bias_correction == "float64":
        # PyTorch (fused CPU kernel and for-loop): float64 scalars, one rounding to the
        # dtype each; sqrt: the fused kernel's is IEEE, the for-loop's torch.sqrt MKL's
        bc1 = 1.0 - float(b1) ** t
        bc2_sqrt = math.sqrt(1.0 - float(b2) ** t)
        step_size = float(lr) / bc1
        if vhat is None:
            vhat_new, denom_v = None, v_new
        elif conv.amsgrad_maximum == "raw":
            vhat_new = np.maximum(vhat, v_new)
            denom_v = vhat_new
        else:
            vhat_new = np.maximum(vhat, v_new / scalar(dtype, 1.0 - float(b2) ** t))
            denom_v = vhat_new * scalar(dtype, 1.0 - float(b2) ** t)
        denom = convention_sqrt(denom_v, conv, fused_kernel=True) / scalar(
            dtype, bc2_sqrt) + eps
        param_new = param + (scalar(dtype, -step_size) * m_new) / denom
        return param_new, m_new, v_new, vhat_new
    bc1 = one - beta_power(dtype, b1, t, conv)
    bc2 = one - beta_power(dtype, b2, t, conv)
    if dtype in _EXTRA_DTYPES.get():  # bfloat16 (bf16_generic): optax's float32 1 - b**t, cast
        bc1, bc2 = (scalar(dtype, np.float32(1) - _libm.power(_F32, np.float32(b),
                                                             np.float32(t))) for b in (b1, b2))
    if conv.optax_jit == "eager":
        return _adam_optax_eager(param, m_new, v_new, vhat, bc1, bc2, lr, eps, conv,
                                 weight_decay, eps_root)
    # optax under jit, as XLA:CPU compiles it for a pytree of several arrays: the bias
    # corrections are folded into one denominator, mu / (bc1 * (sqrt(nu / bc2) + eps))
    v_hat = v_new / bc2
    if vhat is None:
        vhat_new, denom_v = None, v_hat
    elif conv.amsgrad_maximum == "corrected":
        vhat_new = np.maximum(vhat, v_hat)
        denom_v = vhat_new
    else:
        vhat_new = np.maximum(vhat, v_new)
        denom_v = vhat_new / bc2
    if eps_root:  # optax's sqrt(nu_hat + eps_root) (+0 changes no bit of nu_hat >= +0)
        denom_v = denom_v + scalar(dtype, eps_root)
    u = m_new / (bc1 * (np.sqrt(denom_v) + eps))
    if weight_decay is not None:
        u = fma(param, scalar(dtype, weight_decay), u)
    return (optax_apply(param, u, scalar(dtype, -float(lr)), conv.optax_jit), m_new, v_new,
            vhat_new)


def optax_apply(param, u, neg_lr, mode):
    """``apply_updates(param, scale(-lr)(u))`` as ``Convention.optax_jit`` ``mode`` rounds it:
    ``u*(-lr)`` then ``param + that`` (``"update"``, ``"eager"``: apply_updates runs outside
    jit), or one FMA ``fma(u, -lr, param)`` (``"step"``: XLA fuses apply_updates into the
    update)."""
    if mode == "step":
        return fma(u, neg_lr, param)
    return param + u * neg_lr


def _adam_optax_eager(param, m_new, v_new, vhat, bc1, bc2, lr, eps, conv, weight_decay,
                      eps_root):
    """optax's Adam (``scale_by_adam``/``scale_by_amsgrad``, ``add_decayed_weights``,
    ``scale_by_learning_rate``, ``apply_updates``) with nothing jitted: ``m/bc1``,
    ``v/bc2``, ``m_hat / (sqrt(v_hat + eps_root) + eps)``, ``u + wd*w``, ``-lr*u``, ``w + u``,
    each rounded."""
    dtype = param.dtype
    m_hat, v_hat = m_new / bc1, v_new / bc2
    vhat_new = None
    if vhat is not None:  # optax's amsgrad: the maximum of the bias-corrected nu
        vhat_new = np.maximum(vhat, v_hat) if conv.amsgrad_maximum == "corrected" \
            else np.maximum(vhat, v_new)
        v_hat = vhat_new if conv.amsgrad_maximum == "corrected" else vhat_new / bc2
    if eps_root:
        v_hat = v_hat + scalar(dtype, eps_root)
    u = m_hat / (np.sqrt(v_hat) + eps)
    if weight_decay is not None:
        u = u + scalar(dtype, weight_decay) * param
    return param + scalar(dtype, -float(lr)) * u, m_new, v_new, vhat_new


def _adam_scatter(param, grad, m, v, vhat, learning_rate, b1, b2, eps, t, conv):
    """TF1 / Keras 2 non-lazy sparse Adam: ``m*b`` densely, then scatter-add ``(1-b)*g``."""
    dtype = param.dtype
    g = grad.deduplicate()
    one = scalar(dtype, 1)
    c1, c2 = one_minus(dtype, b1, conv), one_minus(dtype, b2, conv)
    m_new = m * tf_cast(dtype, b1)
    m_new[g.indices] += g.values * c1
    v_new = v * tf_cast(dtype, b2)
    if conv.sparse_adam == "tf1":  # TF1's graph (Grappler) computes (g*g)*c as g*(g*c)
        v_new[g.indices] += g.values * (g.values * c2)
    else:
        v_new[g.indices] += (g.values * g.values) * c2
    p1 = scalar(dtype, beta_power(dtype, b1, t, conv))
    p2 = scalar(dtype, beta_power(dtype, b2, t, conv))
    lr = scalar(dtype, lr_value(dtype, learning_rate, conv))
    if conv.sparse_adam == "keras2":  # lr_t * (sqrt(1 - b2^t) / (1 - b1^t))
        lr_c = lr * (np.sqrt(one - p2) / (one - p1))
    else:  # TF1: lr * sqrt(1 - b2^t) / (1 - b1^t), left to right
        lr_c = lr * np.sqrt(one - p2) / (one - p1)
    vhat_new = None if vhat is None else np.maximum(vhat, v_new)
    denom_v = v_new if vhat is None else vhat_new
    param_new = param - (lr_c * m_new) / (np.sqrt(denom_v) + eps_value(dtype, eps, conv))
    return param_new, m_new, v_new, vhat_new


def lazy_rows_torch(rows_param, rows_grad, rows_m, rows_v, *, learning_rate, beta_1, beta_2,
                    epsilon, step, convention=None):
    """``torch.optim.SparseAdam`` on the gathered (unique) rows; returns ``(param, m, v)``.

    ``convention``: its ``sqrt`` knob (:func:`refopt.reference.sqrt.convention_sqrt`;
    SparseAdam has no fused kernel, so ``"torch_fused"`` means MKL's); None: IEEE.

    ``dm = (g - m)*(1-b1)``, ``m += dm``; ``dv = (g*g - v)*(1-b2)``, ``v += dv``;
    ``w += f(-step_size) * ((dm + m_old) / (sqrt(dv + v_old) + eps))`` with
    ``step_size = lr*sqrt(1-b2^t)/(1-b1^t)`` in float64: epsilon-hat placement, like TF.
    """
    dtype = rows_param.dtype
    c1, c2 = scalar(dtype, 1 - beta_1), scalar(dtype, 1 - beta_2)
    dm = (rows_grad - rows_m) * c1
    m_new = rows_m + dm
    dv = (rows_grad * rows_grad - rows_v) * c2
    v_new = rows_v + dv
    numer = dm + rows_m
    root = np.sqrt(dv + rows_v) if convention is None else convention_sqrt(
        dv + rows_v, convention)
    denom = root + scalar(dtype, epsilon)
    step_size = float(learning_rate) * math.sqrt(1 - float(beta_2) ** step) / (
        1 - float(beta_1) ** step)
    return rows_param + scalar(dtype, -step_size) * (numer / denom), m_new, v_new


def decay_torch(param, *, learning_rate, weight_decay):
    """PyTorch ``AdamW``'s decoupled decay: ``w * dtype(1 - lr*wd)`` (the factor in float64)."""
    # np.asarray: a 0-d variable times a scalar is a NumPy scalar, not an array
    factor = scalar(param.dtype, 1.0 - float(learning_rate) * float(weight_decay))
    return np.asarray(param * factor)


def l2_torch(grad, param, weight_decay):
    """PyTorch ``Adam``'s L2 coupling in its fused kernel: ``fma(w, wd, g)`` (one rounding)."""
    return fma(param, scalar(param.dtype, weight_decay), grad)


# ----------------------------------------------------------------------------- SGD
def sgd_tail(how, array):
    """How many trailing elements of ``array`` PyTorch's fused SGD kernel computes in its
    scalar tail under ``sgd_momentum=how``: ``numel % (32 / itemsize)`` for float32/float64
    under ``"torch_fused"`` (the AVX2 kernel's 8 float32 / 4 float64 lanes; its chunks
    start on 64-byte boundaries, so only the tensor's last chunk has a tail), else 0."""
    dtype = np.asarray(array).dtype
    if how != "torch_fused" or dtype not in (_F32, _F64):
        return 0
    return np.asarray(array).size % (32 // dtype.itemsize)


def sgd_variant(param, grad, m, *, learning_rate, momentum, nesterov, convention,
                weight_decay=None, dampening=0.0, step=None):
    """One SGD step under ``convention`` (dense gradient); returns ``(param, m)``.

    ``weight_decay``: PyTorch's L2 term ``g = fma(wd, w, g)`` (``grad.add(param,
    alpha=wd)``), used with ``convention.sgd_momentum`` ``"torch"`` or ``"torch_fused"``
    only. ``dampening`` (torch only): ``b = fma(1 - dampening, g, b mu)`` (``buf.mul_(mu).
    add_(g, alpha=1 - dampening)``), except at ``step`` 1, where torch's buffer is a copy of
    ``g``. ``"torch_fused"`` (``SGD(fused=True)``, ``FusedSGDKernel.cpp``): the same, except
    that the scalar tail (the last ``numel % (32 / itemsize)`` elements of a float32 or
    float64 tensor, after its whole AVX2 vectors) takes ``b = fma(b, mu, g (1 - dampening))``.
    """
    conv = convention
    dtype = param.dtype
    how = conv.sgd_momentum
    if how == "tf1":
        lr = lr_cast(dtype, learning_rate)
        mu = tf_cast(dtype, momentum)
        acc = m * mu + grad
        if nesterov:
            return param - (grad * lr + acc * mu * lr), acc
        return param - acc * lr, acc
    if how in ("torch", "torch_fused"):
        if weight_decay:
            grad = fma(scalar(dtype, weight_decay), param, grad)
        mu = scalar(dtype, momentum)
        if momentum:
            if step == 1:  # torch: the buffer starts as a copy of the gradient
                buf = m * mu + grad
            else:
                undamped = scalar(dtype, 1.0 - float(dampening))
                buf = fma(undamped, grad, m * mu)
                tail = sgd_tail(how, buf)
                if tail:  # the fused kernel's scalar tail, contracted the other way round
                    flat, mf, gf = buf.reshape(-1), m.reshape(-1), grad.reshape(-1)
                    flat[-tail:] = fma(mf[-tail:], mu, gf[-tail:] * undamped)
            direction = fma(mu, buf, grad) if nesterov else buf
        else:
            buf, direction = m, grad
        return fma(scalar(dtype, -float(learning_rate)), direction, param), buf
    # optax: trace t = g + mu*t (one FMA under jit), update -lr*t, then p + u (one FMA
    # when the whole step is jitted; every operation rounded when nothing is)
    mu = scalar(dtype, momentum)
    neg_lr = scalar(dtype, -float(learning_rate))
    if conv.optax_jit == "eager":
        tr = grad + mu * m
        step = grad + mu * tr if nesterov else tr
        return param + neg_lr * step, tr
    tr = fma(mu, m, grad)
    step = fma(mu, tr, grad) if nesterov else tr
    return optax_apply(param, step, neg_lr, conv.optax_jit), tr


# ----------------------------------------------------------------------------- clipping
def _values(g):
    return g.values if isinstance(g, IndexedSlices) else g


def _rewrap(g, values):
    if isinstance(g, IndexedSlices):
        return IndexedSlices(values, g.indices, g.dense_shape)
    return np.asarray(values)


def _sum_squares(values):
    flat = np.ascontiguousarray(values)
    return np.sum(flat * flat, dtype=flat.dtype)


def clip_global_norm_variant(grads, clip_norm, convention):
    """Clip all gradients together by their global L2 norm under ``convention.clip_formula``.

    ``"torch"``: ``total`` = the 2-norm of the per-tensor norms, each norm and ``total`` in
    PyTorch's order of addition (:func:`refopt.reference.reductions.torch_vector_norm`, the
    norms stacked as ``torch.nn.utils.get_total_norm`` stacks them), ``coef = c/(total +
    1e-6)`` clamped to 1 (:func:`refopt.reference.reductions.torch_clip_coef`), every
    gradient times ``coef`` (infinite norm: finite gradients become 0; float16 gradients
    computed in float32 as PyTorch's kernels do, :func:`~refopt.reference.reductions.torch_scale`). ``"optax"``: ``N`` = sqrt of the sum of each tensor's sum of squares; kept when
    ``N < c``, else ``(g / N) * c``. ``None`` entries stay ``None``. Returns the list.
    """
    present = [g for g in grads if g is not None]
    if not present:
        return list(grads)
    # Mixed dtypes: the norms meet in the widest dtype (whatever the order of the list), and
    # every gradient keeps its own dtype (the factor is cast to it, as torch's in-place
    # ``g.mul_(coef)`` and a 0-d scalar do).
    dtype = np.result_type(*[_values(g).dtype for g in present])
    with np.errstate(all="ignore"):
        if convention.clip_formula == "torch":
            # torch.linalg.vector_norm of each gradient, then of the stacked norms, in the
            # order of torch's dtype groups (refopt.reference.reductions)
            from refopt.reference.reductions import (
                torch_clip_coef,
                torch_scale,
                torch_stack_order,
                torch_vector_norm,
            )

            order = torch_stack_order([_values(g).dtype for g in present])
            norms = [torch_vector_norm(_values(present[k])) for k in order]
            total = torch_vector_norm(np.asarray(norms, dtype))
            # max_norm / (total + 1e-6): a Python float over a tensor is the tensor's
            # reciprocal times the float in torch; clamped to 1
            coef = torch_clip_coef(total, clip_norm, dtype)
            return [None if g is None else _rewrap(g, torch_scale(_values(g), coef))
                    for g in grads]
        sums = [_sum_squares(_values(g)) for g in present]
        total = np.sqrt(np.sum(np.asarray(sums, dtype), dtype=dtype))
        c = scalar(dtype, clip_norm)
        if total < c:
            return list(grads)
        if convention.optax_jit == "eager":  # eager XLA divides by a scalar as * (1/N)
            return [None if g is None else _rewrap(
                g, (_values(g) * (_values(g).dtype.type(1) / _values(g).dtype.type(total)))
                * _values(g).dtype.type(c)) for g in grads]
        return [None if g is None else _rewrap(
            g, (_values(g) / _values(g).dtype.type(total)) * _values(g).dtype.type(c))
            for g in grads]


def clip_norm_variant(grad, clip_norm, convention):
    """Per-tensor norm clipping with the framework's global formula applied to one tensor."""
    return clip_global_norm_variant([grad], clip_norm, convention)[0]


# ----------------------------------------------------------------------------- EMA
def ema_variant(average, param, *, ema_momentum, first_step, convention, num_averaged=None):
    """The weight average after a step under ``convention.ema``; returns a new array.

    ``"keras3"``: ``mu = dtype(ema_momentum)``, or 0 on the first step, then
    ``mu*avg + (1 - mu)*w`` with ``1 - mu`` in the dtype. ``"torch"``: the first update copies
    ``w``; later ones ``avg.lerp_(w, 1 - decay)`` (one FMA, branch on ``|weight| < 0.5``);
    with ``ema_momentum=None`` ``AveragedModel``'s default equal-weight average on the CPU
    (``get_swa_avg_fn``): ``avg + (w - avg) / dtype(n + 1)``, three rounded operations, ``n``
    = ``num_averaged``, the averages taken before this one.
    """
    dtype = average.dtype
    if ema_momentum is None and convention.ema == "torch":
        if first_step:
            return param.copy()
        return average + (param - average) / scalar(dtype, num_averaged + 1)
    if convention.ema == "keras3":
        mu = scalar(dtype, 0.0 if first_step else ema_momentum)
        return mu * average + (scalar(dtype, 1) - mu) * param
    if first_step:
        return param.copy()
    w = scalar(dtype, 1 - ema_momentum)
    d = param - average
    if abs(float(w)) < 0.5:
        return fma(w, d, average)
    return fma(w - scalar(dtype, 1), d, param)
