"""FTRL-Proximal, dense and sparse, as each framework computes it (``Convention.ftrl_form``).

FTRL ("Follow The Regularized Leader", McMahan et al. 2013) keeps two slots per variable: the
*accumulator* ``n`` (a running sum of squared gradients, as Adagrad's) and the *linear* term
``z``; every step rebuilds the weight from them in closed form, so the initial weights only
enter through the first step's ``z``. Only the TensorFlow family has it: tf.keras 2.11+ and
Keras 3 write the step with tensor ops (``pow`` always), Keras 2 (legacy) and TF1 call the
fused kernels ``ApplyFtrl``/``ApplyFtrlV2`` (``sqrt`` when ``learning_rate_power == -0.5``, a
select instead of a clip, scalars through float32) and ``SparseApplyFtrl[V2]`` for
``IndexedSlices`` (only the present rows move; tf.keras 2.11+ and Keras 3 move every row).
:func:`ftrl_update` writes each of them out as readable NumPy in the variable dtype with the
rounding points of the framework; the Notes of its docstring give the forms.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
tf_keras    ``tf_keras/optimizers/ftrl.py`` (``Ftrl.build``, ``update_step``; an
            ``IndexedSlices`` gradient is summed by the base optimizer and densified by the
            ops of ``update_step``)
keras3      ``keras/src/optimizers/ftrl.py`` (``update_step``), ``keras/src/initializers/
            constant_initializers.py`` (``Constant``), ``keras/src/backend/tensorflow/
            numpy.py`` and ``sparse.py`` (``add``, ``square`` on ``tf.IndexedSlices``)
keras2      ``tf_keras/optimizers/legacy/ftrl.py`` (``ResourceApplyFtrl[V2]``,
            ``ResourceSparseApplyFtrl[V2]``) and TensorFlow's ``core/kernels/
            training_ops.cc`` (``ApplyFtrl``, ``ApplyFtrlV2``, ``SparseApplyFtrl``,
            ``FtrlCompute``)
tf1         ``tensorflow/python/training/ftrl.py`` (``FtrlOptimizer``) and the same kernels
==========  ===============================================================================
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    DecayedRate,
    as_float_array,
    check_grad,
    check_hyper,
    check_like,
    check_real,
    check_scalar,
    lr_cast,
    scalar,
    tf_cast,
)

__all__ = [
    "FtrlResult",
    "ftrl_update",
    "ftrl_rows",
    "ftrl_defaults",
    "ftrl_scalars",
    "initial_accumulator",
    "ftrl_initial_state",
    "is_lazy_sparse",
    "c_pow",
]

_F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)
_F64 = np.dtype(np.float64)

_FORMS = ("tf_keras", "keras3", "keras2", "tf1")


class FtrlResult(NamedTuple):
    """New arrays after one FTRL step: ``param``, ``accumulator`` (the running sum of squared
    gradients ``n``; TF1's slot "accum") and ``linear`` (the linear term ``z``)."""

    param: np.ndarray
    accumulator: np.ndarray
    linear: np.ndarray


# The constructors' defaults (refopt's = Keras' names). ``None``: TF1 requires a learning rate;
# its ``beta=None`` means 0.
_DEFAULTS = {
    form: dict(learning_rate=0.001, learning_rate_power=-0.5, initial_accumulator_value=0.1,
               l1_regularization_strength=0.0, l2_regularization_strength=0.0,
               l2_shrinkage_regularization_strength=0.0, beta=0.0)
    for form in _FORMS
}
_DEFAULTS["tf1"] = dict(_DEFAULTS["tf1"], learning_rate=None)

#: The hyperparameters of :func:`ftrl_update` besides the learning rate.
HYPER = ("learning_rate_power", "l1_regularization_strength", "l2_regularization_strength",
         "l2_shrinkage_regularization_strength", "beta")


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
    form = conv.ftrl_form
    if form not in _FORMS:
        raise ValueError(
            f"Ftrl does not exist under convention={conv.name!r} (ftrl_form={form!r}): only "
            "TensorFlow's families have FTRL (tf_keras, keras3, keras2, tf1); PyTorch and "
            "optax have none"
        )
    return form


def ftrl_defaults(convention=None):
    """The framework's Ftrl constructor defaults, under refopt's (Keras') argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means tf_keras; the form is ``convention.ftrl_form`` (PyTorch and optax have no
        FTRL: ValueError).

    Returns
    -------
    dict
        ``learning_rate`` (0.001; **None** for TF1, whose ``FtrlOptimizer`` requires one),
        ``learning_rate_power`` -0.5, ``initial_accumulator_value`` 0.1, the three
        regularization strengths 0 and ``beta`` 0 (TF1's ``beta=None`` means 0).
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def initial_accumulator(convention=None, dtype=np.float32, initial_accumulator_value=None):
    """The value the framework fills the accumulator with before the first step.

    tf.keras 2.11+ (``tf.cast(tf.fill(shape, value), dtype)``: the fill makes a float32
    tensor) and Keras 3 (``initializers.Constant``: a float32 tensor, cast) round the value
    through float32, so a float64 variable starts at ``float64(float32(0.1))``; Keras 2's
    ``constant_initializer(value, dtype)`` and TF1's ``ones(dtype) * value`` convert it straight
    to the dtype. The linear slot starts at 0 everywhere.
    """
    dtype = np.dtype(dtype)
    if dtype not in (_F16, _F32, _F64):
        raise TypeError(f"`dtype` must be float16, float32 or float64. Received: dtype={dtype}")
    form = _form(_convention(convention))
    value = (_DEFAULTS[form]["initial_accumulator_value"] if initial_accumulator_value is None
             else check_scalar("initial_accumulator_value", initial_accumulator_value))
    if form in ("tf_keras", "keras3"):
        return tf_cast(dtype, float(value))
    return scalar(dtype, value)


def ftrl_initial_state(param, *, initial_accumulator_value=None, convention=None):
    """Fresh ``(accumulator, linear)`` for ``param`` as the framework creates them (new
    arrays of ``param``'s shape and dtype: :func:`initial_accumulator` and zeros)."""
    param = as_float_array("param", param)
    start = initial_accumulator(convention, param.dtype, initial_accumulator_value)
    return np.full(param.shape, start, param.dtype), np.zeros(param.shape, param.dtype)


def is_lazy_sparse(convention=None):
    """Whether an IndexedSlices gradient moves only its rows (and their slot rows).

    True for Keras 2 and TF1 (``SparseApplyFtrl[V2]`` on the summed rows); False for tf.keras
    2.11+ and Keras 3, whose ``update_step`` densifies the gradient: every row is rebuilt
    from its ``z`` and ``n``, so a row that never had a gradient becomes 0 (shrinkage too
    acts on every row).
    """
    return _form(_convention(convention)) in ("keras2", "tf1")


# ----------------------------------------------------------------------------- pow
def c_pow(x, y):
    """``x ** y`` element-wise with the C library's ``powf``/``pow`` (float16: ``powf`` on the
    float32 values, rounded), as TensorFlow's Eigen computes ``pow`` on a scalar; a new array
    of ``x``'s dtype.

    Not even ``y == 0.5`` is ``sqrt``: glibc's ``powf(x, 0.5)`` differs from the correctly
    rounded ``sqrtf(x)`` by 1 ulp on 1,361,091 of the 2**31 - 2**23 positive finite float32
    (counted exhaustively; ``pow(x, 0.5)`` on 0.08% of random float64), and ``tf.pow`` on a
    scalar gives glibc's value (measured with TF 2.21). Eigen's vectorised ``pow`` (whole
    packets of 8 float32 or 4 float64) is its own approximation, not reproduced: see the
    Notes of :func:`ftrl_update`.
    """
    x = np.asarray(x)
    dt = x.dtype
    y = dt.type(y)
    with np.errstate(all="ignore"):
        if _libm.HAVE_LIBM:  # one C call per element, without a Python loop
            work = np.float64 if dt == _F64 else np.float32
            fn = _UFUNC_POW[work]
            out = fn(x.astype(work).ravel().tolist(), float(work(y)))
            return np.asarray(out, dtype=work).astype(dt).reshape(x.shape)
        out = np.array([_libm.power(dt, v, y) for v in x.ravel().tolist()], dt)
    return out.reshape(x.shape)


# the C library's powf/pow as object ufuncs (C calls through ctypes, no Python loop)
_UFUNC_POW = ({np.float32: np.frompyfunc(_libm._C["powf"], 2, 1),
               np.float64: np.frompyfunc(_libm._C["pow"], 2, 1)} if _libm.HAVE_LIBM else {})


# ----------------------------------------------------------------------------- scalars
def ftrl_scalars(dtype, convention=None, *, learning_rate, learning_rate_power=-0.5,
                 l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                 l2_shrinkage_regularization_strength=0.0, beta=0.0):
    """The step's scalars in ``dtype`` as the framework rounds them.

    Returns
    -------
    dict
        ``lr``, ``power`` (the exponent ``-learning_rate_power``), ``l1``, ``two_l2`` (twice
        the effective l2, ``l2 + beta / (2 lr)``), ``two_shrinkage`` and the flags
        ``use_sqrt`` (the kernels' special case ``learning_rate_power == -0.5``) and
        ``shrinkage`` (the V2 kernels, chosen by the configured shrinkage > 0).

    tf_keras and Keras 3 convert each Python number straight to ``dtype`` (their ops meet a
    tensor) and hold the learning rate in a float32 variable; ``l2 + beta / (2.0 * lr)`` is
    computed in ``dtype``. Keras 2 casts every hyperparameter from a float32 variable
    (``_get_hyper``) or ``tf.cast`` (shrinkage), and adds ``beta / (2.0 * lr)`` in ``dtype``;
    TF1 converts each to a float32 tensor and computes ``l2 + beta / (2 max(lr, 1e-36))`` in
    **float32** before the cast.
    """
    dt = np.dtype(dtype)
    form = _form(_convention(convention))
    with np.errstate(all="ignore"):
        if form in ("tf_keras", "keras3"):
            lr = lr_cast(dt, learning_rate)
            l2 = scalar(dt, l2_regularization_strength) + scalar(dt, beta) / (
                scalar(dt, 2.0) * lr)
            out = dict(lr=lr, power=scalar(dt, -float(learning_rate_power)),
                       l1=scalar(dt, l1_regularization_strength), two_l2=scalar(dt, 2) * l2,
                       two_shrinkage=scalar(dt, 2 * float(l2_shrinkage_regularization_strength)),
                       use_sqrt=False)
        else:
            lr = (lr_cast(dt, learning_rate) if isinstance(learning_rate, DecayedRate)
                  else tf_cast(dt, float(learning_rate)))  # Keras 2's decay, per dtype
            if form == "keras2":
                l2 = tf_cast(dt, float(l2_regularization_strength)) + tf_cast(
                    dt, float(beta)) / (scalar(dt, 2.0) * lr)
            else:
                f = np.float32
                l2 = f(l2_regularization_strength) + f(beta) / (
                    f(2.0) * np.maximum(f(learning_rate), f(1e-36)))
                l2 = scalar(dt, l2)
            power = -tf_cast(dt, float(learning_rate_power))
            out = dict(lr=lr, power=power, l1=tf_cast(dt, float(l1_regularization_strength)),
                       two_l2=scalar(dt, 2) * l2,
                       two_shrinkage=scalar(dt, 2) * tf_cast(
                           dt, float(l2_shrinkage_regularization_strength)),
                       use_sqrt=bool(power == scalar(dt, 0.5)))
    out["shrinkage"] = l2_shrinkage_regularization_strength > 0
    return out


# ----------------------------------------------------------------------------- the forms
def _root(n, s):
    """The kernels' ``n ** power``: ``sqrt`` in the special case, else the C library's pow."""
    return np.sqrt(n) if s["use_sqrt"] else c_pow(n, s["power"])


def _keras(w, g, n, z, s, g_sq=None, tf_keras=False):
    """tf_keras and Keras 3 (the ops of ``update_step``). ``g_sq``: what is added to the
    accumulator (Keras 3 on unsummed IndexedSlices: the sum of the squares); tf_keras squares
    with ``tf.pow(g, 2)``."""
    g_s = g + s["two_shrinkage"] * w
    if g_sq is None:
        g_sq = c_pow(g, 2) if tf_keras else g * g
    n_new = n + g_sq
    r_new, r_old = c_pow(n_new, s["power"]), c_pow(n, s["power"])
    z = z + (g_s - ((r_new - r_old) / s["lr"]) * w)
    q = r_new / s["lr"] + s["two_l2"]
    w = (np.clip(z, -s["l1"], s["l1"]) - z) / q
    return w, n_new, z


def _kernel(w, g, n, z, s):
    """``ApplyFtrl`` (no shrinkage) and ``ApplyFtrlV2`` on CPU, ``multiply_linear_by_lr``
    False: the shrunk gradient enters ``z`` only, the weight is a select."""
    dt = w.dtype
    g_s = g + s["two_shrinkage"] * w if s["shrinkage"] else g
    n_new = n + g * g
    r_new, r_old = _root(n_new, s), _root(n, s)
    z = z + (g_s - ((r_new - r_old) / s["lr"]) * w)
    x = s["l1"] * np.sign(z) - z
    y = r_new / s["lr"] + s["two_l2"]
    w = np.where(np.abs(z) > s["l1"], x / y, dt.type(0))
    return w, n_new, z


def _kernel_rows(w, g, n, z, s):
    """``SparseApplyFtrl[V2]`` on rows of several elements (Eigen chips): the dense kernel's
    arithmetic, but the weight from a clip, ``(clip(z, -l1, l1) - z) / y``."""
    g_s = g + s["two_shrinkage"] * w if s["shrinkage"] else g
    n_new = n + g * g
    r_new, r_old = _root(n_new, s), _root(n, s)
    z = z + (g_s - ((r_new - r_old) / s["lr"]) * w)
    y = r_new / s["lr"] + s["two_l2"]
    w = (np.clip(z, -s["l1"], s["l1"]) - z) / y
    return w, n_new, z


def _kernel_scalar(w, g, n, z, s):
    """``SparseApplyFtrl[V2]`` on one-element rows (a 1-D variable, shape ``(n, 1)``): the
    scalar loop, ``sigma`` from ``pow`` even for the power 0.5, ``z`` summed left to right
    ``(z + g_s) - sigma w``, the weight from ``FtrlCompute`` (a clip)."""
    g_s = g + s["two_shrinkage"] * w if s["shrinkage"] else g
    n_new = n + g * g
    sigma = (c_pow(n_new, s["power"]) - c_pow(n, s["power"])) / s["lr"]
    z = (z + g_s) - sigma * w
    y = _root(n_new, s) / s["lr"] + s["two_l2"]
    w = (np.clip(z, -s["l1"], s["l1"]) - z) / y
    return w, n_new, z


def ftrl_rows(param_rows, grad_rows, accumulator_rows, linear_rows, *, learning_rate,
              learning_rate_power=-0.5, l1_regularization_strength=0.0,
              l2_regularization_strength=0.0, l2_shrinkage_regularization_strength=0.0,
              beta=0.0, convention=None, row_width=None):
    """The lazy sparse step (Keras 2, TF1) on gathered rows, duplicates already summed: new
    ``(param_rows, accumulator_rows, linear_rows)``.

    ``row_width`` (None: from the rows' shape) picks the kernel's path: rows of one element go
    through its scalar loop, longer rows through its row (chip) expressions.
    """
    conv = _convention(convention)
    form = _form(conv)
    if form not in ("keras2", "tf1"):
        raise ValueError(
            f"ftrl_rows is the lazy row update of Keras 2 and TF1; ftrl_form={form!r} moves "
            "every row (use ftrl_update)")
    if row_width is None:
        row_width = int(np.prod(param_rows.shape[1:], dtype=np.int64))
    s = ftrl_scalars(param_rows.dtype, conv, learning_rate=learning_rate,
                     learning_rate_power=learning_rate_power,
                     l1_regularization_strength=l1_regularization_strength,
                     l2_regularization_strength=l2_regularization_strength,
                     l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                     beta=beta)
    step = _kernel_scalar if row_width == 1 else _kernel_rows
    with np.errstate(all="ignore"):
        w, n, z = step(param_rows, grad_rows, accumulator_rows, linear_rows, s)
    return np.asarray(w), np.asarray(n), np.asarray(z)


def ftrl_update(param, grad, accumulator, linear, *, learning_rate, learning_rate_power=-0.5,
                l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                l2_shrinkage_regularization_strength=0.0, beta=0.0, convention=None):
    r"""One FTRL-Proximal step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w`.
    grad : ndarray like ``param``, or IndexedSlices
        The gradient :math:`g`. An :class:`~refopt.IndexedSlices` (``dense_shape`` and dtype
        of ``param``) is applied as the framework applies one (see Notes).
    accumulator : ndarray like ``param``
        :math:`n`, the running sum of squared gradients (:func:`ftrl_initial_state`).
    linear : ndarray like ``param``
        :math:`z`, the linear term (starts at 0).
    learning_rate : float
        :math:`\eta \ge 0` (every step divides by it: 0 gives what the framework's
        arithmetic gives, inf or NaN).
    learning_rate_power : float, default -0.5
        :math:`-c \le 0`; the root of the accumulator is :math:`n^{c}`.
    l1_regularization_strength, l2_regularization_strength : float, default 0.0
        :math:`\lambda_1, \lambda_2 \ge 0`.
    l2_shrinkage_regularization_strength : float, default 0.0
        :math:`\lambda_s \ge 0`, an L2 penalty added to the gradient.
    beta : float, default 0.0
        :math:`\beta \ge 0`, the paper's :math:`\beta`, folded into the l2 term.
    convention : None, str or refopt.conventions.Convention
        Whose step; None means tf_keras. The form is ``convention.ftrl_form`` (torch and
        optax have no FTRL: ValueError).

    Returns
    -------
    FtrlResult
        ``(param, accumulator, linear)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray; a hyperparameter not a real number;
        ``convention`` of the wrong type.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a
        negative learning rate; ``learning_rate_power > 0``; a negative strength or beta; a
        convention without FTRL. Messages name the argument and the value received.

    Notes
    -----
    Every operation is in the dtype of ``param`` and rounds once. :math:`\bar x`: a number
    as the framework converts it (:func:`ftrl_scalars`: straight to the dtype for tf_keras
    and Keras 3, through float32 for Keras 2 and TF1, TF1's effective l2 computed in float32);
    :math:`\eta_{32}` the learning rate through float32;
    :math:`\ell_2 = \bar\lambda_2 + \bar\beta / (2\eta_{32})`; :math:`p(x)` is
    :math:`x^{c}` by the C library's ``pow``/``powf`` (:func:`c_pow`).

    **tf_keras** and **keras3** (the tensor ops of ``update_step``):

    .. math::

        \hat g &= g + \overline{2\lambda_s}\, w, \qquad n' = n + g^2, \\
        z &\leftarrow z + \big(\hat g - ((p(n') - p(n)) / \eta_{32})\, w\big), \\
        w &\leftarrow \big(\mathrm{clip}(z, -\bar\lambda_1, \bar\lambda_1) - z\big)
             \big/ \big(p(n') / \eta_{32} + 2\ell_2\big), \qquad n \leftarrow n'

    (tf_keras squares with ``tf.pow(g, 2)``, i.e. :math:`p` with exponent 2, Keras 3 with
    ``square``). :math:`p` is ``pow`` even for ``learning_rate_power == -0.5``, and the C
    library's ``pow(x, 0.5)`` is not always ``sqrt(x)`` (see :func:`c_pow`): this is where
    Keras and the kernels part at the default power.

    **keras2** and **tf1** (``ApplyFtrl`` when the configured shrinkage is 0, else
    ``ApplyFtrlV2``, which adds :math:`2\lambda_s w` to the gradient of ``z`` only; the
    accumulator takes the raw :math:`g^2`): the same :math:`z`, with :math:`r(x) = \sqrt x`
    when ``learning_rate_power == -0.5`` and :math:`p(x)` otherwise, and the weight a
    select:

    .. math::

        w \leftarrow \begin{cases}
            (\bar\lambda_1 \operatorname{sign}(z) - z) / (r(n') / \eta_{32} + 2\ell_2)
                & |z| > \bar\lambda_1 \\
            0 & \text{otherwise}
        \end{cases}

    The two weights agree wherever the divisor is finite and non-zero (a NaN ``z`` gives 0
    in the kernels, NaN in Keras).

    **Vectorised pow.** TensorFlow's Eigen evaluates ``pow`` (and tf_keras' ``tf.pow(g,
    2)``) on whole packets (8 float32 or 4 float64 elements on AVX) with its own
    approximation, which is 1 ulp off the correctly rounded value on about a quarter of
    float32 inputs (27% for the exponents 0.5, 0.3 and 2, measured with TF 2.21), and on the
    remaining tail with the C library's. refopt computes every
    element as the tail (:func:`c_pow`): variables of fewer elements than a packet match bit
    for bit, wider ones within the tolerance of the golden ``wide`` cases (the difference
    is amplified by the cancellation in :math:`p(n') - p(n)`). The kernels' ``sqrt`` special
    case is exact on every element.

    **Sparse gradients** (:class:`~refopt.IndexedSlices`; duplicate indices summed first,
    from zero in order of appearance): Keras 2 and TF1 (``SparseApplyFtrl[V2]``) update
    only the present rows, with the kernel's arithmetic but the weight from
    :math:`(\mathrm{clip}(z) - z) / y` (no select); on rows of **one element** (a 1-D
    variable, shape ``(n, 1)``) the kernel's scalar loop takes :math:`p` for
    :math:`p(n') - p(n)` even at power 0.5 and sums :math:`(z + \hat g) - \sigma w` left to
    right. tf.keras 2.11+ and Keras 3 densify the gradient in ``update_step``: every row is
    rebuilt (a row that never had a gradient becomes :math:`0`; shrinkage acts on all
    rows). With the convention knob ``keras3_sparse_square`` (Keras 3 on *unsummed*
    duplicates) the accumulator adds the sum of the squares of the occurrences while ``z``
    takes their sum.

    float16: every form evaluated with each operation rounded to float16, ``pow`` through
    float32. Not checked against a framework.

    Examples
    --------
    One step from ``w = 1`` with ``g = 0.5`` and the defaults (learning rate 0.1): ``n = 0.35``,
    ``z = 0.5 - (sqrt(0.35) - sqrt(0.1)) / 0.1``, ``w = -z / (sqrt(0.35) / 0.1)``:

    >>> import numpy as np
    >>> w = np.array([1.0], np.float32)
    >>> acc, lin = ftrl_initial_state(w)
    >>> r = ftrl_update(w, np.array([0.5], np.float32), acc, lin, learning_rate=0.1)
    >>> r.param, r.accumulator, r.linear
    (array([0.3809621], dtype=float32), array([0.35], dtype=float32), array([-2.2538023], dtype=float32))

    References
    ----------
    McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013.
    """
    param, grad, accumulator, linear, form = check_ftrl_args(
        param, grad, accumulator, linear, learning_rate=learning_rate,
        learning_rate_power=learning_rate_power,
        l1_regularization_strength=l1_regularization_strength,
        l2_regularization_strength=l2_regularization_strength,
        l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength, beta=beta,
        convention=convention)
    conv = _convention(convention)
    hyper = dict(learning_rate=learning_rate, learning_rate_power=learning_rate_power,
                 l1_regularization_strength=l1_regularization_strength,
                 l2_regularization_strength=l2_regularization_strength,
                 l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                 beta=beta)
    s = ftrl_scalars(param.dtype, conv, **hyper)
    g_sq = None
    with np.errstate(all="ignore"):
        if isinstance(grad, IndexedSlices):
            if form == "keras3" and conv.keras3_sparse_square:
                squares = IndexedSlices(grad.values * grad.values, grad.indices,
                                        grad.dense_shape)
                g_sq = squares.deduplicate().to_dense()
            grad = grad.deduplicate()
            if form in ("tf_keras", "keras3"):
                grad = grad.to_dense()
            else:
                rows = grad.indices
                w, n, z = param.copy(), accumulator.copy(), linear.copy()
                if rows.size:
                    w[rows], n[rows], z[rows] = ftrl_rows(
                        param[rows], grad.values, accumulator[rows], linear[rows],
                        convention=conv, row_width=int(np.prod(param.shape[1:],
                                                               dtype=np.int64)), **hyper)
                return FtrlResult(w, n, z)
        if form in ("tf_keras", "keras3"):
            w, n, z = _keras(param, grad, accumulator, linear, s, g_sq, form == "tf_keras")
        else:
            w, n, z = _kernel(param, grad, accumulator, linear, s)
    return FtrlResult(np.asarray(w), np.asarray(n), np.asarray(z))


def check_ftrl_args(param, grad, accumulator, linear, *, learning_rate, learning_rate_power,
                    l1_regularization_strength, l2_regularization_strength,
                    l2_shrinkage_regularization_strength, beta, convention):
    """Validate :func:`ftrl_update`'s arguments (its Raises section); return
    ``(param, grad, accumulator, linear, form)``. Shared with the fast backends'
    ``ftrl_update`` so that they raise the same errors."""
    param = as_float_array("param", param)
    form = _form(_convention(convention))
    if isinstance(grad, IndexedSlices) and param.ndim == 0:
        raise ValueError(
            "An IndexedSlices gradient needs a variable of rank >= 1 (its rows). Received: "
            "a 0-d variable"
        )
    grad = check_grad(param, grad)
    accumulator = check_like(param, "accumulator", accumulator)
    linear = check_like(param, "linear", linear)
    check_hyper("learning_rate", learning_rate)
    if not learning_rate >= 0:
        raise ValueError(f"`learning_rate` must be >= 0. Received: "
                         f"learning_rate={learning_rate!r}")
    check_scalar("learning_rate_power", learning_rate_power)
    if not learning_rate_power <= 0:
        raise ValueError("`learning_rate_power` must be <= 0. Received: "
                         f"learning_rate_power={learning_rate_power!r}")
    for name, value in (("l1_regularization_strength", l1_regularization_strength),
                        ("l2_regularization_strength", l2_regularization_strength),
                        ("l2_shrinkage_regularization_strength",
                         l2_shrinkage_regularization_strength),
                        ("beta", beta)):
        check_real(name, value, low=0)  # finite and >= 0, as refopt.Ftrl
    return param, grad, accumulator, linear, form
