"""Lion on the device: :func:`refopt.reference.lion_update`, computed by the rule driver.

The update is :mod:`refopt.rules.lion` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same; tf_keras' sparse branch is the
reference's. Host arrays in, new host arrays out, as every mirror function of
:mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["lion_update"]


def lion_update(param, grad, m, *, learning_rate, beta_1=0.9, beta_2=0.99, convention=None,
                weight_decay=None):
    """As :func:`refopt.reference.lion_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.lion import pure_update

    return pure_update(apply, param, grad, m, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, convention=convention, weight_decay=weight_decay)
