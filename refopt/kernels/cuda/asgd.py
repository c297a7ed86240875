"""ASGD on the device: :func:`refopt.reference.asgd_update`, computed by the rule driver.

The update is :mod:`refopt.rules.asgd` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["asgd_update"]


def asgd_update(param, grad, ax, *, learning_rate, lambd, alpha, t0, step, eta=None,
                mu=None, convention=None):
    """As :func:`refopt.reference.asgd_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.asgd import pure_update

    return pure_update(apply, param, grad, ax, learning_rate=learning_rate, lambd=lambd,
                       alpha=alpha, t0=t0, step=step, eta=eta, mu=mu, convention=convention)
