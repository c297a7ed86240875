"""The golden cases: what each generator records, and the inputs they all feed.

Pure Python + NumPy; imported by the generators only (never by refopt or its tests: the tests
read the recorded ``.npz`` files and ``manifest.json``). Each case names the refopt optimizer
and its keyword arguments (refopt/Keras names), the convention preset (plus knob overrides)
that must reproduce it, the framework API the generator calls, and the tolerance the replay
enforces, in float ulp per step.

Inputs come from :func:`make_inputs`, deterministic in the case's seed; the generators store
them in the ``.npz`` next to the results, so a replay never depends on this file.

Gradient kinds
--------------
``dense``          one dense gradient per variable per step, scale log-uniform in 1e-4..1e2.
``dense_nonfinite`` as dense, with an inf at step 2, a NaN at step 4 and -inf at step 5
                   (variable 0 only; later steps are finite again).
``dense_none``     as dense, but variable 1 gets no gradient (None) at steps 2, 3 and 5.
``sparse``         IndexedSlices for variable 0 (a table; rank 2): duplicate indices, rows absent
                   for several steps, an empty gradient at step 3; other variables dense.
``sparse_dup``     the semantics notes' duplicate example: values [[1,2],[3,4]] at rows [1,1] of a
                   3x2 table of ones, every step.

Tolerances (ulp per step, the replay resyncs to the recorded state before each step when > 0):
0 = bit-identical over the whole trajectory. Norm-based clipping in the TF family gets 1 ulp
(TF's Eigen sums in another order than NumPy; 128 ulp of ``m`` where a rescaled gradient
cancels). torch's for-loop path and SparseAdam get 2 (their CPU sqrt is MKL's, not correctly
rounded). torch's fused path and optax under jit are bit-identical (refopt reproduces their
FMA contractions, see refopt/reference/variants.py).
"""

from __future__ import annotations

import numpy as np

TF = "tf_keras"
K3 = "keras3"
K2 = "keras2"
TF1 = "tf1"
TORCH = "torch"
OPTAX = "optax"

_ADAM = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999)
_SHAPES = [(5,), (4, 3), (2, 3, 2)]
_TABLE = [(10, 4), (3,)]


def _c(id, convention, optimizer, hyper, *, dtype="float32", shapes=_SHAPES, steps=20, seed=0,
       grads="dense", api=None, variant=None, knobs=None, tol=0, why=""):
    return dict(
        id=id, convention=convention, optimizer=optimizer, hyperparameters=hyper,
        dtype=dtype, shapes=[list(s) for s in shapes], steps=steps, seed=seed, grads=grads,
        api=api, variant=variant or {}, knobs=knobs or {}, tolerance_ulp=tol,
        tolerance_reason=why,
    )


def _sched(name, config):
    return {"class_name": name, "config": config}


SCHEDULES = [
    _sched("ExponentialDecay", dict(initial_learning_rate=0.1, decay_steps=3, decay_rate=0.5,
                                    staircase=False)),
    _sched("PiecewiseConstantDecay", dict(boundaries=[2, 5], values=[0.1, 0.05, 0.01])),
    _sched("PolynomialDecay", dict(initial_learning_rate=0.1, decay_steps=4,
                                   end_learning_rate=0.01, power=2.0, cycle=True)),
    _sched("InverseTimeDecay", dict(initial_learning_rate=0.1, decay_steps=2, decay_rate=0.5,
                                    staircase=True)),
    _sched("CosineDecay", dict(initial_learning_rate=0.0, decay_steps=6, alpha=0.1,
                               warmup_target=0.1, warmup_steps=3)),
    _sched("CosineDecayRestarts", dict(initial_learning_rate=0.1, first_decay_steps=2,
                                       t_mul=2.0, m_mul=0.5, alpha=0.1)),
]

NORM_WHY = "1 ulp: the norm is a reduction; TF's Eigen adds in another order than NumPy"

CASES = [
    # ---- tf_keras: TensorFlow 2.21 + tf_keras 2.21 (tf.keras 2.11+ optimizers)
    _c("tf_keras/adam_f32", TF, "Adam", dict(_ADAM, epsilon=1e-7), api="tf_keras.optimizers.Adam"),
    _c("tf_keras/adam_f64_100", TF, "Adam", dict(_ADAM, epsilon=1e-7), dtype="float64", steps=100,
       api="tf_keras.optimizers.Adam"),
    _c("tf_keras/adam_1step", TF, "Adam", dict(learning_rate=1.0, epsilon=1e-12), steps=1,
       api="tf_keras.optimizers.Adam"),
    _c("tf_keras/amsgrad_f32", TF, "Adam", dict(_ADAM, epsilon=1e-7, amsgrad=True),
       api="tf_keras.optimizers.Adam"),
    _c("tf_keras/adamw_f32", TF, "AdamW", dict(_ADAM, weight_decay=0.1),
       api="tf_keras.optimizers.AdamW"),
    _c("tf_keras/adam_sparse_f32", TF, "Adam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       api="tf_keras.optimizers.Adam (non-lazy sparse path)"),
    _c("tf_keras/sgd_momentum_f32", TF, "SGD", dict(learning_rate=0.01, momentum=0.9),
       api="tf_keras.optimizers.SGD"),
    _c("tf_keras/sgd_nesterov_f64", TF, "SGD",
       dict(learning_rate=0.01, momentum=0.9, nesterov=True), dtype="float64",
       api="tf_keras.optimizers.SGD"),
    _c("tf_keras/clipnorm_f32", TF, "Adam", dict(_ADAM, clipnorm=1.0),
       api="tf_keras.optimizers.Adam(clipnorm)", tol=128,
       why="128 ulp: a 1-ulp difference in a tensor's norm (TF's Eigen adds in another order "
           "than NumPy) rescales its clipped gradient by 1 ulp; where m + (g - m)(1 - b1) nearly "
           "cancels, that is up to 128 ulp of m in one step (the variables stay within 1 ulp)"),
    _c("tf_keras/global_clipnorm_nonfinite_f32", TF, "Adam", dict(_ADAM, global_clipnorm=1.0),
       grads="dense_nonfinite", api="tf_keras.optimizers.Adam(global_clipnorm)", tol=1,
       why=NORM_WHY),
    _c("tf_keras/clipvalue_nonfinite_f32", TF, "SGD", dict(learning_rate=0.1, clipvalue=0.5),
       grads="dense_nonfinite", api="tf_keras.optimizers.SGD(clipvalue)"),
    _c("tf_keras/ema_f32", TF, "Adam", dict(_ADAM, use_ema=True, ema_momentum=0.9),
       api="tf_keras.optimizers.Adam(use_ema)"),
    _c("tf_keras/ema_overwrite_f32", TF, "SGD",
       dict(learning_rate=0.1, momentum=0.5, use_ema=True, ema_momentum=0.9,
            ema_overwrite_frequency=3), api="tf_keras.optimizers.SGD(use_ema)"),
    _c("tf_keras/none_grads_f32", TF, "Adam", dict(_ADAM), grads="dense_none",
       api="tf_keras.optimizers.Adam"),
] + [
    _c(f"tf_keras/schedule_{s['class_name']}", TF, "Adam", dict(_ADAM, learning_rate=s), steps=12,
       api=f"tf_keras.optimizers.Adam + {s['class_name']}")
    for s in SCHEDULES
] + [
    # ---- keras3: TensorFlow 2.21 + Keras 3.15.1 (TF backend)
    _c("keras3/adam_f32", K3, "Adam", dict(_ADAM, epsilon=1e-7), api="keras.optimizers.Adam"),
    _c("keras3/amsgrad_f64", K3, "Adam", dict(_ADAM, amsgrad=True), dtype="float64",
       api="keras.optimizers.Adam"),
    _c("keras3/adamw_f32", K3, "AdamW", dict(_ADAM, weight_decay=0.1),
       api="keras.optimizers.AdamW"),
    _c("keras3/sgd_nesterov_f32", K3, "SGD", dict(learning_rate=0.01, momentum=0.9, nesterov=True),
       api="keras.optimizers.SGD"),
    _c("keras3/ema_overwrite_f32", K3, "SGD",
       dict(learning_rate=0.1, momentum=0.5, use_ema=True, ema_momentum=0.9,
            ema_overwrite_frequency=3), api="keras.optimizers.SGD(use_ema)"),
    _c("keras3/ema_adam_f32", K3, "Adam", dict(_ADAM, use_ema=True, ema_momentum=0.9),
       api="keras.optimizers.Adam(use_ema)"),
    _c("keras3/global_clipnorm_nonfinite_f32", K3, "Adam", dict(_ADAM, global_clipnorm=1.0),
       grads="dense_nonfinite", api="keras.optimizers.Adam(global_clipnorm)", tol=1,
       why=NORM_WHY),
    _c("keras3/clipnorm_f32", K3, "SGD", dict(learning_rate=0.1, clipnorm=1.0),
       api="keras.optimizers.SGD(clipnorm)", tol=1, why=NORM_WHY),
    _c("keras3/adam_sparse_dup_f32", K3, "Adam", dict(learning_rate=0.1), shapes=[(3, 2)],
       grads="sparse_dup", steps=2, api="keras.optimizers.Adam on tf.IndexedSlices",
       knobs=dict(keras3_sparse_square=True)),
    _c("keras3/adam_sparse_f32", K3, "Adam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       api="keras.optimizers.Adam on tf.IndexedSlices", knobs=dict(keras3_sparse_square=True)),
    # ---- keras2: TensorFlow 2.15.1 tf.keras.optimizers.legacy + TensorFlow Addons 0.23.0
    _c("keras2/adam_f32", K2, "Adam", dict(_ADAM), api="tf.keras.optimizers.legacy.Adam"),
    _c("keras2/adam_f64", K2, "Adam", dict(_ADAM), dtype="float64",
       api="tf.keras.optimizers.legacy.Adam"),
    _c("keras2/amsgrad_f32", K2, "Adam", dict(_ADAM, amsgrad=True),
       api="tf.keras.optimizers.legacy.Adam"),
    _c("keras2/adam_eps0_1step", K2, "Adam", dict(learning_rate=1.0, epsilon=0.0), steps=1,
       api="tf.keras.optimizers.legacy.Adam (epsilon=0 becomes 1e-7)"),
    _c("keras2/adam_sparse_f32", K2, "Adam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       api="tf.keras.optimizers.legacy.Adam (sparse)"),
    _c("keras2/lazyadam_f32", K2, "LazyAdam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       steps=30, api="tfa.optimizers.LazyAdam"),
    _c("keras2/lazyadam_dup", K2, "LazyAdam", dict(learning_rate=0.1), shapes=[(3, 2)],
       grads="sparse_dup", steps=2, api="tfa.optimizers.LazyAdam"),
    _c("keras2/sgd_nesterov_f32", K2, "SGD", dict(learning_rate=0.01, momentum=0.9, nesterov=True),
       api="tf.keras.optimizers.legacy.SGD"),
    _c("keras2/clipvalue_clipnorm_f32", K2, "SGD",
       dict(learning_rate=0.1, clipvalue=0.5, clipnorm=1.0),
       api="tf.keras.optimizers.legacy.SGD(clipvalue, clipnorm)", tol=1, why=NORM_WHY),
    # ---- tf1: TensorFlow 2.15.1 tf.compat.v1.train (graph mode)
    _c("tf1/adam_f32", TF1, "Adam", dict(_ADAM), api="tf.compat.v1.train.AdamOptimizer"),
    _c("tf1/adam_f64_100", TF1, "Adam", dict(_ADAM), dtype="float64", steps=100,
       api="tf.compat.v1.train.AdamOptimizer"),
    _c("tf1/adam_sparse_f32", TF1, "Adam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       api="tf.compat.v1.train.AdamOptimizer (sparse)"),
    _c("tf1/lazyadam_f32", TF1, "LazyAdam", dict(_ADAM), shapes=_TABLE, grads="sparse",
       api="TF1 contrib LazyAdamOptimizer, emulated with TF 2.15 ops (contrib is gone)"),
    _c("tf1/momentum_nesterov_f32", TF1, "SGD",
       dict(learning_rate=0.01, momentum=0.9, nesterov=True),
       api="tf.compat.v1.train.MomentumOptimizer(use_nesterov=True)"),
    _c("tf1/global_clipnorm_f32", TF1, "Adam", dict(_ADAM, global_clipnorm=1.0),
       grads="dense_nonfinite", api="tf.clip_by_global_norm + AdamOptimizer", tol=1,
       why=NORM_WHY),
    # ---- torch: PyTorch 2.13.0 CPU
    _c("torch/adam_fused_f32", TORCH, "Adam", dict(_ADAM, epsilon=1e-8),
       api="torch.optim.Adam(fused=True)", variant=dict(fused=True)),
    _c("torch/adam_default_f32", TORCH, "Adam", dict(_ADAM, epsilon=1e-8),
       api="torch.optim.Adam (for-loop)", tol=2,
       why="2 ulp: the for-loop path takes MKL's sqrt, not correctly rounded"),
    _c("torch/adam_fused_f64_100", TORCH, "Adam", dict(_ADAM, epsilon=1e-8), dtype="float64",
       steps=100, api="torch.optim.Adam(fused=True)", variant=dict(fused=True)),
    _c("torch/amsgrad_fused_f32", TORCH, "Adam", dict(_ADAM, amsgrad=True),
       api="torch.optim.Adam(amsgrad=True, fused=True)", variant=dict(fused=True)),
    _c("torch/adam_l2_fused_f32", TORCH, "Adam", dict(_ADAM, weight_decay=0.1),
       api="torch.optim.Adam(weight_decay=0.1, fused=True) (L2 coupling)",
       variant=dict(fused=True)),
    _c("torch/adamw_fused_f32", TORCH, "AdamW", dict(_ADAM, weight_decay=0.1),
       api="torch.optim.AdamW(fused=True)", variant=dict(fused=True)),
    _c("torch/adam_none_grads_f32", TORCH, "Adam", dict(_ADAM), grads="dense_none",
       api="torch.optim.Adam(fused=True) (per-parameter step counts)", variant=dict(fused=True)),
    _c("torch/sparseadam_f32", TORCH, "LazyAdam", dict(_ADAM), shapes=_TABLE[:1],
       grads="sparse", steps=30, api="torch.optim.SparseAdam", tol=2,
       why="2 ulp: SparseAdam takes torch.sqrt, MKL's on CPU, not correctly rounded"),
    _c("torch/sgd_momentum_f32", TORCH, "SGD", dict(learning_rate=0.01, momentum=0.9),
       api="torch.optim.SGD(momentum=0.9)"),
    _c("torch/sgd_nesterov_f64", TORCH, "SGD",
       dict(learning_rate=0.01, momentum=0.9, nesterov=True), dtype="float64",
       api="torch.optim.SGD(nesterov=True)"),
    _c("torch/clip_grad_norm_nonfinite_f32", TORCH, "SGD",
       dict(learning_rate=0.1, global_clipnorm=1.0), grads="dense_nonfinite",
       api="torch.nn.utils.clip_grad_norm_ + torch.optim.SGD"),
    _c("torch/clip_grad_value_f32", TORCH, "SGD", dict(learning_rate=0.1, clipvalue=0.5),
       grads="dense_nonfinite", api="torch.nn.utils.clip_grad_value_ + torch.optim.SGD"),
    _c("torch/ema_f32", TORCH, "SGD", dict(learning_rate=0.1, use_ema=True, ema_momentum=0.9),
       api="torch.optim.swa_utils.AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(0.9))"),
    # ---- optax: optax 0.2.8 on jax 0.10.2 (CPU, jit)
    _c("optax/adam_f32", OPTAX, "Adam", dict(_ADAM, epsilon=1e-8), api="optax.adam (jit)"),
    _c("optax/adam_f64", OPTAX, "Adam", dict(_ADAM, epsilon=1e-8), dtype="float64",
       api="optax.adam (jit, jax_enable_x64)"),
    _c("optax/amsgrad_f32", OPTAX, "Adam", dict(_ADAM, amsgrad=True), api="optax.amsgrad (jit)"),
    _c("optax/adamw_f32", OPTAX, "AdamW", dict(_ADAM, weight_decay=0.1), api="optax.adamw (jit)"),
    _c("optax/sgd_nesterov_f32", OPTAX, "SGD", dict(learning_rate=0.01, momentum=0.9,
                                                    nesterov=True),
       api="optax.sgd (jit)"),
    _c("optax/clip_by_global_norm_nonfinite_f32", OPTAX, "SGD",
       dict(learning_rate=0.1, global_clipnorm=1.0), grads="dense_nonfinite",
       api="optax.chain(clip_by_global_norm, sgd) (jit)"),
]

# ---- RMSprop: the four forms (plain, momentum, centered, centered + momentum) per convention,
# rho 0.9 and epsilon 1e-7 everywhere (torch alpha, TF1/optax decay), float32, dense gradients.
_RMS = dict(learning_rate=0.01, rho=0.9, epsilon=1e-7)
_RMS_FORMS = [
    ("", {}),
    ("_momentum", dict(momentum=0.9)),
    ("_centered", dict(centered=True)),
    ("_centered_momentum", dict(centered=True, momentum=0.9)),
]
_RMS_API = {
    TF: "tf_keras.optimizers.RMSprop",
    K3: "keras.optimizers.RMSprop",
    K2: "tf.keras.optimizers.legacy.RMSprop",
    TF1: "tf.compat.v1.train.RMSPropOptimizer",
    TORCH: "torch.optim.RMSprop (for-loop)",
    OPTAX: "optax.rmsprop (jit)",
}

# Tolerances (measured with refopt.reference.rmsprop_update, resync every step): tf_keras and
# optax call rsqrt, torch's for-loop path sqrt, none correctly rounded on CPU (refopt's are).
# Every differing element is reproduced exactly with that one result moved by 1 ulp; the
# tolerance is larger where w - step or momentum*buf + step cancels.
_RSQRT_TF = "tf.math.rsqrt on CPU is not correctly rounded (1 ulp off on some elements)"
_RSQRT_XLA = "XLA:CPU's rsqrt under jit is not correctly rounded (1 ulp off on some elements)"
_SQRT_MKL = ("the for-loop path takes MKL's sqrt, not correctly rounded (1 ulp off on some "
             "elements)")
_CANCEL = ", amplified where the update cancels"
_RMS_TOL = {
    "tf_keras/rmsprop_f32": (4, f"4 ulp: {_RSQRT_TF}{_CANCEL}"),
    "tf_keras/rmsprop_momentum_f32": (8, f"8 ulp: {_RSQRT_TF}{_CANCEL}"),
    "tf_keras/rmsprop_centered_f32": (4, f"4 ulp: {_RSQRT_TF}{_CANCEL}"),
    "tf_keras/rmsprop_centered_momentum_f32": (16, f"16 ulp: {_RSQRT_TF}{_CANCEL}"),
    "torch/rmsprop_f32": (4, f"4 ulp: {_SQRT_MKL}{_CANCEL}"),
    "torch/rmsprop_momentum_f32": (8, f"8 ulp: {_SQRT_MKL}{_CANCEL}"),
    "torch/rmsprop_centered_f32": (2, f"2 ulp: {_SQRT_MKL}{_CANCEL}"),
    "torch/rmsprop_centered_momentum_f32": (32, f"32 ulp: {_SQRT_MKL}{_CANCEL}"),
    "optax/rmsprop_f32": (8, f"8 ulp: {_RSQRT_XLA}{_CANCEL}"),
    "optax/rmsprop_momentum_f32": (8, f"8 ulp: {_RSQRT_XLA}{_CANCEL}"),
    "optax/rmsprop_centered_f32": (1, f"1 ulp: {_RSQRT_XLA}"),
    "optax/rmsprop_centered_momentum_f32": (8, f"8 ulp: {_RSQRT_XLA}{_CANCEL}"),
}


def _rms_tol(id):
    tol, why = _RMS_TOL.get(id, (0, ""))
    return dict(tol=tol, why=why)


CASES += [
    _c(f"{conv}/rmsprop{suffix}_f32", conv, "RMSprop", dict(_RMS, **extra), api=_RMS_API[conv],
       **_rms_tol(f"{conv}/rmsprop{suffix}_f32"))
    for conv in (TF, K3, K2, TF1, TORCH, OPTAX)
    for suffix, extra in _RMS_FORMS
] + [
    _c("tf_keras/rmsprop_f64", TF, "RMSprop", dict(_RMS), dtype="float64",
       api=_RMS_API[TF], tol=2,
       why="2 ulp: TF's float64 rsqrt is 1/sqrt rounded twice (refopt's is correctly rounded)"),
    _c("tf1/rmsprop_default_eps_f32", TF1, "RMSprop", dict(learning_rate=0.01, rho=0.9),
       api="tf.compat.v1.train.RMSPropOptimizer (default epsilon 1e-10)"),
    _c("torch/rmsprop_f64", TORCH, "RMSprop", dict(_RMS), dtype="float64",
       api=_RMS_API[TORCH]),
    _c("optax/rmsprop_eps_outside_f32", OPTAX, "RMSprop", dict(_RMS, eps_in_sqrt=False),
       api="optax.rmsprop(eps_in_sqrt=False) (jit)", variant=dict(eps_in_sqrt=False)),
]

# ---- Adagrad: every convention with the framework's own initial accumulator and epsilon (lr
# 0.01, which TF1 and optax require), float32 and float64; a non-default initial accumulator;
# sparse IndexedSlices (lazy: only the present rows move) where the framework takes them.
_AG = dict(learning_rate=0.01)
_AG_API = {
    TF: "tf_keras.optimizers.Adagrad",
    K3: "keras.optimizers.Adagrad",
    K2: "tf.keras.optimizers.legacy.Adagrad",
    TF1: "tf.compat.v1.train.AdagradOptimizer",
    TORCH: "torch.optim.Adagrad (for-loop)",
    OPTAX: "optax.adagrad (jit)",
}
# The non-default initial accumulator: 0 where the framework allows it (then epsilon is all
# that keeps the first step finite), TF1 (which requires > 0) 1.0, torch (default 0) 0.1.
_AG_IAV = {TF: 0.0, K3: 0.0, K2: 0.0, TF1: 1.0, TORCH: 0.1, OPTAX: 0.0}
# Tolerances (measured with refopt.reference.adagrad_update, resync every step; every
# differing element is reproduced exactly with the framework's root moved by 1 ulp; the
# bound is the measured maximum rounded up to a power of two, larger where w - step cancels).
_RSQRT_TF1 = ("TF's CPU rsqrt is not correctly rounded (Eigen's hardware estimate and Newton "
              "step; 1/sqrt in a vector loop's scalar tail)")
_AG_TOL = {
    "tf1/adagrad_f32": (1, f"1 ulp (measured 1): {_RSQRT_TF1}"),
    "tf1/adagrad_iav_f32": (1, f"1 ulp (measured 1): {_RSQRT_TF1}"),
    "tf1/adagrad_lr1_f32": (64, f"64 ulp (measured 64): {_RSQRT_TF1}{_CANCEL}"),
    "tf1/adagrad_sparse_lr1_f32": (8, f"8 ulp (measured 8): {_RSQRT_TF1}{_CANCEL}"),
    "torch/adagrad_iav_f32": (1, f"1 ulp (measured 1): {_SQRT_MKL}"),
    "torch/adagrad_lr_decay_none_f32": (1, f"1 ulp (measured 1): {_SQRT_MKL}"),
    "torch/adagrad_wide_f32": (2, f"2 ulp (measured 2): {_SQRT_MKL}{_CANCEL}"),
    "torch/adagrad_sparse_wide_f32": (
        16, "16 ulp (measured 10): the sparse branch's sqrt_ is MKL's, not correctly rounded "
            f"(1 ulp off on some elements){_CANCEL}"),
    "optax/adagrad_f64": (1, "1 ulp (measured 1): XLA:CPU's float64 rsqrt under jit is not "
                             "correctly rounded (1 ulp off on some elements)"),
}


def _ag_tol(id):
    tol, why = _AG_TOL.get(id, (0, ""))
    return dict(tol=tol, why=why)


CASES += [
    _c(f"{conv}/adagrad_{dt[0]}{dt[-2:]}", conv, "Adagrad", dict(_AG), dtype=dt,
       api=_AG_API[conv], **_ag_tol(f"{conv}/adagrad_{dt[0]}{dt[-2:]}"))
    for conv in (TF, K3, K2, TF1, TORCH, OPTAX)
    for dt in ("float32", "float64")
] + [
    _c(f"{conv}/adagrad_iav_f32", conv, "Adagrad",
       dict(_AG, initial_accumulator_value=_AG_IAV[conv]), api=_AG_API[conv],
       **_ag_tol(f"{conv}/adagrad_iav_f32"))
    for conv in (TF, K3, K2, TF1, TORCH, OPTAX)
] + [
    _c(f"{conv}/adagrad_sparse_f32", conv, "Adagrad", dict(_AG), shapes=_TABLE, grads="sparse",
       api=_AG_API[conv] + " on IndexedSlices" if conv != TORCH else
       "torch.optim.Adagrad (for-loop) on a sparse COO gradient",
       knobs=dict(keras3_sparse_square=True) if conv == K3 else None,
       **_ag_tol(f"{conv}/adagrad_sparse_f32"))
    for conv in (TF, K3, K2, TF1, TORCH)
] + [
    # learning rate 1: the step is as large as the variable, so a 1-ulp difference in the
    # step shows in the variable (at 0.01 it is absorbed); TF's sparse kernel takes
    # (lr*g)*rsqrt(acc) on rows of several elements but lr*g/sqrt(acc) on one-element rows
    _c("tf1/adagrad_sparse_lr1_f32", TF1, "Adagrad", dict(learning_rate=1.0), shapes=_TABLE,
       grads="sparse", api="tf.compat.v1.train.AdagradOptimizer on IndexedSlices",
       **_ag_tol("tf1/adagrad_sparse_lr1_f32")),
    _c("tf1/adagrad_sparse_1d_f32", TF1, "Adagrad", dict(learning_rate=1.0), shapes=[(12,)],
       grads="sparse",
       api="tf.compat.v1.train.AdagradOptimizer on IndexedSlices of a 1-D variable",
       **_ag_tol("tf1/adagrad_sparse_1d_f32")),
    _c("tf1/adagrad_lr1_f32", TF1, "Adagrad", dict(learning_rate=1.0),
       api="tf.compat.v1.train.AdagradOptimizer", **_ag_tol("tf1/adagrad_lr1_f32")),
    _c("torch/adagrad_wide_f32", TORCH, "Adagrad", dict(_AG), shapes=[(8, 37), (100,)],
       api="torch.optim.Adagrad (for-loop), tensors wider than a vector register",
       **_ag_tol("torch/adagrad_wide_f32")),
    _c("torch/adagrad_sparse_wide_f32", TORCH, "Adagrad", dict(_AG), shapes=[(8, 37)],
       grads="sparse", api="torch.optim.Adagrad (for-loop) on a sparse COO gradient",
       **_ag_tol("torch/adagrad_sparse_wide_f32")),
    _c("torch/adagrad_lr_decay_none_f32", TORCH, "Adagrad", dict(_AG, lr_decay=0.1),
       grads="dense_none", api="torch.optim.Adagrad(lr_decay=0.1) (per-parameter steps)",
       **_ag_tol("torch/adagrad_lr_decay_none_f32")),
    _c("torch/adagrad_l2_f32", TORCH, "Adagrad", dict(_AG, weight_decay=0.1),
       api="torch.optim.Adagrad(weight_decay=0.1) (L2 coupling)",
       **_ag_tol("torch/adagrad_l2_f32")),
    _c("tf_keras/adagrad_wd_f32", TF, "Adagrad", dict(_AG, weight_decay=0.1),
       api="tf_keras.optimizers.Adagrad(weight_decay=0.1)", **_ag_tol("tf_keras/adagrad_wd_f32")),
]

_BY_ID = {c["id"]: c for c in CASES}
assert len(_BY_ID) == len(CASES), "duplicate case ids"


def cases_for(conventions):
    """The cases whose convention is in ``conventions``."""
    return [c for c in CASES if c["convention"] in conventions]


def make_inputs(case):
    """Initial variables and the gradients of every step, from the case's seed.

    Returns
    -------
    init : list of ndarray
        One array per shape, dtype of the case.
    grads : list (steps) of list (variables)
        Each entry an ndarray, ``None`` (no gradient this step), or a tuple
        ``("sparse", indices int64 (n,), values (n, *shape[1:]))``.
    """
    dtype = np.dtype(case["dtype"])
    rng = np.random.default_rng(case["seed"])
    shapes = [tuple(s) for s in case["shapes"]]
    steps = case["steps"]
    kind = case["grads"]
    if kind == "sparse_dup":
        init = [np.ones(shapes[0], dtype)]
        values = np.array([[1.0, 2.0], [3.0, 4.0]], dtype)
        grads = [[("sparse", np.array([1, 1], np.int64), values.copy())] for _ in range(steps)]
        return init, grads
    init = [rng.standard_normal(s).astype(dtype) for s in shapes]
    grads = []
    for k in range(1, steps + 1):
        row = []
        for i, s in enumerate(shapes):
            scale = 10.0 ** rng.uniform(-4, 2)
            g = (rng.standard_normal(s) * scale).astype(dtype)
            if kind == "dense_nonfinite" and i == 0:
                bad = {2: np.inf, 4: np.nan, 5: -np.inf}.get(k)
                if bad is not None:
                    g.flat[0] = bad
            if kind == "dense_none" and i == 1 and k in (2, 3, 5):
                g = None
            if kind == "sparse" and i == 0:
                g = _sparse_grad(rng, s, k, dtype)
            row.append(g)
        grads.append(row)
    return init, grads


def _sparse_grad(rng, shape, k, dtype):
    """Rows 0..n-1 of a table: row n-1 never appears, row n-2 only from step 6 on, duplicates."""
    n = shape[0]
    if k == 3:  # an empty gradient: no rows at all
        return ("sparse", np.zeros(0, np.int64), np.zeros((0,) + shape[1:], dtype))
    pool = np.arange(n - 2) if k < 6 else np.arange(n - 1)
    count = int(rng.integers(2, 7))
    idx = rng.choice(pool, size=count, replace=True).astype(np.int64)
    idx[-1] = idx[0]  # always at least one duplicate
    scale = 10.0 ** rng.uniform(-3, 1)
    values = (rng.standard_normal((count,) + shape[1:]) * scale).astype(dtype)
    return ("sparse", idx, values)


#: Slot names in the recorded files (refopt's names): ``m``, ``v``, ``vhat`` (Adam family),
#: ``m`` (SGD momentum buffer), ``average`` (EMA); RMSprop: ``velocity`` (the mean square),
#: ``momentum``, ``average_gradient`` (centered); Adagrad: ``accumulator`` (the sum of squares).
SLOT_NAMES = ("m", "v", "vhat", "average", "velocity", "momentum", "average_gradient",
              "accumulator")
