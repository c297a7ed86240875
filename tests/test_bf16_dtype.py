"""bfloat16 variables computed in their dtype (issue 17 item 1): torch's for-loop
optimizers, tf_keras'/Keras 3's and optax's Adam and SGD, op by op
(:mod:`refopt.reference.bf16`), and the refusals kept elsewhere. The whole trajectories are
the golden cases ``*_bf16`` (``tests/test_conformance.py -k bf16``); the op values below
were recorded from torch 2.13 (CPU, AVX2) on inputs where the plausible float32 formulas
disagree (``conformance/generators/probe_bf16_ops.py`` prints them).
"""

import ml_dtypes
import numpy as np
import pytest

import refopt
from refopt import conformance
from refopt.indexed_slices import IndexedSlices
from refopt.reference import bf16 as L

BF16 = np.dtype(ml_dtypes.bfloat16)


def bits(a):
    return np.asarray(a).view(np.uint16)


def from_bits(b, n=33):
    """``n`` copies of the bfloat16 with bits ``b``: element 0 lies in the vectorised body,
    element 32 in the scalar tail (numel % 32)."""
    return np.full(n, b, np.uint16).view(BF16)


# torch 2.13: (op, inputs' bits, result bits at element 0 (vector body), at 32 (tail))
TORCH_OPS = [
    # a.lerp(b, 0.9) = fma(0.9 - 1, b - a, b); b - (b - a)*(1 - 0.9) rounds differently
    ("lerp", (16385, 16114), 16161, 16161),
    # a.addcmul(b, c, value=0.37) = fma(0.37*b, c, a); a + 0.37*b*c rounds differently
    ("addcmul", (48854, 16298, 16210), 48243, 48243),
    # a.addcdiv(b, c, value=-0.37) = a + (-0.37*b)/c; a + -0.37*(b/c) rounds differently
    ("addcdiv", (16179, 16321, 16204), 47719, 47719),
    # a.add(b, alpha=0.37): fma in the body, a + R(b*R(alpha)) in the scalar tail
    ("add", (48918, 16353), 15745, 15744),
]


@pytest.mark.parametrize("op, ins, body, tail", TORCH_OPS, ids=[t[0] for t in TORCH_OPS])
def test_each_op_is_torchs_in_the_body_and_the_tail(op, ins, body, tail):
    args = [from_bits(b) for b in ins]
    out = {"lerp": lambda a, b: L.lerp(a, b, 0.9),
           "addcmul": lambda a, b, c: L.addcmul(a, b, c, 0.37),
           "addcdiv": lambda a, b, c: L.addcdiv(a, b, c, -0.37),
           "add": lambda a, b: L.add(a, b, alpha=0.37)}[op](*args)
    assert out.dtype == BF16 and out.shape == (33,)
    assert int(bits(out)[0]) == body and int(bits(out)[32]) == tail
    assert (bits(out)[:32] == body).all()  # every body element alike: tail = numel % 32


def test_scalars_kept_in_float32_except_add():
    # torch 2.13: bf16 [3].mul_(1 + 3*2**-9) -> 3.015625 (the scalar in float32; rounded to
    # bfloat16 first it would give 3.03125); bf16 [1].add_(2**-8 + 2**-17) -> 1.0 (the
    # scalar rounded to bfloat16 first, a tie to even; in float32 it would give 1 + 2**-7)
    assert float(L.mul_s(np.array([3.0], BF16), 1 + 3 * 2.0**-9)[0]) == 3.015625
    assert float(L.add_s(np.array([1.0], BF16), 2.0**-8 + 2.0**-17)[0]) == 1.0


def _golden(case_id):
    return {e["id"]: e for e in conformance.load_manifest()}[case_id]


def test_replay_is_not_vacuous_without_the_tail(monkeypatch):
    # the recorded SGD trajectory needs the scalar tail's rounding of b*alpha
    monkeypatch.setattr(L, "TAIL_LANES", 10**9)
    r = conformance.replay(_golden("torch/sgd_loop_bf16"), backend="reference")
    assert not r.passed and r.max_ulp >= 1


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_adam_bf16_state_is_bf16_and_matches_the_ops(backend):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(37).astype(BF16)
    g = (rng.standard_normal(37) * 0.1).astype(BF16)
    w0 = w.copy()
    opt = refopt.Adam(learning_rate=0.01, epsilon=1e-8, weight_decay=0.05,
                      convention="torch", backend=backend)
    opt.apply_gradients([(g, w)])
    m, v = opt.get_slot(w, "m"), opt.get_slot(w, "v")
    assert w.dtype == m.dtype == v.dtype == BF16
    z = np.zeros(37, BF16)
    p, m1, v1, _ = L.adam(w0, g, z, z, None, learning_rate=0.01, beta_1=0.9, beta_2=0.999,
                          epsilon=1e-8, step=1, weight_decay=0.05)
    assert (bits(w) == bits(p)).all() and (bits(m) == bits(m1)).all()
    assert (bits(v) == bits(v1)).all()
    assert (bits(w) != bits(w0)).any()


def test_maximize_is_the_negated_gradient():
    g = np.array([0.3, -2.0, 7.0], BF16)
    out = []
    for maximize, grad in ((True, g), (False, -g)):
        w = np.array([1.0, -0.5, 0.25], BF16)
        opt = refopt.SGD(learning_rate=0.1, momentum=0.9, convention="torch",
                         maximize=maximize)
        for _ in range(3):
            opt.apply_gradients([(grad, w)])
        out.append(bits(w).copy())
    assert (out[0] == out[1]).all()


@pytest.mark.parametrize("make, match", [
    (lambda: refopt.Ftrl(convention="tf_keras"), r"'tf_keras'"),  # TF's pow (bf16_more)
    (lambda: refopt.Adam(convention="keras3", weight_decay=0.1), r"'keras3'.*weight decay"),
    (lambda: refopt.Adam(convention="keras2"), r"'keras2'"),
    (lambda: refopt.RMSprop(learning_rate=0.1, convention="optax", clipvalue=0.5),
     r"'optax'"),
    (lambda: refopt.Adam(convention="optax_jit_step", amsgrad=True), r"'optax_jit_step'"),
    (lambda: refopt.Adafactor(convention="torch"), r"Adafactor under convention='torch'"),
    (lambda: refopt.Adam(convention="torch", clipnorm=1.0), r"clipping"),
    (lambda: refopt.SGD(convention="torch", use_ema=True), r"EMA"),
    (lambda: refopt.Adagrad(convention="torch_fused"), r"'torch_fused'"),
], ids=["tf_keras", "keras3", "keras2", "optax", "optax_amsgrad", "adafactor", "clip", "ema",
        "fused_adagrad"])
def test_not_reproduced_is_refused_and_changes_nothing(make, match):
    w = np.array([1.0, 2.0], BF16)
    before = bits(w).copy()
    opt = make()
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16.*" + match):
        opt.apply_gradients([(np.ones(2, BF16), w)])
    assert not opt.built and opt.iterations == 0 and (bits(w) == before).all()


def test_sparse_gradient_refused_and_nothing_changes():
    w = np.array([[1.0, 2.0], [3.0, 4.0]], BF16)
    opt = refopt.Adagrad(learning_rate=0.1, convention="torch")
    opt.apply_gradients([(np.ones((2, 2), BF16), w)])
    before = bits(w).copy()
    acc = bits(opt.get_slot(w, "accumulator")).copy()
    g = IndexedSlices(np.ones((1, 2), BF16), np.array([1]), (2, 2))
    with pytest.raises(TypeError, match="IndexedSlices.*to_dense"):
        opt.apply_gradients([(g, w)])
    assert opt.iterations == 1 and (bits(w) == before).all()
    assert (bits(opt.get_slot(w, "accumulator")) == acc).all()


def test_a_convention_with_a_knob_changed_is_refused():
    from refopt.conventions import get_convention

    w = np.array([1.0, 2.0], BF16)
    # the preset itself (a knob set to its own value) is taken
    refopt.SGD(convention=get_convention("torch", low_precision_compute="dtype")).build([w])
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16.*not reproduced"):
        refopt.SGD(convention=get_convention("keras3", learning_rate_cast="dtype")).build([w])


@pytest.mark.parametrize("case_id", ["keras3/sgd_momentum_bf16", "optax_jit_step/adam_bf16"])
def test_cuda_takes_its_host_step_with_the_golden_bits(case_id):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    if not kc.simulator and not kc.cuda.is_available():
        pytest.skip("no CUDA device")
    r = conformance.replay(_golden(case_id), backend="cuda")
    assert r.passed and r.max_ulp == 0
