"""refopt: the numerical ground truth for gradient-based optimizers.

Pure-NumPy reference optimizers that reproduce TensorFlow/Keras formula for formula and in the
same order of operations (:mod:`refopt.reference`), stateful optimizers with the tf.keras 2.11+
API (:class:`Adam`, :class:`AdamW`, :class:`LazyAdam`, :class:`SGD`), learning-rate schedules
(:mod:`refopt.schedules`) and the sparse gradient type :class:`IndexedSlices`.
"""

from refopt.indexed_slices import IndexedSlices
from refopt import lr_scheduler, reference, schedules
from refopt import optax_schedules  # optax's schedules (issue 12 item 8)
from refopt.optimizers import (
    ASGD,
    SGD,
    SGDW,
    Adadelta,
    Adafactor,
    Adagrad,
    Adam,
    Adam8bit,
    AdamW,
    AdamW8bit,
    Adamax,
    Ftrl,
    ProximalAdagrad,
    ProximalGradientDescent,
    Lamb,
    LazyAdam,
    Lion,
    Lion8bit,
    Nadam,
    Optimizer,
    PartialRowWiseAdam,
    RAdam,
    RMSprop,
    Rprop,
    RowWiseAdagrad,
)
# the wrappers (not in __all__: the per-class shortcuts are for optimizers; see
# refopt.optimizers.WRAPPERS)
from refopt.optimizers.loss_scale import GradScaler as GradScaler
from refopt.optimizers.loss_scale import LossScaleOptimizer as LossScaleOptimizer
from refopt.optimizers.multi_steps import MultiSteps as MultiSteps
from refopt.optimizers.averaging import SWA as SWA  # TF-Addons' (keras2)
from refopt.optimizers.averaging import MovingAverage as MovingAverage
from refopt.master_weights import MasterWeights  # float32 masters of float16/bfloat16
from refopt.checkpoint import load_checkpoint, save_checkpoint
from refopt import functional

__version__ = "0.1.0"

__all__ = [
    "Adadelta",
    "Adafactor",
    "Lamb",
    "Adagrad",
    "Adam",
    "Adamax",
    "ASGD",
    "Rprop",
    "RowWiseAdagrad",
    "PartialRowWiseAdam",
    "AdamW",
    "Adam8bit",
    "AdamW8bit",
    "Lion8bit",
    "Ftrl",
    "ProximalAdagrad",
    "ProximalGradientDescent",
    "functional",
    "IndexedSlices",
    "LazyAdam",
    "MasterWeights",
    "Lion",
    "Nadam",
    "Optimizer",
    "RAdam",
    "RMSprop",
    "SGD",
    "SGDW",
    "load_checkpoint",
    "reference",
    "save_checkpoint",
    "schedules",
    "lr_scheduler",
    "optax_schedules",
    "__version__",
]

# The adapters and the distributed package import their framework (torch, jax/optax, mpi4py) on
# first use: `import refopt` never does, and `refopt.optax.adam(...)` works after it.
_LAZY_SUBMODULES = ("torch", "optax", "distributed", "testing")


def __getattr__(name):
    if name in _LAZY_SUBMODULES:
        import importlib

        return importlib.import_module(f"refopt.{name}")
    raise AttributeError(f"module 'refopt' has no attribute {name!r}")
