"""Row-wise Adagrad for ``backend="cuda"``: the reference's functions, computed on the host.

FBGEMM's row-wise Adagrad has no device rule yet (its per-row sum of squares is a reduction
the element rules do not express); ``RowWiseAdagrad(backend="cuda")`` takes the host step
(a ``HostStepWarning``), and these mirrors are :mod:`refopt.reference.rowwise_adagrad`'s own
functions (host arrays in, new host arrays out, the same numbers).
"""

from __future__ import annotations

from refopt.reference.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
    rowwise_adagrad_rows,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)

__all__ = ["RowWiseAdagradResult", "rowwise_adagrad_initial_state", "rowwise_adagrad_rows",
           "rowwise_adagrad_sequential_update", "rowwise_adagrad_update"]
