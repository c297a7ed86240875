"""Adam and AMSGrad, dense and non-lazy sparse, on the CPU: the rule-built kernels.

Same function, same signature and bit-identical results as :mod:`refopt.reference.adam`
(``tf_keras/optimizers/adam.py``). The update is :mod:`refopt.rules.adam` (tf-keras' form,
the rule ``backend="cpu"`` optimizers run), its scalars :func:`refopt.reference.adam_scalars`.
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.reference.adam import AdamResult, adam_scalars

__all__ = ["AdamResult", "adam_update", "adam_scalars"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def adam_update(param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    r"""One Adam (or AMSGrad) step with the CPU kernels; returns new arrays.

    Parameters, returns, errors and numerics are those of
    :func:`refopt.reference.adam_update`, which this function reproduces bit for bit for
    float32 and float64 (float16 is computed by the reference itself).

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
    m, v : ndarray like ``param``
    vhat : ndarray like ``param`` or None
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        The 1-based time step.

    Returns
    -------
    AdamResult
        ``(param, m, v, vhat)``, new C-contiguous arrays of the input dtype and shape.

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.adam_update`.

    Notes
    -----
    Dense: copies of ``param``, ``m``, ``v`` (``vhat``) are updated in place by the
    ``dense`` kernel of :data:`refopt.rules.adam.ADAM` (``AMSGRAD``), per element
    ``m + (g - m)(1-b1)``, ``v + (g*g - v)(1-b2)``, ``max(vhat, v)``,
    ``w - (m alpha)/(sqrt(v) + eps)``. Sparse: the ``table`` kernel of
    :data:`~refopt.rules.adam.ADAM_TABLE`: duplicate rows summed (stable sort, from zero in
    order of appearance), then every row, one owner per row.
    """
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adam_update(param, grad, m, v, vhat, learning_rate=learning_rate,
                                beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, step=step)
    from refopt.kernels.cpu.drivers import apply, apply_sparse
    from refopt.rules.adam import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, v, vhat,
                       learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                       epsilon=epsilon, step=step)
