"""SGD with momentum and Nesterov momentum, with the tf.keras 2.11+ API.

Follows ``tf_keras/optimizers/sgd.py``.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import BASE_KWARGS_DOC, Optimizer, check_bool, check_real
from refopt.reference import variants as _variants

__all__ = ["SGD"]


class SGD(Optimizer):
    r"""Stochastic gradient descent with optional (Nesterov) momentum, tf.keras 2.11+ numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 0.01
        Step size.
    momentum : float, default 0.0
        In [0, 1]. The slot ``m`` is kept even at 0, as tf-keras does.
    nesterov : bool, default False
        Nesterov momentum.
    dampening : float, default 0.0
        PyTorch's dampening (``"torch"``/``"torch_fused"``/``"fbgemm"`` only; ``ValueError``
        elsewhere, and with ``nesterov``, as torch): ``b <- momentum b + (1 - dampening) g``,
        except on a variable's first step, where ``b <- g`` (torch skips it there).
    {base_kwargs}

    Notes
    -----
    ``m <- (-g) lr + m momentum``; ``w <- w + m`` (Nesterov: ``w <- w + (-g) lr + m momentum``
    with the updated ``m``). See :func:`refopt.reference.sgd_update`. PyTorch's SGD keeps a
    velocity without the learning rate (``b = momentum b + (1 - dampening) g; w -= lr b``,
    the sum one FMA; ``torch/optim/sgd.py``), which rounds differently and differs when the
    learning rate changes. ``"torch_fused"`` is ``SGD(fused=True)``'s CPU kernel
    (``aten/src/ATen/native/cpu/FusedSGDKernel.cpp``): the same, except on the last
    ``numel % 8`` (float32) / ``% 4`` (float64) elements of each variable (AVX2's scalar
    tail), whose buffer is ``fma(b, momentum, (1 - dampening) g)`` (convention knob
    ``sgd_momentum="torch_fused"``; golden cases ``torch/fusedk_sgd_*``).

    An :class:`~refopt.IndexedSlices` gradient under ``"keras3"`` and ``"keras2"`` without
    momentum is a scatter, each occurrence in turn (``w[r] -= round(g*lr)``,
    :func:`refopt.reference.sgd_sparse_scatter_update`; golden cases
    ``keras3/sgd_sparse_dup_f32``, ``keras2/sgd_sparse_dup_f32``); tf-keras sums the
    duplicates first. An :class:`~refopt.IndexedSlices` gradient under ``"torch"`` without momentum is
    torch's sparse step: only the rows present move, each occurrence added in turn
    (duplicates not summed first; :func:`refopt.reference.sgd_sparse_torch_update`, golden
    cases ``torch/sgd_sparse_*``). With momentum under ``"torch"`` the buffer is torch's
    uncoalesced sparse COO tensor (:func:`refopt.reference.sgd_sparse_torch_momentum_update`:
    a copy of the first gradient, then ``buf.mul_(momentum).add_(grad, alpha=1 - dampening)``
    as ATen's one-pass merge, growing by the entries that do not line up, Nesterov's
    ``grad.add(buf, alpha=momentum)`` alike, each entry added to the variable in turn;
    golden cases ``torch/sgd_sparse_momentum_*``, ``torch/sgd_sparse_nesterov_*``). The
    slot ``m`` is its ``to_dense()``; the buffer itself is in :meth:`state_dict`
    (``"sparse_momentum"``) and in checkpoints. A variable whose buffer is dense (earlier
    dense gradients) adds the sparse entries into it in turn, as torch. Where torch raises,
    refopt raises ``TypeError`` and changes nothing: a dense gradient for a variable whose
    buffer is sparse, and Nesterov with a dense buffer and a sparse gradient. Other momentum conventions (and a global ``step_counter``)
    densify the gradient. ``weight_decay`` with a sparse gradient raises ``TypeError``, as
    torch refuses it.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 2.0], np.float32)
    >>> opt = refopt.SGD(learning_rate=0.1, momentum=0.9)
    >>> for _ in range(2):
    ...     _ = opt.apply_gradients([(np.ones(2, np.float32), w)])
    >>> w  # 1 - 0.1 - (0.1 + 0.9 * 0.1)
    array([0.71, 1.71], dtype=float32)
    """

    def __init__(
        self,
        learning_rate=0.01,
        momentum=0.0,
        nesterov=False,
        dampening=0.0,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="SGD",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        self.momentum = check_real("momentum", momentum, low=0, high=1)
        self.nesterov = check_bool("nesterov", nesterov)
        self.dampening = check_real("dampening", dampening)
        super().__init__(
            name=name,
            learning_rate=learning_rate,
            weight_decay=weight_decay,
            clipnorm=clipnorm,
            clipvalue=clipvalue,
            global_clipnorm=global_clipnorm,
            use_ema=use_ema,
            ema_momentum=ema_momentum,
            ema_overwrite_frequency=ema_overwrite_frequency,
            jit_compile=jit_compile,
            backend=backend,
            convention=convention,
            **kwargs,
        )
        if self.dampening != 0 and self.convention.sgd_momentum not in ("torch", "torch_fused"):
            raise ValueError(
                f"convention={self.convention.name!r} has no SGD dampening (PyTorch's "
                f"option). Received: dampening={dampening!r}")
        if self.dampening != 0 and self.nesterov:
            raise ValueError("Nesterov momentum requires zero dampening (torch's rule). "
                             f"Received: nesterov=True, dampening={dampening!r}")

    def _slot_groups(self):
        return (("m",),)

    def _is_lazy(self):
        # only the rows present move: TF1's SparseApplyMomentum, and Keras 2's legacy SGD with
        # momentum (ResourceSparseApplyKerasMomentum on the summed rows; issue 12 item 9)
        conv = self.convention
        return conv.sgd_momentum == "tf1" or (
            conv.sparse_adam == "keras2" and conv.sgd_momentum == "keras" and self.momentum != 0)

    def _keeps_duplicates(self):
        """PyTorch's SGD without momentum adds each occurrence of a sparse gradient in turn
        (:func:`refopt.reference.sgd_sparse_torch_update`), Keras 3's and Keras 2's scatter
        it in turn (:func:`refopt.reference.sgd_sparse_scatter_update`; the convention knob
        ``sgd_sparse_scatter``): the staged step keeps them."""
        conv = self.convention
        if self._torch_sparse_momentum():  # torch's sparse momentum buffer keeps them too
            return True
        return self.momentum == 0 and (conv.sgd_momentum in ("torch", "torch_fused")
                                       or conv.sgd_sparse_scatter)

    def _torch_sparse_momentum(self):
        """Whether an IndexedSlices gradient takes torch's sparse momentum buffer
        (:func:`refopt.reference.sgd_sparse_torch_momentum_update`): momentum under the
        ``"torch"`` SGD form with PyTorch's per-variable step counts."""
        conv = self.convention
        return (self.momentum != 0 and conv.sgd_momentum == "torch"
                and conv.step_counter == "per_variable")

    @property
    def _rows_in_turn(self):
        """Without momentum only the present rows move (the staged step gathers them); torch's
        sparse momentum step takes the whole variable and its buffer."""
        return self.momentum == 0

    def _reset_state(self):
        super()._reset_state()
        # torch's sparse momentum buffers: build position -> {per-variable step: buffer}.
        # The step's own entry is written when computed; a step that raises leaves the
        # counter unchanged, so the entry read (the variable's committed step) is never a
        # failed step's.
        self._sparse_momentum = {}

    def _grads_checked_against_state(self):
        """True while a variable holds torch's sparse momentum buffer (its entry for the
        variable's current step: a later dense step leaves the quick path open again)."""
        return any(per.get(self._var_steps[i]) is not None
                   for i, per in self._sparse_momentum.items())

    def _check_grads_against_state(self, pairs):
        """A dense gradient for a variable whose momentum buffer is torch's sparse one raises
        ``TypeError``, as torch does (``buf.mul_(momentum).add_(dense)`` on a sparse buffer:
        torch raises after scaling the buffer; refopt changes nothing)."""
        if not self._sparse_momentum:  # no sparse buffer (also: not built yet)
            return
        for k, (grad, var, _) in enumerate(pairs):
            if grad is None or isinstance(grad, IndexedSlices):
                continue
            i = self._position(var)
            if self._sparse_buffer(i, self._var_steps[i] + 1) is not None:
                raise TypeError(
                    f"The variable at position {k} has PyTorch's sparse momentum buffer "
                    "(its earlier gradients were IndexedSlices), which cannot take a dense "
                    "gradient: torch raises there (adding a dense tensor to a sparse one in "
                    "place). Received a dense gradient of shape "
                    f"{tuple(np.shape(grad))}")

    def _sparse_buffer(self, i, step):
        """The sparse buffer of variable ``i`` after its committed step ``step - 1`` (None)."""
        return self._sparse_momentum.get(i, {}).get(step - 1)

    def _torch_sparse_step(self, param, grad, slots, learning_rate, step):
        from refopt.reference.sgd import sgd_sparse_torch_update
        from refopt.reference.sgd_sparse_momentum import (
            sgd_sparse_torch_momentum_update,
            sparse_buffer_to_dense,
        )
        from refopt.reference.variants import fma

        i = self._index.get(id(param))
        if i is None:  # pragma: no cover - the staged step passes the variable itself
            raise RuntimeError("SGD: torch's sparse momentum step needs the variable itself")
        buf = self._sparse_buffer(i, step) if step > 1 else None
        if step > 1 and buf is None:
            # the buffer is dense (earlier dense gradients): torch's buf.mul_(momentum)
            # .add_(sparse, alpha=1 - dampening), each entry in turn; then param.add_(buf)
            if self.nesterov:
                raise TypeError(
                    "PyTorch's Nesterov SGD cannot add a dense momentum buffer to a sparse "
                    "gradient (torch: add(sparse, dense) is not supported). Received an "
                    f"IndexedSlices for the variable at position {i} after dense gradients.")
            dtype = param.dtype
            with np.errstate(all="ignore"):
                m = slots["m"] * dtype.type(self.momentum)
                m = sgd_sparse_torch_update(m, grad, learning_rate=-(1.0 - self.dampening))
                p = fma(dtype.type(-float(learning_rate)), m, param)
            return np.asarray(p, dtype), {"m": np.asarray(m, dtype)}
        r = sgd_sparse_torch_momentum_update(
            param, grad, buf, learning_rate=learning_rate, momentum=self.momentum,
            dampening=self.dampening, nesterov=self.nesterov)
        per_var = self._sparse_momentum.setdefault(i, {})
        for k in [k for k in per_var if k != step - 1]:
            del per_var[k]
        per_var[step] = r.buffer
        return r.param, {"m": sparse_buffer_to_dense(r.buffer, param.shape)}

    #: linear in the gradient: Keras 3's raw duplicate slices sum to the same rows
    _raw_slices_matter = False

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
        if isinstance(grad, IndexedSlices) and self._torch_sparse_momentum():
            return self._torch_sparse_step(param, grad, slots, learning_rate, step)
        if lazy_rows and isinstance(grad, IndexedSlices):  # the occurrences in turn
            update = (self._kernels.sgd_sparse_torch_update
                      if conv.sgd_momentum in ("torch", "torch_fused")
                      else self._kernels.sgd_sparse_scatter_update)
            p = update(param, grad, learning_rate=learning_rate)
            return p, {"m": slots["m"]}
        if conv.sgd_momentum != "keras" or weight_decay is not None:
            if isinstance(grad, IndexedSlices):  # torch and optax SGD are linear in g
                grad = grad.to_dense()
            with np.errstate(all="ignore"):
                p, m = _variants.sgd_variant(
                    param, grad, slots["m"], learning_rate=learning_rate,
                    momentum=self.momentum, nesterov=self.nesterov, convention=conv,
                    weight_decay=weight_decay, dampening=self.dampening, step=step)
            return np.asarray(p), {"m": np.asarray(m)}
        r = self._kernels.sgd_update(
            param,
            grad,
            slots["m"],
            learning_rate=learning_rate,
            momentum=self.momentum,
            nesterov=self.nesterov,
        )
        return r.param, {"m": r.m}

    #: torch's sparse momentum buffers travel in checkpoints as JSON (exact hex floats)
    _EXTRA_STATE_KEYS = ("sparse_momentum",)
    #: ... one entry per variable, in build order (checkpoints write the file's order)
    _PER_VARIABLE_STATE_KEYS = ("sparse_momentum",)

    def state_dict(self):
        """:meth:`Optimizer.state_dict`, plus ``"sparse_momentum"``: one entry per built
        variable (build order), None or ``{"indices": ndarray of int64, shape (n,),
        "values": ndarray of the variable's dtype, shape (n,) + the variable's row shape}``,
        torch's uncoalesced sparse momentum buffer after the variable's last step (its entries
        in torch's order; copies)."""
        sd = super().state_dict()
        entries = []
        if self._built:
            for i, k in enumerate(self._var_steps):
                buf = self._sparse_momentum.get(i, {}).get(k)
                entries.append(None if buf is None else {
                    "indices": np.array(buf.indices, np.int64),
                    "values": np.array(buf.values, copy=True)})
        sd["sparse_momentum"] = entries
        return sd

    def _parse_sparse_momentum(self, sd, var_list):
        """``sd["sparse_momentum"]`` checked and decoded: ``{position: {step: buffer}}``;
        raises ValueError/TypeError before anything is written."""
        from refopt.reference.sgd_sparse_momentum import SparseMomentumBuffer

        raw = sd.get("sparse_momentum")
        if raw is None or (isinstance(raw, (list, tuple)) and not any(
                e is not None for e in raw)):
            return {}
        if not isinstance(raw, (list, tuple)):
            raise TypeError("`state_dict['sparse_momentum']` must be a list (one entry per "
                            f"variable). Received: {type(raw).__name__}")
        # shapes only (a variable may be a torch tensor or a device array); the values are
        # cast to the variable's dtype once the build is known
        if var_list is not None:
            shapes = [tuple(v.shape) for v in var_list]
        else:
            shapes = [tuple(sh) for sh, _ in self._var_specs]
        steps = list(sd.get("variable_steps") or [])
        if len(raw) != len(shapes) or len(steps) != len(shapes):
            raise ValueError(
                f"`state_dict['sparse_momentum']` must hold one entry per variable "
                f"({len(shapes)}), with the variables' step counts. Received: {len(raw)} "
                f"entries, {len(steps)} step counts")
        out = {}
        for i, entry in enumerate(raw):
            if entry is None:
                continue
            shape = shapes[i]
            where = f"`state_dict['sparse_momentum'][{i}]`"
            try:
                idx = np.asarray(entry["indices"])
                vals = np.asarray(entry["values"])
            except (TypeError, KeyError, IndexError) as exc:
                raise ValueError(f"{where} must be a dict of 'indices' and 'values' arrays "
                                 f"({type(exc).__name__}: {exc})") from None
            if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
                raise ValueError(f"{where}['indices'] must be a 1-d integer array. Received: "
                                 f"dtype={idx.dtype}, shape={idx.shape}")
            if vals.dtype.kind != "f":  # float16/32/64 (sparse bfloat16 is refused)
                raise ValueError(f"{where}['values'] must be a float array. Received: "
                                 f"dtype={vals.dtype}")
            idx = idx.astype(np.int64)
            width = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
            if not shape or vals.size != idx.size * width or (
                    idx.size and (idx.min() < 0 or idx.max() >= shape[0])):
                raise ValueError(f"{where} does not fit variable {i} of shape {shape}: "
                                 f"{idx.size} indices, {vals.size} values")
            out[i] = {int(steps[i]): SparseMomentumBuffer(idx, vals.reshape(
                (idx.size,) + shape[1:]))}
        return out

    def _extra_state_arrays(self, sd):
        """For :mod:`refopt.functional`: ``{"sparse_momentum": [one float64 array per
        variable]}`` when a variable has a sparse buffer, else ``{}``. Each array is
        ``[1, indices..., values...]`` (``[0]``: none), exact for every dtype."""
        entries = sd.get("sparse_momentum") or []
        if not any(e is not None for e in entries):
            return {}
        packed = []
        for e in entries:
            if e is None:
                packed.append(np.zeros(1, np.float64))
                continue
            packed.append(np.concatenate((
                [1.0], np.asarray(e["indices"], np.float64),
                np.asarray(e["values"]).astype(np.float64).reshape(-1))))
        return {"sparse_momentum": packed}

    def _extra_state_from_arrays(self, key, arrays):
        """The inverse of :meth:`_extra_state_arrays` (state_dict's entries, float64 values;
        checked by :meth:`load_state_dict`, which casts them exactly to the variable's
        dtype)."""
        entries = []
        for i, a in enumerate(arrays):
            a = np.asarray(a, np.float64).reshape(-1)
            if a.size == 0 or a[0] == 0:
                entries.append(None)
                continue
            shape = tuple(self._var_specs[i][0]) if i < len(self._var_specs) else (0,)
            width = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
            n = (a.size - 1) // (1 + width)
            entries.append({"indices": a[1:1 + n].astype(np.int64), "values": a[1 + n:]})
        return entries

    def load_state_dict(self, state_dict, var_list=None):
        """:meth:`Optimizer.load_state_dict`, with the sparse momentum buffers of
        :meth:`state_dict` (absent or None: none). All or nothing."""
        if not isinstance(state_dict, dict):
            return super().load_state_dict(state_dict, var_list)
        buffers = self._parse_sparse_momentum(state_dict, var_list)
        rest = {k: v for k, v in state_dict.items() if k != "sparse_momentum"}
        super().load_state_dict(rest, var_list)
        from refopt.reference.sgd_sparse_momentum import SparseMomentumBuffer

        self._sparse_momentum = {
            i: {k: SparseMomentumBuffer(b.indices, b.values.astype(self._var_specs[i][1]))
                for k, b in per.items()} for i, per in buffers.items()}

    def _sparse_update_kind(self):
        if self._keeps_duplicates():
            return None  # the occurrences in turn: the host's staged step
        return "sgd_table" if self.convention.sgd_momentum == "keras" else "densify"

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`)."""
        from refopt.rules.sgd import sgd_call

        return sgd_call(dtype, self.convention, learning_rate=learning_rate,
                        momentum=self.momentum, nesterov=self.nesterov,
                        dampening=self.dampening, step=step)

    def get_config(self):
        config = super().get_config()
        config.update(momentum=self.momentum, nesterov=self.nesterov)
        if self.dampening != 0:  # PyTorch's; absent from the other frameworks' configs
            config.update(dampening=self.dampening)
        return config


SGD.__doc__ = SGD.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
