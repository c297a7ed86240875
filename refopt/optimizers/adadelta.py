"""Adadelta with the tf.keras 2.11+ API, in every framework's numerics.

Follows ``keras/src/optimizers/adadelta.py`` and ``tf_keras/optimizers/adadelta.py`` for the
API and keyword names; the update of each convention is
:func:`refopt.reference.adadelta_update` (readable NumPy, the reference backend) and
:mod:`refopt.rules.adadelta` (the fast backends).
"""

from __future__ import annotations

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    default_learning_rate,
    optimizer_form,
)

__all__ = ["Adadelta"]


class Adadelta(Optimizer):
    r"""Adadelta (Zeiler, 2012) in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: the convention's (0.001 Keras and TF1, **1.0** PyTorch). optax's
        ``adadelta`` defaults to ``None``, which skips the scaling and so climbs the
        gradient: refopt requires a learning rate under ``"optax"``.
    rho : float, optional
        The decay of both running means, in [0, 1]. Default: 0.95 (Keras, TF1), 0.9
        (PyTorch, optax).
    epsilon : float, optional
        Inside both roots, >= 0. Default: 1e-7 Keras (Keras 2: 0 means 1e-7), 1e-8 TF1,
        1e-6 PyTorch and optax.
    {base_kwargs}

    Notes
    -----
    Slots: ``accumulated_grad`` (the running mean of squared gradients: TF's "accum",
    torch's "square_avg", optax's "e_g") and ``accumulated_delta`` (the running mean of
    squared steps: Keras' "accumulated_delta_var", TF's "accum_update", torch's
    "acc_delta", optax's "e_x"), both starting at zero. The update rules of the six forms
    are written out in :func:`refopt.reference.adadelta_update`. ``weight_decay`` is Keras'
    decoupled decay (tf_keras, Keras 3) or an L2 term ``fma(w, wd, g)`` before the step
    (PyTorch's ``weight_decay``, optax's ``add_decayed_weights``; dense gradients only);
    Keras 2 and TF1 have none.

    IndexedSlices gradients (duplicate indices summed first): Keras 2 and TF1 update only
    the present rows and their slots (TensorFlow's sparse kernel); tf_keras decays
    ``accumulated_grad`` and ``accumulated_delta`` on every row (its sparse branch) but
    moves only the present rows of the variable; Keras 3 applies the dense step to the
    summed gradient (with the convention knob ``keras3_sparse_square``, its per-occurrence
    step on unsummed duplicates); PyTorch and optax refuse them.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0], np.float64)
    >>> opt = refopt.Adadelta(learning_rate=1.0, rho=0.5, epsilon=0.25, convention="keras3")
    >>> opt.apply_gradients([(np.array([1.0]), w)])
    1
    >>> opt.get_slot(w, "accumulated_grad"), bool(w[0] == 1 - 0.5 / np.sqrt(0.75))
    (array([0.5]), True)
    """

    slot_variables = ("accumulated_grad", "accumulated_delta")

    def __init__(
        self,
        learning_rate=None,
        rho=None,
        epsilon=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Adadelta",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        from refopt.reference.adadelta import adadelta_defaults

        conv = _check_convention(convention)
        optimizer_form(conv, "Adadelta")
        defaults = adadelta_defaults(conv)
        learning_rate = default_learning_rate(
            learning_rate, defaults, conv, "Adadelta",
            why=("optax's adadelta(learning_rate=None) does not scale the update at all, "
                 "so apply_updates would climb the gradient"))
        if rho is None:
            rho = defaults["rho"]
        self.rho = check_real("rho", rho, low=0, high=1)
        if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
            epsilon = defaults["epsilon"]  # Keras 2: `epsilon or backend.epsilon()`
        self.epsilon = check_real("epsilon", epsilon, low=0)
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
            convention=conv if isinstance(convention, dict) else convention,
            **kwargs,
        )

    #: torch's for-loop root (the ``sqrt`` knob; refopt.reference.sqrt): MKL's on the host
    _torch_sqrt = "loop"

    def _decay_mode(self):
        """Keras' decoupled decay (tf_keras, Keras 3), PyTorch's L2 term, and optax's
        ``add_decayed_weights`` before ``scale_by_adadelta`` (under ``jit`` the same fused
        ``fma(w, wd, g)``: an L2 term); none for Keras 2 and TF1."""
        if self.convention.adadelta_form == "optax":
            return "l2"
        return self.convention.adam_weight_decay

    @property
    def _lazy_sparse(self):
        """Keras 2 and TF1 (TensorFlow's sparse kernel) update only the present rows."""
        from refopt.reference.adadelta import is_lazy_sparse

        return is_lazy_sparse(self.convention)

    def _sparse_update_kind(self):
        # Keras 3: its dense step on the summed gradient (per occurrence with the knob
        # keras3_sparse_square: the reference's, on the host); tf_keras: its own sparse
        # branch (the reference's); PyTorch and optax refuse (the reference raises)
        conv = self.convention
        return ("densify" if conv.adadelta_form == "keras3" and not conv.keras3_sparse_square
                else None)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.adadelta import adadelta_rows
        from refopt.reference.variants import l2_torch

        conv = self.convention
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            if lazy_rows or isinstance(grad, IndexedSlices):
                raise TypeError(
                    f"convention={conv.name!r}: Adadelta's weight_decay needs dense "
                    "gradients (PyTorch's Adadelta takes no sparse gradient). Received an "
                    f"IndexedSlices gradient with weight_decay={weight_decay!r}"
                )
            grad = l2_torch(grad, param, weight_decay)
        kw = dict(learning_rate=learning_rate, rho=self.rho, epsilon=self.epsilon,
                  convention=conv)
        eg, ex = slots["accumulated_grad"], slots["accumulated_delta"]
        if lazy_rows:  # the present rows, gathered (duplicates summed)
            p, eg, ex = adadelta_rows(param, grad, eg, ex, **kw)
        else:
            p, eg, ex = self._kernels.adadelta_update(param, grad, eg, ex, **kw)
        return p, {"accumulated_grad": eg, "accumulated_delta": ex}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`); the lazy
        rows of Keras 2 and TF1 take the dense formula."""
        from refopt.rules.adadelta import adadelta_call

        return adadelta_call(dtype, self.convention, learning_rate=learning_rate,
                             rho=self.rho, epsilon=self.epsilon)

    def get_config(self):
        config = super().get_config()
        config.update(rho=self.rho, epsilon=self.epsilon)
        return config


Adadelta.__doc__ = Adadelta.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
