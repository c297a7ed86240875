"""TF1's proximal optimizers with the tf.keras 2.11+ API: ProximalAdagrad, ProximalGradientDescent.

Follows ``tf.compat.v1.train.ProximalAdagradOptimizer`` and
``ProximalGradientDescentOptimizer`` (their keyword names: ``l1_regularization_strength``,
``l2_regularization_strength``, ``initial_accumulator_value``); the update is
:mod:`refopt.reference.proximal` (readable NumPy, the reference backend) and
:mod:`refopt.rules.proximal` (the fast backends). Only TF1 has them, so the default convention
is ``"tf1"``; the others refuse them, naming both.
"""

from __future__ import annotations

import numpy as np

from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_real,
    default_learning_rate,
)

__all__ = ["ProximalAdagrad", "ProximalGradientDescent"]


class _Proximal(Optimizer):
    """What the two share: the regularisation strengths, lazy sparse rows, the rule's row
    width, no weight decay."""

    _optimizer = None  # "ProximalAdagrad" or "ProximalGradientDescent"
    _lazy_sparse = True  # TF1's sparse kernels move only the present rows

    def _setup(self, conv, learning_rate, l1, l2, defaults):
        from refopt.optimizers.rowwise_adagrad import refuse_keras3_sparse_square
        from refopt.reference.proximal import check_strength

        refuse_keras3_sparse_square(conv, self._optimizer)
        learning_rate = default_learning_rate(
            learning_rate, defaults, conv, self._optimizer,
            why=f"TF1's {self._optimizer}Optimizer takes it as its first, required argument")
        self.l1_regularization_strength = check_strength(
            "l1_regularization_strength",
            defaults["l1_regularization_strength"] if l1 is None else l1)
        self.l2_regularization_strength = check_strength(
            "l2_regularization_strength",
            defaults["l2_regularization_strength"] if l2 is None else l2)
        return learning_rate

    def _decay_mode(self):
        return "none"  # TF1's optimizers have no weight decay

    def _sparse_update_kind(self):
        return None  # always the lazy rows

    def _hyper(self, learning_rate):
        return {"learning_rate": learning_rate,
                    "l1_regularization_strength": self.l1_regularization_strength,
                    "l2_regularization_strength": self.l2_regularization_strength}

    def _row_width(self, dtype):
        """The elements per row shared by every built variable of ``dtype`` of rank >= 1
        (1, or 2 meaning "several"), or None when they differ: TF1's sparse kernels compute
        one-element rows differently, and the executors do not always say which variable a
        lazy step's rule is for."""
        widths = {int(np.prod(shape[1:], dtype=np.int64)) == 1
                  for shape, dt in self._var_specs if dt == dtype and len(shape) >= 1}
        if len(widths) != 1:
            return None
        return 1 if widths.pop() else 2

    def _proximal_rule(self, dtype, learning_rate, lazy_rows, row_width):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`).

        ``row_width``: the elements per row of a lazy sparse step's variable (TF1's sparse
        kernels compute rows of one element in their scalar loop); without it, the width
        shared by every variable of ``dtype`` (None where they differ: the reference's
        path). None also where TF divides in double (one-element rows, float32, ``l2 > 0``).
        """
        from refopt.rules.proximal import proximal_adagrad_call, proximal_sgd_call

        if lazy_rows and row_width is None:
            row_width = self._row_width(np.dtype(dtype))
        make = (proximal_adagrad_call if self._optimizer == "ProximalAdagrad"
                else proximal_sgd_call)
        return make(dtype, self.convention, lazy_rows=lazy_rows, row_width=row_width,
                    **self._hyper(learning_rate))

    def get_config(self):
        config = super().get_config()
        config.update(l1_regularization_strength=self.l1_regularization_strength,
                      l2_regularization_strength=self.l2_regularization_strength)
        return config


_DOC_COMMON = """
    learning_rate : float or refopt.schedules.LearningRateSchedule
        Step size, required (TF1's optimizer has no default). Stored rounded to float32, as
        TF1's float32 tensor; a float64 variable sees ``float64(float32(lr))``.
    l1_regularization_strength, l2_regularization_strength : float, optional
        :math:`\\lambda_1, \\lambda_2 \\ge 0` (default 0): the proximal step soft-thresholds
        by ``lr_t * l1`` (only when ``l1 > 0``) and divides by ``1 + l2 * lr_t``. Cast to the
        variable's dtype through float32 (``tf.cast``), so they must be finite in float32."""

_DOC_SPARSE = """
    IndexedSlices gradients: repeated indices are summed first (TF1's ``apply_gradients``
    de-duplicates before its sparse kernel, so a repeated row moves once, by the sum; the raw
    ``tf.raw_ops.SparseApplyProximal*`` ops would apply each occurrence in turn); then only the
    present rows{slot} move: absent rows are never touched, an empty gradient changes
    nothing. On rows of one element (a 1-D variable, or shape ``(n, 1)``) TF's sparse kernel
    computes the final quotient in double; ``backend="cpu"``/``"cuda"`` run that step with the
    reference where it differs from the dtype's division (float32, ``l2 > 0``).
    The cost of a sparse step follows the rows touched, not the table size.

    ``weight_decay`` and ``use_ema`` are refused (TF1 has neither), and so is a convention
    with ``keras3_sparse_square=True`` (a Keras 3 bug; these are not Keras 3 optimizers).

    float16: TF1 has no float16 CPU kernel for this optimizer (``ResourceApplyProximal*``
    and ``ResourceSparseApplyProximal*`` are registered on the CPU for float32 and float64
    only: TF 2.21 raises ``InvalidArgumentError``). refopt computes float16 variables with the
    same formulas in float16; that is refopt's extrapolation, checked against no
    framework."""


class ProximalAdagrad(_Proximal):
    r"""Proximal Adagrad (FOBOS with Adagrad's step), as TF1's ``ProximalAdagradOptimizer``.

    Parameters
    ----------{common}
    initial_accumulator_value : float, optional
        The accumulators' start, > 0 (TF1: "must be positive"); default 0.1. Converted
        straight to each variable's dtype; a value that rounds to 0 there (``1e-50`` in
        float32) starts the accumulator at 0, as TF1 does, with a ``RuntimeWarning`` (an
        element whose first gradient is 0 becomes NaN).
    {base_kwargs}

    Notes
    -----
    Slot: ``accumulator`` (the running sum of squared gradients). One step (TF1's
    ``ApplyProximalAdagrad``; see :func:`refopt.reference.proximal_adagrad_update`):

    .. math::

        a \leftarrow a + g^2,\quad \eta_t = \eta\,\mathrm{rsqrt}(a),\quad v = w - g\eta_t,\quad
        w \leftarrow \mathrm{sign}(v)\max(|v| - \eta_t\lambda_1, 0) / (1 + \lambda_2\eta_t)

    TF's CPU ``rsqrt`` is Eigen's vectorised estimate (1-2 ulp off on about a fifth of
    float32 inputs; refopt's is correctly rounded): float32 golden cases carry a per-step
    bound, float64 ones are bit-identical.
    {sparse}

    Raises
    ------
    ValueError
        A convention other than ``"tf1"`` (its ``proximal_adagrad_form`` is ``"none"``); a
        negative or non-finite strength, or one that overflows float32 (``1e39``); a
        convention with ``keras3_sparse_square=True``; ``initial_accumulator_value <= 0``;
        the base class's errors (``weight_decay`` and ``use_ema`` under tf1).
    TypeError
        No ``learning_rate``; a hyperparameter not a real number.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones(1, np.float32)
    >>> opt = refopt.ProximalAdagrad(learning_rate=0.1)
    >>> opt.apply_gradients([(np.ones(1, np.float32), w)])
    1
    >>> w, opt.get_slot(w, "accumulator")
    (array([0.9046537], dtype=float32), array([1.1], dtype=float32))
    """

    slot_variables = ("accumulator",)
    _optimizer = "ProximalAdagrad"

    def __init__(
        self,
        learning_rate=None,
        initial_accumulator_value=None,
        l1_regularization_strength=None,
        l2_regularization_strength=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="ProximalAdagrad",
        backend=None,
        convention="tf1",
        **kwargs,
    ):
        from refopt.reference.proximal import proximal_adagrad_defaults

        conv = _check_convention(convention)
        defaults = proximal_adagrad_defaults(conv)
        learning_rate = self._setup(conv, learning_rate, l1_regularization_strength,
                                    l2_regularization_strength, defaults)
        if initial_accumulator_value is None:
            initial_accumulator_value = defaults["initial_accumulator_value"]
        self.initial_accumulator_value = check_real(
            "initial_accumulator_value", initial_accumulator_value, low=0, low_open=True)
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

    def slot_initial_value(self, name, dtype):
        from refopt.reference._common import scalar
        from refopt.reference.proximal import warn_if_accumulator_underflows

        warn_if_accumulator_underflows(self.initial_accumulator_value, dtype)
        return scalar(dtype, self.initial_accumulator_value)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.proximal import proximal_adagrad_rows

        hyper = self._hyper(learning_rate)
        if lazy_rows:  # the present rows, gathered (duplicates summed)
            width = int(np.prod(param.shape[1:], dtype=np.int64))
            p, acc = proximal_adagrad_rows(param, grad, slots["accumulator"],
                                           one_element_rows=width == 1, **hyper)
            return p, {"accumulator": acc}
        r = self._kernels.proximal_adagrad_update(param, grad, slots["accumulator"],
                                                  convention=self.convention, **hyper)
        return r.param, {"accumulator": r.accumulator}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`; defined on
        each class, next to its NumPy update, so that the executors use it)."""
        return self._proximal_rule(dtype, learning_rate, lazy_rows, row_width)

    def get_config(self):
        config = super().get_config()
        config["initial_accumulator_value"] = self.initial_accumulator_value
        return config


class ProximalGradientDescent(_Proximal):
    r"""Proximal gradient descent (FOBOS), as TF1's ``ProximalGradientDescentOptimizer``.

    Parameters
    ----------{common}
    {base_kwargs}

    Notes
    -----
    No slot. One step (TF1's ``ApplyProximalGradientDescent``; see
    :func:`refopt.reference.proximal_gradient_descent_update`), with ``lr*l1`` and
    ``1 + l2*lr`` rounded in the dtype:

    .. math::

        v = w - g\eta,\quad
        w \leftarrow \mathrm{sign}(v)\max(|v| - \eta\lambda_1, 0) / (1 + \lambda_2\eta)

    Every recorded golden case is bit-identical.
    {sparse}

    Raises
    ------
    ValueError
        A convention other than ``"tf1"`` (its ``proximal_sgd_form`` is ``"none"``); a
        negative or non-finite strength, or one that overflows float32 (``1e39``); a
        convention with ``keras3_sparse_square=True``; the base class's errors.
    TypeError
        No ``learning_rate``; a hyperparameter not a real number.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, 0.01], np.float32)
    >>> opt = refopt.ProximalGradientDescent(learning_rate=0.1, l1_regularization_strength=0.5)
    >>> opt.apply_gradients([(np.array([1.0, 0.0], np.float32), w)])
    1
    >>> w
    array([0.84999996, 0.        ], dtype=float32)
    """

    slot_variables = ()
    _optimizer = "ProximalGradientDescent"

    def __init__(
        self,
        learning_rate=None,
        l1_regularization_strength=None,
        l2_regularization_strength=None,
        weight_decay=None,
        clipnorm=None,
        clipvalue=None,
        global_clipnorm=None,
        use_ema=False,
        ema_momentum=0.99,
        ema_overwrite_frequency=None,
        jit_compile=True,
        name="ProximalGradientDescent",
        backend=None,
        convention="tf1",
        **kwargs,
    ):
        from refopt.reference.proximal import proximal_gradient_descent_defaults

        conv = _check_convention(convention)
        defaults = proximal_gradient_descent_defaults(conv)
        learning_rate = self._setup(conv, learning_rate, l1_regularization_strength,
                                    l2_regularization_strength, defaults)
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

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        if self._uses_update_step():  # a subclass rewrote the update with update_step
            return Optimizer._update_step(self, param, grad, slots, learning_rate, step,
                                          weight_decay, lazy_rows)
        from refopt.reference.proximal import proximal_gradient_descent_rows

        hyper = self._hyper(learning_rate)
        if lazy_rows:
            width = int(np.prod(param.shape[1:], dtype=np.int64))
            return proximal_gradient_descent_rows(param, grad, one_element_rows=width == 1,
                                                  **hyper), {}
        r = self._kernels.proximal_gradient_descent_update(param, grad,
                                                           convention=self.convention, **hyper)
        return r.param, {}

    def update_rule(self, dtype, learning_rate, step, *, lazy_rows=False,
                    optax_weight_decay=None, row_width=None):
        """The fast paths' rule for one step (see :meth:`Optimizer.update_rule`; defined on
        each class, next to its NumPy update, so that the executors use it)."""
        return self._proximal_rule(dtype, learning_rate, lazy_rows, row_width)


for _cls in (ProximalAdagrad, ProximalGradientDescent):
    _cls.__doc__ = (_cls.__doc__.replace("{common}", _DOC_COMMON)
                    .replace("{sparse}", _DOC_SPARSE.replace(
                        "{slot}", " (and their accumulator rows)" if _cls.slot_variables
                        else ""))
                    .replace("{base_kwargs}", BASE_KWARGS_DOC))
del _cls
