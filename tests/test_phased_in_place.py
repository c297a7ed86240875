# The phased optimizers' in-place step on backend="cpu" (refopt.executors.cpu.
# try_in_place_step). Lamb (refopt.kernels.cpu.lamb.prepare_in_place): the reference's bits
# on the variables and both moments, at a size where every kernel runs in parallel and the
# two norms on two threads, and the all-or-nothing fall-back to the staged step.
# tests/test_lamb_adafactor_fast.py covers the small shapes (0-d, 2-d, 3-d) with weight decay.
import numpy as np
import pytest
from test_properties import assert_bits_equal

import refopt
from refopt.kernels.cpu import lamb as cpu_lamb

BIG = (1 << 17) + 13  # parallel kernels and norms; not a multiple of the packets' lanes


def _pairs(dtypes, sizes, steps, seed):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(n).astype(dt) for dt, n in zip(dtypes, sizes)]
    grads = [[(rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 1)).astype(dt)
              for dt, n in zip(dtypes, sizes)] for _ in range(steps)]
    grads[-1][0][5] = np.inf  # a non-finite gradient element: NaN norms, as the frameworks
    return init, grads


def _run(backend, kw, dtypes, sizes, steps=3, seed=0):
    init, grads = _pairs(dtypes, sizes, steps, seed)
    opt = refopt.Lamb(backend=backend, **kw)
    ws = [a.copy() for a in init]
    for row in grads:
        opt.apply_gradients(list(zip(row, ws)))
    return ws, [[opt.get_slot(w, s) for w in ws] for s in ("m", "v")]


@pytest.fixture
def spy(monkeypatch):
    ran = []  # one entry per in-place step of one variable that was run
    real = cpu_lamb.prepare_in_place

    def prepare(*args, **kw):
        run = real(*args, **kw)
        if run is None:
            return None

        def counted():
            run()
            ran.append(args[0].size)

        return counted

    monkeypatch.setattr(cpu_lamb, "prepare_in_place", prepare)
    return ran


@pytest.mark.parametrize("kw", [
    {"convention": "keras3", "learning_rate": 0.05},
    {"convention": "keras3", "learning_rate": 0.05, "weight_decay": 0.01},
    {"convention": "optax", "learning_rate": 0.05, "eps_root": 1e-9, "weight_decay": 0.01},
], ids=["keras3", "keras3-decay", "optax-decay"])
def test_in_place_step_is_the_reference(kw, spy):
    # two variables of one dtype (the scratch reused, then grown) and one of the other
    dtypes, sizes = (np.float32, np.float32, np.float64), (37, BIG, BIG)
    got_w, got_s = _run("cpu", kw, dtypes, sizes)
    assert spy == list(sizes) * 3  # every variable of every step took the in-place step
    want_w, want_s = _run("reference", kw, dtypes, sizes)
    for i, (a, e) in enumerate(zip(got_w, want_w)):
        assert_bits_equal(a, e, f"{kw} param {i}")
    for name, got, want in zip("mv", got_s, want_s):
        for i, (a, e) in enumerate(zip(got, want)):
            assert_bits_equal(a, e, f"{kw} {name} {i}")
    # the inf gradient element makes the direction's norm NaN: a ratio of 1 under Keras 3
    # (its test is ``> 0``), NaN everywhere under optax (``== 0``)
    nan = np.isnan(got_w[0])
    assert nan.all() if kw["convention"] == "optax" else np.flatnonzero(nan).tolist() == [5]


@pytest.mark.parametrize("kw,dtypes", [
    ({"convention": "keras3", "clipnorm": 1.0}, (np.float32, np.float32)),  # clipping
    ({"convention": "keras3"}, (np.float32, np.float16)),  # one variable not for it
], ids=["clipnorm", "float16"])
def test_staged_step_when_not_in_place(kw, dtypes, spy):
    sizes = (BIG, 9)
    got_w, got_s = _run("cpu", kw, dtypes, sizes, steps=2, seed=1)
    assert spy == []  # the whole step was staged: nothing was run in place
    want_w, want_s = _run("reference", kw, dtypes, sizes, steps=2, seed=1)
    for a, e in zip(got_w + got_s[0] + got_s[1], want_w + want_s[0] + want_s[1]):
        assert_bits_equal(a, e, f"{kw}")


def test_prepare_in_place_checks_before_writing():
    w = np.ones(10, np.float32)
    m, v = np.zeros_like(w), np.zeros_like(w)
    kw = {"learning_rate": 0.1, "beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "step": 0}
    with pytest.raises(ValueError, match="step"):
        cpu_lamb.prepare_in_place(w, np.ones_like(w), m, v, **kw)
    assert (w == 1).all() and not m.any() and not v.any()
    kw["step"] = 1
    assert cpu_lamb.prepare_in_place(w, np.ones(10, np.float16), m, v, **kw) is None
    assert cpu_lamb.prepare_in_place(w[::2], np.ones(5, np.float32), m[:5], v[:5],
                                     **kw) is None
    # an empty variable: nothing to write, and no error
    e = np.zeros(0, np.float32)
    cpu_lamb.prepare_in_place(e, e.copy(), e.copy(), e.copy(), **kw)()


# Adafactor's in-place step (refopt.kernels.cpu.adafactor.prepare_in_place): a vector (the
# unfactored moment updated in place by _direction_flat; torch's two norms at once) and a
# matrix (the factored moments) at sizes where the kernels run in parallel
@pytest.mark.parametrize("kw", [
    {"convention": "torch", "weight_decay": 0.1, "learning_rate": 0.05},
    {"convention": "keras3", "weight_decay": 0.01},
    {"convention": "tf_keras"},
    {"convention": "optax", "learning_rate": 0.1, "multiply_by_parameter_scale": True,
     "weight_decay": 0.01},
], ids=lambda kw: kw["convention"])
def test_adafactor_in_place_is_the_reference(kw, monkeypatch):
    from refopt.kernels.cpu import adafactor as cpu_af

    ran, flat = [], []
    real, real_flat = cpu_af.prepare_in_place, cpu_af._direction_flat

    def prepare(*args, **k):
        run = real(*args, **k)
        assert run is not None

        def counted():
            run()
            ran.append(args[0].shape)

        return counted

    def direction_flat(*args):
        flat.append(args[0].size)
        return real_flat(*args)

    monkeypatch.setattr(cpu_af, "prepare_in_place", prepare)
    monkeypatch.setattr(cpu_af, "_direction_flat", direction_flat)
    shapes = [(BIG,), (330, 400), (3,)]
    rng = np.random.default_rng(3)
    for dtype in (np.float32, np.float64):
        init = [rng.standard_normal(s).astype(dtype) for s in shapes]
        grads = [[(rng.standard_normal(s) * 0.1).astype(dtype) for s in shapes]
                 for _ in range(3)]
        out = {}
        for backend in ("cpu", "reference"):
            opt = refopt.Adafactor(backend=backend, **kw)
            ws = [a.copy() for a in init]
            for row in grads:
                opt.apply_gradients(list(zip(row, ws)))
            out[backend] = ws + [opt.get_slot(w, s) for s in opt.slot_names for w in ws]
        for i, (a, e) in enumerate(zip(out["cpu"], out["reference"])):
            assert_bits_equal(a, e, f"{kw} {dtype.__name__} array {i}")
    assert ran == shapes * 6  # every variable of every step, both dtypes, in place
    assert flat == [BIG, 3] * 6  # the vectors' moments updated in place (unfactored)
