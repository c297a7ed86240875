"""The ``refopt`` command line (also ``python -m refopt``).

Subcommands:

``refopt demo``
    Train word2vec skip-gram embeddings with :class:`~refopt.LazyAdam` on a real corpus and report
    the loss, nearest neighbours and speed (see :mod:`refopt.demo`).

``refopt golden``
    Write a trajectory (inputs and refopt's state after every step) to ``.npz`` and JSON, for test
    suites in other languages (format: :mod:`refopt.testing.golden`).

``refopt check MODULE:OBJECT``
    Check another implementation against refopt with Hypothesis-generated trajectories
    (:func:`refopt.testing.assert_conforms`); exit status 0 when it conforms, 1 when it diverges,
    2 for a usage error.

Adding a subcommand: write ``_add_NAME(subparsers)``, which registers its parser with
``set_defaults(handler=_run_NAME)``, and list it in :data:`_SUBCOMMANDS`. A handler takes the parsed
arguments and returns an exit status; it raises :class:`CommandError` for a failure the user
caused (bad file, unsupported option value), which :func:`main` reports as one line on stderr with
exit status 2, argparse's convention for usage errors.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
import time

__all__ = ["CommandError", "build_parser", "main"]


class CommandError(Exception):
    """A user-facing failure: :func:`main` prints ``refopt CMD: error: MESSAGE`` and returns 2."""


# ---------------------------------------------------------------------------------------------
# argument types


def _int_at_least(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid integer value" messages
    return parse


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def _nonnegative_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a non-negative finite number, got {text}")
    return value


# ---------------------------------------------------------------------------------------------
# refopt demo

#: Words whose neighbours ``refopt demo`` shows by default (the first few present are used).
DEMO_QUERY_WORDS = (
    "function", "class", "string", "list", "file", "error",
    "exception", "module", "dictionary", "integer",
)
_DEMO_MAX_QUERIES = 6


def _demo_optimizers():
    from refopt.demo import DEMO_OPTIMIZERS

    return DEMO_OPTIMIZERS


def _add_demo(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train word2vec embeddings with LazyAdam (or --optimizer) on a real corpus",
        description=(
            "Train skip-gram word embeddings with negative sampling (word2vec SGNS) with "
            "LazyAdam (or --optimizer NAME), which updates the input and output embedding "
            "tables from IndexedSlices gradients (many duplicate rows per batch), and say "
            "which update the optimizer applies to the rows. Prints the corpus summary, the mean "
            "loss per epoch, the nearest neighbours of a few frequent words and the speed. "
            "The default corpus is the CPython documentation shipped with Python "
            "(pydoc_data.topics). With the defaults it takes about 10 seconds on two CPU cores."
        ),
    )
    data = p.add_argument_group("corpus")
    data.add_argument(
        "--corpus", metavar="PATH",
        help="UTF-8 text file to train on (default: the CPython documentation, "
        "pydoc_data.topics)",
    )
    data.add_argument(
        "--max-tokens", type=_int_at_least(1), metavar="N",
        help="use only the first N tokens of the corpus (default: all)",
    )
    data.add_argument(
        "--min-count", type=_int_at_least(1), default=5, metavar="N",
        help="ignore words occurring fewer than N times (default: %(default)s)",
    )
    data.add_argument(
        "--vocab-size", type=_int_at_least(2), default=5000, metavar="N",
        help="keep at most the N most frequent words (default: %(default)s)",
    )
    data.add_argument(
        "--sample", type=_nonnegative_float, default=1e-3, metavar="T",
        help="subsample frequent words with word2vec's threshold T; 0 keeps all "
        "(default: %(default)s)",
    )
    model = p.add_argument_group("model and training")
    model.add_argument(
        "--epochs", type=_int_at_least(1), default=20, metavar="N",
        help="passes over the corpus (default: %(default)s)",
    )
    model.add_argument(
        "--dim", type=_int_at_least(1), default=100, metavar="N",
        help="embedding dimension (default: %(default)s)",
    )
    model.add_argument(
        "--window", type=_int_at_least(1), default=5, metavar="N",
        help="maximum distance of a context word; each center draws its window from 1..N "
        "(default: %(default)s)",
    )
    model.add_argument(
        "--negatives", type=_int_at_least(0), default=5, metavar="K",
        help="negative samples per (center, context) pair (default: %(default)s)",
    )
    model.add_argument(
        "--batch-size", type=_int_at_least(1), default=1024, metavar="N",
        help="(center, context) pairs per optimizer step (default: %(default)s)",
    )
    model.add_argument(
        "--optimizer", default="LazyAdam", choices=sorted(_demo_optimizers()),
        metavar="NAME",
        help="the optimizer that updates both embedding tables from IndexedSlices gradients: "
        + ", ".join(f"{k} (learning rate {v:g})" for k, v in _demo_optimizers().items())
        + " (default: %(default)s)",
    )
    model.add_argument(
        "--learning-rate", type=_positive_float, default=None, metavar="LR",
        help="learning rate (default: the optimizer's, see --optimizer)",
    )
    model.add_argument(
        "--seed", type=_int_at_least(0), default=0, metavar="N",
        help="seed of the initial embeddings and all random draws (default: %(default)s)",
    )
    model.add_argument(
        "--backend", default="cpu",
        help="the optimizer's backend: cpu (Numba kernels, bit-identical to the reference) "
        "or reference (pure NumPy) (default: %(default)s)",
    )
    model.add_argument(
        "--no-compare", action="store_true",
        help="with --backend cpu, skip timing the optimizer step against the reference at the end",
    )
    out = p.add_argument_group("output")
    out.add_argument(
        "--words", metavar="W,W,...",
        help="comma-separated words whose nearest neighbours to show (default: the first "
        f"{_DEMO_MAX_QUERIES} present of {', '.join(DEMO_QUERY_WORDS)})",
    )
    out.add_argument(
        "--out", metavar="DIR",
        help="write embeddings.npz (embeddings, context_embeddings, vocab, counts, losses) and, "
        "if matplotlib is installed, loss.png to DIR (created if needed)",
    )
    out.add_argument(
        "--quiet", action="store_true",
        help="no progress bar (it is shown only when stderr is a terminal anyway)",
    )
    p.set_defaults(handler=_run_demo)


def _run_demo(args):
    import numpy as np

    from refopt import demo

    wall_start = time.perf_counter()

    try:
        text, corpus_name = demo.load_corpus(args.corpus)
    except FileNotFoundError:
        raise CommandError(f"corpus file not found: {args.corpus}") from None
    except UnicodeDecodeError as exc:
        raise CommandError(f"corpus file is not UTF-8 text: {args.corpus} ({exc.reason} "
                           f"at byte {exc.start})") from None
    except OSError as exc:
        raise CommandError(f"cannot read corpus file {args.corpus}: {exc.strerror or exc}") from None
    all_tokens = demo.tokenize(text)
    tokens = all_tokens[: args.max_tokens] if args.max_tokens else all_tokens

    vocab = demo.build_vocabulary(tokens, min_count=args.min_count, max_size=args.vocab_size)
    if len(vocab) < 2:
        raise CommandError(
            f"corpus too small: {len(vocab)} distinct word(s) occur at least {args.min_count} "
            f"times in {len(tokens):,} tokens, at least 2 are needed (lower --min-count or use "
            "a larger corpus)"
        )

    if args.backend == "cuda":
        raise CommandError("--backend cuda: the demo trains host (NumPy) tables; use "
                           "--backend cpu or reference (backend='cuda' takes device arrays)")
    try:
        optimizer = demo.make_optimizer(args.learning_rate, args.backend, args.optimizer)
    except (NotImplementedError, ValueError) as exc:
        option = "--backend" if "backend" in str(exc) else "--learning-rate"
        value = args.backend if option == "--backend" else args.learning_rate
        raise CommandError(f"{option} {value}: {_one_line(exc)}") from None

    out_dir = None
    if args.out:
        out_dir = args.out
        try:
            os.makedirs(out_dir, exist_ok=True)
        except OSError as exc:
            raise CommandError(f"cannot create output directory {out_dir}: "
                               f"{exc.strerror or exc}") from None
        # Fail before training, not after it, when the outputs cannot be written.
        for name in ("embeddings.npz", "loss.png"):
            target = os.path.join(out_dir, name)
            if os.path.isdir(target):
                raise CommandError(f"cannot write {target}: it is a directory")
        if not os.access(out_dir, os.W_OK):
            raise CommandError(f"cannot write to output directory {out_dir}: permission denied")

    covered = int(vocab.counts.sum())
    capped = f" (first {len(tokens):,} of {len(all_tokens):,})" if len(tokens) < len(all_tokens) else ""
    opt_name = args.optimizer
    lr = optimizer.learning_rate
    print(f"refopt demo: word2vec skip-gram with negative sampling, {opt_name} "
          f"(backend {args.backend!r})")
    print(f"corpus      {corpus_name}")
    print(f"tokens      {len(tokens):,}{capped}")
    print(f"vocabulary  {len(vocab):,} words (min count {args.min_count}, at most "
          f"{args.vocab_size:,}), covering {covered:,} tokens ({covered / max(len(tokens), 1):.1%})")
    print(f"training    {args.epochs} epochs, dim {args.dim}, window {args.window}, "
          f"{args.negatives} negatives, batch {args.batch_size}, learning rate "
          f"{lr:g}, sample {args.sample:g}, seed {args.seed}")
    print(f"sparse      {demo.sparse_update(optimizer)}")
    sys.stdout.flush()

    reporter = _EpochReporter(show_bar=not args.quiet)
    try:
        result = demo.train_skipgram(
            tokens,
            epochs=args.epochs,
            dim=args.dim,
            window=args.window,
            negatives=args.negatives,
            batch_size=args.batch_size,
            min_count=args.min_count,
            vocab_size=args.vocab_size,
            sample=args.sample,
            seed=args.seed,
            optimizer=optimizer,
            progress=reporter,
        )
    finally:
        reporter.close()

    first, last = result.losses[0], result.losses[-1]
    if len(result.losses) == 1:
        print(f"loss        {first:.4f} after one epoch ({result.iterations:,} {opt_name} steps)")
    else:
        # "fell" only by more than the printed precision (a stuck run prints 4.1589 twice)
        trend = "fell" if last < first - 5e-5 else "did NOT fall"
        print(f"loss        {trend} from {first:.4f} to {last:.4f} "
              f"({result.iterations:,} {opt_name} steps)")

    queries = _query_words(args.words, result.vocab)
    if queries:
        print("nearest neighbours (cosine similarity in the input embeddings):")
        width = max(len(w) for w in queries)
        for word in queries:
            if word not in result.vocab:
                print(f"  {word:<{width}}  (not in the vocabulary)")
                continue
            near = demo.nearest_neighbours(result.embeddings, result.vocab, word, k=6)
            print(f"  {word:<{width}}  " + ", ".join(f"{w} {s:.2f}" for w, s in near))

    if out_dir is not None:
        npz = os.path.join(out_dir, "embeddings.npz")
        try:
            np.savez(
                npz,
                embeddings=result.embeddings,
                context_embeddings=result.context_embeddings,
                vocab=np.array(result.vocab, dtype=str),
                counts=result.counts,
                losses=np.array(result.losses, dtype=np.float64),
            )
            print(f"saved       {npz}")
            png = _plot_losses(result.losses, os.path.join(out_dir, "loss.png"))
        except OSError as exc:
            raise CommandError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
        if png:
            print(f"saved       {png}")
        else:
            print("note        matplotlib is not installed, so loss.png was not written "
                  "(pip install 'refopt[plot]')")

    if args.backend != "reference" and not args.no_compare:
        cmp = demo.compare_backends(
            result, backend=args.backend, baseline="reference", batch_size=args.batch_size,
            negatives=args.negatives, learning_rate=args.learning_rate, seed=args.seed,
            optimizer=opt_name,
        )
        ratio = (f"{cmp.speedup:.1f}x faster" if cmp.speedup >= 1
                 else f"{1 / cmp.speedup:.1f}x slower")
        print(f"optimizer   one {opt_name} step on {cmp.steps} replayed batches: {cmp.backend} "
              f"{cmp.backend_ms:.2f} ms, reference {cmp.baseline_ms:.2f} ms ({ratio}), results "
              f"{'bit-identical' if cmp.identical else 'DIFFERENT'}")

    wall = time.perf_counter() - wall_start
    print(f"time        {wall:.1f} s wall, {result.seconds:.1f} s training, "
          f"{result.tokens_per_second:,.0f} tokens/s ({result.corpus_tokens:,} tokens x "
          f"{len(result.losses)} epochs)")
    return 0


class _EpochReporter:
    """Progress callback for :func:`refopt.demo.train_skipgram`: a tqdm bar per epoch (stderr)
    and one printed line per finished epoch (stdout)."""

    def __init__(self, show_bar):
        self.show_bar = show_bar
        self.bar = None

    def __call__(self, p):
        if self.bar is None and p.batches:
            from tqdm import tqdm

            self.bar = tqdm(
                total=p.batches, desc=f"epoch {p.epoch}/{p.epochs}", unit="batch",
                leave=False, file=sys.stderr, dynamic_ncols=True,
                disable=None if self.show_bar else True,  # None: only on a terminal
            )
        if self.bar is not None:
            self.bar.update(p.batch - self.bar.n)
            if p.batch % 16 == 0:
                self.bar.set_postfix_str(f"loss {p.loss:.4f}", refresh=False)
        if p.batch == p.batches:
            self.close()
            rate = p.pairs / p.seconds if p.seconds > 0 else 0.0
            width = len(str(p.epochs))
            print(f"epoch {p.epoch:>{width}}/{p.epochs}  loss {p.loss:.4f}  "
                  f"{p.pairs:,} pairs  {p.seconds:.1f} s  ({rate:,.0f} pairs/s)")
            sys.stdout.flush()

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _query_words(words_option, vocab):
    if words_option:
        return [w.strip().lower() for w in words_option.split(",") if w.strip()]
    present = set(vocab)
    chosen = [w for w in DEMO_QUERY_WORDS if w in present][:_DEMO_MAX_QUERIES]
    if not chosen:  # a corpus without any of them: show the most frequent longer words
        chosen = [w for w in vocab if len(w) > 3][:_DEMO_MAX_QUERIES]
    return chosen


def _plot_losses(losses, path):
    """Write a loss-per-epoch plot to ``path``; return ``path``, or None without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return None
    fig = Figure(figsize=(5, 3.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    epochs = range(1, len(losses) + 1)
    ax.plot(epochs, losses, marker="o")
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean SGNS loss")
    ax.set_title("refopt demo: skip-gram with LazyAdam")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


# ---------------------------------------------------------------------------------------------
# options shared by refopt golden and refopt check

_OPTIMIZER_NAMES = ("Adam", "AdamW", "LazyAdam", "SGD", "RMSprop", "Adagrad", "Adadelta", "Adamax",
                    "Nadam", "Adafactor", "Lion", "Lamb", "Ftrl", "RAdam", "ASGD", "Rprop")
_DTYPE_NAMES = ("float16", "float32", "float64")


def _setting(text):
    """``KEY=VALUE`` -> (key, value); VALUE is JSON (0.01, true, null, {...}), else a string."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    words = {"True": True, "False": False, "None": None}
    if raw.strip() in words:
        return key, words[raw.strip()]
    try:
        return key, json.loads(raw)
    except ValueError:
        return key, raw


def _add_optimizer_options(p, *, steps_default):
    p.add_argument(
        "--optimizer", choices=_OPTIMIZER_NAMES, default="Adam",
        help="the refopt optimizer (default: %(default)s)",
    )
    p.add_argument(
        "--set", dest="settings", type=_setting, action="append", default=[], metavar="KEY=VALUE",
        help="a constructor argument of the optimizer, under refopt's name; VALUE is JSON "
        "(0.01, true, null, or a schedule as {\"class_name\": ..., \"config\": {...}}); repeatable",
    )
    p.add_argument(
        "--convention", default=None,
        help="whose numerics: tf_keras, keras3, keras2, tf1, torch or optax "
        "(default: the optimizer's own, tf_keras; torch for RAdam, ASGD, Rprop)",
    )
    p.add_argument(
        "--dtype", choices=_DTYPE_NAMES, default="float32",
        help="dtype of the variables and gradients (default: %(default)s)",
    )
    p.add_argument(
        "--steps", type=_int_at_least(1), default=steps_default, metavar="N",
        help="number of steps (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=_int_at_least(0), default=0, metavar="N",
        help="seed of the generated inputs (default: %(default)s)",
    )


def _config(args):
    """The --set options as a dict, validated by constructing the refopt optimizer."""
    from refopt.testing.trajectory import default_convention, optimizer_class

    config = dict(args.settings)
    cls = optimizer_class(args.optimizer)
    if args.convention is None:
        args.convention = default_convention(cls)
    try:
        from refopt import schedules

        kwargs = dict(config)
        if isinstance(kwargs.get("learning_rate"), dict):
            kwargs["learning_rate"] = schedules.deserialize(kwargs["learning_rate"])
        cls(**kwargs, convention=args.convention)
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise CommandError(_one_line(exc)) from None
    return config


# ---------------------------------------------------------------------------------------------
# refopt golden


def _shape(text):
    text = text.strip()
    if text in ("", "()", "scalar"):
        return ()
    try:
        shape = tuple(int(d) for d in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated sizes like 3,4 (or 'scalar'), got {text!r}"
        ) from None
    if any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(f"sizes must be >= 0, got {text!r}")
    return shape


def _add_golden(subparsers):
    p = subparsers.add_parser(
        "golden",
        help="write a golden trajectory (.npz and JSON) for tests in other languages",
        description=(
            "Generate initial variables and gradients from a seed, run them through refopt's "
            "reference optimizer, and write the inputs and the variables and every state slot "
            "after each step to PREFIX.npz and PREFIX.json (floats as exact hex strings, "
            "float.hex). The format is documented in the README (Porting an optimizer) and in "
            "refopt.testing.golden."
        ),
    )
    _add_optimizer_options(p, steps_default=5)
    p.add_argument(
        "--shape", dest="shapes", type=_shape, action="append", metavar="D1,D2,...",
        help="shape of one variable, e.g. 3,4 ('scalar' for 0-d); repeatable "
        "(default: one variable of shape 3)",
    )
    p.add_argument(
        "--sparse", action="store_true",
        help="give every variable of at least one non-empty dimension IndexedSlices gradients "
        "(random rows, duplicates included)",
    )
    p.add_argument("--out", required=True, metavar="PREFIX",
                   help="write PREFIX.npz and PREFIX.json")
    p.add_argument(
        "--format", choices=("both", "json", "npz"), default="both",
        help="which files to write (default: %(default)s)",
    )
    p.set_defaults(handler=_run_golden)


def _run_golden(args):
    from refopt.testing import golden

    config = _config(args)
    shapes = args.shapes or [(3,)]
    try:
        trajectory = golden.make_trajectory(
            optimizer=args.optimizer, config=config, dtype=args.dtype, shapes=shapes,
            steps=args.steps, seed=args.seed, sparse=args.sparse, convention=args.convention,
        )
    except (TypeError, ValueError, NotImplementedError) as exc:
        raise CommandError(_one_line(exc)) from None
    if args.out.endswith(("/", os.sep)) or os.path.isdir(args.out):
        raise CommandError(f"--out {args.out}: give a file prefix (PREFIX.npz, PREFIX.json), "
                           "not a directory")
    paths = {}
    if args.format in ("both", "npz"):
        paths["npz_path"] = args.out + ".npz"
    if args.format in ("both", "json"):
        paths["json_path"] = args.out + ".json"
    directory = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(directory):
        raise CommandError(f"--out {args.out}: directory {directory} does not exist")
    try:
        doc = golden.write_golden(trajectory, seed=args.seed, **paths)
    except OSError as exc:
        raise CommandError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    except (TypeError, ValueError) as exc:  # e.g. a schedule that reaches inf mid-trajectory
        raise CommandError(_one_line(exc)) from None
    kinds = ", ".join(f"{'x'.join(map(str, s)) or 'scalar'} {k}"
                      for s, k in zip(doc["shapes"], doc["gradient_kinds"]))
    print(f"refopt golden: {args.optimizer} ({args.convention}, {args.dtype}), {len(shapes)} "
          f"variable(s) [{kinds}], {args.steps} steps, seed {args.seed}, slots "
          f"{', '.join(doc['slots'])}")
    for path in paths.values():
        print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
    return 0


# ---------------------------------------------------------------------------------------------
# refopt check


def _load_object(spec):
    """Import ``MODULE:OBJECT`` (MODULE a dotted name or a .py path; OBJECT may be dotted)."""
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise CommandError(f"expected MODULE:OBJECT (e.g. my_port:MyAdam), got {spec!r}")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.isfile(module_name):
                raise CommandError(f"no such file: {module_name}")
            name = os.path.splitext(os.path.basename(module_name))[0]
            loader_spec = importlib.util.spec_from_file_location(name, module_name)
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
        else:
            if os.getcwd() not in sys.path and "" not in sys.path:
                sys.path.insert(0, os.getcwd())  # as `python -m` would: modules of this folder
            module = importlib.import_module(module_name)
    except CommandError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to import is the user's to fix
        raise CommandError(f"cannot import {module_name}: {type(exc).__name__}: "
                           f"{_one_line(exc)}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise CommandError(f"module {module_name} has no attribute {attr!r}") from None
    if not callable(obj):
        raise CommandError(f"{spec} is a {type(obj).__name__}, not a factory or step function")
    return obj


def _names(text):
    return tuple(t.strip() for t in text.split(",") if t.strip())


def _slot_map_option(text):
    out = {}
    for item in _names(text):
        ref, sep, cand = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected REF=CANDIDATE pairs, got {item!r}")
        out[ref.strip()] = None if cand.strip() in ("", "-") else cand.strip()
    return out


def _add_check(subparsers):
    p = subparsers.add_parser(
        "check",
        help="check another optimizer implementation against refopt",
        description=(
            "Import OBJECT from MODULE (a factory of stateful optimizers with apply_gradients and "
            "get_slot, or a step function step(params, grads, state, hyper, t) -> (params, "
            "state); see refopt.testing.conformance), run Hypothesis-generated trajectories "
            "through it and through refopt, compare the variables and every state slot after "
            "each step (resyncing the candidate to refopt after each step), and report the first "
            "divergence with the shrunk input. Exit status: 0 conforms, 1 diverges, 2 usage error."
        ),
    )
    p.add_argument("target", metavar="MODULE:OBJECT",
                   help="e.g. my_port:MyAdam or path/to/my_port.py:MyAdam")
    _add_optimizer_options(p, steps_default=3)
    p.add_argument(
        "--max-examples", type=_int_at_least(1), default=50, metavar="N",
        help="most trajectories tried (default: %(default)s)",
    )
    p.add_argument(
        "--tolerance-ulp", type=_nonnegative_float, default=0, metavar="ULP",
        help="largest accepted error per element in units in the last place (default: "
        "%(default)s, bit for bit)",
    )
    p.add_argument(
        "--sparse", action=argparse.BooleanOptionalAction, default=None,
        help="draw IndexedSlices gradients too (default: only for LazyAdam)",
    )
    p.add_argument(
        "--vary", type=_names, default=(), metavar="OPTION,...",
        help="pipeline options to draw as well: weight_decay, clipping, ema, schedules",
    )
    p.add_argument(
        "--slot-map", type=_slot_map_option, default=None, metavar="REF=NAME,...",
        help="refopt slot names to the candidate's, e.g. m=exp_avg,v=exp_avg_sq (NAME empty: "
        "do not compare); default: the object's slot_map attribute, else the same names",
    )
    p.add_argument(
        "--kind", choices=("auto", "stateful", "step"), default="auto",
        help="how to call OBJECT (default: auto: a class or a callable taking **kwargs is a "
        "factory, anything else a step function)",
    )
    p.set_defaults(handler=_run_check)


def _run_check(args):
    try:
        from refopt.testing import ConformanceError, assert_conforms
        import hypothesis  # noqa: F401 - assert_conforms imports it when called
    except ImportError:
        raise CommandError("refopt check needs Hypothesis: pip install hypothesis "
                           "(or refopt's test extra)") from None
    bad = [v for v in args.vary if v not in ("weight_decay", "clipping", "ema", "schedules")]
    if bad:
        raise CommandError(f"--vary {','.join(bad)}: expected some of weight_decay, clipping, "
                           "ema, schedules")
    config = _config(args)
    candidate = _load_object(args.target)
    tolerance = float(args.tolerance_ulp)
    tolerance = int(tolerance) if tolerance.is_integer() else tolerance
    what = (f"refopt {args.optimizer} ({args.convention}, {args.dtype}, tolerance {tolerance} "
            f"ulp; up to {args.max_examples} examples of up to {args.steps} steps, seed "
            f"{args.seed})")
    try:
        assert_conforms(
            candidate, optimizer=args.optimizer, config=config, dtype=args.dtype,
            convention=args.convention, steps=args.steps, max_examples=args.max_examples,
            tolerance_ulp=tolerance, seed=args.seed, sparse=args.sparse, vary=args.vary,
            slot_map=args.slot_map, kind=args.kind,
        )
    except ConformanceError as err:
        print(f"refopt check: {args.target} DIVERGES from {what}")
        print(err.report)
        if err.__cause__ is not None:
            import traceback

            print("the candidate's exception:")
            print("".join(traceback.format_exception(err.__cause__)).rstrip())
        return 1
    print(f"refopt check: {args.target} conforms to {what}")
    return 0


# ---------------------------------------------------------------------------------------------
# the parser and the entry point

#: Functions that each add one subcommand to the parser, in the order ``--help`` lists them.
# ------------------------------------------------------------------------------ conformance
def _add_conformance(subparsers):
    p = subparsers.add_parser(
        "conformance",
        help="replay the golden trajectories recorded from TensorFlow/Keras, PyTorch, optax",
        description="Replay the bundled golden cases (recorded from the real frameworks, see "
        "conformance/README.md) through refopt and print, per case: framework and version, "
        "optimizer, steps, the largest distance in ulp and pass/fail against the case's "
        "tolerance. Exit status 1 when a case fails.",
    )
    p.add_argument("--backend", choices=("reference", "cpu", "cuda"), default="reference",
                   help="refopt backend to replay through (default: reference); cuda replays "
                   "only the cases with tf-keras numerics and dense gradients")
    p.add_argument("--filter", default=None, metavar="TEXT",
                   help="only the cases whose id contains TEXT (e.g. 'torch/' or 'sparse')")
    p.add_argument("--list", action="store_true", help="list the cases without replaying")
    p.set_defaults(handler=_run_conformance)


def _run_conformance(args):
    from refopt import conformance

    entries = [e for e in conformance.load_manifest()
               if args.filter is None or args.filter in e["id"]]
    if not entries:
        raise CommandError(f"no case matches --filter {args.filter!r}; see --list")
    if args.list:
        for e in entries:
            print(f"{e['id']:44s} {e['api']}")
        return 0
    if args.backend == "cuda":  # every case replays there (every convention runs on cuda)
        try:
            from refopt.kernels import cuda as kc

            kc.require_device()
        except (ImportError, RuntimeError) as exc:
            raise CommandError(f"--backend cuda: {exc}") from None
    header = f"{'case':44s} {'framework':34s} {'optimizer':9s} {'steps':>5s} {'max ulp':>8s} " \
             f"{'tol':>4s}  result"
    print(header)
    print("-" * len(header))
    failed = []
    for e in entries:
        r = conformance.replay(e, backend=args.backend)
        ulp = "inf" if r.max_ulp == float("inf") else f"{r.max_ulp:g}"
        print(f"{r.case:44s} {r.version[:34]:34s} {r.optimizer:9s} {r.steps:5d} {ulp:>8s} "
              f"{r.tolerance_ulp:4d}  {'pass' if r.passed else 'FAIL'}", flush=True)
        if not r.passed:
            failed.append(r)
    for r in failed:
        print(f"FAIL {r.case}: {r.detail}")
    exact = sum(1 for e in entries if e["tolerance_ulp"] == 0)
    print(f"{len(entries) - len(failed)} of {len(entries)} cases pass on backend "
          f"{args.backend!r} ({exact} required bit-identical)")
    return 1 if failed else 0


_SUBCOMMANDS = [_add_demo, _add_golden, _add_check, _add_conformance]


def build_parser():
    """The ``refopt`` argument parser, with one subparser per subcommand.

    Returns
    -------
    argparse.ArgumentParser
    """
    from refopt import __version__

    parser = argparse.ArgumentParser(
        prog="refopt",
        description="refopt: numerical ground truth for gradient-based optimizers "
        "(NumPy reference Adam/AdamW/LazyAdam/SGD with TensorFlow/Keras semantics).",
    )
    parser.add_argument("--version", action="version", version=f"refopt {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv=None):
    """Run the ``refopt`` command line.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; ``sys.argv[1:]`` when omitted.

    Returns
    -------
    int
        The exit status: 0 on success, 1 when ``refopt check`` finds a divergence or
        ``refopt conformance`` a failing case, 2 for a usage
        error (bad option, missing file, unsupported backend; argparse's convention), 130 when
        interrupted.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return handler(args)
    except CommandError as exc:
        sys.stdout.flush()
        print(f"refopt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"refopt {args.command}: interrupted", file=sys.stderr)
        return 130
