"""SGD with momentum and Nesterov momentum on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``); host arrays in, new host arrays out. The update is
:mod:`refopt.rules.sgd` (Keras' form, the rule ``backend="cuda"`` optimizers run).
"""

from __future__ import annotations

from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_sparse_scatter_update", "sgd_sparse_torch_update", "sgd_update"]


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum with the CUDA kernel; new host arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
    m : ndarray like ``param``
    learning_rate, momentum : float
    nesterov : bool

    Returns
    -------
    SGDResult
        ``(param, m)``, new host arrays; under the simulator bit-identical to
        :func:`refopt.reference.sgd_update` (tested).

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.sgd_update`, before anything is copied.

    Notes
    -----
    Dense gradients run the ``dense`` kernel of :data:`refopt.rules.sgd.SGD`,
    ``IndexedSlices`` gradients tf-keras' sparse update of the whole table (the ``table``
    kernel of :data:`~refopt.rules.sgd.SGD_TABLE`).
    """
    from refopt.kernels.cuda.drivers import apply, apply_sparse
    from refopt.rules.sgd import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, learning_rate=learning_rate,
                       momentum=momentum, nesterov=nesterov)


def sgd_sparse_torch_update(param, grad, *, learning_rate):
    """torch's ``SGD`` on a sparse gradient, each occurrence in turn: the host step.

    Same function, signature and errors as
    :func:`refopt.reference.sgd_sparse_torch_update` (see there for the rule). Its order of
    occurrences is serial, so ``backend="cuda"`` optimizers take the host step for it (a
    ``HostStepWarning``); this mirror computes it on the host too: host arrays in, a new host
    array out, bit-identical to the reference.
    """
    from refopt.reference.sgd import sgd_sparse_torch_update as host

    return host(param, grad, learning_rate=learning_rate)


def sgd_sparse_scatter_update(param, grad, *, learning_rate):
    """Keras 3's and Keras 2's plain SGD on a sparse gradient, each occurrence in turn: as
    :func:`refopt.reference.sgd_sparse_scatter_update`, bit for bit (the same function and
    checks). The host step (a ``HostStepWarning`` for ``backend="cuda"``
    optimizers): host arrays in, a new host array out.
    """
    from refopt.reference.sgd import sgd_sparse_scatter_update as host

    return host(param, grad, learning_rate=learning_rate)
