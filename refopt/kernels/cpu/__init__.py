"""The CPU backend: Numba kernels with the reference's functions, signatures and results.

``refopt.kernels.cpu`` exposes the same public functions as :mod:`refopt.reference`, with the
same signatures, the same errors and bit-identical results in float32 and float64 (norms
within 1 ulp; float16 is computed by the reference, Numba having no float16 arithmetic on the
CPU; the optimizers' fused kernels take float16 and bfloat16 variables computed in float32 as
uint16 bits, :mod:`refopt.kernels.cpu.halfbits`). They are pure like the reference (new
arrays, inputs untouched), which makes them easy to compare; the optimizers with
``backend="cpu"`` call the same kernels in place, fused and over all tensors of a dtype at
once (see :mod:`refopt.optimizers.base`).

Importing this module imports Numba but compiles nothing: every kernel compiles (or loads
from Numba's on-disk cache) on its first call for a dtype.
"""

from refopt.kernels.cpu.adagrad import adagrad_update
from refopt.kernels.cpu.adadelta import adadelta_update
from refopt.kernels.cpu.adafactor import adafactor_update
from refopt.kernels.cpu.lamb import lamb_update
from refopt.reference.adafactor import AdafactorResult, adafactor_initial_state
from refopt.reference.lamb import LambResult, lamb_initial_state
from refopt.kernels.cpu.adam import adam_update
from refopt.reference.adadelta import AdadeltaResult, adadelta_initial_state
from refopt.kernels.cpu.adamax import adamax_update
from refopt.kernels.cpu.nadam import nadam_update
from refopt.kernels.cpu.asgd import asgd_update
from refopt.kernels.cpu.rprop import rprop_update
from refopt.kernels.cpu.partial_rowwise_adam import (
    PartialRowWiseAdamResult,
    partial_rowwise_adam_initial_state,
    partial_rowwise_adam_rows,
    partial_rowwise_adam_update,
)
from refopt.kernels.cpu.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
    rowwise_adagrad_rows,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)
from refopt.kernels.cpu.clipping import (
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from refopt.kernels.cpu.ema import ema_update
from refopt.kernels.cpu.ftrl import ftrl_update
from refopt.kernels.cpu.proximal import (
    proximal_adagrad_update,
    proximal_gradient_descent_update,
)
from refopt.reference.proximal import (
    ProximalAdagradResult,
    ProximalGradientDescentResult,
    proximal_adagrad_initial_state,
)
from refopt.reference.ftrl import FtrlResult, ftrl_initial_state
from refopt.kernels.cpu.lazy_adam import lazy_adam_update
from refopt.kernels.cpu.lion import lion_update
from refopt.kernels.cpu.radam import radam_update
from refopt.reference.lion import LionResult, lion_initial_state
from refopt.reference.radam import RAdamResult, radam_initial_state
from refopt.kernels.cpu.rmsprop import rmsprop_update
from refopt.kernels.cpu.sgd import (
    sgd_sparse_scatter_update,
    sgd_sparse_torch_update,
    sgd_update,
)
from refopt.kernels.cpu.weight_decay import apply_weight_decay
# torch's sparse momentum buffer: a serial merge of two entry lists, computed on the host
# (the optimizer takes the staged step; these are the reference's own functions)
from refopt.reference.sgd_sparse_momentum import (
    SparseMomentumBuffer,
    sgd_sparse_torch_momentum_update,
)
from refopt.reference.adagrad import AdagradResult, adagrad_initial_state, initial_accumulator
from refopt.reference.adam import AdamResult, adam_scalars
from refopt.reference.adamax import AdamaxResult, adamax_initial_state
from refopt.reference.nadam import NadamResult, nadam_initial_state
from refopt.reference.asgd import ASGDResult, asgd_initial_state
from refopt.reference.rprop import RpropResult, rprop_initial_state
from refopt.reference.rmsprop import RMSpropResult, initial_velocity, rmsprop_initial_state
from refopt.reference.sgd import SGDResult

__all__ = [
    "FtrlResult",
    "ftrl_initial_state",
    "ftrl_update",
    "ProximalAdagradResult",
    "ProximalGradientDescentResult",
    "proximal_adagrad_initial_state",
    "proximal_adagrad_update",
    "proximal_gradient_descent_update",
    "AdadeltaResult",
    "adadelta_initial_state",
    "adadelta_update",
    "AdafactorResult",
    "adafactor_initial_state",
    "adafactor_update",
    "LambResult",
    "lamb_initial_state",
    "lamb_update",
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
    "PartialRowWiseAdamResult",
    "partial_rowwise_adam_initial_state",
    "partial_rowwise_adam_rows",
    "partial_rowwise_adam_update",
    "RowWiseAdagradResult",
    "rowwise_adagrad_initial_state",
    "rowwise_adagrad_rows",
    "rowwise_adagrad_sequential_update",
    "rowwise_adagrad_update",
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
    "global_norm",
    "initial_accumulator",
    "initial_velocity",
    "lazy_adam_update",
    "LionResult",
    "lion_initial_state",
    "lion_update",
    "RAdamResult",
    "radam_initial_state",
    "radam_update",
    "rmsprop_initial_state",
    "rmsprop_update",
    "sgd_sparse_scatter_update",
    "sgd_sparse_torch_update",
    "sgd_sparse_torch_momentum_update",
    "SparseMomentumBuffer",
    "sgd_update",
]
