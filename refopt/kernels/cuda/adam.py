"""Adam and AMSGrad on the GPU: the reference's function over the rule-built kernels.

Same function, same signature, same errors as :mod:`refopt.reference.adam`
(``tf_keras/optimizers/adam.py``); host arrays in, new host arrays out. The update is
:mod:`refopt.rules.adam` (tf-keras' form, the rule ``backend="cuda"`` optimizers run),
through :func:`refopt.kernels.cuda.drivers.apply` and
:func:`~refopt.kernels.cuda.drivers.apply_sparse`.
"""

from __future__ import annotations

from refopt.reference.adam import AdamResult

__all__ = ["AdamResult", "adam_update"]


def adam_update(param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    r"""One Adam (or AMSGrad) step with the CUDA kernels; returns new host arrays.

    Parameters, returns, errors and numerics are those of
    :func:`refopt.reference.adam_update`: the arrays are copied to the device, updated there
    by the ``dense`` kernel of :data:`refopt.rules.adam.ADAM` (``AMSGRAD``) and copied back.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        Host array (never modified).
    grad : ndarray like ``param``, or IndexedSlices with ``dense_shape == param.shape``
    m, v : ndarray like ``param``
    vhat : ndarray like ``param`` or None
        AMSGrad's maximum of ``v`` (None: plain Adam).
    learning_rate, beta_1, beta_2, epsilon : float
    step : int
        The 1-based time step.

    Returns
    -------
    AdamResult
        ``(param, m, v, vhat)``, new host arrays of the input dtype and shape. Under the
        simulator, bit-identical to the reference (tested).

    Raises
    ------
    TypeError, ValueError
        As :func:`refopt.reference.adam_update`, before anything is copied.

    Notes
    -----
    An ``IndexedSlices`` gradient runs tf-keras' non-lazy sparse update of the whole table
    on the device (the ``table`` kernel of :data:`refopt.rules.adam.ADAM_TABLE`).
    """
    from refopt.kernels.cuda.drivers import apply, apply_sparse
    from refopt.rules.adam import pure_update

    return pure_update(apply, apply_sparse, param, grad, m, v, vhat,
                       learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                       epsilon=epsilon, step=step)
