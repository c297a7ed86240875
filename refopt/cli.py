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

``refopt explain SOURCE``
    Find the convention knobs or classic slip that reproduce a foreign trajectory (a golden file,
    a bundled case, or MODULE:OBJECT) and print the nearest settings
    (:func:`refopt.testing.explain`); exit status 0 when one reproduces it, 1 otherwise.

``refopt conformance``
    Replay the golden cases recorded from the frameworks (:mod:`refopt.conformance`).

``refopt info``
    Versions, available backends, threads, conventions, optimizers, the kernel cache folder and
    the golden cases (``--json`` for one JSON object: :func:`collect_info`).

``refopt`` alone prints the help and exits with status 0.

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

__all__ = ["CommandError", "build_parser", "collect_info", "main"]


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
            "(pydoc_data.topics). With the defaults it takes about 20 seconds on two idle CPU cores."
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
    dist = p.add_argument_group("distributed (run under mpiexec -n R)")
    dist.add_argument(
        "--distributed", action="store_true",
        help="train both tables row-sharded over the MPI ranks (row i on rank i mod R; "
        "mpiexec -n 2 refopt demo --distributed): the same losses and embeddings, bit for "
        "bit, as without it; needs a lazy --optimizer (LazyAdam, Adagrad, Ftrl) and "
        'pip install "refopt[mpi]"',
    )
    dist.add_argument(
        "--micro-batches", type=_int_at_least(1), default=None, metavar="K",
        help="with --distributed, cut each batch into K micro-batches, K/R per rank "
        "(default: R; a multiple of R)",
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

    comm = _demo_comm(args, optimizer) if args.distributed else None
    if comm is not None and comm.rank != 0:  # rank 0 reports for all
        import contextlib

        with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
            args.quiet = True
            return _run_demo_training(args, demo, tokens, all_tokens, vocab, corpus_name,
                                      optimizer, comm, wall_start)
    return _run_demo_training(args, demo, tokens, all_tokens, vocab, corpus_name, optimizer,
                              comm, wall_start)


def _demo_comm(args, optimizer):
    """The MPI engine of ``refopt demo --distributed``, after checking what only it needs."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        raise CommandError('--distributed needs mpi4py and an MPI library: pip install '
                           '"refopt[mpi]", then mpiexec -n 2 refopt demo --distributed') from None
    if not optimizer._is_lazy():
        raise CommandError(
            f"--optimizer {args.optimizer}: --distributed row-shards the tables, so the "
            "optimizer must update only the rows of a batch; "
            f"{args.optimizer} under convention {optimizer.convention.name!r} updates every row "
            "(lazy: LazyAdam, Adagrad, Ftrl)")
    from refopt.distributed import get_comm

    comm = get_comm()
    k = comm.size if args.micro_batches is None else args.micro_batches
    if k % comm.size:
        raise CommandError(f"--micro-batches {k}: must be a multiple of the number of ranks "
                           f"({comm.size})")
    args.micro_batches = k
    return comm


def _run_demo_training(args, demo, tokens, all_tokens, vocab, corpus_name, optimizer, comm,
                       wall_start):
    import numpy as np

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
    if comm is not None:
        print(f"distributed {comm.size} rank(s) ({comm.engine}), {args.micro_batches} "
              f"micro-batches per batch ({args.micro_batches // comm.size} per rank), both "
              "tables row-sharded (row i on rank i mod R): bit-identical to one process")
    sys.stdout.flush()

    reporter = _EpochReporter(show_bar=not args.quiet)
    settings = {"epochs": args.epochs, "dim": args.dim, "window": args.window,
                "negatives": args.negatives, "batch_size": args.batch_size,
                "min_count": args.min_count, "vocab_size": args.vocab_size,
                "sample": args.sample, "seed": args.seed, "optimizer": optimizer,
                "progress": reporter}
    try:
        if comm is None:
            result = demo.train_skipgram(tokens, **settings)
        else:
            try:
                result = demo.train_skipgram_sharded(tokens, micro_batches=args.micro_batches,
                                                     comm=comm, **settings)
            except Exception:
                if comm.size > 1:  # an error of this rank only: end every rank, not a hang
                    import traceback

                    traceback.print_exc()
                    sys.stderr.flush()
                    comm.abort(1)
                raise
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
        mean_sim = demo.mean_cosine_similarity(result.embeddings)
        if mean_sim > demo.UNDERTRAINED_SIMILARITY:
            print(f"note        the model is undertrained: two words picked at random already "
                  f"have cosine similarity {mean_sim:.2f} on average (the vectors still share "
                  f"one direction), so these neighbours mean little yet; train longer "
                  f"(--epochs, default 20) or on more text")

    if out_dir is not None and (comm is None or comm.rank == 0):
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

    if args.backend != "reference" and not args.no_compare and comm is None:
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
                    "Nadam", "Adafactor", "Lion", "Lamb", "Ftrl", "RAdam", "ASGD", "Rprop",
                    "ProximalAdagrad", "ProximalGradientDescent")
_OPTIMIZER_NAMES += ("RowWiseAdagrad", "PartialRowWiseAdam")
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


def _default_conventions_text():
    """Each optimizer's default convention, for help texts: ``"the optimizer's own: tf_keras;
    keras3 for Lamb; torch for RAdam, ASGD, Rprop"`` (from the constructors' defaults)."""
    from refopt.testing.trajectory import default_convention

    by = {}
    for name in _OPTIMIZER_NAMES:
        by.setdefault(default_convention(name), []).append(name)
    most = max(by, key=lambda c: len(by[c]))
    rest = [f"{c} for {', '.join(names)}" for c, names in by.items() if c != most]
    return "; ".join([f"the optimizer's own: {most}", *rest])


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
        f"(default: {_default_conventions_text()})",
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
        # Validation only: the reference backend, whatever $REFOPT_BACKEND says (a missing
        # GPU must not turn a usage check into a traceback).
        cls(**kwargs, convention=args.convention, backend="reference")
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
            "Generate initial variables and gradients from a seed, run them through refopt "
            "with the numerics of --convention (tf_keras, keras3, keras2, tf1, torch or optax; "
            "computed by the reference backend, whose bits every backend reproduces), and write "
            "the inputs and the variables and every state slot "
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
    p.add_argument("--out", required=True, metavar="PREFIX", type=_prefix,
                   help="write PREFIX.npz and PREFIX.json (missing folders are created; a "
                   "PREFIX ending in .npz or .json names the file itself)")
    p.add_argument(
        "--format", choices=("both", "json", "npz"), default="both",
        help="which files to write (default: %(default)s)",
    )
    p.set_defaults(handler=_run_golden)


def _prefix(text):
    """``--out``: a non-empty file prefix."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file prefix such as golden/adam, got ''")
    return text


def _run_golden(args):
    from refopt.testing import golden

    config = _config(args)
    # `--out gold/x.npz --format npz` means gold/x.npz, not gold/x.npz.npz
    suffixes = {"npz": (".npz",), "json": (".json",), "both": (".npz", ".json")}[args.format]
    for suffix in suffixes:
        if args.out.endswith(suffix) and len(args.out) > len(suffix):
            args.out = args.out[:-len(suffix)]
            break
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
    try:  # as `refopt demo --out` does: a fresh checkout has no golden/ folder
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise CommandError(f"--out {args.out}: cannot create directory {directory}: "
                           f"{exc.strerror or exc}") from None
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
        raise CommandError('refopt check needs Hypothesis: pip install "refopt[testing]"') \
            from None
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
    except (TypeError, ValueError) as exc:  # a usage problem (e.g. a slot to map): no verdict
        hint = (" (on the command line: --slot-map REF=NAME, or REF= to leave it out)"
                if "slot_map=" in str(exc) else "")
        raise CommandError(_one_line(exc) + hint) from None
    print(f"refopt check: {args.target} conforms to {what}")
    return 0


# ---------------------------------------------------------------------------------------------
# refopt explain


def _add_explain(subparsers):
    p = subparsers.add_parser(
        "explain",
        help="find the convention knobs or classic slip that reproduce a foreign trajectory",
        description=(
            "Replay a foreign trajectory through refopt under every convention preset, each "
            "preset with one knob changed, each preset with one classic slip (epsilon inside "
            "the root, no bias correction, float32 powers, step counter off by one, coupled "
            "weight decay, ...) and, when nothing matches, pairs of changes; print the "
            "settings that come nearest, in ulp (each step replayed from the recorded state), "
            "and where each first diverges. SOURCE is a golden file in refopt's format "
            "(.npz or .json), a bundled golden case (an id from `refopt conformance --list`, "
            "or its .npz), or MODULE:OBJECT, a candidate implementation as `refopt check` "
            "takes it, run on inputs generated from --seed. See refopt.testing.explain. "
            "Exit status: 0 a setting reproduces it (within the tolerance), 1 none does, "
            "2 usage error."
        ),
    )
    p.add_argument("source", metavar="SOURCE",
                   help="golden file, bundled case id (e.g. torch/adam_fused_f32) or "
                   "MODULE:OBJECT")
    p.add_argument("--top", type=_int_at_least(1), default=5, metavar="N",
                   help="how many settings to print (default: %(default)s)")
    p.add_argument(
        "--tolerance-ulp", type=_nonnegative_float, default=None, metavar="ULP",
        help="largest distance per step that counts as a match (default: the bundled case's "
        "stated tolerance, else 0: bit for bit)",
    )
    p.add_argument("--no-pairs", action="store_true",
                   help="do not try pairs of changes when no single change matches")
    cand = p.add_argument_group("with MODULE:OBJECT (the candidate's inputs)")
    _add_optimizer_options(cand, steps_default=20)
    cand.add_argument(
        "--shape", dest="shapes", type=_shape, action="append", metavar="D1,D2,...",
        help="shape of one variable; repeatable (default: 5 and 4,3)",
    )
    cand.add_argument("--sparse", action="store_true", help="IndexedSlices gradients")
    cand.add_argument(
        "--slot-map", type=_slot_map_option, default=None, metavar="REF=NAME,...",
        help="refopt slot names to the candidate's, e.g. m=exp_avg,v=exp_avg_sq (NAME empty: "
        "not recorded); default: the object's slot_map attribute, else the same names",
    )
    cand.add_argument("--kind", choices=("auto", "stateful", "step"), default="auto",
                      help="how to call OBJECT (default: %(default)s, as refopt check)")
    p.set_defaults(handler=_run_explain)


def _run_explain(args):
    from refopt import conformance
    from refopt.testing.explain import explain

    source = args.source
    is_file = os.path.exists(source)
    is_case = not is_file and any(e["id"] == source for e in conformance.load_manifest())
    options = {}
    if not is_file and not is_case:
        if ":" not in source:
            raise CommandError(f"{source}: no such file or bundled golden case (see `refopt "
                               "conformance --list`; MODULE:OBJECT for a candidate)")
        candidate = _load_object(source)
        options = {"optimizer": args.optimizer, "config": _config(args), "dtype": args.dtype,
                   "convention": args.convention, "steps": args.steps, "seed": args.seed,
                   "shapes": args.shapes or ((5,), (4, 3)), "sparse": args.sparse,
                   "slot_map": args.slot_map, "kind": args.kind}
        source = candidate
    else:
        given = [flag for flag, value in (("--set", args.settings), ("--shape", args.shapes),
                                          ("--sparse", args.sparse),
                                          ("--slot-map", args.slot_map),
                                          ("--convention", args.convention))
                 if value]
        if given:
            raise CommandError(f"{', '.join(given)}: only for a candidate (MODULE:OBJECT); "
                               f"{source} is a recorded trajectory")
    try:
        result = explain(source, top=args.top, tolerance_ulp=args.tolerance_ulp,
                         pairs=not args.no_pairs, **options)
    except RuntimeError as exc:  # the candidate raised while it was run
        print(f"refopt explain: {exc}")
        return 1
    except (OSError, ValueError, TypeError) as exc:
        raise CommandError(_one_line(exc)) from None
    print("refopt explain")
    print(result.report(top=args.top))
    return 0 if result.match is not None else 1


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
                   help="refopt backend to replay through (default: reference); every case "
                   "replays on each (cuda needs numba-cuda and a GPU or its simulator)")
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
    # Columns as wide as their longest entry (the framework column lists every package).
    wc = max(len("case"), *(len(e["id"]) for e in entries))
    wf = max(len("framework"), *(len(conformance.framework_versions(e)) for e in entries))
    wo = max(len("optimizer"), *(len(e["optimizer"]) for e in entries))
    header = f"{'case':{wc}s} {'framework':{wf}s} {'optimizer':{wo}s} {'steps':>5s} " \
             f"{'max ulp':>8s} {'tol':>4s}  result"
    print(header)
    print("-" * len(header))
    failed = []
    for e in entries:
        r = conformance.replay(e, backend=args.backend)
        ulp = "inf" if r.max_ulp == float("inf") else f"{r.max_ulp:g}"
        print(f"{r.case:{wc}s} {r.version:{wf}s} {r.optimizer:{wo}s} {r.steps:5d} {ulp:>8s} "
              f"{r.tolerance_ulp:4d}  {'pass' if r.passed else 'FAIL'}", flush=True)
        if not r.passed:
            failed.append(r)
    for r in failed:
        print(f"FAIL {r.case}: {r.detail}")
    exact = sum(1 for e in entries if e["tolerance_ulp"] == 0)
    print(f"{len(entries) - len(failed)} of {len(entries)} cases pass on backend "
          f"{args.backend!r} ({exact} required bit-identical)")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# refopt info

#: Distributions whose versions ``refopt info`` reports (None where not installed), in order.
_INFO_PACKAGES = ("numpy", "numba", "numba-cuda", "scipy", "hypothesis", "tqdm", "matplotlib",
                  "torch", "jax", "jaxlib", "optax", "tensorflow", "tf_keras", "keras")


def _dist_version(name):
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _info_cuda(numba_cuda_version):
    """The cuda backend's state: numba-cuda, the simulator, a GPU (imports numba.cuda)."""
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    out = {"available": False, "numba_cuda": numba_cuda_version, "simulator": simulator,
           "devices": [], "detail": None}
    if numba_cuda_version is None:
        out["detail"] = 'numba-cuda is not installed (pip install "refopt[cuda]")'
        return out
    try:
        from numba import cuda

        out["available"] = bool(cuda.is_available())
        if out["available"] and not simulator:
            out["devices"] = [d.name.decode() if isinstance(d.name, bytes) else str(d.name)
                              for d in cuda.list_devices()]
    except Exception as exc:  # noqa: BLE001 - a broken driver reads as "not available"
        out["detail"] = f"numba.cuda failed: {type(exc).__name__}: {_one_line(exc)}"
        return out
    if simulator:
        out["detail"] = "numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1: slow, for tests)"
    elif out["available"]:
        out["detail"] = ", ".join(out["devices"]) or "a GPU"
    else:
        out["detail"] = ("no usable GPU (numba.cuda.is_available() is False); "
                         "NUMBA_ENABLE_CUDASIM=1 runs the simulator")
    return out


def _info_optimizers():
    """Each optimizer class and the presets it exists under (constructed, never run)."""
    import warnings

    from refopt import optimizers
    from refopt.conventions import PRESETS
    from refopt.testing.trajectory import default_convention

    table = {}
    for name in optimizers.__all__:
        cls = getattr(optimizers, name)
        if not (isinstance(cls, type) and issubclass(cls, optimizers.Optimizer)) \
                or cls is optimizers.Optimizer:
            continue
        having = []
        for conv in PRESETS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # some have no default rate there; TF-Addons' AdamW and SGDW no default decay
                for kwargs in ({}, {"learning_rate": 0.01}, {"weight_decay": 0.01}):
                    try:
                        cls(convention=conv, backend="reference", **kwargs)
                    except TypeError:
                        continue
                    except (ValueError, NotImplementedError):
                        break
                    having.append(conv)
                    break
        table[name] = {"conventions": having, "default": default_convention(cls)}
    return table


def _folder_size(path):
    """``(files, bytes)`` of everything under ``path`` (unreadable entries are skipped)."""
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                continue
    return files, size


def collect_info():
    """What ``refopt info`` reports, as a JSON-serialisable dict.

    Returns
    -------
    dict
        ``refopt`` (version), ``python`` (version, executable), ``platform``, ``packages``
        (distribution -> version or None), ``default_backend`` (or the error of a bad
        ``$REFOPT_BACKEND``), ``backends`` (``reference``, ``cpu``, ``cuda``: ``available`` and
        ``detail``; cuda also ``numba_cuda``, ``simulator``, ``devices``), ``numba_threads``
        (``threads``, ``max``, ``threading_layer``), ``conventions`` (preset -> framework),
        ``optimizers`` (class name -> ``conventions``, the presets it exists under, and its
        ``default``), ``kernel_cache`` (``path``, where it came from (``source``), ``env``
        (``$REFOPT_KERNEL_CACHE``), ``env_unusable`` (set but not usable, so another folder
        is used), and ``files`` and ``bytes``: its size; deleting the folder is safe, the
        kernels compile again on first use) and ``golden_cases`` (``total``, ``bit_identical``,
        ``by_convention``).
    """
    import platform

    from refopt import __version__, conformance
    from refopt.conventions import PRESETS
    from refopt.executors import BACKEND_ENV, default_backend

    packages = {name: _dist_version(name) for name in _INFO_PACKAGES}
    info = {
        "refopt": __version__,
        "python": {"version": platform.python_version(), "executable": sys.executable},
        "platform": platform.platform(),
        "packages": packages,
    }
    try:
        info["default_backend"] = default_backend()
    except ValueError as exc:
        info["default_backend"] = f"error: {_one_line(exc)}"
    info["backend_env"] = os.environ.get(BACKEND_ENV)

    cpu = {"available": False, "detail": None}
    threads = {"threads": None, "max": None, "threading_layer": None}
    try:
        import numba

        threads = {"threads": numba.get_num_threads(), "max": numba.config.NUMBA_NUM_THREADS,
                   "threading_layer": numba.config.THREADING_LAYER}
        cpu = {"available": True, "detail": f"Numba {numba.__version__}, "
               f"{threads['threads']} thread(s)"}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        cpu["detail"] = f"Numba cannot be imported: {type(exc).__name__}: {_one_line(exc)}"
    cache = {"path": None, "source": None, "env": os.environ.get("REFOPT_KERNEL_CACHE"),
             "files": None, "bytes": None}
    if cpu["available"]:
        try:
            from pathlib import Path

            from refopt.kernels.cpu.drivers import _cache_dir

            path = _cache_dir()
            cache["path"] = str(path)
            cache["source"] = ("REFOPT_KERNEL_CACHE" if cache["env"] and path == Path(cache["env"])
                               else "home" if path == Path.home() / ".cache" / "refopt" / "kernels"
                               else "temporary folder")
            cache["files"], cache["bytes"] = _folder_size(path)
        except Exception as exc:  # noqa: BLE001 - no writable folder: reported
            cache["source"] = f"error: {_one_line(exc)}"
    # set, but not the folder used (not creatable or not writable): say so
    cache["env_unusable"] = (bool(cache["env"]) and cpu["available"]
                             and cache["source"] != "REFOPT_KERNEL_CACHE")
    info["backends"] = {
        "reference": {"available": True, "detail": f"NumPy {packages['numpy']}"},
        "cpu": cpu,
        "cuda": _info_cuda(packages["numba-cuda"]),
    }
    info["numba_threads"] = threads
    info["kernel_cache"] = cache
    info["conventions"] = {name: preset.framework for name, preset in PRESETS.items()}
    info["optimizers"] = _info_optimizers()
    cases = conformance.load_manifest()
    by_convention = {}
    for e in cases:
        by_convention[e["convention"]] = by_convention.get(e["convention"], 0) + 1
    info["golden_cases"] = {
        "total": len(cases),
        "bit_identical": sum(1 for e in cases if e["tolerance_ulp"] == 0),
        "by_convention": by_convention,
    }
    return info


def _add_info(subparsers):
    p = subparsers.add_parser(
        "info",
        help="versions, backends, threads, conventions, optimizers, kernel cache, golden cases",
        description="Print what refopt finds here: the versions of refopt, Python and the "
        "packages it uses or interoperates with, which backends work (reference; cpu through "
        "Numba; cuda through numba-cuda, on a GPU or the simulator), Numba's threads, the "
        "conventions and the optimizers each exists under, the kernel cache folder and the "
        "bundled golden cases. Paste it into a bug report.",
    )
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of text")
    p.set_defaults(handler=_run_info)


def _run_info(args):
    info = collect_info()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0

    def yes(flag):
        return "yes" if flag else "no "

    print(f"refopt      {info['refopt']}")
    print(f"python      {info['python']['version']} ({info['python']['executable']})")
    print(f"platform    {info['platform']}")
    present = [f"{k} {v}" for k, v in info["packages"].items() if v is not None]
    absent = [k for k, v in info["packages"].items() if v is None]
    print(f"packages    {', '.join(present)}")
    if absent:
        print(f"not found   {', '.join(absent)}")
    env = info["backend_env"]
    print(f"backends    default {info['default_backend']}"
          + (f" (REFOPT_BACKEND={env})" if env else " (REFOPT_BACKEND not set)"))
    for name, b in info["backends"].items():
        print(f"  {name:9s} {yes(b['available'])} {b['detail'] or ''}".rstrip())
    t = info["numba_threads"]
    if t["threads"] is not None:
        print(f"threads     Numba {t['threads']} of {t['max']} (NUMBA_NUM_THREADS; threading "
              f"layer {t['threading_layer']})")
    c = info["kernel_cache"]
    where = f" ({c['source']})" if c["source"] else ""
    print(f"kernels     {c['path'] or 'no cache folder'}{where}")
    if c["files"] is not None:
        print(f"            {c['files']} files, {c['bytes'] / 1e6:.1f} MB; safe to delete to "
              "clean it (kernels compile again on first use)")
    if c["env_unusable"]:
        print(f"            REFOPT_KERNEL_CACHE={c['env']} is set but not usable (cannot "
              "create or write that folder)"
              + (f"; using {c['path']} instead" if c["path"] else ""))
    print("conventions")
    for name, framework in info["conventions"].items():
        print(f"  {name:9s} {framework}")
    print("optimizers")
    width = max(len(n) for n in info["optimizers"])
    for name, o in info["optimizers"].items():
        listed = [f"{c} (default)" if c == o["default"] else c for c in o["conventions"]]
        print(f"  {name:{width}s}  {', '.join(listed)}")
    g = info["golden_cases"]
    per = ", ".join(f"{k} {v}" for k, v in g["by_convention"].items())
    print(f"golden      {g['total']} cases ({g['bit_identical']} bit-identical; {per}): "
          "refopt conformance replays them")
    return 0


_SUBCOMMANDS = [_add_demo, _add_golden, _add_check, _add_explain, _add_conformance, _add_info]


def build_parser():
    """The ``refopt`` argument parser, with one subparser per subcommand.

    Returns
    -------
    argparse.ArgumentParser
    """
    from refopt import __version__

    parser = argparse.ArgumentParser(
        prog="refopt",
        description="refopt: numerical ground truth for gradient-based optimizers: "
        "NumPy reference optimizers with the exact numerics of tf_keras, Keras 3, Keras 2, "
        "TF1, PyTorch and optax, and Numba fast paths (cpu, cuda) with the same bits. "
        "`refopt info` says what is installed and available here.",
    )
    parser.add_argument("--version", action="version", version=f"refopt {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def _launcher_rank():
    """This process's rank as an MPI launcher sets it in the environment (MPICH/Hydra's
    ``PMI_RANK``, Open MPI's ``OMPI_COMM_WORLD_RANK``, PMIx's ``PMIX_RANK``); 0 without one."""
    for key in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def main(argv=None):
    """Run the ``refopt`` command line.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after the program name; ``sys.argv[1:]`` when omitted.

    Returns
    -------
    int
        The exit status: 0 on success (and for ``refopt`` alone, which prints the help),
        1 when ``refopt check`` finds a divergence or
        ``refopt conformance`` a failing case, 2 for a usage
        error (bad option, missing file, unsupported backend; argparse's convention), 130 when
        interrupted.
    """
    parser = build_parser()
    # `mpiexec -n R refopt demo --distributed ...`: every rank meets the same usage error;
    # only rank 0 prints it (the launcher's rank, read before MPI starts)
    quiet = _launcher_rank() > 0 and "--distributed" in (sys.argv[1:] if argv is None
                                                         else argv)
    try:
        if quiet:
            import contextlib

            with open(os.devnull, "w") as devnull, contextlib.redirect_stderr(devnull):
                args = parser.parse_args(argv)
        else:
            args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors: argparse already printed
        return exc.code if isinstance(exc.code, int) else 2
    handler = getattr(args, "handler", None)
    if handler is None:  # `refopt` alone asks what there is: the help, and success (git's way)
        parser.print_help(sys.stdout)
        return 0
    try:
        return handler(args)
    except CommandError as exc:
        sys.stdout.flush()
        if not quiet:
            print(f"refopt {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(f"refopt {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `refopt conformance --list | head`: the reader left; stop quietly
        # (Python's documented recipe: point stdout at devnull so the exit flush cannot fail)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed writer
