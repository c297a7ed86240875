"""RMSprop on the device: :func:`refopt.reference.rmsprop_update`, computed by the rule driver.

The update is :mod:`refopt.rules.rmsprop` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations



__all__ = ["rmsprop_update"]


def rmsprop_update(param, grad, velocity, momentum_buf=None, average_gradient=None, *,
                   learning_rate, rho, momentum, epsilon, centered, convention=None,
                   eps_in_sqrt=None):
    """As :func:`refopt.reference.rmsprop_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.rmsprop import pure_update

    return pure_update(apply, param, grad, velocity, momentum_buf, average_gradient,
                       learning_rate=learning_rate, rho=rho, momentum=momentum,
                       epsilon=epsilon, centered=centered, convention=convention,
                       eps_in_sqrt=eps_in_sqrt)
