"""RMSprop on the CPU: :func:`refopt.reference.rmsprop_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.rmsprop` (the same rule ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import rmsprop as _ref

__all__ = ["rmsprop_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def rmsprop_update(param, grad, velocity, momentum_buf=None, average_gradient=None, *,
                   learning_rate, rho, momentum, epsilon, centered, convention=None,
                   eps_in_sqrt=None):
    """As :func:`refopt.reference.rmsprop_update`, bit-identical in float32 and float64."""
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.rmsprop_update(
            param, grad, velocity, momentum_buf, average_gradient, learning_rate=learning_rate,
            rho=rho, momentum=momentum, epsilon=epsilon, centered=centered,
            convention=convention, eps_in_sqrt=eps_in_sqrt)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.rmsprop import pure_update

    return pure_update(apply, param, grad, velocity, momentum_buf, average_gradient,
                       learning_rate=learning_rate, rho=rho, momentum=momentum,
                       epsilon=epsilon, centered=centered, convention=convention,
                       eps_in_sqrt=eps_in_sqrt)
