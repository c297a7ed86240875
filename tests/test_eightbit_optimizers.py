"""refopt.Adam8bit, AdamW8bit, Lion8bit (issue 17 item 5): bitsandbytes' 8-bit optimizers on
the pipeline, replayed against bitsandbytes 0.50.2.

The golden files in conformance/bnb/ were recorded from bitsandbytes' own CPU optimizers by
conformance/generators/gen_bnb.py (never computed by refopt): after every step the parameter,
the uint8 codes and the block maxima. Here they are replayed through the classes, on every
backend, bit for bit.
"""

import doctest
import glob
import json
import os
import warnings

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt._mkl import mkl_available
from refopt.conventions import get_convention
from refopt.reference import eightbit as E

ROOT = os.path.join(os.path.dirname(__file__), os.pardir, "conformance", "bnb")
FILES = sorted(glob.glob(os.path.join(ROOT, "*.npz")))
SLOTS = {"state1": "m", "state2": "v", "absmax1": "m_absmax", "absmax2": "v_absmax"}


def _case(path):
    d = np.load(path)
    return d, json.loads(str(d["config"]))


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def _host(a):
    return a if isinstance(a, np.ndarray) else a.copy_to_host()


def _optimizer(cfg, backend, convention="torch"):
    kw = cfg["defaults"]
    args = {"learning_rate": kw["lr"], "beta_1": kw["betas"][0], "beta_2": kw["betas"][1],
            "weight_decay": kw["weight_decay"], "backend": backend, "convention": convention,
            "min_8bit_size": cfg["min_8bit_size"]}
    if not cfg["optimizer"].startswith("Lion"):
        args["epsilon"] = kw["eps"]
    return getattr(refopt, cfg["optimizer"])(**args)


def _replay(path, backend):
    """Replay a bitsandbytes case through the class; assert every recorded array's bits."""
    d, cfg = _case(path)
    lion = cfg["optimizer"].startswith("Lion")
    exact_param = lion or mkl_available()  # Adam's root is MKL's (torch's CPU sqrt)
    convention = "torch" if exact_param else get_convention("torch", sqrt="ieee")
    opt = _optimizer(cfg, backend, convention)
    if backend == "cuda":
        from refopt.kernels import cuda as kc

        to_dev = kc.to_device
    else:
        to_dev = np.array
    p = to_dev(d["param0"])
    for t in range(1, cfg["steps"] + 1):
        assert opt.apply_gradients([(to_dev(d[f"grad/{t}"]), p)]) == t
        want = d[f"param/{t}"]
        if exact_param:
            assert np.array_equal(_bits(_host(p)), _bits(want)), t
        else:  # the IEEE root: within a few float32 ulp of values near 1
            np.testing.assert_allclose(_host(p), want, rtol=0, atol=2e-6)
        for key, name in SLOTS.items():
            if f"{key}/{t}" in d:
                got = _host(opt.get_slot(p, name))
                assert got.dtype == d[f"{key}/{t}"].dtype, (name, t)
                assert np.array_equal(_bits(got), _bits(d[f"{key}/{t}"])), (name, t)
            elif lion and name.startswith("v"):
                assert name not in opt.slot_names
    return opt


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("path", FILES, ids=lambda p: os.path.basename(p)[:-4])
def test_classes_replay_bitsandbytes_bit_identically(path, backend):
    opt = _replay(path, backend)
    _, cfg = _case(path)
    eight = cfg["n"] >= cfg["min_8bit_size"]
    p = opt._vars[0]
    assert opt.get_slot(p, "m").dtype == (np.uint8 if eight else np.float32)


@pytest.mark.parametrize("name", ["adam8bit_opts_f32", "lion8bit_f32",
                                  "lion8bit_nonfinite_f32"])
def test_cuda_backend_takes_the_host_step_with_the_same_bits(name):
    kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
    from refopt.executors.cuda import HostStepWarning

    if not (kc.simulator or kc.cuda.is_available()):
        pytest.skip("no GPU and no CUDA simulator")
    with pytest.warns(HostStepWarning):
        opt = _replay(os.path.join(ROOT, f"{name}.npz"), "cuda")
    assert sum(opt._state.fallbacks.values()) == opt.iterations


def test_every_bitsandbytes_case_is_replayed():
    assert sorted(os.path.basename(f)[:-4] for f in FILES) == [
        "adam8bit_f32", "adam8bit_nonfinite_f32", "adam8bit_nonfinite_small_f32",
        "adam8bit_opts_f32", "adam8bit_small_f32", "adamw8bit_f32", "lion8bit_f32",
        "lion8bit_nonfinite_f32", "lion8bit_nonfinite_small_f32", "lion8bit_opts_f32"]


# --------------------------------------------------------------------------- slots
def test_slot_layout_follows_min_8bit_size():
    big, small = np.ones(1000, np.float32), np.ones((3, 4), np.float32)
    opt = refopt.Adam8bit(min_8bit_size=500)
    opt.build([big, small])
    assert opt.slot_names == ("m", "v", "m_absmax", "v_absmax")
    for name in ("m", "v"):
        assert opt.get_slot(big, name).dtype == np.uint8 and opt.get_slot(big, name).shape == (1000,)
        assert opt.get_slot(small, name).dtype == np.float32
        assert opt.get_slot(small, name).shape == (3, 4)
        a = opt.get_slot(big, f"{name}_absmax")
        assert a.dtype == np.float32 and a.shape == (4,)  # ceil(1000 / 256)
        assert opt.get_slot(small, f"{name}_absmax").shape == (0,)
    lion = refopt.Lion8bit(min_8bit_size=500)
    lion.build([big])
    assert lion.slot_names == ("m", "m_absmax")
    assert lion.slot_dtype("m", (1000,), np.float32) == np.uint8
    assert lion.slot_dtype("m", (499,), np.float32) == np.float32


def test_dequantized_slot_is_the_codes_times_the_block_maxima():
    rng = np.random.default_rng(3)
    w = rng.standard_normal(600).astype(np.float32)
    g = (rng.standard_normal(600) * 10.0 ** rng.uniform(-3, 0, 600)).astype(np.float32)
    opt = refopt.Adam8bit(min_8bit_size=1)
    opt.apply_gradients([(g, w)])
    m = opt.dequantized_slot(w, "m")
    codes, absmax = opt.get_slot(w, "m"), opt.get_slot(w, "m_absmax")
    assert m.dtype == np.float32 and m.shape == w.shape
    assert np.array_equal(m, E.create_dynamic_map(True)[codes] * np.repeat(absmax, 256)[:600])
    # after one step m = 0.1 g exactly before quantization: within the map's resolution
    assert np.max(np.abs(m - np.float32(0.1) * g)) <= 0.05 * np.max(np.abs(g))
    v = opt.dequantized_slot(w, "v")
    assert np.all(v >= 0)
    with pytest.raises(KeyError, match="m_absmax"):
        opt.dequantized_slot(w, "m_absmax")


def test_state_memory_is_about_two_bytes_per_element():
    """Measured: 8-bit Adam keeps 2 bytes per element plus 8 per block of 256 (2.03), Lion
    1.02; float32 Adam 8, the 32-bit path under min_8bit_size 8."""
    n = 1_000_000
    w = np.zeros(n, np.float32)

    def per_element(opt):
        opt.build([w])
        return sum(opt.get_slot(w, s).nbytes for s in opt.slot_names) / n

    assert per_element(refopt.Adam8bit()) == (2 * n + 2 * 4 * 3907) / n  # 3907 blocks
    assert per_element(refopt.Lion8bit()) == (n + 4 * 3907) / n
    assert per_element(refopt.Adam(convention="torch")) == 8.0
    assert per_element(refopt.Adam8bit(min_8bit_size=n + 1)) == 8.0


def test_a_model_of_mixed_sizes_is_each_variable_on_its_own_path():
    """One optimizer over an 8-bit variable, a float32-path one, a 0-d and an empty one, one
    excluded from decay: each equals its own function trajectory, bit for bit."""
    rng = np.random.default_rng(5)
    shapes = [(20, 30), (7,), (), (0, 3)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    w = [a.copy() for a in init]
    opt = refopt.AdamW8bit(learning_rate=0.01, weight_decay=0.1, min_8bit_size=100,
                           convention=get_convention("torch", sqrt="ieee"))
    opt.exclude_from_weight_decay([w[1]])
    for gs in grads:
        opt.apply_gradients(zip(gs, w))
    for k, shape in enumerate(shapes):
        p = init[k]
        st = E.adam8bit_initial_state(p, min_8bit_size=100)
        for t, gs in enumerate(grads, start=1):
            p, st = E.adam8bit_update(p, gs[k], st, t, 0.01, weight_decay=0.0 if k == 1 else 0.1)
        assert np.array_equal(_bits(w[k]), _bits(p)), shape
        assert np.array_equal(_bits(opt.get_slot(w[k], "v")), _bits(st.state2)), shape
    assert opt.get_slot(w[0], "m").dtype == np.uint8
    assert opt.get_slot(w[1], "m").dtype == np.float32


@pytest.mark.parametrize("cls", [refopt.Adam8bit, refopt.Lion8bit], ids=lambda c: c.__name__)
def test_backends_agree_with_the_pipeline_options(cls):
    """Clipping, EMA and decay around the 8-bit update: cpu and the CUDA simulator give the
    reference's bits (variables and every slot)."""
    rng = np.random.default_rng(0)
    shapes = [(30, 20), (7,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    backends = ["reference", "cpu"]
    try:
        from refopt.kernels import cuda as kc

        if kc.simulator or kc.cuda.is_available():
            backends.append("cuda")
    except ImportError:
        pass
    results = []
    for backend in backends:
        dev = kc.to_device if backend == "cuda" else np.array
        opt = cls(learning_rate=0.01, weight_decay=0.1, min_8bit_size=100, global_clipnorm=0.5,
                  use_ema=True, backend=backend)
        w = [dev(a) for a in init]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cuda's HostStepWarning
            for gs in grads:
                opt.apply_gradients(zip([dev(g) for g in gs], w))
        results.append(([_bits(_host(v)).tolist() for v in w],
                        [_bits(_host(opt.get_slot(v, s))).tolist()
                         for v in w for s in opt.slot_names]))
    assert all(r == results[0] for r in results[1:])
    assert _host(opt.get_slot(w[0], "m")).dtype == np.uint8


# --------------------------------------------------------------------------- failures
def _snapshot(opt, variables):
    return ([_bits(v).tolist() for v in variables],
            {s: [_bits(opt.get_slot(v, s)).tolist() for v in variables] for s in opt.slot_names},
            opt.iterations, list(opt._var_steps))


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_a_raising_step_changes_nothing(backend):
    rng = np.random.default_rng(2)
    w = [rng.standard_normal(300).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    opt = refopt.Adam8bit(learning_rate=0.01, weight_decay=0.1, min_8bit_size=10,
                          backend=backend)
    opt.apply_gradients([(np.ones(300, np.float32), w[0]), (np.ones(5, np.float32), w[1])])
    before = _snapshot(opt, w)
    sparse = IndexedSlices(np.ones((2,), np.float32), [0, 3], (5,))
    with pytest.raises(TypeError, match="dense gradients only.*IndexedSlices"):
        # the first variable is computed before the second raises: nothing is committed
        opt.apply_gradients([(np.ones(300, np.float32), w[0]), (sparse, w[1])])
    assert _snapshot(opt, w) == before
    with pytest.raises(TypeError, match="dtype"):
        opt.apply_gradients([(np.ones(300, np.float64), w[0])])
    with pytest.raises(ValueError, match="shape"):
        opt.apply_gradients([(np.ones(300, np.float32), w[0]), (np.ones(4, np.float32), w[1])])
    assert _snapshot(opt, w) == before
    # a state of the wrong dtype is refused whole, naming the slot
    sd = opt.state_dict()
    sd["slots"]["m"][0] = sd["slots"]["m"][0].astype(np.float32)
    with pytest.raises(ValueError, match=r"slots'\]\['m'\]\[0\].*float32.*uint8"):
        opt.load_state_dict(sd)
    assert _snapshot(opt, w) == before


def test_non_float32_variables_are_refused_at_build_and_nothing_is_built():
    opt = refopt.Lion8bit()
    w = np.ones(10, np.float64)
    with pytest.raises(TypeError, match=r"Lion8bit takes float32.*var_list\[0\] of dtype float64"):
        opt.apply_gradients([(np.ones(10, np.float64), w)])
    assert not opt.built and opt.iterations == 0
    w16 = np.ones(10, np.float16)
    with pytest.raises(TypeError, match="float16"):
        opt.build([w16])
    assert not opt.built


def test_bad_hyperparameters_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match=r"Adam8bit.*convention='torch'.*convention='keras3'"):
        refopt.Adam8bit(convention="keras3")
    with pytest.raises(ValueError, match=r"Lion8bit.*convention='optax'"):
        refopt.Lion8bit(convention="optax")
    with pytest.raises(ValueError, match=r"beta_2.*\[0, 1\).*Received: beta_2=1\.0"):
        refopt.Lion8bit(beta_2=1.0)
    with pytest.raises(ValueError, match=r"epsilon.*Received: epsilon=-1"):
        refopt.AdamW8bit(epsilon=-1)
    with pytest.raises(ValueError, match=r"min_8bit_size.*Received: min_8bit_size=True"):
        refopt.Adam8bit(min_8bit_size=True)
    with pytest.raises(ValueError, match="amsgrad=True"):
        refopt.AdamW8bit(amsgrad=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'percentile_clipping'"):
        refopt.Adam8bit(percentile_clipping=100)  # not a keyword of bitsandbytes 0.50.2
    with pytest.raises(TypeError, match="unexpected keyword argument 'epsilon'"):
        refopt.Lion8bit(epsilon=1e-8)


def test_defaults_are_bitsandbytes_defaults():
    for cls, lr, betas, wd in ((refopt.Adam8bit, 1e-3, (0.9, 0.999), 0.0),
                               (refopt.AdamW8bit, 1e-3, (0.9, 0.999), 1e-2),
                               (refopt.Lion8bit, 1e-4, (0.9, 0.99), 0.0)):
        opt = cls()
        assert (opt.learning_rate, opt.beta_1, opt.beta_2, opt.weight_decay) == (lr, *betas, wd)
        assert opt.min_8bit_size == 4096 and opt.convention.name == "torch"
        if cls is not refopt.Lion8bit:
            assert opt.epsilon == 1e-8


# --------------------------------------------------------------------------- config, checkpoints
def test_config_round_trip():
    for opt in (refopt.Adam8bit(learning_rate=0.02, beta_1=0.8, epsilon=1e-6, min_8bit_size=7,
                                clipnorm=1.0),
                refopt.Lion8bit(weight_decay=0.5, min_8bit_size=0, use_ema=True)):
        config = opt.get_config()
        assert config["min_8bit_size"] == opt.min_8bit_size
        clone = type(opt).from_config(config)
        assert clone.get_config() == config


def test_checkpoint_resumes_bit_identically_across_backends(tmp_path):
    rng = np.random.default_rng(9)
    shapes = [(40, 10), (6,)]
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(4)]

    def make(backend):
        return refopt.AdamW8bit(learning_rate=0.01, min_8bit_size=100, use_ema=True,
                                backend=backend)

    straight, w = make("reference"), [a.copy() for a in init]
    for gs in grads:
        straight.apply_gradients(zip(gs, w))
    first, w1 = make("cpu"), [a.copy() for a in init]
    for gs in grads[:2]:
        first.apply_gradients(zip(gs, w1))
    refopt.save_checkpoint(tmp_path / "run.npz", first, w1)
    opt2, w2 = refopt.load_checkpoint(tmp_path / "run.npz", backend="reference")
    assert type(opt2) is refopt.AdamW8bit and opt2.get_slot(w2[0], "m").dtype == np.uint8
    assert _snapshot(opt2, w2) == _snapshot(first, w1)
    for gs in grads[2:]:
        opt2.apply_gradients(zip(gs, w2))
    assert _snapshot(opt2, w2) == _snapshot(straight, w)


def test_a_wrapper_checkpoints_its_8bit_inner_optimizer(tmp_path):
    """LossScaleOptimizer forwards slot_dtype: the file's uint8 codes load back."""
    w = [np.linspace(-1, 1, 300).astype(np.float32)]
    opt = refopt.LossScaleOptimizer(refopt.Adam8bit(learning_rate=0.01, min_8bit_size=10))
    assert opt.slot_dtype("v", (300,), np.float32) == np.uint8
    opt.apply_gradients([(np.full(300, 0.5, np.float32), w[0])])
    refopt.save_checkpoint(tmp_path / "ls.npz", opt, w)
    opt2, w2 = refopt.load_checkpoint(tmp_path / "ls.npz")
    assert type(opt2.inner_optimizer) is refopt.Adam8bit
    assert _snapshot(opt2, w2) == _snapshot(opt, w)
    assert opt2.get_slot(w2[0], "m").dtype == np.uint8


def test_inside_a_torch_loop_bitsandbytes_bits_and_resume():
    """refopt.torch with an 8-bit class: torch tensors updated in place with bitsandbytes'
    bits; torch's state_dict resumes bit for bit."""
    torch = pytest.importorskip("torch")
    import refopt.torch as rt

    d, cfg = _case(os.path.join(ROOT, "lion8bit_opts_f32.npz"))
    kw = cfg["defaults"]
    p = torch.nn.Parameter(torch.from_numpy(d["param0"].copy()))
    opt = rt.RefoptOptimizer([p], refopt.Lion8bit, lr=kw["lr"], beta_1=kw["betas"][0],
                             beta_2=kw["betas"][1], weight_decay=kw["weight_decay"])
    for t in range(1, 3):
        p.grad = torch.from_numpy(d[f"grad/{t}"].copy())
        opt.step()
        assert np.array_equal(_bits(p.detach().numpy()), _bits(d[f"param/{t}"]))
    q = torch.nn.Parameter(p.detach().clone())
    opt2 = rt.RefoptOptimizer([q], refopt.Lion8bit, lr=kw["lr"], beta_1=kw["betas"][0],
                              beta_2=kw["betas"][1], weight_decay=kw["weight_decay"])
    opt2.load_state_dict(opt.state_dict())
    q.grad = torch.from_numpy(d["grad/3"].copy())
    opt2.step()
    assert np.array_equal(_bits(q.detach().numpy()), _bits(d["param/3"]))


def test_docstring_examples_run():
    from refopt.optimizers import eightbit

    result = doctest.testmod(eightbit, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 3 and result.failed == 0


def test_no_warning_on_the_reference_path():
    w = np.ones(5000, np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        refopt.Lion8bit(backend="reference").apply_gradients([(np.ones(5000, np.float32), w)])
    assert np.all(w == np.float32(1) - np.float32(1e-4))
