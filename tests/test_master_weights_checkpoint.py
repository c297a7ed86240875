"""``save_checkpoint``/``load_checkpoint`` of a ``MasterWeights``: a resumed run is the
uninterrupted one bit for bit (float16, bfloat16 and float32 variables, round to nearest and
stochastic rounding); mismatches raise ``CheckpointError`` and change nothing."""

import ml_dtypes
import numpy as np
import pytest

import refopt
from refopt.checkpoint import CheckpointError

BF16 = np.dtype(ml_dtypes.bfloat16)


def _make(stochastic_rounding, seed=7, beta_1=0.9):
    return refopt.MasterWeights(
        refopt.Adam(learning_rate=0.01, beta_1=beta_1, convention="keras3",
                    backend="reference"),
        stochastic_rounding=stochastic_rounding, seed=seed)


def _variables():
    return [np.array([1.0, -0.5, 0.25], np.float16), np.array([1.0, 2.0], BF16),
            np.array([3.0], np.float32)]


def _grads(steps):
    rng = np.random.default_rng(0)
    return [[rng.standard_normal(3).astype(np.float16),
             rng.standard_normal(2).astype(np.float32),
             rng.standard_normal(1).astype(np.float32)] for _ in range(steps)]


def _bits(arrays):
    return [np.asarray(a).view(np.uint8).tobytes() for a in arrays]


@pytest.mark.parametrize("stochastic_rounding", [False, True])
def test_resumed_run_is_the_uninterrupted_one(tmp_path, stochastic_rounding):
    grads = _grads(6)
    ref, ref_vars = _make(stochastic_rounding), _variables()
    for g in grads:
        ref.apply_gradients(zip(g, ref_vars))
    opt, vs = _make(stochastic_rounding), _variables()
    for g in grads[:3]:
        opt.apply_gradients(zip(g, vs))
    path = tmp_path / "mw.npz"
    refopt.save_checkpoint(path, opt, vs)
    resumed, rvars = refopt.load_checkpoint(path, backend="reference")
    assert type(resumed) is refopt.MasterWeights and resumed.iterations == 3
    assert [v.dtype for v in rvars] == [np.float16, BF16, np.float32]
    assert _bits(rvars) == _bits(vs)
    for g in grads[3:]:
        resumed.apply_gradients(zip(g, rvars))
    assert _bits(rvars) == _bits(ref_vars)
    assert _bits(resumed.get_master(v) for v in rvars) == _bits(
        ref.get_master(v) for v in ref_vars)
    assert _bits(resumed.get_slot(v, "v") for v in rvars) == _bits(
        ref.get_slot(v, "v") for v in ref_vars)


@pytest.mark.parametrize("stochastic_rounding", [False, True])
def test_saved_without_variables_rounds_the_masters_as_sync(tmp_path, stochastic_rounding):
    opt, vs = _make(stochastic_rounding), _variables()
    for g in _grads(2):
        opt.apply_gradients(zip(g, vs))
    path = tmp_path / "mw.npz"
    meta = refopt.save_checkpoint(path, opt, vs, include_variables=False)
    assert meta["master_weights"]["has_variables"] is False
    new, targets = _make(stochastic_rounding), [np.zeros(3, np.float16), np.zeros(2, BF16),
                                                np.zeros(1, np.float32)]
    refopt.load_checkpoint(path, new, targets)
    # every variable was written from its master at the last step: rounding again gives it
    assert _bits(targets) == _bits(vs)
    assert _bits(new.get_master(v) for v in targets) == _bits(opt.get_master(v) for v in vs)


def test_restore_variables_false_keeps_the_variables_and_restores_the_masters(tmp_path):
    opt, vs = _make(False), _variables()
    for g in _grads(2):
        opt.apply_gradients(zip(g, vs))
    path = tmp_path / "mw.npz"
    refopt.save_checkpoint(path, opt, vs)
    mine = [np.full(3, 9.0, np.float16), np.full(2, 9.0, BF16), np.full(1, 9.0, np.float32)]
    new = _make(False)
    refopt.load_checkpoint(path, new, mine, restore_variables=False)
    assert [float(x) for v in mine for x in v.astype(np.float32)] == [9.0] * 6
    assert _bits([new.get_master(mine[0]), new.get_master(mine[1])]) == _bits(
        [opt.get_master(vs[0]), opt.get_master(vs[1])])
    assert new.iterations == 2


def test_mismatches_raise_and_change_nothing(tmp_path):
    opt, vs = _make(False), _variables()
    opt.apply_gradients(zip(_grads(1)[0], vs))
    path = tmp_path / "mw.npz"
    refopt.save_checkpoint(path, opt, vs)
    targets = [np.zeros(3, np.float16), np.zeros(2, BF16), np.zeros(1, np.float32)]
    for other in (_make(True), _make(False, seed=8), _make(False, beta_1=0.8)):
        with pytest.raises(CheckpointError, match="another configuration"):
            refopt.load_checkpoint(path, other, targets)
        assert not other.built and other.iterations == 0
    wrong = [np.zeros(3, np.float32), np.zeros(2, BF16), np.zeros(1, np.float32)]
    with pytest.raises(CheckpointError, match=r"variables\[0\]"):
        refopt.load_checkpoint(path, _make(False), wrong)
    assert [float(x) for v in targets for x in v.astype(np.float32)] == [0.0] * 6
    with pytest.raises(CheckpointError, match="class MasterWeights"):
        refopt.load_checkpoint(path, refopt.Adam(backend="reference"), [np.zeros(3)])
    plain = tmp_path / "plain.npz"
    w = np.zeros(3, np.float32)
    refopt.save_checkpoint(plain, refopt.Adam(backend="reference"), [w])
    with pytest.raises(CheckpointError, match="class Adam"):
        refopt.load_checkpoint(plain, _make(False), [np.zeros(3, np.float16)])
    with pytest.raises(ValueError, match="not a variable"):
        refopt.save_checkpoint(path, opt, [vs[0], vs[1], np.zeros(1, np.float32)])


def _rounded(opt, v):
    return refopt.precision.round_to(opt.get_master(v), v.dtype)


def test_ema_overwrite_rewrites_variables_without_a_gradient():
    # regression: the inner EMA overwrites every master at step 3; b had no gradient there
    # and kept its old rounded value
    a, b, g = np.float16([1, 2]), np.float16([0.5, -1]), np.float16([1, 1])
    opt = refopt.MasterWeights(refopt.Adam(learning_rate=0.1, use_ema=True,
                                           ema_overwrite_frequency=3, convention="keras3",
                                           backend="reference"))
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a)])
    for v in (a, b):
        assert v.tobytes() == _rounded(opt, v).tobytes()


@pytest.mark.parametrize("convention", ["tf_keras", "keras3"])
def test_a_skipped_step_rewrites_nothing_under_stochastic_rounding(convention):
    # regression: tf_keras counts a step LossScaleOptimizer skips, and the unchanged masters
    # were rounded again with the new step's bits (18 of 64 elements changed)
    w = np.random.default_rng(0).standard_normal(64).astype(np.float16)
    opt = refopt.MasterWeights(refopt.LossScaleOptimizer(
        refopt.SGD(learning_rate=0.01, convention=convention, backend="reference")),
        stochastic_rounding=True, seed=5)
    opt.apply_gradients([(np.ones(64, np.float16), w)])
    before = w.tobytes()
    opt.apply_gradients([(np.full(64, np.inf, np.float16), w)])
    assert w.tobytes() == before


def test_stochastic_rounding_resumes_from_a_checkpoint_in_another_order(tmp_path):
    # regression: the rounding's bits are drawn by build position; a checkpoint saved in
    # another order resumed with other bits
    def make():
        return refopt.MasterWeights(refopt.SGD(learning_rate=0.013, convention="torch",
                                               backend="reference"),
                                    stochastic_rounding=True, seed=3)

    grads = [np.float16([1.1, 0.7, -0.3, 2.2])] * 6
    ref, ra, rb = make(), np.float16([1, 2, 3, 4]), np.float16([-1, -2, -3, -4])
    for g in grads:
        ref.apply_gradients([(g, ra), (g, rb)])
    opt, a, b = make(), np.float16([1, 2, 3, 4]), np.float16([-1, -2, -3, -4])
    for g in grads[:3]:
        opt.apply_gradients([(g, a), (g, b)])
    refopt.save_checkpoint(tmp_path / "c.npz", opt, [b, a])
    new, (b2, a2) = refopt.load_checkpoint(tmp_path / "c.npz", backend="reference")
    for g in grads[3:]:
        new.apply_gradients([(g, a2), (g, b2)])
    assert (a2.tobytes(), b2.tobytes()) == (ra.tobytes(), rb.tobytes())


def test_saved_without_variables_restores_each_from_its_last_write(tmp_path):
    # regression: b had no gradient at the last step; it was restored with that step's bits
    opt = refopt.MasterWeights(refopt.SGD(learning_rate=0.013, convention="torch",
                                          backend="reference"),
                               stochastic_rounding=True, seed=3)
    a, b = np.float16([1, 2, 3, 4]), np.float16([-1, -2, -3, -4])
    g = np.float16([1.1, 0.7, -0.3, 2.2])
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a), (g, b)])
    opt.apply_gradients([(g, a)])
    refopt.save_checkpoint(tmp_path / "c.npz", opt, [a, b], include_variables=False)
    new, (a2, b2) = refopt.load_checkpoint(tmp_path / "c.npz", backend="reference")
    assert (a2.tobytes(), b2.tobytes()) == (a.tobytes(), b.tobytes())
