"""refopt: the numerical ground truth for gradient-based optimizers.

Pure-NumPy reference optimizers that reproduce TensorFlow/Keras formula for formula and in the
same order of operations (:mod:`refopt.reference`), stateful optimizers with the tf.keras 2.11+
API (:class:`Adam`, :class:`AdamW`, :class:`LazyAdam`, :class:`SGD`), learning-rate schedules
(:mod:`refopt.schedules`) and the sparse gradient type :class:`IndexedSlices`.
"""

from refopt.indexed_slices import IndexedSlices
from refopt import reference, schedules
from refopt.optimizers import (
    ASGD,
    SGD,
    Adadelta,
    Adafactor,
    Adagrad,
    Adam,
    AdamW,
    Adamax,
    Ftrl,
    ProximalAdagrad,
    ProximalGradientDescent,
    Lamb,
    LazyAdam,
    Lion,
    Nadam,
    Optimizer,
    RAdam,
    RMSprop,
    Rprop,
    RowWiseAdagrad,
)
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
    "AdamW",
    "Ftrl",
    "ProximalAdagrad",
    "ProximalGradientDescent",
    "functional",
    "IndexedSlices",
    "LazyAdam",
    "Lion",
    "Nadam",
    "Optimizer",
    "RAdam",
    "RMSprop",
    "SGD",
    "load_checkpoint",
    "reference",
    "save_checkpoint",
    "schedules",
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
