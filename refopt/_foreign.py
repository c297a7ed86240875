"""Framework arrays as variables and gradients of the stateful optimizers.

The optimizers compute on NumPy arrays (``backend="reference"``, ``"cpu"``) or numba device
arrays (``backend="cuda"``) and identify a variable by object identity. This module lets a
caller pass the arrays of other libraries instead, without copying a variable:

- a **torch CPU tensor** (a ``torch.nn.Parameter`` included) is viewed with
  ``tensor.detach().numpy()``, which shares its memory, so the update lands in the tensor;
- an object with **``__dlpack__``** is viewed with :func:`numpy.from_dlpack`, one with
  **``__array__``** (or ``__array_interface__``) with :func:`numpy.asarray`, when that view is
  writeable and is the object's memory (not a copy);
- under ``backend="cuda"`` a **torch CUDA tensor** goes to the executor as it is (through its
  ``__cuda_array_interface__``), detached once when it requires grad (torch refuses the
  interface then).

The view of a variable is made once and cached on the optimizer (``opt._foreign_views``:
``id(object) -> (object, view)``), so the same tensor object always maps to the same view,
and the optimizer's identity rule holds: pass the same objects at every step.

A gradient may be a torch tensor too (a sparse COO one with one sparse dimension, as
``torch.nn.Embedding(sparse=True)`` gives, becomes an :class:`~refopt.IndexedSlices` with
its indices in their order of appearance, duplicates kept: the optimizer sums them), or any
object with ``__dlpack__`` / ``__array__`` (read-only is fine for a gradient).

After refopt has written torch tensors in place (a step, ``finalize_variable_values``),
their autograd version counters are bumped (``torch.autograd.graph.increment_version``),
as torch's own in-place operations do: a
``backward()`` through a graph recorded before the step then raises torch's "modified by an
inplace operation" error instead of computing gradients from the new values. Only a step
that succeeded bumps them (a refused one changes nothing).

An array that can only be viewed read-only (a JAX array, a read-only buffer) cannot be
updated in place: it is refused with a ``ValueError`` that names the argument and points to
:mod:`refopt.functional`, the pure-function API that returns new arrays.

torch is never imported here: a tensor is recognised only when ``torch`` is already in
``sys.modules`` (it must be, for the caller to have one).
"""

from __future__ import annotations

import sys

import numpy as np

from refopt.indexed_slices import IndexedSlices

__all__ = [
    "gradient",
    "is_torch_tensor",
    "lookup",
    "pairs",
    "stepped",
    "torch_gradient",
    "torch_variable_view",
    "touched",
    "variable",
    "variables",
]

_FLOAT_NAMES = ("float16", "float32", "float64")

_FUNCTIONAL_HINT = (
    "Variables are updated in place; for immutable arrays use refopt.functional (pure "
    "`init`/`step` functions returning new arrays, e.g. "
    "refopt.functional.functional(refopt.Adam, learning_rate=1e-3)).")


def is_torch_tensor(x):
    """Whether ``x`` is a ``torch.Tensor`` (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_host(opt):
    return opt._executor.name != "cuda"


def _cache(opt):
    cache = opt.__dict__.get("_foreign_views")
    if cache is None:
        cache = opt.__dict__["_foreign_views"] = {}
    return cache


def _check_torch_dtype(t, where):
    name = str(t.dtype).replace("torch.", "")
    if name not in _FLOAT_NAMES:
        raise TypeError(
            f"{where} is a torch tensor of dtype {t.dtype}; refopt computes in float16, float32 "
            "or float64 (torch.bfloat16 and integer tensors are not supported).")


def torch_variable_view(t, where, host=True):
    """The array refopt updates for the torch tensor ``t``, sharing its memory.

    Parameters
    ----------
    t : torch.Tensor
        A dense (strided), contiguous float16/32/64 tensor; CPU for ``host``, CUDA otherwise.
    where : str
        How to name ``t`` in an error message (``"var_list[2]"``).
    host : bool
        True: a NumPy view (``t.detach().numpy()``); False (``backend="cuda"``): the tensor
        itself, or its ``detach()`` when it requires grad (same memory).

    Returns
    -------
    numpy.ndarray or torch.Tensor

    Raises
    ------
    TypeError
        A sparse tensor, a dtype other than float16/32/64, a CUDA tensor for a host backend
        or a CPU tensor for ``backend="cuda"``.
    ValueError
        A non-contiguous tensor (an in-place update needs its memory in C order).
    """
    if t.layout != sys.modules["torch"].strided:
        raise TypeError(f"{where} is a torch tensor with layout={t.layout}; a variable must be "
                        "a dense (strided) tensor.")
    _check_torch_dtype(t, where)
    dev = t.device.type
    if host and dev != "cpu":
        raise TypeError(
            f"{where} is a torch tensor on device {t.device}; this optimizer's backend keeps "
            "variables in host memory. Use backend='cuda' for CUDA tensors, or CPU tensors.")
    if not host and dev != "cuda":
        raise TypeError(
            f"{where} is a torch tensor on device {t.device}; backend='cuda' keeps variables "
            "on the GPU (move the model with .cuda(), or use backend='cpu').")
    if not t.is_contiguous():
        raise ValueError(
            f"{where} is a torch tensor with shape={tuple(t.shape)}, strides={t.stride()}: not "
            "contiguous; variables are updated in place and must be contiguous (a "
            ".contiguous() copy would not be the tensor).")
    d = t.detach()
    return d.numpy() if host else d


def _readonly_error(where, obj):
    return ValueError(f"{where} ({type(obj).__module__}.{type(obj).__name__}) can only be "
                      f"viewed read-only. {_FUNCTIONAL_HINT}")


def _address(a):
    return a.__array_interface__["data"][0]


def _host_view(obj, where):
    """A writeable NumPy view of a foreign object's memory, or an error."""
    if hasattr(obj, "__dlpack__"):
        try:
            a = np.from_dlpack(obj)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            if not (hasattr(obj, "__array__") or hasattr(obj, "__array_interface__")):
                raise TypeError(f"{where} ({type(obj).__name__}) cannot be viewed as a host "
                                f"array through DLPack: {exc}") from None
        else:
            if not a.flags.writeable:
                raise _readonly_error(where, obj)
            return a
    a = np.asarray(obj)
    if not a.flags.writeable:
        raise _readonly_error(where, obj)
    if a.size and _address(np.asarray(obj)) != _address(a):  # a fresh copy on every call
        raise ValueError(
            f"{where} ({type(obj).__name__}) gives a new copy of its data on every "
            f"np.asarray() call, so an in-place update would be lost. {_FUNCTIONAL_HINT}")
    return a


def _is_foreign_array(x):
    return (hasattr(x, "__dlpack__") or hasattr(x, "__array__")
            or hasattr(x, "__array_interface__"))


def _make_view(opt, var, where):
    if is_torch_tensor(var):
        return torch_variable_view(var, where, host=_is_host(opt))
    if not _is_host(opt) or isinstance(var, np.ndarray) or not _is_foreign_array(var):
        return var  # the executor's own checks and messages
    return _host_view(var, where)


def variable(opt, var, where):
    """The array ``opt`` computes on for the variable ``var`` (``var`` itself if it is one).

    Creates and caches the view of a foreign array on first sight (see the module docstring);
    ``where`` names ``var`` in an error message.
    """
    if type(var) is np.ndarray:
        return var
    cache = _cache(opt)
    entry = cache.get(id(var))
    if entry is not None and entry[0] is var:
        view = entry[1]
        if entry[2] is not None and var.data_ptr() != entry[2]:
            raise ValueError(
                f"{where}: the torch tensor's memory moved since the optimizer first saw it "
                "(its .data was replaced, or it was moved or resized); the optimizer's state "
                "belongs to the old memory. Create a new optimizer for the new tensor.")
        return view
    view = _make_view(opt, var, where)
    if view is not var:  # a torch tensor's address is kept, to notice a replaced .data
        tensor = is_torch_tensor(var)
        cache[id(var)] = (var, view, var.data_ptr() if tensor else None)
        if tensor:  # view -> tensor, for touched(): its version counter after a write
            _tensors(opt)[id(view)] = var
    return view


def _tensors(opt):
    tensors = opt.__dict__.get("_foreign_tensors")
    if tensors is None:
        tensors = opt.__dict__["_foreign_tensors"] = {}
    return tensors


def touched(opt, positions=None):
    """Bump the autograd version counter of the torch tensors among ``opt``'s variables at
    ``positions`` (all when None), after refopt wrote them in place.

    Without it a ``backward()`` through a graph recorded before the write would use the new
    values silently; with it torch raises its "modified by an inplace operation" error, as
    after ``torch.optim``'s steps. Costs one dict look-up when no variable is a torch tensor.
    """
    tensors = opt.__dict__.get("_foreign_tensors")
    if not tensors:
        return
    variables = opt._vars
    where = range(len(variables)) if positions is None else positions
    hit = [tensors[id(variables[i])] for i in where if id(variables[i]) in tensors]
    if hit:
        sys.modules["torch"].autograd.graph.increment_version(hit)


def stepped(opt, positions):
    """:func:`touched` for a step that updated the variables at ``positions`` and has been
    counted (``opt.iterations`` is the new count): every variable when the step overwrote
    the weights with their moving averages (``use_ema`` with ``ema_overwrite_frequency``;
    under the Keras 3 and torch EMA that covers variables without a gradient too)."""
    if not opt.__dict__.get("_foreign_tensors"):
        return
    freq = opt.ema_overwrite_frequency if opt.use_ema else None
    touched(opt, None if freq and opt._iterations % freq == 0 else positions)


def lookup(opt, var):
    """The cached view of ``var`` if it is a foreign variable the optimizer has seen, else
    ``var`` (nothing is created: for :meth:`~refopt.Optimizer.get_slot` and friends)."""
    if type(var) is np.ndarray:
        return var
    cache = opt.__dict__.get("_foreign_views")
    entry = cache.get(id(var)) if cache else None
    return entry[1] if entry is not None and entry[0] is var else var


def variables(opt, var_list, what):
    """``var_list`` with each foreign variable replaced by its view (a list), or unchanged
    when it is a single array (the executor then refuses it with its message)."""
    if isinstance(var_list, np.ndarray):
        return var_list
    if is_torch_tensor(var_list) or (not isinstance(var_list, (list, tuple))
                                     and _is_foreign_array(var_list)):
        raise TypeError(f"`{what}` must be a list of arrays, not a single array. Received: "
                        f"{type(var_list).__name__}")
    return [variable(opt, v, f"{what}[{i}]") for i, v in enumerate(var_list)]


def torch_gradient(g, where, host=True):
    """A torch gradient as refopt takes it: a NumPy array (host) or the CUDA tensor, or an
    :class:`~refopt.IndexedSlices` for a sparse COO tensor with one sparse dimension.

    Raises
    ------
    TypeError
        Another sparse layout or more sparse dimensions, an unsupported dtype, a tensor on a
        device the backend does not compute on.
    """
    torch = sys.modules["torch"]
    g = g.detach()
    if g.layout == torch.sparse_coo:
        if g.sparse_dim() != 1:
            raise TypeError(
                f"{where} is a sparse COO tensor with sparse_dim={g.sparse_dim()}; refopt's "
                "sparse gradients are rows (IndexedSlices: sparse_dim=1, as "
                "torch.nn.Embedding(sparse=True) gives). Pass g.to_dense() instead.")
        _check_torch_dtype(g, where)
        values = g._values().cpu().numpy()
        indices = g._indices()[0].cpu().numpy()
        return IndexedSlices(values, indices, tuple(g.shape))
    if g.layout != torch.strided:
        raise TypeError(f"{where} is a torch tensor with layout={g.layout}; gradients must be "
                        "dense tensors or sparse COO tensors of rows.")
    _check_torch_dtype(g, where)
    if host:
        if g.device.type != "cpu":
            raise TypeError(f"{where} is a torch tensor on device {g.device}; this optimizer's "
                            "backend computes in host memory (use backend='cuda').")
        return g.numpy()
    return g


def gradient(opt, grad, where):
    """The gradient ``grad`` as the executor of ``opt`` takes it (``grad`` if already so)."""
    if grad is None or type(grad) is np.ndarray or type(grad) is IndexedSlices:
        return grad
    if is_torch_tensor(grad):
        return torch_gradient(grad, where, host=_is_host(opt))
    if not _is_host(opt) or isinstance(grad, np.ndarray) or not _is_foreign_array(grad):
        return grad
    if hasattr(grad, "__dlpack__"):
        try:
            return np.from_dlpack(grad)
        except (BufferError, RuntimeError, TypeError, ValueError):
            pass
    return np.asarray(grad)


def pairs(opt, grads_and_vars):
    """``grads_and_vars`` (a list) with foreign gradients and variables converted; the same
    list object when nothing is foreign (malformed pairs are left to the executor)."""
    out = None
    for i, pair in enumerate(grads_and_vars):
        try:
            g, v = pair
        except (TypeError, ValueError):
            return grads_and_vars if out is None else out + list(grads_and_vars[i:])
        if type(v) is np.ndarray and (g is None or type(g) is np.ndarray
                                      or type(g) is IndexedSlices):
            if out is not None:
                out.append(pair)
            continue
        if out is None:
            out = list(grads_and_vars[:i])
        out.append((gradient(opt, g, f"Gradient at position {i}"),
                    variable(opt, v, f"variable at position {i}")))
    return grads_and_vars if out is None else out
