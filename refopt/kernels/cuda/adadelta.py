"""Adadelta on the device: :func:`refopt.reference.adadelta_update`, computed by the rule driver.

The update is :mod:`refopt.rules.adadelta` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["adadelta_update"]


def adadelta_update(param, grad, accumulated_grad, accumulated_delta, *, learning_rate, rho,
                    epsilon, convention=None):
    """As :func:`refopt.reference.adadelta_update`, bit for bit (but for the sign of a NaN),
    computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.adadelta import pure_update

    return pure_update(apply, param, grad, accumulated_grad, accumulated_delta,
                       learning_rate=learning_rate, rho=rho, epsilon=epsilon,
                       convention=convention)
