"""TF1's proximal optimizers on the CPU: :func:`refopt.reference.proximal_adagrad_update` and
:func:`refopt.reference.proximal_gradient_descent_update`, computed by the rule-built kernel.

The update is :mod:`refopt.rules.proximal` (the same rules ``backend="cpu"`` optimizers run);
the arguments are checked by the reference's own checks, so the errors are the same.
float16 is computed by the reference (Numba has no float16 arithmetic on the CPU), and so is
a sparse step on one-element rows whose quotient TF computes in double (float32, ``l2 > 0``).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import proximal as _ref

__all__ = ["proximal_adagrad_update", "proximal_gradient_descent_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def proximal_adagrad_update(param, grad, accumulator, *, learning_rate,
                            l1_regularization_strength=0.0, l2_regularization_strength=0.0,
                            convention=None):
    """As :func:`refopt.reference.proximal_adagrad_update`, bit-identical in float32 and
    float64."""
    hyper = {"learning_rate": learning_rate,
                 "l1_regularization_strength": l1_regularization_strength,
                 "l2_regularization_strength": l2_regularization_strength, "convention": convention}
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.proximal_adagrad_update(param, grad, accumulator, **hyper)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.proximal import pure_update

    return pure_update(apply, "ProximalAdagrad", param, grad, [accumulator], **hyper)


def proximal_gradient_descent_update(param, grad, *, learning_rate,
                                     l1_regularization_strength=0.0,
                                     l2_regularization_strength=0.0, convention=None):
    """As :func:`refopt.reference.proximal_gradient_descent_update`, bit-identical in float32
    and float64."""
    hyper = {"learning_rate": learning_rate,
                 "l1_regularization_strength": l1_regularization_strength,
                 "l2_regularization_strength": l2_regularization_strength, "convention": convention}
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.proximal_gradient_descent_update(param, grad, **hyper)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.proximal import pure_update

    return pure_update(apply, "ProximalGradientDescent", param, grad, [], **hyper)
