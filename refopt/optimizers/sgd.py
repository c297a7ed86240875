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
    cases ``torch/sgd_sparse_*``). With momentum torch keeps a sparse buffer that grows by
    every step's entries; refopt densifies the gradient there (the dense step: the same
    values up to rounding, every row's buffer decaying). ``weight_decay`` with a sparse
    gradient raises ``TypeError``, as torch refuses it.

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
        return self.momentum == 0 and (conv.sgd_momentum in ("torch", "torch_fused")
                                       or conv.sgd_sparse_scatter)

    #: with the occurrences kept, only the present rows move: the staged step gathers them
    _rows_in_turn = True

    #: linear in the gradient: Keras 3's raw duplicate slices sum to the same rows
    _raw_slices_matter = False

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        conv = self.convention
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
