"""FTRL on the device: :func:`refopt.reference.ftrl_update`, computed by the rule driver.

The update is :mod:`refopt.rules.ftrl` (the same rule ``backend="cuda"`` optimizers run,
through :func:`refopt.kernels.cuda.drivers.apply`) where it exists
(Keras 2 and TF1 at ``learning_rate_power == -0.5``; wherever the framework calls ``pow`` the
reference computes it on the host: no CUDA function gives the C library's bits); the
arguments are checked by the reference's own checks, so the errors are the same. Host arrays
in, new host arrays out, as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["ftrl_update"]


def ftrl_update(param, grad, accumulator, linear, *, learning_rate, learning_rate_power=-0.5,
                l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                l2_shrinkage_regularization_strength=0.0, beta=0.0, convention=None):
    """As :func:`refopt.reference.ftrl_update`, bit for bit, computed on the device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.ftrl import pure_update

    return pure_update(apply, param, grad, accumulator, linear,
                       learning_rate=learning_rate, learning_rate_power=learning_rate_power,
                       l1_regularization_strength=l1_regularization_strength,
                       l2_regularization_strength=l2_regularization_strength,
                       l2_shrinkage_regularization_strength=l2_shrinkage_regularization_strength,
                       beta=beta, convention=convention)
