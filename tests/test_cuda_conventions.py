"""backend="cuda" under every convention: the rule drivers against the reference, bit for bit.

Runs on numba's CUDA simulator (``tests/conftest.py``) or, with ``NUMBA_ENABLE_CUDASIM=0``, on
a GPU (the same assertions). Launches are tiny (4 threads per block, 2 items per thread, 3
tensors per launch) so a few small variables already span several blocks, chunks and
launches; sizes 13 and 15 cross PyTorch's scalar tail (8 float32 / 4 float64 lanes).

Compared after every step, bit for bit (NaN positions, not NaN bits): every variable, every
slot and EMA average, the counter. Norm clipping is bit-identical too: the sums of squares
are NumPy's pairwise sums, leaves on the device and the tree on the host
(:func:`refopt.kernels.cuda.drivers.sums_of_squares`).
"""

import warnings

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices
from refopt import reference as R
from refopt.conventions import get_convention

kc = pytest.importorskip("refopt.kernels.cuda", reason="numba-cuda is not installed")
pytestmark = pytest.mark.skipif(not kc.simulator and not kc.cuda.is_available(),
                                reason="needs numba's CUDA simulator or an NVIDIA GPU")

from refopt.kernels.cuda import drivers  # noqa: E402
from refopt.executors import cuda as _cuda  # noqa: E402

F16, F32, F64 = np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64)
# "torch_fused": the rule drivers' torch forms ("torch", the for-loop, takes MKL's sqrt in
# Adam: the host step, tests/test_torch_loop.py)
CONVENTIONS = ("tf_keras", "keras3", "keras2", "tf1", "torch_fused", "optax")
HAS_EMA = ("tf_keras", "keras3", "torch_fused")
HAS_ADAMW = ("tf_keras", "keras3", "torch_fused", "optax")


def _rules(conv):
    """torch_fused's for-loop optimizers (SparseAdam, RMSprop) with IEEE's root: MKL's is the
    host step (tests/test_torch_loop.py); the rule drivers' torch forms otherwise."""
    return get_convention(conv, sqrt="ieee") if conv == "torch_fused" else conv


@pytest.fixture(autouse=True)
def small_launches(monkeypatch):
    monkeypatch.setattr(kc.config, "THREADS_PER_BLOCK", 4)
    monkeypatch.setattr(kc.config, "ITEMS_PER_THREAD", 2)
    monkeypatch.setattr(kc.config, "TENSORS_PER_LAUNCH", 3)


def assert_bits(actual, expected, what=""):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan, err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(actual[~nan], expected[~nan], err_msg=what)


def _grads(rng, shapes, dtypes, sparse_at=None):
    host = [rng.standard_normal(s).astype(dt) for s, dt in zip(shapes, dtypes)]
    dev = [kc.to_device(g) for g in host]
    # duplicate rows, summed after clipping; sparse_at: a position, or a tuple of them
    for k in (() if sparse_at is None else
              sparse_at if isinstance(sparse_at, tuple) else (sparse_at,)):
        vals = rng.standard_normal((4,) + shapes[k][1:]).astype(dtypes[k])
        g = IndexedSlices(vals, np.array([4, 0, 4, 1]) % shapes[k][0], shapes[k])
        host[k] = dev[k] = g
    return host, dev


def run_both(cls, kw, *, dtypes, shapes=((13,), (5, 3), (2,)), steps=3, sparse_at=None,
             skip_at=None, exclude=False, seed=0):
    """The same steps on the reference and on cuda; compares everything after each step.

    ``skip_at``: the variable without a gradient in step 2 (PyTorch's per-variable counts,
    Keras 3's and AveragedModel's EMA of every variable). Returns the cuda optimizer.
    """
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(dt) for s, dt in zip(shapes, dtypes)]
    ref = cls(backend="reference", **kw)
    dev = cls(backend="cuda", **kw)
    hv = [x.copy() for x in init]
    dv = [kc.to_device(x) for x in init]
    if exclude:
        ref.exclude_from_weight_decay([hv[0]])
        dev.exclude_from_weight_decay([dv[0]])
    for t in range(steps):
        rg, dg = _grads(rng, shapes, dtypes, sparse_at)
        if skip_at is not None and t == 1:
            rg[skip_at] = dg[skip_at] = None
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Gradients do not exist")
            ref.apply_gradients(zip(rg, hv))
            assert dev.apply_gradients(zip(dg, dv)) == t + 1
        for k, (h, d) in enumerate(zip(hv, dv)):
            assert_bits(d.copy_to_host(), h, f"step {t} variable {k}")
            for name in dev.slot_names:
                assert_bits(dev.get_slot(d, name).copy_to_host(), ref.get_slot(h, name),
                            f"step {t} variable {k} slot {name}")
    assert dev._var_steps == ref._var_steps
    return dev


def _cases(conv):
    cases = [("Adam", refopt.Adam, {}), ("AMSGrad", refopt.Adam, dict(amsgrad=True)),
             ("SGD-momentum", refopt.SGD, dict(momentum=0.9)),
             ("SGD-nesterov", refopt.SGD, dict(momentum=0.9, nesterov=True)),
             ("LazyAdam", refopt.LazyAdam, {})]
    if conv in HAS_ADAMW:
        cases.append(("AdamW", refopt.AdamW, dict(weight_decay=0.05)))
    if conv == "torch_fused":
        cases.append(("SGD-plain", refopt.SGD, {}))
    return cases


MATRIX = [(conv, name, cls, kw) for conv in CONVENTIONS for name, cls, kw in _cases(conv)]


@pytest.mark.parametrize("conv,name,cls,kw", MATRIX,
                         ids=[f"{c}-{n}" for c, n, _, _ in MATRIX])
def test_every_convention_matches_the_reference_bit_for_bit(conv, name, cls, kw):
    sparse = 1 if cls is refopt.LazyAdam else None
    if sparse and get_convention(conv).lazy_update == "torch_sparse":
        sparse = (0, 1, 2)  # torch's SparseAdam refuses dense gradients
    ema = dict(use_ema=True, ema_overwrite_frequency=2) if conv in HAS_EMA else {}
    # float32 with per-tensor norm clipping (and the EMA), float64 with global norm
    # clipping, mixed float32/float64 with value clipping; a variable without a gradient in
    # step 2; the lazy optimizers with a sparse gradient with duplicate rows.
    variants = [((F32, F32, F32), dict(clipnorm=0.5, **ema)),
                ((F64, F64, F64), dict(global_clipnorm=0.7)),
                ((F32, F64, F32), dict(clipvalue=0.3, **ema))]
    for dtypes, extra in variants:
        if sparse and conv == "keras3":  # Keras 3's raw duplicate slices are the host's
            conv = get_convention(conv, keras3_sparse_square=False)
        dev = run_both(cls, dict(learning_rate=0.01, convention=_rules(conv), **kw, **extra),
                       dtypes=dtypes, sparse_at=sparse, skip_at=2)
        assert dev._state.fallbacks == {}, dev._state.fallbacks  # all on the rule drivers


@pytest.mark.parametrize("conv", CONVENTIONS + ("torch",))
def test_float16_under_every_convention(conv):
    for cls, kw in ((refopt.Adam, dict(amsgrad=True, clipnorm=0.5)),
                    (refopt.SGD, dict(momentum=0.9, nesterov=True))):
        dev = run_both(cls, dict(learning_rate=0.01, convention=conv, **kw),
                       dtypes=(F16, F16, F16), steps=2)
        # PyTorch's fused Adam computes float16 in float32 and rounds once
        # (low_precision_compute="float32", refopt.precision); its for-loop ("torch") rounds
        # each torch op once (refopt.reference.bf16's op model; Adam also takes MKL's
        # sqrt): the host step, the reference's numbers, which are torch's (golden cases
        # torch/*_f16, tests/test_f16_loop.py)
        want = {}
        if conv == "torch_fused" and cls is refopt.Adam:
            want = {"float16 computed in float32 (refopt.precision)": 2}
        elif conv == "torch" and cls is refopt.Adam:
            want = {"MKL's sqrt (torch's for-loop path, convention knob sqrt) has no device "
                    "form": 2}
        elif conv == "torch":
            want = {"float16 computed op by op as torch's for-loop (refopt.reference.bf16)": 2}
        assert dev._state.fallbacks == want


@pytest.mark.parametrize("conv", ["tf_keras", "keras3", "torch_fused"])
def test_weight_decay_forms_with_exclusions(conv):
    # Keras' decoupled decay, PyTorch's L2 term (fma into the gradient) and AdamW's factor;
    # an excluded variable in the same launch.
    for cls, kw in ((refopt.Adam, dict(weight_decay=0.1)), (refopt.AdamW, {}),
                    (refopt.SGD, dict(momentum=0.5, weight_decay=0.1))):
        dev = run_both(cls, dict(learning_rate=0.05, convention=conv, **kw),
                       dtypes=(F32, F32, F64), exclude=True, steps=2)
        assert dev._state.fallbacks == {}


def test_optax_adamw_with_exclusions_splits_the_rule_calls():
    # optax's decay is inside the update: the excluded variables get their own rule call
    # without it (the host plan alone would refuse the step).
    dev = run_both(refopt.AdamW, dict(learning_rate=0.05, weight_decay=0.1, amsgrad=True,
                                      convention="optax"),
                   dtypes=(F32, F32, F32), exclude=True)
    assert dev._state.fallbacks == {}


@pytest.mark.parametrize("mu", [0.99, 0.2])
def test_torch_ema_lerp_branches_and_every_variable_averaged(mu):
    # AveragedModel: the first update copies, then lerp as one FMA with |w| < 0.5 (mu 0.99)
    # or >= 0.5 (mu 0.2); every built variable is averaged, with or without a gradient.
    run_both(refopt.Adam, dict(learning_rate=0.01, convention="torch_fused", use_ema=True,
                               ema_momentum=mu), dtypes=(F32, F64, F32), skip_at=0, steps=4)


def test_keras3_averages_start_at_zero_on_cuda():
    w = kc.to_device(np.array([1.0, 2.0], np.float32))
    opt = refopt.Adam(0.1, convention="keras3", use_ema=True, backend="cuda")
    opt.build([w])
    assert (opt.get_slot(w, "average").copy_to_host() == 0).all()
    ref = refopt.Adam(0.1, convention="keras3", use_ema=True)
    ref.build([np.array([1.0, 2.0], np.float32)])
    assert (ref.get_slot(ref._vars[0], "average") == 0).all()


def test_torch_per_variable_steps_take_one_launch_per_step_value(monkeypatch):
    from test_cuda_optimizers import wrap_rule_kernels

    launches = []

    def count(kernel, name, ks):
        class Counted:
            def __getitem__(self, config):
                launches.append(name)
                return kernel[config]
        return Counted()

    wrap_rule_kernels(monkeypatch, count)
    rng = np.random.default_rng(3)
    ws = [kc.to_device(rng.standard_normal(4).astype(np.float32)) for _ in range(2)]
    opt = refopt.Adam(0.01, convention="torch_fused", backend="cuda")
    opt.build(ws)
    opt.apply_gradients([(kc.to_device(np.ones(4, np.float32)), ws[0])])
    assert launches == ["dense"]
    opt.apply_gradients([(kc.to_device(np.ones(4, np.float32)), w) for w in ws])
    assert opt._var_steps == [2, 1] and launches == ["dense"] * 3  # steps 2 and 1: two


@pytest.mark.filterwarnings("ignore::refopt.executors.cuda.HostStepWarning")
@pytest.mark.parametrize("conv,cls,kw,host", [
    ("tf_keras", refopt.Adam, dict(amsgrad=True, weight_decay=0.1, use_ema=True), False),
    ("tf_keras", refopt.SGD, dict(momentum=0.9, nesterov=True, weight_decay=0.1), False),
    ("keras3", refopt.Adam, dict(use_ema=True), True),        # raw duplicate slices: host
    (get_convention("keras3", keras3_sparse_square=False), refopt.Adam, dict(use_ema=True),
     False),                                                  # densified
    ("keras3", refopt.SGD, dict(momentum=0.9), False),        # tf-keras' whole-table SGD
    ("tf1", refopt.SGD, dict(momentum=0.9, nesterov=True), False),  # lazy rows
    ("torch", refopt.SGD, dict(momentum=0.9), True),  # torch's sparse buffer: host step
    ("optax", refopt.SGD, dict(momentum=0.9, nesterov=True), False),
    # SparseAdam rows (with IEEE's sqrt: MKL's is the host step); sparse gradients only
    (get_convention("torch", sqrt="ieee"), refopt.LazyAdam, dict(weight_decay=None), False),
    ("tf1", refopt.Adam, dict(amsgrad=True), True),           # TF1's scatter: host path
    ("keras2", refopt.Adam, {}, True),                        # Keras 2's scatter: host path
], ids=lambda v: getattr(v, "__name__", None) if isinstance(v, type) else None)
def test_sparse_gradients_under_each_convention(conv, cls, kw, host):
    sparse_at = 1
    if cls is refopt.LazyAdam and get_convention(conv).lazy_update == "torch_sparse":
        sparse_at = (0, 1, 2)  # torch's SparseAdam refuses dense gradients
    dev = run_both(cls, dict(learning_rate=0.05, convention=conv, clipnorm=0.8, **kw),
                   dtypes=(F32, F32, F64), sparse_at=sparse_at)
    assert bool(dev._state.fallbacks) == host, dev._state.fallbacks


@pytest.mark.parametrize("conv", ["torch", "optax"])
def test_frameworks_without_sparse_adam_raise_the_references_error(conv):
    errors = []
    for backend, to in (("reference", np.asarray), ("cuda", kc.to_device)):
        w = to(np.ones((3, 2), np.float32))
        opt = refopt.Adam(0.1, convention=conv, backend=backend)
        opt.apply_gradients([(to(np.ones((3, 2), np.float32)), w)])
        with pytest.raises(TypeError) as info:
            opt.apply_gradients([(IndexedSlices(np.ones((1, 2), np.float32), [1], (3, 2)), w)])
        errors.append(str(info.value))
        host = w if backend == "reference" else w.copy_to_host()
        assert opt.iterations == 1 and np.array_equal(host, np.asarray(to(host)))
    assert errors[0] == errors[1]


def test_keras2_several_clips_take_the_host_path_once_warned():
    for conv in ("keras2", "tf1"):
        with pytest.warns(_cuda.HostStepWarning, match="several clips"):
            dev = run_both(refopt.Adam, dict(learning_rate=0.05, convention=conv,
                                             clipvalue=0.3, clipnorm=0.5),
                           dtypes=(F32, F32, F32))
        assert dev._state.fallbacks == {"Keras 2's several clips in sequence": 3}


@pytest.mark.filterwarnings("ignore::refopt.executors.cuda.HostStepWarning")
def test_a_rule_less_subclass_takes_the_host_path():
    class Halved(refopt.SGD):
        def _update_step(self, param, grad, slots, learning_rate, step, **kw):
            return super()._update_step(param, grad * param.dtype.type(0.5), slots,
                                        learning_rate, step, **kw)

    dev = run_both(Halved, dict(learning_rate=0.1, momentum=0.9), dtypes=(F32, F64, F32))
    assert set(dev._state.fallbacks) == {"Halved has no rule (update_rule)"}


@pytest.mark.parametrize("conv", CONVENTIONS)
def test_rmsprop_runs_on_the_rule_drivers(conv):
    # TF1's velocity starts at one on the device too (the optimizer's slot initial value).
    for kw in (dict(), dict(centered=True, momentum=0.9)):
        dev = run_both(refopt.RMSprop, dict(learning_rate=0.01, convention=_rules(conv), **kw),
                       dtypes=(F32, F64, F32), steps=2)
        assert dev._state.fallbacks == {}


def test_rmsprop_mirror_function_is_the_references():
    rng = np.random.default_rng(5)
    for conv in CONVENTIONS:
        for dt in (F16, F32, F64):
            p, g = (rng.standard_normal(13).astype(dt) for _ in range(2))
            v = np.abs(rng.standard_normal(13)).astype(dt)
            b, a = rng.standard_normal(13).astype(dt), (rng.standard_normal(13) / 8).astype(dt)
            kw = dict(learning_rate=0.01, rho=0.9, momentum=0.9, epsilon=1e-7, centered=True,
                      convention=conv)
            want = R.rmsprop_update(p, g, v, b, a, **kw)
            got = kc.rmsprop_update(p, g, v, b, a, **kw)
            for x, y in zip(got, want):
                assert_bits(x, y, f"{conv} {dt}")
    with pytest.raises(ValueError, match="momentum_buf"):
        kc.rmsprop_update(p, g, v, learning_rate=0.1, rho=0.9, momentum=0.9, epsilon=1e-7,
                          centered=False)


@pytest.mark.parametrize("dtype", [F16, F32, F64])
@pytest.mark.parametrize("half", [False, True])
def test_sums_of_squares_are_numpys_pairwise_sums(dtype, half):
    rng = np.random.default_rng(7)
    shapes = [(0,), (1,), (7,), (8,), (13,), (128,), (129,), (3, 50), (1001,)]
    host = [(rng.standard_normal(s) * 3).astype(dtype) for s in shapes]
    got = drivers.sums_of_squares([kc.to_device(h) for h in host], dtype, half=half)
    hv = dtype.type(0.5)
    with np.errstate(all="ignore"):
        want = [dtype.type(np.sum(h * h * hv, dtype=dtype)) if half
                else np.sum(h * h, dtype=dtype) for h in host]
    assert got.dtype == dtype
    assert got.tobytes() == np.asarray(want, dtype).tobytes()


def test_pairwise_tree_follows_numpys_split():
    lo, n, _ = drivers.pairwise_tree(300)  # 300 -> 144 + 156 -> 72 + 72 + 72 + 84
    assert lo.tolist() == [0, 72, 144, 216] and n.tolist() == [72, 72, 72, 84]
    lo, n, _ = drivers.pairwise_tree(100)
    assert lo.tolist() == [0] and n.tolist() == [100]


def test_kernels_are_built_once_per_rule_flags_and_modes():
    run_both(refopt.Adam, dict(learning_rate=0.01, convention="optax"), dtypes=(F32,) * 3,
             steps=1)
    before = len(drivers._BUILT)
    run_both(refopt.Adam, dict(learning_rate=0.01, convention="optax"), dtypes=(F32,) * 3,
             steps=2)
    assert len(drivers._BUILT) == before


# The frameworks' own recorded trajectories (refopt.conformance), first steps, on cuda: the
# same verdict and the same worst ulp distance as the reference backend (which they are
# checked against in tests/test_conformance.py). One or two cases per framework.
GOLDEN = ["keras2/adam_sparse_f32", "keras2/clipvalue_clipnorm_f32", "keras3/ema_adam_f32",
          "keras3/adam_sparse_dup_f32", "tf1/lazyadam_f32", "tf1/momentum_nesterov_f32",
          "torch/adam_l2_fused_f32", "torch/sparseadam_f32", "torch/ema_f32",
          "optax/adamw_f32", "optax/clip_by_global_norm_nonfinite_f32",
          "tf_keras/global_clipnorm_nonfinite_f32"]


@pytest.mark.filterwarnings("ignore::refopt.executors.cuda.HostStepWarning")
@pytest.mark.parametrize("case", GOLDEN)
def test_recorded_framework_trajectories_replay_on_cuda(case):
    from refopt import conformance

    entry = next(e for e in conformance.load_manifest() if e["id"] == case)
    entry = dict(entry, steps=min(entry["steps"], 4))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        want = conformance.replay(entry)
        got = conformance.replay(entry, backend="cuda")
    assert got.passed == want.passed and got.max_ulp == want.max_ulp, got.detail


@pytest.mark.parametrize("conv", ["tf_keras", "torch_fused"])
def test_a_users_optimizer_with_a_rule_runs_on_the_drivers(conv):
    # The public extension point (tests/test_extension.py): slots starting at 0.1, a NumPy
    # update_step and a rule; sparse gradients are densified as the base class does.
    from test_extension import MyAdagrad, NumpyOnly

    ema = dict(use_ema=True) if conv in HAS_EMA else {}
    dev = run_both(MyAdagrad, dict(learning_rate=0.1, convention=conv, clipnorm=1.0, **ema),
                   dtypes=(F32, F64, F32), sparse_at=1, skip_at=2)
    assert dev._state.fallbacks == {}
    with pytest.warns(_cuda.HostStepWarning, match="NumpyOnly has no rule"):
        dev = run_both(NumpyOnly, dict(learning_rate=0.1, convention=conv),
                       dtypes=(F32, F64, F32), steps=2)
    assert sum(dev._state.fallbacks.values()) == 2
