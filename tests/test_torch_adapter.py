import copy
import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import refopt
import refopt.torch as rt

STEPS = 6


@pytest.fixture(autouse=True)
def reference_by_default(monkeypatch):
    # backend left out -> plain NumPy (no kernel compiles); the cpu backend is named explicitly
    monkeypatch.setenv("REFOPT_BACKEND", "reference")


def make_model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3).to(dtype)


def batch(dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 4, generator=g).to(dtype), torch.randn(8, 3, generator=g).to(dtype)


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def train(model, opt, steps=STEPS, scheduler=None, dtype=torch.float32):
    x, y = batch(dtype)
    for _ in range(steps):
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()
    return [p.detach().clone() for p in model.parameters()]


def train_numpy_copies(model, make_refopt, steps=STEPS, dtype=torch.float32, lrs=None):
    """The stateful refopt class on NumPy copies of the parameters; torch only computes the
    gradients (the copies are written back into the model before each forward)."""
    x, y = batch(dtype)
    params = list(model.parameters())
    copies = [p.detach().numpy().copy() for p in params]
    opt = make_refopt()
    for k in range(steps):
        with torch.no_grad():
            for p, c in zip(params, copies):
                p.copy_(torch.from_numpy(c))
        for p in params:
            p.grad = None
        loss_of(model, x, y).backward()
        if lrs is not None:
            opt.learning_rate = lrs[k]
        opt.apply_gradients([(p.grad.numpy().copy(), c) for p, c in zip(params, copies)])
    return [torch.from_numpy(c) for c in copies]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype
        assert torch.equal(x, y), (x - y).abs().max()


# --------------------------------------------------------------- same numbers as the classes
@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("convention", ["torch", "tf_keras"])
def test_adam_equals_stateful_refopt_on_numpy_copies(backend, convention):
    model = make_model()
    twin = copy.deepcopy(model)
    got = train(model, rt.Adam(model.parameters(), lr=1e-2, convention=convention,
                               backend=backend))
    want = train_numpy_copies(
        twin, lambda: refopt.Adam(learning_rate=1e-2, convention=convention, backend=backend))
    assert_same(got, want)


def test_params_updated_in_place_without_copy():
    model = make_model()
    ptrs = [p.data_ptr() for p in model.parameters()]
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    opt = rt.Adam(params, lr=1e-2, backend="cpu")
    train(model, opt, steps=1)
    assert [p.data_ptr() for p in params] == ptrs
    assert all(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    # the state shown to torch is refopt's live state
    m = opt.refopt_optimizers[0].get_slot(params[0], "m")
    assert np.shares_memory(opt.state[params[0]]["m"].numpy(), m)


# --------------------------------------------------------------- torch's own numbers
@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1}, {"amsgrad": True}])
def test_adam_equals_torch_adam_default_and_fused(dtype, kwargs, fused):
    # conformance: torch.optim.Adam's default for-loop path ("torch") and fused=True
    # ("torch_fused", chosen by the adapter's fused=True) are reproduced bit for bit
    model = make_model(dtype)
    twin = copy.deepcopy(model)
    opt = rt.Adam(model.parameters(), lr=1e-2, fused=fused, **kwargs)
    assert opt.refopt_optimizers[0].convention.name == ("torch_fused" if fused else "torch")
    got = train(model, opt, dtype=dtype)
    want = train(twin, torch.optim.Adam(twin.parameters(), lr=1e-2, fused=fused, **kwargs),
                 dtype=dtype)
    assert_same(got, want)


@pytest.mark.parametrize("name, kwargs, torch_kwargs", [
    ("AdamW", {"lr": 1e-2, "fused": True}, {}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True}, {}),
    ("Adamax", {"lr": 1e-2, "weight_decay": 0.1}, {}),
], ids=["AdamW", "SGD", "Adamax"])
def test_other_named_classes_equal_torch(name, kwargs, torch_kwargs):
    # conformance: fused AdamW, SGD and the for-loop Adamax are bit-identical (tolerance 0)
    model = make_model()
    twin = copy.deepcopy(model)
    got = train(model, getattr(rt, name)(model.parameters(), **kwargs))
    want = train(twin, getattr(torch.optim, name)(twin.parameters(), **kwargs, **torch_kwargs))
    assert_same(got, want)


def test_maximize_equals_torch():
    model = make_model()
    twin = copy.deepcopy(model)
    assert_same(train(model, rt.Adam(model.parameters(), lr=1e-2, maximize=True)),
                train(twin, torch.optim.Adam(twin.parameters(), lr=1e-2, maximize=True)))


def test_default_lr_and_filled_groups():
    model = make_model()
    opt = rt.Adam(model.parameters())
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["eps"], g["weight_decay"], g["amsgrad"]) == (
        1e-3, (0.9, 0.999), 1e-8, 0, False)
    tf = rt.Adam(make_model().parameters(), convention="tf_keras")
    assert tf.param_groups[0]["eps"] == 1e-7  # TF's default epsilon under tf_keras


# --------------------------------------------------------------- groups, schedulers, closure
def two_groups(model, lrs):
    return [{"params": [model.weight], "lr": lrs[0]},
            {"params": [model.bias], "lr": lrs[1], "betas": (0.8, 0.99)}]


def test_param_groups_with_their_own_hyperparameters():
    model = make_model()
    twin = copy.deepcopy(model)
    opt = rt.Adam(two_groups(model, (1e-2, 1e-1)))
    assert opt.refopt_optimizers[1].beta_1 == 0.8
    assert_same(train(model, opt),
                train(twin, torch.optim.Adam(two_groups(twin, (1e-2, 1e-1)))))


def test_add_param_group_later():
    model = make_model()
    twin = copy.deepcopy(model)
    results = []
    for m, make in ((model, lambda ps: rt.Adam(ps, lr=1e-2)),
                    (twin, lambda ps: torch.optim.Adam(ps, lr=1e-2))):
        opt = make([m.weight])
        train(m, opt, steps=2)
        opt.add_param_group({"params": [m.bias], "lr": 0.05})
        results.append(train(m, opt, steps=3))
    assert_same(*results)


def test_add_param_group_refused_leaves_optimizer_unchanged():
    model = make_model()
    opt = rt.Adam([model.weight], lr=1e-2)
    with pytest.raises(ValueError, match="beta_1"):
        opt.add_param_group({"params": [model.bias], "betas": (1.5, 0.999)})
    assert len(opt.param_groups) == 1 and len(opt.refopt_optimizers) == 1


@pytest.mark.parametrize("make_scheduler", [
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.3),
    lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda k: 1.0 / (k + 1)),
], ids=["StepLR", "LambdaLR"])
def test_lr_schedulers_drive_the_learning_rate(make_scheduler):
    model = make_model()
    twin = copy.deepcopy(model)
    opt = rt.Adam(model.parameters(), lr=0.05)
    got = train(model, opt, scheduler=make_scheduler(opt))
    topt = torch.optim.Adam(twin.parameters(), lr=0.05)
    assert_same(got, train(twin, topt, scheduler=make_scheduler(topt)))
    assert opt.param_groups[0]["lr"] == topt.param_groups[0]["lr"]


def test_scheduler_under_tf_keras_rounds_lr_to_float32():
    model = make_model()
    twin = copy.deepcopy(model)
    opt = rt.Adam(model.parameters(), lr=0.05, convention="tf_keras")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.3)
    lrs = []
    x, y = batch()
    for _ in range(STEPS):
        lrs.append(opt.param_groups[0]["lr"])
        opt.zero_grad()
        loss_of(model, x, y).backward()
        opt.step()
        assert opt.refopt_optimizers[0].learning_rate == float(np.float32(lrs[-1]))
        sched.step()
    got = [p.detach().clone() for p in model.parameters()]
    want = train_numpy_copies(
        twin, lambda: refopt.Adam(learning_rate=0.05, convention="tf_keras"), lrs=lrs)
    assert_same(got, want)


def test_closure_is_called_once_and_its_loss_returned():
    model = make_model()
    twin = copy.deepcopy(model)
    opt = rt.Adam(model.parameters(), lr=1e-2)
    x, y = batch()
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = loss_of(model, x, y)
        loss.backward()
        return loss

    losses = [opt.step(closure) for _ in range(STEPS)]
    assert len(calls) == STEPS
    assert all(isinstance(v, torch.Tensor) for v in losses)
    assert losses[-1] < losses[0]
    assert_same([p.detach() for p in model.parameters()],
                train(twin, torch.optim.Adam(twin.parameters(), lr=1e-2)))


def test_params_without_grad_are_skipped():
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(2))  # never used: its .grad stays None
    twin = copy.deepcopy(model)
    textra = torch.nn.Parameter(torch.ones(2))
    opt = rt.Adam([*model.parameters(), extra], lr=1e-2)
    got = train(model, opt)
    want = train(twin, torch.optim.Adam([*twin.parameters(), textra], lr=1e-2))
    assert_same(got, want)
    assert torch.equal(extra.detach(), torch.ones(2))
    assert opt.state[extra]["step"].item() == 0
    assert opt.state[model.weight]["step"].item() == STEPS


def test_changing_another_hyperparameter_is_refused_before_any_step():
    model = make_model()
    opt = rt.Adam(two_groups(model, (1e-2, 1e-2)))
    train(model, opt, steps=1)
    before = [p.detach().clone() for p in model.parameters()]
    opt.param_groups[1]["betas"] = (0.5, 0.9)
    with pytest.raises(ValueError, match="betas"):
        train(model, opt, steps=1)
    assert_same([p.detach() for p in model.parameters()], before)


def test_bad_arguments():
    model = make_model()
    with pytest.raises(ValueError, match="lr"):
        rt.Adam(model.parameters(), lr=-1.0)
    with pytest.raises(TypeError, match="beta_one"):
        rt.RefoptOptimizer(model.parameters(), refopt.Adam, beta_one=0.9)
    with pytest.raises(TypeError, match="optimizer_class"):
        rt.RefoptOptimizer(model.parameters(), torch.optim.Adam)
    with pytest.raises(ValueError, match="zero dampening"):  # torch's rule, refopt's message
        rt.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, dampening=0.5)
    with pytest.raises(TypeError, match="bfloat16"):
        rt.Adam(make_model(torch.bfloat16).parameters())
    with pytest.raises(TypeError, match=r"param_groups\[0\]\['params'\]\[0\].*backend='cuda'"):
        rt.Adam(model.parameters(), backend="cuda")  # CPU tensors: refused before any GPU use
    opt = rt.Adam(model.parameters(), lr=1e-2)
    opt.param_groups[0]["lr"] = float("nan")
    with pytest.raises(ValueError, match="lr"):
        train(model, opt, steps=1)


def test_generic_wrapper_with_refopt_names():
    model = make_model()
    twin = copy.deepcopy(model)
    opt = rt.RefoptOptimizer(model.parameters(), refopt.Lion, lr=1e-3, beta_1=0.8,
                             backend="reference")
    assert opt.param_groups[0]["beta_1"] == 0.8 and opt.param_groups[0]["beta_2"] == 0.99
    got = train(model, opt)
    want = train_numpy_copies(twin, lambda: refopt.Lion(learning_rate=1e-3, beta_1=0.8))
    assert_same(got, want)


# --------------------------------------------------------------- state
def test_state_dict_round_trip_resumes_bit_identically():
    model = make_model()
    twin = copy.deepcopy(model)
    straight = train(twin, rt.Adam(two_groups(twin, (1e-2, 0.05)), amsgrad=True),
                     steps=2 * STEPS)
    opt = rt.Adam(two_groups(model, (1e-2, 0.05)), amsgrad=True)
    train(model, opt, steps=STEPS)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)  # torch's default weights_only=True: plain values only
    resumed = make_model(seed=5)
    resumed.load_state_dict(saved["model"])
    opt2 = rt.Adam(two_groups(resumed, (1.0, 1.0)), amsgrad=True)
    opt2.load_state_dict(saved["opt"])
    assert opt2.param_groups[1]["lr"] == 0.05
    assert sorted(opt2.state[resumed.weight]) == ["m", "step", "v", "vhat"]
    assert_same(train(resumed, opt2, steps=STEPS), straight)


def test_pickling_is_refused_with_a_hint():
    opt = rt.Adam(make_model().parameters())
    with pytest.raises(TypeError, match="state_dict"):
        copy.deepcopy(opt)


def test_state_dict_is_a_copy():
    model = make_model()
    opt = rt.Adam(model.parameters(), lr=1e-2)
    train(model, opt, steps=1)
    sd = opt.state_dict()
    m0 = sd["state"][0]["m"].clone()
    train(model, opt, steps=1)
    assert torch.equal(sd["state"][0]["m"], m0)
    assert sd["refopt"][0]["class"] == "Adam" and sd["refopt"][0]["iterations"] == 1


def test_load_state_dict_refusals_change_nothing():
    model = make_model()
    opt = rt.Adam(model.parameters(), lr=1e-2)
    train(model, opt, steps=2)
    before = copy.deepcopy(opt.state_dict())
    torch_sd = torch.optim.Adam(model.parameters()).state_dict()
    with pytest.raises(ValueError, match="torch.optim"):
        opt.load_state_dict(torch_sd)
    bad = copy.deepcopy(before)
    bad["refopt"][0]["config"]["convention"] = "tf_keras"
    with pytest.raises(ValueError, match="convention"):
        opt.load_state_dict(bad)
    bad = copy.deepcopy(before)
    bad["state"][0]["m"] = bad["state"][0]["m"][:1]
    with pytest.raises(ValueError, match="shape"):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert after["refopt"] == before["refopt"]
    for i in before["state"]:
        for k in before["state"][i]:
            assert torch.equal(after["state"][i][k], before["state"][i][k])


# --------------------------------------------------------------- sparse gradients
def embedding_steps(make_opt, indices_per_step, seed=0):
    torch.manual_seed(seed)
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opt = make_opt(emb.parameters())
    for idx in indices_per_step:
        opt.zero_grad()
        emb(torch.tensor(idx)).pow(2).sum().backward()
        opt.step()
    return emb.weight.detach().clone()


STEP_INDICES = [[1, 3, 1, 7], [3, 3, 0], [9, 1]]


def test_sparse_embedding_equals_lazy_adam_on_indexed_slices():
    got = embedding_steps(lambda ps: rt.SparseAdam(ps, lr=0.1, backend="cpu"), STEP_INDICES)
    torch.manual_seed(0)
    table = torch.nn.Embedding(10, 4).weight.detach().numpy().copy()
    opt = refopt.LazyAdam(learning_rate=0.1, convention="torch")
    for idx in STEP_INDICES:
        rows = table[idx]
        g = refopt.IndexedSlices(2 * rows, np.array(idx), table.shape)
        opt.apply_gradients([(g, table)])
    assert torch.equal(got, torch.from_numpy(table))


def test_sparse_embedding_against_torch_sparse_adam():
    # conformance/README: SparseAdam takes MKL's sqrt on CPU (not correctly rounded), 2 ulp per
    # step; one step without repeated indices (torch's coalesce order is not modelled)
    got = embedding_steps(lambda ps: rt.SparseAdam(ps, lr=0.1), [[4, 1, 8]])
    want = embedding_steps(lambda ps: torch.optim.SparseAdam(ps, lr=0.1), [[4, 1, 8]])
    np.testing.assert_array_max_ulp(got.numpy(), want.numpy(), maxulp=2)
    assert not torch.equal(got, embedding_steps(lambda ps: rt.SparseAdam(ps, lr=0.1), []))


def test_sparse_gradient_refused_by_torch_adam():
    with pytest.raises(TypeError, match="IndexedSlices|sparse"):
        embedding_steps(lambda ps: rt.Adam(ps, lr=0.1), [[1, 2]])



def test_module_docstring_example_runs():
    import doctest

    result = doctest.testmod(rt, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_checkpoint_of_torch_tensors_resumes_bit_identically(tmp_path):
    # save_checkpoint/load_checkpoint take the tensors themselves (views, in place)
    p = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
    opt = refopt.Adam(learning_rate=0.1, backend="reference")
    g = torch.full((2, 3), 0.25)
    opt.apply_gradients([(g, p)])
    refopt.save_checkpoint(tmp_path / "c.npz", opt, [p])
    q = torch.nn.Parameter(torch.zeros(2, 3))
    opt2 = refopt.Adam(learning_rate=0.1, backend="reference")
    refopt.load_checkpoint(tmp_path / "c.npz", opt2, [q])
    assert torch.equal(q, p)
    opt.apply_gradients([(g, p)])
    opt2.apply_gradients([(g, q)])
    assert torch.equal(q, p)
    assert np.array_equal(opt2.get_slot(q, "v"), opt.get_slot(p, "v"))


# --------------------------------------------------------------- autograd, compile, hooks
def stale_backward_message(make_opt):
    """Step, then backward through the graph recorded before the step: torch's message, or
    None when it silently computed gradients from the new values."""
    model = make_model()
    opt = make_opt(model.parameters())
    # square() saves the weight for backward (a Linear's own backward needs only the input)
    loss = loss_of(model, *batch()) + model.weight.square().sum()
    loss.backward(retain_graph=True)
    opt.step()
    try:
        loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_a_stale_graph_backward_raises_as_with_torch_optim():
    # torch's default Adam (foreach) bumps the versions; its fused CPU kernel (torch 2.13)
    # does not, and then computes silently from the new values: refopt follows the default
    want = stale_backward_message(lambda ps: torch.optim.Adam(ps, lr=1e-2))
    assert want is not None and "modified by an inplace operation" in want
    got = stale_backward_message(lambda ps: rt.Adam(ps, lr=1e-2))
    assert got is not None and "modified by an inplace operation" in got


def test_only_updated_params_get_a_new_version():
    model = make_model()
    idle = torch.nn.Parameter(torch.ones(2))
    opt = rt.Adam([{"params": model.parameters()}, {"params": [idle]}], lr=1e-2)
    versions = [p._version for p in model.parameters()]
    train(model, opt, steps=1)
    assert all(p._version > v for p, v in zip(model.parameters(), versions))
    assert idle._version == 0


def test_sparse_adam_refuses_dense_gradients_as_torch_does_and_changes_nothing():
    def attempt(make):
        p = torch.nn.Parameter(torch.zeros(3))
        p.grad = torch.ones(3)
        with pytest.raises(RuntimeError) as info:
            make([p]).step()
        assert torch.equal(p.detach(), torch.zeros(3)) and p._version == 0
        return str(info.value)

    assert attempt(lambda ps: rt.SparseAdam(ps)) == attempt(lambda ps: torch.optim.SparseAdam(ps))


@pytest.mark.parametrize("kwargs", [{"nesterov": True}, {"nesterov": True, "momentum": 0.0}])
def test_sgd_nesterov_without_momentum_refused_as_torch_does(kwargs):
    model = make_model()
    with pytest.raises(ValueError) as want:
        torch.optim.SGD(model.parameters(), lr=0.1, **kwargs)
    with pytest.raises(ValueError, match=r"momentum=0\.0") as got:
        rt.SGD(model.parameters(), lr=0.1, **kwargs)
    assert str(got.value).startswith(str(want.value))
    opt = rt.SGD([model.weight], lr=0.1, momentum=0.9, nesterov=True)
    with pytest.raises(ValueError, match=r"param_groups\[1\] with nesterov=True"):
        opt.add_param_group({"params": [model.bias], "momentum": 0.0})
    with pytest.raises(ValueError, match=r"zero dampening.*dampening=0\.5"):
        opt.add_param_group({"params": [model.bias], "dampening": 0.5})
    assert len(opt.param_groups) == 1 and len(opt.refopt_optimizers) == 1


def test_global_clipnorm_in_two_groups_is_refused_naming_clip_grad_norm():
    model = make_model()
    with pytest.raises(ValueError, match=r"2 parameter groups.*clip_grad_norm_"):
        rt.Adam(two_groups(model, (1e-2, 1e-2)), global_clipnorm=0.1)
    opt = rt.Adam([model.weight], global_clipnorm=0.1)  # one group: its norm is the global one
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['global_clipnorm'\]=0\.1"):
        opt.add_param_group({"params": [model.bias]})
    assert len(opt.param_groups) == 1 and len(opt.refopt_optimizers) == 1
    opt.add_param_group({"params": [model.bias], "global_clipnorm": None})
    assert opt.refopt_optimizers[1].global_clipnorm is None


def test_one_group_global_clipnorm_clips_like_torch_clip_grad_norm():
    # the single-group form that remains allowed equals torch.nn.utils.clip_grad_norm_ bit
    # for bit (the torch convention's clip_formula); SGD's step is proportional to the
    # clipped gradient, so clipping shows
    def run(clip):
        model = make_model()
        x, y = batch()
        opt = (rt.SGD(model.parameters(), lr=0.1, global_clipnorm=0.05) if clip == "refopt"
               else rt.SGD(model.parameters(), lr=0.1))
        for _ in range(STEPS):
            opt.zero_grad()
            loss_of(model, x, y).backward()
            if clip == "torch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            opt.step()
        return model.weight.detach().numpy()

    ours, torchs, unclipped = run("refopt"), run("torch"), run(None)
    np.testing.assert_array_equal(ours, torchs)
    assert np.abs(unclipped - torchs).max() > 1e-2


def test_load_state_dict_runs_torch_pre_and_post_hooks():
    model = make_model()
    opt = rt.Adam(model.parameters(), lr=1e-2)
    train(model, opt, steps=1)
    saved = opt.state_dict()
    calls = []

    def pre(optimizer, state_dict):
        calls.append(("pre", optimizer is opt, state_dict is saved))
        state_dict = copy.deepcopy(state_dict)
        state_dict["param_groups"][0]["lr"] = 0.5  # a pre-hook may return an edited dict
        return state_dict

    opt.register_load_state_dict_pre_hook(pre)
    opt.register_load_state_dict_post_hook(
        lambda optimizer: calls.append(("post", optimizer.param_groups[0]["lr"])))
    opt.load_state_dict(saved)
    assert calls == [("pre", True, False), ("post", 0.5)]  # pre gets a shallow copy
    assert saved["param_groups"][0]["lr"] == 1e-2


def test_a_failing_pre_hook_or_refused_load_changes_nothing_and_skips_post_hooks():
    model = make_model()
    opt = rt.Adam(model.parameters(), lr=1e-2)
    train(model, opt, steps=1)
    saved = opt.state_dict()
    posts = []
    opt.register_load_state_dict_post_hook(lambda o: posts.append(1))
    handle = opt.register_load_state_dict_pre_hook(
        lambda o, sd: (_ for _ in ()).throw(KeyError("from the hook")))
    ropt = opt.refopt_optimizers[0]
    with pytest.raises(KeyError, match="from the hook"):
        opt.load_state_dict(saved)
    handle.remove()
    bad = copy.deepcopy(saved)
    bad["refopt"][0]["config"]["convention"] = "tf_keras"
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)
    assert posts == [] and opt.refopt_optimizers[0] is ropt


def test_load_state_dict_config_mismatch_names_group_hyperparameter_saved_and_this():
    model = make_model()
    opt = rt.Adam(two_groups(model, (1e-2, 1e-2)), convention="tf_keras")
    train(model, opt, steps=1)
    saved = opt.state_dict()
    other = rt.Adam(two_groups(model, (1e-2, 1e-2)))
    with pytest.raises(ValueError, match=r"group 0 .*convention: saved 'tf_keras', this "
                       r"optimizer 'torch'.*convention='tf_keras'"):
        other.load_state_dict(saved)
    edited = copy.deepcopy(saved)
    edited["refopt"][1]["config"]["beta_1"] = 0.5
    with pytest.raises(ValueError, match=r"group 1 .*betas\[0\] \(beta_1\): saved 0\.5, this "
                       r"optimizer 0\.8"):
        opt.load_state_dict(edited)
    with pytest.raises(ValueError, match=r"group 0 was computed by refopt\.Adam; .*refopt\.Nadam"):
        rt.NAdam(two_groups(model, (1e-2, 1e-2)), convention="tf_keras").load_state_dict(saved)


def test_step_is_a_graph_break_under_torch_compile():
    import time

    model = make_model()
    twin = copy.deepcopy(model)
    x, y = batch()

    def train_step(m, o):
        o.zero_grad()
        loss = loss_of(m, x, y)
        loss.backward()
        o.step()
        return loss

    start = time.monotonic()
    compiled = torch.compile(train_step, backend="eager")  # dynamo only: no C++ compiler
    opt, topt = rt.Adam(model.parameters(), lr=1e-2), rt.Adam(twin.parameters(), lr=1e-2)
    for _ in range(3):
        got = compiled(model, opt)
        if time.monotonic() - start > 20:  # dynamo on a loaded machine: not worth the wait
            pytest.skip("torch.compile took more than 20 s")
        want = train_step(twin, topt)
        assert torch.equal(got, want)
    assert_same(list(model.parameters()), list(twin.parameters()))
