"""bfloat16 variables computed in their dtype by the generic reference functions: the TF
family's and optax's optimizers other than Adam and SGD (issue 17 item 1).

TensorFlow's CPU kernels (Eigen's ``bfloat16``) and XLA:CPU compute each elementwise op of a
bfloat16 tensor in float32 and round its result once to bfloat16, round-to-nearest-even.
NumPy's arithmetic on ``ml_dtypes.bfloat16`` arrays does exactly that (``+ - * /`` and
``sqrt`` of two bfloat16 values in float32 rounded once is the correctly rounded bfloat16
result: float32 has more than twice bfloat16's 8 bits). So where refopt's reference function
of a convention is the framework's formula op by op, with every scalar converted to the
variable's dtype as the framework converts it (``lr_cast``, ``tf_cast``, ``scalar``) and no
float32-only helper (an FMA, a float32 accumulator), calling it on bfloat16 arrays *is*
the framework's bfloat16 step. This module does that, for the pairs measured bit for bit
against the frameworks (:data:`EXACT`; golden cases ``tf_keras/*_bf16``, ``keras3/*_bf16``,
``optax*/*_bf16``, 20 steps, sizes 37, 12 and 80).

optax: XLA:CPU keeps no float32 intermediate between the ops of a bfloat16 expression and
contracts none into an FMA, under every jit mode: the step is refopt's eager form
(``optax_jit="eager"``) whatever the preset, with optax's bias corrections ``1 - b**t``
computed in float32 and cast to bfloat16 (``1 - bfloat16(0.999)`` would be 0; float16 keeps
its own rounding, unrecorded). ``rsqrt`` (tf_keras' RMSprop, optax's RMSprop, Adagrad,
Adadelta) is the correctly rounded float32 root rounded once to bfloat16
(:func:`refopt.reference.rmsprop.rsqrt`).

tf_keras and Keras 3 also clip by value and average (EMA) bfloat16 variables with the same
ops: the staged step runs its clipping and EMA inside :func:`reference_context`. Refused,
measured (:data:`REFUSED`): Ftrl (TF's ``pow``), ``clipnorm``/``global_clipnorm`` (TF's
bfloat16 norm), tf_keras' centered RMSprop (TF's approximate ``rsqrt``).

Inside a step the reference functions take bfloat16 arrays (:func:`computing_in`, a context
variable); outside, they refuse them as before.

Called from :mod:`refopt.reference.bf16`'s dispatch (``_kind`` "generic") by the staged step
on every backend (``backend="cpu"`` computes it with the reference's functions).
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np

from refopt import precision as _precision
from refopt.reference import _common

__all__ = ["EXACT", "REFUSED", "computing_in", "family", "kind", "reference_context",
           "refusal", "supported", "update"]

_TF = ("tf_keras", "keras3")
_OPTAX = ("optax", "optax_eager", "optax_jit_step")

#: ``(family, optimizer class name)`` pairs whose bfloat16 step is the generic reference
#: function on bfloat16 arrays, bit for bit: the golden cases ``tf_keras/*_bf16``,
#: ``keras3/*_bf16`` and ``optax*/*_bf16`` of each replay bit-identically on
#: ``backend="reference"`` and ``"cpu"`` (``tests/test_bf16_more.py``).
EXACT = frozenset({
    ("tf", "RMSprop"), ("tf", "Adagrad"), ("tf", "Adadelta"), ("tf", "Adamax"),
    ("tf", "Nadam"), ("tf", "Lion"), ("tf", "AdamW"),
    ("optax", "RMSprop"), ("optax", "Adagrad"), ("optax", "Adadelta"), ("optax", "Adamax"),
    ("optax", "Nadam"), ("optax", "Lion"), ("optax", "AdamW"),
})

#: What stays refused, with the reason measured against the framework (the golden case).
REFUSED = {
    ("tf", "Ftrl"): "TensorFlow's pow on bfloat16 packets (Eigen's own approximation) is not "
                    "reproduced (tf_keras/ftrl_bf16: 30,088 ulp from step 4)",
    ("tf_keras", "RMSprop"): "tf_keras' RMSprop takes TensorFlow's rsqrt, which on bfloat16 "
                             "rounds twice (bf16(1/bf16(sqrt x))) on arrays under 16 elements "
                             "and the last n % 16, and is correctly rounded elsewhere: not "
                             "reproduced (tf_keras/rmsprop_centered_momentum_bf16: 1 ulp of "
                             "the momentum at step 1, 80 ulp later; a 1-element RMSprop step "
                             "1 ulp off)",
    ("clipnorm",): "clipnorm/global_clipnorm on bfloat16 gradients: TensorFlow's bfloat16 "
                   "norm reduction is not reproduced (tf_keras/adam_clipnorm_bf16: 29,184 "
                   "ulp from step 7)",
}


def family(opt):
    """``"tf"`` (an unchanged ``"tf_keras"``/``"keras3"`` preset), ``"optax"`` (an unchanged
    optax preset) or None."""
    from refopt.conventions import PRESETS

    conv = opt.convention
    if PRESETS.get(conv.name) != conv:
        return None
    if conv.name in _TF:
        return "tf"
    if conv.name in _OPTAX:
        return "optax"
    return None


def kind(opt):
    """``"generic"`` where ``opt``'s bfloat16 step is its reference function on bfloat16
    (:data:`EXACT`, an optimizer class of refopt itself, no ``update_step`` of a subclass),
    else None."""
    fam = family(opt)
    cls = type(opt)
    if fam is None or not cls.__module__.startswith("refopt.optimizers."):
        return None
    if (fam, cls.__name__) not in EXACT or opt._uses_update_step():
        return None
    return "generic"


def refusal(opt):
    """The measured reason :data:`REFUSED` gives for ``opt``'s optimizer under its family,
    or None."""
    return REFUSED.get((family(opt), type(opt).__name__))


def supported(opt):
    """Why ``opt`` cannot compute a bfloat16 variable in its dtype here (a phrase), or None
    when it can. tf_keras and Keras 3 take the EMA and ``clipvalue`` (elementwise, every op
    rounded to bfloat16: ``*/sgd_momentum_ema_bf16``, ``*/adam_clipvalue_bf16``), not
    ``clipnorm``/``global_clipnorm`` (:data:`REFUSED`); optax takes no clipping."""
    fam = family(opt)
    if opt.use_ema and fam != "tf":
        return "the EMA of bfloat16 variables is not reproduced"
    if opt.clipnorm is not None or opt.global_clipnorm is not None:
        return REFUSED[("clipnorm",)]
    if opt.clipvalue is not None and fam != "tf":
        return "gradient clipping of bfloat16 gradients is not reproduced"
    if opt.convention.name == "tf_keras" and type(opt).__name__ == "RMSprop":
        # Keras 3 takes sqrt and a division: keras3/rmsprop*_bf16
        return REFUSED[("tf_keras", "RMSprop")]
    return None


def reference_context(opt, variables):
    """A context in which ``opt``'s clipping and EMA compute its bfloat16 variables (of the
    list ``variables``) in their dtype with the reference's functions (:func:`computing_in`,
    ``opt._kernels`` the reference's for its duration); a no-op context where no variable
    is bfloat16 computed in its dtype."""
    bf = _precision.BFLOAT16
    if bf is None or not any(getattr(v, "dtype", None) == bf for v in variables):
        return contextlib.nullcontext()
    from refopt.reference import bf16

    if not bf16.takes(opt, bf):
        return contextlib.nullcontext()
    return _with_reference(opt)


@contextlib.contextmanager
def _with_reference(opt):
    from refopt import reference

    kernels = opt._kernels
    opt._kernels = reference
    try:
        with computing_in(_precision.BFLOAT16):
            yield
    finally:
        opt._kernels = kernels


@contextlib.contextmanager
def computing_in(dtype):
    """While active, the reference functions take arrays of ``dtype`` (bfloat16) as they
    take float16 ones (:func:`refopt.reference._common.as_float_array`)."""
    token = _common._EXTRA_DTYPES.set(tuple(_common._EXTRA_DTYPES.get()) + (np.dtype(dtype),))
    try:
        yield
    finally:
        _common._EXTRA_DTYPES.reset(token)


def _computer(opt):
    """A shallow copy of ``opt`` computing with the reference's functions, under the
    convention whose forms are the framework's bfloat16 ops (optax: the eager form)."""
    from refopt import reference
    from refopt.conventions import get_convention

    clone = copy.copy(opt)
    clone._kernels = reference
    if family(opt) == "optax" and opt.convention.optax_jit != "eager":
        clone.convention = get_convention(opt.convention.name, optax_jit="eager")
    return clone


def update(opt, param, grad, slots, learning_rate, step, decays, decay=None):
    """One step of ``opt`` on one bfloat16 variable: weight decay as the convention couples
    it, then the optimizer's reference update, every op rounded to bfloat16.

    ``decay``: the pipeline's decoupled weight decay, ``decay(opt, param, learning_rate)``
    (:func:`refopt.executors.staged.decay`, passed by the caller: this layer imports no
    executor).

    Parameters
    ----------
    opt : refopt.Optimizer
        One :func:`kind` takes.
    param : ndarray of bfloat16
        The variable (not modified).
    grad : ndarray of bfloat16, the shape of ``param``
        Its dense gradient.
    slots : dict of str to ndarray of bfloat16
        Its slots (not modified).
    learning_rate : float
    step : int
        The 1-based step count.
    decays : bool
        Whether weight decay applies to this variable.

    Returns
    -------
    (ndarray, dict)
        The new variable and new slots, bfloat16.
    """
    comp = _computer(opt)
    extra = {}
    with computing_in(_precision.BFLOAT16), np.errstate(all="ignore"):
        if decays:
            param = decay(comp, param, learning_rate)
            if comp._decay_mode() in ("l2", "optax"):  # inside the update
                extra["weight_decay"] = comp.weight_decay
        return comp._update_step(param, grad, slots, learning_rate, step, **extra)
