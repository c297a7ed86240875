"""bitsandbytes' 8-bit optimizers (``Adam8bit``, ``AdamW8bit``, ``Lion8bit``) with the
tf.keras 2.11+ API.

Follows ``bitsandbytes/optim/adam.py``, ``adamw.py``, ``lion.py`` and ``optimizer.py``
(``Optimizer2State``/``Optimizer1State``: state layout, ``min_8bit_size``, the block size
of 256, the per-parameter step counter) of bitsandbytes 0.50.2, and its CPU kernels
(``bitsandbytes/backends/cpu/ops.py``), whose numbers :mod:`refopt.reference.eightbit`
computes. bitsandbytes' keywords are written Keras style: ``lr`` -> ``learning_rate``,
``betas`` -> ``beta_1``, ``beta_2``, ``eps`` -> ``epsilon``.

The slots are not of the variable's dtype (uint8 codes, float32 block maxima): the
optimizers declare them with :meth:`~refopt.Optimizer.slot_dtype` and
:meth:`~refopt.Optimizer.slot_shape`, and every backend keeps them apart from its flat
buffers. The update has no rule: ``backend="cpu"`` runs the reference's functions in the
staged step, ``backend="cuda"`` the host step (one :class:`HostStepWarning
<refopt.executors.cuda.HostStepWarning>`).
"""

from __future__ import annotations

import numbers

import numpy as np

from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import (
    BASE_KWARGS_DOC,
    Optimizer,
    _check_convention,
    check_bool,
    check_real,
)

__all__ = ["Adam8bit", "AdamW8bit", "Lion8bit"]

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)
#: bitsandbytes' block size of the optimizers' 8-bit state (fixed: not a keyword there).
_BLOCK_SIZE = 256
# the base class's keywords from clipnorm on (weight_decay is documented per class)
_BASE_DOC = ("    clipnorm" + BASE_KWARGS_DOC.split("    clipnorm", 1)[1]).replace(
    'Convention, default "tf_keras"',
    'Convention, default "torch"\n        (the only one these classes take, or a Convention derived from it)')


def _check_min_8bit_size(value):
    if (not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_))
            or value < 0):
        raise ValueError("`min_8bit_size` must be an integer >= 0 (bitsandbytes' minimum "
                         "number of elements of a parameter with 8-bit state). Received: "
                         f"min_8bit_size={value!r}")
    return int(value)


class _EightBit(Optimizer):
    """What the three classes share: convention, float32 variables, slot layout, config."""

    #: ("m", "v") for Adam, ("m",) for Lion: the moments; each has a ``<name>_absmax``
    _moments = ()

    def __init__(self, learning_rate, beta_1, beta_2, weight_decay, min_8bit_size, is_paged,
                 name, convention, kwargs):
        conv = _check_convention(convention)
        cls = type(self).__name__
        if conv.name != "torch":
            raise ValueError(
                f"{cls} is bitsandbytes' optimizer, built on torch.optim: it exists under "
                f"convention='torch' (or a Convention derived from it) only; "
                f"convention={conv.name!r} ({conv.framework}) has no {cls}. Received: "
                f"convention={conv.name!r}")
        if learning_rate is None:
            raise TypeError(f"{cls} needs a `learning_rate`. Received: learning_rate=None")
        self.beta_1 = check_real("beta_1", beta_1, low=0, high=1, high_open=True)
        self.beta_2 = check_real("beta_2", beta_2, low=0, high=1, high_open=True)
        self.min_8bit_size = _check_min_8bit_size(min_8bit_size)
        if check_bool("is_paged", is_paged):
            raise ValueError(
                f"{cls}: paged state (CUDA unified memory) does not exist on the CPU, which "
                "refopt reproduces (bitsandbytes' CPU path ignores it with a warning). "
                f"Received: is_paged={is_paged!r}")
        super().__init__(name=name, learning_rate=learning_rate, weight_decay=weight_decay,
                         convention=convention, **kwargs)

    # ---------------------------------------------------------------- slots
    def _eight_bit(self, shape):
        """Whether a variable of ``shape`` keeps 8-bit state (bitsandbytes: ``numel >=
        min_8bit_size``)."""
        return int(np.prod(shape, dtype=np.int64)) >= self.min_8bit_size

    def slot_shape(self, name, shape):
        """``<moment>_absmax``: ``(ceil(size / 256),)`` on the 8-bit path, ``(0,)`` under
        ``min_8bit_size``; the moments: the variable's shape."""
        if name.endswith("_absmax") and name[:-7] in self._moments:
            if not self._eight_bit(shape):
                return (0,)
            n = int(np.prod(shape, dtype=np.int64))
            return (-(-n // _BLOCK_SIZE),)
        return tuple(shape)

    def slot_dtype(self, name, shape, dtype):
        """The moments: uint8 codes on the 8-bit path, float32 under ``min_8bit_size``; the
        block maxima float32."""
        if name in self._moments:
            return _U8 if self._eight_bit(shape) else _F32
        if name.endswith("_absmax") and name[:-7] in self._moments:
            return _F32
        return np.dtype(dtype)

    def dequantized_slot(self, var, slot_name):
        """The float32 value of moment ``slot_name`` (``"m"``, Adam's ``"v"``) of ``var``.

        Parameters
        ----------
        var : ndarray (device array under ``backend="cuda"``)
            A variable the optimizer was built with.
        slot_name : str

        Returns
        -------
        ndarray of float32, shape of ``var``
            A new host array: ``code[q] * absmax[block]`` on the 8-bit path (bitsandbytes'
            signed map for ``m``, unsigned for ``v``), a copy of the float32 moment
            otherwise.

        Raises
        ------
        KeyError
            ``var`` unknown to the optimizer, or ``slot_name`` not a moment.
        """
        from refopt.reference.eightbit import create_dynamic_map, dequantize_blockwise

        if slot_name not in self._moments:
            raise KeyError(f"Unknown moment {slot_name!r}; {type(self).__name__} has "
                           f"{list(self._moments)}")

        def host(a):
            return a.copy() if isinstance(a, np.ndarray) else a.copy_to_host()

        codes = host(self.get_slot(var, slot_name))
        if codes.dtype != _U8:
            return codes
        absmax = host(self.get_slot(var, f"{slot_name}_absmax"))
        return dequantize_blockwise(codes, absmax, create_dynamic_map(slot_name == "m"),
                                    _BLOCK_SIZE)

    # ---------------------------------------------------------------- variables
    def _check_var_list(self, var_list, what="var_list"):
        var_list = super()._check_var_list(var_list, what)
        for i, v in enumerate(var_list):
            if np.dtype(v.dtype) != _F32:
                raise TypeError(
                    f"{type(self).__name__} takes float32 variables (bitsandbytes' CPU "
                    f"8-bit optimizers, as refopt reproduces them). Received: {what}[{i}] "
                    f"of dtype {np.dtype(v.dtype)}")
        return var_list

    # ---------------------------------------------------------------- the step
    def _decay_mode(self):
        """bitsandbytes' decay is decoupled, ``w * f32(1 - lr*wd)`` (PyTorch's AdamW form),
        applied by the pipeline before the update (so exclusions apply)."""
        return "torch"

    def _weight_decay_acts(self):
        return bool(self.weight_decay)  # bitsandbytes skips it at 0 (None: none too)

    def _sparse_update_kind(self):
        return None  # refused in _update_step

    def _eightbit_state(self, slots):
        from refopt.reference.eightbit import EightBitState

        first = slots[self._moments[0]]
        eight = first.dtype == _U8
        moments = [slots[m] for m in self._moments] + [None] * (2 - len(self._moments))
        absmax = ([slots[f"{m}_absmax"] for m in self._moments] + [None]
                  * (2 - len(self._moments))) if eight else [None, None]
        return EightBitState(moments[0], moments[1], absmax[0], absmax[1])

    def _new_slots(self, slots, state):
        out = {}
        for k, m in enumerate(self._moments):
            out[m] = state[k]
            absmax = state[2 + k]
            out[f"{m}_absmax"] = slots[f"{m}_absmax"].copy() if absmax is None else absmax
        return out

    def _refuse_sparse(self, grad):
        if isinstance(grad, IndexedSlices):
            raise TypeError(
                f"{type(self).__name__} takes dense gradients only (bitsandbytes' optimizers "
                "have no sparse update). Received an IndexedSlices; pass "
                "gradient.to_dense().")

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2,
                      min_8bit_size=self.min_8bit_size)
        return config


class _Adam8bitBase(_EightBit):
    _moments = ("m", "v")
    slot_variables = ("m", "v", "m_absmax", "v_absmax")
    #: torch's CPU root (MKL's, knob ``sqrt``): the fast backends take the host step
    _torch_sqrt = "loop"

    def __init__(self, learning_rate, beta_1, beta_2, epsilon, weight_decay, amsgrad,
                 min_8bit_size, is_paged, name, convention, kwargs):
        if check_bool("amsgrad", amsgrad):
            raise ValueError(f"{type(self).__name__} does not support amsgrad=True (nor does "
                             "bitsandbytes). Received: amsgrad=True")
        self.epsilon = check_real("epsilon", epsilon, low=0)
        super().__init__(learning_rate, beta_1, beta_2, weight_decay, min_8bit_size, is_paged,
                         name, convention, kwargs)

    def _root(self):
        """``"mkl"`` where the convention's root is MKL's (torch's CPU ``sqrt``) and MKL is
        here; else ``"ieee"`` (with the convention's one-time warning when MKL is missing)."""
        from refopt._mkl import mkl_available
        from refopt.reference.sqrt import convention_sqrt, takes_mkl_sqrt

        if not takes_mkl_sqrt(self.convention):
            return "ieee"
        if not mkl_available():
            convention_sqrt(np.ones(1, _F32), self.convention)  # warns once per process
            return "ieee"
        return "mkl"

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        from refopt.reference.eightbit import adam8bit_update

        self._refuse_sparse(grad)
        r = adam8bit_update(param, grad, self._eightbit_state(slots), step,
                            learning_rate=float(learning_rate), beta_1=self.beta_1,
                            beta_2=self.beta_2, epsilon=self.epsilon, weight_decay=0.0,
                            block_size=_BLOCK_SIZE, sqrt=self._root())
        return r.param, self._new_slots(slots, r.state)

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon, amsgrad=False)
        return config


_ADAM_DOC = r"""{title}

    Per variable ``w`` of at least ``min_8bit_size`` elements, the moments are kept as one
    byte per element, an index into bitsandbytes' 256-value dynamic map (signed for
    :math:`m`, unsigned for :math:`v`), scaled per block of 256 elements by the block's
    absolute maximum; each step dequantizes them, updates, and quantizes them again.
    Smaller variables keep float32 moments (bitsandbytes' 32-bit path). With :math:`t` the
    variable's step, :math:`c_1 = 1-\beta_1^t`, :math:`c_2 = \sqrt{{1-\beta_2^t}}` (float64):

    .. math::

        m &\leftarrow \mathrm{{fma}}(1-\beta_1,\ g,\ \beta_1 m), \qquad
        v \leftarrow \mathrm{{fma}}((1-\beta_2) g,\ g,\ \beta_2 v) \\
        w &\leftarrow w \cdot \mathrm{{f32}}(1 - \eta\lambda) \quad (\lambda > 0) \\
        w &\leftarrow w + \frac{{\mathrm{{f32}}(-\eta/c_1)\, m}}{{\sqrt{{v}}/c_2 + \epsilon}}
        \quad\text{{(8-bit)}}, \qquad
        w \leftarrow \mathrm{{fma}}\Big(-\frac{{\eta c_2}}{{c_1}},\
        \frac{{m}}{{\sqrt{{v}} + \epsilon c_2}},\ w\Big) \quad\text{{(32-bit)}}

    in float32 (every operation rounded as :func:`refopt.reference.eightbit.adam8bit_update`
    documents), then (8-bit) :math:`m, v` are quantized.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 0.001
        bitsandbytes' ``lr``; a Python float, as torch keeps it.
    beta_1, beta_2 : float, default 0.9, 0.999
        bitsandbytes' ``betas``, each in [0, 1).
    epsilon : float, default 1e-8
        bitsandbytes' ``eps``, >= 0.
    weight_decay : float, default {wd}
        Decoupled decay ``w * f32(1 - lr * weight_decay)`` before the update, >= 0; 0 is
        none. {wd_note}Variables given to :meth:`exclude_from_weight_decay` are not decayed.
    amsgrad : bool, default False
        Refused when True, as bitsandbytes refuses it.
    min_8bit_size : int, default 4096
        Variables with fewer elements keep float32 moments (bitsandbytes' rule).
    is_paged : bool, default False
        Refused when True (paging is CUDA memory; bitsandbytes' CPU path ignores it).
{base}

    Raises
    ------
    ValueError
        A convention other than ``"torch"`` (naming both); ``beta_1``/``beta_2`` outside
        [0, 1), a negative or non-finite ``learning_rate``, ``epsilon`` or
        ``weight_decay``; ``amsgrad`` or ``is_paged`` True; ``min_8bit_size`` not an integer
        >= 0; the base class's errors.
    TypeError
        A hyperparameter not a real number or bool; at build (the first step), a variable
        that is not float32; at a step, an :class:`~refopt.IndexedSlices` gradient
        (bitsandbytes has no sparse update). A step that raises changes nothing.

    Notes
    -----
    Slots, per variable ``w`` of ``n`` elements (``n >= min_8bit_size``: 8-bit path):
    ``m``, ``v`` (bitsandbytes' ``state1``, ``state2``): uint8 codes of ``w``'s shape, or
    float32 moments under ``min_8bit_size``; ``m_absmax``, ``v_absmax`` (``absmax1``,
    ``absmax2``): float32 ``(ceil(n / 256),)``, or ``(0,)`` under ``min_8bit_size``.
    :meth:`dequantized_slot` gives the float32 moments. State: 2 bytes per element plus
    8 per block of 256 (about 2.03), against 8 for ``Adam``. Non-finite values as
    bitsandbytes: a NaN moment never sets its block's maximum and is stored as byte 0 (it
    does not spread to the block); an infinite one makes the maximum ``inf``
    (:mod:`refopt.reference.eightbit` gives the rules).

    Conventions: ``"torch"`` only (or a Convention derived from it), whose knobs act as in
    ``torch.optim``: ``sqrt="mkl"`` takes MKL's vector square root as torch's CPU
    ``torch.sqrt`` (bit for bit with bitsandbytes; ``"ieee"``: the correctly rounded one,
    about 1 ulp off on some elements), per-variable step counts, clipping as
    ``torch.nn.utils.clip_grad_norm_``. The block size is bitsandbytes' fixed 256;
    bitsandbytes' ``optim_bits``, ``args`` (``max_unorm``, ``skip_zeros``,
    ``percentile_clipping``) and per-parameter overrides are not reproduced. Variables
    must be float32 and gradients dense.

    Backends: the update has no rule, so ``backend="cpu"`` computes it with the
    reference's functions (the staged step) and ``backend="cuda"`` on host copies of the
    state (one ``HostStepWarning``): the same bits everywhere.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones(5000, np.float32)
    >>> opt = refopt.{cls}(learning_rate=1e-3)
    >>> opt.apply_gradients([(np.full(5000, 0.5, np.float32), w)])
    1
    >>> opt.get_slot(w, "m").dtype, opt.get_slot(w, "m_absmax").shape
    (dtype('uint8'), (20,))
    """


class Adam8bit(_Adam8bitBase):
    __doc__ = _ADAM_DOC.format(
        title="bitsandbytes' ``Adam8bit``: Adam with blockwise 8-bit moments (CPU numerics).",
        wd="0", wd_note="", base=_BASE_DOC, cls="Adam8bit")

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.0, amsgrad=False, min_8bit_size=4096, is_paged=False,
                 name="Adam8bit", convention="torch", **kwargs):
        super().__init__(learning_rate, beta_1, beta_2, epsilon, weight_decay, amsgrad,
                         min_8bit_size, is_paged, name, convention, kwargs)


class AdamW8bit(_Adam8bitBase):
    __doc__ = _ADAM_DOC.format(
        title="bitsandbytes' ``AdamW8bit``: ``Adam8bit`` with a default decay of 0.01.",
        wd="0.01",
        wd_note="(bitsandbytes' ``AdamW8bit`` is its ``Adam8bit`` with this default: the "
                "same kernel.)\n        ",
        base=_BASE_DOC, cls="AdamW8bit")

    def __init__(self, learning_rate=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=1e-2, amsgrad=False, min_8bit_size=4096, is_paged=False,
                 name="AdamW8bit", convention="torch", **kwargs):
        super().__init__(learning_rate, beta_1, beta_2, epsilon, weight_decay, amsgrad,
                         min_8bit_size, is_paged, name, convention, kwargs)


class Lion8bit(_EightBit):
    r"""bitsandbytes' ``Lion8bit``: Lion with a blockwise 8-bit momentum (CPU numerics).

    Per variable ``w`` of at least ``min_8bit_size`` elements, the momentum is kept as one
    byte per element (bitsandbytes' signed dynamic map, scaled per block of 256 by the
    block's absolute maximum); smaller variables keep a float32 one. In float32:

    .. math::

        w &\leftarrow w \cdot \mathrm{f32}(1 - \eta\lambda) \quad (\lambda > 0) \\
        w &\leftarrow \mathrm{fma}\big(-\eta,\ \mathrm{sign}(\beta_1 m + (1-\beta_1) g),\
        w\big) \\
        m &\leftarrow \mathrm{fma}(1-\beta_2,\ g,\ \beta_2 m)

    (the sign's argument: two rounded products added on the 8-bit path, one fma on the
    32-bit path; :func:`refopt.reference.eightbit.lion8bit_update`), then ``m`` is
    quantized on the 8-bit path. The sign is torch's, 0 for NaN: a weight whose argument is
    NaN keeps its (decayed) value, on both paths.

    Parameters
    ----------
    learning_rate : float or refopt.schedules.LearningRateSchedule, default 1e-4
        bitsandbytes' ``lr``.
    beta_1, beta_2 : float, default 0.9, 0.99
        bitsandbytes' ``betas``, each in [0, 1).
    weight_decay : float, default 0
        Decoupled decay ``w * f32(1 - lr * weight_decay)`` before the update, >= 0; 0 is
        none. Variables given to :meth:`exclude_from_weight_decay` are not decayed.
    min_8bit_size : int, default 4096
        Variables with fewer elements keep a float32 momentum.
    is_paged : bool, default False
        Refused when True.
    {base}

    Raises
    ------
    ValueError
        A convention other than ``"torch"``; ``beta_1``/``beta_2`` outside [0, 1); a
        negative or non-finite ``learning_rate`` or ``weight_decay``; ``is_paged`` True;
        ``min_8bit_size`` not an integer >= 0; the base class's errors.
    TypeError
        As :class:`Adam8bit` (non-float32 variables, sparse gradients).

    Notes
    -----
    Slots: ``m`` (bitsandbytes' ``state1``: uint8 codes of the variable's shape, or float32
    under ``min_8bit_size``) and ``m_absmax`` (``absmax1``: float32 ``(ceil(n / 256),)``,
    or ``(0,)``): about 1.03 bytes per element against 4 for ``Lion``. No square root:
    bit-identical to bitsandbytes under any ``sqrt`` knob. Conventions, backends and what
    is not reproduced: as :class:`Adam8bit`.

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.ones(5000, np.float32)
    >>> opt = refopt.Lion8bit(learning_rate=1e-3)
    >>> opt.apply_gradients([(np.full(5000, 0.5, np.float32), w)])
    1
    >>> float(w[0]), opt.slot_names
    (0.9990000128746033, ('m', 'm_absmax'))
    """

    _moments = ("m",)
    slot_variables = ("m", "m_absmax")

    def __init__(self, learning_rate=1e-4, beta_1=0.9, beta_2=0.99, weight_decay=0.0,
                 min_8bit_size=4096, is_paged=False, name="Lion8bit", convention="torch",
                 **kwargs):
        super().__init__(learning_rate, beta_1, beta_2, weight_decay, min_8bit_size, is_paged,
                         name, convention, kwargs)

    def _update_step(self, param, grad, slots, learning_rate, step, weight_decay=None,
                     lazy_rows=False):
        from refopt.reference.eightbit import lion8bit_update

        self._refuse_sparse(grad)
        r = lion8bit_update(param, grad, self._eightbit_state(slots), step,
                            learning_rate=float(learning_rate), beta_1=self.beta_1,
                            beta_2=self.beta_2, weight_decay=0.0, block_size=_BLOCK_SIZE)
        return r.param, self._new_slots(slots, r.state)


Lion8bit.__doc__ = Lion8bit.__doc__.replace("    {base}\n", _BASE_DOC + "\n")
