"""Checks shared by the pipeline and the executors (the bottom of ``refopt.optimizers``).

Imports nothing of the package above it, so ``base.py`` (the pipeline) and the executors
(``_fast.py``, ``_cuda.py``) can all use it without an import cycle.
"""

from __future__ import annotations

__all__ = ["unpack_pairs"]

#: tf-keras' ``iterations`` is an int64.
_INT64_MAX = 2**63 - 1


def unpack_pairs(grads_and_vars):
    """``grads_and_vars`` as a list of ``(grad, var)`` tuples, or a TypeError naming the position."""
    pairs = []
    for i, pair in enumerate(grads_and_vars):
        try:
            grad, var = pair
        except (TypeError, ValueError):
            raise TypeError(
                "`grads_and_vars` must be an iterable of (gradient, variable) pairs. "
                f"Received at position {i}: {type(pair).__name__}"
            ) from None
        pairs.append((grad, var))
    return pairs
