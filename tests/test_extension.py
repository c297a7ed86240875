"""The public extension point: a user's optimizer as a subclass (slots + NumPy update_step),
the whole pipeline on every backend, a rule for the fused CPU path, and assert_conforms."""

import numpy as np
import pytest
from numba.extending import register_jitable

import refopt
from refopt.rules import Rule, RuleCall, flags, scalars
from refopt.rules.ops import add, div, mul, sqrt, sub
from refopt.testing import assert_conforms


@register_jitable
def my_adagrad_element(p, g, acc, sc, fl, tail):
    acc = add(acc, mul(g, g))
    return sub(p, div(mul(sc[0], g), add(sqrt(acc), sc[1]))), acc


MY_ADAGRAD = Rule("my_adagrad", my_adagrad_element, ("accumulator",))


class MyAdagrad(refopt.Optimizer):
    """Adagrad written as a user would: slots, a NumPy step, optionally a rule."""

    slot_variables = ("accumulator",)

    def __init__(self, learning_rate=0.01, epsilon=1e-7, name="MyAdagrad", **kwargs):
        self.epsilon = epsilon
        super().__init__(name=name, learning_rate=learning_rate, **kwargs)

    def slot_initial_value(self, name, dtype):
        return np.dtype(dtype).type(0.1)

    def update_step(self, gradient, variable, slots, learning_rate, step):
        dt = variable.dtype
        acc = slots["accumulator"] + gradient * gradient
        lr, eps = dt.type(np.float32(learning_rate)), dt.type(self.epsilon)
        return variable - (lr * gradient) / (np.sqrt(acc) + eps), {"accumulator": acc}

    def update_rule(self, dtype, learning_rate, step, **kwargs):
        dt = np.dtype(dtype)
        sc = scalars(dt, [dt.type(np.float32(learning_rate)), dt.type(self.epsilon)])
        return RuleCall(MY_ADAGRAD, sc, flags([]))

    def get_config(self):
        return dict(super().get_config(), epsilon=self.epsilon)


class NumpyOnly(MyAdagrad):
    """The same optimizer without a rule: the staged NumPy path on every backend."""

    def update_rule(self, dtype, learning_rate, step, **kwargs):
        return None


def _run(cls, backend, **kwargs):
    w = np.array([1.0, 2.0, 3.0], np.float32)
    b = np.array([[0.5, -0.5]], np.float64)
    opt = cls(learning_rate=0.1, backend=backend, **kwargs)
    for k in range(3):
        opt.apply_gradients([(np.array([0.5, -1.0, 2.0], np.float32) * (k + 1), w),
                             (np.array([[0.25, 1.5]]), b)])
    return w, b, opt


def test_user_optimizer_expected_values():
    w, b, opt = _run(NumpyOnly, "reference")
    # acc_1 = 0.1 + 0.25, w_1 = 1 - 0.1 * 0.5 / (sqrt(0.35) + 1e-7), ... written out by hand
    acc = np.float32(0.1)
    p = np.float32(1.0)
    for k in range(3):
        g = np.float32(0.5) * np.float32(k + 1)
        acc = acc + g * g
        p = p - (np.float32(0.1) * g) / (np.sqrt(acc) + np.float32(1e-7))
    assert w[0] == p and opt.get_slot(w, "accumulator")[0] == acc
    assert opt.iterations == 3 and opt.slot_names == ("accumulator",)


@pytest.mark.parametrize("kwargs", [{}, {"clipnorm": 1.0, "use_ema": True},
                                    {"weight_decay": 0.01, "clipvalue": 0.5}])
def test_user_optimizer_rule_bit_identical_to_its_numpy(kwargs):
    w_ref, b_ref, ref = _run(NumpyOnly, "reference", **kwargs)
    w_cpu, b_cpu, cpu = _run(MyAdagrad, "cpu", **kwargs)
    w_np, b_np, _ = _run(NumpyOnly, "cpu", **kwargs)  # cpu without a rule: staged, same bits
    for a, b_, c in ((w_ref, w_cpu, w_np), (b_ref, b_cpu, b_np)):
        np.testing.assert_array_equal(b_, a)
        np.testing.assert_array_equal(c, a)
    np.testing.assert_array_equal(cpu.get_slot(w_cpu, "accumulator"),
                                  ref.get_slot(w_ref, "accumulator"))


def test_user_optimizer_raising_step_changes_nothing():
    class Broken(NumpyOnly):
        def update_step(self, gradient, variable, slots, learning_rate, step):
            return variable[:1], slots  # wrong shape

    w = np.ones(3, np.float32)
    opt = Broken()
    with pytest.raises(TypeError, match="shape"):
        opt.apply_gradients([(np.ones(3, np.float32), w)])
    assert opt.iterations == 0 and not opt.built and (w == 1).all()


def test_assert_conforms_with_a_user_optimizer():
    class Port:  # a candidate port of MyAdagrad, stateful, as a porter would write it
        def __init__(self, learning_rate, epsilon, **_):
            self.lr, self.eps, self.acc = learning_rate, epsilon, {}

        def apply_gradients(self, pairs):
            for g, v in pairs:
                dt = v.dtype
                acc = self.acc.setdefault(id(v), np.full_like(v, 0.1)) + g * g
                self.acc[id(v)] = acc
                v -= (dt.type(np.float32(self.lr)) * g) / (np.sqrt(acc) + dt.type(self.eps))

    assert_conforms(lambda **cfg: Port(**cfg), optimizer=MyAdagrad, config={"epsilon": 1e-7},
                    max_examples=10, slot_map={"accumulator": None})


def test_user_optimizer_config_round_trip():
    opt = MyAdagrad(learning_rate=0.2, epsilon=1e-3, clipnorm=1.0)
    again = MyAdagrad.from_config(opt.get_config())
    assert again.get_config() == opt.get_config() and again.epsilon == 1e-3


def test_subclass_rewriting_update_step_is_not_run_by_the_parent_rule():
    # A subclass of a class with a rule that rewrites update_step: every backend runs the new
    # update_step (the inherited rule would compute something else).
    class DoubleLR(MyAdagrad):
        def update_step(self, gradient, variable, slots, learning_rate, step):
            return super().update_step(gradient, variable, slots, 2 * learning_rate, step)

    w_ref, _, _ = _run(DoubleLR, "reference")
    w_cpu, _, _ = _run(DoubleLR, "cpu")
    w_double, _, _ = _run(NumpyOnly, "reference")
    np.testing.assert_array_equal(w_cpu, w_ref)
    assert not np.array_equal(w_ref, w_double)


def test_update_step_on_a_builtin_subclass_is_used():
    class PlainSGD(refopt.SGD):  # momentum ignored: w - lr * g, written by the user
        def update_step(self, gradient, variable, slots, learning_rate, step):
            lr = variable.dtype.type(np.float32(learning_rate))
            return variable - lr * gradient, dict(slots)

    for backend in ("reference", "cpu"):
        w = np.ones(3, np.float32)
        opt = PlainSGD(learning_rate=0.5, momentum=0.9, backend=backend)
        for _ in range(2):
            opt.apply_gradients([(np.ones(3, np.float32), w)])
        np.testing.assert_array_equal(w, np.zeros(3, np.float32))  # 1 - 0.5 - 0.5
