"""Partial row-wise Adam as FBGEMM's table-batched embeddings define it (``PARTIAL_ROWWISE_ADAM``).

Adam with a first moment ``m`` per element and a second moment ``v`` *per row* of an embedding
table, grown by the mean over the row of the squared (coalesced) row gradient. Follows FBGEMM's
optimizer definition ``fbgemm_gpu/codegen/genscript/optimizers.py`` (``partial_rowwise_adam``:
its ``split_precomputation`` and ``split_weight_update``, which the CUDA backward templates
expand) and ``fbgemm_gpu/include/fbgemm_gpu/utils/vec4.cuh`` (``Vec4T<float>::fma_``, one
``__fmaf_rn`` per element).

**No golden value backs this module.** FBGEMM has no CPU kernel for this optimizer
(``split_weight_update_cpu = ""  # TODO``; ``fbgemm-gpu-cpu`` 1.8 asserts "Optimizer
partial_row_wise_adam is not supported in CPU mode"), and its CUDA build could not be run
where refopt's golden cases are recorded. The rule below is FBGEMM's CUDA source as read,
with C++'s float/double promotions written out; its tests hold independent float64 hand
computations with a tolerance. It is *not* claimed bit-identical to FBGEMM's GPU kernel:
the order of the row's sum of squares there (per-thread ``float4`` partial sums, then a warp
butterfly, possibly contracted into FMAs by nvcc) is not knowable without running it, nor
whether nvcc contracts the two double multiply-adds; both can move the last bit.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import as_float_array, check_hyper, check_real, check_step
from refopt.reference.rowwise_adagrad import (
    _check_same,
    _check_slices,
    _rows_shape,
    check_finite_float32,
)
from refopt.reference.variants import fma

__all__ = [
    "PartialRowWiseAdamResult",
    "partial_rowwise_adam_defaults",
    "partial_rowwise_adam_initial_state",
    "partial_rowwise_adam_rows",
    "partial_rowwise_adam_update",
]

_F32 = np.dtype(np.float32)
_F64 = np.float64


class PartialRowWiseAdamResult(NamedTuple):
    """New arrays after one step: ``param`` (the table), ``m`` (per element, FBGEMM's
    ``momentum1``) and ``v`` (one per row, FBGEMM's ``momentum2``)."""

    param: np.ndarray
    m: np.ndarray
    v: np.ndarray


def partial_rowwise_adam_defaults(convention=None):
    """FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` defaults: ``learning_rate`` 0.01,
    ``epsilon`` 1e-8, ``beta_1`` 0.9, ``beta_2`` 0.999, ``weight_decay`` 0.0; both moments
    start at 0."""
    return {"learning_rate": 0.01, "epsilon": 1e-8, "beta_1": 0.9, "beta_2": 0.999,
            "weight_decay": 0.0}


def partial_rowwise_adam_initial_state(param):
    """The moments of ``param``: ``m`` of its shape, ``v`` one per row (``param.shape[:1]``),
    zeros of its dtype.

    Parameters
    ----------
    param : ndarray, shape (V, ...) or ()

    Returns
    -------
    (ndarray, ndarray)
        ``m`` (shape of ``param``) and ``v`` (shape (V,); ``()`` for a 0-d ``param``).
    """
    param = np.asarray(param)
    return np.zeros_like(param), np.zeros(_rows_shape(param.shape), param.dtype)


def _check_beta(name, value):
    check_hyper(name, value)  # real, finite, in [0, 1)
    with np.errstate(all="ignore"):
        if np.float32(value) >= 1:
            raise ValueError(
                f"`{name}` must be < 1 in float32 (FBGEMM passes it to its kernel as a C "
                f"float, where it would round to 1.0 and the bias correction divide by "
                f"zero). Received: {name}={value!r}")
    return value


def check_hyperparameters(*, beta_1, beta_2, epsilon, weight_decay, learning_rate=None):
    """The checks :class:`refopt.PartialRowWiseAdam` and the functions of this module share:
    ``learning_rate`` (unless None), ``epsilon`` and ``weight_decay`` (None: 0) real, finite,
    >= 0 and finite in float32; ``beta_1`` and ``beta_2`` in [0, 1) and < 1 once rounded to
    float32. Returns ``weight_decay`` as a number.

    Raises
    ------
    TypeError
        A hyperparameter not a real number (a bool, a string, an array).
    ValueError
        A value out of range or not finite, or one that overflows float32 (or, for a beta,
        rounds to 1 there); the message names the argument and the value.
    """
    if learning_rate is not None:
        check_finite_float32("learning_rate", check_hyper("learning_rate", learning_rate))
    _check_beta("beta_1", beta_1)
    _check_beta("beta_2", beta_2)
    check_finite_float32("epsilon", check_hyper("epsilon", epsilon))
    wd = check_real("weight_decay", weight_decay, low=0, allow_none=True)
    wd = 0.0 if wd is None else wd
    check_finite_float32("weight_decay", wd)
    return wd


def check_form(convention):
    """Refuse a convention without FBGEMM's row-wise optimizers (its ``rowwise_adagrad_form``
    is ``"none"``; only the ``"fbgemm"`` preset has them)."""
    from refopt.conventions import get_convention

    conv = get_convention(convention)
    if conv.rowwise_adagrad_form == "none":
        raise ValueError(
            f"PartialRowWiseAdam does not exist under convention={conv.name!r} (it is "
            f"FBGEMM's; the convention's `rowwise_adagrad_form` is 'none'; the preset that "
            f"has it: fbgemm). Received: convention={conv.name!r}")
    return conv


def check_arguments(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon,
                    weight_decay, step, convention):
    """Validate the arguments of :func:`partial_rowwise_adam_update` (shared with the CPU
    kernels, so they raise the same errors); return ``param`` as a plain ndarray. Nothing
    is modified."""
    check_form(convention)
    param = as_float_array("param", param)
    if param.dtype != _F32:
        raise TypeError(
            "PartialRowWiseAdam computes FBGEMM's float32 tables only (its mix of float and "
            "double arithmetic has no meaning for another dtype). Received: param with "
            f"dtype={param.dtype}")
    check_hyperparameters(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                          epsilon=epsilon, weight_decay=weight_decay)
    check_step(step)
    _check_same(param, m, "m", param.shape)
    _check_same(param, v, "v", _rows_shape(param.shape))
    if isinstance(grad, IndexedSlices):
        _check_slices(param, grad)
    else:
        _check_same(param, grad, "grad", param.shape)
    return param


def bias_corrections(beta_1, beta_2, step):
    """``(1.0 - powf(beta1, iter), 1.0 - powf(beta2, iter))`` as FBGEMM's kernel computes
    them: ``powf`` of the C float beta and of ``iter`` converted to float, subtracted from
    the double ``1.0`` (so in float64). Returns two ``np.float64``.

    ``powf`` is the C library's (:func:`refopt._libm.powf`, correctly rounded in glibc);
    CUDA's ``powf`` is not guaranteed correctly rounded, so FBGEMM's GPU may differ in the
    last bit of ``powf`` for some ``(beta, iter)``."""
    t = np.float32(step)  # iter (an integer) converted to float for powf
    with np.errstate(all="ignore"):
        b1, b2 = np.float32(beta_1), np.float32(beta_2)
        return (_F64(1.0) - _F64(_libm.powf(b1, t)), _F64(1.0) - _F64(_libm.powf(b2, t)))


def partial_rowwise_adam_rows(w, g, m, v, *, learning_rate, beta_1, beta_2, epsilon,
                              weight_decay=0.0, step):
    """One step on gathered rows: the coalesced gradient of each row, its moments.

    Parameters
    ----------
    w, g, m : ndarray of float32, shape (n, ...) (the same)
        The rows of the table, their (summed) gradients and first moments.
    v : ndarray of float32, shape (n,)
        Their second moments.
    learning_rate, beta_1, beta_2, epsilon, weight_decay : float
        Rounded to float32 (FBGEMM's kernel arguments are C ``float``).
    step : int
        FBGEMM's ``iter`` (1 on the first step).

    Returns
    -------
    (ndarray, ndarray, ndarray)
        New rows, new ``m`` (both shape of ``w``) and new ``v`` (shape (n,)).

    Notes
    -----
    For each row of ``D`` elements, ``f()`` rounding to float32, ``d()`` converting to
    float64 (exact), every other operation in float32 unless an operand is float64 (C++'s
    promotion: ``1.0`` is a double literal)::

        s      = ((0 + g[0]*g[0]) + g[1]*g[1]) + ... + g[D-1]*g[D-1]   (float32, in order)
        g_avg  = s / f(D)                                              (float32)
        v'     = f(d(v*b2) + d(g_avg) * (1.0 - d(b2)))
        v_hat  = f(d(v') / (1.0 - d(powf(b2, t))))
        m'     = fmaf(g, f(1.0 - d(b1)), m*b1)                          (one rounding)
        w'     = f(d(w) - d(lr) * ((d(m') / (1.0 - d(powf(b1, t))))
                                    / d(sqrtf(v_hat) + eps) + d(wd*w)))

    The sum of squares is taken element after element (as
    :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_rows`); FBGEMM's CUDA kernel sums
    per-thread ``float4`` partial sums and reduces them across the warp, an order refopt
    does not reproduce (a few ulp in ``g_avg``). nvcc's default contraction may also fuse
    ``v*b2 + g_avg*(1 - b2)`` and ``w - lr*(...)`` into double FMAs; their results, rounded
    to float32 afterwards, differ from the unfused ones only in rare double-rounding cases.

    A row of no element (``D = 0``) changes nothing (FBGEMM refuses such tables). No
    argument is checked here (the arrays come from :func:`partial_rowwise_adam_update` or
    the optimizer class).
    """
    f32 = np.float32
    n = w.shape[0] if w.ndim else 1
    width = int(np.prod(w.shape[1:], dtype=np.int64))
    if width == 0 or n == 0:  # nothing to average, nothing moves
        return w.copy(), np.array(m, copy=True), np.array(v, copy=True)
    w2 = w.reshape(n, width)
    g2 = np.asarray(g, _F32).reshape(n, width)
    m2 = np.asarray(m, _F32).reshape(n, width)
    v1 = np.asarray(v, _F32).reshape(n)
    with np.errstate(all="ignore"):
        lr, b1, b2, eps, wd = (f32(x) for x in (learning_rate, beta_1, beta_2, epsilon,
                                                 weight_decay))
        bc1, bc2 = bias_corrections(b1, b2, step)
        # the row's mean square, in float32 (at::acc_type<float, true> is float)
        s = np.zeros(n, _F32)
        for d in range(width):
            s = s + g2[:, d] * g2[:, d]
        g_avg = s / f32(width)  # float / int: float division
        # v_t = momentum2 * beta2 + g_avg_square * (1.0 - beta2): a float product, then
        # double arithmetic (1.0 is a double), stored into a float
        v_new = ((v1 * b2).astype(_F64) + g_avg.astype(_F64) * (_F64(1.0) - _F64(b2))
                 ).astype(_F32)
        # v_hat_t = v_t / (1.0 - powf(beta2, iter)): double division, stored into a float
        v_hat = (v_new.astype(_F64) / bc2).astype(_F32)
        # m_t *= beta1 (float), then m_t.fma_(grad, 1.0 - beta1): __fmaf_rn with the double
        # 1.0 - beta1 passed as a float
        m_new = fma(g2, f32(_F64(1.0) - _F64(b1)), m2 * b1)
        # w -= lr * (m_t / (1.0 - powf(beta1, iter)) / (sqrtf(v_hat) + eps) + wd * w):
        # (sqrtf(v_hat) + eps) and wd * w in float, the rest in double, stored into a float
        denom = (np.sqrt(v_hat) + eps).astype(_F64)
        step_ = (m_new.astype(_F64) / bc1) / denom[:, None] + (wd * w2).astype(_F64)
        w_new = (w2.astype(_F64) - _F64(lr) * step_).astype(_F32)
    return (w_new.reshape(w.shape), m_new.reshape(np.shape(m)).astype(_F32, copy=False),
            v_new.reshape(np.shape(v)))


def partial_rowwise_adam_update(param, grad, m, v, *, learning_rate=0.01, beta_1=0.9,
                                beta_2=0.999, epsilon=1e-8, weight_decay=0.0, step,
                                convention="fbgemm"):
    r"""One step of FBGEMM's ``PARTIAL_ROWWISE_ADAM`` (pure: new arrays).

    .. math::

        v_r &\leftarrow \beta_2 v_r + (1 - \beta_2)\,\frac{1}{D}\sum_d g_{r,d}^2, \qquad
        \hat v_r = \frac{v_r}{1 - \beta_2^t} \\
        m_{r,d} &\leftarrow \beta_1 m_{r,d} + (1 - \beta_1)\, g_{r,d} \\
        w_{r,d} &\leftarrow w_{r,d} - \eta\left(\frac{m_{r,d}/(1 - \beta_1^t)}
                  {\sqrt{\hat v_r} + \epsilon} + \lambda\, w_{r,d}\right)

    with ``t = step`` (FBGEMM's ``iter``). The order of operations and the float/double
    mix of FBGEMM's CUDA source are :func:`partial_rowwise_adam_rows`'.

    Parameters
    ----------
    param : ndarray of float32, shape (V, ...)
        The table (rows along the first axis; a 1-d variable has rows of one element, a 0-d
        one is one row). Any row width ``D`` is accepted (FBGEMM refuses a ``D`` that is not
        a multiple of 4); ``D = 0`` changes nothing.
    grad : ndarray of float32 (shape of ``param``) or IndexedSlices
        Dense: every row takes a step. ``IndexedSlices``: duplicate indices are summed
        first, from zero in order of appearance (:meth:`refopt.IndexedSlices.deduplicate`;
        FBGEMM's CUDA backward sums them in an order not reproduced), and only the present
        rows and their moments move; absent rows keep everything (no decay, no moment
        decay), an empty gradient changes nothing.
    m : ndarray of float32, shape of ``param``
        FBGEMM's ``momentum1``.
    v : ndarray of float32, shape (V,)
        FBGEMM's ``momentum2``, one per row.
    learning_rate : float, default 0.01
    beta_1, beta_2 : float, default 0.9, 0.999
        In [0, 1), and < 1 once rounded to float32.
    epsilon : float, default 1e-8
        Outside the root: ``sqrt(v_hat) + eps``.
    weight_decay : float, default 0.0
        ``lr * wd * w`` subtracted with the step (inside the same parenthesis, so decoupled
        from the moments; FBGEMM has no ``weight_decay_mode`` for this optimizer).
    step : int
        FBGEMM's ``iter``, >= 1: the bias corrections' ``t`` (FBGEMM counts it once per
        forward of the module, for every row).
    convention : str or Convention, default "fbgemm"
        Its ``rowwise_adagrad_form`` must be ``"fbgemm"`` (FBGEMM's row-wise optimizers).

    Returns
    -------
    PartialRowWiseAdamResult

    Raises
    ------
    TypeError
        ``param``, ``grad``, ``m`` or ``v`` not a float ndarray, or ``param`` not float32
        (FBGEMM's float32 tables only), or another dtype than ``param``; a hyperparameter
        not a real number.
    ValueError
        A convention without FBGEMM's optimizers; a negative or non-finite hyperparameter,
        a beta outside [0, 1) (or 1 in float32), one that overflows float32; ``step`` not an
        integer >= 1; a shape mismatch. Messages name the argument and the value received.

    Notes
    -----
    Follows FBGEMM's CUDA source (``optimizers.py``, ``partial_rowwise_adam``) as read; no
    FBGEMM value could be recorded (no CPU kernel exists; see the module docstring), so it
    is checked against hand computations in float64 only. Where FBGEMM's GPU may differ:
    the order of the row's sum of squares (a few ulp in the mean), nvcc's contractions,
    CUDA's ``powf``, and the order in which the CUDA backward sums duplicate indices.

    Examples
    --------
    >>> import numpy as np
    >>> from refopt.reference import partial_rowwise_adam_update
    >>> w = np.ones((2, 2), np.float32)
    >>> r = partial_rowwise_adam_update(w, np.array([[3., 4.], [0., 0.]], np.float32),
    ...                                 np.zeros((2, 2), np.float32), np.zeros(2, np.float32),
    ...                                 learning_rate=0.1, step=1)
    >>> r.v.tolist()          # (1.0 - float32(0.999)) * mean(9, 16), rounded to float32
    [0.012499839067459106, 0.0]
    >>> r.param[0].tolist()   # 1 - 0.1 * (0.1 g / 0.1) / sqrt(12.5): about 1 - 0.1 g / 3.5355
    [0.9151471853256226, 0.8868629336357117]
    """
    return exact_update(param, grad, m, v, partial_rowwise_adam_rows,
                        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                        epsilon=epsilon, weight_decay=weight_decay, step=step,
                        convention=convention)


def exact_update(param, grad, m, v, rows_fn, *, learning_rate, beta_1, beta_2, epsilon,
                 weight_decay, step, convention):
    """:func:`partial_rowwise_adam_update` with its row step ``rows_fn`` (the CPU mirror
    passes its compiled one)."""
    param = check_arguments(param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1,
                            beta_2=beta_2, epsilon=epsilon, weight_decay=weight_decay,
                            step=step, convention=convention)
    kw = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              weight_decay=0.0 if weight_decay is None else weight_decay, step=step)
    m, v = np.asarray(m), np.asarray(v)
    if param.ndim == 0:  # one row of one element
        new_w, new_m, new_v = partial_rowwise_adam_rows(
            param.reshape(1, 1), np.asarray(grad).reshape(1, 1), m.reshape(1, 1),
            v.reshape(1), **kw)
        return PartialRowWiseAdamResult(new_w.reshape(()), new_m.reshape(()),
                                        new_v.reshape(()))
    n, width = param.shape[0], int(np.prod(param.shape[1:], dtype=np.int64))
    if isinstance(grad, IndexedSlices):
        with np.errstate(all="ignore"):
            g = grad.deduplicate()
        rows = g.indices
        k = rows.shape[0]
        new_w, new_m, new_v = rows_fn(param[rows].reshape(k, width),
                                      g.values.reshape(k, width),
                                      m[rows].reshape(k, width), v[rows], **kw)
        out_w, out_m, out_v = param.copy(), m.copy(), v.copy()
        out_w[rows] = new_w.reshape((k,) + param.shape[1:])
        out_m[rows] = new_m.reshape((k,) + param.shape[1:])
        out_v[rows] = new_v
        return PartialRowWiseAdamResult(out_w, out_m, out_v)
    new_w, new_m, new_v = rows_fn(param.reshape(n, width), np.asarray(grad).reshape(n, width),
                                  m.reshape(n, width), v, **kw)
    return PartialRowWiseAdamResult(new_w.reshape(param.shape), new_m.reshape(param.shape),
                                    np.asarray(new_v).reshape(v.shape))
