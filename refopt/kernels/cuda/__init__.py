"""The CUDA backend: numba-cuda kernels, their host launchers and the reference's functions.

Importing this module imports ``numba.cuda`` (``refopt`` itself never does; the optimizers
import it only for ``backend="cuda"``). Two layers:

- :mod:`refopt.kernels.cuda._kernels`: the ``@cuda.jit`` kernels (elementwise in the
  reference's order; the dense updates are multi-tensor kernels driven by a segment table).
- :mod:`refopt.kernels.cuda._launch`: in-place host launchers on device arrays (numba's, or
  anything with ``__cuda_array_interface__``: CuPy, PyTorch CUDA tensors, see
  :func:`as_device`): ``adam_multi``/``sgd_multi`` (a group of tensors, one launch per up to
  ``config.TENSORS_PER_LAUNCH``), ``adam_dense``/``sgd_dense`` (one tensor),
  ``lazy_adam_rows``, ``clip_dense``, ``decay_dense``, ``ema_dense``, ``sumsq``, ``copy``.
  The optimizers' ``backend="cuda"`` path (:mod:`refopt.optimizers._cuda`) calls these.
Set ``config.THREADS_PER_BLOCK`` (and ``ITEMS_PER_THREAD``, ``TENSORS_PER_LAUNCH``) before
launching to change the launch shape. Never run on a real GPU yet.
"""

from refopt.kernels.cuda import config
from refopt.kernels.cuda._launch import (  # noqa: F401  (the launchers, public here)
    DTYPES,
    Segments,
    adam_dense,
    adam_multi,
    as_device,
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
    simulator,
    sorted_rows,
    sumsq,
    to_device,
    zeros_like,
)

__all__ = [
    "DTYPES",
    "Segments",
    "adam_dense",
    "adam_multi",
    "as_device",
    "clip_dense",
    "config",
    "copy",
    "decay_dense",
    "ema_dense",
    "is_device_array",
    "lazy_adam_rows",
    "require_device",
    "sgd_dense",
    "sgd_multi",
    "simulator",
    "sumsq",
    "to_device",
]
