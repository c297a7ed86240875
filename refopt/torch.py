"""refopt's optimizers as ``torch.optim.Optimizer`` s: TF's (or torch's, optax's...) numbers in a
torch training loop.

``import refopt.torch`` needs PyTorch; ``import refopt`` does not (nothing here is imported by
the package).

Two ways to name an optimizer:

- **torch's names** (drop-in for ``torch.optim``): :class:`Adam`, :class:`AdamW`, :class:`SGD`,
  :class:`SparseAdam`, :class:`RMSprop`, :class:`Adagrad`, :class:`Adadelta`,
  :class:`Adamax`, :class:`NAdam`, :class:`RAdam`, :class:`ASGD`, :class:`Rprop` take
  torch's keywords (``lr``, ``betas``, ``eps``, ``weight_decay``, ``alpha``, ...), with
  ``convention="torch"`` by default (torch.optim's default CPU path; ``fused=True`` selects
  ``"torch_fused"``), plus ``convention=`` and ``backend=``; they map to the
  refopt class and keywords of :data:`TORCH_NAMES` (``betas -> beta_1, beta_2``,
  ``eps -> epsilon``, RMSprop's ``alpha -> rho``, ``SparseAdam -> LazyAdam``,
  ``NAdam -> Nadam``; ``weight_decay=0`` means none). Any other refopt keyword of the class
  (``clipnorm``, ``use_ema``...) is accepted too, under refopt's name. A keyword left out takes
  the *convention's* default (``refopt.torch.Adam(params, convention="tf_keras")`` has TF's
  epsilon 1e-7; under ``"torch"`` 1e-8), except ``lr``, whose default is torch's.
- **refopt's names**: :class:`RefoptOptimizer` ``(params, refopt.Lamb, lr=..., beta_1=...,
  convention=...)`` wraps any refopt class (yours included) with its own Keras-style
  keywords; only the learning rate is ``lr`` (``learning_rate=`` is accepted as an alias).

In both, each parameter group gets its own refopt optimizer, built with the group's
hyperparameters (``param_groups[i]`` holds them under the names above, with every default
filled in). At every :meth:`~RefoptOptimizer.step` the group's refopt optimizer takes
``group["lr"]``, so torch's learning-rate schedulers (``StepLR``, ``LambdaLR``, ...) drive it;
refopt stores it as the convention does (float32 under the TensorFlow conventions, a Python
float under ``"torch"`` and ``"optax"``). Other hyperparameters are fixed when the group is
added: changing one afterwards (``OneCycleLR`` cycling ``betas`` does) raises ``ValueError``.

What refopt keeps per optimizer is therefore per group: under the TensorFlow conventions each
group has its own ``iterations`` (a group none of whose parameters has a gradient does not
count the step), and ``use_ema`` averages each parameter in its group's optimizer.
``global_clipnorm`` would clip each group by its own norm, not by the model's: it is refused
where more than one group would carry it (clip first with
``torch.nn.utils.clip_grad_norm_``, as with torch.optim). Under the Keras conventions
(``"tf_keras"``, ``"keras3"``) ``weight_decay`` is Keras' decoupled decay
(``w -= lr * wd * w`` before the step), not torch's L2 term added to the gradient; the other
conventions give it their framework's meaning (``"torch"``: torch's; see
:mod:`refopt.conventions`).

Parameters are updated in place with no copy: CPU tensors through ``tensor.numpy()`` views
(``backend="reference"`` or ``"cpu"``), CUDA tensors through ``__cuda_array_interface__``
(``backend="cuda"``; **never run on a GPU**), and each updated parameter's autograd version
counter is bumped, as torch's in-place updates do (a ``backward()`` through a graph
recorded before the step raises). :meth:`~RefoptOptimizer.step` is a graph break under
``torch.compile``. A parameter whose ``.grad`` is ``None`` is
skipped (under ``"torch"`` its step count does not move; under the TensorFlow conventions the
group's ``iterations`` counts the step, as ``apply_gradients`` does). A sparse COO gradient
(``nn.Embedding(sparse=True)``) becomes an :class:`~refopt.IndexedSlices` (indices in their
order of appearance), for the optimizers that take one (:class:`SparseAdam`, ``Adagrad``,
``SGD``...; others raise refopt's error); :class:`SparseAdam` refuses a dense gradient with
torch's ``RuntimeError``.

``optimizer.state[p]`` holds, per parameter, ``"step"`` (a float32 tensor, as torch's) and
each refopt slot under refopt's name (``"m"``, ``"v"``, ``"vhat"``, ``"average"``...) as a
tensor sharing memory with refopt's live state. :meth:`~RefoptOptimizer.state_dict` is
torch's format (``"state"``, ``"param_groups"``) with copies of those tensors, plus a
``"refopt"`` entry: per group, refopt's :meth:`refopt.Optimizer.state_dict` without its slots
(class, config, iterations, learning rate, per-parameter step counts).
:meth:`~RefoptOptimizer.load_state_dict` restores it all or nothing and resumes bit for bit.
torch.optim's own state dicts cannot be loaded (the slot names and conventions differ).

Examples
--------
>>> import torch, refopt.torch
>>> model = torch.nn.Linear(3, 1)
>>> opt = refopt.torch.Adam(model.parameters(), lr=1e-3, convention="tf_keras")
>>> loss = model(torch.ones(2, 3)).square().mean()
>>> loss.backward()
>>> opt.step()
>>> opt.zero_grad()
>>> sorted(opt.state[model.weight])
['m', 'step', 'v']
"""

from __future__ import annotations

import copy
import inspect
import math
import numbers
from collections import defaultdict
from typing import ClassVar

import numpy as np
import torch

import refopt
from refopt import _foreign
from refopt.executors import default_backend
from refopt.optimizers.base import Optimizer as _RefoptBase

__all__ = [
    "ASGD",
    "SGD",
    "TORCH_NAMES",
    "Adadelta",
    "Adagrad",
    "Adam",
    "AdamW",
    "Adamax",
    "NAdam",
    "RAdam",
    "RMSprop",
    "RefoptOptimizer",
    "Rprop",
    "SparseAdam",
]

# refopt constructor arguments that are not per-group hyperparameters
# maximize: the adapter's own keyword (it negates the gradients itself, under any convention)
_NOT_HYPER = ("self", "learning_rate", "name", "backend", "convention", "jit_compile",
              "maximize")


def _hyper_names(cls):
    """The keyword hyperparameters ``cls`` (a refopt optimizer class) takes, in order."""
    names = []
    accepts_kwargs = False
    for klass in (cls, _RefoptBase):
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.kind == p.VAR_KEYWORD:
                accepts_kwargs = True
            elif p.name not in _NOT_HYPER and p.name not in names and p.kind != p.VAR_POSITIONAL:
                names.append(p.name)
        if not accepts_kwargs:
            break
    return names


def _lr_value(lr, where):
    """``lr`` as a float (a 0-d tensor is read), or a clear error."""
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1:
            raise ValueError(f"{where} must be a number or a one-element tensor. Received a "
                             f"tensor of shape {tuple(lr.shape)}")
        lr = lr.item()
    if not isinstance(lr, numbers.Real) or isinstance(lr, bool):
        raise TypeError(f"{where} must be a float. Received: {lr!r}")
    lr = float(lr)
    if not math.isfinite(lr) or lr < 0:
        raise ValueError(f"{where} must be finite and >= 0. Received: {lr!r}")
    return lr


def _same(a, b):
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        try:
            return bool(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))
        except (TypeError, RuntimeError):
            return False
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def _plain(value):
    """A tensor hyperparameter (torch allows ``betas`` of tensors) as a Python number."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


def _graph_break(fn):
    """``fn`` run eagerly under ``torch.compile`` (a graph break): refopt computes on the
    tensors' memory in NumPy/Numba, which dynamo cannot trace. torch.optim's own mechanism
    (``torch._disable_dynamo``: ``torch._dynamo`` is imported on the first call, not at
    import, which would add seconds to ``import refopt.torch``); ``torch.compiler.disable``
    where a torch lacks it."""
    lazy = getattr(torch, "_disable_dynamo", None)
    return lazy(fn) if lazy is not None else torch.compiler.disable(fn)


def _check_global_clipnorm(groups):
    """Refuse ``global_clipnorm`` in more than one group: each group's refopt optimizer would
    clip by its own group's norm, which is not the global norm the name promises."""
    carrying = [k for k, g in enumerate(groups) if g.get("global_clipnorm") is not None]
    if len(carrying) > 1:
        values = ", ".join(f"param_groups[{k}]['global_clipnorm']="
                           f"{groups[k]['global_clipnorm']!r}" for k in carrying)
        raise ValueError(
            f"`global_clipnorm` is set in {len(carrying)} parameter groups ({values}); each "
            "group has its own refopt optimizer, so each would clip by its own group's norm, "
            "not by the norm of all the gradients. Clip all gradients once before step(), as "
            "with torch.optim: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) "
            "(or use one parameter group).")


class RefoptOptimizer(torch.optim.Optimizer):
    """A ``torch.optim.Optimizer`` that computes each step with a refopt optimizer.

    Parameters
    ----------
    params : iterable of torch.Tensor, of dicts, or of (name, tensor) pairs
        As for any ``torch.optim.Optimizer``: the parameters, or parameter groups (dicts with
        ``"params"`` and any hyperparameter of this optimizer, overriding the constructor's).
        Dense float16/32/64 tensors, contiguous; on the CPU for ``backend="reference"`` and
        ``"cpu"``, on a CUDA device for ``backend="cuda"``.
    optimizer_class : type
        A :class:`refopt.Optimizer` subclass (``refopt.Adam``, ``refopt.Lamb``, your own).
    lr : float or 0-d torch.Tensor, optional
        The learning rate, >= 0 and finite (``learning_rate=`` is an alias). Default: the
        class's default under the convention. Schedulers change ``group["lr"]``; each step
        uses the current value.
    convention : str, dict or refopt.conventions.Convention, optional
        The numerics (see :class:`refopt.Optimizer`). Default: the class's default
        (``"tf_keras"`` for most; the torch-named classes of this module default to
        ``"torch"``).
    backend : {"reference", "cpu", "cuda"}, optional
        refopt's backend. Default: refopt's default.
    maximize : bool, default False
        Maximise the objective: the gradient is negated first, as torch does (exact).
    **hyperparameters
        Any keyword of ``optimizer_class`` other than ``learning_rate``, ``name``,
        ``backend``, ``convention``, ``jit_compile`` (e.g. ``beta_1=0.95``, ``clipnorm=1.0``).
        A value ``None`` means the class's default; the group is filled with the value used.

    Raises
    ------
    TypeError
        ``optimizer_class`` is not a refopt optimizer class, an unknown keyword, a parameter
        that is not a tensor (torch's error), a tensor of another dtype or on a device the
        backend does not compute on, a learning rate that is not a number.
    ValueError
        An invalid hyperparameter (refopt's message, naming it and the value), an empty
        parameter list, a parameter in two groups (torch's errors), a non-contiguous
        parameter, ``global_clipnorm`` in more than one group (it would clip each group by
        its own norm: use ``torch.nn.utils.clip_grad_norm_`` before :meth:`step`).

    Notes
    -----
    :meth:`step` raises (changing nothing in that group) where the refopt optimizer refuses
    a gradient (e.g. a sparse gradient for ``Adam`` under ``"torch"``); groups stepped before
    the failing one keep their step. Hyperparameters other than ``lr`` are fixed per group.
    Parameters whose ``.data`` is replaced after the first step are refused (the refopt
    state belongs to the old memory).
    """

    #: torch keyword -> the refopt keywords it stands for (a tuple value unpacks).
    _rename: ClassVar[dict] = {}
    #: torch keywords whose 0 means "none" (torch skips weight decay 0; refopt wants None).
    _zero_is_none: ClassVar[tuple] = ()
    #: torch's own checks of a group's hyperparameters: ``check(group, where)`` raises.
    _group_checks: ClassVar[tuple] = ()
    #: torch's SparseAdam: a dense gradient is refused (torch's RuntimeError).
    _sparse_gradients_only: ClassVar[bool] = False

    def __init__(self, params, optimizer_class, lr=None, *, convention=None, backend=None,
                 maximize=False, learning_rate=None, **hyperparameters):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, _RefoptBase)):
            raise TypeError(
                "`optimizer_class` must be a refopt optimizer class (e.g. refopt.Adam). "
                f"Received: optimizer_class={optimizer_class!r}")
        if learning_rate is not None:
            if lr is not None:
                raise TypeError("Give the learning rate once, as `lr` (or `learning_rate`). "
                                f"Received: lr={lr!r}, learning_rate={learning_rate!r}")
            lr = learning_rate
        if not isinstance(maximize, (bool, np.bool_)):
            raise TypeError(f"`maximize` must be a bool. Received: maximize={maximize!r}")
        self._cls = optimizer_class
        self._convention = convention
        self._backend = backend
        refopt_names = _hyper_names(optimizer_class)
        renamed = {t for targets in self._rename.values() for t in targets}
        self._hyper_keys = list(self._rename) + [n for n in refopt_names if n not in renamed]
        unknown = [k for k in hyperparameters if k not in self._hyper_keys]
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got unexpected keyword arguments {unknown} for "
                f"{optimizer_class.__name__}; its hyperparameters are {self._hyper_keys}.")
        if lr is not None:
            _lr_value(lr, "`lr`")
        defaults = {"lr": lr, "maximize": bool(maximize)}
        defaults.update({k: hyperparameters.get(k) for k in self._hyper_keys})
        self._ropts = []  # one refopt optimizer per param group
        self._frozen = []  # per group: the hyperparameters it was built with
        self._linked = []  # per group: the refopt optimizer whose slots self.state shows
        super().__init__(params, defaults)

    # ---------------------------------------------------------------- groups
    def _refopt_kwargs(self, group):
        kwargs = {}
        for key in self._hyper_keys:
            value = _plain(group.get(key))
            if value is None or (key in self._zero_is_none and value == 0):
                continue
            targets = self._rename.get(key, (key,))
            if len(targets) == 1:
                kwargs[targets[0]] = value
                continue
            try:
                parts = tuple(value)
            except TypeError:
                parts = ()
            if len(parts) != len(targets):
                raise ValueError(f"`{key}` must be a tuple of {len(targets)} numbers "
                                 f"({', '.join(targets)}). Received: {key}={value!r}")
            kwargs.update(zip(targets, parts))
        return kwargs

    def _make_refopt(self, group):
        kwargs = self._refopt_kwargs(group)
        if group.get("lr") is not None:
            kwargs["learning_rate"] = _lr_value(group["lr"], "`lr`")
        if self._convention is not None:
            kwargs["convention"] = self._convention
        if self._backend is not None:
            kwargs["backend"] = self._backend
        return self._cls(**kwargs)

    def _fill_group(self, group, ropt):
        """Write the values the refopt optimizer uses where the group says None."""
        config = ropt.get_config()
        for key in self._hyper_keys:
            if group.get(key) is not None:
                continue
            targets = self._rename.get(key, (key,))
            if not all(t in config for t in targets):
                continue
            value = tuple(config[t] for t in targets) if len(targets) > 1 else config[targets[0]]
            if value is None and key in self._zero_is_none:
                value = 0
            group[key] = value
        if group.get("lr") is None:
            group["lr"] = ropt.learning_rate

    def _check_params(self, group, where):
        host = self._ropts_backend_is_host()
        for i, p in enumerate(group["params"]):
            _foreign.torch_variable_view(p, f"{where}['params'][{i}]", host=host)

    def _ropts_backend_is_host(self):
        return (self._backend or default_backend()) != "cuda"

    def add_param_group(self, param_group):
        """Add a parameter group (torch's rules), with its own refopt optimizer.

        Raises
        ------
        TypeError, ValueError
            torch's errors, refopt's for an invalid hyperparameter, or a parameter the
            backend cannot update in place; ``ValueError`` for ``global_clipnorm`` in a
            second group, and torch's own rules (``SGD``: ``nesterov`` needs a momentum and
            no ``dampening``). The optimizer is then unchanged.
        """
        n = len(self.param_groups)
        super().add_param_group(param_group)
        try:
            group = self.param_groups[-1]
            self._check_params(group, f"param_groups[{n}]")
            ropt = self._make_refopt(group)
            self._fill_group(group, ropt)
            for check in self._group_checks:
                check(group, f"param_groups[{n}]")
            _check_global_clipnorm(self.param_groups)
        except BaseException:
            del self.param_groups[n:]
            raise
        self._ropts.append(ropt)
        self._frozen.append({k: copy.deepcopy(group[k]) for k in self._hyper_keys + ["maximize"]})
        self._linked.append(None)

    def _check_frozen(self, k, group):
        for key, value in self._frozen[k].items():
            if not _same(group.get(key), value):
                raise ValueError(
                    f"param_groups[{k}][{key!r}] changed from {value!r} to {group.get(key)!r}; "
                    f"{type(self).__name__} follows changes of 'lr' only (each group's refopt "
                    "optimizer is built with the other hyperparameters). Create a new "
                    "optimizer, or load a state_dict saved with the new values.")

    # ---------------------------------------------------------------- the step
    @property
    def _step_supports_amp_scaling(self):
        """True where torch's own optimizer would run a fused kernel (refopt's ``Adam``,
        ``AdamW``, ``SGD``, ``Adagrad`` under ``"torch_fused"``): ``torch.amp.GradScaler``
        then leaves the unscaling to :meth:`step` (``grad_scale``, ``found_inf``), which
        divides by the scale as the fused kernel does, instead of multiplying the gradients
        by ``f32(1/s)`` itself."""
        from refopt.optimizers.loss_scale import _fused_kernel_divides

        return bool(self._ropts) and all(_fused_kernel_divides(r) for r in self._ropts)

    def _amp_unscaled(self, g, grad_scale):
        """``g / grad_scale`` as torch's fused kernels compute it (in the gradient's dtype,
        the float32 scale converted exactly); float16/bfloat16 gradients, which the kernel
        divides in float32 without rounding, are refused."""
        if g.dtype in (torch.float16, torch.bfloat16):
            raise NotImplementedError(
                "torch.amp.GradScaler with a fused optimizer on float16/bfloat16 gradients "
                "(the fused kernel unscales them in float32 without rounding) is not "
                f"reproduced by refopt.torch. Received a gradient of dtype {g.dtype}")
        return g / grad_scale.to(device=g.device, dtype=g.dtype).reshape(())

    @_graph_break
    @torch.no_grad()
    def step(self, closure=None):
        """One step of every group's refopt optimizer on the parameters that have a ``.grad``.

        Parameters
        ----------
        closure : callable, optional
            Re-evaluates the model and returns the loss; called once, with gradients enabled,
            before the step (as torch's optimizers do).

        Returns
        -------
        The closure's loss, or None.

        Raises
        ------
        ValueError
            A group's ``lr`` is negative or not finite, or another hyperparameter changed
            (checked for every group before any step), plus what the refopt optimizer raises
            (its step then changes nothing).
        TypeError
            A gradient the backend cannot take (dtype, device, layout).
        RuntimeError
            :class:`SparseAdam` given a dense gradient (torch's error; checked before any
            step).

        Notes
        -----
        Every parameter refopt updated gets its autograd version counter bumped, as after
        torch's in-place updates: a ``backward()`` through a graph recorded before the step
        raises torch's "modified by an inplace operation" error. Under
        :func:`torch.compile` the step is a graph break (``torch.compiler.disable``): it runs
        eagerly, the code around it is compiled.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # torch.amp.GradScaler on a fused optimizer (_step_supports_amp_scaling): skip on an
        # inf, else divide by the scale in the step, as torch's fused kernels do
        found_inf = getattr(self, "found_inf", None)
        grad_scale = getattr(self, "grad_scale", None)
        if found_inf is not None and float(found_inf) != 0:
            return loss
        plans = []
        for k, group in enumerate(self.param_groups):
            self._check_frozen(k, group)
            lr = _lr_value(group["lr"], f"param_groups[{k}]['lr']")
            neg = group["maximize"]
            pairs = [(-p.grad if neg else p.grad, p) for p in group["params"]
                     if p.grad is not None]
            if grad_scale is not None:
                pairs = [(self._amp_unscaled(g, grad_scale), p) for g, p in pairs]
            if self._sparse_gradients_only and any(not g.is_sparse for g, _ in pairs):
                raise RuntimeError(
                    f"{type(self).__name__} does not support dense gradients, please consider "
                    "Adam instead")
            plans.append((k, group, lr, pairs))
        for k, group, lr, pairs in plans:
            if not pairs:
                continue
            ropt = self._ropts[k]
            if not ropt.built:
                ropt.build(group["params"])
            if ropt.learning_rate != lr:
                ropt.learning_rate = lr
            ropt.apply_gradients(pairs)
            self._sync_state(k, [p for _, p in pairs])
        return loss

    # ---------------------------------------------------------------- state
    def _step_of(self, ropt, p):
        if ropt.convention.step_counter == "per_variable":
            return ropt._var_steps[ropt._position(p)]
        return ropt.iterations

    def _sync_state(self, k, params=None):
        """Point ``self.state[p]`` at group ``k``'s live slots; refresh the step counts."""
        ropt = self._ropts[k]
        group = self.param_groups[k]
        if not ropt.built:
            return
        if self._linked[k] is not ropt:
            for p in group["params"]:
                entry = {}
                for name in ropt.slot_names:
                    slot = ropt.get_slot(p, name)
                    entry[name] = (torch.from_numpy(slot) if isinstance(slot, np.ndarray)
                                   else torch.as_tensor(slot, device=p.device))
                self.state[p] = entry
            self._linked[k] = ropt
            params = group["params"]
        for p in params if params is not None else group["params"]:
            entry = self.state[p]
            step = float(self._step_of(ropt, p))
            if "step" in entry:
                entry["step"].fill_(step)
            else:
                entry["step"] = torch.tensor(step, dtype=torch.float32)

    def state_dict(self):
        """torch's ``state_dict`` (copies), plus ``"refopt"``: per group, refopt's state
        without its slots (those are in ``"state"``).

        Returns
        -------
        dict
            ``"state"``: parameter index -> ``{"step": float32 tensor, slot name: tensor}``
            (copies) for the parameters of groups that have stepped; ``"param_groups"``:
            torch's; ``"refopt"``: list, one dict per group (:meth:`refopt.Optimizer.state_dict`
            without ``"slots"``).
        """
        sd = super().state_dict()
        sd["state"] = {i: {name: (v.clone() if isinstance(v, torch.Tensor) else v)
                           for name, v in s.items()} for i, s in sd["state"].items()}
        records = []
        for ropt in self._ropts:
            rec = ropt.state_dict()
            rec.pop("slots")
            records.append(rec)
        sd["refopt"] = records
        return sd

    def load_state_dict(self, state_dict):
        """Restore what :meth:`state_dict` returned (possibly through ``torch.save``/``load``).

        Parameters
        ----------
        state_dict : dict
            From this class's :meth:`state_dict`, with the same number of groups and
            parameters per group.

        Raises
        ------
        TypeError
            ``state_dict`` is not a dict.
        ValueError
            It is not a refopt.torch state dict (torch.optim's have no ``"refopt"`` entry),
            the groups or their sizes differ, a hyperparameter is invalid, or refopt's
            :meth:`~refopt.Optimizer.load_state_dict` refuses a group (another class or
            configuration, a slot of another shape or dtype...; the message names the group,
            the hyperparameter, the saved value and this optimizer's). Nothing changes then.

        Notes
        -----
        As ``torch.optim.Optimizer.load_state_dict``: the hooks registered with
        ``register_load_state_dict_pre_hook`` run first, on a shallow copy of
        ``state_dict`` (one may edit it or return another dict, which is then loaded), and
        those registered with ``register_load_state_dict_post_hook`` run after it loaded.
        An error in a pre-hook or in the checks changes nothing.
        """
        if not isinstance(state_dict, dict):
            raise TypeError("`state_dict` must be a dict, as state_dict() returns. Received: "
                            f"{type(state_dict).__name__}")
        state_dict = state_dict.copy()  # shallow, as torch's: a pre-hook may edit it
        for hook in getattr(self, "_optimizer_load_state_dict_pre_hooks", {}).values():
            result = hook(self, state_dict)
            if result is not None:
                state_dict = result
        self._load(state_dict)
        for hook in getattr(self, "_optimizer_load_state_dict_post_hooks", {}).values():
            hook(self)

    def _config_mismatch(self, k, ropt, rec):
        """A clear error when group ``k``'s saved refopt record does not fit ``ropt`` (this
        optimizer's refopt optimizer, built from the saved group), or None."""
        saved_cls = rec.get("class")
        if saved_cls is not None and saved_cls != self._cls.__name__:
            return ValueError(
                f"loaded state dict's parameter group {k} was computed by refopt.{saved_cls}; "
                f"this {type(self).__name__} computes with refopt.{self._cls.__name__}.")
        config = rec.get("config")
        if not isinstance(config, dict):
            return None  # refopt's load_state_dict names what is wrong
        try:
            diffs = ropt._config_differences(config)
        except TypeError:
            return None
        if not diffs:
            return None
        torch_names = {}
        for key, targets in self._rename.items():
            for i, t in enumerate(targets):
                torch_names[t] = f"{key}[{i}]" if len(targets) > 1 else key
        lines = []
        for d in diffs:
            name, rest = d.split(":", 1)
            shown = f"{torch_names[name]} ({name})" if name in torch_names else name
            lines.append(f"{shown}:{rest}")
        if any(d.startswith("convention:") for d in diffs):
            fix = (f"Create this optimizer with the saved convention "
                   f"(convention={config.get('convention')!r}) to load it.")
        else:
            fix = ("The other hyperparameters are taken from the saved "
                   f"param_groups[{k}], which disagrees with the saved 'refopt' entry: was the "
                   "state dict edited, or saved by another refopt.torch class?")
        return ValueError(
            f"loaded state dict's parameter group {k} was saved with another configuration "
            f"than this {type(self).__name__} has: {'; '.join(lines)}. {fix}")

    def _load(self, state_dict):
        """:meth:`load_state_dict` after the pre-hooks: check everything, then commit."""
        if not isinstance(state_dict, dict):
            raise TypeError("a load_state_dict pre-hook returned a "
                            f"{type(state_dict).__name__}; it must return a dict or None.")
        for key in ("state", "param_groups", "refopt"):
            if key not in state_dict:
                hint = (" (torch.optim's state dicts cannot be loaded: refopt's slots and "
                        "conventions differ)" if key == "refopt" else "")
                raise ValueError(f"`state_dict` has no {key!r} entry; it must come from "
                                 f"{type(self).__name__}.state_dict(){hint}.")
        saved_groups = state_dict["param_groups"]
        records = state_dict["refopt"]
        if len(saved_groups) != len(self.param_groups) or len(records) != len(saved_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups; this optimizer "
                f"has {len(self.param_groups)}.")
        for k, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            if len(g["params"]) != len(sg["params"]):
                raise ValueError(
                    f"loaded state dict's parameter group {k} has {len(sg['params'])} "
                    f"parameters; this optimizer's has {len(g['params'])}.")
        new_groups, new_ropts = [], []
        for k, (g, sg) in enumerate(zip(self.param_groups, saved_groups)):
            group = copy.deepcopy({key: v for key, v in sg.items() if key != "params"})
            group["params"] = g["params"]
            if "param_names" in g and "param_names" not in group:
                group["param_names"] = g["param_names"]
            for check in self._group_checks:
                check(group, f"loaded param_groups[{k}]")
            ropt = self._make_refopt(group)
            rec = dict(records[k])
            slots = {}
            if rec.get("built"):
                for name in rec.get("slot_names", []):
                    arrays = []
                    for j, idx in enumerate(sg["params"]):
                        entry = state_dict["state"].get(idx)
                        if entry is None or name not in entry:
                            raise ValueError(
                                f"loaded state dict has no slot {name!r} for parameter {j} of "
                                f"group {k} (index {idx}).")
                        value = entry[name]
                        if isinstance(value, torch.Tensor):
                            value = value.detach().cpu().numpy()
                        arrays.append(np.asarray(value))
                    slots[name] = arrays
            rec["slots"] = slots
            error = self._config_mismatch(k, ropt, rec)
            if error is not None:
                raise error
            ropt.load_state_dict(rec, var_list=g["params"] if rec.get("built") else None)
            new_groups.append(group)
            new_ropts.append(ropt)
        _check_global_clipnorm(new_groups)
        # every group loaded into its new refopt optimizer: commit
        self.param_groups = new_groups
        self._ropts = new_ropts
        self._frozen = [{key: copy.deepcopy(g[key]) for key in self._hyper_keys + ["maximize"]}
                        for g in new_groups]
        self._linked = [None] * len(new_groups)
        self.state = defaultdict(dict)
        for k in range(len(new_groups)):
            self._sync_state(k)

    def __getstate__(self):
        raise TypeError(
            f"{type(self).__name__} cannot be pickled or deep-copied: its refopt optimizers "
            "update the parameters' memory in place. Save optimizer.state_dict() instead and "
            "load it into a new optimizer over the new parameters.")

    @property
    def refopt_optimizers(self):
        """list of refopt.Optimizer: the refopt optimizer of each parameter group (live)."""
        return list(self._ropts)

    def __repr__(self):
        conv = self._ropts[0].convention.name if self._ropts else self._convention
        return (f"{type(self).__name__}({self._cls.__name__}, convention={conv!r}, "
                f"groups={len(self.param_groups)})")


# ---------------------------------------------------------------- torch's names
#: torch.optim name -> (refopt class name, torch's default lr, torch's positional
#: hyperparameters after lr in order, {torch keyword: refopt keywords}, keywords whose 0
#: means "none")
TORCH_NAMES = {
    "Adam": ("Adam", 1e-3, ("betas", "eps", "weight_decay", "amsgrad"),
             {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ("weight_decay",)),
    "AdamW": ("AdamW", 1e-3, ("betas", "eps", "weight_decay", "amsgrad"),
              {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ()),
    "SGD": ("SGD", 1e-3, ("momentum", "dampening", "weight_decay", "nesterov"), {},
            ("weight_decay",)),
    "SparseAdam": ("LazyAdam", 1e-3, ("betas", "eps"),
                   {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ()),
    "RMSprop": ("RMSprop", 1e-2, ("alpha", "eps", "weight_decay", "momentum", "centered"),
                {"alpha": ("rho",), "eps": ("epsilon",)}, ("weight_decay",)),
    "Adagrad": ("Adagrad", 1e-2, ("lr_decay", "weight_decay", "initial_accumulator_value",
                                  "eps"), {"eps": ("epsilon",)}, ("weight_decay",)),
    "Adadelta": ("Adadelta", 1.0, ("rho", "eps", "weight_decay"), {"eps": ("epsilon",)},
                 ("weight_decay",)),
    "Adamax": ("Adamax", 2e-3, ("betas", "eps", "weight_decay"),
               {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ("weight_decay",)),
    "NAdam": ("Nadam", 2e-3, ("betas", "eps", "weight_decay", "momentum_decay",
                              "decoupled_weight_decay"),
              {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ("weight_decay",)),
    "RAdam": ("RAdam", 1e-3, ("betas", "eps", "weight_decay", "decoupled_weight_decay"),
              {"betas": ("beta_1", "beta_2"), "eps": ("epsilon",)}, ("weight_decay",)),
    "ASGD": ("ASGD", 1e-2, ("lambd", "alpha", "t0", "weight_decay"), {}, ("weight_decay",)),
    "Rprop": ("Rprop", 1e-2, ("etas", "step_sizes"), {}, ()),
}

# torch's implementation switches: accepted, without effect on refopt's numbers (which are the
# convention's; ``fused`` chooses the default convention, "torch" or "torch_fused"); those
# that change what is computed are refused unless at their default.
_IGNORED_SWITCHES = ("foreach",)
_REFUSED_SWITCHES = {"capturable": False, "differentiable": False,
                     "decoupled_weight_decay": False}


def _check_sgd_group(group, where):
    """torch's SGD rule that refopt's SGD does not check itself: Nesterov needs a momentum
    (torch checks its constructor's values; here every group's). Dampening is refopt's SGD's
    (PyTorch's conventions; refused with Nesterov)."""
    momentum = _plain(group.get("momentum"))
    if group.get("nesterov") and not (momentum or 0) > 0:
        raise ValueError("Nesterov momentum requires a momentum and zero dampening (torch's "
                         f"rule). Received: {where} with nesterov=True, momentum={momentum!r}")


#: torch.optim name -> its checks of a group's hyperparameters
_GROUP_CHECKS = {"SGD": (_check_sgd_group,)}


def _torch_named(torch_name):
    refopt_name, default_lr, positional, rename, zero_is_none = TORCH_NAMES[torch_name]

    def __init__(self, params, lr=default_lr, *args, convention=None, backend=None,
                 maximize=False, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f"{torch_name}() takes at most {len(positional) + 2} positional "
                            f"arguments ({len(args) + 2} given)")
        for name, value in zip(positional, args):
            if name in kwargs:
                raise TypeError(f"{torch_name}() got multiple values for argument {name!r}")
            kwargs[name] = value
        for name in _IGNORED_SWITCHES:
            kwargs.pop(name, None)
        fused = kwargs.pop("fused", None)
        if fused is not None and not isinstance(fused, bool):
            raise TypeError(f"`fused` must be a bool or None, as torch's. Received: "
                            f"fused={fused!r}")
        if convention is None:  # torch.optim's default path, or its fused=True kernels
            convention = "torch_fused" if fused else "torch"
        elif fused is not None and convention in ("torch", "torch_fused") and (
                fused != (convention == "torch_fused")):
            raise ValueError(
                f"`fused={fused}` contradicts convention={convention!r} (torch's fused "
                "kernels are the 'torch_fused' convention, its default path 'torch'): pass "
                f"one of them. Received: fused={fused!r}, convention={convention!r}")
        for name, default in _REFUSED_SWITCHES.items():
            if name in kwargs and name not in positional:
                value = kwargs.pop(name)
                if value != default:
                    hint = (" Use refopt.torch.AdamW." if name == "decoupled_weight_decay"
                            else "")
                    raise ValueError(f"refopt.torch.{torch_name} has no `{name}` (refopt "
                                     f"computes the convention's numbers).{hint} Received: "
                                     f"{name}={value!r}")
        RefoptOptimizer.__init__(self, params, getattr(refopt, refopt_name), lr=lr,
                                 convention=convention, backend=backend, maximize=maximize,
                                 **kwargs)

    keys = ", ".join(f"``{k}``" for k in positional)
    renames = "; ".join(f"``{k}`` -> ``{', '.join(v)}``" for k, v in rename.items()) or "none"
    doc = f"""``torch.optim.{torch_name}``'s interface, computed by :class:`refopt.{refopt_name}`.

    Parameters
    ----------
    params : iterable of torch.Tensor or of dicts
        Parameters or parameter groups, as for ``torch.optim.{torch_name}``.
    lr : float, default {default_lr!r}
        torch's default learning rate.
    {keys}
        torch's hyperparameters, by keyword or position (renamed for refopt: {renames}).
        Left out: the convention's default (under ``"torch"``, torch's).
    convention : str, optional
        Whose numbers (``"torch"``, ``"torch_fused"``, ``"tf_keras"``, ``"keras3"``,
        ``"optax"``, ...). Default: ``"torch"`` (torch.optim's default CPU path, the
        for-loop), or ``"torch_fused"`` with ``fused=True``.
    backend : {{"reference", "cpu", "cuda"}}, optional
    maximize : bool, default False
    **kwargs
        Any other keyword of :class:`refopt.{refopt_name}` (refopt's name), torch's
        ``fused`` (only chooses the default convention) and ``foreach`` (ignored: the
        numbers are the convention's).

    See :class:`RefoptOptimizer` for groups, schedulers, state and errors.
    """
    cls = type(torch_name, (RefoptOptimizer,), {
        "__init__": __init__, "__doc__": doc, "__module__": __name__,
        "_rename": rename, "_zero_is_none": zero_is_none,
        "_group_checks": _GROUP_CHECKS.get(torch_name, ()),
        "_sparse_gradients_only": torch_name == "SparseAdam"})
    cls.__qualname__ = torch_name
    return cls


Adam = _torch_named("Adam")
AdamW = _torch_named("AdamW")
SGD = _torch_named("SGD")
SparseAdam = _torch_named("SparseAdam")
RMSprop = _torch_named("RMSprop")
Adagrad = _torch_named("Adagrad")
Adadelta = _torch_named("Adadelta")
Adamax = _torch_named("Adamax")
NAdam = _torch_named("NAdam")
RAdam = _torch_named("RAdam")
ASGD = _torch_named("ASGD")
Rprop = _torch_named("Rprop")
