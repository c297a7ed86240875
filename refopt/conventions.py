"""Conventions: which framework's numerics an optimizer reproduces, as named knobs.

"Adam" is not one algorithm. Frameworks put epsilon in different places, round ``1 - beta``
differently, take the AMSGrad maximum of different quantities, couple weight decay
differently, clip with different formulas and start their weight averages differently. A
:class:`Convention` is a small frozen record of those choices; the presets in
:data:`PRESETS` reproduce one framework each, and :func:`get_convention` lets you override
single knobs::

    >>> from refopt.conventions import get_convention
    >>> conv = get_convention("torch", amsgrad_maximum="corrected")
    >>> conv.name, conv.epsilon_placement, conv.amsgrad_maximum
    ('torch', 'corrected', 'corrected')

Every optimizer takes ``convention=`` (a preset name or a :class:`Convention`). The table of
differences, with the smallest input that shows each one, is ``conformance/README.md``; the
golden trajectories recorded from each framework are replayed by ``refopt conformance``.

Sources: ``../shared/semantics/keras_tf.md`` (sections 1-5) and ``torch_optax.md`` (sections
1-6), each fact confirmed against the framework by the recorded golden cases.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Convention", "PRESETS", "get_convention", "KNOB_VALUES"]

#: The allowed values of each string knob (booleans and floats are checked by type).
KNOB_VALUES = {
    "epsilon_placement": ("hat", "corrected"),
    "bias_correction": ("pow", "accumulator", "float64", "float32"),
    "one_minus_beta": ("float64", "dtype"),
    "moment_update": ("keras", "ema", "torch_fma", "torch_loop", "optax_fma"),
    "amsgrad_maximum": ("raw", "corrected"),
    "learning_rate_cast": ("float32", "float64", "dtype"),
    "epsilon_cast": ("dtype", "float32"),
    "sparse_adam": ("tf_keras", "tf1", "keras2", "densify", "error"),
    "lazy_update": ("dense_rows", "ema_rows", "torch_sparse"),
    "adam_weight_decay": ("decoupled", "l2", "none"),
    "adamw_weight_decay": ("decoupled", "torch", "optax", "tfa", "none"),
    "sgd_momentum": ("keras", "tf1", "torch", "torch_fused", "optax"),
    "clip_selection": ("tf_keras", "one_only", "legacy"),
    "clip_formula": ("tf", "torch", "optax"),
    "ema": ("copy", "keras3", "torch", "none"),
    "step_counter": ("global", "per_variable"),
    "rmsprop_form": ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax"),
    "adagrad_form": ("tf_keras", "keras3", "keras2", "tf1", "torch", "optax"),
    "adadelta_form": ('tf_keras', 'keras3', 'keras2', 'tf1', 'torch', 'optax', 'none'),
    "adamax_form": ('tf_keras', 'keras3', 'keras2', 'torch', 'optax', 'none'),
    "nadam_form": ('tf_keras', 'keras3', 'keras2', 'torch', 'optax', 'none'),
    "adafactor_form": ('tf_keras', 'keras3', 'torch', 'optax', 'none'),
    "lion_form": ('keras3', 'tf_keras', 'optax', 'none'),
    "lamb_form": ('keras3', 'optax', 'none'),
    "ftrl_form": ('tf_keras', 'keras3', 'keras2', 'tf1', 'none'),
    "radam_form": ('torch', 'optax', 'none'),
    "asgd_form": ('torch', 'none'),
    "rprop_form": ('torch', 'none'),
    "proximal_adagrad_form": ('tf1', 'none'),
    "legacy_decay": ("keras2", "keras3", "none"),
    "proximal_sgd_form": ('tf1', 'none'),
    "rowwise_adagrad_form": ("fbgemm", "none"),
    "low_precision_compute": ("dtype", "float32", "torch_fused"),
    "maximize": ("negate", "none"),
    "sqrt": ("ieee", "mkl", "torch_fused"),
    "optax_jit": ("update", "eager", "step"),
}


@dataclass(frozen=True)
class Convention:
    """The numerical choices of one framework, as named knobs (immutable).

    Parameters
    ----------
    name : str
        The preset it came from (overrides keep the name; compare records, not names).
    framework : str
        The framework and API it reproduces, in words.
    epsilon_placement : {"hat", "corrected"}
        ``"hat"``: ``w -= alpha*m / (sqrt(v) + eps)`` with ``alpha = lr*sqrt(1-b2^t)/(1-b1^t)``
        (TF/Keras, TF1; epsilon is not bias-corrected). ``"corrected"``:
        ``w -= lr*m_hat / (sqrt(v_hat) + eps)`` (PyTorch, optax; epsilon outside the
        bias-corrected root).
    bias_correction : {"pow", "accumulator", "float64", "float32"}
        How ``b^t`` is computed: ``"pow"``: ``powf(b, t)`` in the variable dtype (Keras);
        ``"accumulator"``: a float32 product updated once per step, ``b^t`` by ``t - 1``
        multiplications (TF1's ``beta1_power``); ``"float64"``: Python ``b**t`` in float64
        (PyTorch, default and fused paths); ``"float32"``: ``powf(float32(b), t)`` in float32
        (optax).
    one_minus_beta : {"float64", "dtype"}
        ``"float64"``: ``dtype(1 - b)`` with the difference in float64 (tf-keras 2.11+,
        Keras 3, PyTorch, optax); ``"dtype"``: ``1 - dtype(b)`` in the variable dtype (TF1's
        and Keras 2's fused kernels).
    moment_update : {"keras", "ema", "torch_fma", "torch_loop", "optax_fma"}
        ``"keras"``: ``m + (g - m)*(1-b)``; ``"ema"``: ``b*m + (1-b)*g``; ``"torch_fma"``:
        PyTorch's fused CPU kernel (``lerp`` as one FMA, ``v = fma((1-b2)*g, g, v*b2)``, its
        scalar tail of ``numel mod 8`` float32 / ``mod 4`` float64 elements contracted as
        ``fma(v, b2, ((1-b2)*g)*g)``); ``"torch_loop"``: PyTorch's default single-tensor path
        (``exp_avg.lerp_`` one FMA, ``exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)`` =
        ``fma((1-b2)*g, g, v*b2)`` on every element); ``"optax_fma"``: optax under ``jit``
        on XLA:CPU (``fma(1-b, g, b*m)``).
    amsgrad_maximum : {"raw", "corrected"}
        Maximum of the raw second moment (TF/Keras, PyTorch) or of the bias-corrected one
        (optax's ``amsgrad``).
    learning_rate_cast : {"float32", "float64", "dtype"}
        ``"float32"``: stored in a float32 variable, then cast (Keras, TF1); ``"float64"``: a
        Python float used in float64 scalar math (PyTorch); ``"dtype"``: a Python float
        converted straight to the variable dtype (optax).
    epsilon_cast : {"dtype", "float32"}
        Epsilon converted straight to the variable dtype, or through a float32 tensor
        (TF1's ``epsilon_t``; matters for float64 variables).
    sparse_adam : {"tf_keras", "tf1", "keras2", "densify", "error"}
        Non-lazy Adam on an IndexedSlices: tf-keras' ``m + (-m)(1-b)`` then scatter-add;
        TF1's and Keras 2's ``m*b`` then scatter-add of ``(1-b)*g`` (they group the step
        size as ``(lr*sqrt(1-b2^t))/(1-b1^t)`` and ``lr*(sqrt(1-b2^t)/(1-b1^t))``); Keras 3's
        dense update on the densified gradient; or refused (PyTorch ``Adam``; optax has no
        sparse gradients).
    lazy_update : {"dense_rows", "ema_rows", "torch_sparse"}
        ``LazyAdam``'s row update: the convention's dense update on the gathered rows;
        TF1 contrib / TF-Addons ``b*m + (1-b)*g`` rows; or ``torch.optim.SparseAdam``.
    adam_weight_decay : {"decoupled", "l2", "none"}
        What ``Adam(weight_decay=...)`` means: Keras' ``w -= w*wd*lr`` before the update,
        PyTorch's L2 term ``g += wd*w``, or refused (TF1, Keras 2 have none).
    adamw_weight_decay : {"decoupled", "torch", "optax", "tfa", "none"}
        What ``AdamW`` means: Keras' ``w -= w*wd*lr``; PyTorch's ``w *= (1 - lr*wd)`` (the
        factor in float64); optax's ``u = -lr*(adam_u + wd*w)``; TF-Addons'
        ``w -= wd*w`` (not scaled by the learning rate; ``SGDW`` too); or refused.
    legacy_decay : {"keras2", "keras3", "none"}
        The legacy ``decay=`` keyword: Keras 2's ``lr / (1 + decay*iterations)`` in the
        variable dtype; Keras 3's warning (ignored); or refused (tf-keras 2.11+ raises,
        ``tf.compat.v1.train``, PyTorch and optax have no such argument).
    sgd_momentum : {"keras", "tf1", "torch", "torch_fused", "optax"}
        SGD's momentum buffer: Keras' velocity ``m = m*mu - g*lr; w += m``; TF1's
        ``a = a*mu + g; w -= a*lr``; PyTorch's ``b = b*mu + g`` (first step ``b = g``),
        ``w -= lr*b``; optax's trace ``t = g + mu*t``, ``w += -lr*t``. ``"torch"`` is
        the for-loop's ``b = fma(1 - dampening, g, b*mu)``; ``"torch_fused"`` is
        ``SGD(fused=True)``'s CPU kernel (``FusedSGDKernel.cpp``), the same except on its
        scalar tail, the last ``numel % (32 / itemsize)`` elements of each float32/float64
        tensor (AVX2: 8 float32, 4 float64), where GCC contracts the buffer the other way
        round: ``b = fma(b, mu, g*(1 - dampening))``.
    clip_selection : {"tf_keras", "one_only", "legacy"}
        tf-keras: ``clipnorm`` > 0, else ``global_clipnorm`` > 0, else ``clipvalue`` > 0;
        ``one_only``: at most one may be set (Keras 3, and one explicit clip call in PyTorch
        or optax); ``legacy``: Keras 2's ``clipvalue`` then ``clipnorm`` then
        ``global_clipnorm``, negative values refused.
    clip_formula : {"tf", "torch", "optax"}
        Norm clipping: TF's ``g*c/max(n, c)`` and ``c*min(1/N, 1/c) + (N - N)`` (non-finite
        N: every gradient NaN); PyTorch's ``g*min(c/(N + 1e-6), 1)``; optax's
        ``g if N < c else (g/N)*c``.
    ema : {"copy", "keras3", "torch", "none"}
        Weight averages: tf-keras (start as a copy of the variable, ``avg = mu*avg +
        (1-mu)*w`` for the variables of the call); Keras 3 (start at zero, momentum 0 on the
        first step, every built variable); PyTorch ``AveragedModel`` with
        ``get_ema_multi_avg_fn`` (first update copies, then ``lerp``); or refused.
    step_counter : {"global", "per_variable"}
        Adam's ``t``: the optimizer's ``iterations + 1`` for all variables, or a count per
        variable that advances only when it has a gradient (PyTorch).
    default_epsilon : float
        Adam's epsilon when not given (1e-7 Keras, 1e-8 TF1, PyTorch, optax).
    epsilon_zero_is_default : bool
        Keras 2's ``epsilon or backend.epsilon()``: 0 silently becomes 1e-7.
    default_adamw_weight_decay : float
        ``AdamW``'s weight decay when not given (0.004 Keras, 0.01 PyTorch, 1e-4 optax).
    rmsprop_form : {"tf_keras", "keras3", "keras2", "tf1", "torch", "optax"}
        Which framework's RMSprop step (epsilon inside or outside the root, ``rsqrt`` or
        ``sqrt``, ``1 - rho`` rounding, centered denominator order, momentum buffer, defaults):
        see :func:`refopt.reference.rmsprop_update`.
    adagrad_form : {"tf_keras", "keras3", "keras2", "tf1", "torch", "optax"}
        Which framework's Adagrad step (epsilon inside or outside the root or none, ``rsqrt``,
        FMA, how the initial accumulator is rounded, which sparse update, defaults): see
        :func:`refopt.reference.adagrad_update`.
    adadelta_form, adamax_form, nadam_form, adafactor_form, lion_form, lamb_form, ftrl_form, \
radam_form, asgd_form, rprop_form : str
        Which framework's step the optimizer of that name takes (the framework family, as
        ``adagrad_form``), or ``"none"`` where the framework has no such optimizer (the
        class then refuses the convention, naming both). See each optimizer's reference
        function in :mod:`refopt.reference`.
    proximal_adagrad_form, proximal_sgd_form : {"tf1", "none"}
        ``ProximalAdagrad`` and ``ProximalGradientDescent``: TF1's kernels (``"tf1"``, the
        tf1 preset only; sparse gradients summed first, one-element rows divided in double),
        ``"none"`` elsewhere. See :mod:`refopt.reference.proximal`.
    rowwise_adagrad_form : {"fbgemm", "none"}
        ``RowWiseAdagrad``: FBGEMM's table-batched embedding ``EXACT_ROWWISE_ADAGRAD`` (CPU
        reference kernel: duplicates summed first in order of appearance, one accumulator
        per row growing by the mean of the squared row gradient, ``lr/(sqrt(acc) + eps)``),
        the ``"fbgemm"`` preset only. See :mod:`refopt.reference.rowwise_adagrad`.
    low_precision_compute : {"dtype", "float32", "torch_fused"}
        How a float16 (or bfloat16) variable is computed. ``"dtype"``: every operation
        rounded to the variable's dtype (NumPy's float16 arithmetic; TensorFlow's float16
        kernels). ``"float32"``: the variable, its gradient and its slots loaded into float32,
        the weight decay and update computed as for a float32 variable, the new variable and
        slots each rounded once to the variable's dtype (to nearest even): PyTorch's fused CPU
        kernels (``opmath_t``; ``SGD(fused=True)``). ``"torch_fused"`` (the torch_fused
        preset): ``"float32"`` for the optimizers refopt takes from a PyTorch fused kernel
        (``Adam``, ``AdamW``), ``"dtype"`` for the others (PyTorch's for-loop paths, which
        round after each torch op: not exact). The torch and fbgemm presets (the for-loop
        path) take ``"dtype"``. bfloat16 is accepted where the step is
        computed in float32. See :mod:`refopt.precision`.
    maximize : {"negate", "none"}
        ``maximize=True`` of every optimizer: PyTorch's ``g <- -g`` at the start of the step,
        before the L2 term (``"negate"``, the torch and fbgemm presets), or refused
        (``"none"``: the TensorFlow and optax optimizers have no such option).
    optax_jit : {"update", "eager", "step"}
        What is under ``jax.jit`` when an optax form runs (read by the optax forms only;
        XLA:CPU rounds differently in each). ``"update"`` (the ``"optax"`` preset):
        ``jax.jit(tx.update)``, ``optax.apply_updates`` eager: XLA contracts the moments'
        ``(1-b)*g + b*m`` into one FMA and folds the bias corrections into one denominator.
        ``"eager"`` (``"optax_eager"``): nothing jitted, every ``jnp`` operation rounds
        separately (no FMA, optax's order of operations as written). ``"step"``
        (``"optax_jit_step"``): one ``jax.jit`` over ``tx.update`` and
        ``optax.apply_updates`` (how most train steps are written): as ``"update"``, and XLA
        also fuses the final ``w + u`` into the update (see ``conformance/README.md``,
        "optax's three jit modes", for which optimizers differ and by how much).
    sqrt : {"ieee", "mkl", "torch_fused"}
        The elementwise square root of the update. ``"ieee"``: correctly rounded
        (``np.sqrt``; TensorFlow, optax, PyTorch's fused kernels). ``"mkl"``: PyTorch's CPU
        ``torch.sqrt`` on float32/float64 tensors, which calls MKL's vector
        ``vmsSqrt``/``vmdSqrt`` (not correctly rounded: 1 ulp on about 16% of float32 and 1%
        of float64 values), reproduced by calling the same function (:mod:`refopt._mkl`,
        through torch's ``libtorch_cpu`` or the ``mkl`` wheel): torch's default for-loop
        optimizers. ``"torch_fused"``: ``"ieee"`` in the optimizers refopt takes from a
        PyTorch fused kernel (``Adam``, ``AdamW``, ``Adagrad`` on dense gradients:
        ``FusedAdagradKernel.cpp`` takes the hardware root), ``"mkl"`` in the others (their
        for-loop path; Adagrad's sparse rows, which torch's fused kernel refuses). float16 and bfloat16 take ``"ieee"``. Without torch and without the ``mkl``
        wheel, ``"mkl"`` falls back to the correctly rounded root with a ``RuntimeWarning``
        naming this knob (once per process; about 1 ulp per step off on some elements).
        ``backend="cpu"`` and ``"cuda"`` compute a step that takes MKL's root on the host
        (the staged step; cuda with a ``HostStepWarning``): the same numbers. Honoured by
        ``Adam``, ``AdamW`` and ``LazyAdam`` (``SparseAdam``); refopt's other torch
        optimizers compute a correctly rounded root whatever this knob says.
    keras3_sparse_square : bool
        Keras 3 (TF backend) on an IndexedSlices gradient with repeated rows: ``v`` (and
        the other squared slots) gets the sum of the squared duplicate slices instead of the
        square of their sum (Keras 3 squares the raw slices before scattering them). On in
        ``"keras3"`` (faithful: recorded from Keras 3.15); off elsewhere. ``backend="cpu"``
        and ``"cuda"`` compute such a step on the host (the staged step): the same numbers.
    sgd_sparse_scatter : bool
        Plain SGD (no momentum) on an IndexedSlices gradient applies each occurrence in turn,
        ``w[r] -= round(g*lr)`` (Keras 3's ``scatter_sub``, Keras 2's ``ResourceScatterAdd``,
        without deduplication: :func:`refopt.reference.sgd_sparse_scatter_update`), instead of
        the step on the summed rows. On in ``"keras3"`` and ``"keras2"``.
    """

    name: str
    framework: str
    epsilon_placement: str
    bias_correction: str
    one_minus_beta: str
    moment_update: str
    amsgrad_maximum: str
    learning_rate_cast: str
    epsilon_cast: str
    sparse_adam: str
    lazy_update: str
    adam_weight_decay: str
    adamw_weight_decay: str
    sgd_momentum: str
    clip_selection: str
    clip_formula: str
    ema: str
    step_counter: str
    default_epsilon: float
    epsilon_zero_is_default: bool
    default_adamw_weight_decay: float
    keras3_sparse_square: bool = False
    sgd_sparse_scatter: bool = False
    rmsprop_form: str = "tf_keras"
    adagrad_form: str = "tf_keras"
    adadelta_form: str = "tf_keras"
    adamax_form: str = "tf_keras"
    nadam_form: str = "tf_keras"
    adafactor_form: str = "tf_keras"
    lion_form: str = "tf_keras"
    lamb_form: str = "none"
    ftrl_form: str = "tf_keras"
    radam_form: str = "none"
    asgd_form: str = "none"
    rprop_form: str = "none"
    proximal_adagrad_form: str = "none"
    proximal_sgd_form: str = "none"
    rowwise_adagrad_form: str = "none"
    low_precision_compute: str = "dtype"
    legacy_decay: str = "none"
    maximize: str = "none"
    optax_jit: str = "update"
    sqrt: str = "ieee"

    def __post_init__(self):
        for knob, allowed in KNOB_VALUES.items():
            value = getattr(self, knob)
            if value not in allowed:
                raise ValueError(
                    f"Convention knob `{knob}` must be one of {allowed}. Received: "
                    f"{knob}={value!r}"
                )
        for knob in ("epsilon_zero_is_default", "keras3_sparse_square", "sgd_sparse_scatter"):
            if not isinstance(getattr(self, knob), bool):
                raise TypeError(
                    f"Convention knob `{knob}` must be a bool. Received: "
                    f"{knob}={getattr(self, knob)!r}"
                )
        for knob in ("default_epsilon", "default_adamw_weight_decay"):
            v = getattr(self, knob)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
                raise ValueError(
                    f"Convention knob `{knob}` must be a float >= 0. Received: {knob}={v!r}"
                )

    def replace(self, **knobs):
        """A copy with some knobs changed (``ValueError`` for an unknown knob or value)."""
        unknown = sorted(set(knobs) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(
                f"Unknown convention knob(s) {unknown}. Known: "
                f"{[f.name for f in dataclasses.fields(self)]}"
            )
        return dataclasses.replace(self, **knobs)

    def knobs(self):
        """The knobs as a dict (name -> value), ``name`` and ``framework`` included."""
        return dataclasses.asdict(self)

    def differences(self, other):
        """The knobs whose values differ from ``other``'s: ``{knob: (self's, other's)}``."""
        a, b = self.knobs(), other.knobs()
        return {k: (a[k], b[k]) for k in a if k not in ("name", "framework") and a[k] != b[k]}


_TF_KERAS = Convention(
    name="tf_keras",
    framework="tf.keras 2.11+ (tf_keras.optimizers; TensorFlow >= 2.11 default)",
    epsilon_placement="hat",
    bias_correction="pow",
    one_minus_beta="float64",
    moment_update="keras",
    amsgrad_maximum="raw",
    learning_rate_cast="float32",
    epsilon_cast="dtype",
    sparse_adam="tf_keras",
    lazy_update="dense_rows",
    adam_weight_decay="decoupled",
    adamw_weight_decay="decoupled",
    sgd_momentum="keras",
    clip_selection="tf_keras",
    clip_formula="tf",
    ema="copy",
    step_counter="global",
    default_epsilon=1e-7,
    epsilon_zero_is_default=False,
    default_adamw_weight_decay=0.004,
)

#: The presets, by name.
PRESETS = {
    "tf_keras": _TF_KERAS,
    "keras3": _TF_KERAS.replace(
        name="keras3",
        rmsprop_form="keras3",
        adagrad_form="keras3",
        adadelta_form="keras3",
        adamax_form="keras3",
        nadam_form="keras3",
        adafactor_form="keras3",
        lion_form="keras3",
        lamb_form="keras3",
        ftrl_form="keras3",
        framework="Keras 3 (keras.optimizers, TensorFlow backend)",
        sparse_adam="densify",
        clip_selection="one_only",
        ema="keras3",
        legacy_decay="keras3",
        sgd_sparse_scatter=True,
        keras3_sparse_square=True,
    ),
    "keras2": _TF_KERAS.replace(
        name="keras2",
        rmsprop_form="keras2",
        adagrad_form="keras2",
        adadelta_form="keras2",
        adamax_form="keras2",
        nadam_form="keras2",
        adafactor_form="none",
        lion_form="none",
        ftrl_form="keras2",
        framework="Keras 2 legacy OptimizerV2 (tf.keras.optimizers.legacy: Adam, SGD, "
        "RMSprop, Adagrad) and TF-Addons LazyAdam, AdamW, SGDW",
        one_minus_beta="dtype",
        sparse_adam="keras2",
        lazy_update="ema_rows",
        adam_weight_decay="none",
        adamw_weight_decay="tfa",
        clip_selection="legacy",
        ema="none",
        epsilon_zero_is_default=True,
        legacy_decay="keras2",
        sgd_sparse_scatter=True,
    ),
    "tf1": _TF_KERAS.replace(
        name="tf1",
        rmsprop_form="tf1",
        adagrad_form="tf1",
        adadelta_form="tf1",
        adamax_form="none",
        nadam_form="none",
        adafactor_form="none",
        lion_form="none",
        ftrl_form="tf1",
        proximal_adagrad_form="tf1",
        proximal_sgd_form="tf1",
        framework="TF1 tf.compat.v1.train optimizers (Adam, Momentum, RMSProp, Adagrad) and "
        "the TF1 contrib LazyAdamOptimizer",
        bias_correction="accumulator",
        one_minus_beta="dtype",
        sparse_adam="tf1",
        lazy_update="ema_rows",
        adam_weight_decay="none",
        adamw_weight_decay="none",
        sgd_momentum="tf1",
        epsilon_cast="float32",
        clip_selection="legacy",
        ema="none",
        default_epsilon=1e-8,
    ),
    "torch": Convention(
        name="torch",
        framework="PyTorch torch.optim, default CPU path (the single-tensor for-loop: no "
        "fused, no foreach; MKL's sqrt), clip_grad_norm_, AveragedModel",
        epsilon_placement="corrected",
        bias_correction="float64",
        one_minus_beta="float64",
        moment_update="torch_loop",
        amsgrad_maximum="raw",
        learning_rate_cast="float64",
        epsilon_cast="dtype",
        sparse_adam="error",
        lazy_update="torch_sparse",
        adam_weight_decay="l2",
        adamw_weight_decay="torch",
        sgd_momentum="torch",
        clip_selection="one_only",
        clip_formula="torch",
        ema="torch",
        step_counter="per_variable",
        default_epsilon=1e-8,
        epsilon_zero_is_default=False,
        default_adamw_weight_decay=0.01,
        rmsprop_form="torch",
        adagrad_form="torch",
        adadelta_form="torch",
        adamax_form="torch",
        nadam_form="torch",
        adafactor_form="torch",
        lion_form="none",
        ftrl_form="none",
        radam_form="torch",
        asgd_form="torch",
        rprop_form="torch",
        low_precision_compute="dtype",
        maximize="negate",
        sqrt="mkl",
    ),
    "optax": Convention(
        name="optax",
        framework="optax (adam, amsgrad, adamw, sgd, rmsprop, adagrad, clip_by_global_norm) "
        "with jax.jit(tx.update) and an eager apply_updates",
        epsilon_placement="corrected",
        bias_correction="float32",
        one_minus_beta="float64",
        moment_update="optax_fma",
        amsgrad_maximum="corrected",
        learning_rate_cast="dtype",
        epsilon_cast="dtype",
        sparse_adam="error",
        lazy_update="dense_rows",
        adam_weight_decay="none",
        adamw_weight_decay="optax",
        sgd_momentum="optax",
        clip_selection="one_only",
        clip_formula="optax",
        ema="none",
        step_counter="global",
        default_epsilon=1e-8,
        epsilon_zero_is_default=False,
        default_adamw_weight_decay=1e-4,
        rmsprop_form="optax",
        adagrad_form="optax",
        adadelta_form="optax",
        adamax_form="optax",
        nadam_form="optax",
        adafactor_form="optax",
        lion_form="optax",
        lamb_form="optax",
        ftrl_form="none",
        radam_form="optax",
    ),
}
#: PyTorch with ``fused=True`` (CPU): Adam/AdamW's fused kernel (its FMA contractions and
#: scalar tail, the correctly rounded sqrt, float16 computed in float32); SGD's fused kernel
#: (its scalar tail: ``sgd_momentum="torch_fused"``) and Adagrad's (the for-loop's formulas
#: with the correctly rounded sqrt, dense gradients); the optimizers torch has no fused
#: kernel for follow their for-loop path there, as in ``"torch"``.
PRESETS["torch_fused"] = PRESETS["torch"].replace(
    name="torch_fused",
    framework="PyTorch torch.optim with fused=True on CPU (Adam/AdamW/SGD/Adagrad fused "
    "kernels; the others as their for-loop path), clip_grad_norm_, AveragedModel",
    moment_update="torch_fma",
    sgd_momentum="torch_fused",
    low_precision_compute="torch_fused",
    sqrt="torch_fused",
)
#: FBGEMM's table-batched embeddings (``fbgemm_gpu``, as TorchRec's fused embeddings use
#: them): ``RowWiseAdagrad`` is FBGEMM's ``EXACT_ROWWISE_ADAGRAD``; every other knob is
#: PyTorch's (FBGEMM runs inside PyTorch: the dense parameters next to the tables take
#: ``torch.optim``), except the optimizers PyTorch has and FBGEMM's tables do not take.
#: optax with nothing under ``jax.jit`` (every ``jnp`` operation rounded on its own) and with
#: the whole train step (``update`` and ``apply_updates``) under one ``jax.jit``; ``"optax"``
#: itself is ``jax.jit(tx.update)`` with an eager ``apply_updates`` (``Convention.optax_jit``).
PRESETS["optax_eager"] = PRESETS["optax"].replace(
    name="optax_eager", optax_jit="eager",
    framework="optax (as \"optax\") run eagerly: nothing under jax.jit")
PRESETS["optax_jit_step"] = PRESETS["optax"].replace(
    name="optax_jit_step", optax_jit="step",
    framework="optax (as \"optax\") with the whole step, update and apply_updates, under one "
    "jax.jit")
PRESETS["fbgemm"] = PRESETS["torch"].replace(
    name="fbgemm",
    framework="FBGEMM table-batched embeddings (fbgemm_gpu EXACT_ROWWISE_ADAGRAD, CPU kernel; "
    "PARTIAL_ROWWISE_ADAM, its CUDA source, unrecorded; as TorchRec's fused embeddings use "
    "them); torch.optim's knobs for everything else",
    adadelta_form="none",
    adamax_form="none",
    nadam_form="none",
    adafactor_form="none",
    radam_form="none",
    asgd_form="none",
    rprop_form="none",
    rowwise_adagrad_form="fbgemm",
)


def get_convention(convention="tf_keras", **knobs):
    """The :class:`Convention` for a preset name (or a record), with knobs overridden.

    Parameters
    ----------
    convention : str or Convention, default "tf_keras"
        One of ``PRESETS`` (``"tf_keras"``, ``"keras3"``, ``"keras2"``, ``"tf1"``,
        ``"torch"``, ``"torch_fused"``, ``"optax"``, ``"optax_eager"``, ``"optax_jit_step"``,
        ``"fbgemm"``) or a :class:`Convention`.
    **knobs
        Knobs to override, e.g. ``amsgrad_maximum="corrected"``.

    Returns
    -------
    Convention

    Raises
    ------
    ValueError
        An unknown preset name, knob or knob value.
    TypeError
        ``convention`` neither a str nor a Convention.
    """
    if isinstance(convention, Convention):
        base = convention
    elif isinstance(convention, str):
        base = PRESETS.get(convention)
        if base is None:
            raise ValueError(
                f"`convention` must be one of {tuple(PRESETS)} or a refopt.conventions."
                f"Convention. Received: convention={convention!r}"
            )
    else:
        raise TypeError(
            "`convention` must be a preset name (str) or a refopt.conventions.Convention. "
            f"Received: convention={convention!r}"
        )
    return base.replace(**knobs) if knobs else base
