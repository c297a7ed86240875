"""Row-sharded embedding tables: rows owned by ``row mod R``, sparse updates by their owners."""

from __future__ import annotations

import numpy as np

from refopt.distributed._common import (
    agree,
    check_micro_batches,
    config_settings,
    config_text,
    crc32,
    current_learning_rate,
    qualified_name,
    rebuild,
    shown,
)
from refopt.distributed.comm import get_comm
from refopt.executors import plan as _plan
from refopt.indexed_slices import IndexedSlices

__all__ = ["ShardedEmbedding"]


class ShardedEmbedding:
    """An embedding table whose rows are spread over the ranks (row ``i`` on rank ``i mod R``).

    Each rank keeps its rows (global rows ``r, r + R, r + 2R, ...``) as a local table of
    ``ceil((V - r) / R)`` rows and a local lazy optimizer built on it, so table and state
    memory per rank are ``1/R`` of the whole.

    One step (:meth:`apply_gradients`): every rank's micro-batch ``IndexedSlices`` (rank
    ``r`` computes micro-batches ``r K / R .. (r + 1) K / R - 1``) are checked on every rank
    before anything moves, then each entry goes to the owner of its row (all-to-all). An
    owner receives its entries in the global order (micro-batch, then position in it) and
    applies one ``IndexedSlices`` step: duplicates are summed in that order, as the
    single-process step on the concatenation of the K micro-batch gradients does, so the
    table and every slot are bit-identical to it for any R.

    Every rank must construct it with the same optimizer (class, configuration,
    ``iterations``, weight-decay exclusion of the table), table and ``micro_batches``: this is
    checked at construction (a CRC-32 of the table), and the learning rate, configuration and
    ``iterations`` of :attr:`optimizer` again at every step (change them, e.g. the learning
    rate, on every rank alike).

    Parameters
    ----------
    optimizer : refopt.Optimizer
        Unbuilt, one of refopt's own optimizers (not a subclass) that update only the rows of
        a sparse gradient under its convention: ``LazyAdam`` (every convention),
        ``RowWiseAdagrad`` (``exact=True``; its approximate form is not lazy and is
        refused), ``Adagrad`` (every convention but optax's; not PyTorch's with
        ``weight_decay``, which refuses sparse gradients),
        ``Ftrl`` and ``Adadelta`` (``keras2``, ``tf1``), ``Adamax`` (``keras2``), ``SGD``,
        ``ProximalAdagrad`` and ``ProximalGradientDescent`` (``tf1``). Its class,
        hyperparameters, learning rate (a schedule object is shared, not copied),
        ``iterations`` and weight-decay exclusion of ``table`` are used; it is not stepped
        itself (:attr:`optimizer` is the local one). ``clipvalue`` and EMA are applied by
        the owners; norm clipping is refused.
    table : ndarray, shape (V, D), float32 or float64
        The initial table, the same on every rank; only this rank's rows are kept (copied).
    micro_batches : int
        K, a multiple of R.
    comm : Communicator, mpi4py communicator or None

    Raises
    ------
    TypeError
        Not an unbuilt lazy refopt optimizer of those classes, or a configuration whose
        sparse step refuses (a trial step on a one-row copy runs at construction); a table
        that is not a 2-d float ndarray.
    ValueError
        A bad ``micro_batches``; settings that differ between ranks (on every rank, naming
        each setting that differs and the ranks holding each value).
    NotImplementedError
        ``clipnorm`` or ``global_clipnorm`` (a norm over every rank's raw rows).

    Attributes
    ----------
    optimizer : refopt.Optimizer
        This rank's local optimizer, built on its rows (its slots have the local shapes).
    """

    def __init__(self, optimizer, table, *, micro_batches, comm=None):
        import refopt
        from refopt.optimizers.base import Optimizer

        self.comm = comm = get_comm(comm)
        error, settings = None, None
        try:
            if not isinstance(optimizer, Optimizer) or optimizer.built:
                raise TypeError("`optimizer` must be an unbuilt refopt optimizer. Received: "
                                f"optimizer={optimizer!r}")
            cls = type(optimizer)
            if cls is not getattr(refopt, cls.__name__, None):
                raise TypeError(
                    f"{qualified_name(cls)} is not sharded: only refopt's own lazy optimizers "
                    "are (their sparse updates are known to touch only their rows; a subclass "
                    f"may change that). Received: optimizer={qualified_name(cls)}")
            if not optimizer._is_lazy():
                raise TypeError(
                    f"{cls.__name__} under convention="
                    f"{optimizer.convention.name!r} does not update only the rows of a sparse "
                    "gradient; a row-sharded table needs a lazy optimizer (LazyAdam). "
                    f"Received: optimizer={cls.__name__}")
            if _plan.clip_kind(optimizer)[0] in ("norm", "global", "several"):
                raise NotImplementedError(
                    "Norm clipping of a row-sharded table is not supported yet (clipvalue is). "
                    f"Received: clipnorm={optimizer.clipnorm!r}, "
                    f"global_clipnorm={optimizer.global_clipnorm!r}")
            if (not isinstance(table, np.ndarray) or table.ndim != 2
                    or table.dtype not in (np.float32, np.float64)):
                raise TypeError(
                    "`table` must be a 2-d float32 or float64 numpy.ndarray. Received: "
                    f"{type(table).__name__}"
                    + (f" shape={table.shape} dtype={table.dtype}"
                       if isinstance(table, np.ndarray) else ""))
            self.micro_batches = check_micro_batches(micro_batches, comm.size)
            R, r, K = comm.size, comm.rank, self.micro_batches
            self.shape = table.shape
            self.dtype = table.dtype
            self.rows = np.arange(r, table.shape[0], R, dtype=np.int64)  # global ids of mine
            self.local = np.ascontiguousarray(table[self.rows])
            excluded = id(table) in optimizer._exclude_ids
            # a sparse step this configuration refuses (e.g. PyTorch's sparse Adagrad with
            # weight decay) is refused here, on every rank, not by some owners mid-step
            probe, row = rebuild(optimizer, optimizer.iterations), np.zeros((1,) + table.shape[1:],
                                                                             table.dtype)
            if excluded:
                probe.exclude_from_weight_decay([row])
            probe.apply_gradients([(IndexedSlices(row.copy(), np.zeros(1, np.int64), row.shape),
                                    row)])
            self.optimizer = rebuild(optimizer, optimizer.iterations)
            if excluded:
                self.optimizer.exclude_from_weight_decay([self.local])
            self.optimizer.build([self.local])
            self.micro_batch_ids = list(range(r * K // R, (r + 1) * K // R))
            settings = {
                "optimizer class": qualified_name(cls),
                **self._step_settings(per_key=True),
                "table excluded from weight decay": str(excluded),
                "micro_batches": str(K),
                "table (shape, dtype, CRC-32 of the values)": shown(
                    (table.shape, table.dtype.str, crc32(np.ascontiguousarray(table)))),
            }
        except Exception as exc:  # noqa: BLE001 - any error of one rank is every rank's
            error = exc
        agree(comm, error, settings, "The ShardedEmbedding's settings")

    def _step_settings(self, per_key=False):
        """What must be the same on every rank at each step: :attr:`optimizer`'s
        configuration (one entry per key, or one digest: cheaper at every step), ``iterations``
        and learning rate now (a schedule evaluated; may raise ValueError)."""
        opt = self.optimizer
        config = (config_settings(opt) if per_key else
                  {"configuration": shown(config_text(opt))})
        return {**config, "iterations": str(opt.iterations),
                "learning rate now": repr(current_learning_rate(opt, opt.iterations))}

    @property
    def iterations(self):
        """int: the steps applied."""
        return self.optimizer.iterations

    def _check_indices(self, indices, what):
        idx = np.asarray(indices)
        if idx.dtype.kind not in "iu" or idx.ndim != 1:
            raise TypeError(f"`{what}` must be a 1-d integer array. Received: dtype={idx.dtype}, "
                            f"shape={idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.shape[0]):
            raise ValueError(f"`{what}` must lie in [0, {self.shape[0]}). Received: min="
                             f"{idx.min()}, max={idx.max()}")
        return idx.astype(np.int64, copy=False)

    def _route(self, owner_of, arrays):
        """Send ``arrays`` (same length, rows grouped by ``owner_of`` in a stable sort) to
        their owners; returns what this rank receives, in rank order, and the send order."""
        comm, R = self.comm, self.comm.size
        order = np.argsort(owner_of, kind="stable")
        counts = np.bincount(owner_of, minlength=R).astype(np.int64)
        recv_counts = np.array(comm.allgather_obj(counts.tolist()), np.int64)[:, comm.rank]
        out = []
        for a in arrays:
            a = np.ascontiguousarray(a[order])
            width = int(np.prod(a.shape[1:]))
            recv = np.empty((int(recv_counts.sum()),) + a.shape[1:], a.dtype)
            comm.alltoallv(a.reshape(-1), counts * width, recv.reshape(-1), recv_counts * width)
            out.append(recv)
        return out, order, counts, recv_counts

    def lookup(self, indices):
        """The rows ``table[indices]`` this rank's batch needs, gathered from their owners
        (a collective: every rank calls it, with its own indices).

        Parameters
        ----------
        indices : 1-d int array
            Rows in ``[0, V)``, repeats allowed.

        Returns
        -------
        ndarray, shape (len(indices), D)

        Raises
        ------
        TypeError, ValueError
            Bad indices on any rank (on every rank, nothing exchanged).
        """
        error = None
        try:
            idx = self._check_indices(indices, "indices")
        except (TypeError, ValueError) as exc:
            error = exc
        agree(self.comm, error)
        R = self.comm.size
        (asked,), order, counts, recv_counts = self._route(idx % R, [idx])
        answer = self.local[asked // R]
        # send the rows back: the answer to rank s is the block of what s asked
        back = np.empty((idx.size, self.shape[1]), self.dtype)
        self.comm.alltoallv(answer.reshape(-1), recv_counts * self.shape[1], back.reshape(-1),
                            counts * self.shape[1])
        out = np.empty_like(back)
        out[order] = back
        return out

    def apply_gradients(self, micro_grads):
        """One step from this rank's micro-batch gradients (a collective).

        :attr:`optimizer`'s configuration, learning rate and ``iterations`` are compared
        across ranks first (they may change between steps, alike on every rank).

        Parameters
        ----------
        micro_grads : list of IndexedSlices
            One per micro-batch of :attr:`micro_batch_ids`, in that order, each with
            ``dense_shape == (V, D)`` and the table's dtype (no entries is fine).

        Returns
        -------
        int
            ``iterations`` after the step.

        Raises
        ------
        TypeError, ValueError
            On every rank, naming the rank with bad input; nothing has changed anywhere.
        """
        error, settings = None, None
        try:
            m = len(self.micro_batch_ids)
            if not isinstance(micro_grads, (list, tuple)) or len(micro_grads) != m:
                raise ValueError(f"`micro_grads` must be a list of {m} IndexedSlices (micro-"
                                 f"batches {self.micro_batch_ids}). Received: "
                                 f"{type(micro_grads).__name__}")
            for j, g in enumerate(micro_grads):
                if not isinstance(g, IndexedSlices):
                    raise TypeError(f"micro_grads[{j}] must be an IndexedSlices. Received: "
                                    f"{type(g).__name__}")
                if tuple(g.dense_shape) != self.shape or g.dtype != self.dtype:
                    raise ValueError(
                        f"micro_grads[{j}] must have dense_shape={self.shape} and dtype="
                        f"{self.dtype}. Received: dense_shape={tuple(g.dense_shape)}, "
                        f"dtype={g.dtype}")
                self._check_indices(g.indices, f"micro_grads[{j}].indices")
            settings = self._step_settings()
        except (TypeError, ValueError) as exc:
            error = exc
        agree(self.comm, error, settings, "The ShardedEmbedding's step settings")
        R = self.comm.size
        if micro_grads:
            idx = np.concatenate([np.asarray(g.indices, np.int64) for g in micro_grads])
            vals = np.concatenate([g.values.reshape(len(g.indices), self.shape[1])
                                   for g in micro_grads])
        else:
            idx, vals = np.zeros(0, np.int64), np.zeros((0, self.shape[1]), self.dtype)
        (ridx, rvals), *_ = self._route(idx % R, [idx, vals])
        grad = IndexedSlices(rvals, ridx // R, self.local.shape)
        self.optimizer.apply_gradients([(grad, self.local)])
        return self.optimizer.iterations

    def gather_table(self, slot=None):
        """The whole table (or slot ``slot`` of it, e.g. ``"m"``, ``"average"``,
        RowWiseAdagrad's ``"accumulator"``) on every rank (a collective, for checks and
        export).

        Returns
        -------
        ndarray
            ``(V, D)`` for the table; for a slot, ``(V,) + `` the shape of a row of the slot
            (``(V, D)``, or ``(V,)`` for a per-row slot such as RowWiseAdagrad's
            accumulator), in the slot's dtype.

        Raises
        ------
        KeyError
            An unknown slot (on every rank).
        """
        error = None
        src = self.local
        if slot is not None:
            try:
                src = self.optimizer.get_slot(self.local, slot)
            except KeyError as exc:
                error = exc
        agree(self.comm, error)
        R, V = self.comm.size, self.shape[0]
        row_shape = src.shape[1:]  # a slot's own: (D,) or () for a per-row accumulator
        width = int(np.prod(row_shape))
        counts = np.array([len(range(r, V, R)) for r in range(R)], np.int64)
        recv = np.empty(V * width, src.dtype)
        self.comm.allgatherv(np.ascontiguousarray(src).reshape(-1), recv, counts * width)
        out = np.empty((V,) + row_shape, src.dtype)
        start = 0
        for r in range(R):
            n = int(counts[r])
            out[r::R] = recv[start * width:(start + n) * width].reshape((n,) + row_shape)
            start += n
        return out
