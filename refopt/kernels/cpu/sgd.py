"""SGD with momentum and Nesterov momentum on the CPU: the rule-built kernels.

Same function, same signature and bit-identical results as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``). The update is :mod:`refopt.rules.sgd` (Keras' form, the
rule ``backend="cpu"`` optimizers run).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def sgd_update(param, grad, m, *, learning_rate, momentum, nesterov=False):
    r"""One SGD step with (optionally Nesterov) momentum, with the CPU kernels; new arrays.

    Parameters, returns, errors and numerics are those of :func:`refopt.reference.sgd_update`,
    reproduced bit for bit for float32 and float64 (float16 is computed by the reference).

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
        ``(param, m)``, new C-contiguous arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.sgd_update`.

    Notes
    -----
    Dense: ``m <- (-g) lr + m mu``; ``w <- w + m`` or ``w + ((-g) lr + m mu)`` in one pass
    (the ``dense`` kernel of :data:`refopt.rules.sgd.SGD`). Sparse: the ``table`` kernel of
    :data:`~refopt.rules.sgd.SGD_TABLE` (duplicate rows summed, then every row).
    """
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.sgd_update(param, grad, m, learning_rate=learning_rate, momentum=momentum,
                               nesterov=nesterov)
    from refopt.kernels.cpu.drivers import apply, apply_sparse
    from refopt.rules.sgd import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, learning_rate=learning_rate,
                       momentum=momentum, nesterov=nesterov)
