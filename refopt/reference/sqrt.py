"""The elementwise square root a convention's update takes (the ``sqrt`` convention knob).

PyTorch's CPU ``torch.sqrt`` on float32 and float64 tensors calls MKL's vector ``sqrt``
(``vmsSqrt``/``vmdSqrt``), which is not correctly rounded; its fused optimizer kernels take
the hardware's (correctly rounded) root instead. :func:`convention_sqrt` computes the root the
convention names: NumPy's ``np.sqrt`` (IEEE) or MKL's through :mod:`refopt._mkl`.
"""

from __future__ import annotations

import warnings

import numpy as np

from refopt import _mkl

__all__ = ["convention_sqrt", "needs_reference", "optimizer_takes_mkl_sqrt", "sqrt_function",
           "takes_mkl_sqrt"]

_MKL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_warned = False


def takes_mkl_sqrt(convention, fused_kernel=False):
    """Whether a step under ``convention`` takes MKL's root.

    Parameters
    ----------
    convention : refopt.conventions.Convention
    fused_kernel : bool
        The optimizer's step is taken from a PyTorch fused kernel under the ``torch_fused``
        preset (``Adam``, ``AdamW``): the knob value ``"torch_fused"`` then means IEEE.

    Returns
    -------
    bool
    """
    how = getattr(convention, "sqrt", "ieee")
    return how == "mkl" or (how == "torch_fused" and not fused_kernel)


def convention_sqrt(x, convention, fused_kernel=False):
    """``sqrt(x)`` elementwise, rounded as ``convention.sqrt`` says.

    Parameters
    ----------
    x : ndarray of float16, bfloat16, float32 or float64
    convention : refopt.conventions.Convention
    fused_kernel : bool
        See :func:`takes_mkl_sqrt`.

    Returns
    -------
    ndarray
        A new array of ``x``'s shape and dtype: ``np.sqrt(x)`` (knob ``"ieee"``, float16,
        bfloat16) or MKL's ``vmsSqrt``/``vmdSqrt`` (float32/float64 under ``"mkl"``, the
        value torch's CPU ``torch.sqrt`` gives on this machine).

    Warns
    -----
    RuntimeWarning
        ``"mkl"`` without torch and without the ``mkl`` wheel (once per process): the
        correctly rounded root is used instead (1 ulp off MKL's on some elements).
    """
    global _warned
    x = np.asarray(x)
    if x.dtype not in _MKL_DTYPES or not takes_mkl_sqrt(convention, fused_kernel):
        return np.asarray(np.sqrt(x))
    if not _mkl.mkl_available():
        if not _warned:
            _warned = True
            warnings.warn(
                "Convention knob sqrt='mkl' (torch's CPU torch.sqrt, MKL's vector sqrt) needs "
                "torch or the `mkl` wheel (pip install torch, or mkl); neither is installed, "
                "so the correctly rounded sqrt is used (about 1 ulp off torch on some "
                "elements). Received: sqrt=" + repr(convention.sqrt), RuntimeWarning,
                stacklevel=2)
        return np.asarray(np.sqrt(x))
    return _mkl.mkl_sqrt(x)


def optimizer_takes_mkl_sqrt(opt, grads=None):
    """Whether a step of optimizer ``opt`` takes MKL's root (then the fast backends compute it
    on the host, with the reference's numbers).

    An optimizer class declares its torch root with the class attribute ``_torch_sqrt``:
    ``"fused"`` (taken from a PyTorch fused kernel under ``"torch_fused"``: ``Adam``,
    ``AdamW``), ``"fused_dense"`` (the fused kernel on dense gradients, the for-loop on
    sparse ones: ``Adagrad``; fused only when ``grads``, the step's gradients, are given and
    none is an ``IndexedSlices``), ``"loop"`` (a for-loop path only), absent or None (no MKL
    root: the knob does not apply). Lazy optimizers (``SparseAdam``) count as for-loop.
    """
    kind = getattr(type(opt), "_torch_sqrt", None)
    if kind is None:
        return False
    if kind == "fused_dense":
        from refopt.indexed_slices import IndexedSlices

        fused = grads is not None and not any(isinstance(g, IndexedSlices) for g in grads)
    else:
        fused = kind == "fused" and not opt._is_lazy()
    return takes_mkl_sqrt(opt.convention, fused_kernel=fused)


def sqrt_function(convention, fused_kernel=False):
    """``x -> convention_sqrt(x, convention, fused_kernel)``: the root a reference form
    function takes as its ``sqrt`` argument (``np.sqrt`` when the convention's is IEEE)."""
    if convention is None or not takes_mkl_sqrt(convention, fused_kernel):
        return np.sqrt
    return lambda x: convention_sqrt(x, convention, fused_kernel)


def needs_reference(convention):
    """Whether a rule-built pure function (``refopt.kernels.cpu``/``cuda``) must hand a step
    under ``convention`` (a preset name, a Convention or None) to the reference: the
    convention's root for a for-loop optimizer is MKL's, which the rules do not compute."""
    if convention is None:
        return False
    if isinstance(convention, str):
        from refopt.conventions import PRESETS

        convention = PRESETS.get(convention)
    return convention is not None and takes_mkl_sqrt(convention)
