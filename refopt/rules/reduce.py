"""Reductions: the second kind of rule, per-tensor sums in a named order.

An element rule (:class:`refopt.rules.Rule`) maps each element to new values on its own; a
*reduction* combines every element of a tensor into one number. A :class:`Reduction` is an
element map written with :mod:`refopt.rules.ops` (``square(x) = mul(x, x)``) whose terms
are added up in the order one framework adds them. The drivers build the kernels from it as
from a rule: :func:`refopt.kernels.cpu.drivers.reduce` (one multi-tensor kernel per
reduction and order, per-tensor results from an address table) and
:func:`refopt.kernels.cuda.drivers.reduce` (the device sums the independent parts of the
order, the host finishes it). Norm clipping's sums of squares are :data:`SUM_SQUARES` and
:data:`SUM_HALF_SQUARES`; Adafactor's row and column sums and Lamb's trust-ratio norms will
be reductions too.

Orders (:data:`ORDERS`):

``"numpy"``
    What ``np.sum``/``np.add.reduce`` does on a contiguous 1-d float array: the identity
    ``+0`` plus NumPy's pairwise sum (``pairwise_sum`` in
    ``numpy/_core/src/umath/loops_utils.h.src``): a run of fewer than 8 terms is added left
    to right from ``-0.0``; a run of at most :data:`NUMPY_LEAF` (128) terms goes into 8
    interleaved partial sums (term ``i`` into ``r[i % 8]``, the first 8 terms starting
    them), combined as ``((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))``, then the
    remaining ``n % 8`` terms left to right; a longer run splits at ``n2 = n // 2 - (n // 2)
    % 8`` and adds the two halves' sums. float16 terms are widened to float32 before they
    are added (NumPy's ``HALF_pairwise_sum``) and the result rounded back once.
``"torch"``
    ``torch.linalg.vector_norm(g, 2.0)``'s sum on the CPU (PyTorch 2.13, AVX2 kernels; see
    :func:`refopt.reference.reductions.torch_sum_squares` for the sources and the
    measurements): ``L = 32 / itemsize`` lane accumulators from zero, term ``i < m = n - n %
    L`` added into lane ``i % L`` in order; the lanes added left to right; then the tail
    ``i >= m`` added one by one, the first :data:`TORCH_TAIL_UNFUSED` terms of a tail of at
    least 4 as ``add(s, element(x))`` and the others contracted, ``fused(s, x)`` (a
    reduction without ``fused`` adds them all). float32 and float64 only.

The element map takes the reduction's scalars ``sc`` (a tuple of :data:`N_REDUCE_SCALARS`
values of the dtype): ``element(x, sc) -> term``. ``fused(acc, x, sc)`` is ``acc +
element(x, sc)`` rounded once, where a framework's compiler contracts it (for a square:
``fma(x, x, acc)``).

The reference computes the same sums independently (:mod:`refopt.reference.reductions`,
``np.sum``); the tests compare them bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from numba.extending import register_jitable

from refopt.rules.ops import fma, mul

__all__ = ["Reduction", "ORDERS", "SUM_SQUARES", "SUM_HALF_SQUARES", "reduce_scalars",
           "torch_lanes", "torch_unfused", "numpy_tree"]

#: The orders of addition the drivers know.
ORDERS = ("numpy", "torch")

#: NumPy's pairwise sum: runs of at most this many terms are leaves (``PW_BLOCKSIZE``).
NUMPY_LEAF = 128

#: PyTorch's vector width in the AVX2 kernels, in bytes (``Vectorized<T>``).
TORCH_VECTOR_BYTES = 32

#: Per itemsize: how many leading terms of a tail of at least 4 PyTorch's compiled scalar
#: tail adds unfused (GCC vectorised 4 float32 squares; it contracts every float64 one).
TORCH_TAIL_UNFUSED = {4: 4, 8: 0}

#: The drivers hand a reduction this many scalars (padded with zeros).
N_REDUCE_SCALARS = 2


@dataclass(frozen=True)
class Reduction:
    """A per-tensor sum of an element map, for every fast target.

    Parameters
    ----------
    name : str
        A short name (kernel names, reports).
    element : callable
        ``element(x, sc) -> term``, a module-level function written with
        :mod:`refopt.rules.ops` (``@register_jitable``).
    fused : callable or None
        ``fused(acc, x, sc)``: ``acc + element(x, sc)`` rounded once, where an order
        contracts the addition (PyTorch's scalar tail); ``None``: never contracted.
    """

    name: str
    element: Callable
    fused: Callable | None = None


def reduce_scalars(dtype, values=()):
    """A tuple of :data:`N_REDUCE_SCALARS` scalars of ``dtype`` (padded with zeros)."""
    values = list(values)
    if len(values) > N_REDUCE_SCALARS:
        raise ValueError(f"A reduction takes at most {N_REDUCE_SCALARS} scalars. "
                         f"Received {len(values)}")
    values += [0] * (N_REDUCE_SCALARS - len(values))
    dt = np.dtype(dtype)
    with np.errstate(all="ignore"):
        return np.array([dt.type(v) for v in values], dt)


def torch_lanes(dtype):
    """PyTorch's lane count for ``dtype`` (8 float32, 4 float64)."""
    return TORCH_VECTOR_BYTES // np.dtype(dtype).itemsize


def torch_unfused(dtype, tail):
    """How many leading terms of a tail of ``tail`` terms PyTorch adds unfused."""
    return TORCH_TAIL_UNFUSED[np.dtype(dtype).itemsize] if tail >= 4 else 0


def numpy_tree(n):
    """NumPy's pairwise tree of ``n`` terms: its leaves ``(lo, count)`` from left to right
    and, from the root down, each level's mask of internal nodes and the range of its leaves
    (a level's nodes are the two children of each internal node of the level above, in
    order): ``(leaf_lo, leaf_n, levels)``."""
    lo = np.zeros(1, np.int64)
    size = np.full(1, n, np.int64)
    leaf_lo, leaf_n, levels = [], [], []
    count = 0
    while lo.size:
        internal = size > NUMPY_LEAF
        leaves = ~internal
        k = int(leaves.sum())
        levels.append((internal, count, count + k))
        leaf_lo.append(lo[leaves])
        leaf_n.append(size[leaves])
        count += k
        half = size[internal] // 2
        half -= half % 8
        lo = np.stack([lo[internal], lo[internal] + half], axis=1).reshape(-1)
        size = np.stack([half, size[internal] - half], axis=1).reshape(-1)
    return np.concatenate(leaf_lo), np.concatenate(leaf_n), levels


# ----------------------------------------------------------------------------- reductions
@register_jitable
def square(x, sc):
    """``x * x``."""
    return mul(x, x)


@register_jitable
def square_fused(acc, x, sc):
    """``acc + x * x`` rounded once."""
    return fma(x, x, acc)


@register_jitable
def half_square(x, sc):
    """``(x * x) * sc[0]`` (``tf.nn.l2_loss``'s term with ``sc[0] = 0.5``)."""
    return mul(mul(x, x), sc[0])


#: ``sum(x * x)``: norm clipping's sum of squares.
SUM_SQUARES = Reduction("sum_squares", square, square_fused)

#: ``sum((x * x) * h)`` with ``h = sc[0]``: TensorFlow's global norm sums ``l2_loss`` halves
#: (``h = 0.5``).
SUM_HALF_SQUARES = Reduction("sum_half_squares", half_square)


def torch_vector_norms(sums, singles):
    """``torch.linalg.vector_norm(g, 2.0)`` of each tensor from its :data:`SUM_SQUARES` in the
    ``"torch"`` order: ``sqrt(sum)`` (0 for no element), except for a tensor of one element,
    whose norm PyTorch takes as ``|x|`` (``singles[k]``: that element, ``None`` for a tensor
    of any other size). Host arithmetic, in the sums' dtype."""
    sums = np.asarray(sums)
    with np.errstate(all="ignore"):
        norms = np.sqrt(sums)
    for k, x in enumerate(singles):
        if x is not None:
            norms[k] = np.abs(sums.dtype.type(x))
    return norms
