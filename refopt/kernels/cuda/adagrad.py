"""Adagrad on the device: :func:`refopt.reference.adagrad_update`, computed by the rule driver.

The update is :mod:`refopt.rules.adagrad` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["adagrad_update"]


def adagrad_update(param, grad, accumulator, *, learning_rate, epsilon, convention=None,
                   lr_decay=0.0, step=1):
    """As :func:`refopt.reference.adagrad_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.adagrad import pure_update

    return pure_update(apply, param, grad, accumulator, learning_rate=learning_rate,
                       epsilon=epsilon, convention=convention, lr_decay=lr_decay, step=step)
