"""The executors: where a backend keeps the state and how it runs one step.

Layers of one step (each imports only the layers below it)::

    refopt.optimizers   the API: classes, hyperparameters, slots, config       (api)
    refopt.pipeline     the order of apply_gradients, written once             (pipeline)
    refopt.executors    reference | cpu | cuda, behind :class:`Executor`        (executors)
    refopt.rules, refopt.reference, refopt.kernels   the numbers                (rules, reference)

The pipeline calls an executor through the small interface below and never asks which one it
has; the optimizer classes hold one (``opt._executor``) and their pure-function table
(``opt._kernels``) and do not know which backend runs.

- :mod:`~refopt.executors.reference`: NumPy; the state is one array per variable and slot;
  a step is :func:`refopt.executors.staged.compute` then :func:`~refopt.executors.staged.commit`.
- :mod:`~refopt.executors.cpu`: Numba; flat state per dtype, fused rule-built kernels
  (:mod:`refopt.kernels.cpu.drivers`), the staged step with the CPU pure functions otherwise.
- :mod:`~refopt.executors.cuda`: numba-cuda; device state, rule-built kernels
  (:mod:`refopt.kernels.cuda.drivers`), the staged step on host copies otherwise.

:mod:`~refopt.executors.plan` turns an optimizer's convention into the clip, decay and EMA
modes and scalars that both fused executors pass to their kernels.
"""

from __future__ import annotations

import logging
import os

__all__ = ["Executor", "get_executor", "default_backend", "BACKENDS"]

#: The backends.
BACKENDS = ("reference", "cpu", "cuda")


class Executor:
    """What the pipeline needs from a backend. Subclasses implement every method.

    Attributes
    ----------
    name : str
        The backend's name (``"reference"``, ``"cpu"``, ``"cuda"``).
    kernels : module
        The pure functions of the staged step (``adam_update``, ``clip_by_norm``, ...), with
        :mod:`refopt.reference`'s signatures: :mod:`refopt.reference` itself, or
        :mod:`refopt.kernels.cpu` / :mod:`refopt.kernels.cuda`.
    """

    name = None
    kernels = None

    def check_var_list(self, var_list, what):
        """``var_list`` as a list after checking each variable; raises TypeError/ValueError."""
        raise NotImplementedError

    def check_pairs(self, grads_and_vars):
        """Validate a step's pairs: a list of ``(gradient, variable, (shape, dtype))``.

        Each gradient as the executor will read it (a device array for ``cuda``), ``None``
        kept. Raises what tf-keras raises for malformed pairs (TypeError, ValueError).
        """
        raise NotImplementedError

    def allocate(self, opt, var_list):
        """The state of ``opt`` for ``var_list``: an object with ``slots`` (dict of name ->
        list of arrays, one per variable) and ``averages`` (list; empty without EMA)."""
        raise NotImplementedError

    def quick_step(self, opt, grads_and_vars, lr_value):
        """Run the common step of a built optimizer after cheap checks, if the executor has
        such a path: the positions of the updated variables, or None (nothing touched; the
        pipeline then validates in full and calls :meth:`run_step`)."""
        return None

    def run_step(self, opt, positions, grads, lr_value):
        """Apply one step (clip, deduplicate, decay, update, EMA) to the built variables at
        ``positions`` with their validated gradients. Either raises having changed nothing,
        or completes; the pipeline moves the counters."""
        raise NotImplementedError

    def finalize(self, opt, positions):
        """Overwrite the variables at ``positions`` with their EMA averages."""
        raise NotImplementedError

    def checkpoint_arrays(self, variables):
        """``(variables, arrays)`` for a checkpoint: the variables as a list, and arrays with
        ``shape``/``dtype`` to read and write them (the variables themselves on the host)."""
        raise NotImplementedError


_EXECUTORS = {}

#: The environment variable that chooses the backend of optimizers created without ``backend=``.
BACKEND_ENV = "REFOPT_BACKEND"


def default_backend():
    """The backend an optimizer gets when ``backend`` is not given (``None``).

    ``$REFOPT_BACKEND`` when set (``"reference"``, ``"cpu"`` or ``"cuda"``), else ``"cpu"``
    (Numba, a dependency of refopt): every backend gives the reference's bits, so the fast
    one is the safe default; its kernels compile on first use (see :func:`resolve_backend`).

    Raises
    ------
    ValueError
        ``$REFOPT_BACKEND`` set to an unknown name.
    """
    env = os.environ.get(BACKEND_ENV)
    if env is None or env == "":
        return "cpu"
    if env not in BACKENDS:
        raise ValueError(f"${BACKEND_ENV} must be one of {BACKENDS}. Received: "
                         f"{BACKEND_ENV}={env!r}")
    return env


_NOTICE_GIVEN = False


def resolve_backend(backend):
    """``backend``, or the default when it is ``None``; the first default ``"cpu"`` of the
    process logs once (logger ``"refopt"``, level WARNING, as JAX says which backend it took)
    that the kernels compile on first use and where they are cached."""
    global _NOTICE_GIVEN
    if backend is not None:
        return backend
    backend = default_backend()
    if backend == "cpu" and not _NOTICE_GIVEN and os.environ.get(BACKEND_ENV) != "cpu":
        _NOTICE_GIVEN = True
        from refopt.kernels.cpu.drivers import _cache_dir

        logging.getLogger("refopt").warning(
            "refopt uses backend='cpu' (Numba kernels, bit-identical to backend='reference'). "
            "Each optimizer's kernels compile on their first step (seconds each; up to tens "
            "of seconds on a loaded machine), then load from the cache in %s. "
            "backend='reference' or %s=reference gives plain NumPy; %s=cpu silences this "
            "note.", _cache_dir(), BACKEND_ENV, BACKEND_ENV)
    return backend


def get_executor(backend):
    """The executor of ``backend`` (created once).

    Raises
    ------
    ValueError
        An unknown backend name.
    RuntimeError
        ``"cuda"`` without numba-cuda, or without a GPU and the CUDA simulator.
    """
    ex = _EXECUTORS.get(backend)
    if ex is not None:
        if backend == "cuda":
            ex.require_device()
        return ex
    if backend == "reference":
        from refopt.executors.reference import ReferenceExecutor as cls
    elif backend == "cpu":
        from refopt.executors.cpu import CpuExecutor as cls
    elif backend == "cuda":
        from refopt.executors.cuda import CudaExecutor as cls
    else:
        raise ValueError(f"`backend` must be one of {BACKENDS}. Received: backend={backend!r}")
    ex = cls()
    if backend == "cuda":
        ex.require_device()
    _EXECUTORS[backend] = ex
    return ex
