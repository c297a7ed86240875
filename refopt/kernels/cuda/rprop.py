"""Rprop on the device: :func:`refopt.reference.rprop_update`, computed by the rule driver.

The update is :mod:`refopt.rules.rprop` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["rprop_update"]


def rprop_update(param, grad, prev, step_size, *, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0),
                 convention=None):
    """As :func:`refopt.reference.rprop_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.rprop import pure_update

    return pure_update(apply, param, grad, prev, step_size, etas=etas,
                       step_sizes=step_sizes, convention=convention)
