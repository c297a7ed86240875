"""SGD with momentum and Nesterov momentum on the GPU: the reference's function.

Same function, same signature, same errors as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``); host arrays in, new host arrays out. The update is
:mod:`refopt.rules.sgd` (Keras' form, the rule ``backend="cuda"`` optimizers run).
"""

from __future__ import annotations

from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_update"]


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
