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
    from refopt.rules.rmsprop import rmsprop_call

    param, grad, velocity, momentum_buf, average_gradient, form = _ref.check_rmsprop_args(
        param, grad, velocity, momentum_buf, average_gradient, learning_rate=learning_rate,
        rho=rho, momentum=momentum, epsilon=epsilon, centered=centered, convention=convention,
        eps_in_sqrt=eps_in_sqrt)
    conv = _ref._convention(convention)
    has_buffer = momentum_buf is not None
    updates = has_buffer and (momentum > 0 or form in ("tf1", "optax"))
    call = rmsprop_call(param.dtype, conv, learning_rate=learning_rate, rho=rho,
                        momentum=momentum, epsilon=epsilon, centered=centered,
                        has_buffer=has_buffer, update_buffer=updates,
                        eps_in_sqrt=eps_in_sqrt is not False)
    slots = [velocity] + ([momentum_buf] if has_buffer else []) + (
        [average_gradient] if centered else [])
    p, out = apply(call, param, grad, slots)
    v = out.pop(0)
    b = out.pop(0) if has_buffer else None
    a = out.pop(0) if centered else None
    return _ref.RMSpropResult(p, v, b, a)
