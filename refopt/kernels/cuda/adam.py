"""Adam and AMSGrad on the GPU: the reference's function over the fused multi-tensor kernel.

Same function, same signature, same errors as :mod:`refopt.reference.adam`
(``tf_keras/optimizers/adam.py``); host arrays in, new host arrays out.
"""

from __future__ import annotations

from refopt import reference as _ref
from refopt.indexed_slices import IndexedSlices
from refopt.kernels.cuda._common import (
    as_float_array,
    check_grad,
    check_like,
    to_dev,
    to_host,
)
from refopt.kernels.cuda._launch import adam_dense, adam_sparse
from refopt.reference.adam import AdamResult, adam_scalars

__all__ = ["AdamResult", "adam_update"]


def adam_update(param, grad, m, v, vhat=None, *, learning_rate, beta_1, beta_2, epsilon, step):
    r"""One Adam (or AMSGrad) step with the CUDA kernel; returns new host arrays.

    Parameters, returns, errors and numerics are those of
    :func:`refopt.reference.adam_update`: the arrays are copied to the device, updated there
    by the kernel the optimizers use (``_kernels.adam_multi``, one tensor) and copied back.

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
    An ``IndexedSlices`` gradient runs tf-keras' non-lazy sparse update on the device
    (``_kernels.adam_sparse_table``). Empty arrays are computed by the reference on the host.
    """
    param = as_float_array("param", param)
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    if vhat is not None:
        vhat = check_like(param, "vhat", vhat)
    hp = dict(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
              step=step)
    adam_scalars(param.dtype, **hp)  # validates the hyperparameters and step
    if param.size == 0:
        return _ref.adam_update(param, grad, m, v, vhat, **hp)
    P, M, V = to_dev(param), to_dev(m), to_dev(v)
    VH = None if vhat is None else to_dev(vhat)
    if isinstance(grad, IndexedSlices):
        adam_sparse(P, M, V, VH, grad.values, grad.indices, **hp)
    else:
        adam_dense(P, to_dev(grad), M, V, VH, **hp)
    return AdamResult(*(None if a is None else to_host(a)
                        for a in (P, M, V, VH)))
