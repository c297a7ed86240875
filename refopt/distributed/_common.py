"""Shared pieces of refopt.distributed: partitions, agreement on errors, the elementwise list."""

from __future__ import annotations

import numpy as np

__all__ = ["ELEMENTWISE", "PER_TENSOR", "DistributedError", "agree", "bounds"]

#: Optimizers whose update (after clipping) is elementwise given per-step scalars: a slice
#: of a flat buffer is updated exactly as the whole. Lamb and Adafactor reduce per tensor.
ELEMENTWISE = ("Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad", "Adadelta",
               "Adamax", "Nadam", "Lion", "RAdam", "ASGD", "Rprop", "Ftrl")

#: Optimizers whose update reduces over each tensor (Lamb's trust-ratio norms, Adafactor's
#: factored moments, update RMS and parameter scale): sharded a whole tensor per rank, so
#: every reduction is the single-process one.
PER_TENSOR = ("Lamb", "Adafactor")

_TYPES = {"TypeError": TypeError, "ValueError": ValueError, "KeyError": KeyError,
          "OverflowError": OverflowError, "FileNotFoundError": FileNotFoundError,
          "NotImplementedError": NotImplementedError}


class DistributedError(RuntimeError):
    """A collective step that failed on some rank for a reason outside refopt's checks."""


def bounds(total, size):
    """``size + 1`` boundaries of the balanced contiguous partition of ``total`` elements:
    rank ``r`` owns ``[b[r], b[r + 1])`` (the first ``total % size`` ranks one more)."""
    return [(total * r) // size for r in range(size + 1)]


def agree(comm, error):
    """Make every rank raise the same error if any rank has one (a collective).

    Parameters
    ----------
    comm : Communicator
    error : BaseException or None
        This rank's error (caught before anything was written), or None.

    Raises
    ------
    TypeError, ValueError, KeyError, ...
        On every rank, the type of the lowest failing rank's error (``DistributedError`` for
        types not listed), its message prefixed with that rank and the list of failing ranks.
    """
    mine = None if error is None else (type(error).__name__, str(error))
    reports = comm.allgather_obj(mine)
    failed = [r for r, rep in enumerate(reports) if rep is not None]
    if not failed:
        return
    name, msg = reports[failed[0]]
    others = "" if len(failed) == 1 else f" (ranks {failed} failed; the first is shown)"
    raise _TYPES.get(name, DistributedError)(f"rank {failed[0]}: {name}: {msg}{others}")


def check_micro_batches(micro_batches, size):
    """``micro_batches`` as an int K that ``size`` divides; ValueError otherwise."""
    if (not isinstance(micro_batches, (int, np.integer)) or isinstance(micro_batches, bool)
            or micro_batches < 1):
        raise ValueError("`micro_batches` must be an int >= 1. Received: "
                         f"micro_batches={micro_batches!r}")
    if micro_batches % size:
        raise ValueError(
            f"`micro_batches` must be a multiple of the number of ranks ({size}) so that every "
            f"rank computes the same number of micro-batches. Received: "
            f"micro_batches={micro_batches!r}")
    return int(micro_batches)
