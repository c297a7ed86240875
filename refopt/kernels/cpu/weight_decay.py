"""Decoupled weight decay on the CPU: the decay step's rule.

Same function, same signature and bit-identical results as
:mod:`refopt.reference.weight_decay` (``tf_keras/optimizers/optimizer.py``,
``_apply_weight_decay``). The update is :func:`refopt.rules.steps.decay` (the step the
optimizers' fused kernels run), as the rule :data:`refopt.rules.steps.DECAY`.
"""

from __future__ import annotations

import numpy as np

from refopt import reference as _ref

__all__ = ["apply_weight_decay"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def apply_weight_decay(param, *, learning_rate, weight_decay):
    r"""Shrink a variable towards zero, :math:`w - (w\lambda)\eta`, with the CPU kernel.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
    learning_rate, weight_decay : float

    Returns
    -------
    ndarray
        A new C-contiguous array, bit-identical to
        :func:`refopt.reference.apply_weight_decay`.

    Raises
    ------
    TypeError
        As :func:`refopt.reference.apply_weight_decay`.
    """
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.apply_weight_decay(param, learning_rate=learning_rate,
                                       weight_decay=weight_decay)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.steps import pure_weight_decay

    return pure_weight_decay(apply, param, learning_rate=learning_rate,
                             weight_decay=weight_decay)
