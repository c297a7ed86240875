"""Partial row-wise Adam (FBGEMM's ``PARTIAL_ROWWISE_ADAM``) with the tf.keras 2.11+ API.

Follows FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (``optimizer=EmbOptimType.
PARTIAL_ROWWISE_ADAM``; keywords ``learning_rate``, ``eps``, ``beta1``, ``beta2``,
``weight_decay``) as its CUDA source reads; the update is
:func:`refopt.reference.partial_rowwise_adam_update` (readable NumPy) and a compiled row loop
on ``backend="cpu"``, bit-identical to it. No FBGEMM value backs it (FBGEMM has no CPU kernel
for this optimizer): see :mod:`refopt.reference.partial_rowwise_adam`.
"""

from __future__ import annotations

import numpy as np

from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    default_learning_rate,
)
from refopt.optimizers.rowwise_adagrad import refuse_keras3_sparse_square

__all__ = ["PartialRowWiseAdam"]

_BASE_DOC = BASE_KWARGS_DOC.split("    clipnorm", 1)[1]  # its own weight_decay, not Keras'
_F32 = np.dtype(np.float32)


class PartialRowWiseAdam(Optimizer):
    r"""Partial row-wise Adam: ``m`` per element, ``v`` one per row, FBGEMM's CUDA rule.

    Each row :math:`r` of a variable (the first axis; an embedding table ``(V, D)``) keeps one
    second moment :math:`v_r`, an exponential average of the mean over the row of its
    squared gradient; the first moment :math:`m` is Adam's, per element. The row moves by
    :math:`\eta\,(\hat m / (\sqrt{\hat v_r} + \epsilon) + \lambda w)`. The rule, the float and
    double arithmetic of FBGEMM's CUDA source and where it may differ from FBGEMM's GPU are
    in :func:`refopt.reference.partial_rowwise_adam_update`.

    .. warning:: Not checked against FBGEMM: FBGEMM has no CPU kernel for this optimizer
       (``fbgemm-gpu-cpu`` refuses it), so no golden value could be recorded. refopt follows
       FBGEMM's source as read and is tested against float64 hand computations.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Default 0.01 (FBGEMM's).
    beta_1, beta_2 : float, optional
        FBGEMM's ``beta1``, ``beta2``, in [0, 1) (and < 1 in float32). Default 0.9, 0.999.
    epsilon : float, optional
        FBGEMM's ``eps``, outside the root. Default 1e-8.
    weight_decay : float, optional
        >= 0, default 0, finite in float32 (FBGEMM's C float): ``lr*wd*w`` is subtracted
        with the step, inside the row update (FBGEMM has no decay mode for this optimizer).
    clipnorm, clipvalue, global_clipnorm, use_ema, ...
        As every refopt optimizer (PyTorch's conventions for them; FBGEMM's own
        ``gradient_clipping``/``max_norm`` are not reproduced).

    Raises
    ------
    ValueError
        A convention other than ``"fbgemm"`` (its ``rowwise_adagrad_form``) or with
        ``keras3_sparse_square=True``; a beta outside [0, 1); a negative, non-finite or
        float32-overflowing ``epsilon``/``weight_decay``; the base class's errors.
    TypeError
        A hyperparameter not a real number; a variable that is not float32 (at ``build`` or
        the first ``apply_gradients``: FBGEMM's float32 tables only).

    Notes
    -----
    Slots: ``m`` (the variable's shape, FBGEMM's ``momentum1``) and ``v`` (shape ``(V,)``,
    ``momentum2``), starting at 0. IndexedSlices gradients update only their rows: duplicate
    indices are summed first (from zero, in order of appearance), rows absent keep their
    values and both moments; an empty one changes nothing but the step count. A dense
    gradient steps every row.

    The bias corrections' ``t`` is the step count of the convention (``"fbgemm"`` counts per
    variable, as PyTorch: every ``apply_gradients`` that gives the variable a gradient, an
    empty IndexedSlices included). FBGEMM's ``iter`` counts every forward of the module (one
    per training step); with one refopt variable per table and a gradient (possibly empty)
    for every table at every step, the two are the same. FBGEMM can keep ``momentum1`` in
    float16 or bfloat16 (``optimizer_state_dtypes``); refopt keeps ``m`` in float32 only.

    ``backend="cpu"`` runs the rows in one compiled serial loop, bit for bit the reference;
    ``backend="cuda"`` takes the host step (a ``HostStepWarning``: the reference's numbers,
    the state copied both ways).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> table = np.ones((4, 2), np.float32)
    >>> opt = refopt.PartialRowWiseAdam(learning_rate=0.1, backend="reference")
    >>> g = refopt.IndexedSlices(np.array([[1., 2.], [2., 2.]], np.float32), [1, 1], (4, 2))
    >>> opt.apply_gradients([(g, table)])
    1
    >>> opt.get_slot(table, "v").tolist()     # (1 - 0.999) * mean of (3^2, 4^2) on row 1
    [0.0, 0.012499839067459106, 0.0, 0.0]
    """

    slot_variables = ("m", "v")

    def __init__(
        self,
        learning_rate=None,
        beta_1=None,
        beta_2=None,
        epsilon=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="PartialRowWiseAdam",
        backend=None,
        convention="fbgemm",
        **kwargs,
    ):
        from refopt.reference.partial_rowwise_adam import (
            check_form,
            check_hyperparameters,
            partial_rowwise_adam_defaults,
        )

        conv = _check_convention(convention)
        check_form(conv)
        refuse_keras3_sparse_square(conv, "PartialRowWiseAdam")
        defaults = partial_rowwise_adam_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv,
                                              "PartialRowWiseAdam")
        self.beta_1 = defaults["beta_1"] if beta_1 is None else beta_1
        self.beta_2 = defaults["beta_2"] if beta_2 is None else beta_2
        self.epsilon = defaults["epsilon"] if epsilon is None else epsilon
        check_hyperparameters(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                              weight_decay=weight_decay)
        super().__init__(
            name=name,
            learning_rate=learning_rate,
            weight_decay=None,  # inside the row update, not the pipeline's decay
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
        self.weight_decay = weight_decay

    # the row update applies the decay itself; a variable of exclude_from_weight_decay
    # takes weight_decay 0 (as an FBGEMM table configured without it): the staged step
    # passes decay_excluded=True
    def _weight_decay_acts(self):
        return False

    _decays_in_update = True

    _lazy_sparse = True

    def slot_shape(self, name, shape):
        if name == "v":  # one per row (FBGEMM's momentum2)
            return tuple(shape[:1])
        return tuple(shape)

    def _check_var_list(self, var_list, what="var_list"):
        var_list = super()._check_var_list(var_list, what)
        for i, var in enumerate(var_list):
            if np.dtype(var.dtype) != _F32:
                raise TypeError(
                    f"PartialRowWiseAdam takes float32 variables (FBGEMM's float32 tables; "
                    f"its float and double arithmetic has no meaning for another dtype). "
                    f"Received: {what}[{i}] of dtype {np.dtype(var.dtype)}")
        return var_list

    def _kw(self, learning_rate, step, decay_excluded=False):
        wd = 0.0 if decay_excluded else (self.weight_decay or 0.0)
        return dict(learning_rate=learning_rate, beta_1=self.beta_1, beta_2=self.beta_2,
                    epsilon=self.epsilon, weight_decay=wd, step=step)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False, decay_excluded=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        fns = self._kernels  # the reference's functions, or the CPU's compiled row loop
        kw = self._kw(learning_rate, step, decay_excluded)
        if lazy_rows:  # the present rows, gathered (duplicates summed)
            from refopt.reference._common import check_step
            from refopt.reference.partial_rowwise_adam import check_hyperparameters

            # the row step checks nothing (the values may have been set since __init__)
            check_hyperparameters(learning_rate=learning_rate, beta_1=self.beta_1,
                                  beta_2=self.beta_2, epsilon=self.epsilon,
                                  weight_decay=self.weight_decay)
            check_step(step)
            p, m, v = fns.partial_rowwise_adam_rows(param, grad, slots["m"], slots["v"], **kw)
        else:
            p, m, v = fns.partial_rowwise_adam_update(param, grad, slots["m"], slots["v"],
                                                      convention=self.convention, **kw)
        return p, {"m": m, "v": v}

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon,
                      weight_decay=self.weight_decay)
        return config


PartialRowWiseAdam.__doc__ = PartialRowWiseAdam.__doc__.replace(
    "    clipnorm, clipvalue, global_clipnorm, use_ema, ...\n        As every refopt optimizer "
    "(PyTorch's conventions for them; FBGEMM's own\n        ``gradient_clipping``/"
    "``max_norm`` are not reproduced).\n",
    "    clipnorm" + _BASE_DOC.rstrip() + "\n        (FBGEMM's own ``gradient_clipping`` and "
    "``max_norm`` are not reproduced.)\n")
