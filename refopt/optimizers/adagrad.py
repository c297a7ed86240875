"""Adagrad with the tf.keras 2.11+ API, in every framework's numerics.

Follows ``keras/src/optimizers/adagrad.py`` and ``tf_keras/optimizers/adagrad.py`` for the API
and keyword names (plus PyTorch's ``lr_decay`` under its convention); the update of each
convention is :func:`refopt.reference.adagrad_update` (readable NumPy, the reference backend)
and :mod:`refopt.rules.adagrad` (the fast backends).
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    default_learning_rate,
)

__all__ = ["Adagrad"]


class Adagrad(Optimizer):
    r"""Adagrad (Duchi, Hazan & Singer, 2011) in each framework's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size. Default: the convention's (0.001 Keras, 0.01 PyTorch); TF1's
        ``AdagradOptimizer`` and optax's ``adagrad`` have none, so it is required there.
    initial_accumulator_value : float, optional
        The accumulators' start, >= 0 (TF1: > 0). Default: 0.1, PyTorch 0. Keras 3 rounds it
        through float32 (a float64 variable starts at ``float64(float32(0.1))``).
    epsilon : float, optional
        Default: 1e-7 Keras and optax, 1e-10 PyTorch. Inside the root (``sqrt(acc + eps)``)
        for tf_keras, Keras 3 and optax; outside (``sqrt(acc) + eps``) for Keras 2 (where 0
        means 1e-7) and PyTorch. TF1's Adagrad has none: refused under ``"tf1"``.
    lr_decay : float, optional
        PyTorch's decay of the learning rate, ``lr / (1 + (t - 1) * lr_decay)`` with ``t``
        the variable's own step count; accepted under ``convention="torch"`` only.
    {base_kwargs}

    Notes
    -----
    Slot: ``accumulator`` (the running sum of squared gradients; torch's "sum", optax's
    "sum_of_squares"). The update rules of the six forms are written out in
    :func:`refopt.reference.adagrad_update`. ``weight_decay`` is Keras' decoupled decay
    (tf_keras, Keras 3) or PyTorch's L2 term (``g + wd*w``, dense gradients only, as
    PyTorch); Keras 2, TF1 and optax have none.

    IndexedSlices gradients (duplicate indices summed first): tf_keras, Keras 2, TF1 and
    PyTorch update only the present rows and their accumulators (lazy; with tf_keras'
    ``weight_decay`` the decay still covers the whole variable, as tf_keras decays every
    variable); Keras 3 applies the dense step to the summed gradient; optax refuses them.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([10.0], np.float32)
    >>> opt = refopt.Adagrad(learning_rate=0.1)
    >>> opt.apply_gradients([(w.copy(), w)])
    1
    >>> w, opt.get_slot(w, "accumulator")
    (array([9.90005], dtype=float32), array([100.1], dtype=float32))
    """

    slot_variables = ("accumulator",)

    def __init__(
        self,
        learning_rate=None,
        initial_accumulator_value=None,
        epsilon=None,
        lr_decay=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Adagrad",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        from refopt.reference.adagrad import adagrad_defaults

        conv = _check_convention(convention)
        form = conv.adagrad_form
        defaults = adagrad_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "Adagrad")
        if initial_accumulator_value is None:
            initial_accumulator_value = defaults["initial_accumulator_value"]
        self.initial_accumulator_value = check_real(
            "initial_accumulator_value", initial_accumulator_value, low=0,
            low_open=form == "tf1")  # TF1: "must be positive"
        if form == "tf1":
            if epsilon is not None:
                raise ValueError(
                    "convention='tf1' has no epsilon for Adagrad (TF1's AdagradOptimizer "
                    f"multiplies by rsqrt(accumulator)). Received: epsilon={epsilon!r}"
                )
        else:
            if epsilon is None or (conv.epsilon_zero_is_default and epsilon == 0):
                epsilon = defaults["epsilon"]
            epsilon = check_real("epsilon", epsilon, low=0)
        self.epsilon = epsilon
        if lr_decay is not None:
            lr_decay = check_real("lr_decay", lr_decay, low=0)
            if form != "torch":
                raise ValueError(
                    f"`lr_decay` is PyTorch's option; convention={conv.name!r} has no "
                    f"learning-rate decay for Adagrad. Received: lr_decay={lr_decay!r}"
                )
        elif form == "torch":
            lr_decay = 0.0  # torch's default: the configs and checkpoints say so
        self.lr_decay = lr_decay
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

    def _root_positive(self):
        """Whether ``sqrt(acc + eps)`` is > 0 in every dtype: then the Keras step leaves a row
        with a zero gradient as it is (``w - 0/root = w``, ``acc + 0 = acc``), so the dense
        step on a densified gradient and the row update give the same bits."""
        with np.errstate(under="ignore"):
            return bool(self.initial_accumulator_value > 0
                        or (self.epsilon is not None and np.float16(self.epsilon) > 0))

    #: torch's root (the ``sqrt`` knob; refopt.reference.sqrt): the fused kernel's (IEEE) on
    #: dense gradients under "torch_fused", else the for-loop's (MKL's, on the host)
    _torch_sqrt = "fused_dense"

    @property
    def _lazy_sparse(self):
        """Whether an IndexedSlices gradient goes to the lazy row update.

        tf_keras, Keras 2, TF1 and PyTorch update only the present rows, except under
        tf_keras' decoupled weight decay, which covers every row: that step goes through
        :meth:`_update_step` whole (its sparse branch is lazy itself). Keras 3 applies its
        dense step to the summed gradient, which the row update reproduces bit for bit when
        :meth:`_root_positive` (and no weight decay or ``keras3_sparse_square`` is
        involved): the row update is used then (it is the fused one).
        """
        from refopt.reference.adagrad import is_lazy_sparse

        conv = self.convention
        decoupled = self.weight_decay is not None and self._decay_mode() == "decoupled"
        if conv.adagrad_form == "keras3":
            return not (conv.keras3_sparse_square or decoupled) and self._root_positive()
        return is_lazy_sparse(conv) and not decoupled

    def _sparse_update_kind(self):
        # Keras 3: its dense step on the summed gradient; tf_keras with decoupled decay: its
        # row update, which the dense step on the densified gradient equals when the root
        # cannot be zero (see _root_positive)
        conv = self.convention
        if conv.keras3_sparse_square:
            return None
        if conv.adagrad_form == "keras3" or (
                conv.adagrad_form == "tf_keras" and self._root_positive()):
            return "densify"
        return None

    def _row_width(self, dtype):
        """The elements per row shared by every built variable of ``dtype`` of rank >= 1
        (1, or 2 meaning "several"), or None when they differ: TF1's sparse kernel treats
        one-element rows differently, and the executors do not say which variable a lazy
        step's rule is for."""
        widths = {int(np.prod(shape[1:], dtype=np.int64)) == 1
                  for shape, dt in self._var_specs if dt == dtype and len(shape) >= 1}
        if len(widths) != 1:
            return None
        return 1 if widths.pop() else 2

    def slot_initial_value(self, name, dtype):
        from refopt.reference.adagrad import initial_accumulator

        return initial_accumulator(self.convention, dtype, self.initial_accumulator_value)

    def _lr_decay(self):
        return 0.0 if self.lr_decay is None else self.lr_decay

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.adagrad import adagrad_rows
        from refopt.reference.variants import l2_torch

        conv = self.convention
        if weight_decay is not None:  # PyTorch's L2 term: grad.add(param, alpha=wd)
            if lazy_rows or isinstance(grad, IndexedSlices):
                raise TypeError(
                    f"convention={conv.name!r}: Adagrad's weight_decay is not compatible with "
                    "sparse gradients (PyTorch raises for it). Received an IndexedSlices "
                    f"gradient with weight_decay={weight_decay!r}"
                )
            grad = l2_torch(grad, param, weight_decay)
        kw = dict(learning_rate=learning_rate, epsilon=self.epsilon, convention=conv,
                  lr_decay=self._lr_decay(), step=step)
        if lazy_rows:  # the present rows, gathered (duplicates summed)
            p, acc = adagrad_rows(param, grad, slots["accumulator"], **kw)
            return p, {"accumulator": acc}
        r = self._kernels.adagrad_update(param, grad, slots["accumulator"], **kw)
        return r.param, {"accumulator": r.accumulator}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`).

        ``row_width``: the elements per row of a lazy sparse step's variable. TF1's sparse
        kernel divides by ``sqrt`` on rows of one element and multiplies by ``rsqrt`` on
        longer ones; without ``row_width`` the width shared by every variable of ``dtype``
        is used, and when they differ there is no rule (None: the reference's path).
        """
        from refopt.rules.adagrad import adagrad_call

        if lazy_rows and row_width is None and self.convention.adagrad_form == "tf1":
            row_width = self._row_width(np.dtype(dtype))
        return adagrad_call(dtype, self.convention, learning_rate=learning_rate,
                            epsilon=self.epsilon, lr_decay=self._lr_decay(), step=step,
                            lazy_rows=lazy_rows, row_width=row_width)

    def get_config(self):
        config = super().get_config()
        config.update(initial_accumulator_value=self.initial_accumulator_value,
                      epsilon=self.epsilon)
        if self.lr_decay is not None:
            config["lr_decay"] = self.lr_decay
        return config


Adagrad.__doc__ = Adagrad.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
