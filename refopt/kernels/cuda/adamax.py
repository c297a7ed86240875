"""Adamax on the device: :func:`refopt.reference.adamax_update`, computed by the rule driver.

The update is :mod:`refopt.rules.adamax` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`. tf_keras' non-lazy sparse update and
Keras 3's raw slices have no rule: computed by the reference.
"""

from __future__ import annotations

__all__ = ["adamax_update"]


def adamax_update(param, grad, m, u, *, learning_rate, beta_1, beta_2, epsilon, step=1,
                  convention=None):
    """As :func:`refopt.reference.adamax_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.adamax import pure_update

    return pure_update(apply, param, grad, m, u, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step, convention=convention)
