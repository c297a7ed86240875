"""Regression tests of what a user found against torch 2.13 (values printed by torch itself,
noted next to each test; recorded on this project's machine with the CPU wheel)."""

import numpy as np
import pytest

import refopt

F32 = np.float32


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_torch_zero_weight_decay_with_a_sparse_gradient_is_no_decay(backend):
    # torch.optim.Adagrad([p], lr=0.1, weight_decay=0.0) with p = ones((3, 2)) and a sparse
    # gradient [[1, 2]] at row 1: torch skips the L2 term when weight_decay == 0 (its default)
    # and gives row 1 = [0x1.cccccc0000000p-1] * 2 (0.9f), the other rows untouched.
    w = np.ones((3, 2), F32)
    opt = refopt.Adagrad(learning_rate=0.1, weight_decay=0.0, convention="torch",
                         backend=backend)
    opt.apply_gradients([(refopt.IndexedSlices(np.array([[1.0, 2.0]], F32), [1], (3, 2)), w)])
    want = np.ones((3, 2), F32)
    want[1] = float.fromhex("0x1.cccccc0000000p-1")
    np.testing.assert_array_equal(w, want)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_torch_zero_weight_decay_leaves_an_inf_weight_alone(backend):
    # torch.optim.Adam([w], lr=0.1, weight_decay=0.0, fused=True), w = [inf, 1], g = [0.5, 0.5]:
    # torch gives [inf, 0.9000000357627869]; an L2 term 0 * inf would have made NaN.
    w = np.array([np.inf, 1.0], F32)
    opt = refopt.Adam(learning_rate=0.1, weight_decay=0.0, convention="torch", backend=backend)
    opt.apply_gradients([(np.array([0.5, 0.5], F32), w)])
    assert w[0] == np.inf and w[1] == F32(0.9000000357627869)


def test_torch_adagrad_checkpoint_loads_into_torchs_default_lr_decay(tmp_path):
    # torch.optim.Adagrad's lr_decay defaults to 0; a checkpoint written without the
    # argument must load into Adagrad(convention="torch", lr_decay=0.0) (a user's report).
    from refopt.checkpoint import load_checkpoint, save_checkpoint

    w = np.ones(3, F32)
    opt = refopt.Adagrad(learning_rate=0.1, convention="torch")
    opt.apply_gradients([(np.ones(3, F32), w)])
    assert opt.get_config()["lr_decay"] == 0.0
    save_checkpoint(tmp_path / "a.npz", opt, [w])
    w2 = np.empty_like(w)
    load_checkpoint(tmp_path / "a.npz", refopt.Adagrad(learning_rate=0.1, convention="torch",
                                                        lr_decay=0.0), [w2])
    np.testing.assert_array_equal(w2, w)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
@pytest.mark.parametrize("name, expected", [
    # torch 2.13: NAdam / RAdam(lr=0.1, weight_decay=0.1, decoupled_weight_decay=True) on
    # torch.tensor(1.0) with grad 0.5, one step (a user found a 0-d variable raising TypeError
    # here: the decoupled decay returned a NumPy scalar)
    ("Nadam", 0.884354829788208),
    ("RAdam", 0.9399999976158142),
])
def test_decoupled_decay_on_a_0d_variable_is_torchs(name, expected, backend):
    w = np.array(1.0, np.float32)
    opt = getattr(refopt, name)(learning_rate=0.1, weight_decay=0.1, decoupled_weight_decay=True,
                                convention="torch", backend=backend)
    opt.apply_gradients([(np.array(0.5, np.float32), w)])
    assert w.shape == () and w == np.float32(expected)
