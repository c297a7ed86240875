"""bfloat16 variables computed in their dtype, op by op: PyTorch's default (for-loop)
optimizers, tf_keras'/Keras 3's Adam and SGD on TensorFlow's CPU kernels, optax's adam and
sgd on XLA:CPU; and float16 variables of PyTorch's for-loop optimizers, with the same ops.

:func:`supported`, :func:`takes` and :func:`update` are the staged step's entry
(:func:`refopt.executors.staged.compute`, every backend; ``backend="cuda"`` takes its host
step): elsewhere refopt computes bfloat16 only in float32 (:mod:`refopt.precision`). Only
the conventions' presets themselves are taken (a convention with a knob changed is
refused: these functions do not read the knobs).

PyTorch
-------

``torch.optim.Adam``, ``AdamW``, ``SGD``, ``Adagrad`` and ``RMSprop`` run their
single-tensor for-loop path on CPU (``foreach`` and ``fused`` off): a sequence of in-place
torch ops on the bfloat16 parameter, gradient and state (the state is bfloat16, like the
parameter). Each op loads its bfloat16 operands exactly into float32 (``opmath_t``),
computes there, and rounds its result once to bfloat16, round-to-nearest-even. What each op
computes in float32 was measured on torch 2.13 (CPU, AVX2) element by element, on the
vectorised body and on the scalar tail, and is written out below (``a``, ``b``, ``c``:
tensors; ``s``: a Python number; ``R``: the rounding to bfloat16; ``f32``: float32):

=====================================  ==================================================
torch op                               float32 computation, then ``R``
=====================================  ==================================================
``a.mul_(s)``, ``a / s``               ``a * f32(s)``, ``a / f32(s)``
``a.add_(s)``                          ``a + R(s)`` (the scalar rounded to bfloat16 first)
``a.add_(b, alpha=s)``                 ``fma(b, R(s), a)``; in the scalar tail, the last
                                       ``numel % 32`` elements (two AVX2 vectors of 16 per
                                       iteration), ``a + R(b * R(s))``
``a.lerp_(b, w)``                      ``fma(w, b - a, a)`` if ``|w| < 0.5`` else
                                       ``fma(w - 1, b - a, b)``, ``w = f32(w)``
``a.addcmul_(b, c, value=s)``          ``fma(f32(s) * b, c, a)``
``a.addcdiv_(b, c, value=s)``          ``a + (f32(s) * b) / c``
``a.sqrt()``, ``torch.maximum(a, b)``  ``sqrt(a)`` (correctly rounded), ``max(a, b)``
=====================================  ==================================================

Python scalars (``1 - beta``, ``lr / bias_correction1``...) are computed in float64 as
torch's Python code computes them. NumPy arrays of ``ml_dtypes.bfloat16`` hold the tensors.
The scalar tails are those of a tensor of at most 32,768 elements (``at::internal::
GRAIN_SIZE``): a larger one is split between torch's threads, each chunk with a tail of its
own, which this module does not model (``a.add_(b, alpha)`` may then differ by one rounding
in a few elements). Source: ``torch/optim/{adam,sgd,adagrad,rmsprop}.py`` (2.13,
``_single_tensor_*``).

float16 (``Half``) parameters take the same ops with float16's rounding ``R`` (and the
state in float16): measured on torch 2.13 (CPU, AVX2) as for bfloat16, every formula of the
table holds, the scalar tail included (``numel % 32``: two ``Vectorized<Half>`` of 16,
:data:`TAIL_LANES_F16`; ``conformance/generators/probe_f16_ops.py``). float16's narrow range
shows where bfloat16's does not: ``eps=1e-8`` rounds to 0 in ``a.add_(eps)``, so a ``v``
that underflows to 0 gives torch's ``m / 0`` (an infinity, or NaN for ``m = 0``), which
this model gives too (golden cases ``torch/*_loop_f16``, ``torch/adagrad_f16``,
``torch/sgd_momentum_f16``). ``AveragedModel``'s exponential average of float16 parameters
is the op ``lerp`` too (:func:`ema_torch`, ``torch/sgd_ema_loop_f16``). torch's other
for-loop optimizers (``Adamax``, ``NAdam``, ``RAdam``, ``Adadelta``, ``ASGD``, ``Rprop``) on
bfloat16 and float16, and the sparse gradients of float16 tables of ``SparseAdam`` and
``Adagrad``, are :mod:`refopt.reference.bf16_torch_more` (golden cases ``torch/*_loopx_*``,
``torch/*_sparsex_f16``); other sparse float16 steps keep NumPy's float16 arithmetic
(:func:`takes`; torch's sparse ``SGD`` without momentum is bit for bit so).

tf_keras and Keras 3
--------------------
``tf.Variable``/``keras.Variable`` of dtype bfloat16 (no mixed policy): the slots are
bfloat16 and every TensorFlow op on them is Eigen's bfloat16 op, computed in float32 and
rounded once; which is what NumPy's ``ml_dtypes.bfloat16`` arithmetic does, so
:func:`keras_adam` and :func:`keras_sgd` are tf_keras' formulas (``tf_keras/optimizers/
adam.py``, ``sgd.py``; Keras 3's ``keras/src/optimizers/adam.py``, ``sgd.py`` compute the
same roundings) on bfloat16 arrays, the scalars converted as TensorFlow converts them: the
learning rate (a float32 variable) and ``tf.cast(beta)`` through float32, Python floats
(``1 - beta``, ``epsilon``) straight, the step count ``tf.cast(iterations + 1)``, whose
integer is rounded to bfloat16 (exact up to 256), and ``tf.pow`` as ``powf`` on the float32
values, rounded.

optax
-----
Params of dtype bfloat16 (the state is bfloat16): XLA:CPU computes every op of
``optax.adam``/``optax.sgd`` in bfloat16, rounding each result (no FMA, no folding of the
bias corrections, unlike float32), under each of refopt's three jit modes (``"optax"``,
``"optax_eager"``, ``"optax_jit_step"``: the golden cases ``optax*/*_bf16``, 20 steps);
:func:`optax_adam` and :func:`optax_sgd` are optax's formulas on bfloat16 arrays, Python
floats converted straight to bfloat16, the bias corrections ``1 - b**count`` in float32
(``powf``) and then cast.

The TF family's and optax's other optimizers (RMSprop, Adagrad, Adadelta, Adamax, Nadam,
Lion, AdamW; with EMA and ``clipvalue`` under tf_keras and Keras 3) run their generic
reference functions on bfloat16: :mod:`refopt.reference.bf16_generic` (``_kind``
"generic").
"""

from __future__ import annotations

import numpy as np

from refopt import _libm
from refopt import precision as _precision
from refopt.indexed_slices import IndexedSlices
from refopt.reference import bf16_generic as _generic
from refopt.reference._common import lr_cast, scalar, tf_cast

__all__ = ["TAIL_LANES", "TAIL_LANES_F16", "ema_torch", "keras_adam", "keras_sgd",
           "optax_adam", "optax_sgd", "supported", "takes", "takes_average", "update"]

#: Elements per iteration of torch's vectorised CPU loop on bfloat16 under AVX2 (two
#: ``Vectorized<BFloat16>`` of 16): the last ``numel % TAIL_LANES`` take the scalar path.
TAIL_LANES = 32
#: The same for float16 (``Vectorized<Half>`` of 16 under AVX2, two per iteration), measured
#: on torch 2.13 (``conformance/generators/probe_f16_ops.py``).
TAIL_LANES_F16 = 32

_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)
_F16 = np.dtype(np.float16)


# ------------------------------------------------------------------------------ the ops
def _f(a):
    """``a`` exactly in float32."""
    return np.asarray(a).astype(_F32)


def _r(x, dtype):
    return _precision.round_to(x, dtype)


def _rs(s, dtype):
    """Python number ``s`` as torch converts a scalar to ``dtype`` (through float), in
    float32."""
    return _f(_r(np.float32(s), dtype))


def _fma(a, b, c):
    """float32 ``a*b + c`` rounded once (the product is exact in float64)."""
    with np.errstate(all="ignore"):
        return (np.asarray(a, _F64) * np.asarray(b, _F64) + np.asarray(c, _F64)).astype(_F32)


def mul_s(a, s):
    """``a.mul_(s)``."""
    return _r(_f(a) * np.float32(s), a.dtype)


def div_s(a, s):
    """``a / s``."""
    return _r(_f(a) / np.float32(s), a.dtype)


def add_s(a, s):
    """``a.add_(s)``: the scalar rounded to the dtype first."""
    return _r(_f(a) + _rs(s, a.dtype), a.dtype)


def add(a, b, alpha=1.0):
    """``a.add(b, alpha=alpha)``: one FMA, except the scalar tail (see the module)."""
    al = _rs(alpha, a.dtype)
    fa, fb = _f(a), _f(b)
    out = _fma(fb, al, fa)
    tail = a.size % (TAIL_LANES_F16 if a.dtype == _F16 else TAIL_LANES)
    if tail:
        flat = out.reshape(-1)
        prod = _f(_r(fb.reshape(-1)[-tail:] * al, a.dtype))
        flat[-tail:] = fa.reshape(-1)[-tail:] + prod
    return _r(out, a.dtype)


def lerp(a, b, w):
    """``a.lerp_(b, w)`` for a Python weight ``w``."""
    fa, fb, w32 = _f(a), _f(b), np.float32(w)
    d = fb - fa
    if abs(float(w32)) < 0.5:
        return _r(_fma(w32, d, fa), a.dtype)
    return _r(_fma(w32 - np.float32(1), d, fb), a.dtype)


def addcmul(a, b, c, value):
    """``a.addcmul_(b, c, value=value)``."""
    return _r(_fma(np.float32(value) * _f(b), _f(c), _f(a)), a.dtype)


def addcdiv(a, b, c, value):
    """``a.addcdiv_(b, c, value=value)``."""
    return _r(_f(a) + (np.float32(value) * _f(b)) / _f(c), a.dtype)


def sqrt(a):
    """``a.sqrt()``."""
    return _r(np.sqrt(_f(a)), a.dtype)


def maximum(a, b):
    """``torch.maximum(a, b)`` (NaN propagates)."""
    return _r(np.maximum(_f(a), _f(b)), a.dtype)


# ------------------------------------------------------------------------- the updates
def adam(param, grad, m, v, vhat, *, learning_rate, beta_1, beta_2, epsilon, step,
         weight_decay=None, decoupled=False):
    """``torch.optim.Adam``/``AdamW`` (``_single_tensor_adam``), one step; new arrays."""
    lr, b1, b2 = float(learning_rate), float(beta_1), float(beta_2)
    if weight_decay is not None:
        if decoupled:
            param = mul_s(param, 1 - lr * float(weight_decay))
        else:
            grad = add(grad, param, alpha=weight_decay)
    m = lerp(m, grad, 1 - b1)
    v = addcmul(mul_s(v, b2), grad, grad, 1 - b2)
    bc1 = 1 - b1 ** step
    bc2 = 1 - b2 ** step
    step_size = lr / bc1
    bc2_sqrt = bc2 ** 0.5
    if vhat is not None:
        vhat = maximum(vhat, v)
    denom = add_s(div_s(sqrt(v if vhat is None else vhat), bc2_sqrt), epsilon)
    return addcdiv(param, m, denom, -step_size), m, v, vhat


def sgd(param, grad, buf, *, learning_rate, momentum, dampening, nesterov, step,
        weight_decay=None):
    """``torch.optim.SGD`` (``_single_tensor_sgd``), one step: ``(param, buf)``. ``step``
    1 is the step torch creates the buffer at (a copy of the gradient)."""
    if weight_decay is not None:
        grad = add(grad, param, alpha=weight_decay)
    if momentum != 0:
        if step == 1:
            buf = grad.copy()
        else:
            buf = add(mul_s(buf, momentum), grad, alpha=1 - float(dampening))
        grad = add(grad, buf, alpha=momentum) if nesterov else buf
    return add(param, grad, alpha=-float(learning_rate)), buf


def adagrad(param, grad, acc, *, learning_rate, epsilon, lr_decay, step, weight_decay=None):
    """``torch.optim.Adagrad`` (``_single_tensor_adagrad``, dense), one step."""
    if weight_decay is not None:
        grad = add(grad, param, alpha=weight_decay)
    clr = float(learning_rate) / (1 + (step - 1) * float(lr_decay))
    acc = addcmul(acc, grad, grad, 1)
    std = add_s(sqrt(acc), epsilon)
    return addcdiv(param, grad, std, -clr), acc


def rmsprop(param, grad, sq, grad_avg, buf, *, learning_rate, rho, epsilon, momentum,
            centered, weight_decay=None):
    """``torch.optim.RMSprop`` (``_single_tensor_rmsprop``), one step:
    ``(param, sq, grad_avg, buf)`` (None for the slots not in use)."""
    lr, rho = float(learning_rate), float(rho)
    if weight_decay is not None:
        grad = add(grad, param, alpha=weight_decay)
    sq = addcmul(mul_s(sq, rho), grad, grad, 1 - rho)
    if centered:
        grad_avg = lerp(grad_avg, grad, 1 - rho)
        avg = sqrt(addcmul(sq, grad_avg, grad_avg, -1))
    else:
        avg = sqrt(sq)
    avg = add_s(avg, epsilon)
    if momentum > 0:
        buf = addcdiv(mul_s(buf, momentum), grad, avg, 1)
        return add(param, buf, alpha=-lr), sq, grad_avg, buf
    return addcdiv(param, grad, avg, -lr), sq, grad_avg, buf


def keras_adam(param, grad, m, v, vhat, *, learning_rate, beta_1, beta_2, epsilon, step):
    """tf_keras'/Keras 3's ``Adam.update_step`` on bfloat16 arrays: ``(param, m, v, vhat)``.

    ``alpha = lr * sqrt(1 - b2^t) / (1 - b1^t)``; ``m += (g - m)(1 - b1)``;
    ``v += (g^2 - v)(1 - b2)``; AMSGrad ``vhat = max(vhat, v)``;
    ``param -= (m alpha) / (sqrt(v or vhat) + eps)``, every op rounded to bfloat16.
    """
    dt = param.dtype
    lr = lr_cast(dt, learning_rate)
    t = dt.type(step)
    p1 = _libm.power(dt, tf_cast(dt, beta_1), t)
    p2 = _libm.power(dt, tf_cast(dt, beta_2), t)
    one = dt.type(1)
    alpha = lr * np.sqrt(one - p2) / (one - p1)
    m = m + (grad - m) * scalar(dt, 1 - beta_1)
    v = v + (np.square(grad) - v) * scalar(dt, 1 - beta_2)
    if vhat is not None:
        vhat = np.maximum(vhat, v)
    den = np.sqrt(v if vhat is None else vhat) + scalar(dt, epsilon)
    return np.asarray(param - (m * alpha) / den), np.asarray(m), np.asarray(v), (
        None if vhat is None else np.asarray(vhat))


def keras_sgd(param, grad, m, *, learning_rate, momentum, nesterov):
    """tf_keras'/Keras 3's ``SGD.update_step`` on bfloat16 arrays: ``(param, m)``.

    ``m = m mu - g lr``; ``param += m`` (Nesterov: ``param += m mu - g lr``); without
    momentum ``param -= g lr``.
    """
    dt = param.dtype
    lr = lr_cast(dt, learning_rate)
    if not momentum:
        return np.asarray(param - grad * lr), m
    mu = tf_cast(dt, momentum)
    m = np.asarray(m * mu - grad * lr)
    if nesterov:
        return np.asarray(param + (m * mu - grad * lr)), m
    return np.asarray(param + m), m


def optax_adam(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, eps_root, step):
    """``optax.adam`` then ``apply_updates`` on bfloat16 arrays: ``(param, m, v)``.

    ``m = (1-b1) g + b1 m``; ``v = (1-b2) g^2 + b2 v``; ``u = (m / bc1) /
    (sqrt(v / bc2 + eps_root) + eps)``, ``bc = R(1 - b**t)`` (float32);
    ``param + u (-lr)``; every op rounded to bfloat16.
    """
    dt = param.dtype
    f32 = np.dtype(np.float32)
    m = (scalar(dt, 1 - beta_1) * grad + scalar(dt, beta_1) * m)
    v = (scalar(dt, 1 - beta_2) * np.square(grad) + scalar(dt, beta_2) * v)
    bc1 = dt.type(np.float32(1) - _libm.power(f32, np.float32(beta_1), np.float32(step)))
    bc2 = dt.type(np.float32(1) - _libm.power(f32, np.float32(beta_2), np.float32(step)))
    u = (m / bc1) / (np.sqrt(v / bc2 + scalar(dt, eps_root or 0.0)) + scalar(dt, epsilon))
    return (np.asarray(param + u * scalar(dt, -float(learning_rate))), np.asarray(m),
            np.asarray(v))


def optax_sgd(param, grad, m, *, learning_rate, momentum, nesterov):
    """``optax.sgd`` then ``apply_updates`` on bfloat16 arrays: ``(param, m)``.

    ``m = g + mu m``; the step ``m`` (Nesterov: ``g + mu m``); ``param + step (-lr)``.
    """
    dt = param.dtype
    step = grad
    if momentum:
        mu = scalar(dt, momentum)
        m = np.asarray(grad + mu * m)
        step = grad + mu * m if nesterov else m
    return np.asarray(param + step * scalar(dt, -float(learning_rate))), m


# ------------------------------------------------------------------------ the dispatch
def optimizer_class_name(opt):
    """The name of ``opt``'s class when it is one of refopt's own optimizer classes (not a
    subclass elsewhere, which may rewrite the update), else None. By name and module, so
    this layer imports no optimizer (``tests/test_layers.py``)."""
    t = type(opt)
    return t.__name__ if t.__module__.startswith("refopt.optimizers.") else None


def _kind(opt):
    """Which update of this module ``opt`` runs under its convention (torch's "adam",
    "sgd", "adagrad", "rmsprop"; "keras_adam", "keras_sgd", "optax_adam", "optax_sgd"), or
    None where this module does not reproduce it (a convention other than an unchanged
    preset, another optimizer or option)."""
    from refopt.conventions import PRESETS
    from refopt.reference.variants import is_tf_keras_adam

    conv = opt.convention
    cls = optimizer_class_name(opt)
    if PRESETS.get(conv.name) != conv:
        return None
    if conv.name in ("tf_keras", "keras3"):
        if cls == "Adam" and is_tf_keras_adam(conv) and not opt._uses_update_step() and not (
                opt.nesterov):
            return "keras_adam"
        if cls == "SGD" and conv.sgd_momentum == "keras":
            return "keras_sgd"
        return _generic.kind(opt)  # the other optimizers: refopt.reference.bf16_generic
    if conv.name in ("optax", "optax_eager", "optax_jit_step"):
        if cls == "Adam" and not opt.amsgrad and not opt.nesterov and (
                not opt._uses_update_step()):
            return "optax_adam"
        if cls == "SGD" and conv.sgd_momentum == "optax":
            return "optax_sgd"
        return _generic.kind(opt)  # the other optimizers: refopt.reference.bf16_generic
    if cls in ("Adam", "AdamW"):
        if conv.moment_update != "torch_loop" or opt.nesterov or opt._uses_update_step():
            return None
        return "adam"
    if cls == "SGD" and conv.sgd_momentum == "torch":
        return "sgd"
    if cls == "Adagrad" and conv.adagrad_form == "torch" and conv.sqrt == "mkl":
        return "adagrad"
    if cls == "RMSprop" and conv.rmsprop_form == "torch":
        return "rmsprop"
    # Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop: refopt.reference.bf16_torch_more
    from refopt.reference import bf16_torch_more

    return bf16_torch_more.kind(opt)


def supported(opt):
    """Why ``opt`` cannot compute a bfloat16 variable in its dtype here (a phrase), or None
    when it can: ``Adam``, ``AdamW``, ``SGD``, ``Adagrad``, ``RMSprop`` under a convention
    with torch's for-loop forms (``"torch"``, ``"fbgemm"``; ``"torch_fused"`` for RMSprop);
    ``Adam`` and ``SGD`` under ``"tf_keras"``, ``"keras3"`` and the optax presets (no
    weight decay; optax: no AMSGrad or Nesterov Adam); without clipping or EMA (not
    recorded on bfloat16)."""
    if _kind(opt) is None:
        return _generic.refusal(opt) or "its step on bfloat16 is not reproduced"
    tf_family = _generic.family(opt) == "tf"  # EMA and clipvalue: bf16_generic.supported
    if opt.use_ema and not tf_family:
        return "the EMA of bfloat16 variables is not reproduced"
    if any(c is not None for c in (opt.clipnorm, opt.global_clipnorm)) or (
            opt.clipvalue is not None and not tf_family):
        return "gradient clipping of bfloat16 gradients is not reproduced"
    kind = _kind(opt)
    if kind == "generic":
        return _generic.supported(opt)
    torch_kind = kind in ("adam", "sgd", "adagrad", "rmsprop", "adamax", "nadam", "radam",
                          "adadelta", "asgd", "rprop")
    if opt._weight_decay_acts() and (not torch_kind or opt._decay_mode() not in (
            "l2", "torch")):
        return f"weight decay ({opt._decay_mode()!r}) of bfloat16 variables is not reproduced"
    return None


def takes(opt, dtype, sparse=False):
    """Whether a ``dtype`` variable of ``opt`` runs here.

    bfloat16 computed in its dtype (:func:`refopt.precision.compute_dtype` is None) by an
    optimizer :func:`supported` accepts (a sparse gradient then raises in :func:`update`).
    float16 computed in its dtype by torch's for-loop ``Adam``, ``AdamW``, ``SGD``,
    ``Adagrad``, ``RMSprop`` (the torch kinds :func:`supported` accepts, under ``"torch"``,
    ``"fbgemm"``, ``"torch_fused"`` for RMSprop) with a dense gradient (``sparse`` False):
    each torch op computed in float32 and rounded once to float16, bit for bit torch 2.13's
    (golden cases ``torch/*_f16`` of the for-loop). Clipping runs before, on the float16
    gradients, as elsewhere (``clip_grad_norm_``: ``torch/adam_clip_loop_f16``), and the EMA
    after (:func:`takes_average`). Likewise ``Adamax``, ``NAdam``, ``RAdam``, ``Adadelta``,
    ``ASGD``, ``Rprop`` (:mod:`refopt.reference.bf16_torch_more`), and the gathered rows of
    a sparse gradient of ``SparseAdam``/``Adagrad`` without weight decay or EMA
    (``sparse`` True: :func:`refopt.reference.bf16_torch_more.takes_sparse_f16`). Every
    other float16 step keeps NumPy's float16
    arithmetic (every op rounded).
    """
    if dtype == _F16:
        if sparse:  # torch's SparseAdam, sparse Adagrad: refopt.reference.bf16_torch_more
            from refopt.reference import bf16_torch_more

            return (_precision.compute_dtype(opt.convention, dtype, opt) is None
                    and bf16_torch_more.takes_sparse_f16(opt))
        if _kind(opt) not in ("adam", "sgd", "adagrad", "rmsprop", "adamax", "nadam",
                                        "radam", "adadelta", "asgd", "rprop"):
            return False
        if _precision.compute_dtype(opt.convention, dtype, opt) is not None:
            return False
        return not opt._weight_decay_acts() or opt._decay_mode() in ("l2", "torch")
    return (_precision.BFLOAT16 is not None and dtype == _precision.BFLOAT16
            and _precision.compute_dtype(opt.convention, dtype, opt) is None
            and supported(opt) is None)


def takes_average(opt, dtype):
    """Whether the EMA of a ``dtype`` variable of ``opt`` is :func:`ema_torch`: float16
    under ``AveragedModel``'s exponential average (convention knob ``ema="torch"``, an
    ``ema_momentum``), whatever computes the step."""
    return (dtype == _F16 and opt.use_ema and opt.convention.ema == "torch"
            and opt.ema_momentum is not None)


def ema_torch(average, param, ema_momentum, *, first_step):
    """``AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(ema_momentum))`` on float16: the
    first update copies ``param``, later ones ``average.lerp_(param, 1 - ema_momentum)``
    (``torch._foreach_lerp_``, on CPU the op :func:`lerp` per tensor). New array.

    Source: ``torch/optim/swa_utils.py`` (2.13, ``get_ema_multi_avg_fn``,
    ``AveragedModel.update_parameters``).
    """
    if first_step:
        return np.array(param, copy=True)
    with np.errstate(all="ignore"):
        return lerp(average, param, 1 - float(ema_momentum))


def update(opt, param, grad, slots, learning_rate, step, decays, sparse=False, decay=None):
    """One step of ``opt`` on one bfloat16 (or float16: :func:`takes`) variable, torch's
    for-loop op by op (or Keras' / optax's ops on bfloat16).

    Parameters
    ----------
    opt : refopt.Optimizer
        An optimizer :func:`supported` accepts (float16: one :func:`takes` accepts).
    param : ndarray of bfloat16 or float16
        The variable (not modified).
    grad : ndarray of the dtype of ``param``, its shape
        Its gradient (already negated under ``maximize``).
    slots : dict of str to ndarray of the dtype of ``param``
        The optimizer's slots for this variable (not modified).
    learning_rate : float
    step : int
        The variable's 1-based step count (torch's per-parameter ``step``).
    decays : bool
        Whether weight decay applies to this variable.
    sparse : bool, default False
        Whether the executor gathered the rows of a sparse gradient (refused).
    decay : callable, optional
        The pipeline's decoupled weight decay ``decay(opt, param, learning_rate)``, which the
        TF family's and optax's other optimizers take (:mod:`refopt.reference.bf16_generic`;
        given by the staged step, as this layer imports no executor).

    Returns
    -------
    (ndarray, dict)
        The new variable and the new slots, in the dtype of ``param``.

    Raises
    ------
    TypeError
        ``grad`` is an IndexedSlices (torch's sparse paths on bfloat16 are not reproduced);
        nothing has changed.
    """
    if sparse and param.dtype == _F16 and not isinstance(grad, IndexedSlices):
        # the gathered rows of a float16 table (SparseAdam, Adagrad): bf16_torch_more
        from refopt.reference import bf16_torch_more

        return bf16_torch_more.update_sparse_f16(opt, param, grad, slots, learning_rate, step)
    if sparse or isinstance(grad, IndexedSlices):
        raise TypeError(
            f"{type(opt).__name__} under convention={opt.convention.name!r}: a sparse "
            "gradient of a bfloat16 variable is not reproduced (torch's for-loop on "
            "bfloat16 is modelled for dense gradients). Received: an IndexedSlices gradient; "
            "pass grad.to_dense()"
        )
    kind = _kind(opt)
    if kind == "generic":
        return _generic.update(opt, param, grad, slots, learning_rate, step, decays,
                               decay=decay)
    if kind in ("adamax", "nadam", "radam", "adadelta", "asgd", "rprop"):
        # torch's other for-loop optimizers: refopt.reference.bf16_torch_more
        from refopt.reference import bf16_torch_more

        return bf16_torch_more.update(opt, kind, param, grad, slots, learning_rate, step,
                                      decays)
    wd = opt.weight_decay if decays else None
    with np.errstate(all="ignore"):
        if kind == "keras_adam":
            p, m, v, vhat = keras_adam(
                param, grad, slots["m"], slots["v"], slots.get("vhat"),
                learning_rate=learning_rate, beta_1=opt.beta_1, beta_2=opt.beta_2,
                epsilon=opt.epsilon, step=step)
            new = {"m": m, "v": v}
            if vhat is not None:
                new["vhat"] = vhat
            return p, new
        if kind == "keras_sgd":
            p, m = keras_sgd(param, grad, slots.get("m"), learning_rate=learning_rate,
                             momentum=opt.momentum, nesterov=opt.nesterov)
            return p, ({"m": m} if "m" in slots else {})
        if kind == "optax_adam":
            p, m, v = optax_adam(param, grad, slots["m"], slots["v"],
                                 learning_rate=learning_rate, beta_1=opt.beta_1,
                                 beta_2=opt.beta_2, epsilon=opt.epsilon,
                                 eps_root=opt.eps_root, step=step)
            return p, {"m": m, "v": v}
        if kind == "optax_sgd":
            p, m = optax_sgd(param, grad, slots.get("m"), learning_rate=learning_rate,
                             momentum=opt.momentum, nesterov=opt.nesterov)
            return p, ({"m": m} if "m" in slots else {})
        if kind == "adam":
            p, m, v, vhat = adam(
                param, grad, slots["m"], slots["v"], slots.get("vhat"),
                learning_rate=learning_rate, beta_1=opt.beta_1, beta_2=opt.beta_2,
                epsilon=opt.epsilon, step=step, weight_decay=wd,
                decoupled=opt._decay_mode() == "torch")
            new = {"m": m, "v": v}
            if vhat is not None:
                new["vhat"] = vhat
            return p, new
        if kind == "sgd":
            p, buf = sgd(param, grad, slots.get("m"), learning_rate=learning_rate,
                         momentum=opt.momentum, dampening=opt.dampening,
                         nesterov=opt.nesterov, step=step, weight_decay=wd)
            return p, ({"m": buf} if "m" in slots else {})
        if kind == "adagrad":
            p, acc = adagrad(param, grad, slots["accumulator"], learning_rate=learning_rate,
                             epsilon=opt.epsilon, lr_decay=opt.lr_decay, step=step,
                             weight_decay=wd)
            return p, {"accumulator": acc}
        p, sq, ga, buf = rmsprop(
            param, grad, slots["velocity"], slots.get("average_gradient"),
            slots.get("momentum"), learning_rate=learning_rate, rho=opt.rho,
            epsilon=opt.epsilon, momentum=opt.momentum, centered=opt.centered,
            weight_decay=wd)
    new = {"velocity": sq}
    if "average_gradient" in slots:
        new["average_gradient"] = ga
    if "momentum" in slots:
        new["momentum"] = buf
    return p, new
