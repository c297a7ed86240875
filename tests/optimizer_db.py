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
    ({"clipvalue": "1"}, TypeError, r"clipvalue"),
    ({"weight_decay": -0.01}, ValueError, r"weight_decay.*>= 0.*Received: weight_decay=-0\.01"),
    ({"weight_decay": float("inf")}, ValueError, r"weight_decay.*finite"),
    ({"use_ema": 1}, TypeError, r"use_ema.*bool"),
    ({"not_an_argument": 1}, TypeError, r"unexpected keyword argument 'not_an_argument'"),
    ({"lr": 0.1}, TypeError, r"unexpected keyword argument 'lr'.*learning_rate"),
    # non-finite clip thresholds and `decay`: refused or taken per convention (issue 12 item
    # 6), tested per convention in tests/test_keras_corners.py
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

ADAMAX_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_2": -0.5}, ValueError, r"beta_2.*Received: beta_2=-0\.5"),
    ({"epsilon": -1e-7}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1e-07"),
    ({"epsilon": "1e-7"}, TypeError, r"epsilon"),
    ({"convention": "tf1"}, ValueError, r"Adamax does not exist under convention='tf1'"),
    ({"learning_rate": None, "convention": "optax"}, TypeError, r"needs a `learning_rate`"),
    ({"weight_decay": 0.1, "convention": "keras2"}, ValueError,
     r"convention='keras2' has no weight decay for Adamax.*Received: weight_decay=0\.1"),
    ({"learning_rate": 0.1, "weight_decay": 0.1, "convention": "optax"}, ValueError,
     r"convention='optax' has no weight decay for Adamax"),
    ({"amsgrad": True}, TypeError, r"unexpected keyword argument 'amsgrad'"),
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
    OptimizerInfo(
        refopt.Adamax,
        (
            {},
            {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9, "epsilon": 1e-3},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "torch", "weight_decay": 0.01, "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + ADAMAX_ERRORS,
        ("m", "u"),
    ),
)


ADADELTA_ERRORS = (
    ({"rho": 1.5}, ValueError, r"rho.*\[0, 1\].*Received: rho=1\.5"),
    ({"rho": "0.9"}, TypeError, r"rho.*real number"),
    ({"epsilon": -1.0}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1\.0"),
    ({"convention": "optax"}, TypeError, r"needs a `learning_rate`.*climb the gradient"),
    ({"convention": "keras2", "weight_decay": 0.01}, ValueError,
     r"convention='keras2' has no weight decay for Adadelta"),
    ({"convention": refopt.conventions.get_convention("torch", adadelta_form="none")},
     ValueError, r"Adadelta does not exist under convention='torch'.*'none'"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.Adadelta,
        (
            {},
            {"learning_rate": 1.0, "rho": 0.5, "epsilon": 1e-3},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "torch", "weight_decay": 0.01, "global_clipnorm": 0.5},
            {"convention": "optax", "learning_rate": 0.5, "weight_decay": 0.01},
        ),
        COMMON_ERRORS + ADADELTA_ERRORS,
        ("accumulated_grad", "accumulated_delta"),
    ),
)

# ASGD and Rprop exist under PyTorch only: their default convention is "torch"
ASGD_ERRORS = (
    ({"lambd": -0.1}, ValueError, r"lambd.*>= 0.*Received: lambd=-0\.1"),
    ({"alpha": float("inf")}, ValueError, r"alpha.*finite"),
    ({"t0": "5"}, TypeError, r"t0.*real number"),
    ({"convention": "tf_keras"}, ValueError, r"ASGD does not exist under convention='tf_keras'"),
)

RPROP_ERRORS = (
    ({"etas": (0.5, 1.0)}, ValueError, r"etas.*0 < etaminus < 1 < etaplus"),
    ({"etas": 0.5}, TypeError, r"etas.*pair"),
    ({"step_sizes": (1.0, 0.5)}, ValueError, r"step_sizes.*Received: step_sizes=\(1\.0, 0\.5\)"),
    ({"weight_decay": 0.01}, ValueError, r"convention='torch' has no weight decay for Rprop"),
    ({"convention": "optax"}, ValueError, r"Rprop does not exist under convention='optax'"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.ASGD,
        (
            {},
            {"learning_rate": 0.05, "lambd": 0.01, "alpha": 0.6, "t0": 2.0},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"t0": 0.0, "global_clipnorm": 0.5, "clipvalue": None},
        ),
        COMMON_ERRORS + ASGD_ERRORS,
        ("ax",),
    ),
    OptimizerInfo(
        refopt.Rprop,
        (
            {},
            {"learning_rate": 0.02, "etas": (0.3, 1.5), "step_sizes": (1e-3, 0.05)},
            {"learning_rate": 0.1, "clipnorm": 1.0, "use_ema": True},
        ),
        COMMON_ERRORS + RPROP_ERRORS,
        ("prev", "step_size"),
    ),
)


# Lamb exists under Keras 3 and optax only: its default convention is "keras3"
LAMB_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_2": -0.5}, ValueError, r"beta_2.*Received: beta_2=-0\.5"),
    ({"epsilon": -1e-7}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1e-07"),
    ({"eps_root": 1e-8}, ValueError, r"eps_root.*optax.*Received: eps_root=1e-08"),
    ({"convention": "optax"}, TypeError, r"needs a `learning_rate`"),
    ({"convention": "tf_keras"}, ValueError, r"Lamb does not exist under convention='tf_keras'"),
    ({"convention": "torch"}, ValueError, r"Lamb does not exist under convention='torch'"),
)

ADAFACTOR_ERRORS = (
    ({"beta_2_decay": 0.5}, ValueError, r"beta_2_decay.*<= 0.*Received: beta_2_decay=0\.5"),
    ({"epsilon_1": -1.0}, ValueError, r"epsilon_1.*>= 0"),
    ({"epsilon_2": float("nan")}, ValueError, r"epsilon_2.*finite"),
    ({"clip_threshold": None}, ValueError, r"clip_threshold=None.*optax"),
    ({"clip_threshold": 0.5, "convention": "torch"}, ValueError,
     r"clip_threshold.*>= 1.*Received: clip_threshold=0\.5"),
    ({"relative_step": 1}, TypeError, r"relative_step.*bool"),
    ({"relative_step": False, "convention": "torch"}, ValueError,
     r"relative_step.*Keras.*convention='torch'"),
    ({"min_dim_size_to_factor": 2}, ValueError, r"min_dim_size_to_factor.*optax"),
    ({"min_dim_size_to_factor": 2.5, "convention": "optax"}, ValueError,
     r"min_dim_size_to_factor.*integer"),
    ({"momentum": 0.9, "convention": "optax"}, NotImplementedError, r"momentum.*not reproduced"),
    ({"convention": "keras2"}, ValueError, r"Adafactor does not exist under convention='keras2'"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.Lamb,
        (
            {},
            {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9, "epsilon": 1e-3},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "optax", "learning_rate": 0.01, "eps_root": 1e-8,
             "weight_decay": 0.01, "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + LAMB_ERRORS,
        ("m", "v"),
    ),
    OptimizerInfo(
        refopt.Adafactor,
        (
            {},
            {"learning_rate": 0.05, "beta_2_decay": -0.5, "epsilon_2": 1e-2,
             "clip_threshold": 0.5, "relative_step": False},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True,
             "convention": "keras3"},
            {"convention": "torch", "weight_decay": 0.01, "epsilon_1": 1e-10},
            {"convention": "optax", "min_dim_size_to_factor": 1, "weight_decay": 0.01,
             "clip_threshold": None, "multiply_by_parameter_scale": False},
        ),
        COMMON_ERRORS + ADAFACTOR_ERRORS,
        ("velocity_row", "velocity_col", "velocity"),
    ),
)


# Ftrl exists in the TensorFlow families only (tf_keras, keras3, keras2, tf1)
FTRL_ERRORS = (
    ({"learning_rate_power": 0.5}, ValueError,
     r"learning_rate_power.*<= 0.*Received: learning_rate_power=0\.5"),
    ({"initial_accumulator_value": -0.1}, ValueError,
     r"initial_accumulator_value.*>= 0.*Received: initial_accumulator_value=-0\.1"),
    ({"l1_regularization_strength": -0.01}, ValueError,
     r"l1_regularization_strength.*>= 0.*Received: l1_regularization_strength=-0\.01"),
    ({"l2_regularization_strength": float("nan")}, ValueError,
     r"l2_regularization_strength.*finite"),
    ({"l2_shrinkage_regularization_strength": "0.1"}, TypeError,
     r"l2_shrinkage_regularization_strength.*real number"),
    ({"beta": -1.0}, ValueError, r"beta.*>= 0.*Received: beta=-1\.0"),
    ({"convention": "tf1"}, TypeError, r"convention='tf1' needs a `learning_rate`"),
    ({"convention": "keras2", "weight_decay": 0.01}, ValueError,
     r"convention='keras2' has no weight decay for Ftrl"),
    ({"convention": "torch"}, ValueError, r"Ftrl does not exist under convention='torch'"),
    ({"convention": "optax"}, ValueError, r"Ftrl does not exist under convention='optax'"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.Ftrl,
        (
            {},
            {"learning_rate": 0.1, "learning_rate_power": -0.3, "l1_regularization_strength": 0.01,
             "l2_regularization_strength": 0.02, "l2_shrinkage_regularization_strength": 0.1,
             "beta": 0.1},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "tf1", "learning_rate": 0.1, "l2_shrinkage_regularization_strength": 0.1},
            {"convention": "keras2", "learning_rate_power": 0.0, "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + FTRL_ERRORS,
        ("accumulator", "linear"),
    ),
)


# Lion exists under tf_keras, Keras 3 and optax; RAdam under torch and optax (its default
# convention is "torch")
LION_ERRORS = (
    ({"beta_1": 0.0}, ValueError, r"beta_1.*\(0, 1\].*Received: beta_1=0\.0"),
    ({"beta_2": 1.5}, ValueError, r"beta_2.*\[0, 1\].*Received: beta_2=1\.5"),
    ({"beta_2": "0.9"}, TypeError, r"beta_2.*real number"),
    ({"convention": "optax"}, TypeError, r"Lion under convention='optax' needs a `learning_rate`"),
    ({"convention": "torch"}, ValueError, r"Lion does not exist under convention='torch'"),
    ({"convention": "keras2"}, ValueError, r"Lion does not exist under convention='keras2'"),
)

RADAM_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_2": float("nan")}, ValueError, r"beta_2.*finite"),
    ({"epsilon": -1e-8}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1e-08"),
    ({"decoupled_weight_decay": "yes"}, TypeError, r"decoupled_weight_decay.*bool"),
    ({"threshold": 4.0}, ValueError, r"threshold.*optax.*Received: threshold=4\.0"),
    ({"epsilon_root": 1e-8}, ValueError, r"epsilon_root.*optax.*Received: epsilon_root=1e-08"),
    ({"convention": "optax"}, TypeError, r"RAdam under convention='optax' needs a `learning_rate`"),
    ({"convention": "optax", "learning_rate": 0.1, "decoupled_weight_decay": True}, ValueError,
     r"decoupled_weight_decay.*PyTorch.*Received: decoupled_weight_decay=True"),
    ({"convention": "optax", "learning_rate": 0.1, "weight_decay": 0.01}, ValueError,
     r"convention='optax' has no weight decay for RAdam"),
    ({"convention": "tf_keras"}, ValueError, r"RAdam does not exist under convention='tf_keras'"),
    ({"convention": "keras3"}, ValueError, r"RAdam does not exist under convention='keras3'"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.Lion,
        (
            {},
            {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "keras3", "weight_decay": 0.01, "global_clipnorm": 0.5},
            {"convention": "optax", "learning_rate": 0.01, "weight_decay": 0.0},
            {"convention": "optax", "learning_rate": 0.01, "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + LION_ERRORS,
        ("m",),
    ),
    OptimizerInfo(
        refopt.RAdam,
        (
            {},
            {"learning_rate": 0.01, "beta_1": 0.4, "beta_2": 0.99, "epsilon": 1e-6},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"weight_decay": 0.01, "decoupled_weight_decay": True, "global_clipnorm": 0.5},
            {"convention": "optax", "learning_rate": 0.01, "epsilon_root": 1e-8,
             "threshold": 4.0},
        ),
        COMMON_ERRORS + RADAM_ERRORS,
        ("m", "v"),
    ),
)


# Nadam exists under tf_keras, Keras 3, Keras 2, torch and optax (TF1 has none)
NADAM_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_2": -0.5}, ValueError, r"beta_2.*Received: beta_2=-0\.5"),
    ({"epsilon": -1e-7}, ValueError, r"epsilon.*>= 0.*Received: epsilon=-1e-07"),
    ({"epsilon": "1e-7"}, TypeError, r"epsilon.*real number"),
    ({"convention": "tf1"}, ValueError, r"Nadam does not exist under convention='tf1'"),
    ({"convention": "optax"}, TypeError, r"Nadam under convention='optax' needs a `learning_rate`"),
    ({"momentum_decay": 0.004}, ValueError,
     r"momentum_decay.*PyTorch.*Received: momentum_decay=0\.004"),
    ({"convention": "torch", "momentum_decay": -0.1}, ValueError,
     r"momentum_decay.*>= 0.*Received: momentum_decay=-0\.1"),
    ({"decoupled_weight_decay": True}, ValueError,
     r"decoupled_weight_decay.*PyTorch.*Received: decoupled_weight_decay=True"),
    ({"convention": "torch", "decoupled_weight_decay": "yes"}, TypeError,
     r"decoupled_weight_decay.*bool"),
    ({"convention": "keras2", "weight_decay": 0.01}, ValueError,
     r"convention='keras2' has no weight decay for Nadam.*Received: weight_decay=0\.01"),
    ({"convention": "optax", "learning_rate": 0.1, "weight_decay": 0.01}, ValueError,
     r"convention='optax' has no weight decay for Nadam"),
    ({"convention": "keras2", "learning_rate": refopt.schedules.ExponentialDecay(0.1, 2, 0.5)},
     ValueError, r"Keras 2's legacy Nadam does not support learning-rate schedules"),
)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.Nadam,
        (
            {},
            {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9, "epsilon": 1e-3},
            {"learning_rate": 0.1, "clipnorm": 1.0, "weight_decay": 0.01, "use_ema": True},
            {"convention": "torch", "weight_decay": 0.01, "momentum_decay": 0.01,
             "global_clipnorm": 0.5},
            {"convention": "torch", "weight_decay": 0.01, "decoupled_weight_decay": True},
            {"convention": "keras2", "epsilon": 0.0},
            {"convention": "optax", "learning_rate": 0.01},
        ),
        COMMON_ERRORS + NADAM_ERRORS,
        ("m", "v"),
    ),
)


# TF1's proximal optimizers: default convention "tf1", a required learning rate (so the common
# errors get one), no EMA (the use_ema error configs are TF1's refusal instead)
PROXIMAL_COMMON_ERRORS = tuple(
    ({"learning_rate": 0.1, **kw}, exc, rx) for kw, exc, rx in COMMON_ERRORS
    if not kw.get("use_ema"))
PROXIMAL_ERRORS = (
    ({"learning_rate": None}, TypeError, r"ProximalAdagrad.*needs a `learning_rate`"),
    ({"learning_rate": 0.1, "l1_regularization_strength": -0.01}, ValueError,
     r"l1_regularization_strength.*>= 0.*Received: l1_regularization_strength=-0\.01"),
    ({"learning_rate": 0.1, "l2_regularization_strength": float("inf")}, ValueError,
     r"l2_regularization_strength.*finite"),
    ({"learning_rate": 0.1, "l1_regularization_strength": "0.1"}, TypeError,
     r"l1_regularization_strength.*real number"),
    ({"learning_rate": 0.1, "initial_accumulator_value": 0.0}, ValueError,
     r"initial_accumulator_value.*> 0.*Received: initial_accumulator_value=0\.0"),
    ({"learning_rate": 0.1, "convention": "tf_keras"}, ValueError,
     r"ProximalAdagrad does not exist under convention='tf_keras'.*proximal_adagrad_form"),
    ({"learning_rate": 0.1, "convention": "torch"}, ValueError,
     r"ProximalAdagrad does not exist under convention='torch'"),
    ({"learning_rate": 0.1, "weight_decay": 0.01}, ValueError,
     r"convention='tf1' has no weight decay for ProximalAdagrad"),
    ({"learning_rate": 0.1, "use_ema": True}, ValueError,
     r"convention='tf1' has no moving average"),
)
PROXIMAL_SGD_ERRORS = tuple(
    (kw, exc, rx.replace("ProximalAdagrad", "ProximalGradientDescent")
     .replace("proximal_adagrad_form", "proximal_sgd_form"))
    for kw, exc, rx in PROXIMAL_ERRORS if "initial_accumulator_value" not in kw)

OPTIMIZERS += (
    OptimizerInfo(
        refopt.ProximalAdagrad,
        (
            {"learning_rate": 0.1},
            {"learning_rate": 0.1, "initial_accumulator_value": 0.5,
             "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.1},
            {"learning_rate": 0.1, "clipnorm": 1.0, "l1_regularization_strength": 0.01},
            {"learning_rate": 0.1, "global_clipnorm": 0.5, "l2_regularization_strength": 0.1},
        ),
        PROXIMAL_COMMON_ERRORS + PROXIMAL_ERRORS,
        ("accumulator",),
    ),
    OptimizerInfo(
        refopt.ProximalGradientDescent,
        (
            {"learning_rate": 0.1},
            {"learning_rate": 0.1, "l1_regularization_strength": 0.01,
             "l2_regularization_strength": 0.1},
            {"learning_rate": 0.1, "clipvalue": 0.5, "l1_regularization_strength": 0.01},
        ),
        PROXIMAL_COMMON_ERRORS + PROXIMAL_SGD_ERRORS,
        (),
    ),
)

# FBGEMM's row-wise Adagrad: default convention "fbgemm", one accumulator per row
ROWWISE_ADAGRAD_ERRORS = (
    ({"epsilon": -1e-8}, ValueError, r"epsilon.*>= 0"),
    ({"weight_decay_mode": "adamw"}, ValueError,
     r"weight_decay_mode.*Received: weight_decay_mode='adamw'"),
    ({"weight_decay": 0.1}, ValueError, (r"weight_decay.*needs weight_decay_mode='l2' or "
                                         r"'decoupled'.*Received: weight_decay=0\.1, "
                                         r"weight_decay_mode='none'")),
    ({"exact": 1}, TypeError, r"exact.*bool.*Received: exact=1"),
    ({"convention": "torch"}, ValueError,
     r"RowWiseAdagrad does not exist under convention='torch'.*rowwise_adagrad_form"),
)
OPTIMIZERS += (
    OptimizerInfo(
        refopt.RowWiseAdagrad,
        (
            {},
            {"learning_rate": 0.1, "epsilon": 1e-3, "weight_decay": 0.1,
             "weight_decay_mode": "l2"},
            {"learning_rate": 0.1, "weight_decay": 0.01, "weight_decay_mode": "decoupled",
             "clipnorm": 1.0},
            {"learning_rate": 0.1, "exact": False, "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + ROWWISE_ADAGRAD_ERRORS,
        ("accumulator",),
    ),
)

# FBGEMM's partial row-wise Adam (issue 14 item 1): convention "fbgemm", float32 tables,
# m per element and v one per row
PARTIAL_ROWWISE_ADAM_ERRORS = (
    ({"beta_1": 1.0}, ValueError, r"beta_1.*\[0, 1\).*Received: beta_1=1\.0"),
    ({"beta_2": -0.5}, ValueError, r"beta_2.*Received: beta_2=-0\.5"),
    ({"beta_2": 0.99999999}, ValueError,
     r"beta_2.*< 1 in float32.*Received: beta_2=0\.99999999"),
    ({"beta_1": "0.9"}, TypeError, r"beta_1.*Received: beta_1='0\.9'"),
    ({"epsilon": -1e-8}, ValueError, r"epsilon.*>= 0"),
    ({"epsilon": 1e39}, ValueError, r"epsilon.*finite in float32.*Received: epsilon=1e\+39"),
    ({"weight_decay": 1e39}, ValueError, r"weight_decay.*finite in float32"),
    ({"convention": "torch"}, ValueError,
     r"PartialRowWiseAdam does not exist under convention='torch'.*fbgemm"),
)
OPTIMIZERS += (
    OptimizerInfo(
        refopt.PartialRowWiseAdam,
        (
            {},
            {"learning_rate": 0.1, "weight_decay": 0.01, "clipnorm": 1.0},
            {"learning_rate": 0.05, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-6,
             "global_clipnorm": 0.5},
        ),
        COMMON_ERRORS + PARTIAL_ROWWISE_ADAM_ERRORS,
        ("m", "v"),
    ),
)

# bitsandbytes' 8-bit optimizers (issue 17 item 5): convention "torch" only, float32
# variables; min_8bit_size=1 puts these tables' small variables on the 8-bit path
EIGHTBIT_ERRORS = (
    ({"convention": "tf_keras"}, ValueError,
     r"8bit.*convention='torch'.*convention='tf_keras'"),
    ({"convention": "torch_fused"}, ValueError, r"Received: convention='torch_fused'"),
    ({"min_8bit_size": -1}, ValueError, r"min_8bit_size.*integer >= 0.*Received: min_8bit_size=-1"),
    ({"min_8bit_size": 2.5}, ValueError, r"min_8bit_size.*Received: min_8bit_size=2\.5"),
    ({"is_paged": True}, ValueError, r"is_paged=True"),
)
EIGHTBIT_ADAM_ERRORS = (
    ({"amsgrad": True}, ValueError, r"amsgrad=True"),
)
OPTIMIZERS += tuple(
    OptimizerInfo(
        cls,
        (
            {},
            {"learning_rate": 0.01, "min_8bit_size": 1, "weight_decay": 0.1, "clipnorm": 1.0},
            {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.95, "min_8bit_size": 5},
        ),
        COMMON_ERRORS + EIGHTBIT_ERRORS + (() if cls is refopt.Lion8bit
                                           else ADAM_ERRORS + EIGHTBIT_ADAM_ERRORS),
        ("m", "m_absmax") if cls is refopt.Lion8bit else ("m", "v", "m_absmax", "v_absmax"),
    )
    for cls in (refopt.Adam8bit, refopt.AdamW8bit, refopt.Lion8bit)
)


def optimizer_id(info):
    return info.cls.__name__
