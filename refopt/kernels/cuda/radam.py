"""RAdam on the device: :func:`refopt.reference.radam_update`, computed by the rule driver.

The update is :mod:`refopt.rules.radam` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out,
as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["radam_update"]


def radam_update(param, grad, m, v, *, learning_rate, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 step=1, convention=None, epsilon_root=0.0, threshold=5.0):
    """As :func:`refopt.reference.radam_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.radam import pure_update

    return pure_update(apply, param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step, convention=convention,
                       epsilon_root=epsilon_root, threshold=threshold)
