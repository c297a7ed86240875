"""Shared pieces of refopt.distributed: partitions, agreement on errors and settings, the
elementwise list, rebuilding the wrapped optimizer."""

from __future__ import annotations

import hashlib
import json
import zlib

import numpy as np

__all__ = ["ELEMENTWISE", "PER_TENSOR", "DistributedError", "ShardedCheckpointError", "agree",
           "bounds", "crc32", "qualified_name", "rebuild"]

#: Optimizers whose update (after clipping) is elementwise given per-step scalars: a slice
#: of a flat buffer is updated exactly as the whole. Lamb and Adafactor reduce per tensor.
ELEMENTWISE = ("Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad", "Adadelta",
               "Adamax", "Nadam", "Lion", "RAdam", "ASGD", "Rprop", "Ftrl", "ProximalAdagrad",
               "ProximalGradientDescent")

#: Optimizers whose update reduces over each tensor (Lamb's trust-ratio norms, Adafactor's
#: factored moments, update RMS and parameter scale): sharded a whole tensor per rank, so
#: every reduction is the single-process one. RowWiseAdagrad's dense step reduces per row.
PER_TENSOR = ("Lamb", "Adafactor", "RowWiseAdagrad")


class DistributedError(RuntimeError):
    """A collective step that failed on some rank for a reason outside refopt's checks."""


class ShardedCheckpointError(ValueError):
    """A sharded checkpoint whose content is malformed, inconsistent, truncated or altered,
    or of another optimizer or variables (raised on every rank; nothing was loaded)."""


_TYPES = {t.__name__: t for t in (
    TypeError, ValueError, KeyError, OverflowError, NotImplementedError, OSError,
    FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError, NotADirectoryError,
    ShardedCheckpointError)}

#: The longest repr of a setting shown in a mismatch message; longer ones show a digest.
_SHOWN = 80


def bounds(total, size):
    """``size + 1`` boundaries of the balanced contiguous partition of ``total`` elements:
    rank ``r`` owns ``[b[r], b[r + 1])`` (the first ``total % size`` ranks one more)."""
    return [(total * r) // size for r in range(size + 1)]


def crc32(array):
    """CRC-32 of a C-contiguous array's bytes (zero-size arrays included)."""
    return zlib.crc32(array.reshape(-1).view(np.uint8))


def qualified_name(cls):
    """``module.QualName`` of a class: two classes of one ``__name__`` differ here."""
    return f"{cls.__module__}.{cls.__qualname__}"


def shown(value):
    """A short, comparable text for a setting: its repr, or a digest of a long one."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= _SHOWN:
        return text
    return f"<{len(text)} characters, SHA-256 {hashlib.sha256(text.encode()).hexdigest()[:16]}>"


def config_text(optimizer, learning_rate=True):
    """``optimizer.get_config()`` without the keys that do not change the numbers (``name``,
    ``backend``, ``jit_compile``), as canonical JSON text; a schedule's class named by its
    qualified name; ``learning_rate=False``: without the learning rate."""
    from refopt import schedules

    drop = ("name", "backend", "jit_compile") + (() if learning_rate else ("learning_rate",))
    config = {k: v for k, v in optimizer.get_config().items() if k not in drop}
    if learning_rate and isinstance(optimizer._learning_rate, schedules.LearningRateSchedule):
        config["learning_rate_class"] = qualified_name(type(optimizer._learning_rate))
    return json.dumps(config, sort_keys=True,
                      default=lambda o: o.item() if hasattr(o, "item") else repr(o))


def config_settings(optimizer):
    """:func:`config_text` as settings for :func:`agree`, one entry per key (so that a
    mismatch names the keys that differ)."""
    config = json.loads(config_text(optimizer))
    return {f"config[{k!r}]": shown(json.dumps(v, sort_keys=True)) for k, v in config.items()}


def current_learning_rate(optimizer, step):
    """The learning rate ``optimizer`` uses at ``step`` (a schedule evaluated there), a
    float; raises ValueError for a schedule that gives a bad value."""
    from refopt import schedules

    lr = optimizer._learning_rate
    if isinstance(lr, schedules.LearningRateSchedule):
        return optimizer._evaluate_schedule(lr, step)
    return lr


def agree(comm, error, settings=None, what="The settings"):
    """Make every rank raise the same error if any rank has one, or if ``settings`` differ
    between ranks (one collective).

    Parameters
    ----------
    comm : Communicator
    error : BaseException or None
        This rank's error (caught before anything was written), or None.
    settings : dict of str to str, optional
        What must be identical on every rank (name to a short text, see :func:`shown`);
        compared only when no rank has an error.
    what : str
        How the message names the settings' owner.

    Raises
    ------
    TypeError, ValueError, KeyError, OSError, ShardedCheckpointError, ...
        On every rank, the type of the lowest failing rank's error (``DistributedError`` for
        types not listed), its message prefixed with that rank and the list of failing ranks.
    ValueError
        On every rank, when ``settings`` differ: each setting that differs, with the ranks
        holding each value.
    """
    mine = None if error is None else (type(error).__name__, str(error))
    reports = comm.allgather_obj((mine, settings))
    failed = [r for r, (rep, _) in enumerate(reports) if rep is not None]
    if failed:
        name, msg = reports[failed[0]][0]
        others = "" if len(failed) == 1 else f" (ranks {failed} failed; the first is shown)"
        raise _TYPES.get(name, DistributedError)(f"rank {failed[0]}: {name}: {msg}{others}")
    if settings is None:
        return
    every = [s for _, s in reports]
    diffs = []
    for key in every[0]:
        values = [s.get(key) for s in every]
        if any(v != values[0] for v in values):
            ranks = {}
            for r, v in enumerate(values):
                ranks.setdefault(v, []).append(r)
            diffs.append(f"{key} (" + "; ".join(f"ranks {rs}: {v}" for v, rs in ranks.items())
                         + ")")
    if diffs:
        raise ValueError(
            f"{what} differ between ranks: {', '.join(diffs)}. Every rank must construct it "
            "with the same optimizer (class, configuration, iterations), variables or table "
            "and arguments, and make the same changes (learning rate) between steps.")


def rebuild(optimizer, iterations, **overrides):
    """A new unbuilt optimizer of ``optimizer``'s class and configuration (``overrides``
    replacing keys of ``get_config()``), at ``iterations``.

    A learning-rate schedule is the same object, not a ``from_config`` copy (a schedule class
    of the user's own is then not looked up by name, and its state is kept); it is
    evaluated at ``iterations`` (ValueError where it gives a bad learning rate there).
    """
    from refopt import schedules

    config = dict(optimizer.get_config())
    config.update(overrides)
    schedule = optimizer._learning_rate
    is_schedule = isinstance(schedule, schedules.LearningRateSchedule)
    if is_schedule:
        config["learning_rate"] = 0.0  # a placeholder, replaced by the schedule below
    local = type(optimizer).from_config(config)
    local.iterations = iterations
    if is_schedule:
        local.learning_rate = schedule  # evaluated at ``iterations``
    return local


def check_micro_batches(micro_batches, size):
    """``micro_batches`` as an int K that ``size`` divides; ValueError otherwise."""
    if (not isinstance(micro_batches, (int, np.integer)) or isinstance(micro_batches, bool)
            or micro_batches < 1):
        raise ValueError("`micro_batches` must be an int >= 1. Received: "
                         f"micro_batches={micro_batches!r}")
    if micro_batches % size:
        raise ValueError(
            f"`micro_batches` must be a multiple of the number of ranks ({size}) so that every "
            f"rank computes the same number of micro-batches. Received: "
            f"micro_batches={micro_batches!r}")
    return int(micro_batches)
