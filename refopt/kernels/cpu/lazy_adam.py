"""Lazy (sparse) Adam on the CPU: one Numba kernel sums duplicates and updates the rows.

Same function, same signature and bit-identical results as :mod:`refopt.reference.lazy_adam`
(row semantics of the TF1 contrib ``LazyAdamOptimizer``, scalars of tf-keras' Adam).
"""

from __future__ import annotations

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cpu import _kernels as K
from refopt.kernels.cpu._common import (
    FALLBACK_DTYPES,
    as_float_array,
    c_copy,
    check_grad,
    check_like,
    flags,
    launch,
    rows2d,
    scalars,
    stable_order,
)
from refopt.kernels.cpu.adam import adam_update
from refopt.reference.adam import AdamResult, adam_scalars

__all__ = ["lazy_adam_update"]


def lazy_adam_update(
    param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step
):
    r"""One lazy Adam step with the CPU kernel; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, shape ``(rows, ...)``
    grad : IndexedSlices with ``dense_shape == param.shape``, or ndarray like ``param``
        A dense ndarray gets the dense Adam update (:func:`adam_update`).
    m, v : ndarray like ``param``
    vhat : ndarray like ``param`` or None
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        The 1-based global time step.

    Returns
    -------
    AdamResult
        Bit-identical to :func:`refopt.reference.lazy_adam_update`: rows absent from
        ``grad.indices`` are copies of the inputs.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.lazy_adam_update`.

    Notes
    -----
    This pure function copies the tables (its contract is to return new arrays); the
    optimizers' in-place path (``LazyAdam(backend="cpu")``) costs only the rows touched.
    ``_kernels.lazy_adam_rows`` sorts the indices stably, gives each unique row to one
    parallel iteration, which sums its gradient rows from zero in order of appearance and
    applies the Adam pass to the row.
    """
    if not isinstance(grad, IndexedSlices):
        return adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                           beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    dtype = param.dtype
    s = adam_scalars(dtype, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, step=step)
    if dtype in FALLBACK_DTYPES:
        return _ref.lazy_adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                                     beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    sc = scalars(dtype, alpha=s.alpha, c1=s.one_minus_beta_1, c2=s.one_minus_beta_2,
                 eps=s.epsilon)
    P, M, V = c_copy(param), c_copy(m), c_copy(v)
    VH = None if vhat is None else c_copy(vhat)
    M2 = rows2d(M)
    vals = rows2d(grad.values)
    order, srows = stable_order(grad.indices)
    launch(K.lazy_adam_rows, (rows2d(P), M2, rows2d(V), M2 if VH is None else rows2d(VH),
                              order, srows, vals,
                              flags(ams=vhat is not None), sc, dtype.type(1), False,
                              dtype.type(0)), vals.size)
    return AdamResult(P, M, V, VH)
