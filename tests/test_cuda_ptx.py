"""The PTX audit of the CUDA kernels (refopt.kernels.cuda.ptx), and what it relies on.

- The PTX parsers (parameter block size, float instruction counts, the audit rules) on small
  hand-written PTX texts: they run everywhere.
- ``rule_kernel_signatures`` (the argument types the audit compiles with) against the
  arguments of real launches, recorded on the simulator while the optimizers, the launchers
  and the mirror functions run: if a launcher changes what it passes, the audit would compile
  something else.
- The audit itself, in a subprocess with ``NUMBA_ENABLE_CUDASIM=0`` (numba reads it once per
  process and this one runs the simulator): the kernels compile to PTX for sm_80, sm_90 and
  sm_100 without a GPU, have no FMA and no approximate or flush-to-zero arithmetic, and the
  24-tensor launches fit the 4 KiB parameter block; the control kernel written with plain
  operators *is* contracted, so the check is not vacuous. Which kernels: at sm_80 every rule
  variant (``ptx.rule_variants``: each convention's forms with their flags, decay and EMA
  modes, on the dense, rows and table kernels) in float32, and in float16 and float64 one
  variant per rule and kernel plus the representative ones (``ptx.family_rules``: a dtype
  changes only the primitives of ``refopt.rules.ops``, which every variant of a rule shares;
  the flags select branches of the same source in every dtype); at sm_90 and sm_100 the
  representative ones (``ptx.REPRESENTATIVE_RULES``) in the three dtypes; every reduction
  kernel at every cc and dtype. ``python -m refopt.kernels.cuda.ptx`` without
  ``--full-dtype`` compiles every variant in every dtype at sm_80 (467 builds instead of 275
  when measured, 1.6 times the CPU time). It needs numba-cuda with NVVM and NVRTC
  (``.[test]`` installs ``numba-cuda[cu13]``, which brings both from PyPI); without them
  it is skipped, saying why.
"""

import functools
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
from refopt.kernels.cuda import ptx  # noqa: E402

# A kernel entry in the form NVVM writes it: u64 pointers, a float, a byte, a byte array.
_ENTRY = """
.visible .entry _Z3fooPf(
\t.param .u64 _Z3fooPf_param_0,
\t.param .f32 _Z3fooPf_param_1,
\t.param .u8 _Z3fooPf_param_2,
\t.param .align 8 .b8 _Z3fooPf_param_3[56],
\t.param .f64 _Z3fooPf_param_4
)
{
\tld.param.u64 \t%rd1, [_Z3fooPf_param_0];
\tfma.rn.f32 \t%f4, %f2, %f1, %f3;
\tmul.f32 \t%f5, %f4, %f1;
\tmul.rn.f64 \t%fd2, %fd1, %fd1;
\t@%p1 add.rn.f32 \t%f6, %f5, %f1;
\tsqrt.approx.ftz.f32 \t%f7, %f6;
\tdiv.rn.f32 \t%f8, %f7, %f6;
\tmul.lo.s64 \t%rd2, %rd1, %rd1;
\tsetp.lt.f32 \t%p2, %f1, %f2;
\tex2.approx.ftz.f32 \t%f9, %f8;
\tadd.rn.f16x2 \t%r9, %r8, %r8;
}
"""

# sm_100 and newer qualify pointer parameters; the parameter stays 8 bytes.
_ENTRY_SM100 = """
.visible .entry _Z3barPf(
\t.param .u64 _Z3barPf_param_0,
\t.param .u64 .ptr .align 1 _Z3barPf_param_1,
\t.param .u64 .ptr .global .align 16 _Z3barPf_param_2,
\t.param .f32 _Z3barPf_param_3
)
{
}
"""


def test_param_bytes_follows_the_alignment_of_each_parameter():
    # u64 at 0 (8), f32 at 8 (4), u8 at 12 (1), 56-byte array aligned to 8 at 16 (72),
    # f64 at 72: ends at 80.
    assert ptx.param_bytes(_ENTRY) == 80
    assert ptx.param_bytes(_ENTRY_SM100) == 28
    with pytest.raises(ValueError, match="no .entry"):
        ptx.param_bytes(".version 8.0\n")
    with pytest.raises(ValueError, match="Cannot read"):
        ptx.param_bytes(".entry k(\n.param .weird x\n)")


def test_float_ops_counts_float_arithmetic_only():
    assert ptx.float_ops(_ENTRY) == {"add.rn.f16x2": 1, "add.rn.f32": 1, "div.rn.f32": 1,
                                     "fma.rn.f32": 1, "mul.f32": 1, "mul.rn.f64": 1,
                                     "sqrt.approx.ftz.f32": 1}
    # .approx/.ftz on any instruction, not only arithmetic
    assert ptx.approximations(_ENTRY) == {"ex2.approx.ftz.f32": 1, "sqrt.approx.ftz.f32": 1}


def test_audit_flags_fma_unrounded_mul_approx_and_ftz_only():
    problems = ptx.audit_ops({**ptx.float_ops(_ENTRY), **ptx.approximations(_ENTRY)})
    assert len(problems) == 6
    assert any("fma.rn.f32" in p and "fused" in p for p in problems)
    assert any("mul.f32" in p and "rounding modifier" in p for p in problems)
    assert any("sqrt.approx.ftz.f32" in p and "approximate" in p for p in problems)
    assert any("sqrt.approx.ftz.f32" in p and "subnormals" in p for p in problems)
    assert any("ex2.approx.ftz.f32" in p and "approximate" in p for p in problems)
    assert ptx.audit_ops({"mul.rn.f32": 3, "add.rn.f64": 2, "div.rn.f32": 1,
                          "sqrt.rn.f64": 1, "add.f64": 4}) == []


# ---------------------------------------------------------------------------------------
# kernel_signatures against real launches (simulator)


class _Record:
    """Stands in for a kernel: records the argument types of each launch, then launches."""

    def __init__(self, kernel, name, log):
        self.kernel, self.name, self.log = kernel, name, log

    def __getitem__(self, config):
        launch = self.kernel[config]

        def call(*args):
            self.log.append((self.name, tuple(_numba_type(a) for a in args)))
            return launch(*args)

        return call


def _numba_type(a):
    from numba import typeof, types

    if isinstance(a, tuple):
        return types.UniTuple(_numba_type(a[0]), len(a)) if len(set(map(_numba_type, a))) == 1 \
            else types.Tuple(tuple(_numba_type(x) for x in a))
    if hasattr(a, "_ary"):  # the simulator's device array
        return typeof(a._ary)
    return typeof(a)


# PyTorch's fused Adam path (its lane sums for clip_grad_norm_ run on the device; a torch
# convention whose Adam takes MKL's sqrt steps on the host)
_TORCH_FUSED = "torch_fused" if "torch_fused" in refopt.conventions.PRESETS else "torch"


@pytest.mark.skipif(not kc.simulator, reason="records launches on the simulator")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_kernel_signatures_are_those_of_real_launches(dtype, monkeypatch):
    from test_cuda_optimizers import wrap_rule_kernels

    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    rng = np.random.default_rng(3)
    shapes = [(3,), (2, 2)]

    def host():
        return [rng.standard_normal(s).astype(dtype) for s in shapes]

    rule_log = []

    def record_rule(kernel, name, ks):
        arity = ks.rule.arity if ks is not None else 1
        return _Record(kernel, (name, arity), rule_log)

    wrap_rule_kernels(monkeypatch, record_rule)
    for opt in (refopt.Adam(0.1, amsgrad=True, weight_decay=0.1, clipnorm=1.0, use_ema=True,
                            ema_overwrite_frequency=1, backend="cuda"),
                refopt.SGD(0.1, momentum=0.9, nesterov=True, global_clipnorm=1.0,
                           use_ema=True, backend="cuda"),
                refopt.AdamW(0.1, convention=_TORCH_FUSED, use_ema=True, clipnorm=1.0,
                             backend="cuda")):
        ws = [kc.to_device(h) for h in host()]
        opt.apply_gradients(zip([kc.to_device(g) for g in host()], ws))
    for opt in (refopt.Adam(0.1, amsgrad=True, weight_decay=0.1, backend="cuda"),
                refopt.Adam(0.1, backend="cuda"),
                refopt.SGD(0.1, momentum=0.9, backend="cuda")):  # non-lazy sparse: tables
        table = kc.to_device(rng.standard_normal((5, 2)).astype(dtype))
        opt.apply_gradients([(IndexedSlices(rng.standard_normal((3, 2)).astype(dtype),
                                            np.array([4, 0, 4]), (5, 2)), table)])
    # lazy rows: Adam's rule, SparseAdam's (with IEEE's root: MKL's is the host step)
    for conv in ("tf_keras", refopt.conventions.get_convention("torch", sqrt="ieee")):
        table = kc.to_device(rng.standard_normal((5, 2)).astype(dtype))
        lazy = refopt.LazyAdam(0.1, amsgrad=conv == "tf_keras", use_ema=True, clipnorm=1.0,
                               convention=conv, backend="cuda")
        lazy.apply_gradients([(IndexedSlices(rng.standard_normal((3, 2)).astype(dtype),
                                             np.array([4, 0, 4]), (5, 2)), table)])
    p, g = host()[0], host()[0]  # the mirror functions take host arrays, as the reference
    m, v = np.zeros_like(p), np.ones_like(p)
    kc.adam_update(p, g, m, v, v, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                   step=1)
    kc.sgd_update(p, g, m, learning_rate=0.1, momentum=0.9, nesterov=False)
    t2 = rng.standard_normal((5, 2)).astype(dtype)
    kc.lazy_adam_update(t2, IndexedSlices(np.ones((2, 2), dtype), [1, 3], (5, 2)),
                        np.zeros_like(t2), np.zeros_like(t2), learning_rate=0.1, beta_1=0.9,
                        beta_2=0.999, epsilon=1e-7, step=1)
    kc.clip_by_value(g, 0.5)
    kc.global_norm([g])
    kc.apply_weight_decay(p, learning_rate=0.1, weight_decay=0.1)
    kc.ema_update(p, g, ema_momentum=0.9)
    # the launchers on device arrays
    P, G, M, V = (kc.to_device(a) for a in (p, g, m, v))
    kc.adam_dense(P, G, M, V, learning_rate=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                  step=2, weight_decay=0.1, clip=(2, 1.0, 3.0), average=kc.to_device(p),
                  ema_momentum=0.9)
    kc.sgd_dense(P, G, M, learning_rate=0.1, momentum=0.9)
    kc.decay_dense(kc.to_device(g), P, learning_rate=0.1, weight_decay=0.1)
    kc.ema_dense(kc.to_device(g), P, ema_momentum=0.9, overwrite=True)
    kc.clip_dense(kc.to_device(g), G, 3, gscale=0.5)
    width = kc.config.TENSORS_PER_LAUNCH
    seen = set()
    for (name, arity), sig in rule_log:
        assert sig == ptx.rule_kernel_signatures(dtype, width, arity)[name], (name, arity)
        seen.add((name, arity))
    # the rule drivers' kernels for rules of 0 (the steps), 1, 2 and 3 slots; the reductions'
    assert {("dense", 0), ("dense", 1), ("dense", 2), ("dense", 3), ("rows", 2), ("rows", 3),
            ("table", 1), ("table", 2), ("table", 3), ("leaf_sums", 1),
            ("lane_sums", 1)} <= seen


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_family_rules_cover_every_rule_and_kernel_of_the_dtype(dtype):
    # what the audit compiles in float16 and float64 at the first cc: every (rule, kernel)
    # pair of the dtype's variants, each once unless it is a representative one
    variants = {v[0]: (v[1].name, v[5]) for v in ptx.rule_variants(dtype)}
    families = ptx.family_rules(dtype)
    assert {variants[label] for label in families} == set(variants.values())
    assert set(ptx.REPRESENTATIVE_RULES) <= set(families)
    others = [variants[label] for label in families if label not in ptx.REPRESENTATIVE_RULES]
    assert len(others) == len(set(others))
    assert len(families) < len(variants) // 2


# ---------------------------------------------------------------------------------------
# The audit itself (NVVM, no GPU)


@functools.lru_cache(maxsize=1)
def _audit():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    # every variant in float32, one per rule and kernel in float16 and float64 (see above)
    proc = subprocess.run([sys.executable, "-m", "refopt.kernels.cuda.ptx", "--json",
                           "--full-dtype", "float32"],
                          check=False, capture_output=True, text=True, env=env, timeout=900)
    return proc


def _run_audit():
    """The audit's report (run once per session: it compiles a few hundred kernels)."""
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed (numba's own numba.cuda cannot compile PTX "
                    "here)")
    proc = _audit()
    if proc.returncode == 2:
        pytest.skip(f"no CUDA compiler toolchain (NVVM/NVRTC): {proc.stderr.strip()}")
    return proc, json.loads(proc.stdout)


def test_every_kernel_compiles_to_ptx_without_fma_or_approximations():
    proc, report = _run_audit()
    failed = {(k["name"], k["dtype"], k["cc"]): k["problems"] for k in report["kernels"]
              if k["problems"]}
    assert failed == {} and proc.returncode == 0 and report["passed"]
    # numba-cuda compiled for the target asked for (it clamps unknown newer ones)
    assert {(k["cc"], k["target"]) for k in report["kernels"]} == {
        ("8.0", "sm_80"), ("9.0", "sm_90"), ("10.0", "sm_100")}
    kinds = {v[0]: v[5] for v in ptx.rule_variants()}
    rules = {f"rule {kind}: {label}" for label, kind in kinds.items()}
    assert {k.split(":")[0] for k in rules} == {"rule dense", "rule rows", "rule table"}
    reductions = {"reduce leaf_sums: sum_squares", "reduce leaf_sums: sum_half_squares",
                  "reduce lane_sums: sum_squares"}
    for cc in ("8.0", "9.0", "10.0"):
        for dt in ("float16", "float32", "float64"):
            names = {k["name"] for k in report["kernels"] if (k["cc"], k["dtype"]) == (cc, dt)}
            # at the first cc every rule variant in float32, one per rule and kernel (and
            # the representative ones) in float16 and float64 (which has no rsqrt forms);
            # the representative ones at the others
            variants = {v[0]: v[5] for v in ptx.rule_variants(dt)}
            labels = (variants if dt == "float32" else ptx.family_rules(dt)) if cc == "8.0" \
                else ptx.REPRESENTATIVE_RULES
            expect = {f"rule {variants[label]}: {label}" for label in labels}
            # every reduction at every cc (PyTorch's lanes: float32 and float64 only)
            expect = expect | {r for r in reductions
                               if dt != "float16" or "lane_sums" not in r}
            assert names == expect, (cc, dt)
    # every convention's Adam forms and SGD forms are among the rule variants
    assert {"rule dense: torch Adam wd", "rule dense: optax AdamW AMSGrad",
            "rule dense: tf_keras AdamW", "rule rows: torch LazyAdam rows",
            "rule dense: torch SGD Nesterov", "rule dense: optax SGD Nesterov",
            "rule dense: tf1 SGD Nesterov", "rule dense: torch Adam EMA 0.2",
            "rule table: tf_keras AdamW AMSGrad table", "rule table: tf_keras SGD table",
            "rule dense: step clip by norm", "rule dense: step decay",
            "rule dense: step ema"} <= rules
    # float16 computes in float32: no float16 arithmetic instruction at all.
    for k in report["kernels"]:
        if k["dtype"] == "float16":
            assert not [op for op in k["float_ops"] if op.endswith(".f16")], k
    # the low-precision kernels (float16/bfloat16 bits computed in float32, issue #17), at
    # the first cc only: float32 arithmetic, explicitly rounded, no .f16 (bit conversions)
    low = {(k["name"], k["dtype"]): k for k in report["kernels"] if k["dtype"].endswith("bits")}
    assert set(low) == {(f"rule dense: {label}", f"{fmt} bits")
                        for label, fmt in ptx.LOW_PRECISION_RULES}
    for k in low.values():
        assert k["cc"] == "8.0" and k["float_ops"].get("mul.rn.f32", 0) > 0, k
        assert not [op for op in k["float_ops"] if op.endswith(".f16")], k
    # The elementwise kernels round every multiply and add explicitly.
    for name in ("rule dense: tf_keras Adam", "rule table: tf_keras Adam table"):
        adam = next(k for k in report["kernels"]
                    if k["name"] == name and k["dtype"] == "float32")
        assert adam["float_ops"].get("mul.rn.f32", 0) > 0
        assert adam["float_ops"].get("sqrt.rn.f32", 0) > 0
    # ops.fma emits no fma: float32 through float64 mul.rn + add.rn, float64 by an
    # error-free transformation (many mul.rn.f64), so the "no fma" rule holds for the rules
    # that round once (PyTorch's and XLA's forms) too.
    for dt, op in (("float32", "mul.rn.f64"), ("float64", "mul.rn.f64")):
        torch = next(k for k in report["kernels"]
                     if k["name"] == "rule dense: torch Adam wd" and k["dtype"] == dt)
        assert torch["float_ops"].get(op, 0) > 0 and not [
            o for o in torch["float_ops"] if o.startswith(("fma", "mad"))], torch
    # 24 tensors (two descriptors of 56 bytes each) plus the rest fit in 4 KiB.
    for k in report["kernels"]:
        if k["name"].startswith("rule dense"):
            assert 24 * 2 * 56 < k["param_bytes"] <= ptx.PARAM_LIMIT, k


def test_the_control_kernel_is_contracted_so_the_audit_is_not_vacuous():
    _, report = _run_audit()
    controls = [c for c in report["controls"] if c["dtype"] != "float16"]
    assert len(controls) == 6  # float32 and float64; sm_80, sm_90 and sm_100
    for c in controls:
        fma = "fma.rn.f32" if c["dtype"] == "float32" else "fma.rn.f64"
        assert c["float_ops"].get(fma, 0) >= 1, c
        assert any("fused" in p for p in c["problems"])


def test_device_mode_without_a_gpu_is_one_clear_error():
    if importlib.util.find_spec("numba_cuda") is None:
        pytest.skip("numba-cuda is not installed")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    proc = subprocess.run([sys.executable, "-m", "refopt.kernels.cuda.ptx", "--device", "--json"],
                          check=False, capture_output=True, text=True, env=env, timeout=300)
    report = json.loads(proc.stdout)
    if report.get("passed"):  # a GPU is present: then every kernel passed
        assert proc.returncode == 0
        return
    assert proc.returncode == 2
    assert "--device needs a usable CUDA GPU" in report["error"]
