"""Row-wise Adagrad (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``) with the tf.keras 2.11+ API.

Follows FBGEMM's ``SplitTableBatchedEmbeddingBagsCodegen`` (``optimizer=EmbOptimType.
EXACT_ROWWISE_ADAGRAD``; keywords ``learning_rate``, ``eps``, ``weight_decay``,
``weight_decay_mode``) and TorchRec's fused embeddings, which pass the same keywords; the
update is :func:`refopt.reference.rowwise_adagrad_update` (readable NumPy), compiled row
loops on ``backend="cpu"`` and device row kernels on ``backend="cuda"``, all bit-identical.
"""

from __future__ import annotations

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    default_learning_rate,
    optimizer_form,
)

__all__ = ["RowWiseAdagrad"]


def refuse_keras3_sparse_square(conv, optimizer):
    """Refuse a convention with ``keras3_sparse_square=True`` for ``optimizer`` (which is
    not a Keras 3 optimizer): the knob makes the pipeline skip summing the duplicates of an
    IndexedSlices, and the lazy rows' scatter would then keep only the last duplicate."""
    if conv.keras3_sparse_square:
        raise ValueError(
            f"{optimizer} cannot take a convention with keras3_sparse_square=True (that knob "
            f"reproduces a Keras 3 bug of Keras 3's own optimizers; {optimizer} is not one, "
            f"and its duplicate indices are always summed). Received: convention="
            f"{conv.name!r} with keras3_sparse_square=True")

_BASE_DOC = BASE_KWARGS_DOC.split("    clipnorm", 1)[1]  # its own weight_decay, not Keras'


class RowWiseAdagrad(Optimizer):
    r"""Row-wise Adagrad: one accumulator per row of a table, FBGEMM's numerics.

    Each row :math:`r` of a variable (the first axis; an embedding table ``(V, D)``) keeps
    one accumulator :math:`a_r`, grown by the mean over the row of its squared gradient;
    the row then moves by :math:`\eta\,g_r/(\sqrt{a_r} + \epsilon)`. The rule, the order of
    its roundings and FBGEMM's sources are in :func:`refopt.reference.rowwise_adagrad_update`.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, optional
        Default 0.01 (FBGEMM's).
    epsilon : float, optional
        FBGEMM's ``eps``, outside the root. Default 1e-8.
    weight_decay : float, optional
        >= 0, default 0 (none), finite in float32 (FBGEMM's C float). Acts as
        ``weight_decay_mode`` says, inside the row update.
    weight_decay_mode : {"none", "l2", "decoupled"}, default "none"
        FBGEMM's ``WeightDecayMode``: ``"l2"`` adds ``wd*w`` to the gradient in the sum of
        squares and multiplies the row by ``1 - wd*lr/(sqrt(a) + eps)``; ``"decoupled"``
        multiplies it by ``1 - lr*wd``. A ``weight_decay`` > 0 needs a mode other than
        ``"none"`` (FBGEMM would silently ignore it).
    exact : bool, default True
        ``True``: FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` (duplicate indices of an
        IndexedSlices summed first, from zero in order of appearance; one step per row).
        ``False``: FBGEMM's approximate ``ROWWISE_ADAGRAD``, every occurrence a step of its
        own, one after another (:func:`refopt.reference.rowwise_adagrad_sequential_update`).
        Cost of ``False``: ``backend="cpu"`` (float32) runs the occurrences in one compiled
        loop, about the exact step's cost; ``"cuda"`` one launch, one thread per distinct
        row walking its occurrences in order; the reference backend runs one vectorised
        NumPy step per *round*, rounds being the largest number of times one index occurs
        in the gradient (a row looked up 1000 times in a batch: 1000 NumPy steps). Either
        way only the rows present are updated: the cost does not grow with the table.
    clipnorm, clipvalue, global_clipnorm, use_ema, ...
        As every refopt optimizer (PyTorch's conventions for them; FBGEMM's own
        ``gradient_clipping``/``max_norm`` are not reproduced).

    Raises
    ------
    ValueError
        A convention other than ``"fbgemm"`` or with ``keras3_sparse_square=True``; a
        negative, non-finite or float32-overflowing ``epsilon``/``weight_decay``; an unknown
        ``weight_decay_mode``; ``weight_decay > 0`` with mode ``"none"``; the base class's
        errors.
    TypeError
        A hyperparameter not a real number; ``exact`` not a bool.

    Notes
    -----
    Slot: ``accumulator``, shape ``(V,)`` (FBGEMM's ``momentum1``), starting at 0.
    IndexedSlices gradients update only their rows (rows absent keep their values and
    accumulators: no decay); an empty one changes nothing. A dense gradient steps every
    row. Exists under ``convention="fbgemm"`` (its ``rowwise_adagrad_form``) only; a
    convention with ``keras3_sparse_square=True`` is refused.

    float16 tables compute in float16 with a float16 accumulator. That is not FBGEMM's
    float16: its ``SparseType.FP16`` tables keep a float32 accumulator, compute in float32
    and round the stored weights stochastically (``stochastic_rounding=True`` by default);
    refopt records and reproduces float32 tables only. Any row width ``D`` is accepted
    (FBGEMM refuses ``D`` not a multiple of 4; ``D = 0`` changes nothing here).

    ``backend="cuda"`` updates float32 and float64 tables on the device, in place, with
    hand-written kernels (:mod:`refopt.kernels.cuda.rowwise_adagrad`: one thread per row,
    no atomics; an IndexedSlices' duplicates summed on the host first), bit for bit the
    reference. Steps with clipping or the EMA, float16 tables and 0-d variables take the
    host step (a ``HostStepWarning``: the same numbers, the state copied both ways).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> table = np.ones((4, 2), np.float32)
    >>> opt = refopt.RowWiseAdagrad(learning_rate=0.1, backend="reference")
    >>> g = refopt.IndexedSlices(np.array([[1., 2.], [2., 2.]], np.float32), [1, 1], (4, 2))
    >>> opt.apply_gradients([(g, table)])
    1
    >>> opt.get_slot(table, "accumulator").tolist()     # mean of (3^2, 4^2) on row 1
    [0.0, 12.5, 0.0, 0.0]
    """

    slot_variables = ("accumulator",)

    def __init__(
        self,
        learning_rate=None,
        epsilon=None,
        weight_decay=None,
        weight_decay_mode="none",
        exact=True,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="RowWiseAdagrad",
        backend=None,
        convention="fbgemm",
        **kwargs,
    ):
        from refopt.reference.rowwise_adagrad import (
            check_hyperparameters,
            rowwise_adagrad_defaults,
        )

        conv = _check_convention(convention)
        optimizer_form(conv, "RowWiseAdagrad", knob="rowwise_adagrad_form")
        refuse_keras3_sparse_square(conv, "RowWiseAdagrad")
        defaults = rowwise_adagrad_defaults(conv)
        learning_rate = default_learning_rate(learning_rate, defaults, conv, "RowWiseAdagrad")
        self.epsilon = defaults["epsilon"] if epsilon is None else epsilon
        check_hyperparameters(epsilon=self.epsilon, weight_decay=weight_decay,
                              weight_decay_mode=weight_decay_mode)
        wd = weight_decay
        if not isinstance(exact, (bool, np.bool_)):
            raise TypeError(f"`exact` must be a bool. Received: exact={exact!r}")
        self.weight_decay_mode = weight_decay_mode
        self.exact = bool(exact)
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
        self.weight_decay = wd

    # the row update applies the decay itself (FBGEMM's weight_decay_mode); a variable of
    # exclude_from_weight_decay takes none (weight_decay_mode "none", as an FBGEMM table
    # configured without decay): the staged step passes decay_excluded=True
    def _weight_decay_acts(self):
        return False

    _decays_in_update = True

    @property
    def _lazy_sparse(self):
        return self.exact

    def _keeps_duplicates(self):
        """The approximate form needs the raw occurrences (see the staged step)."""
        return not self.exact

    #: the approximate form moves only the present rows: the staged step gathers them and
    #: hands the update the occurrences as an IndexedSlices over the gathered rows
    _rows_in_turn = True

    def slot_shape(self, name, shape):
        if name == "accumulator":  # one per row (FBGEMM's momentum1)
            return tuple(shape[:1])
        return tuple(shape)

    def _kw(self, learning_rate, decay_excluded=False):
        if decay_excluded:
            return dict(learning_rate=learning_rate, epsilon=self.epsilon, weight_decay=0.0,
                        weight_decay_mode="none")
        return dict(learning_rate=learning_rate, epsilon=self.epsilon,
                    weight_decay=self.weight_decay or 0.0,
                    weight_decay_mode=self.weight_decay_mode)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False, decay_excluded=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        k = self._kernels  # the reference's functions, or the CPU's compiled row step
        acc = slots["accumulator"]
        kw = self._kw(learning_rate, decay_excluded)
        if lazy_rows and isinstance(grad, IndexedSlices):  # approximate, gathered rows
            p, a = k.rowwise_adagrad_sequential_update(param, grad, acc,
                                                       convention=self.convention, **kw)
        elif lazy_rows:  # the present rows, gathered (duplicates summed)
            from refopt.reference.rowwise_adagrad import check_hyperparameters

            check_hyperparameters(**kw)  # the row step checks nothing (values set since)
            p, a = k.rowwise_adagrad_rows(param, grad, acc, **kw)
        elif isinstance(grad, IndexedSlices):  # approximate: the occurrences in turn
            p, a = k.rowwise_adagrad_sequential_update(param, grad, acc,
                                                       convention=self.convention, **kw)
        else:
            p, a = k.rowwise_adagrad_update(param, grad, acc, convention=self.convention,
                                            **kw)
        return p, {"accumulator": a}

    def _cuda_calls(self, state, positions, grads, lr_value, kc):
        """``backend="cuda"``: the device row kernels' launches of this step, or None for
        the host step (clipping, the EMA, float16 tables; see
        :func:`_cuda_device_calls`)."""
        return _cuda_device_calls(self, state, positions, grads, lr_value)

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon, weight_decay=self.weight_decay,
                      weight_decay_mode=self.weight_decay_mode, exact=self.exact)
        return config


# ----------------------------------------------------------------- backend="cuda"
def _cuda_covered(opt, state, positions):
    """Whether the device kernels express this step of ``opt`` (else the host step)."""
    from refopt.executors import plan as _plan
    from refopt.kernels.cuda.rowwise_adagrad import DEVICE_DTYPES, MODES

    if type(opt)._update_step is not RowWiseAdagrad._update_step or opt._uses_update_step():
        return False
    if opt.use_ema or _plan.clip_kind(opt)[0] is not None:
        return False
    if opt.weight_decay_mode not in MODES:
        return False
    if opt.weight_decay and any(id(opt._vars[i]) in opt._exclude_ids for i in positions):
        return False  # exclude_from_weight_decay: the host step (decay_excluded)
    for i in positions:
        d = state.views[i]
        if np.dtype(d.dtype) not in DEVICE_DTYPES or len(d.shape) == 0:
            return False
    return True


def _cuda_validate(opt, forms, lr_value):
    """Raise what the reference's step would, before anything is launched: the reference's
    own ``_update_step`` on one-row arrays of each (dtype, form) of the step."""
    from refopt.executors.cuda import _reference_clone

    clone = _reference_clone(opt)
    with np.errstate(all="ignore"):
        for dt, form in sorted(forms, key=str):
            z = np.zeros((1, 1), dt)
            slots = {"accumulator": np.zeros(1, dt)}
            if form == "rows":  # exact, present rows (duplicates summed)
                clone._update_step(z, z, slots, lr_value, 1, lazy_rows=True)
            elif form == "sequential":  # approximate, the occurrences in turn
                g = IndexedSlices(np.zeros((1, 1), dt), np.zeros(1, np.int64), (1, 1))
                clone._update_step(z, g, slots, lr_value, 1, lazy_rows=True)
            else:
                clone._update_step(z, z, slots, lr_value, 1)


def _cuda_device_calls(opt, state, positions, grads, lr_value):
    """The device launches of one ``RowWiseAdagrad`` step, or None (then the host step).

    Parameters
    ----------
    opt : refopt.RowWiseAdagrad
    state : refopt.executors.cuda.CudaState
    positions : list of int
        The variables of the step (indices into ``state.views``).
    grads : list of device arrays or IndexedSlices
        Their gradients (dense ones already copied if they alias the state).
    lr_value : float
        The learning rate of this step.

    Returns
    -------
    list of (callable, tuple, dict) or None
        The launches, run by the executor after every check passed (a step that raises
        changes nothing); None for what the kernels do not cover: clipping, the EMA, float16
        tables, a 0-d variable, a subclass that rewrites the update.

    Raises
    ------
    TypeError, ValueError
        The reference's errors for the current hyperparameters, before any launch.
    """
    from refopt.kernels.cuda._launch import cuda, sorted_rows
    from refopt.kernels.cuda.rowwise_adagrad import exact_rows, sequential_rows

    if not _cuda_covered(opt, state, positions):
        return None
    forms = set()
    for i, g in zip(positions, grads):
        dt = np.dtype(state.views[i].dtype)
        if not isinstance(g, IndexedSlices):
            forms.add((dt, "dense"))
        else:
            forms.add((dt, "rows" if opt.exact else "sequential"))
    _cuda_validate(opt, forms, lr_value)
    kw = {"learning_rate": lr_value, "epsilon": opt.epsilon,
          "weight_decay": opt.weight_decay or 0.0, "weight_decay_mode": opt.weight_decay_mode}
    calls = []
    for i, g in zip(positions, grads):
        d = state.views[i]
        acc = state.slots["accumulator"][i]
        v = d.shape[0]
        width = d.size // v if v else 0
        if d.size == 0:
            continue  # no row, or rows of no element: nothing changes
        table = d.reshape(v, width)
        if not isinstance(g, IndexedSlices):
            calls.append((exact_rows, (table, g.reshape(v, width), acc, None), kw))
            continue
        if g.indices.shape[0] == 0:
            continue  # an empty gradient changes nothing
        if opt.exact:
            with np.errstate(all="ignore"):
                u = g.deduplicate()  # from zero, in order of appearance
            n = u.indices.shape[0]
            vals = cuda.to_device(np.ascontiguousarray(u.values).reshape(n, width))
            rows = cuda.to_device(np.ascontiguousarray(u.indices, np.int64))
            calls.append((exact_rows, (table, vals, acc, rows), kw))
        else:
            order, starts, urows = sorted_rows(g.indices)
            n = g.indices.shape[0]
            vals = cuda.to_device(np.ascontiguousarray(g.values).reshape(n, width))
            calls.append((sequential_rows, (table, acc, vals, cuda.to_device(order),
                                            cuda.to_device(starts), cuda.to_device(urows)),
                          kw))
    return calls



RowWiseAdagrad.__doc__ = RowWiseAdagrad.__doc__.replace(
    "    clipnorm, clipvalue, global_clipnorm, use_ema, ...\n        As every refopt optimizer "
    "(PyTorch's conventions for them; FBGEMM's own\n        ``gradient_clipping``/"
    "``max_norm`` are not reproduced).\n",
    "    clipnorm" + _BASE_DOC.rstrip() + "\n        (FBGEMM's own ``gradient_clipping`` and "
    "``max_norm`` are not reproduced.)\n")
