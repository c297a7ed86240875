"""The reference layer: pure NumPy functions that are the ground truth of refopt.

Every function takes arrays and Python numbers, never modifies its inputs, and returns new
arrays. Computation happens in the dtype of the variable (float16, float32 or float64), with
the scalar rounding of the framework each function names in its docstring. The fast backends
(``refopt.kernels``) have the same signatures and are tested against these functions.
"""

from refopt.reference.adagrad import (
    AdagradResult,
    adagrad_initial_state,
    adagrad_update,
    initial_accumulator,
)
from refopt.reference.adadelta import AdadeltaResult, adadelta_initial_state, adadelta_update
from refopt.reference.adafactor import (
    AdafactorResult,
    adafactor_initial_state,
    adafactor_update,
)
from refopt.reference.lamb import LambResult, lamb_initial_state, lamb_update
from refopt.reference.adam import AdamResult, adam_scalars, adam_update
from refopt.reference.adamax import AdamaxResult, adamax_initial_state, adamax_update
from refopt.reference.nadam import NadamResult, nadam_initial_state, nadam_update
from refopt.reference.asgd import ASGDResult, asgd_initial_state, asgd_update
from refopt.reference.rprop import RpropResult, rprop_initial_state, rprop_update
from refopt.reference.clipping import (
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from refopt.reference.ema import ema_update
from refopt.reference.ftrl import FtrlResult, ftrl_initial_state, ftrl_update
from refopt.reference.proximal import (
    ProximalAdagradResult,
    ProximalGradientDescentResult,
    proximal_adagrad_initial_state,
    proximal_adagrad_update,
    proximal_gradient_descent_update,
)
from refopt.reference.lazy_adam import lazy_adam_update
from refopt.reference.lion import LionResult, lion_initial_state, lion_update
from refopt.reference.partial_rowwise_adam import (
    PartialRowWiseAdamResult,
    partial_rowwise_adam_initial_state,
    partial_rowwise_adam_rows,
    partial_rowwise_adam_update,
)
from refopt.reference.radam import RAdamResult, radam_initial_state, radam_update
from refopt.reference.rmsprop import (
    RMSpropResult,
    initial_velocity,
    rmsprop_initial_state,
    rmsprop_update,
)
from refopt.reference.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
    rowwise_adagrad_rows,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)
from refopt.reference.sgd import (
    SGDResult,
    sgd_sparse_scatter_update,
    sgd_sparse_torch_update,
    sgd_update,
)
from refopt.reference.sgd_sparse_momentum import (
    SparseMomentumBuffer,
    sgd_sparse_torch_momentum_update,
)
from refopt.reference.weight_decay import apply_weight_decay

__all__ = [
    "AdafactorResult",
    "adafactor_initial_state",
    "adafactor_update",
    "LambResult",
    "lamb_initial_state",
    "lamb_update",
    "AdadeltaResult",
    "adadelta_initial_state",
    "adadelta_update",
    "AdagradResult",
    "AdamResult",
    "AdamaxResult",
    "adamax_initial_state",
    "adamax_update",
    "NadamResult",
    "nadam_initial_state",
    "nadam_update",
    "ASGDResult",
    "asgd_initial_state",
    "asgd_update",
    "RpropResult",
    "rprop_initial_state",
    "rprop_update",
    "RMSpropResult",
    "SGDResult",
    "adagrad_initial_state",
    "adagrad_update",
    "adam_scalars",
    "adam_update",
    "apply_weight_decay",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "ema_update",
    "FtrlResult",
    "ftrl_initial_state",
    "ftrl_update",
    "ProximalAdagradResult",
    "ProximalGradientDescentResult",
    "proximal_adagrad_initial_state",
    "proximal_adagrad_update",
    "proximal_gradient_descent_update",
    "global_norm",
    "initial_accumulator",
    "initial_velocity",
    "lazy_adam_update",
    "LionResult",
    "lion_initial_state",
    "lion_update",
    "PartialRowWiseAdamResult",
    "partial_rowwise_adam_initial_state",
    "partial_rowwise_adam_rows",
    "partial_rowwise_adam_update",
    "RAdamResult",
    "radam_initial_state",
    "radam_update",
    "rmsprop_initial_state",
    "rmsprop_update",
    "RowWiseAdagradResult",
    "rowwise_adagrad_initial_state",
    "rowwise_adagrad_rows",
    "rowwise_adagrad_sequential_update",
    "rowwise_adagrad_update",
    "sgd_sparse_scatter_update",
    "sgd_sparse_torch_momentum_update",
    "sgd_sparse_torch_update",
    "sgd_update",
    "SparseMomentumBuffer",
]
