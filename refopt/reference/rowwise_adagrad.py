"""Row-wise Adagrad as FBGEMM's table-batched embeddings compute it (``EXACT_ROWWISE_ADAGRAD``).

One accumulator per row of an embedding table, grown by the *mean* over the row of the
squared (coalesced) row gradient. Follows FBGEMM's optimizer definition
``fbgemm_gpu/codegen/genscript/optimizers.py`` (``rowwise_adagrad``, its
``split_weight_update_cpu``) and the CPU backward kernels
``fbgemm_gpu/codegen/training/backward/embedding_backward_split_cpu_template.cpp`` (exact:
duplicates coalesced first) and ``..._cpu_approx_template.cpp`` (approximate: every
occurrence applied in turn). TorchRec's fused embedding modules call these kernels
(``fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, ...}``). Facts confirmed on
``fbgemm-gpu-cpu`` 1.8.0 by the golden cases ``fbgemm/rowwise_adagrad_*``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import as_float_array, check_hyper, check_real
from refopt.reference.variants import fma

__all__ = [
    "WEIGHT_DECAY_MODES",
    "RowWiseAdagradResult",
    "rowwise_adagrad_defaults",
    "rowwise_adagrad_initial_state",
    "rowwise_adagrad_rows",
    "rowwise_adagrad_sequential_update",
    "rowwise_adagrad_update",
]

#: ``weight_decay_mode`` values and FBGEMM's ``WeightDecayMode`` they stand for.
WEIGHT_DECAY_MODES = {"none": "NONE (0)", "l2": "L2 (1)", "decoupled": "DECOUPLE (2)"}


class RowWiseAdagradResult(NamedTuple):
    """New arrays after one step: ``param`` (the table) and ``accumulator`` (one per row)."""

    param: np.ndarray
    accumulator: np.ndarray


def rowwise_adagrad_defaults(convention=None):
    """FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` defaults: ``learning_rate`` 0.01,
    ``epsilon`` 1e-8, ``weight_decay`` 0.0 with ``weight_decay_mode`` ``"none"``, the
    accumulator (``momentum1``) starting at 0."""
    return {"learning_rate": 0.01, "epsilon": 1e-8, "weight_decay": 0.0,
            "weight_decay_mode": "none", "initial_accumulator_value": 0.0}


def _rows_shape(shape):
    """The number of rows (the first axis; a 0-d variable is one row of one element)."""
    return (shape[0],) if len(shape) else ()


def rowwise_adagrad_initial_state(param, initial_accumulator_value=0.0):
    """The accumulator of ``param``: one value per row (``param.shape[:1]``), in its dtype.

    Parameters
    ----------
    param : ndarray, shape (V, ...) or ()
    initial_accumulator_value : float, default 0.0
        FBGEMM starts ``momentum1`` at zero.

    Returns
    -------
    ndarray, shape (V,) (``()`` for a 0-d ``param``), dtype of ``param``
    """
    param = np.asarray(param)
    return np.full(_rows_shape(param.shape), initial_accumulator_value, param.dtype)


def _check_mode(weight_decay_mode):
    if not isinstance(weight_decay_mode, str) or weight_decay_mode not in WEIGHT_DECAY_MODES:
        raise ValueError(
            f"`weight_decay_mode` must be one of {tuple(WEIGHT_DECAY_MODES)}. Received: "
            f"weight_decay_mode={weight_decay_mode!r}")


def check_finite_float32(name, value):
    """Refuse a finite real ``value`` that overflows float32 (``1e39``): FBGEMM's kernel
    arguments (``learning_rate``, ``eps``, ``weight_decay``) are C ``float``, which would
    hold inf. Returns ``value``; raises ValueError naming ``name``."""
    with np.errstate(over="ignore"):
        if np.isfinite(value) and not np.isfinite(np.float32(value)):
            raise ValueError(f"`{name}` must be finite in float32 (FBGEMM passes it to its "
                             f"kernel as a C float). Received: {name}={value!r}")
    return value


def check_hyperparameters(*, epsilon, weight_decay, weight_decay_mode, learning_rate=None):
    """The checks :class:`refopt.RowWiseAdagrad` and the functions of this module share:
    ``learning_rate`` (unless None) and ``epsilon`` real, finite, >= 0 and finite in float32;
    ``weight_decay`` (None: 0) the same; ``weight_decay_mode`` one of
    :data:`WEIGHT_DECAY_MODES`, and not ``"none"`` with ``weight_decay > 0`` (FBGEMM would
    silently ignore the decay). Returns ``weight_decay`` as a number.

    Raises
    ------
    TypeError
        A hyperparameter not a real number (a bool, a string, an array).
    ValueError
        A negative or non-finite value, one that overflows float32, an unknown mode, a
        decay with mode ``"none"``; the message names the argument and the value.
    """
    if learning_rate is not None:
        check_finite_float32("learning_rate", check_hyper("learning_rate", learning_rate))
    check_finite_float32("epsilon", check_hyper("epsilon", epsilon))
    wd = check_real("weight_decay", weight_decay, low=0, allow_none=True)
    wd = 0.0 if wd is None else wd
    check_finite_float32("weight_decay", wd)
    _check_mode(weight_decay_mode)
    if wd > 0 and weight_decay_mode == "none":
        raise ValueError(
            "`weight_decay` > 0 needs weight_decay_mode='l2' or 'decoupled' (FBGEMM "
            f"ignores it under WeightDecayMode.NONE). Received: weight_decay={wd!r}, "
            f"weight_decay_mode={weight_decay_mode!r}")
    return wd


def check_arguments(param, grad, accumulator, *, learning_rate, epsilon, weight_decay,
                    weight_decay_mode, convention):
    """Validate the arguments of :func:`rowwise_adagrad_update` and
    :func:`rowwise_adagrad_sequential_update` (shared with the CPU kernels, so they raise
    the same errors); return ``param`` as a plain ndarray. Nothing is modified."""
    _check_form(convention)
    param = as_float_array("param", param)
    check_hyperparameters(learning_rate=learning_rate, epsilon=epsilon,
                          weight_decay=weight_decay, weight_decay_mode=weight_decay_mode)
    _check_same(param, accumulator, "accumulator", _rows_shape(param.shape))
    if isinstance(grad, IndexedSlices):
        _check_slices(param, grad)
    else:
        _check_same(param, grad, "grad", param.shape)
    return param


def rowwise_adagrad_rows(w, g, acc, *, learning_rate, epsilon, weight_decay=0.0,
                         weight_decay_mode="none"):
    """One step on gathered rows: the coalesced gradient of each row, its accumulator.

    Parameters
    ----------
    w, g : ndarray, shape (n, ...) (the same), float16/32/64
        The rows of the table and their (summed) gradients.
    acc : ndarray, shape (n,), dtype of ``w``
    learning_rate, epsilon, weight_decay : float
        Rounded to the dtype of ``w`` (FBGEMM's kernel arguments are C ``float``).
    weight_decay_mode : {"none", "l2", "decoupled"}

    Returns
    -------
    (ndarray, ndarray)
        New rows (shape of ``w``) and new accumulators (shape (n,)).

    Notes
    -----
    In the dtype ``T`` of ``w``, for each row with ``D`` elements (FBGEMM's
    ``split_weight_update_cpu``)::

        g_l2   = fma(wd, w, g)               (L2 only; only the sum of squares sees it)
        s      = ((0 + g_l2[0]^2) + g_l2[1]^2) + ... + g_l2[D-1]^2     (in element order)
        acc'   = acc + s / T(D)
        mult   = lr / (sqrt(acc') + eps)
        corr   = fma(-mult, wd, 1)  (L2) | fma(-lr, wd, 1)  (decoupled) | 1  (none)
        w'     = fma(corr, w, -(g*mult))

    ``fma`` is one rounding (:func:`refopt.reference.variants.fma`): FBGEMM's CPU kernel is
    compiled with floating-point contraction (GCC's default), which fuses these three (the
    L2 gradient, the decay factor, the weight update) and not the sum of squares (measured
    on the golden cases ``fbgemm/rowwise_adagrad_*``, the decay factor on
    ``fbgemm/rowwise_adagrad_{l2,decoupled}_big_f32``: every other choice misses them).

    A row of no element (``D = 0``, a table of shape ``(V, 0)``) keeps its accumulator
    (the mean of no square is not taken; FBGEMM refuses such tables, see
    :func:`rowwise_adagrad_update`). No argument is checked here (the arrays come from
    :func:`rowwise_adagrad_update` or the optimizer class).
    """
    _check_mode(weight_decay_mode)
    dt = w.dtype.type
    n = w.shape[0] if w.ndim else 1
    width = int(np.prod(w.shape[1:], dtype=np.int64))
    w2 = w.reshape(n, width)
    g2 = np.asarray(g, w.dtype).reshape(n, width)
    a1 = np.asarray(acc, w.dtype).reshape(n)
    lr, eps, wd = dt(learning_rate), dt(epsilon), dt(weight_decay)
    if width == 0:  # no element: nothing to average, nothing moves
        return w.copy(), np.array(acc, w.dtype, copy=True)
    with np.errstate(all="ignore"):
        # FBGEMM's kernel is compiled with FMA contraction: grad += wd*w is one fma
        gl = fma(np.full_like(w2, wd), w2, g2) if weight_decay_mode == "l2" else g2
        s = np.zeros(n, w.dtype)
        for d in range(w2.shape[1]):  # FBGEMM's CPU loop: one element after another
            s = s + gl[:, d] * gl[:, d]
        a = a1 + s / dt(w2.shape[1])
        mult = lr / (np.sqrt(a) + eps)
        # the decay factor 1 - x*wd is one fma too (x = mult under L2, lr decoupled)
        if weight_decay_mode == "l2":
            corr = fma(-mult, wd, dt(1))
        elif weight_decay_mode == "decoupled":
            corr = np.full(n, fma(-lr, wd, dt(1)), w.dtype)
        else:
            corr = np.ones(n, w.dtype)
        # ... and corr*w - g*mult is fma(corr, w, -(g*mult)) (the sum of squares is not
        # contracted: measured on the golden cases)
        shape2 = w2.shape
        new = fma(np.broadcast_to(corr[:, None], shape2), w2,
                  -(g2 * np.broadcast_to(mult[:, None], shape2)))
    return new.reshape(w.shape), a.reshape(np.shape(acc))


def rowwise_adagrad_update(param, grad, accumulator, *, learning_rate=0.01, epsilon=1e-8,
                           weight_decay=0.0, weight_decay_mode="none", convention="fbgemm"):
    r"""One step of FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` (pure: new arrays).

    .. math::

        a_r \leftarrow a_r + \frac{1}{D}\sum_{d} \tilde g_{r,d}^2, \qquad
        w_r \leftarrow c_r\,w_r - \frac{\eta}{\sqrt{a_r} + \epsilon}\, g_r

    with :math:`\tilde g = g + \lambda w` under L2 decay (else :math:`g`), and
    :math:`c_r = 1 - \lambda\eta/(\sqrt{a_r}+\epsilon)` (L2), :math:`1 - \eta\lambda`
    (decoupled) or 1. The order of operations and roundings is
    :func:`rowwise_adagrad_rows`'.

    Parameters
    ----------
    param : ndarray, shape (V, ...), float16/32/64
        The table (rows along the first axis; a 1-d variable has rows of one element). Any
        row width ``D`` is accepted (FBGEMM refuses a table whose ``D`` is not a multiple
        of 4, and the golden cases have ``D`` in 4, 8, 64, 128); ``D = 0`` changes nothing
        (the accumulator is not touched: the mean of no square is not taken).
    grad : ndarray (shape of ``param``) or IndexedSlices
        Dense: every row takes a step (a zero row gradient still applies the decoupled
        decay and leaves the accumulator as it is, as FBGEMM does for an index looked up
        with a zero gradient). ``IndexedSlices``: duplicate indices are summed first, from
        zero in order of appearance (FBGEMM's ``grad_buffer``), and only the present rows
        and their accumulators move; rows absent from the gradient keep their values (no
        decay), an empty gradient changes nothing.
    accumulator : ndarray, shape (V,), dtype of ``param``
        FBGEMM's ``momentum1``.
    learning_rate : float, default 0.01
    epsilon : float, default 1e-8
        Outside the root: ``sqrt(acc) + eps``.
    weight_decay : float, default 0.0
    weight_decay_mode : {"none", "l2", "decoupled"}, default "none"
        FBGEMM's ``WeightDecayMode.NONE``, ``L2`` (``g + wd*w`` in the sum of squares, the
        factor ``1 - wd*lr/(sqrt(acc) + eps)`` on the weight) and ``DECOUPLE`` (the factor
        ``1 - lr*wd``).
    convention : str or Convention, default "fbgemm"
        Its ``rowwise_adagrad_form`` must be ``"fbgemm"``.

    Returns
    -------
    RowWiseAdagradResult

    Raises
    ------
    ValueError
        A convention without row-wise Adagrad; an unknown ``weight_decay_mode``;
        ``weight_decay > 0`` with mode ``"none"``; a negative or non-finite hyperparameter,
        or one that overflows float32 (``1e39``: FBGEMM's kernel arguments are C float); a
        shape mismatch. Messages name the argument and the value received.
    TypeError
        ``param``, ``grad`` or ``accumulator`` not a float16/32/64 ndarray (an integer table
        is refused), or of another dtype than ``param``; a hyperparameter not a real number.

    Notes
    -----
    FBGEMM computes in the table's float32 (``at::acc_type<float, true>``); its kernel
    arguments (``learning_rate`` read from a float32 tensor, ``eps``, ``weight_decay``) are C
    ``float``. Float64 tables (which FBGEMM does not have) compute the same formulas in
    float64; float16 ones in float16, which is **not** FBGEMM's float16: FBGEMM's
    ``SparseType.FP16`` tables keep a float32 accumulator, compute the row in float32 and
    store the weights with stochastic rounding (on by default, ``stochastic_rounding=True``
    in 1.8.0); none of that is reproduced, and no float16 case is recorded.

    Known difference, not reproduced: FBGEMM's CPU backward for *pooled* float32 tables
    (``PoolingMode.SUM``/``MEAN``, unshared) calls FBGEMM's JIT ``GenerateSparseAdaGrad``
    kernel, which sums the squares in eight AVX2 lanes (a different rounding of the sum)
    and is given ``weight_decay=0``: weight decay is silently ignored there (1.8.0). The
    sequence-embedding path (``PoolingMode.NONE``), float16 tables and shared tables take
    the kernel reproduced here.

    Examples
    --------
    >>> import numpy as np
    >>> from refopt.reference import rowwise_adagrad_update
    >>> w = np.ones((2, 2), np.float32)
    >>> r = rowwise_adagrad_update(w, np.array([[3., 4.], [0., 0.]], np.float32),
    ...                            np.zeros(2, np.float32), learning_rate=0.1)
    >>> r.accumulator.tolist(), r.param[0].tolist()
    ([12.5, 0.0], [0.9151471853256226, 0.8868629336357117])
    """
    return exact_update(param, grad, accumulator, rowwise_adagrad_rows,
                        learning_rate=learning_rate, epsilon=epsilon, weight_decay=weight_decay,
                        weight_decay_mode=weight_decay_mode, convention=convention)


def exact_update(param, grad, accumulator, rows_fn, *, learning_rate, epsilon, weight_decay,
                 weight_decay_mode, convention):
    """:func:`rowwise_adagrad_update` with its row step ``rows_fn`` (the CPU mirror passes
    its compiled one)."""
    param = check_arguments(param, grad, accumulator, learning_rate=learning_rate,
                            epsilon=epsilon, weight_decay=weight_decay,
                            weight_decay_mode=weight_decay_mode, convention=convention)
    kw = dict(learning_rate=learning_rate, epsilon=epsilon, weight_decay=weight_decay,
              weight_decay_mode=weight_decay_mode)
    if isinstance(grad, IndexedSlices):
        with np.errstate(all="ignore"):
            g = grad.deduplicate()
        rows = g.indices
        width = int(np.prod(param.shape[1:], dtype=np.int64))
        k = rows.shape[0]
        new_w, new_a = rows_fn(param[rows].reshape(k, width), g.values.reshape(k, width),
                               np.asarray(accumulator)[rows], **kw)
        out_w, out_a = param.copy(), np.array(accumulator, copy=True)
        out_w[rows] = new_w.reshape((k,) + param.shape[1:])
        out_a[rows] = new_a
        return RowWiseAdagradResult(out_w, out_a)
    grad = np.asarray(grad)
    if param.ndim == 0:
        new_w, new_a = rowwise_adagrad_rows(param, grad, accumulator, **kw)
    else:
        n, width = param.shape[0], int(np.prod(param.shape[1:], dtype=np.int64))
        new_w, new_a = rows_fn(param.reshape(n, width), grad.reshape(n, width),
                               np.asarray(accumulator), **kw)
        new_w = new_w.reshape(param.shape)
    return RowWiseAdagradResult(new_w, new_a)


def rowwise_adagrad_sequential_update(param, grad, accumulator, *, learning_rate=0.01,
                                      epsilon=1e-8, weight_decay=0.0,
                                      weight_decay_mode="none", convention="fbgemm"):
    """FBGEMM's approximate row-wise Adagrad: each occurrence of an index is a step of its own.

    FBGEMM's ``ROWWISE_ADAGRAD`` (approximate; ``embedding_backward_split_cpu_approx_template
    .cpp``, deprecated and no longer built in ``fbgemm-gpu`` 1.8) does not coalesce: for
    every index of the batch, in order, it applies :func:`rowwise_adagrad_rows` to that row
    with that occurrence's gradient alone, so a row that appears twice grows its
    accumulator twice and takes two steps, the second with the first's result. (FBGEMM runs
    the bags in parallel, so its order between bags is not fixed; this function takes the
    order of ``grad.indices``.)

    Parameters
    ----------
    param, accumulator, learning_rate, epsilon, weight_decay, weight_decay_mode, convention
        As :func:`rowwise_adagrad_update`.
    grad : IndexedSlices or ndarray
        Its rows are applied one after another, duplicates included; a dense gradient is
        every row once (the exact step).

    Returns
    -------
    RowWiseAdagradResult

    Raises
    ------
    TypeError, ValueError
        As :func:`rowwise_adagrad_update`.

    Notes
    -----
    Cost: the occurrences are taken in *rounds*: round ``j`` steps, in one vectorised
    :func:`rowwise_adagrad_rows`, the ``j``-th occurrence of every index that has one
    (distinct rows, so their order within a round does not matter, and each sees the
    result of its previous occurrence). Rounds = the largest number of times one index
    occurs, so a batch where one row appears ``m`` times costs ``m`` NumPy steps.
    ``backend="cpu"`` runs every occurrence in one compiled loop instead, bit-identical.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> from refopt.reference import rowwise_adagrad_sequential_update
    >>> g = refopt.IndexedSlices(np.array([[1.], [1.]], np.float32), [0, 0], (1, 1))
    >>> r = rowwise_adagrad_sequential_update(np.zeros((1, 1), np.float32), g,
    ...                                       np.zeros(1, np.float32), learning_rate=1.0)
    >>> r.accumulator.tolist(), r.param.tolist()   # -1 - 1/sqrt(2)
    ([2.0], [[-1.7071068286895752]])
    """
    kw = dict(learning_rate=learning_rate, epsilon=epsilon, weight_decay=weight_decay,
              weight_decay_mode=weight_decay_mode)
    if not isinstance(grad, IndexedSlices):
        return rowwise_adagrad_update(param, grad, accumulator, convention=convention, **kw)
    param = check_arguments(param, grad, accumulator, convention=convention, **kw)
    out_w, out_a = param.copy(), np.array(accumulator, copy=True)
    idx = np.asarray(grad.indices, np.int64)
    width = int(np.prod(param.shape[1:], dtype=np.int64))
    values = grad.values.reshape(idx.shape[0], width)
    table = out_w.reshape(param.shape[0], width)  # a view: writes land in out_w
    for occurrences in _rounds(idx):
        rows = idx[occurrences]
        new_w, new_a = rowwise_adagrad_rows(table[rows], values[occurrences], out_a[rows],
                                            **kw)
        table[rows] = new_w
        out_a[rows] = new_a
    return RowWiseAdagradResult(out_w, out_a)


def _rounds(idx):
    """The positions of ``idx`` grouped by rank among the equal indices: first the first
    occurrence of every index, then the second ones, ... (each group has distinct indices,
    in order of position)."""
    if idx.size == 0:
        return []
    order = np.argsort(idx, kind="stable")  # equal indices stay in order of position
    sorted_idx = idx[order]
    starts = np.flatnonzero(np.r_[True, sorted_idx[1:] != sorted_idx[:-1]])
    sizes = np.diff(np.r_[starts, idx.size])
    rank = np.empty_like(idx)
    rank[order] = np.arange(idx.size) - np.repeat(starts, sizes)
    by_rank = np.argsort(rank, kind="stable")  # by rank, then by position
    return np.split(by_rank, np.cumsum(np.bincount(rank))[:-1])


def _check_form(convention):
    from refopt.conventions import get_convention

    conv = get_convention(convention)
    if conv.rowwise_adagrad_form == "none":
        raise ValueError(
            f"RowWiseAdagrad does not exist under convention={conv.name!r} (its "
            f"`rowwise_adagrad_form` is 'none'; the preset that has it: fbgemm). Received: "
            f"convention={conv.name!r}")


def _check_same(param, arr, name, shape):
    arr = as_float_array(name, arr)
    if arr.dtype != param.dtype:
        raise TypeError(f"`{name}` must have the dtype of `param` ({param.dtype}). Received: "
                        f"{name}.dtype={arr.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"`{name}` must have shape {tuple(shape)}. Received: "
                         f"{name}.shape={arr.shape}")


def _check_slices(param, grad):
    if param.ndim == 0 or tuple(grad.dense_shape) != param.shape:
        raise ValueError(f"An IndexedSlices `grad` must have dense_shape {param.shape} (a "
                         f"table of rank >= 1). Received: dense_shape={tuple(grad.dense_shape)}")
    if grad.values.dtype != param.dtype:
        raise TypeError(f"`grad.values` must have the dtype of `param` ({param.dtype}). "
                        f"Received: {grad.values.dtype}")
