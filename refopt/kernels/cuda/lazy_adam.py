"""Lazy (sparse) Adam on the GPU: the reference's function over the Adam rule's ``rows`` kernel.

Same function, same signature, same errors as :mod:`refopt.reference.lazy_adam` (row
semantics of the TF1 contrib ``LazyAdamOptimizer``, scalars of tf-keras' Adam).
"""

from __future__ import annotations

from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cuda.adam import adam_update

__all__ = ["lazy_adam_update"]


def lazy_adam_update(
    param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step
):
    r"""One lazy Adam step with the CUDA kernel; returns new host arrays.

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
        New host arrays; rows absent from ``grad.indices`` are copies of the inputs. Under
        the simulator, bit-identical to :func:`refopt.reference.lazy_adam_update` (tested).

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.lazy_adam_update`, before anything is copied.

    Notes
    -----
    The tables are copied to the device and back (this function's contract is to return
    new arrays); ``LazyAdam(backend="cuda")`` updates the device tables in place. The
    duplicates are summed from zero in order of appearance by the thread that owns each
    element of a unique row (the ``rows`` kernel of :data:`refopt.rules.adam.ADAM`).
    """
    if not isinstance(grad, IndexedSlices):
        return adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                           beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    from refopt.kernels.cuda.drivers import apply, apply_sparse
    from refopt.rules.adam import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, v, vhat,
                       learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                       epsilon=epsilon, step=step, lazy=True)
