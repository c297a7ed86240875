"""ZeRO-1 data parallelism: each rank owns a slice of the flat parameters and its state.

Exact mode (the default) is bit-identical to one process for any number of ranks R that
divides the number of micro-batches K; fast mode is reproducible for a given R only.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from refopt import schedules as _schedules
from refopt.distributed import norms as _norms
from refopt.distributed._common import (
    ELEMENTWISE,
    PER_TENSOR,
    ShardedCheckpointError,
    agree,
    bounds,
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

__all__ = ["LAYOUTS", "MODES", "ShardedOptimizer", "tensor_owners"]

#: ``"exact"``: every micro-batch gradient slice goes to its owner, summed in micro-batch
#: order (the same numbers for any R). ``"fast"``: each rank pre-sums its micro-batches,
#: the owner adds the R partial sums in rank order (one reduce-scatter's volume; the
#: grouping, hence the rounding, depends on R).
MODES = ("exact", "fast")

_CLIP_KEYS = ("clipnorm", "clipvalue", "global_clipnorm")

#: How the state is cut. ``"slice"``: a contiguous slice of each dtype's flattened variables
#: per rank (elementwise optimizers; boundaries inside tensors). ``"tensor"``: whole tensors
#: per rank (:func:`tensor_owners`), for updates and clips that reduce over a tensor in an
#: order that cannot be split (Lamb, Adafactor, PyTorch's norm clipping).
LAYOUTS = ("slice", "tensor")


def tensor_owners(nbytes, size):
    """The rank that owns each tensor in the ``"tensor"`` layout: greedy balancing.

    Tensors are taken largest first (ties: the lower position first) and each goes to the
    rank with the fewest bytes so far (ties: the lower rank), the classic
    longest-processing-time rule: deterministic, and no rank holds more than ``total / R``
    plus one tensor's bytes.

    Parameters
    ----------
    nbytes : list of int
        Each tensor's bytes, in ``variables`` order.
    size : int
        R.

    Returns
    -------
    list of int
        The owner of each tensor.
    """
    load = [0] * size
    owner = [0] * len(nbytes)
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        r = min(range(size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += nbytes[i]
    return owner


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
    """The variables of one dtype: their flat layout and this rank's slice ``[lo, hi)``.

    ``owners`` None: the ``"slice"`` layout (variables in order, aligned balanced bounds);
    else the ``"tensor"`` layout: the variables ordered by (owner, position), each rank's
    bounds at its first tensor.
    """

    def __init__(self, dtype, positions, variables, size, rank, owners=None):
        if owners is not None:
            positions = sorted(positions, key=lambda i: (owners[i], i))
        self.dtype = dtype
        self.positions = positions
        self.shapes = [variables[i].shape for i in positions]
        self.sizes = [variables[i].size for i in positions]
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64).tolist()
        self.total = self.offsets[-1]
        if owners is None:
            self.owners = None
            self.bounds = aligned_bounds(self.offsets, size)
        else:
            self.owners = [owners[i] for i in positions]
            self.bounds = [self.offsets[bisect.bisect_left(self.owners, r)]
                           for r in range(size)] + [self.total]
        self.lo, self.hi = self.bounds[rank], self.bounds[rank + 1]
        # this rank's pieces: (variable position, start in the variable, start in the slice, n);
        # in the "tensor" layout also its zero-size tensors (Adafactor's factored slots of a
        # (0, n) variable have n elements, and PyTorch's global norm stacks every tensor's)
        self.pieces = []
        for k, i in enumerate(positions):
            a = max(self.offsets[k], self.lo)
            b = min(self.offsets[k + 1], self.hi)
            if b > a or (owners is not None and self.sizes[k] == 0 and self.owners[k] == rank):
                self.pieces.append((i, a - self.offsets[k], a - self.lo, b - a))

    def counts(self):
        return [self.bounds[r + 1] - self.bounds[r] for r in range(len(self.bounds) - 1)]

    def segments(self, r):
        """Rank ``r``'s slice as ``[(k, start in tensor k, count)]``, in flat order."""
        lo, hi = self.bounds[r], self.bounds[r + 1]
        out = []
        for k in range(len(self.positions)):
            a = max(self.offsets[k], lo)
            b = min(self.offsets[k + 1], hi)
            if b > a:
                out.append((k, a - self.offsets[k], b - a))
        return out


class ShardedOptimizer:
    """Data parallelism with sharded optimizer state (ZeRO-1), bit-identical to one process.

    Wraps an unbuilt refopt optimizer (the single-process optimizer stays the unit of
    truth, as with Horovod's ``DistributedOptimizer`` and torch's
    ``ZeroRedundancyOptimizer``). Every rank holds the full variables; rank ``r`` owns a part
    of them and only that part's slots and EMA averages: a local optimizer built like
    ``optimizer`` runs on its part with the local executor. :attr:`layout` says how the
    variables are cut (:data:`LAYOUTS`):

    - ``"slice"`` (elementwise optimizers): for each dtype, about ``1/R`` of the variables of
      that dtype flattened back to back in ``variables`` order, a contiguous slice (the
      balanced partition, each boundary moved down to a multiple of :data:`ALIGN` elements
      within its tensor); the local optimizer runs on 1-d views of the pieces.
    - ``"tensor"`` (Lamb and Adafactor, whose updates reduce over each tensor, and norm
      clipping with PyTorch's formula, whose sums run in lanes across a whole tensor):
      whole tensors, balanced greedily by bytes (:func:`tensor_owners`); the local
      optimizer runs on the variables themselves, so every per-tensor reduction is the
      single-process one. Memory per rank is about ``1/R`` of the state plus at most one
      tensor's state.

    One step (:meth:`apply_gradients`): this rank's ``K / R`` micro-batch gradients (rank
    ``r`` computes micro-batches ``r K / R`` to ``(r + 1) K / R - 1``) are checked on every
    rank before anything moves; each micro-batch's gradient slice goes to its owner
    (all-to-all), which sums the K contributions **in micro-batch order**
    (``G = g_0; G = G + g_k`` for ``k = 1..K-1``, in the dtype; with ``reduction="mean"``
    then ``G / K``); norm clipping reduces each tensor's squares in NumPy's pairwise order
    across the owners (:mod:`refopt.distributed.norms`), giving the single-process norm;
    under PyTorch's formula each owner takes its tensors' ``torch.linalg.vector_norm`` in
    PyTorch's order (:func:`refopt.reference.reductions.torch_vector_norm`) and the ranks
    exchange these T numbers, stacked in ``get_total_norm``'s order for a global norm; the
    owner clips, decays, updates and averages its part; the updated parts are gathered back
    into every rank's variables.

    Every rank must construct it with the same optimizer (class, configuration,
    ``iterations``, weight-decay exclusions), the same variables (shapes, dtypes, values) and
    the same ``micro_batches``, ``mode`` and ``reduction``. This is checked at construction
    (one small all-gather; the values by a CRC-32 of each variable): a difference raises the
    same ValueError on every rank, naming each setting that differs and the ranks holding
    each value. At every step, ``iterations`` and the step's learning rate are compared the
    same way. Between steps only ``optimizer.learning_rate`` may change (set it on every rank
    alike; the next step uses it); any other change to ``optimizer``'s configuration is
    refused at the next step.

    Parameters
    ----------
    optimizer : refopt.Optimizer
        Unbuilt; its class, hyperparameters, convention, backend (``"cpu"`` or
        ``"reference"``), learning rate (a schedule object is used itself, not a copy, so a
        schedule class of your own works), ``iterations`` and weight-decay exclusions are
        used. It is not stepped itself. One of refopt's optimizers (not a subclass):
        elementwise (``ELEMENTWISE``: the Adam family, SGD, RMSprop, Adagrad, Adadelta,
        Adamax, Nadam, Lion, RAdam, ASGD, Rprop, Ftrl) or per tensor (``PER_TENSOR``: Lamb,
        Adafactor).
    variables : list of ndarray
        The model's variables, float32 or float64 (float16 without norm clipping),
        C-contiguous, writeable, the same shapes, dtypes and values on every rank. Zero-size
        variables are fine; an empty list makes every step a no-op, as one process.
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
        ``optimizer`` is not an unbuilt refopt optimizer of those classes; a variable is not
        a float ndarray.
    ValueError
        A bad ``micro_batches``, ``mode`` or ``reduction``; settings or variables that
        differ between ranks; a C-contiguity or writeability problem.
    NotImplementedError
        Keras 2's several clips in sequence, or norm clipping with float16 variables; Nadam
        over several dtypes (its momentum product takes the first variable's dtype).

    Notes
    -----
    Memory: each rank keeps ``1/R`` of the slots and averages (:meth:`state_nbytes`; in the
    ``"tensor"`` layout up to one tensor's more). Communication per rank and step, N
    elements of gradient: exact mode sends ``(K/R) N (R-1)/R`` and receives as much; fast
    mode ``N (R-1)/R``; both gather ``N (R-1)/R`` parameters; norm clipping adds
    ``O(T log N + 256 T)`` numbers for T tensors (``T`` numbers under PyTorch's formula). Every rank must call every method here in the same order (they are
    collectives).

    Examples
    --------
    Run with ``mpiexec -n 2 python -m mpi4py train.py`` (``-m mpi4py`` makes an exception
    on one rank outside refopt's checked collectives end every rank; without it the other
    ranks wait forever)::

        opt = refopt.Adam(learning_rate=1e-3, global_clipnorm=1.0, backend="cpu")
        dist = ShardedOptimizer(opt, variables, micro_batches=4)
        for step in range(steps):
            grads = [grad_fn(batch(step, k)) for k in dist.micro_batch_ids]
            dist.apply_gradients(grads)   # variables updated on every rank
            if step == 1000:
                opt.learning_rate = 1e-4  # on every rank: used from the next step
    """

    def __init__(self, optimizer, variables, *, micro_batches, comm=None, mode="exact",
                 reduction="sum"):
        import refopt
        from refopt.optimizers.base import Optimizer

        self.comm = comm = get_comm(comm)
        error, settings = None, None
        try:
            if not isinstance(optimizer, Optimizer):
                raise TypeError("`optimizer` must be a refopt optimizer. Received: "
                                f"optimizer={optimizer!r}")
            if optimizer.built:
                raise ValueError("`optimizer` must not be built yet (its state is sharded). "
                                 f"Received: optimizer={optimizer!r} (built)")
            cls = type(optimizer)
            name = cls.__name__
            if name not in ELEMENTWISE + PER_TENSOR or cls is not getattr(refopt, name, None):
                raise TypeError(
                    f"{qualified_name(cls)} is not sharded: only refopt's own optimizers are "
                    "(their updates are known to be elementwise or per tensor; a subclass "
                    f"may change that): {', '.join(ELEMENTWISE + PER_TENSOR)}. Received: "
                    f"optimizer={qualified_name(cls)}")
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
            if kind in ("norm", "global") and any(v.dtype == np.float16 for v in variables):
                raise NotImplementedError(
                    "Norm clipping over float16 variables is not sharded yet.")
            dtypes = list(dict.fromkeys(v.dtype for v in variables))
            if name == "Nadam" and len(dtypes) > 1:
                raise NotImplementedError(
                    "Nadam over variables of several dtypes is not sharded (its momentum "
                    f"product takes the first variable's dtype). Received dtypes {dtypes}")
            self.mode = mode
            self.reduction = reduction
            self.variables = variables
            self.optimizer = optimizer
            self._clip_kind = kind
            self._iterations = optimizer.iterations
            R, K = comm.size, self.micro_batches
            self.micro_batch_ids = list(range(comm.rank * K // R, (comm.rank + 1) * K // R))
            torch_norm = (kind in ("norm", "global")
                          and optimizer.convention.clip_formula == "torch")
            self.layout = "tensor" if name in PER_TENSOR or torch_norm else "slice"
            owners = (tensor_owners([v.nbytes for v in variables], R)
                      if self.layout == "tensor" else None)
            self.groups = [_Group(dt, [i for i, v in enumerate(variables) if v.dtype == dt],
                                  variables, R, comm.rank, owners) for dt in dtypes]
            self._buffers = {}
            self._config = config_text(optimizer, learning_rate=False)
            self._excluded_ids = set(optimizer._exclude_ids)
            self._build_local(optimizer.iterations)
            # everything that must be the same on every rank (compared below)
            settings = {
                "optimizer class": qualified_name(cls),
                **config_settings(optimizer),
                "learning rate now": repr(current_learning_rate(optimizer, self._iterations)),
                "iterations": str(self._iterations),
                "weight-decay exclusions (positions)": shown(
                    optimizer._excluded_positions(variables)),
                "mode": mode, "reduction": reduction, "micro_batches": str(K),
                "layout": self.layout,
                "number of variables": str(len(variables)),
                "variables' shapes and dtypes": shown([(v.shape, v.dtype.str)
                                                       for v in variables]),
                "variables' values (CRC-32 of each)": shown([crc32(v) for v in variables]),
            }
        except Exception as exc:  # noqa: BLE001 - any error of one rank is every rank's
            error = exc
        agree(comm, error, settings, "The ShardedOptimizer's settings")

    @property
    def iterations(self):
        """int: the global steps applied (the wrapped optimizer's ``iterations`` at
        construction, or the checkpoint's after :meth:`load`, plus the steps since)."""
        return self._iterations

    # ------------------------------------------------------------------ local optimizer
    def _build_local(self, iterations):
        proto = self.optimizer
        # clipping happens here, on the whole gradient's numbers
        local = rebuild(proto, iterations, **dict.fromkeys(_CLIP_KEYS))
        pieces, owners = [], []
        for grp in self.groups:
            for i, start, _, n in grp.pieces:
                pieces.append(self.variables[i] if self.layout == "tensor"
                              else self.variables[i].reshape(-1)[start:start + n])
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
        out = []
        for j, grads in enumerate(micro_grads):
            row = []
            for i, (g, v) in enumerate(zip(grads, self.variables)):
                if isinstance(g, np.generic) and v.ndim == 0:
                    g = np.asarray(g)  # a NumPy scalar for a 0-d variable, as one process
                if type(g) is not np.ndarray:
                    raise TypeError(
                        f"micro_grads[{j}][{i}] must be a dense numpy.ndarray (None and "
                        "IndexedSlices are not sharded; use ShardedEmbedding for tables). "
                        f"Received: {type(g).__name__}")
                if g.shape != v.shape or g.dtype != v.dtype:
                    raise ValueError(
                        f"micro_grads[{j}][{i}] must have its variable's shape {v.shape} "
                        f"and dtype {v.dtype}. Received: shape={g.shape}, dtype={g.dtype}")
                row.append(g)
            out.append(row)
        if set(self.optimizer._exclude_ids) != self._excluded_ids:
            raise ValueError(
                "The wrapped optimizer's weight-decay exclusions changed after the "
                "ShardedOptimizer was constructed (only its learning_rate may change between "
                "steps; build a new ShardedOptimizer for others).")
        changed = config_text(self.optimizer, learning_rate=False)
        if changed != self._config:
            import json

            before, now = json.loads(self._config), json.loads(changed)
            keys = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
            raise ValueError(
                "The wrapped optimizer's settings changed after the ShardedOptimizer was "
                "constructed (only its learning_rate may change between steps; build a new "
                "ShardedOptimizer for others): "
                + ", ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in keys))
        # the step's learning rate (a schedule evaluated now; may raise)
        return out, current_learning_rate(self.optimizer, self._iterations)

    def _buffer(self, key, n, dtype):
        """A buffer of ``n`` elements kept between steps (a fresh large array each step
        costs page faults on every use)."""
        buf = self._buffers.get(key)
        if buf is None or buf.size != n or buf.dtype != dtype:
            buf = self._buffers[key] = np.empty(n, dtype)
        return buf

    def _reduce(self, g, grp, micro_grads):
        """This rank's slice of the step's gradient, summed in the mode's fixed order.

        Exact: the rows are every rank's micro-batch slices, in micro-batch order; fast:
        every rank's pre-sum (its micro-batches left to right), in rank order. The first
        row is copied, the others added one by one. This rank's own rows are read in place.
        """
        comm, R, me = self.comm, self.comm.size, self.comm.rank
        dt = grp.dtype
        fast = self.mode == "fast"
        rows = [[gr[i].reshape(-1) for i in grp.positions] for gr in micro_grads]
        m = 1 if fast else len(rows)
        counts = grp.counts()
        mine = counts[me]

        def fill(dst, segs):  # one row of a slice: a micro-batch's, or the pre-sum
            pos = 0
            for k, start, n in segs:
                out = dst[pos:pos + n]
                out[...] = rows[0][k][start:start + n]
                for r in rows[1:]:
                    np.add(out, r[k][start:start + n], out=out)
                pos += n

        send = self._buffer((g, "send"), m * (grp.total - mine), dt)
        pos = 0
        for d in range(R):  # the block for rank d: its slice of each row, in order
            if d == me:
                continue
            segs = grp.segments(d)
            if fast:
                fill(send[pos:pos + counts[d]], segs)
                pos += counts[d]
                continue
            for r in rows:
                for k, start, n in segs:
                    send[pos:pos + n] = r[k][start:start + n]
                    pos += n
        recv = self._buffer((g, "recv"), (R - 1) * m * mine, dt)
        if R > 1:
            comm.alltoallv(send, [0 if d == me else m * counts[d] for d in range(R)], recv,
                           [0 if d == me else m * mine for d in range(R)])
        mine_segs = grp.segments(me)
        if fast:
            own = self._buffer((g, "own"), mine, dt)
            fill(own, mine_segs)
            own_rows = [[(0, mine, own)]]
        else:
            own_rows = []
            for r in rows:
                pieces, pos = [], 0
                for k, start, n in mine_segs:
                    pieces.append((pos, n, r[k][start:start + n]))
                    pos += n
                own_rows.append(pieces)
        total = self._buffer((g, "total"), mine, dt)
        first, at = True, 0
        for src in range(R):
            for j in range(m):
                if src == me:
                    parts = own_rows[j]
                else:
                    parts = [(0, mine, recv[at:at + mine])]
                    at += mine
                for p, n, x in parts:
                    out = total[p:p + n]
                    if first:
                        out[...] = x
                    else:
                        np.add(out, x, out=out)
                first = False
        if self.reduction == "mean":
            np.divide(total, dt.type(self.micro_batches), out=total)
        return total

    def _clip(self, totals):
        """Clip every group's slice in place as the single-process step would."""
        proto = self.optimizer
        kind, c = _plan.clip_kind(proto)
        if kind is None:
            return
        if kind == "value":
            for grp, total in zip(self.groups, totals):
                c = _plan.clip_arrays(proto, grp.dtype, 0)[3]
                np.maximum(np.minimum(total, c), -c, out=total)
            return
        if proto.convention.clip_formula == "torch":
            self._clip_torch(totals, kind, c)
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
        # a global norm adds the tensors' sums in ``variables`` order, as one process does
        # (the "tensor" layout orders each group by owner)
        by_var = {i: s[k] for grp, s in zip(self.groups, sums)
                  for k, i in enumerate(grp.positions)}
        in_order = [by_var[i] for i in range(len(self.variables))]
        gnorm = None
        if half:
            if len(self.groups) > 1:  # checked before any data moved, see apply_gradients
                raise AssertionError
            dt = self.groups[0].dtype
            with np.errstate(all="ignore"):
                gnorm = np.sqrt(np.sum(np.asarray(in_order, dt), dtype=dt) * dt.type(2.0))
        elif kind == "global":  # optax: clip_by_global_norm over every dtype at once
            self._clip_optax_global(totals, in_order)
            return
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

    def _clip_optax_global(self, totals, sums):
        """optax's ``clip_by_global_norm`` from every tensor's sum of squares (``sums``, in
        ``variables`` order): the norm in the widest dtype, kept below the threshold, else
        ``(g / norm) * c`` in each gradient's dtype
        (:func:`refopt.reference.variants.clip_global_norm_variant`)."""
        from refopt.reference._common import scalar

        dtype = np.result_type(*[v.dtype for v in self.variables])
        with np.errstate(all="ignore"):
            norm = np.sqrt(np.sum(np.asarray(sums, dtype), dtype=dtype))
            c = scalar(dtype, self.optimizer.global_clipnorm)
            if norm < c:
                return
            for grp, total in zip(self.groups, totals):
                dt = grp.dtype
                np.multiply(total / dt.type(norm), dt.type(c), out=total)

    def _clip_torch(self, totals, kind, c):
        """PyTorch's norm clipping (``clip_grad_norm_``) in the ``"tensor"`` layout: each owner
        takes the norms of its whole tensors in PyTorch's order; a global norm stacks every
        rank's norms in ``get_total_norm``'s order (T numbers exchanged)."""
        from refopt.reference import reductions as _red
        from refopt.reference import variants as _variants

        conv = self.optimizer.convention
        owned = [(i, total[s:s + n].reshape(self.variables[i].shape))
                 for grp, total in zip(self.groups, totals) for i, _, s, n in grp.pieces]
        with np.errstate(all="ignore"):
            if kind == "norm":
                for _, x in owned:
                    x[...] = _variants.clip_norm_variant(x, c, conv)
                return
            norms = {}
            for part in self.comm.allgather_obj({i: _red.torch_vector_norm(x)
                                                 for i, x in owned}):
                norms.update(part)
            dtypes = [v.dtype for v in self.variables]
            dtype = np.result_type(*dtypes)
            stacked = np.asarray([norms[k] for k in _red.torch_stack_order(dtypes)], dtype)
            coef = _red.torch_clip_coef(_red.torch_vector_norm(stacked), c, dtype)
            for _, x in owned:
                x[...] = _red.torch_scale(x, coef)

    def apply_gradients(self, micro_grads):
        """One global step from this rank's micro-batch gradients (a collective).

        Parameters
        ----------
        micro_grads : list of list of ndarray
            For each of this rank's micro-batches (:attr:`micro_batch_ids`, in that order),
            one dense gradient per variable, with its variable's shape and dtype (a NumPy
            scalar of that dtype for a 0-d variable).

        Returns
        -------
        int
            ``iterations`` after the step.

        Raises
        ------
        TypeError, ValueError
            On every rank, naming the rank whose input is bad (a missing or extra
            micro-batch, a gradient of another shape, dtype or type, a schedule that gives
            a bad learning rate; TensorFlow's mixed-dtype refusal of a global norm; a change
            of the optimizer's configuration other than its learning rate), or the ranks
            whose ``iterations`` or learning rate differ. Raised before any data moves: no
            variable or state has changed on any rank.
        """
        error, settings = None, None
        try:
            micro_grads, lr = self._check(micro_grads)
            if (self._clip_kind == "global" and len(self.groups) > 1
                    and self.optimizer.convention.clip_formula == "tf"):
                raise TypeError(
                    "All gradients of a global norm must have the same dtype (TensorFlow "
                    "refuses to stack mixed dtypes). Received dtypes "
                    f"{sorted(g.dtype.name for g in self.groups)}")
            settings = {"iterations": str(self._iterations), "learning rate": repr(lr)}
        except (TypeError, ValueError, KeyError) as exc:
            error = exc
        agree(self.comm, error, settings, "The ShardedOptimizer's step settings")
        if not self.variables:  # one process: an empty step is a no-op, the counter stays
            return self._iterations
        self._sync_learning_rate(lr)
        with np.errstate(all="ignore"):
            totals = [self._reduce(g, grp, micro_grads) for g, grp in enumerate(self.groups)]
        self._clip(totals)
        grads = []
        for grp, total in zip(self.groups, totals):
            for i, _, s, n in grp.pieces:
                grads.append(total[s:s + n].reshape(self.variables[i].shape)
                             if self.layout == "tensor" else total[s:s + n])
        if self.pieces:
            self.local.apply_gradients(list(zip(grads, self.pieces)))
        self._allgather_variables()
        self._iterations += 1
        return self._iterations

    def _sync_learning_rate(self, value):
        """Give the local optimizer the wrapped one's learning rate (a float or schedule the
        user set between steps; ``value``: its value at this step, already checked)."""
        lr, local = self.optimizer._learning_rate, self.local
        if isinstance(lr, _schedules.LearningRateSchedule):
            if local._learning_rate is not lr:
                local._learning_rate = lr
                local._current_learning_rate = value
        elif local._learning_rate != lr:
            local.learning_rate = lr

    def _allgather_variables(self):
        if self.comm.size == 1:  # the pieces are views of the variables: nothing to gather
            return
        for g, grp in enumerate(self.groups):
            self._allgather_flat(grp, [self.variables[i].reshape(-1) for i in grp.positions],
                                 self._group_pieces(grp), grp.sizes, grp.counts(),
                                 buffers=g)

    def _group_pieces(self, grp):
        """This rank's pieces (1-d views of the variables, or whole variables in the
        ``"tensor"`` layout) of ``grp``, in slice order."""
        start = 0
        for g in self.groups:
            if g is grp:
                return self.pieces[start:start + len(grp.pieces)]
            start += len(g.pieces)
        raise KeyError(grp)

    def _slot_shape(self, name, shape):
        """The shape of slot ``name`` of a variable of ``shape`` (Adafactor's factored
        moments are smaller than their variable)."""
        if name == "average":
            return tuple(shape)
        return tuple(self.optimizer.slot_shape(name, shape))

    def _slot_layout(self, grp, name):
        """``(sizes, counts)`` of slot ``name`` over ``grp``: each variable's slot size in the
        group's order and each rank's number of slot elements. In the ``"slice"`` layout a
        slot is cut as its variable (elementwise optimizers' slots have its shape)."""
        if self.layout == "slice":
            return grp.sizes, grp.counts()
        sizes = [int(np.prod(self._slot_shape(name, shape))) for shape in grp.shapes]
        counts = [0] * self.comm.size
        for r, n in zip(grp.owners, sizes):
            counts[r] += n
        return sizes, counts

    def _allgather_flat(self, grp, outs, mine, sizes, counts, buffers=None):
        """Gather every rank's part of a group's flat buffer (``mine``: this rank's arrays,
        in order) into ``outs`` (one flat array per variable of the group, ``sizes[k]``
        elements each; ``counts``: each rank's number of elements); ``buffers``: a key to
        keep the buffers between calls (the step's gather), None: fresh ones."""
        me = self.comm.rank
        if buffers is None:
            send = np.empty(counts[me], grp.dtype)
            recv = np.empty(sum(sizes), grp.dtype)
        else:
            send = self._buffer((buffers, "gather_send"), counts[me], grp.dtype)
            recv = self._buffer((buffers, "gather_recv"), sum(sizes), grp.dtype)
        if mine:
            np.concatenate([m.reshape(-1) for m in mine], out=send)
        self.comm.allgatherv(send, recv, counts)
        start = 0
        for n, out in zip(sizes, outs):
            out[:] = recv[start:start + n]
            start += n

    def gather_slot(self, name):
        """The full slot ``name`` (or ``"average"``) of every variable, on every rank.

        A collective, for checks and export; the training step never gathers state.

        Returns
        -------
        list of ndarray
            One array per variable, in ``variables`` order, in the slot's shape (the
            variable's, or Adafactor's factored shapes) and the variable's dtype.

        Raises
        ------
        KeyError
            An unknown slot name (on every rank).
        """
        error = None if name in self.local.slot_names else KeyError(
            f"Unknown slot {name!r}; this optimizer has {list(self.local.slot_names)}")
        agree(self.comm, error)
        out = [np.empty(self._slot_shape(name, v.shape), v.dtype) for v in self.variables]
        for grp in self.groups:
            mine = [self.local.get_slot(p, name) for p in self._group_pieces(grp)]
            self._allgather_flat(grp, [out[i].reshape(-1) for i in grp.positions], mine,
                                 *self._slot_layout(grp, name))
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

        Every rank writes ``shard-<rank>-of-<R>.npz`` (its part of the parameters, of
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
            arrays[f"g{g}_param"] = (np.concatenate([p.reshape(-1) for p in pieces]) if pieces
                                     else np.zeros(0, grp.dtype))
            for slot in self.local.slot_names:
                mine = [self.local.get_slot(p, slot).reshape(-1) for p in pieces]
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
                "iterations": int(self._iterations),
                "optimizer": type(self.optimizer).__name__,
                "config": _jsonable(self.optimizer.get_config()),
                "slots": list(self.local.slot_names),
                "layout": self.layout,
                "groups": [{"dtype": grp.dtype.str, "positions": grp.positions,
                            "shapes": [list(sh) for sh in grp.shapes], "sizes": grp.sizes,
                            "bounds": grp.bounds} for grp in self.groups],
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
        """Restore a checkpoint written by :meth:`save` with any number of ranks and either
        layout (a collective); all or nothing on every rank.

        The checkpoint is re-sharded to this run's R and layout: one saved in the
        ``"slice"`` layout loads into the ``"tensor"`` layout and back (e.g. Adam with
        ``clipnorm`` saved under ``convention="tf_keras"``, loaded under ``"torch"``). Every
        rank checks, before anything is written: the manifest's fields and their consistency
        (each shard's file name at its position, each group's order of variables and bounds
        as :meth:`save` writes them for the saved R and layout), the manifest against this
        optimizer (class, slots, and the position, dtype and shape of every variable), every
        shard's size, SHA-256 and arrays, and that every rank read the same manifest. The
        saved configuration is not compared: the state is loaded into this optimizer as it
        is configured (hyperparameters, convention, learning rate). Then it sets the
        variables, its parts of every slot and average, and ``iterations``.

        Raises
        ------
        FileNotFoundError, OSError
            No manifest, a missing or unreadable shard (on every rank; nothing loaded).
        ShardedCheckpointError
            A :class:`ValueError`: a malformed or inconsistent manifest, a truncated or
            altered shard (size, SHA-256 or arrays), or a checkpoint of another optimizer
            class, other slots or other variables (on every rank; nothing loaded).
        ValueError
            The ranks read different manifests (on every rank; nothing loaded).

        Notes
        -----
        Every rank reads every shard (the parameters are replicated): I/O per rank is the
        whole checkpoint.
        """
        import hashlib
        import io
        import os

        error, settings, per_var, iterations = None, None, None, None
        try:
            path = os.path.join(directory, "manifest.json")
            if not os.path.exists(path):
                raise FileNotFoundError(f"No manifest.json in {directory!r}: not a complete "
                                        "sharded checkpoint (the manifest is written last).")
            with open(path, "rb") as f:
                raw = f.read()
            man, saved = self._check_manifest(raw, directory)
            iterations = man["iterations"]
            current_learning_rate(self.optimizer, iterations)  # a schedule that fails there
            files = []
            for r, shard in enumerate(man["shards"]):
                p = os.path.join(directory, shard["file"])
                if not os.path.exists(p):
                    raise FileNotFoundError(f"Shard {shard['file']!r} of the checkpoint in "
                                            f"{directory!r} is missing.")
                with open(p, "rb") as f:
                    data = f.read()
                if len(data) != shard["bytes"] or hashlib.sha256(data).hexdigest() != shard[
                        "sha256"]:
                    raise ShardedCheckpointError(
                        f"Shard {shard['file']!r} of the checkpoint in {directory!r} is "
                        f"truncated or altered: {len(data)} bytes, expected {shard['bytes']} "
                        "with the SHA-256 in manifest.json.")
                try:
                    with np.load(io.BytesIO(data), allow_pickle=False) as z:
                        files.append({k: z[k] for k in z.files})
                except Exception as exc:  # noqa: BLE001 - any unreadable content
                    raise ShardedCheckpointError(
                        f"Shard {shard['file']!r} of the checkpoint in {directory!r} is not a "
                        f"readable .npz file: {type(exc).__name__}: {exc}") from None
            per_var = {}  # (variable, "param" or slot) -> its whole flat array
            for g, (grp, (positions, shapes, counts)) in enumerate(zip(self.groups, saved)):
                for key in ["param"] + list(self.local.slot_names):
                    parts = []
                    for r, f in enumerate(files):
                        part = f.get(f"g{g}_{key}")
                        want = counts[key][r]
                        if part is None or part.shape != (want,) or part.dtype != grp.dtype:
                            raise ShardedCheckpointError(
                                f"Shard {man['shards'][r]['file']!r} of the checkpoint in "
                                f"{directory!r}: array 'g{g}_{key}' is "
                                + ("missing" if part is None else
                                   f"of shape {part.shape}, dtype {part.dtype}")
                                + f"; the manifest gives ({want},) {grp.dtype}.")
                        parts.append(part)
                    full = np.concatenate(parts)
                    start = 0
                    for i, sh in zip(positions, shapes):
                        n = int(np.prod(sh if key == "param" else self._slot_shape(key, sh)))
                        per_var[(i, key)] = full[start:start + n]
                        start += n
            settings = {"manifest.json (SHA-256)": hashlib.sha256(raw).hexdigest()}
        except ShardedCheckpointError as exc:
            error = exc
        except Exception as exc:  # noqa: BLE001 - whatever one rank meets, every rank raises
            error = exc if isinstance(exc, OSError) else ShardedCheckpointError(
                f"The checkpoint in {directory!r} is malformed: {type(exc).__name__}: {exc}")
        agree(self.comm, error, settings, f"The checkpoints that the ranks load ({directory!r})")
        # nothing can fail from here on
        self._iterations = iterations
        for grp in self.groups:
            for i in grp.positions:
                self.variables[i].reshape(-1)[:] = per_var[(i, "param")]
        self._build_local(self._iterations)
        for grp in self.groups:
            for p, (i, start, _, n) in zip(self._group_pieces(grp), grp.pieces):
                for slot in self.local.slot_names:
                    full = per_var[(i, slot)]
                    dst = self.local.get_slot(p, slot)
                    src = full if self.layout == "tensor" else full[start:start + n]
                    np.copyto(dst, src.reshape(dst.shape))

    def _check_manifest(self, raw, directory):
        """The manifest (``raw``: the bytes of manifest.json) checked field by field, for
        consistency, and against this optimizer; returns it and, per group, the saved
        ``(positions, shapes, counts)`` (``counts[key][r]``: shard ``r``'s number of elements
        of ``"param"`` or a slot)."""
        import json

        def bad(msg):
            return ShardedCheckpointError(f"The manifest.json in {directory!r} {msg}")

        def is_int(x, low=0):
            return isinstance(x, int) and not isinstance(x, bool) and x >= low

        def int_list(x, n=None, low=0):
            return (isinstance(x, list) and all(is_int(v, low) for v in x)
                    and (n is None or len(x) == n))

        try:
            man = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"is not valid JSON: {exc}") from None
        if not isinstance(man, dict):
            raise bad(f"must hold a JSON object. Received: {type(man).__name__}")
        fmt = "refopt.distributed.ShardedOptimizer/1"
        if man.get("format") != fmt:
            raise bad(f"has format={man.get('format')!r}; expected {fmt!r}.")
        R = man.get("ranks")
        checks = [
            ("ranks", is_int(R, 1), "an int >= 1"),
            ("iterations", is_int(man.get("iterations")) and man["iterations"] < 2**63,
             "an int in [0, 2**63 - 1]"),
            ("optimizer", isinstance(man.get("optimizer"), str), "a str"),
            ("config", isinstance(man.get("config"), dict), "an object"),
            ("slots", isinstance(man.get("slots"), list)
             and all(isinstance(x, str) for x in man["slots"]), "a list of str"),
            ("layout", man.get("layout") in LAYOUTS, f"one of {LAYOUTS}"),
            ("groups", isinstance(man.get("groups"), list)
             and all(isinstance(g, dict) for g in man["groups"]), "a list of objects"),
            ("shards", isinstance(man.get("shards"), list) and is_int(R, 1)
             and len(man["shards"]) == R and all(
                 isinstance(x, dict) and isinstance(x.get("file"), str)
                 and isinstance(x.get("sha256"), str) and is_int(x.get("bytes"))
                 for x in man["shards"]),
             "a list of `ranks` objects with file (str), sha256 (str), bytes (int)"),
        ]
        for key, ok, what in checks:
            if not ok:
                raise bad(f"has a malformed {key!r}: expected {what}. Received: "
                          + (f"{key}={shown(repr(man[key]))}" if key in man else "(absent)"))
        for r, shard in enumerate(man["shards"]):
            name = f"shard-{r:05d}-of-{R:05d}.npz"
            if shard["file"] != name:
                raise bad(f"lists {shard['file']!r} as shard {r} of {R}; expected {name!r} "
                          "(entries reordered or renamed).")
        me = type(self.optimizer).__name__
        mine = list(self.local.slot_names)
        want = [[(i, grp.dtype.str, tuple(self.variables[i].shape)) for i in sorted(
            grp.positions)] for grp in self.groups]
        if man["optimizer"] != me or man["slots"] != mine:
            raise bad(f"is of {man['optimizer']} with slots {man['slots']}; this optimizer is "
                      f"{me} with slots {mine}.")
        # what save() writes for these variables with the saved R and layout
        owners = (tensor_owners([v.nbytes for v in self.variables], R)
                  if man["layout"] == "tensor" else None)
        expect = [_Group(grp.dtype, sorted(grp.positions), self.variables, R, 0, owners)
                  for grp in self.groups]
        have, saved = [], []
        if len(man["groups"]) != len(self.groups):
            raise bad(f"has {len(man['groups'])} groups (dtypes); this optimizer's variables "
                      f"have {len(self.groups)}: {[g.dtype.str for g in self.groups]}.")
        for k, (g, exp) in enumerate(zip(man["groups"], expect)):
            positions = g.get("positions", exp.positions)  # absent: older manifests
            shapes = g.get("shapes", [list(self.variables[i].shape) for i in exp.positions]
                           if int_list(positions) else None)
            if (not isinstance(g.get("dtype"), str) or not int_list(positions)
                    or not isinstance(shapes, list) or len(shapes) != len(positions)
                    or not all(int_list(sh) for sh in shapes)
                    or not int_list(g.get("bounds"), R + 1)):
                raise bad(f"has a malformed group {k}: expected dtype (str), positions (list "
                          f"of int), shapes (a list of int lists, one per position), bounds "
                          f"({R + 1} ints). Received: {shown(g)}")
            have.append(sorted((i, g["dtype"], tuple(sh)) for i, sh in zip(positions, shapes)))
            saved.append((positions, [tuple(sh) for sh in shapes], g["bounds"], exp))
        if have != want:
            raise bad(f"is over variables (position, dtype, shape) {shown(have)}; this "
                      f"optimizer's are {shown(want)}.")
        out = []
        for k, (positions, shapes, b, exp) in enumerate(saved):
            if positions != exp.positions:
                raise bad(f"lists group {k}'s variables in the order {shown(positions)}; "
                          f"save() writes {shown(exp.positions)} for {R} ranks in the "
                          f"{man['layout']!r} layout (entries permuted).")
            ok = (b == exp.bounds if owners is not None else
                  b[0] == 0 and b[-1] == exp.total and all(x <= y for x, y in itertools.pairwise(b)))
            if not ok:
                raise bad(f"has bounds {shown(b)} for group {k}; expected "
                          + (f"{shown(exp.bounds)}" if owners is not None else
                             f"non-decreasing from 0 to {exp.total}") + ".")
            counts = {"param": [b[r + 1] - b[r] for r in range(R)]}
            for slot in mine:
                if owners is None:
                    counts[slot] = counts["param"]
                else:
                    per = [0] * R
                    for r, sh in zip(exp.owners, shapes):
                        per[r] += int(np.prod(self._slot_shape(slot, sh)))
                    counts[slot] = per
            out.append((positions, shapes, counts))
        return man, out


def _jsonable(config):
    """``get_config()`` with NumPy scalars as Python numbers (for the manifest)."""
    import json

    return json.loads(json.dumps(config, default=lambda o: o.item() if hasattr(o, "item")
                                 else repr(o)))
