"""Shared helpers of the CPU backend: argument checks (the reference's own), scalar tables.

The checks and the scalar rounding are those of :mod:`refopt.reference._common`, imported
rather than rewritten, so that both backends accept and refuse exactly the same arguments and
round every hyperparameter the same way before it reaches a kernel.
"""

from __future__ import annotations

import sys

import numpy as np

from refopt.reference._common import (  # noqa: F401  (re-exported for the kernels' modules)
    FLOAT_DTYPES,
    as_float_array,
    check_flag,
    check_grad,
    check_like,
    check_scalar,
    check_step,
    lr_cast,
    scalar,
    tf_cast,
)

#: float16 is computed by the reference (Numba has no float16 arithmetic on the CPU).
FALLBACK_DTYPES = (np.dtype(np.float16),)


#: Below this many elements (about 0.1 ms of work) a parallel kernel runs on the calling
#: thread only (its serial twin): a parallel region costs microseconds to start, and on a
#: loaded machine its barrier can wait for a descheduled worker for milliseconds (measured on
#: this project's shared 2-core machine: a 0.5 ms lazy step took 12-16 ms with 2 threads
#: while another process ran). Lowered from 2**21 when torch's fused Adam, which runs its
#: threads from about 3e5 elements, was faster between 3e5 and 1e6 elements
#: (benchmarks/bench_cpu.py --dense-only: 0.84x at 3e5 with 2**21, 0.96-0.99x with 2**17).
PARALLEL_MIN_ELEMENTS = 1 << 17


_SERIAL = {}  # parallel kernel -> its serial twin (drivers.with_serial_twins), or False


def launch(kernel, args, n_elements):
    """Call a ``parallel=True`` kernel, on one thread when ``n_elements`` is small.

    Small work runs the kernel's serial twin when its module has one (``NAME_serial``, see
    :func:`refopt.kernels.cpu.drivers.with_serial_twins`), else the kernel with Numba's
    thread count set to one and restored afterwards. The thread count never changes the
    results (every element is computed by the same operations whichever thread runs it).
    """
    if n_elements >= PARALLEL_MIN_ELEMENTS:
        return kernel(*args)
    serial = _SERIAL.get(kernel)
    if serial is None:
        mod = sys.modules.get(getattr(kernel, "py_func", kernel).__module__)
        serial = _SERIAL[kernel] = getattr(mod, kernel.__name__ + "_serial", False)
    if serial:
        return serial(*args)
    import numba

    previous = numba.get_num_threads()
    if previous == 1:
        return kernel(*args)
    numba.set_num_threads(1)
    try:
        return kernel(*args)
    finally:
        numba.set_num_threads(previous)


def table(*arrays):
    """``(addresses, counts)`` int64 arrays of C-contiguous arrays, for the multi-tensor kernels."""
    addr = np.array([a.ctypes.data for a in arrays], np.int64)
    cnt = np.array([a.size for a in arrays], np.int64)
    return addr, cnt


def rows2d(a):
    """A C-contiguous ``(rows, row_size)`` view (or copy) of a table or of sparse values."""
    a = np.ascontiguousarray(a)
    width = int(np.prod(a.shape[1:], dtype=np.int64))
    return a.reshape(a.shape[0], width)


def stable_order(indices):
    """A stable sort of row indices: ``(order, sorted_rows)``, both int64.

    ``sorted_rows = indices[order]`` is ascending and equal rows keep their order of
    appearance, so a run of equal rows lists its gradient rows in input order. The rows and
    positions are packed into one int64 key (``row << bits | position``) and sorted with
    NumPy's (vectorised) sort, ten times faster than a stable argsort; if a row is too large
    to pack, ``np.argsort(kind="stable")`` is used instead. ``indices`` are validated
    (non-negative).
    """
    idx = np.asarray(indices).astype(np.int64, copy=False)
    n = idx.shape[0]
    bits = max(1, int(n).bit_length())
    if n == 0 or int(idx.max()) < (1 << (62 - bits)):
        keys = np.sort((idx << bits) | np.arange(n, dtype=np.int64))
        return keys & ((1 << bits) - 1), keys >> bits
    order = np.argsort(idx, kind="stable")
    return order, idx[order]


def deduplicate(grad):
    """:meth:`refopt.IndexedSlices.deduplicate`, compiled: the same object, bit for bit.

    The rows are put in a stable order (:func:`stable_order`) and summed by the drivers'
    segment sums (``refopt.kernels.cpu._kernels._segment_sums``: from +0, in order of
    appearance), then the unique rows are put in order of first appearance, as
    ``deduplicate`` returns them. About ten times faster than NumPy's ``np.add.at`` on 16384
    rows of 64 float32 (the staged step of the sparse optimizers calls it). float16 values,
    rows of no element and empty gradients take :meth:`~refopt.IndexedSlices.deduplicate`.
    """
    from refopt.indexed_slices import IndexedSlices

    if grad._unique:
        return grad
    values = grad.values
    n = grad.indices.shape[0]
    if values.dtype not in (np.float32, np.float64) or n == 0 or values.size == 0:
        return grad.deduplicate()
    from refopt.kernels.cpu._kernels import _segment_sums

    order, srows = stable_order(grad.indices)
    one = values.dtype.type(1)
    rows, sums = _segment_sums(order, srows, rows2d(values), 0, one, one, one)
    first = order[np.flatnonzero(np.concatenate(([True], srows[1:] != srows[:-1])))]
    by_first = np.argsort(first)  # positions are distinct: any sort is stable
    out = IndexedSlices(sums[by_first].reshape((rows.shape[0],) + values.shape[1:]),
                        rows[by_first], grad.dense_shape)
    out._unique = True
    return out
