"""SGD with momentum and Nesterov momentum on the CPU: the rule-built kernels.

Same function, same signature and bit-identical results as :mod:`refopt.reference.sgd`
(``tf_keras/optimizers/sgd.py``). The update is :mod:`refopt.rules.sgd` (Keras' form, the
rule ``backend="cpu"`` optimizers run).
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref
from refopt.reference.sgd import SGDResult

__all__ = ["SGDResult", "sgd_sparse_scatter_update", "sgd_sparse_torch_update", "sgd_update"]

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


_in_turn = None


def _kernel():
    global _in_turn
    if _in_turn is None:
        from numba import njit

        from refopt.rules.ops import add, fma, mul

        @njit(cache=True, error_model="numpy", nogil=True)
        def in_turn(P, idx, V, neg_lr, fused):  # pragma: no cover - compiled
            """Every occurrence ``k`` in order: row ``idx[k]`` of ``P`` in place."""
            for k in range(idx.shape[0]):
                row = P[idx[k]]
                v = V[k]
                for d in range(row.shape[0]):
                    if fused:
                        row[d] = fma(neg_lr, v[d], row[d])
                    else:
                        row[d] = add(row[d], mul(neg_lr, v[d]))

        _in_turn = in_turn
    return _in_turn


def sgd_sparse_torch_update(param, grad, *, learning_rate):
    """As :func:`refopt.reference.sgd_sparse_torch_update`, bit for bit (the same checks);
    float32 and float64 run one compiled loop over the occurrences (O(occurrences x row
    size), serial: the same bits for any thread count)."""
    from refopt.kernels.cpu._common import rows2d, scalar
    from refopt.reference.sgd import _check_sparse_torch

    param = _check_sparse_torch(param, grad, learning_rate)
    if param.dtype not in _FAST:
        return _ref.sgd_sparse_torch_update(param, grad, learning_rate=learning_rate)
    out = np.array(param, copy=True, order="C")
    if grad.indices.shape[0] == 0 or out.size == 0:
        return out
    neg_lr = scalar(out.dtype, -float(learning_rate))
    _kernel()(rows2d(out) if out.ndim > 1 else out.reshape(-1, 1),
              np.asarray(grad.indices, np.int64), rows2d(grad.values), neg_lr,
              out.ndim > 1 or grad.indices.shape[0] > 1)  # torch: 1 entry of a 1-D
    return out


def sgd_sparse_scatter_update(param, grad, *, learning_rate):
    """Keras 3's and Keras 2's plain SGD on a sparse gradient, each occurrence in turn: as
    :func:`refopt.reference.sgd_sparse_scatter_update`, bit for bit (the same function and
    checks). On the host (NumPy), as the cpu backend's staged step runs it: the occurrences are
    applied in order.
    """
    from refopt.reference.sgd import sgd_sparse_scatter_update as host

    return host(param, grad, learning_rate=learning_rate)
