"""The CUDA backend: numba-cuda kernels, their host launchers and the reference's functions.

Importing this module imports ``numba.cuda`` (``refopt`` itself never does; the optimizers
import it only for ``backend="cuda"``). Three layers:

- :mod:`refopt.kernels.cuda.drivers`: every ``@cuda.jit`` kernel, built from a rule
  (:mod:`refopt.rules`: each update, and the pipeline's clip, decay and EMA steps, defined
  once): multi-tensor ``dense`` kernels driven by a segment table, ``rows`` (lazy sparse)
  and ``table`` (whole-table sparse) kernels, and NumPy's pairwise sums of squares.
- :mod:`refopt.kernels.cuda._launch`: in-place host launchers on device arrays (numba's, or
  anything with ``__cuda_array_interface__``: CuPy, PyTorch CUDA tensors, see
  :func:`as_device`): ``adam_multi``/``sgd_multi`` (a group of tensors, one launch per up to
  ``config.TENSORS_PER_LAUNCH``), ``adam_dense``/``sgd_dense`` (one tensor),
  ``lazy_adam_rows``, ``adam_sparse``/``sgd_sparse`` (tf-keras' non-lazy sparse updates of
  a whole table), ``clip_dense``, ``decay_dense``, ``ema_dense``, ``sumsq``, ``copy``.
  The optimizers' ``backend="cuda"`` path (:mod:`refopt.executors.cuda`) calls these.
- The mirror of :mod:`refopt.reference`, file for file (``adam.py``, ``clipping.py``, ...):
  ``adam_update``, ``lazy_adam_update``, ``sgd_update``, ``apply_weight_decay``,
  ``clip_by_value``, ``clip_by_norm``, ``global_norm``, ``clip_by_global_norm``,
  ``ema_update``, ``rmsprop_update``, with the reference's signatures, checks and result
  types (the rules' ``pure_update`` bodies, shared with :mod:`refopt.kernels.cpu`, on
  :func:`drivers.apply` and :func:`drivers.apply_sparse`). They take host NumPy arrays,
  copy them to the device, run the rules' kernels and return new host arrays (inputs
  untouched). On the simulator the elementwise results are bit-identical to the reference;
  norms are NumPy's pairwise sums. float16 is computed on the device in float32, rounded to
  float16 after every operation, as NumPy does.
- :mod:`refopt.kernels.cuda.halfbits`: exact float16/bfloat16 <-> float32 conversions on
  uint16 bits, for the optimizers' float16/bfloat16 variables computed in float32
  (``to_device`` of an ``ml_dtypes.bfloat16`` host array gives a bfloat16 device array).

Set ``config.THREADS_PER_BLOCK`` (and ``ITEMS_PER_THREAD``, ``TENSORS_PER_LAUNCH``) before
launching to change the launch shape. ``python -m refopt.kernels.cuda.ptx`` compiles every
kernel to PTX (no GPU needed) and audits it. Never run on a real GPU yet.
"""

from refopt.kernels.cuda import config
from refopt.kernels.cuda._launch import (  # noqa: F401  (the launchers, public here)
    DTYPES,
    Segments,
    adam_dense,
    adam_multi,
    adam_sparse,
    as_device,
    check_config,
    clip_args,
    clip_dense,
    copy,
    cuda,
    decay_dense,
    ema_dense,
    is_device_array,
    lazy_adam_rows,
    require_device,
    sgd_dense,
    sgd_multi,
    sgd_sparse,
    simulator,
    sorted_rows,
    sumsq,
    to_device,
    zeros_like,
)
from refopt.kernels.cuda.adagrad import adagrad_update
from refopt.kernels.cuda.adadelta import adadelta_update
from refopt.kernels.cuda.adafactor import adafactor_update
from refopt.kernels.cuda.lamb import lamb_update
from refopt.reference.adafactor import AdafactorResult, adafactor_initial_state
from refopt.reference.lamb import LambResult, lamb_initial_state
from refopt.kernels.cuda.adam import adam_update
from refopt.reference.adadelta import AdadeltaResult, adadelta_initial_state
from refopt.kernels.cuda.adamax import adamax_update
from refopt.kernels.cuda.nadam import nadam_update
from refopt.kernels.cuda.asgd import asgd_update
from refopt.kernels.cuda.rprop import rprop_update
from refopt.reference.partial_rowwise_adam import (
    PartialRowWiseAdamResult,
    partial_rowwise_adam_initial_state,
    partial_rowwise_adam_rows,
    partial_rowwise_adam_update,
)
from refopt.kernels.cuda.rowwise_adagrad import (
    RowWiseAdagradResult,
    rowwise_adagrad_initial_state,
    rowwise_adagrad_rows,
    rowwise_adagrad_sequential_update,
    rowwise_adagrad_update,
)
from refopt.kernels.cuda.clipping import (
    clip_by_global_norm,
    clip_by_norm,
    clip_by_value,
    global_norm,
)
from refopt.kernels.cuda.ema import ema_update
from refopt.kernels.cuda.ftrl import ftrl_update
from refopt.kernels.cuda.proximal import (
    proximal_adagrad_update,
    proximal_gradient_descent_update,
)
from refopt.reference.proximal import (
    ProximalAdagradResult,
    ProximalGradientDescentResult,
    proximal_adagrad_initial_state,
)
from refopt.reference.ftrl import FtrlResult, ftrl_initial_state
from refopt.kernels.cuda.lazy_adam import lazy_adam_update
from refopt.kernels.cuda.lion import lion_update
from refopt.kernels.cuda.radam import radam_update
from refopt.reference.lion import LionResult, lion_initial_state
from refopt.reference.radam import RAdamResult, radam_initial_state
from refopt.kernels.cuda.rmsprop import rmsprop_update
from refopt.kernels.cuda.sgd import (
    sgd_sparse_scatter_update,
    sgd_sparse_torch_update,
    sgd_update,
)
from refopt.kernels.cuda.weight_decay import apply_weight_decay
# torch's sparse momentum buffer: a serial merge of two entry lists, computed on the host
# (the optimizer takes the host step; these are the reference's own functions)
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
    "DTYPES",
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
    "Segments",
    "adagrad_initial_state",
    "adagrad_update",
    "adam_dense",
    "adam_multi",
    "adam_scalars",
    "adam_sparse",
    "adam_update",
    "apply_weight_decay",
    "as_device",
    "check_config",
    "clip_by_global_norm",
    "clip_by_norm",
    "clip_by_value",
    "clip_dense",
    "config",
    "copy",
    "decay_dense",
    "ema_dense",
    "ema_update",
    "global_norm",
    "initial_accumulator",
    "initial_velocity",
    "is_device_array",
    "lazy_adam_rows",
    "lazy_adam_update",
    "LionResult",
    "lion_initial_state",
    "lion_update",
    "RAdamResult",
    "radam_initial_state",
    "radam_update",
    "rmsprop_initial_state",
    "rmsprop_update",
    "require_device",
    "sgd_dense",
    "sgd_multi",
    "sgd_sparse",
    "sgd_sparse_scatter_update",
    "sgd_sparse_torch_update",
    "sgd_sparse_torch_momentum_update",
    "SparseMomentumBuffer",
    "sgd_update",
    "simulator",
    "sumsq",
    "to_device",
]
