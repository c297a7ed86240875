"""Skip-gram word embeddings with negative sampling (word2vec SGNS), trained by :class:`LazyAdam`.

This is the workload refopt exists for: two embedding tables (the *input* or "center" table and
the *output* or "context" table) whose gradients are :class:`~refopt.IndexedSlices` with many
duplicate indices per batch (frequent words occur many times in one batch), applied by a lazy
optimizer that moves only the rows it is given.

The model is the one of Mikolov et al. (2013), "Distributed Representations of Words and Phrases
and their Compositionality": for a center word ``c`` with context word ``o`` and ``K`` negative
words ``n_1 .. n_K`` drawn from the unigram distribution raised to the power 3/4, the loss is::

    loss = -log σ(u_c · v_o) - Σ_k log σ(-u_c · v_{n_k})

where ``u`` are rows of the input table and ``v`` rows of the output table. A batch holds many
(center, context) pairs, each with its own ``K`` negatives; the objective of a batch is the mean
loss over its pairs.

Everything here is computation; nothing prints. The command line (``refopt demo``, in
:mod:`refopt.cli`) does the reporting.

Examples
--------
>>> from refopt.demo import load_corpus, tokenize, train_skipgram, nearest_neighbours
>>> text, name = load_corpus()                      # the CPython documentation topics
>>> result = train_skipgram(tokenize(text)[:5000], epochs=2, dim=16)   # doctest: +SKIP
>>> nearest_neighbours(result.embeddings, result.vocab, "function", k=3)  # doctest: +SKIP
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from refopt.indexed_slices import IndexedSlices

__all__ = [
    "DEFAULT_CORPUS_NAME",
    "DEMO_OPTIMIZERS",
    "BackendComparison",
    "Progress",
    "SkipGramResult",
    "Vocabulary",
    "build_vocabulary",
    "compare_backends",
    "load_corpus",
    "make_optimizer",
    "mean_cosine_similarity",
    "micro_batch_bounds",
    "nearest_neighbours",
    "skipgram_batch",
    "sparse_update",
    "subsample",
    "tokenize",
    "train_skipgram",
    "train_skipgram_sharded",
]

#: What :func:`load_corpus` calls the embedded default corpus.
DEFAULT_CORPUS_NAME = "pydoc_data.topics (the CPython documentation shipped with Python)"

# Runs of letters in any script (Unicode word characters minus digits and "_").
_WORD = re.compile(r"[^\W\d_]+")


def load_corpus(path=None):
    """Read the text to train on.

    Parameters
    ----------
    path : str or os.PathLike, optional
        A UTF-8 text file. When omitted, the embedded default corpus is used: the help topics of
        the CPython documentation, ``pydoc_data.topics.topics`` (a dict of str to str shipped with
        every Python), joined in sorted key order.

    Returns
    -------
    text : str
        The whole corpus.
    name : str
        A short description of where it came from (the path, or :data:`DEFAULT_CORPUS_NAME`).

    Raises
    ------
    FileNotFoundError, IsADirectoryError, PermissionError
        If ``path`` cannot be opened.
    UnicodeDecodeError
        If the file is not valid UTF-8.
    """
    if path is None:
        from pydoc_data.topics import topics

        return "\n".join(topics[key] for key in sorted(topics)), DEFAULT_CORPUS_NAME
    with open(path, encoding="utf-8") as handle:
        return handle.read(), str(path)


def tokenize(text):
    """Split text into lowercase words.

    A word is a maximal run of letters (of any script) after lowercasing; everything else
    (digits, punctuation, underscores, whitespace) separates words.

    Parameters
    ----------
    text : str

    Returns
    -------
    list of str
        The words in order of appearance.

    Examples
    --------
    >>> tokenize("The __init__() method, e.g. str.Upper!")
    ['the', 'init', 'method', 'e', 'g', 'str', 'upper']
    >>> tokenize("Привет, мир: alpha12 café")
    ['привет', 'мир', 'alpha', 'café']
    """
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    """The words kept for training, most frequent first.

    Attributes
    ----------
    words : list of str
        The kept words; ``words[i]`` is row ``i`` of both embedding tables.
    counts : ndarray of int64, shape ``(len(words),)``
        How often each word occurs in the corpus (non-increasing).
    index : dict of str to int
        Inverse of ``words``.
    """

    words: list
    counts: np.ndarray
    index: dict = field(repr=False)

    def __len__(self):
        return len(self.words)

    def encode(self, tokens):
        """Map tokens to row ids, dropping tokens that are not in the vocabulary.

        Parameters
        ----------
        tokens : iterable of str

        Returns
        -------
        ndarray of int64
        """
        index = self.index
        return np.fromiter((index[t] for t in tokens if t in index), dtype=np.int64)


def build_vocabulary(tokens, min_count=5, max_size=None):
    """Count the tokens and keep the frequent ones.

    Parameters
    ----------
    tokens : iterable of str
    min_count : int, default 5
        Words occurring fewer times are dropped.
    max_size : int, optional
        Keep at most this many words (the most frequent). Ties in count are broken by first
        appearance in ``tokens``, so the result is deterministic.

    Returns
    -------
    Vocabulary
    """
    counter = Counter(tokens)  # insertion order = first appearance
    kept = [(w, c) for w, c in counter.items() if c >= min_count]
    kept.sort(key=lambda wc: -wc[1])  # stable: ties keep first-appearance order
    if max_size is not None:
        kept = kept[:max_size]
    words = [w for w, _ in kept]
    counts = np.array([c for _, c in kept], dtype=np.int64)
    return Vocabulary(words, counts, {w: i for i, w in enumerate(words)})


def subsample(ids, counts, sample, rng):
    """Drop occurrences of frequent words at random, as word2vec does.

    Each occurrence of word ``w`` with corpus frequency ``f = counts[w] / counts.sum()`` is kept
    with probability ``(sqrt(f / sample) + 1) * sample / f`` (capped at 1), the formula of the
    word2vec C code (``sample`` is its ``-sample`` option; ``1e-3`` there by default).

    Parameters
    ----------
    ids : ndarray of int
        The corpus as row ids.
    counts : ndarray of int
        Count of each row id.
    sample : float
        The threshold; ``0`` or less keeps everything.
    rng : numpy.random.Generator

    Returns
    -------
    ndarray of int
        The kept ids, in their original order.
    """
    if sample <= 0 or ids.size == 0:
        return ids
    freq = counts / counts.sum()
    keep = np.minimum((np.sqrt(freq / sample) + 1.0) * sample / freq, 1.0)
    return ids[rng.random(ids.size) < keep[ids]]


def _skipgram_pairs(ids, window, rng):
    """All (center, context) pairs of one pass, with word2vec's shrunk window.

    For each center position a window ``b`` is drawn uniformly from ``1..window`` and the words at
    distance ``1..b`` on either side are its contexts. Returns two int64 arrays.
    """
    n = ids.size
    reach = rng.integers(1, window + 1, size=n)
    centers, contexts = [], []
    for d in range(1, min(window, n - 1) + 1):
        right = reach[: n - d] >= d  # center at i, context at i + d
        centers.append(ids[: n - d][right])
        contexts.append(ids[d:][right])
        left = reach[d:] >= d  # center at i, context at i - d
        centers.append(ids[d:][left])
        contexts.append(ids[: n - d][left])
    if not centers:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(centers), np.concatenate(contexts)


def skipgram_batch(center_table, context_table, centers, targets):
    """Loss and sparse gradients of a batch of SGNS examples.

    Parameters
    ----------
    center_table : ndarray, shape ``(V, dim)``
        Input embeddings ``u``.
    context_table : ndarray, shape ``(V, dim)``
        Output embeddings ``v``.
    centers : ndarray of int, shape ``(B,)``
        Center word of each example.
    targets : ndarray of int, shape ``(B, 1 + K)``
        Column 0 is the true context word, columns ``1..K`` the negative words.

    Returns
    -------
    loss : float
        The mean over the ``B`` examples of ``-log σ(u·v_o) - Σ_k log σ(-u·v_k)``, computed with
        the stable ``log σ(x) = -logaddexp(0, -x)``.
    center_grad : IndexedSlices
        Gradient of the mean loss wrt ``center_table``: ``B`` rows at ``centers``.
    context_grad : IndexedSlices
        Gradient wrt ``context_table``: ``B * (1 + K)`` rows at ``targets.ravel()``.

    Notes
    -----
    With ``z = sign * (u · v)`` (``sign`` +1 for the context, -1 for negatives) each term is
    ``logaddexp(0, -z)`` and its derivative wrt the score ``u · v`` is ``-sign * σ(-z)``, with
    ``σ(-z) = exp(-logaddexp(0, z))``. The gradients are in the dtype of the tables. Indices repeat
    whenever a word occurs more than once in the batch; the optimizer sums them.
    """
    u = center_table[centers]  # (B, d)
    v = context_table[targets]  # (B, 1+K, d)
    terms, center_values, context_values = _sgns_rows(u, v, targets.shape[0])
    loss = float(terms.sum(dtype=np.float64) / targets.shape[0])
    return (
        loss,
        IndexedSlices(center_values, centers, center_table.shape),
        IndexedSlices(context_values, targets.reshape(-1), context_table.shape),
    )


def _sgns_rows(u, v, batch):
    """The per-example loss terms and gradient rows of :func:`skipgram_batch`.

    ``u`` (b, d) and ``v`` (b, 1+K, d) are the looked-up rows of ``b`` examples of a batch of
    ``batch`` examples (``b <= batch``: every quantity here is computed row by row, so the rows
    of a part of a batch are the bytes of the same rows of the whole batch; the gradient is of
    the mean over ``batch``). Returns ``terms`` (b, 1+K), the center gradient rows (b, d) and
    the context gradient rows (b (1+K), d), in the dtype of ``u``.
    """
    dtype = u.dtype
    width = v.shape[1]
    scores = np.matmul(v, u[:, :, None])[:, :, 0]  # (b, 1+K)
    sign = np.full(width, -1.0, dtype=dtype)
    sign[0] = 1.0
    z = scores * sign
    terms = np.logaddexp(dtype.type(0), -z)
    # d(mean loss)/d(score): -sign * sigmoid(-z) / B
    dscore = (-sign / dtype.type(batch)) * np.exp(-np.logaddexp(dtype.type(0), z))
    center_values = np.matmul(dscore[:, None, :], v)[:, 0, :]  # (b, d)
    context_values = (dscore[:, :, None] * u[:, None, :]).reshape(u.shape[0] * width, -1)
    return terms, center_values, context_values


#: The optimizers ``refopt demo --optimizer`` trains with (every one that accepts
#: IndexedSlices gradients under its default convention, Ftrl under Keras 2's sparse apply;
#: RMSprop's sparse form comes with the sparse family), and their default learning rates. The
#: loss is the mean over a batch of 1024 pairs, so a row's gradient is small: Adam normalises
#: it away, plain SGD, Adagrad (whose accumulator starts at 0.1), Adadelta (whose steps start
#: at sqrt(epsilon)) and Ftrl need large rates. Measured, loss after three epochs on 100,000
#: tokens (from 4.16): SGD 2.37, Adagrad 2.47, Adadelta 2.37, Ftrl 2.39, Lamb 2.44 (0.05
#: diverges), Lion 2.43, Adamax 2.60, Nadam 2.25.
DEMO_OPTIMIZERS = {"LazyAdam": 0.005, "Adam": 0.005, "AdamW": 0.005, "Adagrad": 10.0,
                   "SGD": 50.0, "Adadelta": 100.0, "Adamax": 0.005, "Nadam": 0.005,
                   "Lion": 0.001, "Ftrl": 20.0, "Lamb": 0.02,
                   # the sparse family (issue 14): FBGEMM's row-wise Adagrad (exact), TF1's
                   # proximal optimizers (l1 = l2 = 0 here: TF1's Adagrad and plain SGD)
                   "RowWiseAdagrad": 0.2, "ProximalAdagrad": 10.0,
                   "ProximalGradientDescent": 50.0,
                   # FBGEMM's partial row-wise Adam at FBGEMM's default rate (loss after
                   # two epochs 2.30; 2.43 at Adam's 0.005, 2.31 at 0.02)
                   "PartialRowWiseAdam": 0.01}


def make_optimizer(learning_rate=None, backend="cpu", optimizer="LazyAdam"):
    """The optimizer the demo trains with (default :class:`refopt.LazyAdam`, Keras' betas).

    Parameters
    ----------
    learning_rate : float or None
        None: the optimizer's default in :data:`DEMO_OPTIMIZERS`.
    backend : str, default "cpu"
        Passed through to the optimizer, which rejects backends it does not have.
    optimizer : str, default "LazyAdam"
        A key of :data:`DEMO_OPTIMIZERS`.

    Returns
    -------
    refopt.Optimizer

    Raises
    ------
    ValueError
        An unknown ``optimizer`` (naming the ones there are), or what the optimizer raises.
    """
    import refopt

    if optimizer not in DEMO_OPTIMIZERS:
        raise ValueError(f"`optimizer` must be one of {sorted(DEMO_OPTIMIZERS)}. Received: "
                         f"optimizer={optimizer!r}")
    lr = DEMO_OPTIMIZERS[optimizer] if learning_rate is None else learning_rate
    cls = getattr(refopt, optimizer)
    if optimizer in ("LazyAdam", "Adam", "AdamW"):
        return cls(learning_rate=lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7, backend=backend)
    if optimizer == "Ftrl":
        # TF's sparse apply (Keras 2 / TF1 SparseApplyFtrl): only the rows of a batch move.
        # tf_keras' Ftrl densifies the gradient and recomputes every weight from its linear
        # term, which sets both tables to 0 on the first step: the skip-gram loss then sits
        # at its saddle point (every gradient 0), 6 ln 2, for good.
        return cls(learning_rate=lr, convention="keras2", backend=backend)
    return cls(learning_rate=lr, backend=backend)


def sparse_update(optimizer):
    """One line saying what ``optimizer`` does to the rows of an embedding table given an
    :class:`~refopt.IndexedSlices` gradient (under its convention).

    The line is measured, not recited: a copy of the optimizer (same class and configuration,
    reference backend) takes two steps on a 2 x 2 table whose gradient holds only row 0, and
    the line says whether row 1 and its slots changed on each step.

    Parameters
    ----------
    optimizer : refopt.Optimizer
        Built or not; read only (its class, configuration and laziness).

    Returns
    -------
    str
        ``"<Name> is lazy here: ..."`` (only the present rows and their slots move) or
        ``"<Name> is not lazy here: ..."`` with what happens to a row absent from a batch:
        it stays or keeps moving (and why: weight decay, slots that carry its earlier
        gradients), whether its slots change, and whether a row no batch has touched moves.
    """
    import numpy as np

    from refopt.indexed_slices import IndexedSlices
    from refopt.optimizers import SGD

    name = type(optimizer).__name__
    if optimizer.convention.name != "tf_keras":
        name += f" ({optimizer.convention.name})"
    if optimizer._is_lazy():
        return (f"{name} is lazy here: only the rows present in a batch (duplicates summed) "
                "move, with their slots; the other rows and their slots stay as they are")
    config = dict(optimizer.get_config(), backend="reference")
    probe = type(optimizer).from_config(config)
    # row 0 in every gradient, row 1 in the first only, row 2 in none
    table = np.array([[0.5, -0.25], [0.75, -1.0], [-0.5, 0.25]], np.float32)
    values = np.array([[0.125, -0.5], [0.25, 0.375]], np.float32)
    fresh, absent, slots_moved = [], [], False
    for step in range(3):
        rows = [0, 1] if step == 0 else [0]
        grad = IndexedSlices(values[:len(rows)], np.array(rows), table.shape)
        before = table.copy()
        slots = {n: probe.get_slot(table, n).copy() for n in probe.slot_names} \
            if probe.built else {}
        probe.apply_gradients([(grad, table)])
        fresh.append(not np.array_equal(before[2], table[2]))
        if step:
            absent.append(not np.array_equal(before[1], table[1]))
            if getattr(optimizer, "momentum", None) == 0 and isinstance(optimizer, SGD):
                continue  # SGD without momentum: Keras keeps no momentum buffer
            slots_moved |= any(not np.array_equal(v[1], probe.get_slot(table, n)[1])
                               for n, v in slots.items())
    what = f"{name} is not lazy here: every row of both tables takes the step"
    if not any(absent):
        how = "a row absent from a batch does not move"
    else:
        why = []
        if optimizer._weight_decay_acts():
            why.append("weight decay")
        if slots_moved:
            why.append("slots that carry its earlier gradients")
        how = "a row absent from a batch keeps moving" + (f" ({', '.join(why)})" if why else "")
    if slots_moved:
        how += "; its slots change"
    if fresh[0] and not any(fresh[1:]):
        how += "; a row no batch has touched yet moves on the first step only"
    elif any(fresh):
        how += "; so does a row no batch has touched yet"
    return f"{what}; {how}"


@dataclass(frozen=True)
class Progress:
    """Where :func:`train_skipgram` stands, as passed to its ``progress`` callback.

    Attributes
    ----------
    epoch, epochs : int
        The current epoch (from 1) and the number of epochs.
    batch, batches : int
        Batches done in this epoch (from 1) and the number in this epoch (it varies from epoch
        to epoch, with subsampling and the dynamic window).
    loss : float
        Mean loss over the examples of this epoch so far (NaN for an epoch without examples).
    pairs : int
        Examples done in this epoch.
    seconds : float
        Wall time of this epoch so far.
    """

    epoch: int
    epochs: int
    batch: int
    batches: int
    loss: float
    pairs: int
    seconds: float


@dataclass
class SkipGramResult:
    """What :func:`train_skipgram` returns.

    Attributes
    ----------
    vocab : list of str
        Row ``i`` of the tables is ``vocab[i]``; most frequent first.
    counts : ndarray of int64
        Corpus count of each vocabulary word.
    embeddings : ndarray of float32, shape ``(len(vocab), dim)``
        The input ("center") table: the word vectors.
    context_embeddings : ndarray of float32, shape ``(len(vocab), dim)``
        The output ("context") table.
    losses : list of float
        Mean SGNS loss per training example, one entry per epoch.
    epoch_seconds : list of float
        Wall time of each epoch.
    pairs_per_epoch : list of int
        (center, context) examples trained on in each epoch.
    corpus_tokens : int
        Tokens given to :func:`train_skipgram`.
    vocab_tokens : int
        Of these, the tokens in the vocabulary (the ones trained on, before subsampling).
    seconds : float
        Wall time of the whole call, vocabulary building included.
    iterations : int
        Optimizer steps taken (batches).
    """

    vocab: list
    counts: np.ndarray
    embeddings: np.ndarray
    context_embeddings: np.ndarray
    losses: list
    epoch_seconds: list
    pairs_per_epoch: list
    corpus_tokens: int
    vocab_tokens: int
    seconds: float
    iterations: int

    @property
    def tokens_per_second(self):
        """float: corpus tokens processed per second of wall time (``corpus_tokens * epochs``)."""
        return self.corpus_tokens * len(self.losses) / self.seconds if self.seconds > 0 else 0.0


def train_skipgram(
    tokens,
    *,
    epochs=20,
    dim=100,
    window=5,
    negatives=5,
    batch_size=1024,
    learning_rate=0.005,
    min_count=5,
    vocab_size=5000,
    sample=1e-3,
    seed=0,
    backend="cpu",
    optimizer=None,
    progress=None,
):
    """Train skip-gram embeddings with negative sampling on a token sequence.

    Parameters
    ----------
    tokens : sequence of str
        The corpus, e.g. from :func:`tokenize`.
    epochs : int, default 20
        Passes over the corpus. Subsampling, windows, negatives and the order of examples are
        drawn afresh in every epoch.
    dim : int, default 100
        Embedding dimension.
    window : int, default 5
        Maximum distance between a center word and a context word; each center draws its own
        window size in ``1..window`` (word2vec's "dynamic window").
    negatives : int, default 5
        Negative words per (center, context) example, drawn from the unigram distribution raised
        to 3/4. A negative may coincide with the true context word (it is not resampled).
    batch_size : int, default 1024
        (center, context) examples per optimizer step.
    learning_rate : float, default 0.005
        Of the :class:`~refopt.LazyAdam` built by :func:`make_optimizer`.
    min_count : int, default 5
        See :func:`build_vocabulary`.
    vocab_size : int, default 5000
        Keep at most this many words (the most frequent).
    sample : float, default 1e-3
        Subsampling threshold, see :func:`subsample`; ``0`` disables subsampling.
    seed : int, default 0
        Seeds the initial tables and every random draw; equal arguments give equal results.
    backend : str, default "cpu"
        Passed to :func:`make_optimizer`; ignored when ``optimizer`` is given.
    optimizer : object, optional
        Anything with ``apply_gradients([(IndexedSlices, ndarray), ...])`` that updates the tables
        in place, used instead of a new :class:`~refopt.LazyAdam`. One optimizer updates both
        tables, one step per batch.
    progress : callable, optional
        Called as ``progress(p)`` with a :class:`Progress` after every batch, and at least once
        per epoch: the last call of an epoch has ``p.batch == p.batches`` and ``p.loss`` is then
        the epoch's mean loss.

    Returns
    -------
    SkipGramResult

    Raises
    ------
    ValueError
        If an argument is out of range, or fewer than two distinct words survive
        :func:`build_vocabulary` (nothing to train).

    Notes
    -----
    The input table starts uniform in ``[-0.5/dim, 0.5/dim)`` and the output table at zero, as in
    word2vec. Both are C-contiguous float32 and are updated in place by the optimizer; the
    gradients are float32 :class:`~refopt.IndexedSlices` (see :func:`skipgram_batch`).
    """
    start = time.perf_counter()
    tokens, vocab, ids = _prepare(tokens, epochs=epochs, dim=dim, window=window,
                                  negatives=negatives, batch_size=batch_size,
                                  learning_rate=learning_rate, min_count=min_count,
                                  vocab_size=vocab_size)
    if optimizer is None:
        optimizer = make_optimizer(learning_rate, backend)
    rng = np.random.default_rng(seed)
    center_table, context_table = _initial_tables(len(vocab), dim, rng)

    def step(centers, targets):
        loss, center_grad, context_grad = skipgram_batch(center_table, context_table, centers,
                                                         targets)
        optimizer.apply_gradients([(center_grad, center_table), (context_grad, context_table)])
        return loss

    losses, epoch_seconds, pairs_per_epoch = _train_loop(
        ids, vocab, rng, step, epochs=epochs, window=window, negatives=negatives,
        batch_size=batch_size, sample=sample, progress=progress)
    return SkipGramResult(
        vocab=list(vocab.words),
        counts=vocab.counts,
        embeddings=center_table,
        context_embeddings=context_table,
        losses=losses,
        epoch_seconds=epoch_seconds,
        pairs_per_epoch=pairs_per_epoch,
        corpus_tokens=len(tokens),
        vocab_tokens=int(ids.size),
        seconds=time.perf_counter() - start,
        iterations=int(optimizer.iterations),
    )


def _prepare(tokens, *, epochs, dim, window, negatives, batch_size, learning_rate, min_count,
             vocab_size):
    """Check the arguments of :func:`train_skipgram`; the tokens, vocabulary and row ids."""
    for name, value, low in [
        ("epochs", epochs, 1),
        ("dim", dim, 1),
        ("window", window, 1),
        ("negatives", negatives, 0),
        ("batch_size", batch_size, 1),
        ("min_count", min_count, 1),
        ("vocab_size", vocab_size, 2),
    ]:
        if int(value) != value or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}. Received: {name}={value!r}")
    if not learning_rate > 0:
        raise ValueError(f"`learning_rate` must be > 0. Received: learning_rate={learning_rate!r}")
    tokens = list(tokens)
    vocab = build_vocabulary(tokens, min_count=min_count, max_size=vocab_size)
    if len(vocab) < 2:
        raise ValueError(
            f"the corpus has {len(vocab)} distinct word(s) occurring at least {min_count} times "
            f"({len(tokens)} tokens); at least 2 are needed to train"
        )
    return tokens, vocab, vocab.encode(tokens)


def _initial_tables(n_words, dim, rng):
    """word2vec's start: the input table uniform in [-0.5/dim, 0.5/dim), the output at 0."""
    center_table = np.ascontiguousarray(
        (rng.random((n_words, dim), dtype=np.float32) - np.float32(0.5)) / np.float32(dim)
    )
    return center_table, np.zeros((n_words, dim), dtype=np.float32)


def _train_loop(ids, vocab, rng, step, *, epochs, window, negatives, batch_size, sample,
                progress):
    """The epochs and batches of :func:`train_skipgram`: every random draw, in one order.

    ``step(centers, targets)`` trains on one batch and returns its mean loss (a float).
    Returns the mean loss, the seconds and the pairs of each epoch.
    """
    n_words = len(vocab)
    noise = vocab.counts.astype(np.float64) ** 0.75
    noise_cdf = np.cumsum(noise / noise.sum())
    losses, epoch_seconds, pairs_per_epoch = [], [], []
    for epoch in range(1, epochs + 1):
        epoch_start = time.perf_counter()
        kept = subsample(ids, vocab.counts, sample, rng)
        centers, contexts = _skipgram_pairs(kept, window, rng)
        order = rng.permutation(centers.size)
        centers, contexts = centers[order], contexts[order]
        n_pairs = centers.size
        n_batches = -(-n_pairs // batch_size)
        total = 0.0
        for b in range(n_batches):
            sl = slice(b * batch_size, (b + 1) * batch_size)
            c = centers[sl]
            targets = np.empty((c.size, 1 + negatives), dtype=np.int64)
            targets[:, 0] = contexts[sl]
            if negatives:
                draws = rng.random((c.size, negatives))
                targets[:, 1:] = np.minimum(np.searchsorted(noise_cdf, draws), n_words - 1)
            loss = step(c, targets)
            total += loss * c.size
            if progress is not None:
                done = min(n_pairs, (b + 1) * batch_size)
                progress(
                    Progress(epoch, epochs, b + 1, n_batches, total / done, done,
                             time.perf_counter() - epoch_start)
                )
        losses.append(total / n_pairs if n_pairs else float("nan"))
        pairs_per_epoch.append(int(n_pairs))
        epoch_seconds.append(time.perf_counter() - epoch_start)
        if progress is not None and n_batches == 0:
            progress(Progress(epoch, epochs, 0, 0, float("nan"), 0, epoch_seconds[-1]))
    return losses, epoch_seconds, pairs_per_epoch


def micro_batch_bounds(batch, micro_batches):
    """Where the ``micro_batches`` micro-batches of a batch of ``batch`` pairs start and end.

    Micro-batch ``k`` holds pairs ``[b[k], b[k + 1])`` with ``b[k] = k * batch //
    micro_batches`` (balanced and contiguous; some are empty when the batch is smaller
    than ``micro_batches``).

    Returns
    -------
    list of int, length ``micro_batches + 1``
    """
    return [k * batch // micro_batches for k in range(micro_batches + 1)]


def train_skipgram_sharded(
    tokens,
    *,
    micro_batches=None,
    comm=None,
    epochs=20,
    dim=100,
    window=5,
    negatives=5,
    batch_size=1024,
    learning_rate=0.005,
    min_count=5,
    vocab_size=5000,
    sample=1e-3,
    seed=0,
    backend="cpu",
    optimizer=None,
    progress=None,
):
    """:func:`train_skipgram` over MPI, both tables row-sharded: the same bits for any R.

    A collective: every rank calls it with the same arguments (``mpiexec -n R``). Every rank
    draws the whole run's random numbers (the same stream as :func:`train_skipgram`); each
    batch is cut into ``micro_batches`` contiguous micro-batches
    (:func:`micro_batch_bounds`) and rank ``r`` computes micro-batches ``r K / R .. (r + 1)
    K / R - 1``: it gathers the rows they need from their owners
    (:meth:`~refopt.distributed.ShardedEmbedding.lookup`), forms their gradient rows (each a
    row of the whole batch's gradient, bit for bit, the mean still over the whole batch),
    and hands them to two :class:`~refopt.distributed.ShardedEmbedding` (row ``i`` of each
    table on rank ``i mod R``), whose owners add duplicates in (micro-batch, position)
    order, the order of the whole batch's ``IndexedSlices``. The per-example loss terms are
    gathered and summed as :func:`skipgram_batch` sums them. So the losses, both tables and
    the optimizer's slots are those of :func:`train_skipgram` with the same arguments, bit for
    bit, whatever R and K.

    Parameters
    ----------
    tokens, epochs, dim, window, negatives, batch_size, learning_rate, min_count, vocab_size,
    sample, seed, backend, progress
        As :func:`train_skipgram` (``progress`` is called on every rank; report from one).
    micro_batches : int or None
        K, a multiple of R; None: R.
    comm : Communicator, mpi4py communicator or None
        See :func:`refopt.distributed.get_comm`.
    optimizer : refopt.Optimizer or None
        Unbuilt and lazy on sparse gradients (LazyAdam, the default; Adagrad; Keras 2's
        Ftrl): each table gets a copy of it (one optimizer per table, one step per batch, as
        the one optimizer of :func:`train_skipgram` steps both tables once per batch).

    Returns
    -------
    SkipGramResult
        On every rank, with the whole tables (gathered at the end).

    Raises
    ------
    ValueError
        As :func:`train_skipgram`; a ``micro_batches`` that is not a multiple of R.
    TypeError
        An optimizer that is not lazy on sparse gradients (a row-sharded table's owner
        moves only its rows).
    ImportError
        No ``comm`` given and ``mpi4py`` is not installed (``pip install "refopt[mpi]"``).
    """
    from refopt.distributed import ShardedEmbedding, get_comm

    start = time.perf_counter()
    tokens, vocab, ids = _prepare(tokens, epochs=epochs, dim=dim, window=window,
                                  negatives=negatives, batch_size=batch_size,
                                  learning_rate=learning_rate, min_count=min_count,
                                  vocab_size=vocab_size)
    comm = get_comm(comm)
    micro_batches = comm.size if micro_batches is None else micro_batches
    if optimizer is None:
        optimizer = make_optimizer(learning_rate, backend)
    rng = np.random.default_rng(seed)
    center_table, context_table = _initial_tables(len(vocab), dim, rng)
    tables = [ShardedEmbedding(optimizer, table, micro_batches=micro_batches, comm=comm)
              for table in (center_table, context_table)]
    del center_table, context_table  # each rank keeps its rows only
    mine = tables[0].micro_batch_ids
    shape = tables[0].shape

    def step(centers, targets):
        n, width = targets.shape
        cut = micro_batch_bounds(n, micro_batches)
        lo, hi = cut[mine[0]], cut[mine[-1] + 1]
        u = tables[0].lookup(centers[lo:hi])
        v = tables[1].lookup(targets[lo:hi].reshape(-1)).reshape(hi - lo, width, dim)
        terms = np.empty((hi - lo, width), np.float32)
        center_grads, context_grads = [], []
        for k in mine:
            a, b = cut[k] - lo, cut[k + 1] - lo
            terms[a:b], cv, xv = _sgns_rows(u[a:b], v[a:b], n)
            center_grads.append(IndexedSlices(cv, centers[lo + a:lo + b], shape))
            context_grads.append(IndexedSlices(xv, targets[lo + a:lo + b].reshape(-1), shape))
        tables[0].apply_gradients(center_grads)
        tables[1].apply_gradients(context_grads)
        every = np.empty((n, width), np.float32)  # the whole batch's terms, in order
        R = comm.size
        counts = [(cut[(r + 1) * micro_batches // R] - cut[r * micro_batches // R]) * width
                  for r in range(R)]
        comm.allgatherv(terms.reshape(-1), every.reshape(-1), counts)
        return float(every.sum(dtype=np.float64) / n)

    losses, epoch_seconds, pairs_per_epoch = _train_loop(
        ids, vocab, rng, step, epochs=epochs, window=window, negatives=negatives,
        batch_size=batch_size, sample=sample, progress=progress)
    return SkipGramResult(
        vocab=list(vocab.words),
        counts=vocab.counts,
        embeddings=tables[0].gather_table(),
        context_embeddings=tables[1].gather_table(),
        losses=losses,
        epoch_seconds=epoch_seconds,
        pairs_per_epoch=pairs_per_epoch,
        corpus_tokens=len(tokens),
        vocab_tokens=int(ids.size),
        seconds=time.perf_counter() - start,
        iterations=int(tables[0].iterations),
    )


@dataclass(frozen=True)
class BackendComparison:
    """What :func:`compare_backends` measured.

    Attributes
    ----------
    backend, baseline : str
        The two backends compared.
    steps : int
        Batches replayed through each.
    backend_ms, baseline_ms : float
        Median wall time of one ``apply_gradients`` call (both tables), in milliseconds.
    identical : bool
        Whether both left bit-identical tables and moments.
    """

    backend: str
    baseline: str
    steps: int
    backend_ms: float
    baseline_ms: float
    identical: bool

    @property
    def speedup(self):
        """float: ``baseline_ms / backend_ms``."""
        return self.baseline_ms / self.backend_ms if self.backend_ms > 0 else float("inf")


def compare_backends(result, *, backend="cpu", baseline="reference", steps=20, batch_size=1024,
                     negatives=5, learning_rate=None, seed=0, optimizer="LazyAdam"):
    """Time optimizer steps of two backends on the same sparse gradients of a trained model.

    Draws ``steps`` batches of (center, context, negatives) from the unigram distribution of
    ``result``, computes their gradients once (:func:`skipgram_batch`), then replays them through
    a fresh :func:`make_optimizer` of each backend on copies of the trained tables, timing each
    ``apply_gradients`` call, and checks that both end bit-identical.

    Parameters
    ----------
    result : SkipGramResult
        A trained model (its tables are not modified).
    backend, baseline : str
        The backends to compare (``baseline`` is the denominator of the speed-up).
    steps, batch_size, negatives : int
        How many batches, of how many pairs with how many negatives each.
    learning_rate : float or None
        None: the optimizer's default (:data:`DEMO_OPTIMIZERS`).
    seed : int
    optimizer : str, default "LazyAdam"
        Which optimizer (:func:`make_optimizer`).

    Returns
    -------
    BackendComparison
    """
    rng = np.random.default_rng(seed)
    counts = np.asarray(result.counts, dtype=np.float64)
    probs = counts / counts.sum()
    batches = []
    for _ in range(steps):
        centers = rng.choice(len(probs), size=batch_size, p=probs)
        targets = rng.choice(len(probs), size=(batch_size, 1 + negatives), p=probs)
        _, g_in, g_out = skipgram_batch(result.embeddings, result.context_embeddings, centers, targets)
        batches.append((g_in, g_out))

    def replay(name):
        tables = [result.embeddings.copy(), result.context_embeddings.copy()]
        opt = make_optimizer(learning_rate, name, optimizer)
        times = []
        for g_in, g_out in batches:
            start = time.perf_counter()
            opt.apply_gradients([(g_in, tables[0]), (g_out, tables[1])])
            times.append(time.perf_counter() - start)
        state = tables + [opt.get_slot(t, n) for t in tables for n in opt.slot_names]
        return 1e3 * float(np.median(times)), state

    backend_ms, a = replay(backend)
    baseline_ms, b = replay(baseline)
    identical = all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) for x, y in zip(a, b))
    return BackendComparison(backend, baseline, steps, backend_ms, baseline_ms, identical)


def nearest_neighbours(embeddings, vocab, word, k=5):
    """The words whose vectors are closest to ``word``'s by cosine similarity.

    Parameters
    ----------
    embeddings : ndarray, shape ``(len(vocab), dim)``
    vocab : sequence of str
        ``vocab[i]`` names row ``i``.
    word : str
        The query; must be in ``vocab``.
    k : int, default 5
        How many neighbours to return (fewer if the vocabulary is smaller).

    Returns
    -------
    list of (str, float)
        ``(word, cosine)`` pairs, most similar first, the query itself excluded. Ties keep
        vocabulary order. A zero vector has cosine 0 with everything.

    Raises
    ------
    KeyError
        If ``word`` is not in ``vocab``.

    Examples
    --------
    >>> import numpy as np
    >>> E = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [-1.0, 0.0]])
    >>> [(w, round(s, 4)) for w, s in nearest_neighbours(E, ["a", "b", "c", "d"], "a", k=2)]
    [('b', 0.7071), ('c', 0.0)]
    """
    vocab = list(vocab)
    try:
        row = vocab.index(word)
    except ValueError:
        raise KeyError(f"{word!r} is not in the vocabulary") from None
    emb = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    sims = (emb @ emb[row]) / (safe * safe[row])
    sims[norms == 0] = 0.0
    if norms[row] == 0:
        sims[:] = 0.0
    sims[row] = -np.inf
    order = np.argsort(-sims, kind="stable")
    n = min(k, len(vocab) - 1)
    return [(vocab[i], float(sims[i])) for i in order[:n]]


#: Above this mean cosine similarity of two distinct words (:func:`mean_cosine_similarity`) the
#: vectors still share one direction, so every word's neighbours look alike and their
#: similarities approach 1: ``refopt demo`` says the model is undertrained. Measured on the
#: default corpus (seed 0): 0.85-0.99 after one epoch depending on the optimizer, 0.24-0.29
#: after three, lower after the default 20; 0.5 separates the two with a wide margin.
UNDERTRAINED_SIMILARITY = 0.5


def mean_cosine_similarity(embeddings):
    """The mean cosine similarity of two distinct rows (non-zero rows only).

    Parameters
    ----------
    embeddings : ndarray, shape ``(n, dim)``

    Returns
    -------
    float
        ``(|sum u_i|**2 - m) / (m (m - 1))`` over the ``m`` unit vectors ``u_i`` of the
        non-zero rows: the average of ``cos(u_i, u_j)`` over all ordered pairs ``i != j``
        (computed in float64, without the ``m x m`` matrix). NaN with fewer than two
        non-zero rows.

    Examples
    --------
    >>> import numpy as np
    >>> round(mean_cosine_similarity(np.array([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])), 4)
    0.4714
    """
    emb = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(emb, axis=1)
    units = emb[norms > 0] / norms[norms > 0, None]
    m = len(units)
    if m < 2:
        return float("nan")
    total = units.sum(axis=0)
    return float((total @ total - m) / (m * (m - 1)))
