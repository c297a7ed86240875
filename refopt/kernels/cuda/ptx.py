"""Compile every CUDA kernel to PTX without a GPU and audit what the compiler made of it.

The simulator runs the kernels as Python, so it can neither catch a kernel numba cannot type
or lower for a device, nor see what NVVM does to the arithmetic. This module asks numba-cuda
and NVVM (no driver, no GPU: ``cuda.compile_ptx`` with an explicit compute capability) for
the PTX of the kernels the rule drivers (:mod:`refopt.kernels.cuda.drivers`, which build
every CUDA kernel of refopt) build for every form the optimizers and the launchers use
(:func:`rule_variants`: Adam, AMSGrad, AdamW, the lazy row rules and SGD of every convention
preset, with their decay and EMA modes; tf-keras' whole-table sparse rules; the pipeline's
clip, decay and EMA steps as rules; all of them at the first compute capability, one per
form at the others) and of the reductions' kernels (:func:`reduction_kernels`: the sums of
squares of norm clipping, NumPy's pairwise leaves and PyTorch's lanes), with the argument
types the drivers' launchers pass, in float16, float32 and float64, and checks:

- **no contraction**: no ``fma`` and no float ``mul`` without an explicit rounding modifier
  (ptxas may fuse a plain ``mul.f32`` with a following add), so each multiply and add rounds
  on its own as in the reference. This holds for the rules that *do* round ``a * b + c``
  once (PyTorch's and XLA's forms): :func:`refopt.rules.ops.fma` emits no ``fma``
  instruction (float32 through float64 ``mul.rn`` + ``add.rn``, float64 by an error-free
  transformation);
- **IEEE operations**: no ``.approx`` and no ``.ftz`` instruction (the default options give
  ``div.rn`` and ``sqrt.rn``; ``fastmath`` would not);
- **the parameter block**: a multi-tensor launch of ``config.TENSORS_PER_LAUNCH`` tensors
  fits CUDA's classic 4 KiB of kernel parameters (4096 bytes, the limit before CUDA 12.1).

At the first compute capability it also compiles the low-precision ``dense`` kernels
(:func:`low_precision_kernels`: float16/bfloat16 variables computed in float32, their bits
converted with integer operations and ``mul.rn``/``add.rn``), reported with the dtype labels
``"float16 bits"`` and ``"bfloat16 bits"``.

It also compiles a *control* kernel written with plain operators, ``out[i] = a[i] * b[i] +
c[i]``, and reports whether NVVM contracted it: if it did (float32 and float64), contraction
is on in this toolchain and the audit above is not vacuous. (numba-cuda lowers plain float16
arithmetic through function calls that are not contracted; the float16 kernels do not use it
anyway: they compute in float32.)

Run it as ``python -m refopt.kernels.cuda.ptx`` (``--json`` for a machine-readable report,
``--cc 8.0 --cc 9.0`` for the targets; default 8.0, 9.0 and 10.0; on a GPU, ``--device``
audits what a launch compiles, after link-time optimisation: :func:`compile_on_device`). It needs numba-cuda
(``pip install 'refopt[cuda]'``), libNVVM and NVRTC (a CUDA toolkit, or
``pip install 'numba-cuda[cu13]'``), and ``NUMBA_ENABLE_CUDASIM`` unset or ``0``. Exit status:
0 when every kernel passes, 1 when one fails, 2 when the simulator is on or the toolchain, a
target or a kernel's compilation fails (the message says which).

Device-less compilation: numba-cuda asks the current device for its compute capability when
it compiles a device function called by a kernel; while this module compiles, that query is
answered with the requested ``cc`` (:func:`_device_stand_in`). Nothing runs on a device.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field

import numpy as np

#: CUDA's classic limit on a kernel's parameters, in bytes.
PARAM_LIMIT = 4096

#: The compute capabilities compiled by default: A100 (8.0), H100/H200 (9.0), B200 (10.0).
DEFAULT_CCS = ((8, 0), (9, 0), (10, 0))

_INSTR = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9]*(?:\.[a-z0-9]+)*)\s")


@dataclass
class KernelPTX:
    """The PTX of one kernel for one dtype and compute capability, and its audit.

    Attributes
    ----------
    name : str
        ``"rule <kernel>: <variant>"``, ``"reduce <kernel>: <reduction>"`` or ``"control"``.
    dtype : str
        ``"float16"``, ``"float32"`` or ``"float64"``.
    cc : tuple of int
        The compute capability asked for.
    target : str
        The PTX ``.target`` numba-cuda compiled for (``"sm_90"``; numba-cuda clamps a
        capability newer than its NVVM supports to the newest it knows).
    param_bytes : int
        Size of the kernel's parameter block (with alignment), in bytes.
    float_ops : dict of str to int
        Count of each float arithmetic instruction (``mul.rn.f32``, ``fma.rn.f64``, ...), and
        of any instruction with an ``.approx`` or ``.ftz`` modifier.
    problems : list of str
        What the audit found (empty: the kernel passes).
    """

    name: str
    dtype: str
    cc: tuple
    target: str
    param_bytes: int
    float_ops: dict
    problems: list = field(default_factory=list)

    def as_dict(self):
        return {"name": self.name, "dtype": self.dtype, "cc": ".".join(map(str, self.cc)),
                "target": self.target, "param_bytes": self.param_bytes, "float_ops": self.float_ops,
                "problems": self.problems}


def float_ops(ptx):
    """Count the float arithmetic instructions of a PTX text.

    Parameters
    ----------
    ptx : str

    Returns
    -------
    dict of str to int
        Instruction (with its modifiers, e.g. ``"add.rn.f32"``) to count, for ``add``,
        ``sub``, ``mul``, ``fma``, ``mad``, ``div``, ``sqrt``, ``rcp`` and ``rsqrt`` on
        ``f16``/``f16x2``/``bf16``/``bf16x2``/``f32``/``f64``.
    """
    counts = collections.Counter()
    for ins in _instructions(ptx):
        parts = ins.split(".")
        if parts[0] in ("add", "sub", "mul", "fma", "mad", "div", "sqrt", "rcp", "rsqrt") \
                and parts[-1] in ("f16", "f16x2", "bf16", "bf16x2", "f32", "f64"):
            counts[ins] += 1
    return dict(sorted(counts.items()))


def _instructions(ptx):
    """The opcode (with its modifiers) of every instruction line of a PTX text."""
    for line in ptx.splitlines():
        m = _INSTR.match(line)
        if m:
            yield m.group(1)


def approximations(ptx):
    """Count the instructions of any kind with an ``.approx`` or ``.ftz`` modifier.

    Parameters
    ----------
    ptx : str

    Returns
    -------
    dict of str to int
        E.g. ``{"ex2.approx.ftz.f32": 2}``; empty when there is none.
    """
    counts = collections.Counter(ins for ins in _instructions(ptx)
                                 if {"approx", "ftz"} & set(ins.split(".")))
    return dict(sorted(counts.items()))


def audit_ops(ops):
    """The contraction and approximation problems in ``float_ops`` counts (empty: none).

    Parameters
    ----------
    ops : dict of str to int
        As returned by :func:`float_ops`.

    Returns
    -------
    list of str
    """
    problems = []
    for ins, n in ops.items():
        parts = ins.split(".")
        if parts[0] in ("fma", "mad"):
            problems.append(f"{n} x {ins}: a multiply and an add fused (one rounding)")
        elif parts[0] == "mul" and not any(p in ("rn", "rz", "rm", "rp") for p in parts):
            problems.append(f"{n} x {ins}: a multiply without a rounding modifier "
                            "(ptxas may fuse it with an add)")
        if "approx" in parts:
            problems.append(f"{n} x {ins}: approximate, not IEEE round-to-nearest")
        if "ftz" in parts:
            problems.append(f"{n} x {ins}: flushes subnormals to zero")
    return problems


def param_bytes(ptx):
    """Size in bytes of the parameter block of the (one) ``.entry`` in ``ptx``.

    Each ``.param`` is placed at the next multiple of its alignment (its size for the scalar
    types, ``.align N`` for byte arrays), as CUDA lays out kernel parameters. A pointer
    attribute (``.param .u64 .ptr .align 1 p``, emitted for sm_100 and newer) qualifies the
    memory pointed to and does not change the parameter's size.

    Parameters
    ----------
    ptx : str

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``ptx`` has no ``.entry`` or a parameter declaration it cannot read.
    """
    m = re.search(r"\.entry\s+\S+\s*\((.*?)\)", ptx, re.S)
    if not m:
        raise ValueError("ptx has no .entry (kernel) declaration")
    sizes = {"8": 1, "16": 2, "32": 4, "64": 8}
    offset = 0
    for decl in m.group(1).split(","):
        decl = decl.strip()
        if not decl:
            continue
        arr = re.match(r"\.param\s+\.align\s+(\d+)\s+\.b8\s+\S+\[(\d+)\]", decl)
        if arr:
            align, size = int(arr.group(1)), int(arr.group(2))
        else:
            # A pointer attribute (".ptr [.space] .align N", sm_100 and newer) describes the
            # memory pointed to; the parameter itself keeps its type's size and alignment.
            sc = re.match(r"\.param\s+\.[a-z](\d+)(?:\s+\.ptr(?:\s+\.(?:global|const|local|"
                          r"shared))?(?:\s+\.align\s+\d+)?)?\s+\S+$", decl)
            if not sc:
                raise ValueError(f"Cannot read the parameter declaration {decl!r}")
            align = size = sizes[sc.group(1)]
        offset = -(-offset // align) * align + size
    return offset


def rule_kernel_signatures(dtype, width, arity):
    """The numba argument types of the rule drivers' kernels (:mod:`refopt.kernels.cuda.drivers`)
    for a rule of ``arity`` slots, as :func:`~refopt.kernels.cuda.drivers.launch_dense`,
    :func:`~refopt.kernels.cuda.drivers.launch_rows`,
    :func:`~refopt.kernels.cuda.drivers.launch_table` and
    :func:`~refopt.kernels.cuda.drivers.sums_of_squares` pass them: C-contiguous 1-d arrays
    of ``dtype`` (2-d for the sparse kernels' ``(rows, width)`` tables), int64 tables, the
    pipeline's 8 and the rule's 16 scalars as tuples of ``dtype`` scalars, the clip pairs a
    ``(tensors, 2)`` array, Python ``int`` (int64) and ``bool``, tuples of ``width`` arrays
    (``Segments.tuples`` pads to ``config.TENSORS_PER_LAUNCH``), the leaf sums of float16 in
    float32, a reduction's scalars as a tuple of ``N_REDUCE_SCALARS`` ``dtype`` scalars. ``tests/test_cuda_ptx.py`` checks this table against the arguments of real
    launches on the simulator.

    Returns
    -------
    dict of str to tuple of numba types
        ``"dense"``, ``"rows"``, ``"table"`` (a rule's kernels), ``"leaf_sums"`` and
        ``"lane_sums"`` (a reduction's, :func:`~refopt.kernels.cuda.drivers.reduce_kernels`).
    """
    from numba import typeof, types

    dtype = np.dtype(dtype)
    acc = np.dtype(np.float32) if dtype == np.dtype(np.float16) else dtype
    a1 = typeof(np.zeros(2, dtype))
    a2 = typeof(np.zeros((2, 2), dtype))
    i1 = typeof(np.zeros(2, np.int64))
    i2 = typeof(np.zeros((2, 2), np.int64))
    s = typeof(dtype.type(1))
    n = typeof(1)
    b = typeof(True)
    tup = types.UniTuple(a1, width)
    psc = types.UniTuple(s, 8)
    sc = types.UniTuple(s, 16)
    from refopt.rules.reduce import N_REDUCE_SCALARS

    rsc = types.UniTuple(s, N_REDUCE_SCALARS)
    return {
        "dense": (tup, tup, i2, a2, n) + (a1,) * arity + (a1, b, psc, sc),
        "rows": (a2,) + (a2,) * arity + (a2, i1, i1, i1, n, s, s, n, psc, sc, s),
        "table": (a2,) + (a2,) * arity + (a2, i1, i1, i1, n, s, s, n, psc, sc, s),
        "leaf_sums": (tup, i1, i1, i1, typeof(np.zeros(2, acc)), rsc, typeof(acc.type(0))),
        "lane_sums": (tup, a2, rsc, s),
    }


def rule_variants(dtype=np.float32, rmsprop=False):
    """The rule kernels the optimizers and the launchers build, one per distinct ``(rule,
    flags, decay mode, EMA mode, kernel)``, gathered from real optimizers of every convention
    preset: Adam, AMSGrad, AdamW, Adam with its convention's weight decay, with the EMA where
    the convention has one; LazyAdam's row rule (SparseAdam for torch); SGD with momentum,
    Nesterov, PyTorch's momentum 0; tf-keras' whole-table sparse Adam, AMSGrad and SGD
    (:func:`refopt.kernels.cuda.adam_sparse`, :func:`~refopt.kernels.cuda.sgd_sparse`), with
    and without Keras' decay; the pipeline's steps as rules (clip by value, by norm, by the
    global scale, decay, EMA: the launchers :func:`~refopt.kernels.cuda.clip_dense`,
    :func:`~refopt.kernels.cuda.decay_dense`, :func:`~refopt.kernels.cuda.ema_dense` and
    the mirror functions); Adagrad (dense and rows) and RMSprop, except, in float64, their
    forms with ``rsqrt`` (TF1's and optax's Adagrad, tf_keras', TF1's and optax's RMSprop):
    float64 ``ops.rsqrt`` calls ``math.frexp``, whose numba-cuda lowering has one plain
    ``mul.f64`` by 2**54 and one ``add.f64`` ``x + x``, both exact, which the audit's rule
    "every multiply explicitly rounded" flags; ``rmsprop`` includes them, and RMSprop
    centered with momentum.

    Returns
    -------
    list of (label, Rule, fl tuple, dmode, emode, kind)
        ``kind``: the kernel the variant runs, ``"dense"``, ``"rows"`` (a lazy row rule) or
        ``"table"`` (a whole-table sparse rule).
    """
    import refopt
    from refopt.conventions import PRESETS
    from refopt.executors import plan as _plan
    from refopt.rules import adam as rules_adam
    from refopt.rules import sgd as rules_sgd
    from refopt.rules import steps

    dtype = np.dtype(dtype)
    out = {}

    def add(label, opt, rows=False):
        if opt is None:
            return
        rc = opt.update_rule(dtype, 0.01, 3, lazy_rows=rows,
                             optax_weight_decay=(opt.weight_decay
                                                 if opt.weight_decay is not None
                                                 and opt._decay_mode() == "optax" else None))
        if rc is None:
            return
        pl = _plan.plan(opt, dtype, 0.01, 3, 0)
        dmode, emode = (pl.dmode, 0 if rows else pl.emode) if pl is not None else (0, 0)
        direct(label, rc, dmode, emode, "rows" if rows else "dense")

    def refused_or(cls, **kwargs):  # None where the convention refuses the configuration
        try:
            return cls(**kwargs)
        except ValueError:  # e.g. torch's LazyAdam (SparseAdam) has no amsgrad
            return None

    def direct(label, rc, dmode=0, emode=0, kind="dense"):
        key = (rc.rule.name, tuple(int(f) for f in rc.fl), dmode, emode, kind)
        out.setdefault(key, (f"{label}", rc.rule, key[1], dmode, emode, kind))

    for name, conv in PRESETS.items():
        if conv.optax_jit == "step":
            # "optax_jit_step" compiles "optax"'s branches except the last add, which is
            # ops.fma (audited in every FMA form); its 16 variants are not compiled again
            continue
        ema = conv.ema != "none"
        base = dict(convention=name, use_ema=ema)
        add(f"{name} Adam", refopt.Adam(**base))
        add(f"{name} AMSGrad", refopt.Adam(amsgrad=True, **base))
        if conv.adamw_weight_decay != "none":  # TF-Addons' (keras2) has no default decay
            wd = dict(base, weight_decay=conv.default_adamw_weight_decay)
            add(f"{name} AdamW", refopt.AdamW(**wd))
            add(f"{name} AdamW AMSGrad", refopt.AdamW(amsgrad=True, **wd))
        if conv.adam_weight_decay != "none":
            add(f"{name} Adam wd", refopt.Adam(weight_decay=0.01, **base))
        add(f"{name} LazyAdam rows", refopt.LazyAdam(convention=name), rows=True)
        add(f"{name} LazyAdam AMSGrad rows", refused_or(refopt.LazyAdam, amsgrad=True,
                                                        convention=name), rows=True)
        add(f"{name} SGD momentum", refopt.SGD(momentum=0.9, **base))
        add(f"{name} SGD Nesterov", refopt.SGD(momentum=0.9, nesterov=True, **base))
        add(f"{name} SGD", refopt.SGD(**base))
        if conv.sgd_momentum == "tf1":
            add(f"{name} SGD rows", refopt.SGD(momentum=0.9, convention=name), rows=True)
        if conv.ema == "torch":  # AveragedModel's lerp after its first (copy) update
            for mu in (0.99, 0.2):  # |1 - mu| < 0.5 and >= 0.5: EMA modes 3 and 4
                opt = refopt.Adam(ema_momentum=mu, **base)
                opt.iterations = 5
                add(f"{name} Adam EMA {mu}", opt)
        # float64 rsqrt uses math.frexp (see above); float32/16 rsqrt has no frexp
        with_rsqrt = rmsprop or dtype != np.float64
        if conv.adagrad_form not in ("tf1", "optax") or with_rsqrt:  # those two use rsqrt
            add(f"{name} Adagrad", refopt.Adagrad(learning_rate=0.01, **base))
            if conv.adagrad_form not in ("keras3", "optax"):  # lazy rows where sparse is
                add(f"{name} Adagrad rows", refopt.Adagrad(learning_rate=0.01,
                                                           convention=name), rows=True)
        if conv.adamax_form != "none":  # one build per form (tf_keras and Keras 3 share one)
            add(f"{name} Adamax", refopt.Adamax(learning_rate=0.01, convention=name))
            if conv.adamax_form == "keras2":  # the only lazy form
                add(f"{name} Adamax rows", refopt.Adamax(learning_rate=0.01, convention=name),
                    rows=True)
        if conv.nadam_form != "none":  # one build per form (tf_keras and Keras 3 share one)
            add(f"{name} Nadam", refopt.Nadam(learning_rate=0.01, convention=name))
        if conv.asgd_form != "none":  # one build: t0=0 averages from step 3 (the ax update)
            add(f"{name} ASGD", refopt.ASGD(t0=0.0, convention=name))
        if conv.rprop_form != "none":  # one build
            add(f"{name} Rprop", refopt.Rprop(convention=name))
        if conv.lion_form != "none":  # one build per form (tf_keras and Keras 3 share one;
            # optax's with its decay inside the update)
            add(f"{name} Lion", refopt.Lion(learning_rate=0.01, convention=name,
                                            weight_decay=1e-3 if name == "optax" else None))
        if conv.lamb_form != "none":  # one build per form: the phase with the moments
            from refopt.rules.lamb import direction_call

            direct(f"{name} Lamb direction", direction_call(
                dtype, conv, beta_1=0.9, beta_2=0.999, epsilon=1e-6, step=3,
                eps_root=1e-8 if name == "optax" else None,
                weight_decay=1e-3 if name == "optax" else None))
        if conv.adafactor_form != "none" and (
                conv.adafactor_form in ("keras3", "torch") or with_rsqrt):
            # one build per form: the direction phase of a vector (tf_keras and optax: rsqrt)
            from refopt.rules import RuleCall, flags, scalars
            from refopt.rules.adafactor import ADAFACTOR_DIRECTION, FORMS as AF_FORMS

            direct(f"{name} Adafactor direction", RuleCall(
                ADAFACTOR_DIRECTION, scalars(dtype, [0.5, 0.5, 1e-30, 1, 1e-14, 0.3, -0.7]),
                flags([AF_FORMS[conv.adafactor_form], 0, 1])))
        if conv.radam_form != "none":  # one build per form, a rectified step (t = 10)
            from refopt.rules.radam import radam_call

            direct(f"{name} RAdam", radam_call(dtype, conv, learning_rate=0.01, beta_1=0.9,
                                               beta_2=0.999, epsilon=1e-8, step=10))
        # Adadelta: one build per form (Keras 2 and TF1 share the kernel's; their lazy rows
        # are the same rule); the TF kernel's and optax's use rsqrt
        if conv.adadelta_form != "none" and (
                conv.adadelta_form not in ("keras2", "tf1", "optax") or with_rsqrt):
            add(f"{name} Adadelta", refopt.Adadelta(learning_rate=1.0, convention=name))
        if conv.ftrl_form == "keras2":  # Ftrl's rule: the kernels' (Keras 2 = TF1), one build
            add(f"{name} Ftrl", refopt.Ftrl(convention=name))  # each for dense and rows
            from refopt.rules.ftrl import ftrl_call

            direct(f"{name} Ftrl rows", ftrl_call(dtype, conv, learning_rate=0.01,
                                                  lazy_rows=True, row_width=4), kind="rows")
        if conv.proximal_adagrad_form != "none":  # TF1's: one build each, dense and rows,
            # l1 on (float64 takes 1/sqrt, no rsqrt)
            from refopt.rules.proximal import proximal_adagrad_call

            hp_prox = {"learning_rate": 0.01, "l1_regularization_strength": 0.01,
                       "l2_regularization_strength": 0.01}
            direct(f"{name} ProximalAdagrad", proximal_adagrad_call(dtype, conv, **hp_prox))
            direct(f"{name} ProximalAdagrad rows", proximal_adagrad_call(
                dtype, conv, lazy_rows=True, row_width=4, **hp_prox), kind="rows")
        if conv.proximal_sgd_form != "none":
            from refopt.rules.proximal import proximal_sgd_call

            hp_prox = {"learning_rate": 0.01, "l1_regularization_strength": 0.01,
                       "l2_regularization_strength": 0.01}
            direct(f"{name} ProximalGradientDescent",
                   proximal_sgd_call(dtype, conv, **hp_prox))
            direct(f"{name} ProximalGradientDescent rows", proximal_sgd_call(
                dtype, conv, lazy_rows=True, row_width=4, **hp_prox), kind="rows")
        if with_rsqrt or conv.rmsprop_form in ("keras3", "keras2", "torch"):
            add(f"{name} RMSprop", refopt.RMSprop(learning_rate=0.01, **base))
            add(f"{name} RMSprop centered momentum",
                refopt.RMSprop(learning_rate=0.01, centered=True, momentum=0.9, **base))
    # tf-keras' whole-table sparse updates (decay mode 1: Keras' decoupled decay)
    hp = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=3, table=True)
    direct("tf_keras Adam table", rules_adam.tf_keras_call(dtype, amsgrad=False, **hp),
           kind="table")
    direct("tf_keras AdamW AMSGrad table", rules_adam.tf_keras_call(dtype, amsgrad=True, **hp),
           1, kind="table")
    for nesterov, dmode in ((False, 0), (True, 1)):
        direct(f"tf_keras SGD{' Nesterov wd' if nesterov else ''} table",
               rules_sgd.tf_keras_call(dtype, learning_rate=0.01, momentum=0.9,
                                       nesterov=nesterov, table=True), dmode, kind="table")
    # the pipeline's steps as rules (the launchers' and mirror functions' one-tensor kernels)
    for label, rule, mode in (("clip by value", steps.CLIP, 1), ("clip by norm", steps.CLIP, 2),
                              ("clip global", steps.CLIP, 3), ("decay", steps.DECAY, 1),
                              ("ema", steps.EMA, 1)):
        direct(f"step {label}", steps.step_call(rule, dtype, mode))
    return list(out.values())


@contextlib.contextmanager
def _device_stand_in(cc):
    """Answer numba-cuda's "current device" query with compute capability ``cc``."""
    from numba.cuda import dispatcher

    class _StandIn:
        compute_capability = tuple(cc)

    saved = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: _StandIn()
    try:
        yield
    finally:
        dispatcher.get_current_device = saved


def _target(ptx):
    m = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M)
    return m.group(1) if m else "?"


def _control(a, b, c, out):
    i = 0
    while i < out.shape[0]:
        out[i] = a[i] * b[i] + c[i]
        i += 1


def _require_toolchain():
    from numba import cuda

    if hasattr(cuda, "FakeCUDAKernel"):
        raise RuntimeError("NUMBA_ENABLE_CUDASIM is set: the simulator compiles nothing. "
                           "Run with NUMBA_ENABLE_CUDASIM=0 (no GPU is needed).")
    return cuda


#: The rule variants compiled at every compute capability (all of them at the first one):
#: one per form, the driver code is the same whatever the target.
REPRESENTATIVE_RULES = ("tf_keras Adam", "tf_keras AdamW AMSGrad", "tf_keras LazyAdam rows",
                        "torch Adam wd", "torch LazyAdam rows", "optax AdamW AMSGrad",
                        "torch SGD Nesterov", "tf1 SGD rows", "tf_keras AdamW AMSGrad table",
                        "step clip by norm")


#: The low-precision dense kernels audited (``kernels(..., low=...)``: float16/bfloat16 bits
#: computed in float32), at the first cc only: the conversions
#: (:mod:`refopt.kernels.cuda.halfbits`) are the same in every rule, the rule's float32
#: arithmetic is audited with the float32 variants. ``(label, optimizer, format)``.
LOW_PRECISION_RULES = (("torch_fused Adam", "float16"),
                       ("torch_fused AdamW", "bfloat16"),
                       ("torch_fused SGD momentum", "bfloat16"))


def low_precision_kernels(width, tpb=256, items=8):
    """``(name, dtype label, py_func, signature)`` of the low-precision ``dense`` kernels of
    :data:`LOW_PRECISION_RULES`, as the executor launches them: uint16 arrays (variables,
    gradients, slot buffers), the clip pairs and every scalar in float32. Names: ``"rule
    dense: torch_fused Adam"``, dtype labels ``"float16 bits"`` and ``"bfloat16 bits"``."""
    from numba import typeof, types

    import refopt
    from refopt.executors import plan as _plan
    from refopt.kernels.cuda import drivers, halfbits

    f32 = np.dtype(np.float32)
    opts = {"torch_fused Adam": refopt.Adam(weight_decay=0.01, convention="torch_fused"),
            "torch_fused AdamW": refopt.AdamW(convention="torch_fused"),
            "torch_fused SGD momentum": refopt.SGD(
                momentum=0.9, convention=_low_convention("torch_fused"))}
    u1 = typeof(np.zeros(2, np.uint16))
    tup = types.UniTuple(u1, width)
    s = typeof(np.float32(1))
    out = []
    for label, fmt in LOW_PRECISION_RULES:
        opt = opts[label]
        rc = opt.update_rule(f32, 0.01, 3, optax_weight_decay=None)
        pl = _plan.plan(opt, f32, 0.01, 3, 0)
        ks = drivers.kernels(rc.rule, rc.fl, pl.dmode, 0, tpb, f32, items=items,
                             low=halfbits.kind_of(_low_dtype(fmt)))
        sig = (tup, tup, typeof(np.zeros((2, 2), np.int64)), typeof(np.zeros((2, 2), f32)),
               typeof(1)) + (u1,) * rc.rule.arity + (u1, typeof(True), types.UniTuple(s, 8),
                                                      types.UniTuple(s, 16))
        out.append((f"rule dense: {label}", f"{fmt} bits", ks.dense.py_func, sig))
    return out


def _low_convention(name):
    from refopt.conventions import get_convention

    return get_convention(name, low_precision_compute="float32")


def _low_dtype(fmt):
    if fmt == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(fmt)


def family_rules(dtype=np.float32, rmsprop=False):
    """One rule variant per family: the first of :func:`rule_variants` for each ``(rule,
    kernel)`` pair (e.g. ``adam`` on ``dense``, ``adam`` on ``rows``), and
    :data:`REPRESENTATIVE_RULES`.

    What a dtype changes in a kernel is in :mod:`refopt.rules.ops` (float16 computed in
    float32 and rounded back, float64's ``fma`` by an error-free transformation), shared by
    every variant of a rule; the flags, decay and EMA modes select branches of the rule's
    source, which are the same in every dtype. So the audit compiles every variant in one
    dtype and these in the others (``compile_all(full_dtypes=...)``).

    Returns
    -------
    tuple of str
        Labels of :func:`rule_variants`, in its order.
    """
    seen, labels = set(), []
    for label, rule, _, _, _, kind in rule_variants(dtype, rmsprop=rmsprop):
        if (rule.name, kind) not in seen or label in REPRESENTATIVE_RULES:
            seen.add((rule.name, kind))
            labels.append(label)
    return tuple(labels)


def _report(name, dt, cc, ptx):
    ops = {**float_ops(ptx), **approximations(ptx)}
    r = KernelPTX(name, np.dtype(dt).name, tuple(cc), _target(ptx), param_bytes(ptx), ops,
                  audit_ops(ops))
    if r.param_bytes > PARAM_LIMIT:
        r.problems.append(f"parameter block of {r.param_bytes} bytes exceeds {PARAM_LIMIT}")
    return r


def rule_kernels(dtype, width, tpb=256, items=8, labels=None, rmsprop=False):
    """``(name, py_func, signature)`` of the rule drivers' kernels to audit for ``dtype``.

    Every :func:`rule_variants` (those named in ``labels`` when given), its ``dense``,
    ``rows`` or ``table`` kernel as the optimizers and launchers launch it; and the pairwise
    reductions' kernels (:func:`reduction_kernels`). Names: ``"rule <kind>: <variant>"``,
    ``"reduce <kind>: <reduction>"``.
    """
    from refopt.kernels.cuda import drivers

    dtype = np.dtype(dtype)
    out = []
    for label, rule, fl, dmode, emode, kind in rule_variants(dtype, rmsprop=rmsprop):
        if labels is not None and label not in labels:
            continue
        ks = drivers.kernels(rule, fl, dmode, emode, tpb, dtype, items=items)
        sig = rule_kernel_signatures(dtype, width, rule.arity)[kind]
        out.append((f"rule {kind}: {label}", getattr(ks, kind).py_func, sig))
    out += [(name, kernel.py_func, sig)
            for name, kernel, sig in reduction_kernels(dtype, width, tpb)]
    return out


def reduction_kernels(dtype, width, tpb=256):
    """``(name, kernel, signature)`` of the reductions' kernels to audit for ``dtype``: the
    leaf sums (NumPy's order) of :data:`~refopt.rules.reduce.SUM_SQUARES` and
    :data:`~refopt.rules.reduce.SUM_HALF_SQUARES` (norm clipping) and the lane sums
    (PyTorch's order, float32 and float64) of ``SUM_SQUARES``. Names: ``"reduce leaf_sums:
    sum_squares"`` and so on."""
    from refopt.kernels.cuda import drivers
    from refopt.rules.reduce import SUM_HALF_SQUARES, SUM_SQUARES

    sigs = rule_kernel_signatures(dtype, width, 1)
    out = []
    for red in (SUM_SQUARES, SUM_HALF_SQUARES):
        rk = drivers.reduce_kernels(red, tpb, dtype)
        out.append((f"reduce leaf_sums: {red.name}", rk.leaf_sums, sigs["leaf_sums"]))
        if red is SUM_SQUARES and rk.lane_sums is not None:
            out.append((f"reduce lane_sums: {red.name}", rk.lane_sums, sigs["lane_sums"]))
    return out


def compile_all(ccs=DEFAULT_CCS, dtypes=(np.float16, np.float32, np.float64), tpb=256, items=8,
                width=None, all_rules=False, rmsprop=False, jobs=None, full_dtypes=None):
    """Compile every kernel (and the control) to PTX and audit it.

    Parameters
    ----------
    ccs : sequence of (int, int)
        Compute capabilities.
    dtypes : sequence of numpy dtypes
        float16, float32 and/or float64.
    tpb, items : int
        Threads per block and items per thread the kernels are built for.
    width : int or None
        Tensors per multi-tensor launch (None: ``config.TENSORS_PER_LAUNCH``).
    all_rules : bool
        Compile every rule variant (:func:`rule_kernels`) at every cc; by default all of
        them at the first cc and :data:`REPRESENTATIVE_RULES` at the others.
    rmsprop : bool
        Include RMSprop's rules (see :func:`rule_variants`).
    jobs : int or None
        Processes compiling ``(cc, dtype)`` tasks in parallel (None: one per CPU, at most
        one per task; 1: in this process).
    full_dtypes : sequence of numpy dtypes or None
        The dtypes whose every rule variant is compiled at the first cc (None: all of
        ``dtypes``); the others compile :func:`family_rules` there (one variant per rule and
        kernel). Ignored with ``all_rules``.

    Returns
    -------
    list of KernelPTX
        The kernels' reports (the rule drivers' kernels, named ``"rule ..."``), then one
        ``"control"`` report per cc and dtype, whose ``problems`` list the contraction NVVM
        applied to plain operators.

    Raises
    ------
    RuntimeError
        If the simulator is on.
    Exception
        From numba-cuda when NVVM/NVRTC cannot be found or a kernel does not compile.
    """
    _require_toolchain()
    from refopt.kernels.cuda import config

    width = int(config.TENSORS_PER_LAUNCH if width is None else width)
    full = None if full_dtypes is None else {np.dtype(dt).name for dt in full_dtypes}

    def labels(n_cc, dt):
        if all_rules or (n_cc == 0 and (full is None or np.dtype(dt).name in full)):
            return None
        return family_rules(dt, rmsprop) if n_cc == 0 else REPRESENTATIVE_RULES

    tasks = [(tuple(cc), np.dtype(dt).name, tpb, items, width, labels(n_cc, dt), rmsprop)
             for n_cc, cc in enumerate(ccs) for dt in dtypes]
    jobs = min(len(tasks), os.cpu_count() or 1) if jobs is None else max(1, int(jobs))
    if jobs == 1:
        results = [_compile_task(*task) for task in tasks]
    else:  # one (cc, dtype) per task; spawned workers (numba is not fork-safe)
        import concurrent.futures
        import multiprocessing

        with concurrent.futures.ProcessPoolExecutor(
                jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_compile_task, *zip(*tasks)))
    return [r for rs in results for r in rs]


def _compile_task(cc, dtype, tpb, items, width, labels, rmsprop):
    """The reports of one compute capability and dtype (see :func:`compile_all`)."""
    cuda = _require_toolchain()
    from numba import typeof

    dt = np.dtype(dtype)
    reports = []
    with _device_stand_in(cc):
        for name, fn, sig in rule_kernels(dt, width, tpb, items, labels, rmsprop):
            ptx, _ = cuda.compile_ptx(fn, sig, cc=tuple(cc))
            reports.append(_report(name, dt, cc, ptx))
        if dt == np.float16 and labels != REPRESENTATIVE_RULES:  # first cc: the
            for name, label, fn, sig in low_precision_kernels(width, tpb, items):  # low ones
                ptx, _ = cuda.compile_ptx(fn, sig, cc=tuple(cc))
                r = _report(name, np.float32, cc, ptx)
                r.dtype = label
                reports.append(r)
        a = typeof(np.zeros(2, dt))
        ptx, _ = cuda.compile_ptx(_control, (a, a, a, a), cc=tuple(cc))
        ops = {**float_ops(ptx), **approximations(ptx)}
        reports.append(KernelPTX("control", dt.name, tuple(cc), _target(ptx),
                                 param_bytes(ptx), ops, audit_ops(ops)))
    return reports


def compile_on_device(dtypes=(np.float16, np.float32, np.float64), tpb=256, items=8,
                      width=None, all_rules=False):
    """Compile every kernel for the current GPU as a launch does, and audit that PTX.

    A launch compiles through the kernel's dispatcher and, when nvJitLink is available,
    links with link-time optimisation (numba-cuda's default), which generates the final code
    at link time; this audits the PTX after LTO (``library.get_lto_ptx``), else the PTX of the
    library. It sees what a device runs, where :func:`compile_all` sees ``compile_ptx``.

    Parameters
    ----------
    dtypes, tpb, items, width
        As :func:`compile_all`.
    all_rules : bool
        Every rule variant; by default :data:`REPRESENTATIVE_RULES` (one per form).

    Returns
    -------
    list of KernelPTX
        One per kernel and dtype, ``cc`` the device's.

    Raises
    ------
    RuntimeError
        If the simulator is on or there is no usable GPU.
    """
    cuda = _require_toolchain()
    if not cuda.is_available():
        raise RuntimeError("--device needs a usable CUDA GPU (numba.cuda.is_available() is "
                           "False); without one, audit with compile_ptx (no --device).")
    from refopt.kernels.cuda import config, drivers

    cc = tuple(cuda.get_current_device().compute_capability)
    width = int(config.TENSORS_PER_LAUNCH if width is None else width)
    reports = []
    for dt in dtypes:
        dt = np.dtype(dt)
        kernels = []
        for label, rule, fl, dmode, emode, kind in rule_variants(dt):
            if not all_rules and label not in REPRESENTATIVE_RULES:
                continue
            ks = drivers.kernels(rule, fl, dmode, emode, tpb, dt, items=items)
            kernels.append((f"rule {kind}: {label}", getattr(ks, kind),
                            rule_kernel_signatures(dt, width, rule.arity)[kind]))
        kernels += reduction_kernels(dt, width, tpb)
        for name, kernel, sig in kernels:
            lib = kernel.compile(sig).library
            lto = bool(getattr(lib, "_lto", False))
            ptx = lib.get_lto_ptx(cc=cc) if lto else lib.get_asm_str(cc=cc)
            reports.append(_report(name + (" (after LTO)" if lto else ""), dt, cc, ptx))
    return reports


def _cc(text):
    m = re.fullmatch(r"(\d+)\.(\d+)", text.strip())
    if not m or int(m.group(1)) < 1:
        raise argparse.ArgumentTypeError(
            f"--cc takes MAJOR.MINOR with MAJOR >= 1, e.g. 9.0. Received: {text!r}")
    return int(m.group(1)), int(m.group(2))


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m refopt.kernels.cuda.ptx",
        description="Compile refopt's CUDA kernels to PTX (no GPU needed) and audit them: no "
                    "FMA contraction, no approximate or flush-to-zero arithmetic, kernel "
                    "parameters within 4 KiB.")
    parser.add_argument("--cc", type=_cc, action="append",
                        help="compute capability MAJOR.MINOR (repeatable; default 8.0, 9.0 "
                             "and 10.0)")
    parser.add_argument("--json", action="store_true", help="print a JSON report")
    parser.add_argument("--all-rules", action="store_true",
                        help="compile every rule variant at every cc (default: all at the "
                             "first cc, one per form at the others; with --device, one per "
                             "form)")
    parser.add_argument("--rmsprop", action="store_true",
                        help="also audit RMSprop's rule kernels (known to fail the strict "
                             "rule on math.frexp's exact plain mul.f64)")
    parser.add_argument("--full-dtype", action="append", choices=("float16", "float32",
                                                                  "float64"),
                        help="compile every rule variant at the first cc only in this dtype "
                             "(repeatable; the others: one variant per rule and kernel, "
                             "ptx.family_rules; default: every variant in every dtype)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="processes compiling in parallel (default: one per CPU)")
    parser.add_argument("--device", action="store_true",
                        help="compile for the current GPU as a launch does (with link-time "
                             "optimisation when nvJitLink is there) and audit that PTX")
    args = parser.parse_args(argv)
    ccs = list(dict.fromkeys(args.cc)) if args.cc else list(DEFAULT_CCS)
    try:
        reports = (compile_on_device(all_rules=args.all_rules) if args.device else
                   compile_all(ccs=ccs, all_rules=args.all_rules, rmsprop=args.rmsprop,
                               jobs=args.jobs, full_dtypes=args.full_dtype))
    except Exception as exc:  # the simulator is on, the toolchain or a target is missing
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        msg = f"cannot compile to PTX: {type(exc).__name__}: {msg}"
        print(msg, file=sys.stderr)
        if args.json:
            print(json.dumps({"error": msg, "passed": False}))
        return 2
    kernels = [r for r in reports if r.name != "control"]
    controls = [r for r in reports if r.name == "control"]
    failed = [r for r in kernels if r.problems]
    if args.json:
        print(json.dumps({"kernels": [r.as_dict() for r in kernels],
                          "controls": [r.as_dict() for r in controls],
                          "passed": not failed}, indent=1))
    else:
        for r in kernels:
            ops = " ".join(f"{k}:{v}" for k, v in r.float_ops.items()) or "-"
            verdict = "ok" if not r.problems else "FAIL: " + "; ".join(r.problems)
            print(f"{r.target:6} {r.dtype:7} {r.name:17} params {r.param_bytes:5} B"
                  f"  {ops}  {verdict}")
        for r in controls:
            fused = "contracted to FMA" if r.problems else "not contracted"
            print(f"{r.target:6} {r.dtype:7} control (plain a*b+c): {fused}")
        print(f"{len(kernels) - len(failed)} of {len(kernels)} kernel builds pass")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
