"""refopt: the numerical ground truth for gradient-based optimizers.

Pure-NumPy reference optimizers that reproduce TensorFlow/Keras formula for formula and in the
same order of operations (:mod:`refopt.reference`), stateful optimizers with the tf.keras 2.11+
API (:class:`Adam`, :class:`AdamW`, :class:`LazyAdam`, :class:`SGD`), learning-rate schedules
(:mod:`refopt.schedules`) and the sparse gradient type :class:`IndexedSlices`.
"""

from refopt.indexed_slices import IndexedSlices
from refopt import reference, schedules
from refopt.optimizers import SGD, Adagrad, Adam, AdamW, LazyAdam, Optimizer, RMSprop
from refopt.checkpoint import load_checkpoint, save_checkpoint

__version__ = "0.1.0"

__all__ = [
    "Adagrad",
    "Adam",
    "AdamW",
    "IndexedSlices",
    "LazyAdam",
    "Optimizer",
    "RMSprop",
    "SGD",
    "load_checkpoint",
    "reference",
    "save_checkpoint",
    "schedules",
    "__version__",
]
