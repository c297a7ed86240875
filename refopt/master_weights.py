"""Master weights: float32 copies of float16/bfloat16 variables, updated by any optimizer.

``MasterWeights(optimizer)`` keeps a float32 *master* copy of every float16 or bfloat16
variable; each step the wrapped optimizer updates the masters (its slots are float32, its
arithmetic that of float32 variables under its convention, on its backend's fast path) and
each low-precision variable receives its master rounded once: to nearest, ties to even, or,
with ``stochastic_rounding=True``, stochastically with counter-based random bits
(:func:`refopt.precision.random_bits`: the same seed gives the same bits on every backend and
in every run). float32 and float64 variables are updated directly.

This is the recipe of Keras 3's mixed-precision policies (``mixed_float16``,
``mixed_bfloat16``: float32 variables, the optimizer never sees float16 state), of PyTorch's
AMP recipes (a float32 model under ``autocast``) and of apex's ``master_weights=True``, where
the low-precision copy is what the forward pass reads.
"""

from __future__ import annotations

import numbers

import numpy as np

from refopt import precision as _precision
from refopt.executors.checks import check_host_variable, describe, unpack_pairs
from refopt.indexed_slices import IndexedSlices
from refopt.optimizers.base import Optimizer, check_bool

__all__ = ["MasterWeights"]

_F32 = np.dtype(np.float32)


class MasterWeights:
    """Keep float32 master weights for the float16/bfloat16 variables of ``optimizer``.

    Parameters
    ----------
    optimizer : refopt.Optimizer
        The optimizer that updates the masters (any class, convention and host backend,
        ``"reference"`` or ``"cpu"``), not yet built.
    stochastic_rounding : bool, default False
        Round each new master to the variable's dtype stochastically
        (:func:`refopt.precision.stochastic_round`) instead of to nearest even.
    seed : int, default 0
        The seed of the stochastic rounding, in ``[0, 2**64)``. Element ``i`` of the variable
        at build position ``k`` after step ``t`` (``iterations``, 1 on the first step) draws
        ``random_bits(seed, t, k, size)[i]``.

    Attributes
    ----------
    inner_optimizer : refopt.Optimizer
        The wrapped optimizer (its variables are the masters).

    Raises
    ------
    TypeError
        ``optimizer`` is not a refopt optimizer, ``stochastic_rounding`` not a bool, ``seed``
        not an int.
    ValueError
        ``optimizer`` already built or on ``backend="cuda"``; ``seed`` out of range.

    Notes
    -----
    Gradients come in the variable's dtype or in float32 and are converted exactly to float32.
    A step that raises changes nothing (the inner optimizer's rule; the rounding runs after
    it and cannot fail). Only the variables whose master moved are rewritten (those that had
    a gradient, and every one on a step where the inner EMA overwrites the variables; with
    stochastic rounding, exactly those whose master changed, so a step a
    ``LossScaleOptimizer`` skips rewrites none); use :meth:`sync` after changing masters by
    hand. ``state_dict`` holds the inner optimizer's
    state plus the masters; :func:`refopt.save_checkpoint` and
    :func:`refopt.load_checkpoint` take a ``MasterWeights`` as they take an optimizer (a
    resumed run is bit-identical, stochastic rounding included).

    Examples
    --------
    >>> import numpy as np, refopt
    >>> w = np.array([1.0, -2.0], np.float16)
    >>> opt = refopt.MasterWeights(refopt.SGD(learning_rate=1e-4))
    >>> for _ in range(4):
    ...     _ = opt.apply_gradients([(np.float16([1.0, 1.0]), w)])
    >>> w, opt.get_master(w)   # float16 alone stays at [1, -2]: 1e-4 is under half an ulp
    (array([ 0.9995, -2.    ], dtype=float16), array([ 0.99959993, -2.0003996 ], dtype=float32))
    """

    def __init__(self, optimizer, *, stochastic_rounding=False, seed=0):
        if not isinstance(optimizer, Optimizer):
            raise TypeError("`optimizer` must be a refopt optimizer. Received: "
                            f"{type(optimizer).__name__}")
        if optimizer.built:
            raise ValueError("`optimizer` must not be built yet: MasterWeights builds it with "
                             "the float32 masters.")
        if optimizer.backend == "cuda":
            raise ValueError("MasterWeights keeps host masters: `optimizer` must have "
                             "backend='reference' or 'cpu'. Received: backend='cuda'")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"`seed` must be an int. Received: seed={seed!r}")
        if not 0 <= int(seed) < 2**64:
            raise ValueError(f"`seed` must be in [0, 2**64). Received: seed={seed!r}")
        self.inner_optimizer = optimizer
        self.stochastic_rounding = check_bool("stochastic_rounding", stochastic_rounding)
        self.seed = int(seed)
        self._vars = []        # build order
        self._masters = []     # float32 copies (or the variable itself when not low)
        self._index = {}
        self._written = []     # per variable: the step of its last write (0: never)

    # ----------------------------------------------------------------- state
    @property
    def built(self):
        return bool(self._vars)

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    def get_master(self, variable):
        """The float32 master of ``variable`` (a live array; the variable itself when it is
        float32 or float64). ``KeyError`` for a variable this optimizer was not built with."""
        return self._masters[self._position(variable)]

    def get_slot(self, variable, slot_name):
        """The inner optimizer's slot of ``variable``'s master (float32 for low precision)."""
        return self.inner_optimizer.get_slot(self.get_master(variable), slot_name)

    def _position(self, variable):
        k = self._index.get(id(variable))
        if k is None:
            raise KeyError(f"Unknown variable ({describe(variable)}): this optimizer was built "
                           "with other variables.")
        return k

    def build(self, var_list):
        """Create the masters (exact float32 copies) and build the inner optimizer on them.

        Raises
        ------
        TypeError, ValueError
            A variable that is not a valid host array, or listed twice; nothing is built.
        """
        if self.built:
            return
        var_list = list(var_list)
        for i, v in enumerate(var_list):
            check_host_variable(v, f"var_list[{i}]")
        masters = [v.astype(_F32) if _precision.is_low_precision(v.dtype) else v
                   for v in var_list]
        self.inner_optimizer.build(masters)  # raises on duplicates, nothing kept
        self._vars, self._masters = var_list, masters
        self._index = {id(v): k for k, v in enumerate(var_list)}
        self._written = [0] * len(var_list)

    # ----------------------------------------------------------------- step
    def apply_gradients(self, grads_and_vars):
        """One step: the inner optimizer on the masters, then each updated low-precision
        variable set to its rounded master. Returns the inner ``iterations``.

        Raises
        ------
        TypeError
            A gradient of another dtype than its variable (float32 accepted), or not an
            ndarray/IndexedSlices/None.
        KeyError
            A variable this optimizer was not built with.
        Others
            As the inner optimizer's :meth:`~refopt.Optimizer.apply_gradients`; nothing
            changes then.
        """
        pairs = unpack_pairs(grads_and_vars)
        building = not self.built
        if building:
            self.build([v for _, v in pairs])
        inner = self.inner_optimizer
        before = inner.iterations
        freq = inner.ema_overwrite_frequency if inner.use_ema else None
        overwrite = bool(freq) and (before + 1) % freq == 0  # EMA into every variable
        lows = [k for k, v in enumerate(self._vars) if _precision.is_low_precision(v.dtype)]
        # stochastic rounding draws new bits every step: rewrite only the masters that moved
        # (a step skipped by a LossScaleOptimizer changes none); to nearest, rewriting an
        # unchanged master gives the same value
        saved = ({k: self._masters[k].copy() for k in lows} if self.stochastic_rounding
                 else None)
        try:
            mapped, touched = [], []
            for i, (g, v) in enumerate(pairs):
                k = self._position(v)
                low = _precision.is_low_precision(v.dtype)
                if low and isinstance(g, (IndexedSlices, np.ndarray)):
                    if g.dtype not in (v.dtype, _F32):
                        raise TypeError(
                            f"Gradient at position {i} has dtype={g.dtype}; its variable "
                            f"is {v.dtype}: pass it in {v.dtype} or float32.")
                    g = _precision.upcast(g)  # others: the inner optimizer's error
                    touched.append(k)
                mapped.append((g, self._masters[k]))
            it = self.inner_optimizer.apply_gradients(mapped)
        except BaseException:
            if building:  # as the inner optimizer: a raising first call builds nothing
                self._vars, self._masters, self._index, self._written = [], [], {}, []
                self.inner_optimizer._reset_state()
            raise
        if saved is not None:
            touched = [k for k in lows if not np.array_equal(
                saved[k].view(np.uint32), self._masters[k].view(np.uint32))]
        elif overwrite and it == before + 1:
            touched = lows
        for k in touched:
            self._write(k, it)
        return it

    def sync(self):
        """Write every low-precision variable from its master (rounded as configured, with
        the current ``iterations`` as the stochastic rounding's step)."""
        for k, v in enumerate(self._vars):
            if _precision.is_low_precision(v.dtype):
                self._write(k, self.iterations)

    def _write(self, k, step):
        self._written[k] = int(step)
        var, master = self._vars[k], self._masters[k]
        if self.stochastic_rounding:
            bits = _precision.random_bits(self.seed, int(step), k, master.size)
            new = _precision.stochastic_round(master, var.dtype, bits)
        else:
            new = _precision.round_to(master, var.dtype)
        np.copyto(var, new)

    # ----------------------------------------------------------------- serialization
    def get_config(self):
        """``{"optimizer": {"class_name", "config"}, "stochastic_rounding", "seed"}``: the
        wrapped optimizer's config and this wrapper's options (no state)."""
        return {"optimizer": {"class_name": type(self.inner_optimizer).__name__,
                              "config": self.inner_optimizer.get_config()},
                "stochastic_rounding": self.stochastic_rounding, "seed": self.seed}

    def state_dict(self):
        """The inner optimizer's ``state_dict`` plus ``"masters"``: the float32 masters of the
        low-precision variables (``None`` for the others), in build order (copies)."""
        sd = self.inner_optimizer.state_dict()
        sd["masters"] = [m.copy() if m is not v else None
                         for v, m in zip(self._vars, self._masters)]
        return sd

    def load_state_dict(self, state_dict, var_list=None):
        """Restore :meth:`state_dict` (all or nothing): the masters, then the inner state.

        Raises
        ------
        TypeError, ValueError
            As :meth:`refopt.Optimizer.load_state_dict`; ``"masters"`` missing, of another
            length, shape or dtype than the variables' float32 masters.
        """
        if not isinstance(state_dict, dict) or "masters" not in state_dict:
            raise ValueError("`state_dict` must be what MasterWeights.state_dict() returns "
                             "(with a 'masters' entry).")
        if not self.built:
            if var_list is None:
                raise ValueError("Pass `var_list` (the variables, in build order) to load "
                                 "into an optimizer that is not built.")
            self.build(var_list)
        saved = list(state_dict["masters"])
        if len(saved) != len(self._vars):
            raise ValueError(f"`state_dict` has {len(saved)} masters; this optimizer has "
                             f"{len(self._vars)} variables.")
        values = []
        for k, (v, m, s) in enumerate(zip(self._vars, self._masters, saved)):
            if m is v:
                if s is not None:
                    raise ValueError(f"masters[{k}] must be None ({v.dtype} variable).")
                continue
            s = np.asarray(s)
            if s.shape != m.shape or s.dtype != _F32:
                raise ValueError(f"masters[{k}] must be float32 of shape {m.shape}. Received: "
                                 f"{s.dtype} of shape {s.shape}")
            values.append((m, s))
        inner = {key: val for key, val in state_dict.items() if key != "masters"}
        self.inner_optimizer.load_state_dict(inner, var_list=self._masters)
        for m, s in values:
            np.copyto(m, s)
