"""The communication engines behind :mod:`refopt.distributed`: one small interface, MPI built.

The distributed layer only moves data and decides who computes what; everything it needs from
an engine is the collectives of :class:`Communicator`. Two engines are here:

- :class:`MPIComm`: MPI through ``mpi4py`` (``pip install "refopt[mpi]"`` brings ``mpi4py``
  and the ``mpich`` wheel, so no system MPI is needed); run with ``mpiexec -n R python ...``.
  NumPy buffers move with the upper-case, buffer-based calls (``Alltoallv``, ``Allgatherv``),
  never pickled; only small metadata (error reports, norm partial sums, manifests) goes
  through the pickling lower-case calls.
- :class:`SelfComm`: one process, no MPI: the same code path with ``R = 1`` (what
  ``mpiexec -n 1`` would do), for single-process use and tests.

Every collective is called by every rank in the same order (MPI's rule); the layers above
never branch on data that only one rank has before a collective.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Communicator", "MPIComm", "SelfComm", "get_comm"]


class Communicator:
    """What :mod:`refopt.distributed` needs from an engine (subclass it to add one).

    Attributes
    ----------
    rank : int
        This process's rank, ``0 <= rank < size``.
    size : int
        The number of ranks ``R``.
    engine : str
        The engine's name (``"mpi"``, ``"self"``).
    """

    rank = 0
    size = 1
    engine = None

    def allgather_obj(self, obj):
        """Every rank's ``obj`` (small, picklable), as a list in rank order, on every rank."""
        raise NotImplementedError

    def bcast_obj(self, obj, root=0):
        """``root``'s ``obj`` on every rank."""
        raise NotImplementedError

    def alltoallv(self, send, send_counts, recv, recv_counts):
        """Exchange blocks of 1-D arrays: ``send[block d]`` (``send_counts[d]`` elements, blocks
        back to back in rank order) goes to rank ``d``; rank ``s``'s block for this rank lands
        in ``recv`` at the sum of ``recv_counts[:s]``. ``send`` and ``recv`` have one dtype."""
        raise NotImplementedError

    def allgatherv(self, send, recv, counts):
        """``recv`` (1-D) becomes every rank's ``send`` back to back in rank order
        (``counts[s]`` elements from rank ``s``)."""
        raise NotImplementedError

    def barrier(self):
        """Wait until every rank is here."""
        raise NotImplementedError

    def abort(self, code=1):
        """End every rank now with exit status ``code`` (for an error only this rank has,
        outside the checked collectives, which would otherwise leave the others waiting)."""
        raise NotImplementedError


def _displacements(counts):
    counts = np.asarray(counts, np.int64)
    displ = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=displ[1:])
    return displ


class SelfComm(Communicator):
    """One process, no MPI: every collective is a copy (``R = 1``)."""

    engine = "self"

    def allgather_obj(self, obj):
        return [obj]

    def bcast_obj(self, obj, root=0):
        return obj

    def alltoallv(self, send, send_counts, recv, recv_counts):
        n = int(send_counts[0])
        recv[:n] = send[:n]

    def allgatherv(self, send, recv, counts):
        recv[: int(counts[0])] = send

    def barrier(self):
        pass

    def abort(self, code=1):
        pass  # one process: the caller's exception ends it


_MPI_TYPES = {}


class MPIComm(Communicator):
    """MPI through ``mpi4py``.

    Parameters
    ----------
    comm : mpi4py.MPI.Comm or None
        The communicator; ``None``: ``MPI.COMM_WORLD``.

    Raises
    ------
    ImportError
        ``mpi4py`` is not installed (``pip install "refopt[mpi]"``).

    Notes
    -----
    Element counts go to MPI as C ints: one block of one collective must stay under
    ``2**31`` elements (a 4e6 x 64 table's shard is far below it).
    """

    engine = "mpi"

    def __init__(self, comm=None):
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "refopt.distributed's MPI engine needs mpi4py and an MPI library: "
                'pip install "refopt[mpi]" (mpi4py and the mpich wheel).') from exc
        self._MPI = MPI
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()

    def _type(self, dtype):
        return self._MPI._typedict[np.dtype(dtype).char]

    def allgather_obj(self, obj):
        return self.comm.allgather(obj)

    def bcast_obj(self, obj, root=0):
        return self.comm.bcast(obj, root=root)

    def alltoallv(self, send, send_counts, recv, recv_counts):
        t = self._type(send.dtype)
        sc = np.asarray(send_counts, np.int64)
        rc = np.asarray(recv_counts, np.int64)
        self.comm.Alltoallv([send, (sc, _displacements(sc)), t],
                            [recv, (rc, _displacements(rc)), t])

    def allgatherv(self, send, recv, counts):
        t = self._type(recv.dtype)
        c = np.asarray(counts, np.int64)
        self.comm.Allgatherv([send, t], [recv, (c, _displacements(c)), t])

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code=1):
        self.comm.Abort(code)


def get_comm(comm=None):
    """The engine for ``comm``.

    ``comm`` itself if it is a :class:`Communicator`; an ``mpi4py`` communicator wrapped in
    :class:`MPIComm`; ``None``: :class:`MPIComm` on ``COMM_WORLD`` when ``mpi4py`` imports
    (a process not started by ``mpiexec`` is then one rank), else :class:`SelfComm`.

    Raises
    ------
    TypeError
        ``comm`` is something else.
    """
    if isinstance(comm, Communicator):
        return comm
    if comm is None:
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return SelfComm()
        return MPIComm()
    try:
        from mpi4py import MPI
    except ImportError:
        MPI = None
    if MPI is not None and isinstance(comm, MPI.Comm):
        return MPIComm(comm)
    raise TypeError("`comm` must be a refopt.distributed.Communicator, an mpi4py "
                    f"communicator or None. Received: comm={comm!r}")
