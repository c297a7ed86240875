"""Per-tensor sums of squares over a tensor split across ranks, in NumPy's order, exactly.

The single-process pipeline reduces each gradient's squares with NumPy's pairwise sum
(``np.sum``; the CPU kernels' twin follows the same tree, :func:`refopt.rules.reduce.numpy_tree`):
the identity ``+0`` plus ``pw(0, n)``, where ``pw(lo, n)`` is a leaf (at most 128 terms, 8
interleaved partial sums) or ``pw(lo, h) + pw(lo + h, n - h)`` with ``h = n // 2 - (n // 2) % 8``.
A node of that tree depends only on its own terms, so when a tensor's elements are split
across ranks, each rank computes every *maximal* node lying wholly in its part with ``np.sum``
(a subtree is ``np.sum`` of its terms) and sends, for the at most two leaves cut by its part's
ends, the raw terms it has of them. Every rank then rebuilds the root from these parts in the
tree's own order: the result is the single-process sum bit for bit, whatever the split, for
``O(log n)`` numbers plus at most 256 terms per rank and tensor.
"""

from __future__ import annotations

import numpy as np

from refopt.rules.reduce import NUMPY_LEAF

__all__ = ["combine_parts", "local_parts"]


def _split(n):
    half = n // 2
    return half - half % 8


def local_parts(terms, lo, n_total):
    """The parts of one tensor's sum that this rank contributes.

    Parameters
    ----------
    terms : ndarray, 1-d
        The terms (``g * g`` or ``g * g * 0.5``, already mapped) of this rank's elements
        ``[lo, lo + terms.size)`` of the tensor, in C order.
    lo : int
        Where they start in the tensor.
    n_total : int
        The tensor's number of elements.

    Returns
    -------
    (nodes, raws)
        ``nodes``: ``[(start, count, value)]`` for the maximal tree nodes wholly inside this
        part (``value`` is ``np.sum`` of their terms); ``raws``: ``[(start, terms)]`` for the
        pieces of leaves the part cuts.
    """
    hi = lo + terms.size
    nodes, raws = [], []
    if terms.size == 0:
        return nodes, raws
    dtype = terms.dtype
    stack = [(0, n_total)]
    while stack:
        s, n = stack.pop()
        e = s + n
        if e <= lo or s >= hi or n == 0:
            continue
        if lo <= s and e <= hi:
            nodes.append((s, n, np.sum(terms[s - lo:e - lo], dtype=dtype)))
        elif n <= NUMPY_LEAF:
            a, b = max(s, lo), min(e, hi)
            raws.append((a, terms[a - lo:b - lo].copy()))
        else:
            h = _split(n)
            stack.append((s + h, n - h))
            stack.append((s, h))
    return nodes, raws


def combine_parts(parts, n_total, dtype):
    """A tensor's ``np.sum`` of its terms from every rank's :func:`local_parts`.

    Parameters
    ----------
    parts : list of (nodes, raws)
        Every rank's parts for the tensor (any order).
    n_total : int
    dtype : numpy.dtype
        The terms' dtype (float32 or float64).

    Returns
    -------
    numpy scalar of ``dtype``
        ``0 + pw(0, n_total)``, exactly as ``np.sum`` of the whole tensor's terms.
    """
    dtype = np.dtype(dtype)
    nodes = {}
    raws = []
    for node_list, raw_list in parts:
        for s, n, v in node_list:
            nodes[(s, n)] = v
        raws.extend(raw_list)
    raws.sort(key=lambda r: r[0])
    starts = [r[0] for r in raws]

    def leaf(s, n):
        import bisect
        k = bisect.bisect_left(starts, s)
        pieces = []
        while k < len(raws) and raws[k][0] < s + n:
            pieces.append(raws[k][1])
            k += 1
        terms = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
        if terms.size != n:  # a bug, never the user's input
            raise RuntimeError(f"norm parts cover {terms.size} of the {n} terms of a leaf")
        return np.sum(terms, dtype=dtype)

    def node(s, n):
        v = nodes.get((s, n))
        if v is not None:
            return v
        if n <= NUMPY_LEAF:
            return leaf(s, n)
        h = _split(n)
        return dtype.type(node(s, h) + node(s + h, n - h))

    if n_total == 0:
        return dtype.type(0)
    with np.errstate(all="ignore"):
        return dtype.type(dtype.type(0) + node(0, n_total))
