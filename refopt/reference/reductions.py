"""Sums of squares and 2-norms in each framework's order of addition.

A float sum depends on the order of its additions. The reference computes each norm in the
order the framework it reproduces adds (readable NumPy, independent of the fast paths'
:class:`refopt.rules.reduce.Reduction`, which the property tests compare with these):

``"numpy"``
    :func:`numpy_sum_squares`: ``np.sum(g * g, dtype)``, NumPy's pairwise summation
    (``numpy/_core/src/umath/loops_utils.h.src``, ``pairwise_sum``: under 8 terms left to
    right, up to 128 terms in 8 interleaved partial sums, longer runs split at ``n/2``
    rounded down to a multiple of 8), added to the identity ``+0``. The TensorFlow
    conventions' and optax's norms are computed so (see ``conformance/README.md`` for how
    close that is to the frameworks' own reductions at large sizes).
``"torch"``
    :func:`torch_sum_squares` and :func:`torch_vector_norm`: ``torch.linalg.vector_norm(g,
    2.0)`` on the CPU, as ``torch.nn.utils.clip_grad_norm_`` calls it (PyTorch 2.13 wheel,
    AVX2 kernels).
"""

from __future__ import annotations

import numpy as np

from refopt.reference.variants import fma

__all__ = ["numpy_sum_squares", "torch_sum_squares", "torch_vector_norm",
           "torch_stack_order", "torch_clip_coef", "torch_scale", "TORCH_VECTOR_BYTES"]

#: The width of PyTorch's ``Vectorized<T>`` in the AVX2 kernels: 8 float32 or 4 float64 lanes.
TORCH_VECTOR_BYTES = 32

#: How many of the last ``numel % lanes`` terms the compiled scalar tail adds with a separately
#: rounded square (GCC vectorised those squares, 4 float32 at a time) before it contracts the
#: rest into ``fma(x, x, s)``; per itemsize (measured on the 2.13 wheel, see
#: :func:`torch_sum_squares`).
TORCH_TAIL_UNFUSED = {4: 4, 8: 0}


def numpy_sum_squares(values):
    """``np.sum(g * g, dtype=g.dtype)`` of the array in C order (NumPy's pairwise sum)."""
    flat = np.ascontiguousarray(values).reshape(-1)
    with np.errstate(all="ignore"):
        return np.sum(flat * flat, dtype=flat.dtype)


def torch_sum_squares(values):
    r"""The sum of squares of ``torch.linalg.vector_norm(g, 2.0)`` on the CPU, before its root.

    Parameters
    ----------
    values : ndarray of float32 or float64
        Read in C order (PyTorch's contiguous gradient).

    Returns
    -------
    numpy scalar of the dtype

    Notes
    -----
    ``aten/src/ATen/native/cpu/ReduceOpsKernel.cpp`` (``norm_kernel_tensor_iterator_impl``,
    the ``val == 2.0`` branch taken for a contiguous float32 or float64 input reduced over
    all its elements, ``is_reduce_lastdim``) through ``binary_kernel_reduce_lastdim``
    (``aten/src/ATen/native/cpu/Reduce.h``), which runs the whole reduction of one output
    serially (no cascade, no chunking, no threads: the result does not depend on
    ``torch.set_num_threads``). With :math:`L` lanes (``Vectorized<T>``: 8 float32 or 4
    float64 in the AVX2 build) and :math:`m = n - n \bmod L`:

    1. one vector accumulator from zero, :math:`a_j \leftarrow a_j + x_i x_i` for
       :math:`i = j, j + L, \dots < m` (``norm_two_reduce_step``: the square and the add
       each rounded; the compiler did not contract these);
    2. the lanes added in order, :math:`s = ((a_0 + a_1) + a_2) + \dots + a_{L-1}`;
    3. the scalar tail :math:`i = m, \dots, n - 1`, ``s += x * x``: the compiler vectorised
       the squares of the first 4 float32 terms of a tail of at least 4 (each square
       rounded, then added in order) and contracted the others into
       :math:`s \leftarrow \mathrm{fma}(x, x, s)` (every float64 tail term is contracted).

    Steps 1-3 were established by comparing with ``torch.linalg.vector_norm`` on thousands
    of random arrays of every size from 1 to 300 and up to 10^6 (``tests/test_reductions.py``
    keeps the comparison and golden values recorded from PyTorch). The float32 ``fma`` is
    computed as :func:`refopt.reference.variants.fma` does (through float64).
    """
    x = np.ascontiguousarray(values).reshape(-1)
    dtype = x.dtype
    lanes = TORCH_VECTOR_BYTES // dtype.itemsize
    n = x.size
    m = n - n % lanes
    with np.errstate(all="ignore"):
        acc = np.zeros(lanes, dtype)
        if m:
            # each lane's running sum, one block of L squares after another (cumulative sums
            # along axis 0 are strictly sequential); the accumulator starts at zero
            blocks = x[:m].reshape(-1, lanes)
            acc = np.add.accumulate(np.vstack([acc, blocks * blocks]), axis=0)[-1]
        s = acc[0]
        for j in range(1, lanes):
            s = s + acc[j]
        tail = x[m:]
        unfused = TORCH_TAIL_UNFUSED[dtype.itemsize] if tail.size >= 4 else 0
        for k, v in enumerate(tail):
            s = s + v * v if k < unfused else fma(v, v, s)[()]
    return dtype.type(s)


def _torch_half_sum_squares(x):
    # float16 takes the generic reduction (binary_kernel_reduce with NormTwoOps, a float
    # accumulator): float32(x)**2 added serially from zero. The square of a float16 value is
    # exact in float32 (22 significand bits at most, no overflow), so contracted or not,
    # each step is one float32 addition: a cumulative sum (strictly sequential).
    xs = x.astype(np.float32)
    return np.add.accumulate(xs * xs)[-1]


def torch_vector_norm(values):
    """``torch.linalg.vector_norm(g, 2.0)`` on the CPU (C order).

    No element: 0. One element (any shape of size 1, a 0-d tensor included): ``|x|``
    (``linalg_vector_norm`` returns ``abs`` when every reduced dimension has size 1,
    ``aten/src/ATen/native/LinearAlgebra.cpp``). Otherwise, float32 and float64: ``sqrt``
    of :func:`torch_sum_squares`, rounded to the dtype; float16: the squares summed serially
    in float32 (PyTorch's generic reduction), the root rounded to float16 (bfloat16 likewise:
    checked against torch 2.13 at every size 1-299 and up to 10^5; float16 checked up to
    10^5 elements; above 32768 PyTorch splits the sum among its threads, which float16's
    rounding of the root hid in the cases measured).
    """
    x = np.ascontiguousarray(values).reshape(-1)
    if x.size == 0:
        return x.dtype.type(0)
    if x.size == 1:
        return np.abs(x[0])
    with np.errstate(all="ignore"):
        if x.dtype.itemsize == 2:  # float16 and bfloat16: the same generic reduction
            return np.sqrt(_torch_half_sum_squares(x)).astype(x.dtype)[()]
        return np.sqrt(torch_sum_squares(x))


def torch_stack_order(dtypes):
    """The order in which ``torch.nn.utils.get_total_norm`` stacks the per-tensor norms.

    It groups the gradients by device and dtype (``torch._C._group_tensors_by_device_and_dtype``,
    a C++ ``unordered_map``) and extends the list of norms group by group: the groups come
    in the reverse order of their dtype's first appearance (measured for float16, float32
    and float64, every permutation), each group's tensors in their order. Returns the
    positions of ``dtypes`` in that order.
    """
    firsts = []
    for d in dtypes:
        if np.dtype(d) not in firsts:
            firsts.append(np.dtype(d))
    return [k for d in reversed(firsts) for k, e in enumerate(dtypes) if np.dtype(e) == d]


def torch_clip_coef(total, max_norm, dtype):
    """``clip_grad_norm_``'s ``clamp(max_norm / (total + 1e-6), max=1.0)`` in ``dtype``.

    Each operation is a PyTorch kernel on a 0-d tensor of the total norm's dtype, so each is
    rounded to it: ``total + 1e-6``, then the reciprocal (a Python float over a tensor is
    ``reciprocal(t) * max_norm``), then the product; float16 kernels compute in float32
    (PyTorch's ``opmath``) with the scalars ``1e-6`` and ``max_norm`` in float32, and round
    each result to float16. A NaN stays NaN.
    """
    dtype = np.dtype(dtype)
    work = np.dtype(np.float32) if dtype == np.float16 else dtype
    total = np.asarray(total)
    with np.errstate(all="ignore"):
        x = (total.astype(work) + work.type(1e-6)).astype(dtype)
        r = (work.type(1) / x.astype(work)).astype(dtype)
        coef = (r.astype(work) * work.type(max_norm)).astype(dtype)
        return np.minimum(coef, dtype.type(1))  # NaN propagates


def torch_scale(values, coef):
    """``g.mul_(coef)`` (``_foreach_mul_``) with the 0-d tensor ``coef``: the product in
    ``g``'s dtype, float16 computed in float32 with ``coef`` in float32 (PyTorch's
    ``opmath``; ``coef`` may be wider than ``g``), rounded once."""
    values = np.asarray(values)
    work = np.dtype(np.float32) if values.dtype == np.float16 else values.dtype
    with np.errstate(all="ignore"):
        return (values.astype(work) * work.type(coef)).astype(values.dtype)
