"""One table of the optimizers under test, their configs and their error configs.

Generic tests iterate over it; adding an optimizer means adding a row (in the spirit of
PyTorch's ``OptimizerInfo``).
"""

from dataclasses import dataclass, field

import refopt


@dataclass(frozen=True)
class OptimizerInfo:
    cls: type
    # Keyword sets that must construct and step without error.
    configs: tuple
    # (kwargs, exception type, regex the message must match)
    error_configs: tuple = field(default_factory=tuple)
    slots: tuple = ()


# Errors every optimizer shares (base-class keywords).
COMMON_ERRORS = (
    ({"learning_rate": -0.1}, ValueError, r"learning_rate.*>= 0.*Received: learning_rate=-0\.1"),
    ({"learning_rate": float("nan")}, ValueError, r"learning_rate.*finite.*nan"),
    ({"learning_rate": float("inf")}, ValueError, r"learning_rate.*finite.*inf"),
    ({"learning_rate": 1e39}, ValueError, r"learning_rate.*finite in float32"),
    ({"learning_rate": "0.1"}, TypeError, r"learning_rate.*Received: learning_rate='0\.1'"),
    ({"learning_rate": True}, TypeError, r"learning_rate"),
    ({"ema_momentum": 1.5}, ValueError, r"ema_momentum.*\[0, 1\].*Received: ema_momentum=1\.5"),
    ({"ema_momentum": -0.1}, ValueError, r"ema_momentum.*Received: ema_momentum=-0\.1"),
    ({"ema_momentum": float("nan")}, ValueError, r"ema_momentum.*finite"),
    ({"use_ema": True, "ema_overwrite_frequency": 0}, ValueError, r"ema_overwrite_frequency.*integer >= 1.*Received: ema_overwrite_frequency=0"),
    ({"use_ema": True, "ema_overwrite_frequency": 2.5}, ValueError, r"ema_overwrite_frequency.*Received: ema_overwrite_frequency=2\.5"),
    ({"ema_overwrite_frequency": True}, ValueError, r"ema_overwrite_frequency"),
    ({"clipnorm": 1.0, "global_clipnorm": 1.0}, ValueError, r"At most one of `clipnorm` and `global_clipnorm`.*clipnorm=1\.0, global_clipnorm=1\.0"),
    ({"clipnorm": float("nan")}, ValueError, r"clipnorm.*finite"),
    ({"global_clipnorm": float("inf")}, ValueError, r"global_clipnorm.*finite"),
    ({"clipvalue": "1"}, TypeError, r"clipvalue"),
    ({"weight_decay": -0.01}, ValueError, r"weight_decay.*>= 0.*Received: weight_decay=-0\.01"),
    ({"weight_decay": float("inf")}, ValueError, r"weight_decay.*finite"),
    ({"use_ema": 1}, TypeError, r"use_ema.*bool"),
    ({"not_an_argument": 1}, TypeError, r"unexpected keyword argument 'not_an_argument'"),
    ({"lr": 0.1}, TypeError, r"unexpected keyword argument 'lr'.*learning_rate"),
    ({"decay": 0.1}, ValueError, r"decay.*legacy"),
    ({"gradient_aggregator": None}, ValueError, r"gradient_aggregator.*legacy"),
    ({"backend": "tpu"}, ValueError, r"backend.*Received: backend='tpu'"),
    ({"convention": 3}, TypeError, r"convention.*Received: convention=3"),
    ({"convention": {"name": "x"}}, ValueError, r"convention.*dict.*Received"),
    ({"convention": "jax"}, ValueError, r"convention.*Received: convention='jax'"),
    ({"name": 3}, TypeError, r"name.*Received: name=3"),
)

ADAM_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_1": -0.5}, ValueError, r"beta_1.*Received: beta_1=-0\.5"),
    ({"beta_2": 1.0}, ValueError, r"beta_2.*Received: beta_2=1\.0"),
    ({"beta_2": float("nan")}, ValueError, r"beta_2.*finite"),
    ({"epsilon": -1e-7}, ValueError, r"epsilon.*>= 0"),
    ({"epsilon": float("inf")}, ValueError, r"epsilon.*finite"),
    ({"amsgrad": "yes"}, TypeError, r"amsgrad.*bool"),
)

SGD_ERRORS = (
    ({"momentum": 1.5}, ValueError, r"momentum.*\[0, 1\].*Received: momentum=1\.5"),
    ({"momentum": -0.1}, ValueError, r"momentum"),
    ({"nesterov": None}, TypeError, r"nesterov.*bool"),
)

RMSPROP_ERRORS = (
    ({"rho": 1.5}, ValueError, r"rho.*\[0, 1\].*Received: rho=1\.5"),
    ({"momentum": -0.1}, ValueError, r"momentum.*>= 0.*Received: momentum=-0\.1"),
    ({"epsilon": -1.0}, ValueError, r"epsilon.*>= 0"),
    ({"centered": 1}, TypeError, r"centered.*bool"),
    ({"eps_in_sqrt": False}, ValueError, r"eps_in_sqrt.*optax.*Received: eps_in_sqrt=False"),
    ({"learning_rate": None, "convention": "tf1"}, TypeError, r"needs a `learning_rate`"),
)

ADAGRAD_ERRORS = (
    ({"initial_accumulator_value": -0.1}, ValueError,
     r"initial_accumulator_value.*>= 0.*Received: initial_accumulator_value=-0\.1"),
    ({"epsilon": -1.0}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1\.0"),
    ({"epsilon": "1e-7"}, TypeError, r"epsilon.*real number"),
    ({"lr_decay": 0.1}, ValueError, r"lr_decay.*PyTorch.*Received: lr_decay=0\.1"),
    ({"learning_rate": 0.1, "epsilon": 1e-7, "convention": "tf1"}, ValueError,
     r"convention='tf1' has no epsilon.*Received: epsilon=1e-07"),
    ({"learning_rate": 0.1, "initial_accumulator_value": 0.0, "convention": "tf1"},
     ValueError, r"initial_accumulator_value.*> 0"),
    ({"learning_rate": None, "convention": "tf1"}, TypeError, r"needs a `learning_rate`"),
)

ADAM_CONFIGS = (
    {},
    {"amsgrad": True},
    {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9, "epsilon": 1e-3},
    {"weight_decay": 0.01, "clipnorm": 1.0},
    {"global_clipnorm": 0.5, "use_ema": True, "ema_overwrite_frequency": 2},
    {"clipvalue": 0.1, "use_ema": True, "ema_momentum": 0.5},
)

OPTIMIZERS = (
    OptimizerInfo(refopt.Adam, ADAM_CONFIGS, COMMON_ERRORS + ADAM_ERRORS, ("m", "v")),
    OptimizerInfo(
        refopt.AdamW,
        ADAM_CONFIGS[:3],
        COMMON_ERRORS
        + ADAM_ERRORS
        + ((({"weight_decay": None}), ValueError, r"AdamW requires a `weight_decay`"),),
        ("m", "v"),
    ),
    OptimizerInfo(refopt.LazyAdam, ADAM_CONFIGS, COMMON_ERRORS + ADAM_ERRORS, ("m", "v")),
    OptimizerInfo(
        refopt.SGD,
        (
            {},
            {"momentum": 0.9},
            {"momentum": 0.9, "nesterov": True, "weight_decay": 0.1},
            {"learning_rate": 0.1, "clipvalue": 0.5, "use_ema": True},
        ),
        COMMON_ERRORS + SGD_ERRORS,
        ("m",),
    ),
    OptimizerInfo(
        refopt.RMSprop,
        (
            {},
            {"momentum": 0.9, "centered": True},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
        ),
        COMMON_ERRORS + RMSPROP_ERRORS,
        ("velocity",),
    ),
    OptimizerInfo(
        refopt.Adagrad,
        (
            {},
            {"learning_rate": 0.1, "initial_accumulator_value": 0.0, "epsilon": 1e-3},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "torch", "lr_decay": 0.1, "weight_decay": 0.01},
        ),
        COMMON_ERRORS + ADAGRAD_ERRORS,
        ("accumulator",),
    ),
)


def optimizer_id(info):
    return info.cls.__name__
