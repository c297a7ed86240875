"""Lamb on the device: :func:`refopt.reference.lamb_update`, computed in phases.

The element phases are :mod:`refopt.rules.lamb` (the direction with the moments, then the
step with the trust ratio), run on the device by the rule driver
(:func:`refopt.kernels.cuda.drivers.apply`); the per-tensor norms between them are summed on
the host in the framework's order by the reference's own functions. The arguments are
checked by the reference's checks, so the errors are the same. Host arrays in, new host
arrays out, as every mirror function of :mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["lamb_update"]


def lamb_update(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                convention=None, eps_root=None, weight_decay=None):
    """As :func:`refopt.reference.lamb_update`, bit for bit, its element phases on the
    device."""
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.lamb import pure_update

    return pure_update(apply, param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1,
                       beta_2=beta_2, epsilon=epsilon, step=step, convention=convention,
                       eps_root=eps_root, weight_decay=weight_decay)
