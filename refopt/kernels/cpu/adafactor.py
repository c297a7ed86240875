"""Adafactor on the CPU: :func:`refopt.reference.adafactor_update`, computed in phases.

The element phases are :mod:`refopt.rules.adafactor` (the second-moment estimate with the
update, then the step), run by the rule driver's kernels
(:func:`refopt.kernels.cpu.drivers.apply`); the means between them (the variable's RMS, the
row and column means, the update's RMS) and the factored moments (one row or column of
numbers) are computed on the host in the framework's order by the reference's own functions.
The arguments are checked by the reference's checks, so the errors are the same. float16 is
computed by the reference (Numba has no float16 arithmetic on the CPU).
"""

from __future__ import annotations

import numpy as np

from refopt.reference import adafactor as _ref

__all__ = ["adafactor_update"]

_FAST = (np.dtype(np.float32), np.dtype(np.float64))


def adafactor_update(param, grad, velocity_row, velocity_col, velocity, *, learning_rate, step,
                     convention=None, beta_2_decay=None, epsilon_1=None, epsilon_2=None,
                     clip_threshold=None, weight_decay=None, min_dim_size_to_factor=None,
                     decay_offset=None, multiply_by_parameter_scale=None, factored=None):
    """As :func:`refopt.reference.adafactor_update`, bit-identical in float32 and float64."""
    options = dict(beta_2_decay=beta_2_decay, epsilon_1=epsilon_1, epsilon_2=epsilon_2,
                   clip_threshold=clip_threshold, weight_decay=weight_decay,
                   min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset,
                   multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored)
    if not (isinstance(param, np.ndarray) and param.dtype in _FAST):
        return _ref.adafactor_update(param, grad, velocity_row, velocity_col, velocity,
                                     learning_rate=learning_rate, step=step,
                                     convention=convention, **options)
    from refopt.kernels.cpu.drivers import apply
    from refopt.rules.adafactor import pure_update

    return pure_update(apply, param, grad, velocity_row, velocity_col, velocity,
                       learning_rate=learning_rate, step=step, convention=convention, **options)
