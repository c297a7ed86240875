"""``refopt.GradScaler`` against ``torch.amp.GradScaler("cpu")`` (torch 2.13, run here):
which optimizers unscale in the kernel (fused Adam, AdamW, SGD, Adagrad divide by the scale
in ``step``), ``unscale_`` (always the for-each multiplication by ``f32(1/s)``) and
``scale`` of low-precision arrays (float32 opmath, one rounding). Regressions found by a
user test: each case below differed from torch before."""

import ml_dtypes
import numpy as np
import pytest

import refopt

torch = pytest.importorskip("torch")

N, STEPS, SCALE = 512, 3, 1000.1  # a scale that is not a power of two: g/s != g*f32(1/s)
SLOTS = {"Adam": {"m": "exp_avg", "v": "exp_avg_sq"}, "AdamW": {"m": "exp_avg", "v": "exp_avg_sq"},
         "SGD": {"m": "momentum_buffer"}, "Adagrad": {"accumulator": "sum"}}
KW = {"Adam": dict(lr=0.01), "AdamW": dict(lr=0.01, weight_decay=0.1),
      "SGD": dict(lr=0.1, momentum=0.9), "Adagrad": dict(lr=0.1)}


def _grads():
    rng = np.random.default_rng(7)
    return [(rng.standard_normal(N) * SCALE).astype(np.float32) for _ in range(STEPS)]


def _torch_run(name, unscale_first):
    p = torch.nn.Parameter(torch.ones(N))
    opt = getattr(torch.optim, name)([p], fused=True, **KW[name])
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1000)
    for g in _grads():
        p.grad = torch.from_numpy(g.copy())
        scaler.scale(torch.ones(()))  # creates the scale, as scaler.scale(loss) does
        if unscale_first:
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    state = {k: v.detach().numpy().copy() for k, v in opt.state[p].items() if k != "step"}
    return p.detach().numpy().copy(), state


def _refopt_opt(name):
    kw = dict(KW[name])
    kw["learning_rate"] = kw.pop("lr")
    return getattr(refopt, name)(**kw, convention="torch_fused", backend="reference")


@pytest.mark.parametrize("unscale_first", [False, True])
@pytest.mark.parametrize("name", ["Adam", "AdamW", "SGD", "Adagrad"])
def test_fused_optimizers_under_grad_scaler_are_torchs(name, unscale_first):
    want_p, want_state = _torch_run(name, unscale_first)
    w = np.ones(N, np.float32)
    opt = _refopt_opt(name)
    scaler = refopt.GradScaler(init_scale=SCALE, growth_interval=1000)
    for g in _grads():
        pairs = [(g, w)]
        if unscale_first:
            pairs = scaler.unscale_(opt, pairs)
        scaler.step(opt, pairs)
        scaler.update()
    assert w.tobytes() == want_p.tobytes()
    for ours, theirs in SLOTS[name].items():
        assert opt.get_slot(w, ours).tobytes() == want_state[theirs].tobytes(), ours


def test_master_weights_unscale_as_their_inner_optimizer():
    # MasterWeights(Adam torch_fused) on float16 variables: the float32 masters are what
    # torch's fused Adam computes on float32 parameters from the same (exact) gradients
    grads = [g.astype(np.float16) for g in _grads()]
    p = torch.nn.Parameter(torch.ones(N))
    topt = torch.optim.Adam([p], lr=0.01, fused=True)
    tscaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1000)
    w = np.ones(N, np.float16)
    opt = refopt.MasterWeights(refopt.Adam(learning_rate=0.01, convention="torch_fused",
                                           backend="reference"))
    scaler = refopt.GradScaler(init_scale=SCALE, growth_interval=1000)
    for g in grads:
        p.grad = torch.from_numpy(g.astype(np.float32))
        tscaler.scale(torch.ones(()))
        tscaler.step(topt)
        tscaler.update()
        scaler.step(opt, [(g.astype(np.float32), w)])
        scaler.update()
    assert opt.get_master(w).tobytes() == p.detach().numpy().tobytes()


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_scale_of_low_precision_arrays_is_torchs(dtype):
    x = np.random.default_rng(3).standard_normal(2000).astype(np.float32)
    x[:3] = [0.5, 0.0, -1e-3]
    tdtype = torch.float16 if dtype is np.float16 else torch.bfloat16
    for init in (2.0 ** 16, 1000.1):
        want = torch.amp.GradScaler("cpu", init_scale=init).scale(
            torch.from_numpy(x).to(tdtype)).to(torch.float32).numpy()
        got = refopt.GradScaler(init_scale=init).scale(x.astype(dtype)).astype(np.float32)
        assert got.tobytes() == want.tobytes(), init


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("name", ["Adam", "SGD"])
def test_torch_grad_scaler_drives_the_adapter_as_torchs_optimizer(name, fused):
    # torch.amp.GradScaler around refopt.torch.RefoptOptimizer: a fused convention declares
    # _step_supports_amp_scaling (the step divides by grad_scale, skips on found_inf), the
    # for-loop one is unscaled by the scaler's multiplication; both are torch's bits
    import refopt.torch as rt

    grads = _grads()
    grads[1] = grads[1].copy()
    grads[1][5] = np.inf  # a skipped step, the scale backs off
    runs = []
    for ours in (False, True):
        p = torch.nn.Parameter(torch.ones(N))
        kw = dict(KW[name])
        if ours:
            conv = "torch_fused" if fused else "torch"
            opt = rt.RefoptOptimizer([p], getattr(refopt, name), convention=conv,
                                     backend="reference", **kw)
            assert opt._step_supports_amp_scaling is fused
        else:
            opt = getattr(torch.optim, name)([p], fused=fused, **kw)
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALE, growth_interval=1)
        for g in grads:
            p.grad = torch.from_numpy(g.copy())
            scaler.scale(torch.ones(()))
            scaler.step(opt)
            scaler.update()
        runs.append((p.detach().numpy().copy(), scaler.get_scale()))
    assert runs[0][0].tobytes() == runs[1][0].tobytes()
    assert runs[0][1] == runs[1][1]
