"""RAdam (rectified Adam), as PyTorch and optax compute it (``Convention.radam_form``).

RAdam (Liu et al., 2020) is Adam whose adaptive step is switched on only once the
approximated simple moving average's length :math:`\\rho_t` passes a threshold, and then
scaled by a rectification term :math:`r_t`; before that it is SGD with the bias-corrected
momentum. PyTorch (``torch.optim.RAdam``) and optax (``optax.radam``) have it; Keras 3,
tf_keras, Keras 2 and TF1 do not (``radam_form="none"``). They differ in where the host
scalars are computed (PyTorch: Python floats, float64; optax: in the variable's precision
under ``jit``, float32 for float32 variables), in the threshold test (PyTorch
:math:`\\rho_t > 5`, optax :math:`\\rho_t \\ge` ``threshold``), in epsilon's place
(PyTorch adds it to the raw :math:`\\sqrt{v}` and multiplies by :math:`\\sqrt{1 -
\\beta_2^t}`, optax to the root of the bias-corrected :math:`\\hat v`), in their moment
updates (PyTorch's ``lerp`` and ``addcmul``, optax's FMAs) and in weight decay (PyTorch's
L2 term or decoupled decay; optax's ``radam`` has none). :func:`radam_update` writes both
as readable NumPy in the variable dtype.

Sources (read for facts only; nothing here is copied from them):

==========  ===============================================================================
form        framework file
==========  ===============================================================================
torch       ``torch/optim/radam.py`` (``_single_tensor_radam``, the default path on CPU:
            not ``foreach``, not ``capturable``), ``torch/_tensor.py`` (``__rtruediv__``:
            ``x.reciprocal() * other``)
optax       ``optax/_src/alias.py`` (``radam``), ``optax/_src/transform.py``
            (``scale_by_radam``), ``optax/tree_utils/_tree_math.py`` (``tree_update_moment``,
            ``tree_update_moment_per_elem_norm``, ``tree_bias_correction``), under
            ``jax.jit`` on XLA:CPU
==========  ===============================================================================
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from refopt import _libm
from refopt.conventions import Convention, get_convention
from refopt.indexed_slices import IndexedSlices
from refopt.reference._common import (
    as_float_array,
    check_grad,
    check_hyper,
    check_like,
    check_step,
    scalar,
)
from refopt.reference.rmsprop import _lerp
from refopt.reference.sqrt import sqrt_function
from refopt.reference.variants import fma, optax_apply

__all__ = [
    "RAdamResult",
    "radam_update",
    "radam_defaults",
    "radam_initial_state",
    "radam_scalars",
    "check_radam_args",
]

_FORMS = ("torch", "optax")
_F64 = np.dtype(np.float64)
_F32 = np.dtype(np.float32)


class RAdamResult(NamedTuple):
    """New arrays after one RAdam step: ``param``, ``m`` (torch's ``exp_avg``, optax's
    ``mu``) and ``v`` (``exp_avg_sq``, ``nu``)."""

    param: np.ndarray
    m: np.ndarray
    v: np.ndarray


# The constructors' defaults. optax requires a learning rate (None).
_DEFAULTS = {
    "torch": dict(learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                  epsilon_root=0.0, threshold=5.0),
    "optax": dict(learning_rate=None, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                  epsilon_root=0.0, threshold=5.0),
}


def _convention(convention):
    if convention is None:
        return get_convention("torch")
    if isinstance(convention, (Convention, str)):
        return get_convention(convention)
    raise TypeError(
        "`convention` must be None (torch), a preset name or a refopt.conventions."
        f"Convention. Received: convention={convention!r}"
    )


def _form(conv):
    form = conv.radam_form
    if form not in _FORMS:
        raise ValueError(
            f"RAdam does not exist under convention={conv.name!r} (radam_form={form!r}; "
            "only PyTorch and optax have it). Received: "
            f"convention={conv.name!r}"
        )
    return form


def radam_defaults(convention=None):
    """The framework's RAdam constructor defaults, under refopt's argument names.

    Parameters
    ----------
    convention : None, str or Convention
        None means torch; the form is ``convention.radam_form`` (an error for ``"none"``).

    Returns
    -------
    dict
        ``learning_rate`` (0.001 PyTorch; None for optax, which requires one), ``beta_1``
        0.9, ``beta_2`` 0.999, ``epsilon`` 1e-8, and optax's ``epsilon_root`` 0.0 and
        ``threshold`` 5.0 (PyTorch's threshold is fixed at 5, its test strict).
    """
    return dict(_DEFAULTS[_form(_convention(convention))])


def radam_initial_state(param):
    """Fresh ``(m, v)`` for ``param``: zeros of its shape and dtype (both frameworks)."""
    param = as_float_array("param", param)
    return np.zeros(param.shape, param.dtype), np.zeros(param.shape, param.dtype)


def radam_scalars(dtype, *, beta_1, beta_2, step, convention=None, threshold=5.0):
    """The host scalars of step ``step``, computed as the framework computes them.

    Returns
    -------
    dict
        torch (Python floats, float64): ``bc1 = 1 - b1**t``, ``bc2 = 1 - b2**t``, ``rho_inf
        = 2/(1 - b2) - 1``, ``rho = rho_inf - 2*t*b2**t / bc2``, ``rectified = rho > 5``
        and, when rectified, ``rect = ((rho-4)(rho-2) rho_inf / ((rho_inf-4)(rho_inf-2)
        rho))**0.5`` (C ``pow``), else None. optax (NumPy scalars of the working precision:
        float64 for float64 variables, under ``jax_enable_x64``, float32 otherwise):
        ``b2t = b2**t`` (``powf``/``pow``), ``bc1 = 1 - b1**t``, ``bc2 = 1 - b2t``,
        ``rho = f(rho_inf) - (f(2t) b2t) / (1 - b2t)``, ``rectified = rho >= f(threshold)``
        and ``rect = sqrt((rho-4)(rho-2) f(rho_inf) / (f((rho_inf-4)(rho_inf-2)) rho))``
        (the product of the two Python constants is a Python float, rounded once).
    """
    dtype = np.dtype(dtype)
    form = _form(_convention(convention))
    b1, b2 = float(beta_1), float(beta_2)
    rho_inf = 2.0 / (1.0 - b2) - 1.0
    with np.errstate(all="ignore"):
        if form == "torch":
            t = float(step)  # torch's step is a float32 tensor, read with .item()
            bc1 = 1 - b1 ** t
            bc2 = 1 - b2 ** t
            rho = rho_inf - 2 * t * (b2 ** t) / bc2
            rectified = bool(rho > 5.0)
            rect = None
            if rectified:
                rect = ((rho - 4) * (rho - 2) * rho_inf
                        / ((rho_inf - 4) * (rho_inf - 2) * rho)) ** 0.5
            return dict(bc1=bc1, bc2=bc2, rho_inf=rho_inf, rho=rho, rectified=rectified,
                        rect=rect)
        work = _F64 if dtype == _F64 else _F32
        w = work.type
        one = w(1)
        b1t = _libm.power(work, w(b1), w(step))
        b2t = _libm.power(work, w(b2), w(step))
        bc1, bc2 = one - b1t, one - b2t
        if _convention(convention).optax_jit == "eager":
            # eager jnp: b2**count with an int32 count is square-and-multiply in the working
            # precision (under jit, and in optax's jitted bias_correction: pow)
            b2t = optax_eager_power(work, b2, step)
        rho = w(rho_inf) - (w(2 * step) * b2t) / (one - b2t)
        rectified = bool(rho >= w(threshold))
        rect = np.sqrt((rho - w(4)) * (rho - w(2)) * w(rho_inf)
                       / (w((rho_inf - 4.0) * (rho_inf - 2.0)) * rho))
        return dict(bc1=bc1, bc2=bc2, rho_inf=rho_inf, rho=rho, rectified=rectified,
                    rect=rect)


def optax_eager_power(work, b, t):
    """``b**t`` as eager JAX computes a Python float to an int32 array power: ``lax.pow``
    with an integer exponent, square-and-multiply in ``work`` (float32, or float64 under
    ``jax_enable_x64``), each product rounded; ``t >= 0``."""
    acc, x, y = work.type(1), work.type(b), int(t)
    while y:
        if y & 1:
            acc = work.type(acc * x)
        x = work.type(x * x)
        y >>= 1
    return acc


def _torch(w, g, m, v, lr, b1, b2, eps, step, sqrt=np.sqrt):
    """``_single_tensor_radam`` (after its weight decay): ``lerp_``, ``mul_``/``addcmul_``
    (one FMA), the bias-corrected ``m``, and the rectified or the SGD step. ``sqrt``: the
    convention's root (MKL's under ``sqrt="mkl"``, :mod:`refopt.reference.sqrt`)."""
    dt = w.dtype
    s = radam_scalars(dt, beta_1=b1, beta_2=b2, step=step, convention="torch")
    m = _lerp(m, g, scalar(dt, 1 - b1))  # exp_avg.lerp_(grad, 1 - beta1)
    v = fma(scalar(dt, 1 - b2) * g, g, v * scalar(dt, b2))  # mul_(b2).addcmul_(g, g, 1-b2)
    m_hat = m / scalar(dt, s["bc1"])
    lr = scalar(dt, lr)
    if s["rectified"]:
        # (bc2 ** 0.5) / (sqrt(v) + eps) is Tensor.__rtruediv__: reciprocal, then a product
        adaptive = (scalar(dt, 1) / (sqrt(v) + scalar(dt, eps))) * scalar(dt, s["bc2"] ** 0.5)
        return w - ((m_hat * lr) * adaptive) * scalar(dt, s["rect"]), m, v
    return w - m_hat * lr, m, v


def _optax(w, g, m, v, lr, b1, b2, eps, eps_root, threshold, step, jit="update"):
    """``scale_by_radam`` then ``scale_by_learning_rate`` under ``jit`` (the moments'
    ``(1-b)*x + b*t`` contracted into FMAs), ``apply_updates`` outside. ``jit`` is
    ``Convention.optax_jit`` (``"eager"``: every operation rounded, no FMA)."""
    dt = w.dtype
    s = radam_scalars(dt, beta_1=b1, beta_2=b2, step=step,
                      convention=get_convention("optax", optax_jit=jit), threshold=threshold)
    if jit == "eager":
        m = scalar(dt, 1 - b1) * g + scalar(dt, b1) * m
        v = scalar(dt, 1 - b2) * (g * g) + scalar(dt, b2) * v
    else:
        m = fma(scalar(dt, 1 - b1), g, scalar(dt, b1) * m)
        v = fma(scalar(dt, 1 - b2), g * g, scalar(dt, b2) * v)
    m_hat = m / scalar(dt, s["bc1"])
    if s["rectified"]:
        v_hat = v / scalar(dt, s["bc2"])
        u = (scalar(dt, s["rect"]) * m_hat) / (np.sqrt(v_hat + scalar(dt, eps_root))
                                               + scalar(dt, eps))
    else:
        u = m_hat
    return optax_apply(w, u, scalar(dt, -float(lr)), jit), m, v


def radam_update(param, grad, m, v, *, learning_rate, beta_1=0.9, beta_2=0.999,
                 epsilon=1e-8, step=1, convention=None, epsilon_root=0.0, threshold=5.0):
    r"""One RAdam step as the convention's framework computes it; returns new arrays.

    Parameters
    ----------
    param : ndarray of float16, float32 or float64, any shape
        The variable :math:`w` (after PyTorch's decoupled decay, if any).
    grad : ndarray like ``param``
        The gradient :math:`g` (with PyTorch's L2 term already added, if any). Neither
        framework takes sparse gradients.
    m, v : ndarray like ``param``
        The first and second moments; fresh ones are zeros (:func:`radam_initial_state`).
    learning_rate : float
        :math:`\eta`.
    beta_1, beta_2 : float, default 0.9, 0.999
    epsilon : float, default 1e-8
        :math:`\epsilon`, in the denominator of the rectified step (see Notes).
    step : int, default 1
        The 1-based step :math:`t` (PyTorch counts per parameter, optax globally).
    convention : None, str or refopt.conventions.Convention
        Whose step; None means torch. The form is ``convention.radam_form``.
    epsilon_root : float, default 0.0
        optax's ``eps_root``, inside the root; PyTorch has none (must be 0).
    threshold : float, default 5.0
        optax's ``threshold`` on :math:`\rho_t`; PyTorch's is fixed at 5 (must be 5).

    Returns
    -------
    RAdamResult
        ``(param, m, v)``, new arrays of the input dtype and shape.

    Raises
    ------
    TypeError
        An array not a float16/32/64 ndarray, an IndexedSlices gradient; a hyperparameter
        not a real number; ``convention`` of the wrong type.
    ValueError
        A state array or gradient whose shape or dtype differs from ``param``'s; a
        convention without RAdam; a negative epsilon or ``epsilon_root``; ``epsilon_root``
        or ``threshold`` other than the default under torch; ``step`` not an integer >= 1.

    Notes
    -----
    With :math:`\rho_\infty = 2/(1-\beta_2) - 1` and
    :math:`\rho_t = \rho_\infty - 2t\beta_2^t/(1-\beta_2^t)`, the rectification is
    :math:`r_t = \sqrt{(\rho_t-4)(\rho_t-2)\rho_\infty / ((\rho_\infty-4)(\rho_\infty-2)
    \rho_t)}`. Every array operation is in the dtype of ``param`` and rounds once, unless
    written :math:`\mathrm{fma}(a, b, c)`; :math:`\bar x` is a Python number converted to
    the dtype.

    **torch** (``torch.optim.RAdam``, the single-tensor for-loop, PyTorch's default on CPU;
    the scalars :math:`b_1 = 1-\beta_1^t`, :math:`b_2 = 1-\beta_2^t`, :math:`\rho_t`,
    :math:`r_t` in Python floats, float64):

    .. math::

        m \leftarrow \mathrm{lerp}(m, g, \overline{1-\beta_1}), \quad
        v \leftarrow \mathrm{fma}(\overline{1-\beta_2}\, g,\ g,\ v\bar\beta_2), \quad
        \hat m = m / \bar b_1

        \rho_t > 5:\quad w \leftarrow w - \Big(\big((\hat m\,\bar\eta)\,
        (1/(\sqrt{v} + \bar\epsilon))\,\overline{\sqrt{b_2}}\big)\Big)\, \bar r_t;
        \qquad \text{else}\quad w \leftarrow w - \hat m\,\bar\eta

    (``lerp`` is one FMA, branching on :math:`|1-\beta_1| < 0.5`; the division of the
    Python float :math:`\sqrt{b_2}` by the tensor is ``reciprocal()`` times it). With
    :math:`\beta_2 = 0.999`, :math:`\rho_5 = 4.996` and :math:`\rho_6 = 5.994`: steps 1-5
    are not rectified. PyTorch's CPU ``sqrt`` (MKL's vector math) is not correctly rounded
    (1 ulp off on some float32 inputs; refopt's is); the golden cases carry that tolerance.
    Weight decay is a separate step (:func:`refopt.reference.variants.l2_torch`: the L2
    term ``fma(w, wd, g)``; with ``decoupled_weight_decay``
    :func:`~refopt.reference.variants.decay_torch`: ``w * (1 - lr*wd)``).

    **optax** (``optax.radam`` = ``scale_by_radam`` then ``scale_by_learning_rate``, the
    update under ``jax.jit``, ``apply_updates`` outside; the scalars :math:`\beta^t`
    (``powf``), :math:`b_1, b_2, \rho_t, r_t` in the working precision: float32, or
    float64 for float64 variables):

    .. math::

        m \leftarrow \mathrm{fma}(\overline{1-\beta_1}, g, \bar\beta_1 m), \quad
        v \leftarrow \mathrm{fma}(\overline{1-\beta_2}, g^2, \bar\beta_2 v), \quad
        \hat m = m / b_1

        \rho_t \ge \theta:\quad u = (r_t \hat m) / (\sqrt{v / b_2 + \bar\epsilon_r} +
        \bar\epsilon); \qquad \text{else}\quad u = \hat m; \qquad
        w \leftarrow w + \overline{-\eta}\, u

    Differences, in short: the threshold test (:math:`>` 5 vs :math:`\ge \theta`); where
    :math:`\rho_t` and :math:`r_t` are computed (float64 vs the working precision: at step
    1 optax's float32 :math:`\rho_1` is a cancellation of about 1999 - 1998); epsilon added
    to :math:`\sqrt{v}` (PyTorch: effectively :math:`\epsilon/\sqrt{b_2}` on the
    bias-corrected scale) or to :math:`\sqrt{\hat v}` (optax); the moment updates' FMAs;
    weight decay (PyTorch only).

    float16: evaluated with each operation rounded to float16 (FMAs once, from float64);
    not checked against a framework.

    Examples
    --------
    The first step is SGD with the bias-corrected momentum, which is the gradient:

    >>> import numpy as np
    >>> w = np.array([1.0, -2.0], np.float32)
    >>> m, v = radam_initial_state(w)
    >>> r = radam_update(w, np.array([0.5, 0.25], np.float32), m, v, learning_rate=0.1)
    >>> r.param
    array([ 0.95 , -2.025], dtype=float32)

    References
    ----------
    Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond", ICLR 2020
    (arXiv:1908.03265).
    """
    param, grad, m, v, form = check_radam_args(
        param, grad, m, v, learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
        epsilon=epsilon, step=step, convention=convention, epsilon_root=epsilon_root,
        threshold=threshold)
    with np.errstate(all="ignore"):
        if form == "torch":
            w, m_new, v_new = _torch(param, grad, m, v, learning_rate, beta_1, beta_2,
                                     epsilon, step, sqrt_function(_convention(convention)))
        else:
            w, m_new, v_new = _optax(param, grad, m, v, learning_rate, beta_1, beta_2,
                                     epsilon, epsilon_root, threshold, step,
                                     jit=_convention(convention).optax_jit)
    return RAdamResult(np.asarray(w), np.asarray(m_new), np.asarray(v_new))


def check_radam_args(param, grad, m, v, *, learning_rate, beta_1, beta_2, epsilon, step,
                     convention, epsilon_root, threshold):
    """Validate :func:`radam_update`'s arguments (its Raises section); return
    ``(param, grad, m, v, form)``. Shared with the fast backends' ``radam_update``."""
    param = as_float_array("param", param)
    form = _form(_convention(convention))
    if isinstance(grad, IndexedSlices):
        raise TypeError(
            "RAdam takes no sparse gradient (PyTorch raises 'RAdam does not support sparse "
            "gradients', JAX has none); pass grad.to_dense(). Received: grad of type "
            f"IndexedSlices with radam_form={form!r}"
        )
    grad = check_grad(param, grad)
    m = check_like(param, "m", m)
    v = check_like(param, "v", v)
    for name, x in (("learning_rate", learning_rate), ("beta_1", beta_1), ("beta_2", beta_2),
                    ("epsilon", epsilon), ("epsilon_root", epsilon_root),
                    ("threshold", threshold)):
        check_hyper(name, x)
    for name, x in (("epsilon", epsilon), ("epsilon_root", epsilon_root)):
        if not x >= 0:
            raise ValueError(f"`{name}` must be >= 0. Received: {name}={x!r}")
    if form == "torch":
        if epsilon_root != 0:
            raise ValueError(
                "`epsilon_root` is optax's option; torch's RAdam has none. Received: "
                f"epsilon_root={epsilon_root!r} with radam_form='torch'"
            )
        if threshold != 5.0:
            raise ValueError(
                "torch's RAdam rectifies when rho_t > 5 (fixed); `threshold` is optax's "
                f"option. Received: threshold={threshold!r} with radam_form='torch'"
            )
    check_step(step)
    return param, grad, m, v, form
