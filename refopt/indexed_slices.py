"""The sparse gradient type: rows of a table, as TensorFlow's ``tf.IndexedSlices``.

An embedding lookup ``table[indices]`` has a gradient that is non-zero only in the looked-up
rows. TensorFlow represents it as ``IndexedSlices(values, indices, dense_shape)``: row ``i`` of
``values`` belongs to row ``indices[i]`` of the dense gradient. An index may appear several times
(a word that occurs twice in a batch); the dense gradient is then the *sum* of those rows.
"""

from __future__ import annotations

import numbers

import numpy as np

__all__ = ["IndexedSlices"]


class IndexedSlices:
    """A sparse gradient for a table: ``values`` are rows placed at ``indices``.

    Parameters
    ----------
    values : array_like of float, shape ``(n,) + dense_shape[1:]``
        One row per index. Converted with ``np.asarray`` (no copy if already an ndarray);
        its dtype must be a floating dtype (float16, float32 or float64).
    indices : array_like of int, shape ``(n,)``
        Row numbers, each in ``[0, dense_shape[0])``. Duplicates are allowed and mean "sum".
        Any integer dtype is accepted; ``n`` may be 0 (an empty gradient). They are copied and
        made read-only, so validated indices cannot be changed afterwards.
    dense_shape : tuple of int
        Shape of the dense tensor (the variable), at least one dimension.

    Raises
    ------
    TypeError
        If ``indices`` is not of an integer dtype, ``values`` not of a floating dtype, or
        ``dense_shape`` not a sequence of non-negative integers.
    ValueError
        If ``indices`` is not 1-D, ``values.shape != (len(indices),) + dense_shape[1:]``, or an
        index lies outside ``[0, dense_shape[0])``. The message names the offending argument and
        shows the value received.

    Notes
    -----
    Mirrors ``tf.IndexedSlices`` (``tensorflow/python/framework/indexed_slices.py``). TensorFlow
    does not validate on construction (an out-of-range index fails later, inside a scatter
    kernel); refopt validates eagerly so that a bad gradient never reaches an optimizer.

    Examples
    --------
    >>> import numpy as np
    >>> g = IndexedSlices(np.array([[1., 2.], [3., 4.]]), np.array([1, 1]), (3, 2))
    >>> g.to_dense()
    array([[0., 0.],
           [4., 6.],
           [0., 0.]])
    """

    __slots__ = ("_values", "_indices", "_dense_shape", "_unique")

    def __init__(self, values, indices, dense_shape):
        try:
            dense_shape = tuple(dense_shape)
        except TypeError:
            raise TypeError(
                "`dense_shape` must be a sequence of non-negative integers. "
                f"Received: dense_shape={dense_shape!r}"
            ) from None
        if (
            len(dense_shape) == 0
            or not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in dense_shape)
            or any(int(d) < 0 for d in dense_shape)
        ):
            raise TypeError(
                "`dense_shape` must be a non-empty sequence of non-negative integers. "
                f"Received: dense_shape={dense_shape!r}"
            )
        dense_shape = tuple(int(d) for d in dense_shape)

        indices = np.array(indices)  # a private copy: validated indices cannot change later
        if indices.size == 0 and indices.dtype.kind == "f":
            indices = indices.astype(np.int64)  # np.array([]) is float64; an empty list is fine
        if indices.dtype.kind not in "iu":
            raise TypeError(
                "`indices` must have an integer dtype. "
                f"Received: indices with dtype={indices.dtype} ({_preview(indices)})"
            )
        if indices.ndim != 1:
            raise ValueError(
                f"`indices` must be 1-D. Received: indices with shape={indices.shape}"
            )
        values = np.asarray(values)
        if values.dtype not in (np.float16, np.float32, np.float64) and (
                values.dtype.name != "bfloat16"):  # ml_dtypes.bfloat16
            raise TypeError(
                "`values` must have dtype float16, float32 or float64. "
                f"Received: values with dtype={values.dtype}"
            )
        expected = (indices.shape[0],) + dense_shape[1:]
        if values.shape != expected:
            raise ValueError(
                "`values` must have shape (len(indices),) + dense_shape[1:] = "
                f"{expected}. Received: values with shape={values.shape}, "
                f"indices with shape={indices.shape}, dense_shape={dense_shape}"
            )
        if indices.size:
            bad = (indices < 0) | (indices >= dense_shape[0])
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"`indices` must lie in [0, {dense_shape[0]}) (dense_shape[0]). "
                    f"Received: indices[{first}]={int(indices[first])}"
                )
        indices.flags.writeable = False
        self._values = values
        self._indices = indices
        self._dense_shape = dense_shape
        self._unique = False  # set by deduplicate(): deduplicating again returns self

    @property
    def values(self):
        """ndarray: the rows, shape ``(n,) + dense_shape[1:]`` (the caller's array, not copied)."""
        return self._values

    @property
    def indices(self):
        """ndarray of int, shape ``(n,)``: a validated, read-only copy of the row numbers."""
        return self._indices

    @property
    def dense_shape(self):
        """tuple of int: the shape of the dense tensor."""
        return self._dense_shape

    @property
    def dtype(self):
        """numpy.dtype: the dtype of ``values``."""
        return self.values.dtype

    def deduplicate(self):
        """Sum the rows of duplicate indices.

        Returns
        -------
        IndexedSlices
            An object with unique ``indices`` in order of first appearance and, for each,
            the sum of its rows, accumulated from zero in order of appearance (``0 + v_a + v_b
            + ...`` in the dtype of ``values``). Indices become int64. Inputs are not modified.
            The result remembers that it is deduplicated: deduplicating it again returns it
            unchanged (the same object), so a pipeline pays for the summation once.

        Notes
        -----
        Reproduces TensorFlow's ``Optimizer._deduplicate_indexed_slices``
        (``tensorflow/python/training/optimizer.py``) and tf-keras'
        ``_deduplicate_sparse_grad`` (``tf_keras/optimizers/optimizer.py``): ``tf.unique``
        (first-appearance order) then ``unsorted_segment_sum`` (zero-initialised, summed in
        input order). For unique indices the result is bit-identical to the input rows, except
        that a ``-0.0`` becomes ``+0.0`` (``0 + -0.0``), as in TensorFlow.
        """
        if self._unique:
            return self
        unique, first_pos, inverse = np.unique(
            self.indices, return_index=True, return_inverse=True
        )
        # np.unique sorts; reorder the unique ids by first appearance, as tf.unique does.
        order = np.argsort(first_pos, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        segment = rank[inverse.reshape(-1)]
        summed = np.zeros((unique.size,) + self.values.shape[1:], dtype=self.values.dtype)
        _scatter_add_in_order(summed, segment, self.values)
        out = IndexedSlices(summed, unique[order].astype(np.int64), self.dense_shape)
        out._unique = True
        return out

    def to_dense(self):
        """Scatter-add the rows into a new dense array.

        Returns
        -------
        ndarray, shape ``dense_shape``, dtype of ``values``
            Zeros everywhere, plus the sum of the rows at each index (summed in the order of
            :meth:`deduplicate`).
        """
        dense = np.zeros(self.dense_shape, dtype=self.values.dtype)
        _scatter_add_in_order(dense, self.indices, self.values)
        return dense

    def __repr__(self):
        return (
            f"IndexedSlices(values={_preview(self.values)}, indices={_preview(self.indices)}, "
            f"dense_shape={self.dense_shape})"
        )


def _scatter_add_in_order(out, rows, values):
    """``out[rows[i]] += values[i]`` for i = 0, 1, ... in order (sequential, deterministic).

    ``np.add.at`` is unbuffered and applies the updates in input order. It is several times
    faster on a flat 1-D target than with row indices into a 2-D one, so rows are expanded to
    element offsets first. ``out`` must be C-contiguous.
    """
    width = int(np.prod(out.shape[1:], dtype=np.int64))
    flat_out = out.reshape(-1)
    if width == 1:
        np.add.at(flat_out, rows, values.reshape(-1))
        return
    offsets = (np.asarray(rows, dtype=np.int64)[:, None] * width + np.arange(width)).reshape(-1)
    np.add.at(flat_out, offsets, values.reshape(-1))


def _preview(a, limit=6):
    flat = np.asarray(a).reshape(-1)
    head = ", ".join(repr(x.item()) for x in flat[:limit])
    more = ", ..." if flat.size > limit else ""
    return f"array(shape={np.shape(a)}, [{head}{more}])"
