"""Row-wise Adagrad for ``backend="cuda"``: the mirror functions and the device row kernels.

The mirror functions (:func:`rowwise_adagrad_update`, :func:`rowwise_adagrad_rows`,
:func:`rowwise_adagrad_sequential_update`, ...) are :mod:`refopt.reference.rowwise_adagrad`'s
own (host arrays in, new host arrays out). ``RowWiseAdagrad(backend="cuda")`` updates its
device tables in place with the two kernels below, launched by the optimizer's
``_cuda_calls`` hook (:meth:`refopt.RowWiseAdagrad._cuda_calls`, which
:func:`refopt.executors.cuda._prepare` asks first):

- :func:`exact_rows`: one thread per row, every row of a dense gradient, or the rows of an
  IndexedSlices whose duplicates were summed on the host first
  (:meth:`refopt.IndexedSlices.deduplicate`: from zero in order of appearance, the
  reference's bits);
- :func:`sequential_rows`: FBGEMM's approximate form (``exact=False``): the occurrences are
  grouped by row on the host (a stable argsort of the indices), and one thread per distinct
  row applies that row's occurrences one after another, in order of appearance.

Each thread computes its row as :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_rows`
does, in the same order: the sum of squares element after element from zero, the mean, the
accumulator, the multiplier, the decay factor and the weight update, every operation through
:mod:`refopt.rules.ops` (libdevice's explicitly rounded ``*_rn`` on a GPU, never contracted;
``fma`` rounds ``a*b + c`` once by the reference's own method). No atomics: a row belongs to
one thread, so the bits do not depend on the launch shape. float32 and float64 tables.
"""

from __future__ import annotations

import threading

import numpy as np

from refopt.kernels.cuda._launch import cuda, simulator
from refopt.reference.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
    rowwise_adagrad_rows,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)
from refopt.rules import ops

__all__ = ["RowWiseAdagradResult", "exact_rows", "rowwise_adagrad_initial_state",
           "rowwise_adagrad_rows", "rowwise_adagrad_sequential_update", "rowwise_adagrad_update",
           "sequential_rows"]

#: FBGEMM's ``WeightDecayMode`` as the kernels' integer flag.
MODES = {"none": 0, "l2": 1, "decoupled": 2}
#: The table dtypes the device kernels take (float16 tables take the host step).
DEVICE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_LOCK = threading.Lock()
_KERNELS = None


def _row_step(P, r, G, k, A, lr, eps, wd, mode, dd, one, zero):  # pragma: no cover - device
    """Row ``r`` of table ``P`` (rows, D) and accumulator ``A[r]``, with gradient row ``k`` of
    ``G``, in place: the reference's ``rowwise_adagrad_rows`` for one row. ``dd`` is ``D`` in
    the dtype, ``one``/``zero`` 1 and 0 in the dtype (so every operation stays in it)."""
    width = P.shape[1]
    s = zero
    for d in range(width):  # element order, from +0
        x = G[k, d]
        if mode == 1:  # L2: fma(wd, w, g), only the sum of squares sees it
            x = ops.fma(wd, P[r, d], x)
        s = ops.add(s, ops.mul(x, x))
    a = ops.add(A[r], ops.div(s, dd))
    mult = ops.div(lr, ops.add(ops.sqrt(a), eps))
    corr = one
    if mode == 1:
        corr = ops.fma(-mult, wd, one)
    elif mode == 2:
        corr = ops.fma(-lr, wd, one)
    for d in range(width):  # w[d] is read before it is written
        P[r, d] = ops.fma(corr, P[r, d], -ops.mul(G[k, d], mult))
    A[r] = a


def _exact(P, G, A, rows, direct, lr, eps, wd, mode, dd, one, zero):  # pragma: no cover
    """Thread ``t`` < ``G.shape[0]``: row ``t`` (``direct``) or ``rows[t]`` with gradient row ``t``."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for t in range(start, G.shape[0], stride):
        r = t if direct else rows[t]
        _row_step_dev(P, r, G, t, A, lr, eps, wd, mode, dd, one, zero)


def _sequential(P, A, vals, order, starts, urows, lr, eps, wd, mode, dd, one,
                zero):  # pragma: no cover
    """Thread ``t`` < ``urows.shape[0]``: row ``urows[t]``, its occurrences
    ``order[starts[t]:starts[t + 1]]`` one after another."""
    start = cuda.grid(1)
    stride = cuda.gridsize(1)
    for t in range(start, urows.shape[0], stride):
        r = urows[t]
        for j in range(starts[t], starts[t + 1]):
            _row_step_dev(P, r, vals, order[j], A, lr, eps, wd, mode, dd, one, zero)


_row_step_dev = None


def kernels():
    """``(exact, sequential)``: the two kernels, compiled on first use (lazily per dtype)."""
    global _KERNELS, _row_step_dev
    if _KERNELS is None:
        with _LOCK:
            if _KERNELS is None:
                if not simulator:
                    ops.register_cuda()
                _row_step_dev = cuda.jit(device=True)(_row_step)
                _KERNELS = (cuda.jit(_exact), cuda.jit(_sequential))
    return _KERNELS


def _scalars(dtype, width, learning_rate, epsilon, weight_decay, weight_decay_mode):
    """The kernels' scalars, rounded to ``dtype`` as the reference rounds them."""
    dt = np.dtype(dtype).type
    with np.errstate(all="ignore"):
        return (dt(learning_rate), dt(epsilon), dt(weight_decay), MODES[weight_decay_mode],
                dt(width), dt(1), dt(0))


def _no_rows():
    """A one-element int64 device array standing for "no row list" (never read; a new one
    each time, so that it always belongs to the current CUDA context)."""
    return cuda.to_device(np.zeros(1, np.int64))


def _grid(n):
    from refopt.kernels.cuda import _launch

    tpb = _launch._tpb()
    blocks = max(1, min(_launch._config_int("MAX_BLOCKS"), -(-int(n) // tpb)))
    return blocks, tpb


def exact_rows(table, grads, accumulator, rows, *, learning_rate, epsilon, weight_decay=0.0,
               weight_decay_mode="none"):
    r"""One exact row-wise Adagrad step of the given rows of a device table, in place.

    Parameters
    ----------
    table : numba device array, shape (V, D), float32 or float64, C-contiguous
    grads : numba device array, shape (n, D), dtype of ``table``
        Gradient row ``t`` belongs to table row ``rows[t]`` (or ``t`` when ``rows`` is None:
        then ``n == V``). Rows must be distinct (duplicates summed beforehand).
    accumulator : numba device array, shape (V,), dtype of ``table``
    rows : numba device array of int64, shape (n,), or None
    learning_rate, epsilon, weight_decay : float
        Rounded to the table's dtype (FBGEMM's C ``float`` for float32 tables).
    weight_decay_mode : {"none", "l2", "decoupled"}

    Notes
    -----
    Per row, :math:`a \leftarrow a + \frac1D\sum_d \tilde g_d^2`,
    :math:`w \leftarrow \mathrm{fma}(c, w, -g\,\eta/(\sqrt a + \epsilon))`, in the order and
    roundings of :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_rows` (bit for bit).
    One launch, one thread per row; nothing is checked here (the optimizer checks first).
    """
    n = grads.shape[0]
    if n == 0 or table.shape[1] == 0:
        return
    ex, _ = kernels()
    sc = _scalars(table.dtype, table.shape[1], learning_rate, epsilon, weight_decay,
                  weight_decay_mode)
    direct = rows is None
    if direct:
        rows = _no_rows()  # never read
    blocks, tpb = _grid(n)
    ex[blocks, tpb](table, grads, accumulator, rows, direct, *sc)


def sequential_rows(table, accumulator, values, order, starts, urows, *, learning_rate, epsilon,
                    weight_decay=0.0, weight_decay_mode="none"):
    """FBGEMM's approximate row-wise Adagrad on a device table, in place (one launch).

    Parameters
    ----------
    table : numba device array, shape (V, D), float32 or float64
    accumulator : numba device array, shape (V,)
    values : numba device array, shape (k, D)
        The occurrences' gradient rows, in order of appearance.
    order, starts, urows : numba device arrays of int64
        :func:`refopt.kernels.cuda._launch.sorted_rows` of the indices: the occurrences of
        row ``urows[t]`` are ``order[starts[t]:starts[t + 1]]``, in order of appearance.
    learning_rate, epsilon, weight_decay, weight_decay_mode
        As :func:`exact_rows`.

    Notes
    -----
    One thread per distinct row applies its occurrences in turn, each a step of
    :func:`exact_rows`' arithmetic on the row as the previous one left it: the reference's
    :func:`refopt.reference.rowwise_adagrad.rowwise_adagrad_sequential_update`, bit for bit.
    """
    n = urows.shape[0]
    if n == 0 or table.shape[1] == 0:
        return
    _, seq = kernels()
    sc = _scalars(table.dtype, table.shape[1], learning_rate, epsilon, weight_decay,
                  weight_decay_mode)
    blocks, tpb = _grid(n)
    seq[blocks, tpb](table, accumulator, values, order, starts, urows, *sc)


def ptx_audit(cc=(8, 0), dtypes=(np.float32, np.float64)):
    """Compile both kernels to PTX (no GPU; ``NUMBA_ENABLE_CUDASIM`` unset or 0) with the
    argument types :func:`exact_rows` and :func:`sequential_rows` pass, and audit them with
    :mod:`refopt.kernels.cuda.ptx`'s rules (no ``fma``/``mad``, every ``mul`` explicitly
    rounded, no ``.approx``/``.ftz``).

    Returns
    -------
    dict of str to list of str
        ``"<kernel> <dtype>"`` to its problems (empty lists: the audit passes).

    Raises
    ------
    RuntimeError
        Under the simulator, which compiles nothing.
    """
    from numba import types as T

    from refopt.kernels.cuda import ptx as X

    X._require_toolchain()
    kernels()  # registers the CUDA arithmetic and the device row step
    out = {}
    for dtype in dtypes:
        dt = T.float32 if np.dtype(dtype) == np.float32 else T.float64
        a2, a1, i1 = dt[:, ::1], dt[::1], T.int64[::1]
        sigs = {"exact": (_exact, (a2, a2, a1, i1, T.boolean, dt, dt, dt, T.int64, dt, dt, dt)),
                "sequential": (_sequential, (a2, a1, a2, i1, i1, i1, dt, dt, dt, T.int64, dt,
                                             dt, dt))}
        for name, (fn, sig) in sigs.items():
            with X._device_stand_in(tuple(cc)):
                text, _ = cuda.compile_ptx(fn, sig, cc=tuple(cc))
            out[f"{name} {np.dtype(dtype).name}"] = (X.audit_ops(X.float_ops(text))
                                                     + [f"{n} x {k}" for k, n in
                                                        X.approximations(text).items()])
    return out
