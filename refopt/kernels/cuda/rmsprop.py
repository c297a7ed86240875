"""RMSprop on the device: :func:`refopt.reference.rmsprop_update`, computed by the rule driver.

The update is :mod:`refopt.rules.rmsprop` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

import numpy as np

from refopt.reference import rmsprop as _ref

__all__ = ["rmsprop_update"]


def rmsprop_update(param, grad, velocity, momentum_buf=None, average_gradient=None, *,
                   learning_rate, rho, momentum, epsilon, centered, convention=None,
                   eps_in_sqrt=None):
    """As :func:`refopt.reference.rmsprop_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
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
    with np.errstate(all="ignore"):
        p, out = apply(call, param, grad, slots)
    v = out.pop(0)
    b = out.pop(0) if has_buffer else None
    a = out.pop(0) if centered else None
    return _ref.RMSpropResult(p, v, b, a)
