"""Distributed training over MPI, bit-identical to one process for any number of ranks.

- :class:`ShardedOptimizer`: data parallelism with sharded optimizer state (ZeRO-1): a
  slice of the flattened parameters per rank for elementwise optimizers, whole tensors per
  rank for Lamb, Adafactor and PyTorch-formula norm clipping;
  ``mode="exact"`` sums the K micro-batch gradients of a step in micro-batch order whatever
  the number of ranks R (R divides K), so every R gives the single-process bits;
  ``mode="fast"`` pre-sums on each rank (reproducible for a given R).
- :class:`ShardedEmbedding`: a table row-sharded by ``row mod R`` with a lazy sparse
  optimizer (LazyAdam, RowWiseAdagrad, Adagrad, ...), sparse gradients routed to the owners
  and summed in the global order, and lookups.
- :mod:`refopt.distributed.comm`: the engine interface (:class:`Communicator`), MPI through
  ``mpi4py`` (:class:`MPIComm`, ``pip install "refopt[mpi]"``) and one process
  (:class:`SelfComm`).

Every rank must construct the same objects with the same optimizer, variables and settings
(checked: a difference raises the same ValueError on every rank).
Every call here is a collective: every rank makes the same calls in the same order. Run a
script with ``mpiexec -n R python -m mpi4py script.py`` (``-m mpi4py`` aborts every rank when
one raises an exception outside refopt's collectives, instead of leaving the others waiting).
"""

from refopt.distributed._common import (
    ELEMENTWISE,
    PER_TENSOR,
    DistributedError,
    ShardedCheckpointError,
)
from refopt.distributed.comm import Communicator, MPIComm, SelfComm, get_comm
from refopt.distributed.embedding import ShardedEmbedding
from refopt.distributed.zero import MODES, ShardedOptimizer

__all__ = ["ELEMENTWISE", "MODES", "PER_TENSOR", "Communicator", "DistributedError", "MPIComm",
           "SelfComm", "ShardedCheckpointError", "ShardedEmbedding", "ShardedOptimizer",
           "get_comm"]
