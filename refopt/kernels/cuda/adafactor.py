"""Adafactor on the device: :func:`refopt.reference.adafactor_update`, computed in phases.

The element phases are :mod:`refopt.rules.adafactor` (the second-moment estimate with the
update, then the step), run on the device by the rule driver
(:func:`refopt.kernels.cuda.drivers.apply`); the means between them and the factored moments
(one row or column of numbers) are computed on the host in the framework's order by the
reference's own functions. The arguments are checked by the reference's checks, so the errors
are the same. Host arrays in, new host arrays out, as every mirror function of
:mod:`refopt.kernels.cuda`.
"""

from __future__ import annotations

__all__ = ["adafactor_update"]


def adafactor_update(param, grad, velocity_row, velocity_col, velocity, *, learning_rate, step,
                     convention=None, beta_2_decay=None, epsilon_1=None, epsilon_2=None,
                     clip_threshold=None, weight_decay=None, min_dim_size_to_factor=None,
                     decay_offset=None, multiply_by_parameter_scale=None, factored=None):
    """As :func:`refopt.reference.adafactor_update`, bit for bit, its element phases on the
    device."""
    options = dict(beta_2_decay=beta_2_decay, epsilon_1=epsilon_1, epsilon_2=epsilon_2,
                   clip_threshold=clip_threshold, weight_decay=weight_decay,
                   min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset,
                   multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored)
    from refopt.kernels.cuda.drivers import apply
    from refopt.rules.adafactor import pure_update

    return pure_update(apply, param, grad, velocity_row, velocity_col, velocity,
                       learning_rate=learning_rate, step=step, convention=convention, **options)
