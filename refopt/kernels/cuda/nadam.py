"""Nadam on the device: :func:`refopt.reference.nadam_update`, computed by the rule driver.

The update is :mod:`refopt.rules.nadam` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["nadam_update"]


def nadam_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                 convention=None, momentum_decay=None, product_dtype=None, eps_root=None):
    """As :func:`refopt.reference.nadam_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.nadam import pure_update

    return pure_update(apply, param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step, convention=convention,
                       momentum_decay=momentum_decay, product_dtype=product_dtype,
                       eps_root=eps_root)
