"""FTRL-Proximal with the tf.keras 2.11+ API, in the numerics of each TensorFlow family.

Follows ``keras/src/optimizers/ftrl.py`` and ``tf_keras/optimizers/ftrl.py`` for the API and
keyword names (Keras 2's legacy ``Ftrl`` and TF1's ``FtrlOptimizer`` use the same names); the
update of each convention is :func:`refopt.reference.ftrl_update` (readable NumPy, the
reference backend) and :mod:`refopt.rules.ftrl` (the fast backends). PyTorch and optax have no
FTRL: their conventions are refused.
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
    optimizer_form,
)

__all__ = ["Ftrl"]


class Ftrl(Optimizer):
    r"""FTRL-Proximal (McMahan et al., 2013) in each TensorFlow family's numerics.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Step size :math:`\eta`. Default 0.001; TF1's ``FtrlOptimizer`` has none, so it is
        required under ``convention="tf1"``.
    learning_rate_power : float, default -0.5
        <= 0: the weight's denominator grows as ``accumulator ** -learning_rate_power``
        (0: a fixed learning rate).
    initial_accumulator_value : float, default 0.1
        The accumulators' start, >= 0. tf.keras 2.11+ and Keras 3 round it through float32
        (a float64 variable starts at ``float64(float32(0.1))``).
    l1_regularization_strength, l2_regularization_strength : float, default 0.0
        >= 0. The L1 strength thresholds the weight to exactly 0 while ``|linear| <= l1``.
    l2_shrinkage_regularization_strength : float, default 0.0
        >= 0: ``2 * shrinkage * w`` is added to the gradient of the linear term (Keras 2 and
        TF1 switch to the ``ApplyFtrlV2`` kernel when it is > 0).
    beta : float, default 0.0
        >= 0, the paper's beta: the l2 term becomes ``l2 + beta / (2 * learning_rate)``.
    {base_kwargs}

    Raises
    ------
    ValueError
        Also: ``convention="torch"`` or ``"optax"`` (no FTRL there), an argument out of its
        range (a negative strength or accumulator start, a positive ``learning_rate_power``).

    Notes
    -----
    Slots: ``accumulator`` (the sum of squared gradients ``n``; TF1's "accum") and
    ``linear`` (``z``). Every step rebuilds the weight from them in closed form (see
    :func:`refopt.reference.ftrl_update` for each framework's formula): the initial weights
    only enter through the first step's ``z``.

    IndexedSlices gradients (duplicate indices summed first): Keras 2 and TF1 update only the
    present rows and their slots (``SparseApplyFtrl``); tf.keras 2.11+ and Keras 3 densify
    the gradient, so every row is rebuilt and a row that never had a gradient becomes 0.
    ``weight_decay`` is Keras' decoupled decay (tf_keras, Keras 3); Keras 2 and TF1 have none.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0], np.float32)
    >>> opt = refopt.Ftrl(learning_rate=0.1)
    >>> opt.apply_gradients([(np.array([0.5], np.float32), w)])
    1
    >>> w, opt.get_slot(w, "accumulator"), opt.get_slot(w, "linear")
    (array([0.3809621], dtype=float32), array([0.35], dtype=float32), array([-2.2538023], dtype=float32))
    """

    slot_variables = ("accumulator", "linear")

    def __init__(
        self,
        learning_rate=None,
        learning_rate_power=-0.5,
        initial_accumulator_value=0.1,
        l1_regularization_strength=0.0,
        l2_regularization_strength=0.0,
        l2_shrinkage_regularization_strength=0.0,
        beta=0.0,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="Ftrl",
        backend=None,
        convention="tf_keras",
        **kwargs,
    ):
        conv = _check_convention(convention)
        form = optimizer_form(conv, "Ftrl")
        learning_rate = default_learning_rate(
            learning_rate, {"learning_rate": None if form == "tf1" else 0.001}, conv, "Ftrl",
            why="TF1's FtrlOptimizer has no default")
        self.learning_rate_power = check_real("learning_rate_power", learning_rate_power,
                                              high=0)
        self.initial_accumulator_value = check_real(
            "initial_accumulator_value", initial_accumulator_value, low=0)
        self.l1_regularization_strength = check_real(
            "l1_regularization_strength", l1_regularization_strength, low=0)
        self.l2_regularization_strength = check_real(
            "l2_regularization_strength", l2_regularization_strength, low=0)
        self.l2_shrinkage_regularization_strength = check_real(
            "l2_shrinkage_regularization_strength", l2_shrinkage_regularization_strength,
            low=0)
        self.beta = check_real("beta", beta, low=0)
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

    def _hyper(self):
        return dict(learning_rate_power=self.learning_rate_power,
                    l1_regularization_strength=self.l1_regularization_strength,
                    l2_regularization_strength=self.l2_regularization_strength,
                    l2_shrinkage_regularization_strength=self.l2_shrinkage_regularization_strength,
                    beta=self.beta)

    @property
    def _lazy_sparse(self):
        """Keras 2 and TF1 update only the present rows (``SparseApplyFtrl``); not with the
        ``keras3_sparse_square`` knob, which hands the step the raw duplicates (then
        :meth:`_update_step` sums them itself)."""
        from refopt.reference.ftrl import is_lazy_sparse

        return is_lazy_sparse(self.convention) and not self.convention.keras3_sparse_square

    def _sparse_update_kind(self):
        # tf_keras and Keras 3 apply their dense step to the summed gradient; Keras 3 with
        # keras3_sparse_square squares each occurrence: the host path
        if self.convention.ftrl_form in ("tf_keras", "keras3") and not (
                self.convention.keras3_sparse_square):
            return "densify"
        return None

    def slot_initial_value(self, name, dtype):
        if name == "linear":
            return np.dtype(dtype).type(0)
        from refopt.reference.ftrl import initial_accumulator

        return initial_accumulator(self.convention, dtype, self.initial_accumulator_value)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference import ftrl as ref

        kw = dict(learning_rate=learning_rate, convention=self.convention, **self._hyper())
        if lazy_rows:  # the present rows, gathered (duplicates summed)
            p, n, z = ref.ftrl_rows(param, grad, slots["accumulator"], slots["linear"], **kw)
            return p, {"accumulator": n, "linear": z}
        update = getattr(self._kernels, "ftrl_update", ref.ftrl_update)
        if isinstance(grad, IndexedSlices) and self.convention.ftrl_form in ("keras2", "tf1"):
            update = ref.ftrl_update  # the row update of the raw duplicates (host)
        r = update(param, grad, slots["accumulator"], slots["linear"], **kw)
        return r.param, {"accumulator": r.accumulator, "linear": r.linear}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`). A step that
        needs the C library's ``pow`` (tf_keras and Keras 3 always, the kernels at a power
        other than 0.5 and on one-element rows) gets :data:`refopt.rules.ftrl.FTRL_POW`,
        whose ``targets`` is the CPU only (the CUDA executor then takes its host step; see
        :func:`refopt.rules.ftrl.ftrl_call`)."""
        try:
            from refopt.rules.ftrl import ftrl_call
        except ImportError:  # pragma: no cover - the rule module is optional
            return None
        return ftrl_call(dtype, self.convention, learning_rate=learning_rate,
                         lazy_rows=lazy_rows, row_width=row_width,
                         allow_pow=True, **self._hyper())

    def get_config(self):
        config = super().get_config()
        config.update(initial_accumulator_value=self.initial_accumulator_value,
                      **self._hyper())
        return config


Ftrl.__doc__ = Ftrl.__doc__.replace("{base_kwargs}", BASE_KWARGS_DOC)
