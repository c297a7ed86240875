"""Lazy (sparse) Adam on the CPU: the Adam rule's ``rows`` kernel.

Same function, same signature and bit-identical results as :mod:`refopt.reference.lazy_adam`
(row semantics of the TF1 contrib ``LazyAdamOptimizer``, scalars of tf-keras' Adam).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cpu.adam import adam_update

__all__ = ["lazy_adam_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


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
    The ``rows`` kernel of :data:`refopt.rules.adam.ADAM` (``AMSGRAD``) sorts the indices
    stably, sums each unique row's gradient rows from zero in order of appearance and gives
    each unique row to one parallel iteration, which applies the Adam element to the row.
    """
    if not isinstance(grad, IndexedSlices):
        return adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                           beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.lazy_adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                                     beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    from refopt.kernels.cpu.drivers import apply, apply_sparse
    from refopt.rules.adam import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, v, vhat,
                       learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                       epsilon=epsilon, step=step, lazy=True)
