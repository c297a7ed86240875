"""Rules: each update defined once, as numbers, for the fast paths.

A *rule* is the arithmetic of one optimizer's update on **one element**, written with the
target operations of :mod:`refopt.rules.ops` (never the bare operators), so that the same
Python source compiles to the CPU (Numba ``@njit``), to CUDA (numba-cuda device function,
explicitly rounded, never contracted) and runs as plain Python (the simulator)::

    def element(p, g, s_0, ..., s_k, sc, fl, tail):
        ...
        return p, s_0, ..., s_k

- ``p``, ``g``: the parameter and its gradient (already clipped, weight-decayed as the
  convention says: that is the pipeline's work, see :mod:`refopt.rules.steps`); in a
  whole-table sparse step (the drivers' ``table`` kernels) ``g`` is ``None`` for the
  elements of rows without a gradient, so only a rule written for it runs there (e.g.
  :data:`refopt.rules.adam.ADAM_TABLE`: ``if g is not None:`` folds away when compiled);
- ``s_0 .. s_k``: the optimizer's slots, in the order of :attr:`Rule.slots` (none at all
  for the pipeline's steps run alone, :data:`refopt.rules.steps.CLIP` & co.: ``(p,)``);
- ``sc``: a small array of scalars in the variable dtype, rounded on the host as the
  framework rounds them (learning rate, ``1 - beta``, bias corrections...);
- ``fl``: a small int64 array of flags (AMSGrad, Nesterov, the convention's form);
- ``tail``: whether the element lies in the last ``numel % lanes`` elements of its tensor
  (PyTorch's vectorised kernels treat that scalar tail differently; ``lanes`` is
  :attr:`RuleCall.tail_lanes`, 0 for none).

The generic multi-tensor drivers (:mod:`refopt.kernels.cpu.drivers`,
:mod:`refopt.kernels.cuda.drivers`) build every kernel from a rule: they add clipping,
weight decay and the EMA (the pipeline's element steps) around it, loop over every tensor
of a dtype group, and over the unique rows of a sparse gradient. Adding an optimizer adds a
rule; no driver changes.

Per-tensor sums (norm clipping's sums of squares) are the second kind of rule: a
:class:`refopt.rules.reduce.Reduction`, an element map summed in a named order of addition
(NumPy's or PyTorch's), from which the drivers build their ``reduce`` kernels.

Phased updates (element rule -> per-tensor sums -> element rule). An update whose elements
need sums over their whole tensor (Lamb's trust ratio ``||w||/||u||``; Adafactor's row,
column and RMS means) is written as several ordinary rules and the sums between them, in a
module-level ``pure_update(apply, ...)`` of its rule module (:func:`refopt.rules.lamb.
pure_update`): phase 1 is a rule that returns its intermediate (Lamb's direction ``u``) in
the parameter's place, together with the slots; the sums are taken on the host from that
intermediate and the variable, in the framework's order (by default the reference's own
reduction functions, so the bits are the reference's whatever order the framework uses; a
backend passes ``sums=`` with compiled twins doing the same operations in the same order:
the CPU's are :mod:`refopt.kernels.cpu._reduce_seq`, tested bit for bit against the
reference's), and turned
into the next phase's scalars rounded as the framework rounds them; phase 2 is a slot-less
rule given the intermediate in the gradient's place and those scalars. A per-row or
per-column value (Adafactor's factors) reaches an element phase as a slot broadcast to the
variable's shape. ``apply`` is a
backend's one-tensor rule driver (:func:`refopt.kernels.cpu.drivers.apply`,
:func:`refopt.kernels.cuda.drivers.apply`), so a phased update runs on every target with no
driver edited; the backends' pure functions (``refopt.kernels.cpu.lamb_update``,
``refopt.kernels.cuda.lamb_update``) are it. The optimizers' ``backend="cpu"`` steps call
the CPU ones per tensor through the staged step; ``backend="cuda"`` takes the CUDA
executor's host step for them (the fused multi-tensor kernels take single-phase rules only). Lamb
(:mod:`refopt.rules.lamb`) and Adafactor (:mod:`refopt.rules.adafactor`, whose factored
moments, one row or column of numbers, are updated on the host with the means) are phased.

The readable NumPy reference (:mod:`refopt.reference`) is a separate implementation of the
same updates; the property tests compare the two bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

__all__ = ["Root", "Rule", "RuleCall"]


@dataclass(frozen=True)
class Root:
    """Where a rule's one square root sits, so that a backend can take it from a vector
    library (MKL's ``vmsSqrt``, the root of PyTorch's for-loop optimizers on the CPU, which no
    scalar instruction reproduces).

    The rule's element must compute ``sqrt`` once, of the new value of slot ``slot``, and
    then its parameter by ``finish``; it is written as ``finish(p, g, *new_slots,
    sqrt(new_slots[slot]), sc, fl, tail)``, so the arithmetic is defined once. A backend
    then runs the element for the new slots, the vector root of that slot's new values, and
    ``finish`` with them (the CPU's ``rows_root`` kernel).

    Parameters
    ----------
    slot : int
        The index, in :attr:`Rule.slots`, of the slot whose new value is the root's argument.
    finish : callable
        ``finish(p, g, s_0, ..., s_k, root, sc, fl, tail) -> p``, a module-level function of
        the rule's module, written with :mod:`refopt.rules.ops`; ``s_i`` are the new slots.
    forms : tuple of int
        The values of flag 0 (the rule's form) for which the element is written so; for the
        others the element is not split (and the backend takes its host step).
    """

    slot: int
    finish: Callable
    forms: tuple


@dataclass(frozen=True)
class Rule:
    """One update, defined once for every fast target.

    Parameters
    ----------
    name : str
        A short name (kernel names, reports).
    element : callable
        ``element(p, g, *slots, sc, fl, tail) -> (p, *slots)``, a module-level function
        written with :mod:`refopt.rules.ops` (see the module docstring).
    slots : tuple of str
        The slot names the element takes and returns, in order.
    targets : tuple of str, default ("cpu", "cuda")
        The fused backends that may run it: a rule using an op only one target has (the
        CPU's ``cpow``, the C library's ``powf``) names that one; on the others the executor
        takes its host step.
    root : Root or None
        Where its square root sits, when a convention may take it from MKL (see
        :class:`Root`).
    """

    name: str
    element: Callable
    slots: tuple
    targets: tuple = ("cpu", "cuda")
    root: Root = None

    @property
    def arity(self):
        """The number of slots."""
        return len(self.slots)


@dataclass
class RuleCall:
    """A rule with the scalars and flags of one step for one dtype (what the drivers run).

    Parameters
    ----------
    rule : Rule
    sc : ndarray of the variables' dtype, shape (k,)
        The rule's scalars (at least one entry).
    fl : ndarray of int64, shape (j,)
        The rule's flags (at least one entry).
    tail_lanes : int
        Elements ``i >= numel - numel % tail_lanes`` of a tensor get ``tail=True``.
    """

    rule: Rule
    sc: np.ndarray
    fl: np.ndarray
    tail_lanes: int = 0
    extra: dict = field(default_factory=dict)


#: The drivers hand a rule 16 scalars and 8 flags (the arrays are padded with zeros).
N_SCALARS, N_FLAGS = 16, 8


def scalars(dtype, values):
    """An array of ``N_SCALARS`` entries of ``dtype`` from already-rounded scalars."""
    values = list(values)
    if len(values) > N_SCALARS:
        raise ValueError(f"A rule takes at most {N_SCALARS} scalars. Received {len(values)}")
    values += [0] * (N_SCALARS - len(values))
    with np.errstate(all="ignore"):
        return np.array([np.dtype(dtype).type(v) for v in values], dtype=dtype)


def flags(values):
    """An int64 array of ``N_FLAGS`` flags."""
    values = [int(v) for v in values]
    if len(values) > N_FLAGS:
        raise ValueError(f"A rule takes at most {N_FLAGS} flags. Received {len(values)}")
    values += [0] * (N_FLAGS - len(values))
    return np.array(values, np.int64)
