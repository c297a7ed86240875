"""TF1's proximal optimizers on the device: :func:`refopt.reference.proximal_adagrad_update`
and :func:`refopt.reference.proximal_gradient_descent_update`, computed by the rule driver.

The update is :mod:`refopt.rules.proximal` (the same rules ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`); the arguments are checked by the
reference's own checks, so the errors are the same. Host arrays in, new host arrays out, as
every mirror function of :mod:`refopt.kernels.cuda`. A sparse step on one-element rows whose
quotient TF computes in double (float32/float16 with ``l2 > 0``) is the reference's.
"""

from __future__ import annotations

__all__ = ["proximal_adagrad_update", "proximal_gradient_descent_update"]


def proximal_adagrad_update(param, grad, accumulator, *, learning_rate,
                            l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                            convention=None):
    """As :func:`refopt.reference.proximal_adagrad_update`, bit for bit, on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.proximal import pure_update

    return pure_update(apply, "ProximalAdagrad", param, grad, [accumulator],
                       learning_rate=learning_rate,
                       l1_regularization_strength=l1_regularization_strength,
                       l2_regularization_strength=l2_regularization_strength,
                       convention=convention)


def proximal_gradient_descent_update(param, grad, *, learning_rate,
                                     l1_regularization_strength=0.0,
                                     l2_regularization_strength=0.0, convention=None):
    """As :func:`refopt.reference.proximal_gradient_descent_update`, bit for bit, on the
    device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.proximal import pure_update

    return pure_update(apply, "ProximalGradientDescent", param, grad, [],
                       learning_rate=learning_rate,
                       l1_regularization_strength=l1_regularization_strength,
                       l2_regularization_strength=l2_regularization_strength,
                       convention=convention)
