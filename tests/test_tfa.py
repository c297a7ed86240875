"""TF-Addons' AdamW and SGDW under convention "keras2" (issue 12 item 9).

Expected values are TF-Addons 0.23's (TF 2.15), printed by it and copied here; whole
trajectories are golden cases replayed by tests/test_conformance.py (ids in TFA_CASES).
"""

import warnings

import numpy as np
import pytest

import refopt
from refopt import IndexedSlices, conformance

TFA_CASES = [
    "keras2/adamw_tfa_f32", "keras2/adamw_tfa_f64", "keras2/adamw_tfa_sparse_f32",
    "keras2/adamw_tfa_decay_f32", "keras2/sgdw_tfa_f32", "keras2/sgdw_tfa_nesterov_f64",
    "keras2/sgdw_tfa_sparse_f32", "keras2/sgdw_tfa_momentum_sparse_f32",
    "keras2/sgd_momentum_sparse_f32",
]


def _dup_grad():  # the semantics notes' duplicate example: rows [1, 1] of a 3x2 table
    return IndexedSlices(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), [1, 1], (3, 2))


def _one_step(opt, grad, w):
    opt.apply_gradients([(grad, w)])
    return w


def test_sgdw_decay_is_not_scaled_by_the_learning_rate():
    # tfa.optimizers.SGDW(weight_decay=0.1, learning_rate=0.5), g = 0.2: [0.79999995, 1.6999999]
    w = np.array([1.0, 2.0], np.float32)
    opt = refopt.SGDW(weight_decay=0.1, learning_rate=0.5, backend="reference")
    _one_step(opt, np.full(2, 0.2, np.float32), w)
    assert w.tolist() == [0.7999999523162842, 1.6999999284744263]
    assert opt.convention.name == "keras2"  # its only convention, and its default


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_sparse_gradients_decay_only_the_present_rows(backend):
    # TF-Addons 0.23 on the duplicate example, weight_decay 0.5, lr 0.1, a table of ones
    want = {
        ("AdamW", 0.0): [[1.0, 1.0], [0.40000009536743164, 0.40000006556510925], [1.0, 1.0]],
        ("SGDW", 0.5): [[1.0, 1.0], [0.09999999403953552, -0.10000002384185791], [1.0, 1.0]],
        # momentum 0: Keras 2's SGD scatter-adds the rows itself, TF-Addons' decay never runs
        ("SGDW", 0.0): [[1.0, 1.0], [0.5999999642372131, 0.4000000059604645], [1.0, 1.0]],
    }
    for (name, momentum), rows in want.items():
        kwargs = {"momentum": momentum} if name == "SGDW" else {}
        opt = getattr(refopt, name)(weight_decay=0.5, learning_rate=0.1, convention="keras2",
                                    backend=backend, **kwargs)
        w = _one_step(opt, _dup_grad(), np.ones((3, 2), np.float32))
        # (momentum 0: TF adds -lr*g of each duplicate in turn, and so does refopt)
        assert w.tolist() == rows, (name, momentum)


def test_adamw_keras2_is_tf_addons_and_needs_a_weight_decay():
    with pytest.raises(TypeError, match=r"TF-Addons' AdamW.*requires a `weight_decay`"):
        refopt.AdamW(convention="keras2")
    with pytest.raises(ValueError, match=r"weight_decay.*>= 0.*Received: weight_decay=-0\.1"):
        refopt.AdamW(weight_decay=-0.1, convention="keras2")
    with pytest.raises(ValueError, match=r"convention='keras2' has no weight decay for Adam"):
        refopt.Adam(weight_decay=0.1, convention="keras2")  # Keras 2's Adam has none
    opt = refopt.AdamW(weight_decay=0.05, convention="keras2", backend="reference")
    again = refopt.AdamW.from_config(opt.get_config())
    assert again.weight_decay == 0.05 and again.convention.adamw_weight_decay == "tfa"


@pytest.mark.parametrize("convention", ["tf_keras", "keras3", "tf1", "torch", "optax"])
def test_sgdw_exists_only_under_keras2(convention):
    with pytest.raises(ValueError, match=rf"SGDW.*only under convention='keras2'.*"
                                         rf"Received: convention='{convention}'"):
        refopt.SGDW(weight_decay=0.1, convention=convention)


def test_sgdw_arguments():
    with pytest.raises(TypeError, match=r"SGDW requires a `weight_decay`"):
        refopt.SGDW()
    with pytest.raises(ValueError, match=r"weight_decay.*finite"):
        refopt.SGDW(weight_decay=float("inf"))
    with pytest.raises(ValueError, match=r"momentum"):
        refopt.SGDW(weight_decay=0.1, momentum=1.5)
    opt = refopt.SGDW(weight_decay=0.01, learning_rate=0.05, momentum=0.9, nesterov=True,
                      decay=0.1, backend="reference")
    config = opt.get_config()
    assert (config["weight_decay"], config["momentum"], config["nesterov"], config["decay"],
            config["name"]) == (0.01, 0.9, True, 0.1, "SGDW")
    assert refopt.SGDW.from_config(config).get_config() == config


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_path_is_bit_identical_to_the_reference(dtype):
    rng = np.random.default_rng(0)
    grads = [rng.normal(size=(4, 3)).astype(dtype) for _ in range(3)]
    for make in (lambda b: refopt.AdamW(weight_decay=0.05, learning_rate=0.01,
                                        convention="keras2", backend=b),
                 lambda b: refopt.SGDW(weight_decay=0.05, learning_rate=0.01, momentum=0.9,
                                       backend=b)):
        out = []
        for backend in ("reference", "cpu"):
            opt, w = make(backend), np.linspace(-1, 1, 12).reshape(4, 3).astype(dtype)
            for g in grads:
                opt.apply_gradients([(g, w)])
            out.append((w.copy(), opt.get_slot(w, "m").copy()))
        for a, b in zip(*out):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


def test_a_raising_step_changes_nothing():
    opt = refopt.SGDW(weight_decay=0.1, learning_rate=0.1, momentum=0.9, backend="reference")
    w = np.ones(3, np.float32)
    opt.apply_gradients([(np.ones(3, np.float32), w)])
    before = (w.copy(), opt.get_slot(w, "m").copy(), opt.iterations)
    with pytest.raises(ValueError):
        opt.apply_gradients([(np.ones(4, np.float32), w)])
    np.testing.assert_array_equal(w, before[0])
    np.testing.assert_array_equal(opt.get_slot(w, "m"), before[1])
    assert opt.iterations == before[2]


def test_tfa_cases_are_recorded_and_replay():
    by_id = {e["id"]: e for e in conformance.load_manifest()}
    for case_id in TFA_CASES:
        entry = by_id[case_id]
        versions = entry["framework_version"]
        if "tfa" in case_id:
            assert "tensorflow_addons" in versions, case_id
        assert entry["tolerance_ulp"] == 0  # every one bit-identical
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = conformance.replay(by_id["keras2/adamw_tfa_sparse_f32"], backend="reference")
    assert result.passed and result.max_ulp == 0, result.detail


def test_sgdw_docstring_example():
    import doctest

    import refopt.optimizers.sgdw as module

    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
