"""The ``refopt`` command line (also ``python -m refopt``).

Subcommands:

``refopt demo``
    Train word2vec skip-gram embeddings with :class:`~refopt.LazyAdam` on a real corpus and report
    the loss, nearest neighbours and speed (see :mod:`refopt.demo`).

Adding a subcommand: write ``_add_NAME(subparsers)``, which registers its parser with
``set_defaults(handler=_run_NAME)``, and list it in :data:`_SUBCOMMANDS`. A handler takes the parsed
arguments and returns an exit status; it raises :class:`CommandError` for a failure the user
caused (bad file, unsupported option value), which :func:`main` reports as one line on stderr with
exit status 2, argparse's convention for usage errors.
"""

from __future__ import annotations

import argparse
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


def _add_demo(subparsers):
    p = subparsers.add_parser(
        "demo",
        help="train word2vec embeddings with LazyAdam on a real corpus",
        description=(
            "Train skip-gram word embeddings with negative sampling (word2vec SGNS) with "
            "LazyAdam, which updates the input and output embedding tables from IndexedSlices "
            "gradients (many duplicate rows per batch). Prints the corpus summary, the mean "
            "loss per epoch, the nearest neighbours of a few frequent words and the speed. "
            "The default corpus is the CPython documentation shipped with Python "
            "(pydoc_data.topics). With the defaults it takes about 20 seconds on two CPU cores."
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
        "--learning-rate", type=_positive_float, default=0.005, metavar="LR",
        help="LazyAdam learning rate (default: %(default)s)",
    )
    model.add_argument(
        "--seed", type=_int_at_least(0), default=0, metavar="N",
        help="seed of the initial embeddings and all random draws (default: %(default)s)",
    )
    model.add_argument(
        "--backend", default="reference",
        help="LazyAdam backend (default: %(default)s, the pure-NumPy reference)",
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

    try:
        optimizer = demo.make_optimizer(args.learning_rate, args.backend)
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
    print(f"refopt demo: word2vec skip-gram with negative sampling, LazyAdam "
          f"(backend {args.backend!r})")
    print(f"corpus      {corpus_name}")
    print(f"tokens      {len(tokens):,}{capped}")
    print(f"vocabulary  {len(vocab):,} words (min count {args.min_count}, at most "
          f"{args.vocab_size:,}), covering {covered:,} tokens ({covered / max(len(tokens), 1):.1%})")
    print(f"training    {args.epochs} epochs, dim {args.dim}, window {args.window}, "
          f"{args.negatives} negatives, batch {args.batch_size}, learning rate "
          f"{args.learning_rate:g}, sample {args.sample:g}, seed {args.seed}")
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
        print(f"loss        {first:.4f} after one epoch ({result.iterations:,} LazyAdam steps)")
    else:
        trend = "fell" if last < first else "did NOT fall"
        print(f"loss        {trend} from {first:.4f} to {last:.4f} "
              f"({result.iterations:,} LazyAdam steps)")

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
# the parser and the entry point

#: Functions that each add one subcommand to the parser, in the order ``--help`` lists them.
_SUBCOMMANDS = [_add_demo]


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
        The exit status: 0 on success, 2 for a usage error (bad option, missing file, unsupported
        backend; argparse's convention), 130 when interrupted.
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
