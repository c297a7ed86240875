import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refopt
from refopt import IndexedSlices, checkpoint, schedules
from refopt.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from refopt.testing import slot_names
from refopt.testing import strategies as rst
from refopt.testing.trajectory import copy_gradient

ALL_OPTIONS = dict(weight_decay=True, clipping=True, ema=True, schedules=True)


def bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def state_of(opt, variables):
    """Everything a step depends on or changes: iterations, variables, every slot."""
    out = {"iterations": opt.iterations}
    for i, v in enumerate(variables):
        out[f"var{i}"] = bits(v).tolist()
        if opt.variables[1:]:  # built
            for name in slot_names(opt):
                out[f"{name}{i}"] = bits(opt.get_slot(v, name)).tolist()
    return out


def run(opt, variables, gradients):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for grads in gradients:
            opt.apply_gradients(zip([copy_gradient(g) for g in grads], variables))


# --------------------------------------------------------------------------- bit-identical resume
@settings(max_examples=40)
@given(data=st.data(), optimizer=st.sampled_from(["Adam", "AdamW", "LazyAdam", "SGD"]),
       dtype=st.sampled_from(["float16", "float32", "float64"]))
def test_resumed_run_is_bit_identical_to_uninterrupted(tmp_path_factory, data, optimizer, dtype):
    t = data.draw(rst.trajectories(optimizer=optimizer, dtype=dtype, max_steps=6, sparse=True,
                                   config={"ema_overwrite_frequency": 2} if data.draw(st.booleans())
                                   else None, **ALL_OPTIONS))
    split = data.draw(st.integers(0, t.steps))
    straight = t.make_optimizer()
    w_straight = [a.copy() for a in t.initial]
    straight.build(w_straight)
    run(straight, w_straight, t.gradients)

    first = t.make_optimizer()
    w_first = [a.copy() for a in t.initial]
    first.build(w_first)
    run(first, w_first, t.gradients[:split])
    path = tmp_path_factory.mktemp("ckpt") / "run.npz"
    meta = save_checkpoint(path, first, w_first)
    assert meta["iterations"] == split

    resumed = type(first).from_config(first.get_config())
    w_resumed = [np.full_like(a, np.nan) for a in t.initial]
    load_checkpoint(path, resumed, w_resumed)
    assert state_of(resumed, w_resumed) == state_of(first, w_first)
    run(resumed, w_resumed, t.gradients[split:])
    assert state_of(resumed, w_resumed) == state_of(straight, w_straight)
    if split < t.steps:
        assert resumed.learning_rate == straight.learning_rate


def _lazy_run_setup():
    lr = schedules.CosineDecay(0.1, 5, alpha=0.1, warmup_target=0.2, warmup_steps=2)
    def factory():
        return refopt.LazyAdam(learning_rate=lr, amsgrad=True, weight_decay=0.01, use_ema=True,
                               ema_overwrite_frequency=3, clipnorm=1.0)

    rng = np.random.default_rng(0)
    w0 = [rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)]
    grads = [[IndexedSlices(rng.standard_normal((4, 3)).astype(np.float32),
                            rng.integers(0, 6, 4), (6, 3)),
              rng.standard_normal(4).astype(np.float32)] for _ in range(8)]
    return factory, w0, grads


def test_resume_lazy_adam_with_schedule_ema_amsgrad_from_every_step(tmp_path):
    factory, w0, grads = _lazy_run_setup()
    straight, w_straight = factory(), [w.copy() for w in w0]
    run(straight, w_straight, grads)
    for split in range(len(grads) + 1):
        first, w_first = factory(), [w.copy() for w in w0]
        run(first, w_first, grads[:split])
        save_checkpoint(tmp_path / "c.npz", first, w_first)
        resumed, w_resumed = factory(), [np.zeros_like(w) for w in w0]
        meta = load_checkpoint(tmp_path / "c.npz", resumed, w_resumed)
        assert meta["built"] == (split > 0) and meta["iterations"] == split
        if split:
            assert float.fromhex(meta["learning_rate"]) == first.learning_rate
        run(resumed, w_resumed, grads[split:])
        assert state_of(resumed, w_resumed) == state_of(straight, w_straight), split


def test_without_variables_and_with_another_name(tmp_path):
    factory, w0, grads = _lazy_run_setup()
    opt, w = factory(), [x.copy() for x in w0]
    run(opt, w, grads[:3])
    meta = save_checkpoint(tmp_path / "c.npz", opt, w, include_variables=False)
    assert not meta["has_variables"]
    config = dict(opt.get_config(), name="renamed")
    other = refopt.LazyAdam.from_config(config)
    mine = [x.copy() for x in w]
    mine[0][0, 0] += 1  # the caller's values stay: they are not in the file
    expected = mine[0].copy()
    load_checkpoint(tmp_path / "c.npz", other, mine)
    np.testing.assert_array_equal(mine[0], expected)
    assert other.iterations == 3


# --------------------------------------------------------------------------- atomic writes
def test_failed_write_keeps_previous_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    opt, w = refopt.Adam(), [np.ones(3, np.float32)]
    opt.apply_gradients([(np.ones(3, np.float32), w[0])])
    path = tmp_path / "c.npz"
    save_checkpoint(path, opt, w)
    before = path.read_bytes()
    opt.apply_gradients([(np.ones(3, np.float32), w[0])])

    def crash_mid_write(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.np, "savez", crash_mid_write)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, opt, w)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["c.npz"]

    def replace_fails(src, dst):
        raise PermissionError("read-only")

    monkeypatch.setattr(checkpoint.os, "replace", replace_fails)
    with pytest.raises(PermissionError):
        save_checkpoint(path, opt, w)
    monkeypatch.undo()
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.npz"]
    save_checkpoint(path, opt, w)
    assert load_checkpoint(path, refopt.Adam(), [np.zeros(3, np.float32)])["iterations"] == 2


def test_save_checks_the_variable_list(tmp_path):
    opt, w = refopt.SGD(momentum=0.9), [np.ones(3, np.float32), np.ones(2, np.float32)]
    opt.apply_gradients(zip([np.ones(3, np.float32), np.ones(2, np.float32)], w))
    with pytest.raises(ValueError, match="the 2 variables the optimizer was built with"):
        save_checkpoint(tmp_path / "c.npz", opt, w[:1])
    with pytest.raises(ValueError, match=r"`variables\[1\]`.*not a variable"):
        save_checkpoint(tmp_path / "c.npz", opt, [w[0], w[1].copy()])
    with pytest.raises(TypeError, match="variables"):
        save_checkpoint(tmp_path / "c.npz", opt, w[0])
    with pytest.raises(TypeError, match="refopt optimizer"):
        save_checkpoint(tmp_path / "c.npz", object(), w)
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- bad files
@pytest.fixture
def saved(tmp_path):
    lr = schedules.ExponentialDecay(0.1, 2, 0.5)
    opt = refopt.Adam(learning_rate=lr, amsgrad=True, use_ema=True)
    w = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(4, np.float32)]
    run(opt, w, [[np.full((2, 3), 0.5, np.float32), np.full(4, -1.0, np.float32)]] * 3)
    path = tmp_path / "c.npz"
    save_checkpoint(path, opt, w)
    return path, opt


def fresh(config_from, shapes=((2, 3), (4,)), dtype=np.float32, cls=refopt.Adam):
    opt = cls.from_config(config_from.get_config())
    variables = [np.full(s, 7.0, dtype) for s in shapes]
    return opt, variables


def assert_untouched(opt, variables):
    assert opt.iterations == 0 and len(opt.variables) == 1  # not built
    assert all((v == 7.0).all() for v in variables)


def test_truncated_files_raise_and_change_nothing(saved, tmp_path):
    path, original = saved
    data = path.read_bytes()
    for n in sorted({0, 1, 10, 100, len(data) // 2, len(data) - 100, len(data) - 1}):
        (tmp_path / "t.npz").write_bytes(data[:n])
        opt, w = fresh(original)
        with pytest.raises(CheckpointError, match="truncated, corrupted"):
            load_checkpoint(tmp_path / "t.npz", opt, w)
        assert_untouched(opt, w)


def test_corrupted_bytes_raise_or_load_the_same_state(saved, tmp_path):
    path, original = saved
    data = path.read_bytes()
    good_opt, good_w = fresh(original)
    load_checkpoint(path, good_opt, good_w)
    expected = state_of(good_opt, good_w)
    raised = 0
    for offset in range(0, len(data), 7):  # every 7th byte: headers, npy headers and data
        corrupt = bytearray(data)
        corrupt[offset] ^= 0x5A
        (tmp_path / "x.npz").write_bytes(bytes(corrupt))
        opt, w = fresh(original)
        try:
            load_checkpoint(tmp_path / "x.npz", opt, w)
        except CheckpointError:
            raised += 1
            assert_untouched(opt, w)
        else:  # a byte nothing depends on (e.g. a zip timestamp): the state must be intact
            assert state_of(opt, w) == expected, offset
    # Zip headers hold fields nothing reads (times, versions, flags): about 12% of the bytes here.
    assert raised > 0.8 * len(range(0, len(data), 7))


def test_checksum_catches_consistent_but_altered_contents(saved, tmp_path):
    path, original = saved
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["slot_m_0"] = arrays["slot_m_0"] + 1  # a valid zip with a valid CRC, other numbers
    np.savez(tmp_path / "x.npz", **arrays)
    opt, w = fresh(original)
    with pytest.raises(CheckpointError, match="SHA-256 does not match"):
        load_checkpoint(tmp_path / "x.npz", opt, w)
    assert_untouched(opt, w)


def rewrite_meta(path, target, **changes):
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
        meta = json.loads(str(z["meta"]))
    meta.update(changes)
    checkpoint._write_file(target, meta, arrays)


@pytest.mark.parametrize("case, match", [
    ("fewer_variables", "holds 2 variables; `variables` has 1"),
    ("wrong_shape", r"`variables\[1\]` has shape \(5,\).*saved shape \(4,\)"),
    ("wrong_dtype", r"dtype float64.*dtype float32"),
    ("other_class", "state of an optimizer of class Adam; cannot load it into one of class "
                    "LazyAdam"),
    ("other_config", "amsgrad: saved True, this optimizer False"),
    ("newer_version", "checkpoint format 2; this refopt reads format 1 and older"),
    ("not_a_checkpoint", "not a refopt checkpoint"),
])
def test_mismatched_checkpoints_raise_and_change_nothing(saved, tmp_path, case, match):
    path, original = saved
    opt, w = fresh(original)
    if case == "fewer_variables":
        w = w[:1]
    elif case == "wrong_shape":
        opt, w = fresh(original, shapes=((2, 3), (5,)))
    elif case == "wrong_dtype":
        opt, w = fresh(original, dtype=np.float64)
    elif case == "other_class":
        opt, w = fresh(original, cls=refopt.LazyAdam)
    elif case == "other_config":
        opt = refopt.Adam.from_config(dict(original.get_config(), amsgrad=False))
    elif case == "newer_version":
        rewrite_meta(path, path, format_version=2, refopt_version="9.0")
    elif case == "not_a_checkpoint":
        from refopt.testing.golden import make_trajectory, write_golden

        write_golden(make_trajectory(), npz_path=path)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(path, opt, w)
    assert opt.iterations == 0 and len(opt.variables) == 1
    assert all((v == 7.0).all() for v in w)


def test_loading_into_a_built_optimizer_is_refused(saved):
    path, original = saved
    opt, w = fresh(original)
    opt.build(w)
    with pytest.raises(ValueError, match="not been built yet"):
        load_checkpoint(path, opt, w)
    assert opt.iterations == 0 and all((v == 7.0).all() for v in w)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(path.with_name("missing.npz"), refopt.Adam(), w)


def test_loaded_optimizer_reports_the_learning_rate_of_the_last_saved_step(tmp_path):
    sched = refopt.schedules.ExponentialDecay(1.0, 1, 0.5)
    w = np.ones(2, np.float32)
    opt = refopt.SGD(learning_rate=sched)
    for _ in range(3):
        opt.apply_gradients([(np.ones(2, np.float32), w)])
    assert opt.learning_rate == 0.25  # the value step 2 used
    path = tmp_path / "ckpt.npz"
    refopt.save_checkpoint(path, opt, [w])
    fresh = refopt.SGD.from_config(opt.get_config())
    refopt.load_checkpoint(path, fresh, [w.copy()])
    assert fresh.learning_rate == 0.25 and fresh.iterations == 3


def _without(key):
    def change(meta):
        del meta[key]
    return change


@pytest.mark.parametrize("change, key", [
    (_without("config"), "config"), (lambda m: m.update(config=None), "config"),
    (_without("shapes"), "shapes"), (lambda m: m.update(shapes=[[-3, 2], [4]]), "shapes"),
    (lambda m: m.update(shapes=[[2.5, 3], [4]]), "shapes"),
    (_without("built"), "built"), (_without("has_variables"), "has_variables"),
    (lambda m: m.update(has_variables="yes"), "has_variables"),
    (lambda m: m.update(dtypes=["foo", "float32"]), "dtypes"),
    (lambda m: m.update(dtypes=["int32", "float32"]), "dtypes"),
    (lambda m: m.update(dtypes=["float32"]), "dtypes"),
    (_without("slots"), "slots"), (lambda m: m.update(variable_steps="x"), "variable_steps"),
    (lambda m: m.update(excluded_from_weight_decay=[5]), "excluded_from_weight_decay"),
], ids=lambda x: x if isinstance(x, str) else "")
def test_damaged_metadata_with_a_valid_hash_is_a_checkpoint_error(saved, tmp_path, change, key):
    path, original = saved
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files if k not in ("meta", "sha256")}
        meta = json.loads(str(z["meta"]))
    change(meta)
    checkpoint._write_file(tmp_path / "d.npz", meta, arrays)
    with pytest.raises(CheckpointError, match=f"d.npz has damaged metadata: '{key}' must be"):
        load_checkpoint(tmp_path / "d.npz")
    opt, w = fresh(original)
    with pytest.raises(CheckpointError, match="damaged metadata"):
        load_checkpoint(tmp_path / "d.npz", opt, w)
    assert_untouched(opt, w)


@pytest.mark.parametrize("content", [b"hello", b"", b"\x93NUMPY", b"{\"meta\": 1}"])
def test_a_small_file_that_is_not_an_npz_says_so_without_numpys_pickle_advice(tmp_path, content):
    (tmp_path / "x.npz").write_bytes(content)
    with pytest.raises(CheckpointError, match="not a refopt checkpoint") as info:
        load_checkpoint(tmp_path / "x.npz")
    assert "pickle" not in str(info.value) and "x.npz" in str(info.value)
