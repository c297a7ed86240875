"""ZeRO-1 data parallelism: each rank owns a slice of the flat parameters and its state.

Exact mode (the default) is bit-identical to one process for any number of ranks R that
divides the number of micro-batches K; fast mode is reproducible for a given R only.
"""

from __future__ import annotations

import bisect
import zlib

import numpy as np

from refopt import schedules as _schedules
from refopt.distributed import norms as _norms
from refopt.distributed._common import ELEMENTWISE, agree, bounds, check_micro_batches
from refopt.distributed.comm import get_comm
from refopt.executors import plan as _plan

__all__ = ["MODES", "ShardedOptimizer"]

#: ``"exact"``: every micro-batch gradient slice goes to its owner, summed in micro-batch
#: order (the same numbers for any R). ``"fast"``: each rank pre-sums its micro-batches,
#: the owner adds the R partial sums in rank order (one reduce-scatter's volume; the
#: grouping, hence the rounding, depends on R).
MODES = ("exact", "fast")

_CLIP_KEYS = ("clipnorm", "clipvalue", "global_clipnorm")


#: Slice boundaries fall at a multiple of this many elements from the start of a tensor (or
#: at its end): vectorised frameworks treat a tensor's last ``numel % lanes`` elements as a
#: tail with other arithmetic (PyTorch's fused Adam: lanes of 32 bytes, its scalar tail
#: contracted differently), so a slice must not create a tail the whole tensor lacks. 64
#: is a multiple of every lane count (8 float32, 4 float64, 16 for 64-byte vectors).
ALIGN = 64


def aligned_bounds(offsets, size):
    """The ``size + 1`` slice boundaries of a flat buffer of tensors starting at ``offsets``
    (``offsets[-1]`` is the total): the balanced partition, each inner boundary moved down
    to a multiple of :data:`ALIGN` elements from the start of the tensor it falls in."""
    raw = bounds(offsets[-1], size)
    out = []
    for p in raw:
        k = bisect.bisect_right(offsets, p) - 1
        if 0 <= k < len(offsets) - 1:
            p = offsets[k] + ((p - offsets[k]) // ALIGN) * ALIGN
        out.append(p)
    return out


class _Group:
    """The variables of one dtype: their flat layout and this rank's slice ``[lo, hi)``."""

    def __init__(self, dtype, positions, variables, size, rank):
        self.dtype = dtype
        self.positions = positions
        self.sizes = [variables[i].size for i in positions]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64).tolist()
        self.total = self.offsets[-1]
        self.bounds = aligned_bounds(self.offsets, size)
        self.lo, self.hi = self.bounds[rank], self.bounds[rank + 1]
        # this rank's pieces: (variable position, start in the variable, start in the slice, n)
        self.pieces = []
        for k, i in enumerate(positions):
            a = max(self.offsets[k], self.lo)
            b = min(self.offsets[k + 1], self.hi)
            if b > a:
                self.pieces.append((i, a - self.offsets[k], a - self.lo, b - a))

    def counts(self):
        return [self.bounds[r + 1] - self.bounds[r] for r in range(len(self.bounds) - 1)]


class ShardedOptimizer:
    """Data parallelism with sharded optimizer state (ZeRO-1), bit-identical to one process.

    Wraps an unbuilt refopt optimizer (the single-process optimizer stays the unit of
    truth, as with Horovod's ``DistributedOptimizer`` and torch's
    ``ZeroRedundancyOptimizer``). Every rank holds the full variables; rank ``r`` owns, for
    each dtype, about ``1/R`` of the variables of that dtype flattened back to back in
    ``variables`` order, a contiguous slice (the balanced partition, each boundary moved
    down to a multiple of :data:`ALIGN` elements within its tensor), and only that
    slice's slots and EMA averages: a local optimizer built like ``optimizer`` runs on the
    pieces of the slice (1-d views of the variables) with the local executor.

    One step (:meth:`apply_gradients`): this rank's ``K / R`` micro-batch gradients (rank
    ``r`` computes micro-batches ``r K / R`` to ``(r + 1) K / R - 1``) are checked on every
    rank before anything moves; each micro-batch's gradient slice goes to its owner
    (all-to-all), which sums the K contributions **in micro-batch order**
    (``G = g_0; G = G + g_k`` for ``k = 1..K-1``, in the dtype; with ``reduction="mean"``
    then ``G / K``); norm clipping reduces each tensor's squares in NumPy's pairwise order
    across the owners (:mod:`refopt.distributed.norms`), giving the single-process norm;
    the owner clips, decays, updates and averages its slice; the updated slices are
    gathered back into every rank's variables.

    Parameters
    ----------
    optimizer : refopt.Optimizer
        Unbuilt; its class, hyperparameters, convention, backend (``"cpu"`` or
        ``"reference"``), ``iterations`` and weight-decay exclusions are used. It is not
        stepped itself. Its class must be elementwise (``ELEMENTWISE``: the Adam family,
        SGD, RMSprop, Adagrad, Adadelta, Adamax, Nadam, Lion, RAdam, ASGD, Rprop, Ftrl);
        Lamb and Adafactor reduce per tensor and are refused.
    variables : list of ndarray
        The model's variables, float32 or float64 (float16 without norm clipping),
        C-contiguous, writeable, the same shapes, dtypes and values on every rank (checked
        with a CRC-32 at construction).
    micro_batches : int
        K, the micro-batches of one global step; a multiple of R.
    comm : Communicator, mpi4py communicator or None
        The engine (:func:`refopt.distributed.comm.get_comm`).
    mode : {"exact", "fast"}
        See :data:`MODES`; :attr:`mode` says which is in use.
    reduction : {"sum", "mean"}
        The gradient of a step: the sum of the K micro-batch gradients, or that sum / K.

    Raises
    ------
    TypeError
        ``optimizer`` is not an unbuilt elementwise refopt optimizer; a variable is not a
        float ndarray.
    ValueError
        A bad ``micro_batches``, ``mode`` or ``reduction``; variables that differ between
        ranks (shape, dtype or value); a C-contiguity or writeability problem.
    NotImplementedError
        Norm clipping with PyTorch's formula or Keras 2's several clips in sequence (their
        reductions are not split yet), or with float16 variables; Nadam over several dtypes
        (its momentum product takes the first variable's dtype).

    Notes
    -----
    Memory: each rank keeps ``1/R`` of the slots and averages (:meth:`state_nbytes`).
    Communication per rank and step, N elements of gradient: exact mode sends
    ``(K/R) N (R-1)/R`` and receives as much; fast mode ``N (R-1)/R``; both gather
    ``N (R-1)/R`` parameters; norm clipping adds ``O(T log N + 256 T)`` numbers for T
    tensors. Every rank must call every method here in the same order (they are
    collectives).

    Examples
    --------
    Run with ``mpiexec -n 2 python train.py``::

        opt = refopt.Adam(learning_rate=1e-3, global_clipnorm=1.0, backend="cpu")
        dist = ShardedOptimizer(opt, variables, micro_batches=4)
        for step in range(steps):
            grads = [grad_fn(batch(step, k)) for k in dist.micro_batch_ids]
            dist.apply_gradients(grads)   # variables updated on every rank
    """

    def __init__(self, optimizer, variables, *, micro_batches, comm=None, mode="exact",
                 reduction="sum"):
        from refopt.optimizers.base import Optimizer

        self.comm = comm = get_comm(comm)
        error = None
        try:
            if not isinstance(optimizer, Optimizer):
                raise TypeError("`optimizer` must be a refopt optimizer. Received: "
                                f"optimizer={optimizer!r}")
            if optimizer.built:
                raise ValueError("`optimizer` must not be built yet (its state is sharded). "
                                 f"Received: optimizer={optimizer!r} (built)")
            name = type(optimizer).__name__
            if name not in ELEMENTWISE:
                raise TypeError(
                    f"{name} is not sharded: its update is not known to be elementwise "
                    f"(Lamb and Adafactor reduce per tensor). Sharded optimizers: "
                    f"{', '.join(ELEMENTWISE)}. Received: optimizer={name}")
            if mode not in MODES:
                raise ValueError(f"`mode` must be one of {MODES}. Received: mode={mode!r}")
            if reduction not in ("sum", "mean"):
                raise ValueError("`reduction` must be 'sum' or 'mean'. Received: "
                                 f"reduction={reduction!r}")
            self.micro_batches = check_micro_batches(micro_batches, comm.size)
            variables = optimizer._check_var_list(variables, "variables")
            kind, _ = _plan.clip_kind(optimizer)
            if kind == "several":
                raise NotImplementedError(
                    f"convention={optimizer.convention.name!r} with several clips in "
                    "sequence is not sharded yet; set one of clipvalue, clipnorm, "
                    "global_clipnorm.")
            if kind in ("norm", "global"):
                if optimizer.convention.clip_formula == "torch":
                    raise NotImplementedError(
                        "Norm clipping with PyTorch's formula is not sharded yet (its sum "
                        "runs lanes across the whole tensor). Received: "
                        f"convention={optimizer.convention.name!r}")
                if any(v.dtype == np.float16 for v in variables):
                    raise NotImplementedError(
                        "Norm clipping over float16 variables is not sharded yet.")
            dtypes = list(dict.fromkeys(v.dtype for v in variables))
            if name == "Nadam" and len(dtypes) > 1:
                raise NotImplementedError(
                    "Nadam over variables of several dtypes is not sharded (its momentum "
                    f"product takes the first variable's dtype). Received dtypes {dtypes}")
        except (TypeError, ValueError, NotImplementedError) as exc:
            error = exc
        agree(comm, error)
        specs = [(v.shape, v.dtype.str, zlib.crc32(memoryview(v).cast("B"))) for v in variables]
        agree(comm, None if len(set(map(repr, comm.allgather_obj(specs)))) == 1 else ValueError(
            "`variables` differ between ranks (shape, dtype or values; every rank must start "
            "from the same variables)."))
        self.mode = mode
        self.reduction = reduction
        self.variables = variables
        self.optimizer = optimizer
        self._clip_kind = kind
        self.iterations = optimizer.iterations
        R, K = comm.size, self.micro_batches
        self.micro_batch_ids = list(range(comm.rank * K // R, (comm.rank + 1) * K // R))
        self.groups = [_Group(dt, [i for i, v in enumerate(variables) if v.dtype == dt],
                              variables, R, comm.rank) for dt in dtypes]
        self._build_local(optimizer.iterations)

    # ------------------------------------------------------------------ local optimizer
    def _build_local(self, iterations):
        proto = self.optimizer
        config = dict(proto.get_config())
        for key in _CLIP_KEYS:  # clipping happens here, on the whole gradient's numbers
            config[key] = None
        local = type(proto).from_config(config)
        local.iterations = iterations
        pieces, owners = [], []
        for grp in self.groups:
            for i, start, _, n in grp.pieces:
                pieces.append(self.variables[i].reshape(-1)[start:start + n])
                owners.append(i)
        excluded = [p for p, i in zip(pieces, owners) if id(self.variables[i]) in
                    proto._exclude_ids]
        if excluded:
            local.exclude_from_weight_decay(excluded)
        if pieces:
            local.build(pieces)
        self.local = local
        self.pieces = pieces

    @property
    def slot_names(self):
        """tuple of str: the slots (and ``"average"`` with EMA) of the wrapped optimizer."""
        return self.local.slot_names

    def state_nbytes(self):
        """int: bytes of optimizer state (slots and EMA averages) held by this rank."""
        if not self.pieces:
            return 0
        return sum(self.local.get_slot(p, name).nbytes
                   for p in self.pieces for name in self.local.slot_names)

    # ------------------------------------------------------------------ the step
    def _check(self, micro_grads):
        m = len(self.micro_batch_ids)
        if not isinstance(micro_grads, (list, tuple)) or len(micro_grads) != m:
            raise ValueError(
                f"`micro_grads` must be a list of this rank's {m} micro-batch gradients (one "
                f"list per micro-batch id {self.micro_batch_ids}). Received: "
                f"{type(micro_grads).__name__}"
                + (f" of length {len(micro_grads)}" if hasattr(micro_grads, '__len__') else ""))
        n = len(self.variables)
        for j, grads in enumerate(micro_grads):
            if not isinstance(grads, (list, tuple)) or len(grads) != n:
                raise ValueError(
                    f"micro_grads[{j}] must be a list of {n} gradients (one per variable). "
                    f"Received: {type(grads).__name__}"
                    + (f" of length {len(grads)}" if hasattr(grads, '__len__') else ""))
            for i, (g, v) in enumerate(zip(grads, self.variables)):
                if type(g) is not np.ndarray:
                    raise TypeError(
                        f"micro_grads[{j}][{i}] must be a dense numpy.ndarray (None and "
                        "IndexedSlices are not sharded; use ShardedEmbedding for tables). "
                        f"Received: {type(g).__name__}")
                if g.shape != v.shape or g.dtype != v.dtype:
                    raise ValueError(
                        f"micro_grads[{j}][{i}] must have its variable's shape {v.shape} "
                        f"and dtype {v.dtype}. Received: shape={g.shape}, dtype={g.dtype}")
        proto = self.optimizer
        if isinstance(proto._learning_rate, _schedules.LearningRateSchedule):
            proto._evaluate_schedule(proto._learning_rate, self.iterations)  # may raise

    def _reduce(self, grp, micro_grads):
        """This rank's slice of the step's gradient, summed in the mode's fixed order."""
        comm, R = self.comm, self.comm.size
        dt = grp.dtype
        rows = [[g[i].reshape(-1) for i in grp.positions] for g in micro_grads]
        if self.mode == "fast":  # pre-sum this rank's micro-batches, left to right
            total = [r.copy() for r in rows[0]]
            for r in rows[1:]:
                for t, x in zip(total, r):
                    np.add(t, x, out=t)
            rows = [total]
        m = len(rows)
        counts = grp.counts()
        send = np.empty(m * grp.total, dt)
        pos = 0
        for d in range(R):  # block for rank d: its slice of each micro-batch, in order
            lo_d, hi_d = grp.bounds[d], grp.bounds[d + 1]
            for flat in rows:
                for k in range(len(grp.positions)):
                    a = max(grp.offsets[k], lo_d)
                    b = min(grp.offsets[k + 1], hi_d)
                    if b > a:
                        send[pos:pos + b - a] = flat[k][a - grp.offsets[k]:b - grp.offsets[k]]
                        pos += b - a
        mine = grp.hi - grp.lo
        recv = np.empty(R * m * mine, dt)
        comm.alltoallv(send, [m * c for c in counts], recv, [m * mine] * R)
        recv = recv.reshape(R * m, mine)  # rows in micro-batch (exact) or rank (fast) order
        total = recv[0].copy()
        for k in range(1, recv.shape[0]):
            np.add(total, recv[k], out=total)
        if self.reduction == "mean":
            np.divide(total, dt.type(self.micro_batches), out=total)
        return total

    def _clip(self, totals):
        """Clip every group's slice in place as the single-process step would."""
        proto = self.optimizer
        kind, _ = _plan.clip_kind(proto)
        if kind is None:
            return
        if kind == "value":
            for grp, total in zip(self.groups, totals):
                c = _plan.clip_arrays(proto, grp.dtype, 0)[3]
                np.maximum(np.minimum(total, c), -c, out=total)
            return
        half = kind == "global" and proto.convention.clip_formula == "tf"
        parts = []
        for grp, total in zip(self.groups, totals):
            per = []
            for k in range(len(grp.positions)):
                a = max(grp.offsets[k], grp.lo)
                b = min(grp.offsets[k + 1], grp.hi)
                piece = total[a - grp.lo:b - grp.lo] if b > a else total[:0]
                with np.errstate(all="ignore"):
                    terms = piece * piece
                    if half:
                        terms = terms * grp.dtype.type(0.5)
                per.append(_norms.local_parts(terms, max(a - grp.offsets[k], 0),
                                              grp.sizes[k]))
            parts.append(per)
        everyone = self.comm.allgather_obj(parts)
        sums = [np.array([_norms.combine_parts([rank_parts[g][k] for rank_parts in everyone],
                                               grp.sizes[k], grp.dtype)
                          for k in range(len(grp.positions))], grp.dtype)
                for g, grp in enumerate(self.groups)]
        gnorm = None
        if half:
            if len(self.groups) > 1:  # checked before any data moved, see apply_gradients
                raise AssertionError
            dt = self.groups[0].dtype
            with np.errstate(all="ignore"):
                gnorm = np.sqrt(np.sum(sums[0], dtype=dt) * dt.type(2.0))
        for grp, total, s in zip(self.groups, totals, sums):
            cmode, cden, cscale, cv = _plan.clip_arrays(proto, grp.dtype, len(s), s, gnorm)
            with np.errstate(all="ignore"):
                for k in range(len(grp.positions)):
                    a = max(grp.offsets[k], grp.lo)
                    b = min(grp.offsets[k + 1], grp.hi)
                    if b <= a:
                        continue
                    x = total[a - grp.lo:b - grp.lo]
                    mode = int(cmode[k])
                    if mode == 2:
                        np.divide(x * cv, cden[k], out=x)
                    elif mode == 3:
                        np.multiply(x, cscale[k], out=x)
                    elif mode == 4:
                        np.multiply(x / cden[k], cv, out=x)

    def apply_gradients(self, micro_grads):
        """One global step from this rank's micro-batch gradients (a collective).

        Parameters
        ----------
        micro_grads : list of list of ndarray
            For each of this rank's micro-batches (:attr:`micro_batch_ids`, in that order),
            one dense gradient per variable, with its variable's shape and dtype.

        Returns
        -------
        int
            ``iterations`` after the step.

        Raises
        ------
        TypeError, ValueError
            On every rank, naming the rank whose input is bad (a missing or extra
            micro-batch, a gradient of another shape, dtype or type, a schedule that gives
            a bad learning rate; TensorFlow's mixed-dtype refusal of a global norm). Raised
            before any data moves: no variable or state has changed on any rank.
        """
        error = None
        try:
            self._check(micro_grads)
            if (self._clip_kind == "global" and len(self.groups) > 1
                    and self.optimizer.convention.clip_formula == "tf"):
                raise TypeError(
                    "All gradients of a global norm must have the same dtype (TensorFlow "
                    "refuses to stack mixed dtypes). Received dtypes "
                    f"{sorted(g.dtype.name for g in self.groups)}")
        except (TypeError, ValueError, KeyError) as exc:
            error = exc
        agree(self.comm, error)
        with np.errstate(all="ignore"):
            totals = [self._reduce(grp, micro_grads) for grp in self.groups]
        self._clip(totals)
        grads = []
        for grp, total in zip(self.groups, totals):
            for _, _, s, n in grp.pieces:
                grads.append(total[s:s + n])
        if self.pieces:
            self.local.apply_gradients(list(zip(grads, self.pieces)))
        self._allgather_variables()
        self.iterations += 1
        return self.iterations

    def _allgather_variables(self):
        for grp in self.groups:
            self._allgather_flat(grp, [self.variables[i].reshape(-1) for i in grp.positions],
                                 self._group_pieces(grp))

    def _group_pieces(self, grp):
        """This rank's pieces (1-d views of the variables) of ``grp``, in slice order."""
        start = 0
        for g in self.groups:
            if g is grp:
                return self.pieces[start:start + len(grp.pieces)]
            start += len(g.pieces)
        raise KeyError(grp)

    def _allgather_flat(self, grp, outs, mine):
        """Gather the groups' slices (``mine``: this rank's pieces, in order) into ``outs``
        (one flat array per variable of the group)."""
        send = np.concatenate(mine) if mine else np.zeros(0, grp.dtype)
        recv = np.empty(grp.total, grp.dtype)
        self.comm.allgatherv(send, recv, grp.counts())
        for k, out in enumerate(outs):
            out[:] = recv[grp.offsets[k]:grp.offsets[k + 1]]

    def gather_slot(self, name):
        """The full slot ``name`` (or ``"average"``) of every variable, on every rank.

        A collective, for checks and export; the training step never gathers state.

        Returns
        -------
        list of ndarray
            One array per variable (its shape and dtype), in ``variables`` order.

        Raises
        ------
        KeyError
            An unknown slot name (on every rank).
        """
        error = None if name in self.local.slot_names else KeyError(
            f"Unknown slot {name!r}; this optimizer has {list(self.local.slot_names)}")
        agree(self.comm, error)
        out = [np.empty(v.shape, v.dtype) for v in self.variables]
        for grp in self.groups:
            mine = [self.local.get_slot(p, name) for p in self._group_pieces(grp)]
            self._allgather_flat(grp, [out[i].reshape(-1) for i in grp.positions], mine)
        return out

    def finalize_variable_values(self):
        """With EMA, overwrite every variable with its average on every rank (a collective)."""
        if not self.optimizer.use_ema:
            return
        if self.pieces:
            self.local.finalize_variable_values(self.pieces)
        self._allgather_variables()

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory):
        """Write a sharded checkpoint into ``directory`` (a collective).

        Every rank writes ``shard-<rank>-of-<R>.npz`` (its slice of the parameters, of
        every slot and EMA average), each atomically (a temporary file, then
        ``os.replace``); when all have succeeded, rank 0 writes ``manifest.json`` (the
        layout, ``iterations``, the optimizer's config, each shard's size and SHA-256) last,
        atomically. The manifest is the commit point: use a new directory per checkpoint
        (e.g. one per step) so that the previous one stays loadable if a rank dies while
        writing.

        Raises
        ------
        OSError
            A rank could not write (on every rank; no manifest is written then).
        """
        import hashlib
        import json
        import os

        comm = self.comm
        name = f"shard-{comm.rank:05d}-of-{comm.size:05d}.npz"
        arrays = {}
        for g, grp in enumerate(self.groups):
            pieces = self._group_pieces(grp)
            arrays[f"g{g}_param"] = (np.concatenate(pieces) if pieces
                                     else np.zeros(0, grp.dtype))
            for slot in self.local.slot_names:
                mine = [self.local.get_slot(p, slot) for p in pieces]
                arrays[f"g{g}_{slot}"] = np.concatenate(mine) if mine else np.zeros(0, grp.dtype)
        error, digest = None, None
        try:
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, name)
            tmp = path + f".tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            with open(path, "rb") as f:
                data = f.read()
            digest = (name, hashlib.sha256(data).hexdigest(), len(data))
        except OSError as exc:
            error = exc
        agree(comm, error)
        shards = comm.allgather_obj(digest)
        error = None
        if comm.rank == 0:
            manifest = {
                "format": "refopt.distributed.ShardedOptimizer/1",
                "ranks": comm.size,
                "iterations": int(self.iterations),
                "optimizer": type(self.optimizer).__name__,
                "config": _jsonable(self.optimizer.get_config()),
                "slots": list(self.local.slot_names),
                "groups": [{"dtype": grp.dtype.str, "sizes": grp.sizes, "bounds": grp.bounds}
                           for grp in self.groups],
                "shards": [{"file": n, "sha256": h, "bytes": b} for n, h, b in shards],
            }
            try:
                path = os.path.join(directory, "manifest.json")
                with open(path + ".tmp", "w") as f:
                    json.dump(manifest, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(path + ".tmp", path)
            except OSError as exc:
                error = exc
        agree(comm, error)

    def load(self, directory):
        """Restore a checkpoint written by :meth:`save` with any number of ranks (a
        collective); all or nothing on every rank.

        The layout is re-sharded to this run's R. Every rank checks the manifest against
        this optimizer (class, slots, dtypes and sizes of the variables) and every shard's
        size and SHA-256 before anything is written; then sets the variables, its slices of
        every slot and average, and ``iterations``.

        Raises
        ------
        FileNotFoundError
            No manifest, or a missing shard (on every rank; nothing loaded).
        ValueError
            A truncated or altered shard (size or SHA-256), or a checkpoint of another
            optimizer or layout (on every rank; nothing loaded).

        Notes
        -----
        Every rank reads every shard (the parameters are replicated): I/O per rank is the
        whole checkpoint.
        """
        import hashlib
        import io
        import json
        import os

        error, flat = None, None
        try:
            path = os.path.join(directory, "manifest.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"No manifest.json in {directory!r}: not a complete "
                                        "sharded checkpoint (the manifest is written last).")
            with open(path) as f:
                man = json.load(f)
            want = [{"dtype": grp.dtype.str, "sizes": grp.sizes} for grp in self.groups]
            have = [{"dtype": g["dtype"], "sizes": g["sizes"]} for g in man["groups"]]
            if (man["optimizer"] != type(self.optimizer).__name__ or want != have
                    or man["slots"] != list(self.local.slot_names)):
                raise ValueError(
                    f"The checkpoint in {directory!r} is of {man['optimizer']} with slots "
                    f"{man['slots']} over variables {have}; this optimizer is "
                    f"{type(self.optimizer).__name__} with slots {list(self.local.slot_names)}"
                    f" over {want}.")
            files = []
            for shard in man["shards"]:
                p = os.path.join(directory, shard["file"])
                if not os.path.exists(p):
                    raise FileNotFoundError(f"Shard {shard['file']!r} of the checkpoint in "
                                            f"{directory!r} is missing.")
                with open(p, "rb") as f:
                    data = f.read()
                if len(data) != shard["bytes"] or hashlib.sha256(data).hexdigest() != shard[
                        "sha256"]:
                    raise ValueError(
                        f"Shard {shard['file']!r} of the checkpoint in {directory!r} is "
                        f"truncated or altered: {len(data)} bytes, expected {shard['bytes']} "
                        "with the SHA-256 in manifest.json.")
                with np.load(io.BytesIO(data)) as z:
                    files.append({k: z[k] for k in z.files})
            flat = {}
            for g, grp in enumerate(self.groups):
                for key in ["param"] + list(self.local.slot_names):
                    full = np.concatenate([f[f"g{g}_{key}"] for f in files])
                    if full.shape != (grp.total,) or full.dtype != grp.dtype:
                        raise ValueError(f"The checkpoint's {key!r} of dtype {grp.dtype} has "
                                         f"shape {full.shape}, dtype {full.dtype}; expected "
                                         f"({grp.total},) {grp.dtype}.")
                    flat[(g, key)] = full
        except (OSError, ValueError, KeyError) as exc:
            error = exc
        agree(self.comm, error)
        # nothing can fail from here on
        self.iterations = int(man["iterations"])
        for g, grp in enumerate(self.groups):
            full = flat[(g, "param")]
            for k, i in enumerate(grp.positions):
                self.variables[i].reshape(-1)[:] = full[grp.offsets[k]:grp.offsets[k + 1]]
        self._build_local(self.iterations)
        for g, grp in enumerate(self.groups):
            for slot in self.local.slot_names:
                full = flat[(g, slot)]
                for p, (_, _, s, n) in zip(self._group_pieces(grp), grp.pieces):
                    self.local.get_slot(p, slot)[:] = full[grp.lo + s:grp.lo + s + n]


def _jsonable(config):
    """``get_config()`` with NumPy scalars as Python numbers (for the manifest)."""
    import json

    return json.loads(json.dumps(config, default=lambda o: o.item() if hasattr(o, "item")
                                 else repr(o)))
