"""Lazy (sparse) Adam: only the rows present in an IndexedSlices gradient move.

The row semantics follow the TF1 contrib ``LazyAdamOptimizer``
(``tensorflow/contrib/opt/python/training/lazy_adam_optimizer.py``): rows absent from the
gradient keep ``w``, ``m`` and ``v`` unchanged, and bias correction uses the *global* step.
The scalars and the algebraic form of the moment update are those of tf-keras' dense Adam
(:func:`refopt.reference.adam_update`), so a gradient whose indices cover every row once gives
exactly the dense Adam result.
"""

from __future__ import annotations


from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import as_float_array, check_grad, check_like
from refopt.reference.adam import AdamResult, adam_update

__all__ = ["lazy_adam_update"]


def lazy_adam_update(
    param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step
):
    r"""One lazy Adam step; returns new arrays, inputs are never modified.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, shape ``(rows, ...)``
        The table :math:`w`.
    grad : IndexedSlices with ``dense_shape == param.shape``, or ndarray like ``param``
        The gradient. Duplicate indices are summed first (:meth:`IndexedSlices.deduplicate`).
        A dense ndarray gets the dense Adam update (:func:`adam_update`), as in TF1.
    m, v : ndarray like ``param``
        First and second moments.
    vhat : ndarray like ``param`` or None
        AMSGrad maximum (lazy too: only present rows); ``None`` for plain Adam.
    learning_rate, beta_1, beta_2, epsilon : float
        As in :func:`adam_update`.
    step : int
        The 1-based *global* time step :math:`t` (``iterations + 1``), shared by all rows,
        whether or not a row was present in earlier steps.

    Returns
    -------
    AdamResult
        ``(param, m, v, vhat)`` as new arrays. Rows not in ``grad.indices`` are bit-for-bit
        copies of the inputs.

    Raises
    ------
    TypeError, ValueError
        As :func:`adam_update`.

    Notes
    -----
    For the deduplicated rows :math:`I` with summed gradient rows :math:`g_I`, in the dtype of
    ``param``:

    .. math::

        m_I &\leftarrow m_I + (g_I - m_I)(1-\beta_1) \\
        v_I &\leftarrow v_I + (g_I^2 - v_I)(1-\beta_2) \\
        \hat v_I &\leftarrow \max(\hat v_I, v_I) \quad\text{(AMSGrad)} \\
        w_I &\leftarrow w_I - (m_I\alpha) / (\sqrt{v_I} + \hat\epsilon)

    with :math:`\alpha` from :func:`adam_scalars` at the global step: the present rows get
    exactly :func:`adam_update` applied to the gathered rows. Convention difference:
    TF1 contrib and TF-Addons write the moments as ``b1*m + (1-b1)*g`` (different rounding)
    and have no AMSGrad; the ``convention`` presets of the optimizer select those.
    Lazy Adam is a different algorithm from Adam: absent rows keep stale moments (see
    tensorflow/tensorflow#23668).

    Examples
    --------
    >>> import numpy as np
    >>> from refopt import IndexedSlices
    >>> t, z = np.ones((3, 2), np.float32), np.zeros((3, 2), np.float32)
    >>> g = IndexedSlices(np.full((2, 2), 0.5, np.float32), [1, 1], (3, 2))  # row 1 twice: sum 1.0
    >>> lazy_adam_update(t, g, z, z, learning_rate=0.1, beta_1=0.9, beta_2=0.999,
    ...                  epsilon=1e-7, step=1).param
    array([[1.      , 1.      ],
           [0.900001, 0.900001],
           [1.      , 1.      ]], dtype=float32)
    """
    if not isinstance(grad, IndexedSlices):
        return adam_update(
            param, grad, m, v, vhat,
            learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
            epsilon=epsilon, step=step,
        )
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    g = grad.deduplicate()
    idx = g.indices
    # The present rows get exactly the dense update (same elementwise operations, same order).
    rows = adam_update(
        param[idx], g.values, m[idx], v[idx], None if vhat is None else vhat[idx],
        learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step,
    )
    param_new, m_new, v_new = param.copy(), m.copy(), v.copy()
    param_new[idx], m_new[idx], v_new[idx] = rows.param, rows.m, rows.v
    vhat_new = None
    if vhat is not None:
        vhat_new = vhat.copy()
        vhat_new[idx] = rows.vhat
    return AdamResult(param_new, m_new, v_new, vhat_new)
