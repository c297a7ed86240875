import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import refopt

GRADS = ([0.1, -0.2, 0.3], [0.01, 0.5, -1.0], [1e-4, 0.0, 2.0])
START = [1.0, 2.0, 3.0]


@pytest.fixture(autouse=True)
def reference_by_default(monkeypatch):
    # backend left out -> plain NumPy (no kernel compiles); the cpu backend is named explicitly
    monkeypatch.setenv("REFOPT_BACKEND", "reference")


class ArrayView:
    """An object that exposes its memory through ``__array__`` only (a view, no copy)."""

    def __init__(self, a):
        self._a = a

    def __array__(self, dtype=None, copy=None):
        return self._a


class ArrayCopy(ArrayView):
    def __array__(self, dtype=None, copy=None):
        return self._a.copy()


class DLPackOnly:
    """An object that exposes its memory through DLPack only."""

    def __init__(self, a):
        self._a = a

    def __dlpack__(self, **kwargs):
        return self._a.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def numpy_run(backend, make=lambda: refopt.Adam(learning_rate=0.01)):
    w = np.array(START, np.float32)
    opt = make() if backend is None else refopt.Adam(learning_rate=0.01, backend=backend)
    for g in GRADS:
        opt.apply_gradients([(np.array(g, np.float32), w)])
    return w, opt


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_torch_parameter_updated_in_place_with_torch_gradients(backend):
    w = torch.nn.Parameter(torch.tensor(START))
    ptr = w.data_ptr()
    opt = refopt.Adam(learning_rate=0.01, backend=backend)
    for g in GRADS:
        opt.apply_gradients([(torch.tensor(g), w)])
    want, ref = numpy_run(backend)
    assert w.data_ptr() == ptr
    np.testing.assert_array_equal(w.detach().numpy(), want)
    np.testing.assert_array_equal(opt.get_slot(w, "v"), ref.get_slot(ref._vars[0], "v"))
    assert opt.iterations == 3


def test_mixed_numpy_and_torch_variables_and_build_with_tensors():
    a = torch.tensor(START)
    b = np.array(START, np.float32)
    opt = refopt.SGD(learning_rate=0.1, momentum=0.9, backend="cpu")
    opt.build([a, b])
    for g in GRADS:
        opt.apply_gradients([(np.array(g, np.float32), a), (torch.tensor(g), b)])
    np.testing.assert_array_equal(a.numpy(), b)
    assert len(opt.variables) == 3


def test_exclude_minimize_finalize_and_state_dict_take_tensors():
    w = torch.tensor(START)
    v = torch.tensor(START)
    opt = refopt.AdamW(learning_rate=0.1, weight_decay=0.5, use_ema=True)
    opt.exclude_from_weight_decay([v])
    loss = opt.minimize(lambda: (1.0, [torch.ones(3), torch.ones(3)]), [w, v])
    assert loss == 1.0
    assert not torch.equal(w, v)  # v is not decayed
    sd = opt.state_dict()
    other = refopt.AdamW(learning_rate=0.1, weight_decay=0.5, use_ema=True)
    other.load_state_dict(sd, var_list=[w, v])
    np.testing.assert_array_equal(other.get_slot(w, "m"), opt.get_slot(w, "m"))
    opt.finalize_variable_values([w])
    np.testing.assert_array_equal(w.numpy(), opt.get_slot(w, "average"))


def test_sparse_torch_gradient_becomes_indexed_slices():
    table = torch.zeros(6, 2)
    ref = np.zeros((6, 2), np.float32)
    g = torch.sparse_coo_tensor([[4, 1, 4]], torch.ones(3, 2), (6, 2),
                                check_invariants=True)
    a = refopt.LazyAdam(learning_rate=0.1)
    b = refopt.LazyAdam(learning_rate=0.1)
    a.apply_gradients([(g, table)])
    b.apply_gradients([(refopt.IndexedSlices(np.ones((3, 2), np.float32), [4, 1, 4], (6, 2)),
                        ref)])
    np.testing.assert_array_equal(table.numpy(), ref)
    assert set(np.flatnonzero(table.numpy().any(axis=1))) == {1, 4}


@pytest.mark.parametrize("wrap", [ArrayView, DLPackOnly], ids=["__array__", "__dlpack__"])
def test_writeable_array_protocol_objects_are_updated_in_place(wrap):
    mem = np.array(START, np.float32)
    obj = wrap(mem)
    opt = refopt.Adam(learning_rate=0.01)
    for g in GRADS:
        opt.apply_gradients([(np.array(g, np.float32), obj)])
    want, _ = numpy_run("reference")
    np.testing.assert_array_equal(mem, want)
    assert opt.get_slot(obj, "m").shape == (3,)


@pytest.mark.parametrize("wrap", [ArrayView, DLPackOnly], ids=["__array__", "__dlpack__"])
def test_read_only_arrays_are_refused_naming_the_functional_api(wrap):
    mem = np.array(START, np.float32)
    mem.flags.writeable = False
    opt = refopt.Adam(learning_rate=0.01)
    with pytest.raises(ValueError, match=r"variable at position 0 .*read-only.*refopt\.functional"):
        opt.apply_gradients([(np.ones(3, np.float32), wrap(mem))])
    with pytest.raises(ValueError, match=r"var_list\[1\].*refopt\.functional"):
        opt.build([np.zeros(2, np.float32), wrap(mem)])
    assert not opt.built and opt.iterations == 0
    np.testing.assert_array_equal(mem, START)


def test_array_that_copies_on_every_call_is_refused():
    opt = refopt.Adam(learning_rate=0.01)
    with pytest.raises(ValueError, match="copy.*refopt.functional"):
        opt.apply_gradients([(np.ones(3, np.float32), ArrayCopy(np.ones(3, np.float32)))])
    assert not opt.built


def test_read_only_gradient_objects_are_fine():
    g = np.array(GRADS[0], np.float32)
    g.flags.writeable = False
    w = np.array(START, np.float32)
    opt = refopt.Adam(learning_rate=0.01)
    opt.apply_gradients([(ArrayView(g), w)])
    opt.apply_gradients([(DLPackOnly(np.array(GRADS[1], np.float32)), w)])
    opt.apply_gradients([(np.array(GRADS[2], np.float32), w)])
    want, _ = numpy_run("reference")
    np.testing.assert_array_equal(w, want)


def test_bad_tensors_are_refused_with_their_argument_named():
    opt = refopt.Adam(learning_rate=0.01)
    with pytest.raises(TypeError, match=r"var_list\[0\].*device meta.*backend='cuda'"):
        opt.build([torch.zeros(3, device="meta")])
    with pytest.raises(TypeError, match=r"var_list\[0\].*bfloat16"):
        opt.build([torch.zeros(3, dtype=torch.bfloat16)])
    with pytest.raises(ValueError, match=r"variable at position 0.*not contiguous"):
        opt.apply_gradients([(torch.ones(3, 2).t().contiguous(), torch.zeros(2, 3).t())])
    with pytest.raises(TypeError, match="not a single array"):
        opt.build(torch.zeros(3))
    with pytest.raises(TypeError, match=r"Gradient at position 0.*sparse_dim=2"):
        opt.apply_gradients([(torch.zeros(2, 2).to_sparse(), torch.zeros(2, 2))])
    assert not opt.built


def test_replaced_tensor_data_is_detected():
    w = torch.zeros(3)
    opt = refopt.Adam(learning_rate=0.01)
    opt.apply_gradients([(torch.ones(3), w)])
    w.data = torch.zeros(3)
    with pytest.raises(ValueError, match="memory moved"):
        opt.apply_gradients([(torch.ones(3), w)])
    assert opt.iterations == 1


def test_an_unknown_tensor_is_a_key_error():
    opt = refopt.Adam(learning_rate=0.01)
    opt.build([torch.zeros(3)])
    with pytest.raises(KeyError, match="cannot recognize"):
        opt.apply_gradients([(torch.ones(3), torch.zeros(3))])
    with pytest.raises(KeyError):
        opt.get_slot(torch.zeros(3), "m")


def test_refopt_imports_and_steps_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import numpy as np, refopt\n"
            "w = np.ones(2, np.float32)\n"
            "refopt.Adam(learning_rate=0.1).apply_gradients([(np.ones(2, np.float32), w)])\n"
            "assert 'refopt.torch' not in sys.modules\n"
            "print(w.tolist())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    w = np.ones(2, np.float32)  # the same step here, where torch is imported
    refopt.Adam(learning_rate=0.1).apply_gradients([(np.ones(2, np.float32), w)])
    assert out.stdout.strip() == str(w.tolist())


def stale_backward_error(step):
    """Record a graph on w, let ``step(w)`` update w, then backward through the old graph:
    the error torch raises (None if it computed gradients)."""
    w = torch.nn.Parameter(torch.tensor(START))
    loss = (w * w).sum()
    loss.backward(retain_graph=True)
    step(w)
    try:
        loss.backward()
    except RuntimeError as exc:
        return str(exc)
    return None


def test_a_step_bumps_the_version_so_a_stale_backward_raises_as_after_torch_optim():
    expected = stale_backward_error(lambda w: torch.optim.Adam([w], lr=0.1).step())
    assert expected is not None and "inplace operation" in expected
    got = stale_backward_error(
        lambda w: refopt.Adam(learning_rate=0.1).apply_gradients([(w.grad, w)]))
    assert got is not None and "inplace operation" in got
    got = stale_backward_error(
        lambda w: refopt.Adam(learning_rate=0.1).minimize(lambda: (0.0, [w.grad]), [w]))
    assert got is not None and "inplace operation" in got


def test_a_refused_step_does_not_bump_the_version():
    w = torch.nn.Parameter(torch.tensor(START))
    opt = refopt.Adam(learning_rate=0.1)
    opt.apply_gradients([(torch.ones(3), w)])
    version = w._version
    with pytest.raises(ValueError):
        opt.apply_gradients([(torch.ones(2), w)])  # wrong shape: nothing changes
    assert w._version == version
    skipped = torch.nn.Parameter(torch.tensor(START))
    both = refopt.Adam(learning_rate=0.1)
    with pytest.warns(UserWarning, match="Gradients do not exist"):
        both.apply_gradients([(torch.ones(3), w), (None, skipped)])
    assert w._version > version and skipped._version == 0  # not written, not bumped


def test_ema_writes_bump_the_version():
    w = torch.nn.Parameter(torch.tensor(START))
    idle = torch.nn.Parameter(torch.tensor(START))  # no gradient: keras3's EMA still averages it
    opt = refopt.Adam(learning_rate=0.1, use_ema=True, ema_overwrite_frequency=2,
                      convention="keras3")
    opt.build([w, idle])
    with pytest.warns(UserWarning):
        opt.apply_gradients([(torch.ones(3), w), (None, idle)])
    assert idle._version == 0
    with pytest.warns(UserWarning):
        opt.apply_gradients([(torch.ones(3), w), (None, idle)])  # step 2: the overwrite
    assert idle._version > 0
    before = w._version
    opt.finalize_variable_values([w])
    assert w._version > before
