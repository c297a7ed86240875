"""Shared helpers of the CUDA mirror functions: the reference's checks, host <-> device.

The checks and the scalar rounding are those of :mod:`refopt.reference._common`, imported
rather than rewritten, so that the CUDA mirror accepts and refuses exactly the arguments the
reference does, with the same exceptions and messages, before anything is copied.
"""

from __future__ import annotations

import numpy as np

from refopt.kernels.cuda._launch import cuda
from refopt.reference._common import (  # noqa: F401  (re-exported for the mirror modules)
    FLOAT_DTYPES,
    as_float_array,
    check_flag,
    check_grad,
    check_like,
    check_scalar,
    scalar,
)


def to_dev(a):
    """A new device array holding ``a`` in C order (the host array is not touched).

    ``np.asarray(order="C")``, not ``np.ascontiguousarray``, which turns 0-d into shape (1,).
    """
    return cuda.to_device(np.asarray(a, order="C"))


def to_host(d):
    """A new host ndarray with the contents of device array ``d``."""
    return d.copy_to_host()
