import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from refopt import IndexedSlices
from refopt.cli import main
from refopt.demo import (
    build_vocabulary,
    nearest_neighbours,
    skipgram_batch,
    subsample,
    tokenize,
    train_skipgram,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

# A small, fast run of the demo on the first tokens of the default corpus.
SMALL = ["--max-tokens", "4000", "--epochs", "3", "--dim", "16", "--batch-size", "256",
         "--min-count", "3", "--seed", "1", "--quiet"]


# --- tokenize ---------------------------------------------------------------------------------


def test_tokenize_lowercases_and_splits_on_everything_but_letters():
    text = "The __init__() method, e.g. str.Upper!\nDon't use x2y; UTF-8."
    assert tokenize(text) == [
        "the", "init", "method", "e", "g", "str", "upper", "don", "t", "use", "x", "y", "utf",
    ]


def test_tokenize_without_letters_is_empty():
    assert tokenize("") == []
    assert tokenize("123 -- 4.56 ___ ,.;") == []


def test_tokenize_keeps_letters_of_any_script():
    assert tokenize("\u00c9t\u00e9 \u041c\u0438\u0440 x1y") == ["\u00e9t\u00e9", "\u043c\u0438\u0440", "x", "y"]


# --- vocabulary and subsampling ---------------------------------------------------------------


def test_build_vocabulary_keeps_frequent_words_most_frequent_first():
    tokens = "b a b c a b d".split()
    vocab = build_vocabulary(tokens, min_count=2)
    assert vocab.words == ["b", "a"]
    assert vocab.counts.tolist() == [3, 2]
    assert vocab.encode(["a", "c", "b", "zzz"]).tolist() == [1, 0]


def test_build_vocabulary_breaks_ties_by_first_appearance_and_caps_size():
    tokens = "y x x y z".split()
    assert build_vocabulary(tokens, min_count=1).words == ["y", "x", "z"]
    assert build_vocabulary(tokens, min_count=1, max_size=1).words == ["y"]


def test_subsample_keep_probability_follows_word2vec_formula():
    # word 0: f = 0.9, keep = (sqrt(0.9 / 0.1) + 1) * 0.1 / 0.9 = 4/9; word 1: f = 0.1, keep 1
    counts = np.array([9, 1])
    ids = np.array([0] * 90_000 + [1] * 10_000)
    kept = subsample(ids, counts, 0.1, np.random.default_rng(0))
    assert np.sum(kept == 1) == 10_000
    assert abs(np.sum(kept == 0) / 90_000 - 4 / 9) < 0.01
    assert subsample(ids, counts, 0.0, np.random.default_rng(0)) is ids


# --- nearest_neighbours -----------------------------------------------------------------------

WORDS = ["a", "b", "c", "d", "e"]
# a = (1, 0); b = (1, 1) at 45 degrees; c = (0, 2) at 90; d = (-3, 0) opposite; e = (3, 1)
VECTORS = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0], [-3.0, 0.0], [3.0, 1.0]])


def test_nearest_neighbours_orders_by_hand_computed_cosine():
    near = nearest_neighbours(VECTORS, WORDS, "a", k=4)
    assert [w for w, _ in near] == ["e", "b", "c", "d"]
    expected = [3 / math.sqrt(10), 1 / math.sqrt(2), 0.0, -1.0]
    np.testing.assert_allclose([s for _, s in near], expected, rtol=0, atol=1e-12)


def test_nearest_neighbours_excludes_the_query_and_caps_k_at_vocab_size():
    near = nearest_neighbours(VECTORS, WORDS, "c", k=10)
    assert len(near) == 4
    assert "c" not in [w for w, _ in near]
    # cos(c, b) = 2 / (2 * sqrt 2) = 1/sqrt 2; cos(c, e) = 2 / (2 * sqrt 10) = 1/sqrt 10
    assert near[0][0] == "b" and near[0][1] == pytest.approx(1 / math.sqrt(2))
    assert near[1][0] == "e" and near[1][1] == pytest.approx(1 / math.sqrt(10))


def test_nearest_neighbours_gives_zero_vectors_cosine_zero():
    vectors = np.array([[1.0, 0.0], [0.0, 0.0], [-1.0, 0.0]], dtype=np.float32)
    assert nearest_neighbours(vectors, ["p", "zero", "q"], "p", k=2) == [("zero", 0.0), ("q", -1.0)]
    assert nearest_neighbours(vectors, ["p", "zero", "q"], "zero", k=2) == [("p", 0.0), ("q", 0.0)]


def test_nearest_neighbours_of_unknown_word_raises_key_error():
    with pytest.raises(KeyError, match="nope"):
        nearest_neighbours(VECTORS, WORDS, "nope")


# --- skipgram_batch ---------------------------------------------------------------------------


def test_skipgram_batch_at_zero_scores_matches_hand_derived_values():
    # All scores are 0 (zero output table): each term is log 2, sigmoid(0) = 1/2.
    center = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    context = np.zeros((2, 2), dtype=np.float32)
    loss, cg, og = skipgram_batch(center, context, np.array([0, 0]), np.array([[1, 0], [1, 1]]))
    assert loss == pytest.approx(2 * math.log(2))
    assert isinstance(cg, IndexedSlices) and isinstance(og, IndexedSlices)
    assert cg.values.dtype == og.values.dtype == np.float32
    assert cg.indices.tolist() == [0, 0] and cg.dense_shape == (2, 2)
    np.testing.assert_array_equal(cg.values, np.zeros((2, 2), np.float32))
    # d loss / d v = -sign * sigmoid(0) * u / B with B = 2: positive -u/4, negative +u/4
    assert og.indices.tolist() == [1, 0, 1, 1] and og.dense_shape == (2, 2)
    u = center[0]
    np.testing.assert_allclose(og.values, np.stack([-u / 4, u / 4, -u / 4, u / 4]))


def test_skipgram_batch_gradients_match_finite_differences_with_duplicate_rows():
    rng = np.random.default_rng(3)
    center = rng.normal(size=(4, 3))
    context = rng.normal(size=(5, 3))
    centers = np.array([2, 0, 2])
    targets = np.array([[1, 4, 1], [3, 3, 0], [1, 2, 4]])

    def loss_of(c, o):
        return skipgram_batch(c, o, centers, targets)[0]

    _, cg, og = skipgram_batch(center, context, centers, targets)
    for table, grad, other_first in [(center, cg, True), (context, og, False)]:
        numeric = np.zeros_like(table)
        h = 1e-6
        for idx in np.ndindex(table.shape):
            plus, minus = table.copy(), table.copy()
            plus[idx] += h
            minus[idx] -= h
            if other_first:
                numeric[idx] = (loss_of(plus, context) - loss_of(minus, context)) / (2 * h)
            else:
                numeric[idx] = (loss_of(center, plus) - loss_of(center, minus)) / (2 * h)
        np.testing.assert_allclose(grad.to_dense(), numeric, atol=1e-7)


def test_skipgram_loss_is_stable_for_huge_scores():
    center = np.array([[100.0, 0.0]], dtype=np.float32)
    context = np.array([[-100.0, 0.0], [100.0, 0.0]], dtype=np.float32)
    loss, cg, og = skipgram_batch(center, context, np.array([0]), np.array([[0, 1]]))
    assert loss == pytest.approx(2e4, rel=1e-6)  # two terms of log(1 + e^10000) = 10000
    assert np.isfinite(cg.values).all() and np.isfinite(og.values).all()


# --- train_skipgram ---------------------------------------------------------------------------


def _small_tokens():
    words = "the cat sat on the mat while the dog lay on the log and the bird sang".split()
    rng = np.random.default_rng(0)
    return [words[i] for i in rng.integers(0, len(words), 3000)]


def test_train_skipgram_is_deterministic_and_reports_progress_per_epoch():
    tokens = _small_tokens()
    calls = []
    kw = dict(epochs=2, dim=8, batch_size=128, min_count=1, seed=5)
    first = train_skipgram(tokens, progress=calls.append, **kw)
    second = train_skipgram(tokens, **kw)
    assert first.losses == second.losses
    np.testing.assert_array_equal(first.embeddings, second.embeddings)
    ends = [p for p in calls if p.batch == p.batches]
    assert [p.epoch for p in ends] == [1, 2]
    assert [p.loss for p in ends] == pytest.approx(first.losses)
    assert [p.pairs for p in ends] == first.pairs_per_epoch
    assert first.iterations == sum(p.batches for p in ends)
    assert first.embeddings.dtype == first.context_embeddings.dtype == np.float32
    assert first.embeddings.shape == (len(first.vocab), 8)


def test_train_skipgram_rejects_a_corpus_without_two_frequent_words():
    with pytest.raises(ValueError, match="at least 2"):
        train_skipgram(["one", "two", "three"], min_count=2)


# --- the command line -------------------------------------------------------------------------


@pytest.mark.slow
def test_demo_via_main_trains_and_writes_npz(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["demo", *SMALL, "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "loss        fell" in stdout
    assert "nearest neighbours" in stdout
    assert "tokens/s" in stdout

    with np.load(out / "embeddings.npz") as data:
        vocab = data["vocab"]
        losses = data["losses"]
        assert data["embeddings"].shape == (len(vocab), 16)
        assert data["context_embeddings"].shape == (len(vocab), 16)
        assert data["embeddings"].dtype == np.float32
        assert data["counts"].shape == (len(vocab),)
        assert np.all(np.diff(data["counts"]) <= 0)
    assert vocab.dtype.kind == "U" and len(vocab) > 10
    assert losses.shape == (3,)
    assert losses[-1] < losses[0]
    if HAS_MATPLOTLIB:
        assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not (out / "loss.png").exists()
        assert "matplotlib is not installed" in stdout


@pytest.mark.parametrize("name, lazy, detail", [
    ("Adam", False, "a row absent from a batch keeps moving (slots that carry its earlier "
                    "gradients); its slots change"),
    ("Adagrad", True, "the other rows and their slots stay as they are"),
    ("SGD", False, "a row absent from a batch does not move"),  # momentum 0: nothing carries
    # the accumulators decay, the step is a multiple of the zero gradient
    ("Adadelta", False, "a row absent from a batch does not move; its slots change"),
    # the demo's Ftrl is Keras 2's sparse apply (tf_keras' densifies and zeroes every row)
    ("Ftrl", True, "the other rows and their slots stay as they are"),
])
def test_demo_optimizer_trains_and_says_how_it_updates_rows(name, lazy, detail, capsys):
    assert main(["demo", *SMALL, "--optimizer", name, "--no-compare", "--words", "the"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"refopt demo: word2vec skip-gram with negative sampling, {name} ")
    shown = f"{name} (keras2)" if name == "Ftrl" else name
    expected = f"sparse      {shown} is lazy here" if lazy else f"sparse      {shown} is not lazy"
    assert expected in out and detail in out
    assert "loss        fell" in out and f" {name} steps)" in out


def test_demo_backend_cuda_exits_2_with_one_line_message(capsys):
    assert main(["demo", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refopt demo: error: --backend cuda: the demo trains host") and \
        err.count("\n") == 1


def test_demo_unknown_optimizer_exits_2_naming_the_choices(capsys):
    assert main(["demo", "--optimizer", "RMSprop"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'RMSprop'" in err and "'Adagrad'" in err


@pytest.mark.slow
@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed")
def test_demo_writes_loss_png_with_matplotlib(tmp_path):
    assert main(["demo", *SMALL, "--epochs", "2", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "loss.png").stat().st_size > 1000


def _run_module(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "refopt", *args],
        capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=120,
    )


@pytest.mark.slow
def test_python_dash_m_refopt_demo_runs_and_loss_falls():
    proc = _run_module("demo", *SMALL)
    assert proc.returncode == 0, proc.stderr
    losses = [float(line.split("loss")[1].split()[0])
              for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(losses) == 3
    assert losses[-1] < losses[0]
    assert "Traceback" not in proc.stderr


def test_python_dash_m_refopt_without_command_prints_help_and_exits_0():
    proc = _run_module()
    assert proc.returncode == 0
    assert "usage: refopt" in proc.stdout and "demo" in proc.stdout


@pytest.mark.slow
def test_demo_trains_on_a_corpus_file(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(" ".join(_small_tokens()) + "\n", encoding="utf-8")
    assert main(["demo", "--corpus", str(corpus), "--epochs", "2", "--dim", "8",
                 "--batch-size", "128", "--words", "cat,dog,zebra", "--quiet"]) == 0
    stdout = capsys.readouterr().out
    assert str(corpus) in stdout
    assert "tokens      3,000" in stdout
    assert "zebra  (not in the vocabulary)" in stdout
    assert "\n  cat  " in stdout


def test_demo_with_missing_corpus_exits_2_with_one_line_message(tmp_path, capsys):
    missing = tmp_path / "no-such-file.txt"
    assert main(["demo", "--corpus", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"refopt demo: error: corpus file not found: {missing}\n"


def test_demo_with_non_utf8_corpus_exits_2(tmp_path, capsys):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes("caf\u00e9 cr\u00e8me".encode("latin-1"))
    assert main(["demo", "--corpus", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("refopt demo: error: corpus file is not UTF-8 text") and err.count("\n") == 1


def test_demo_with_too_small_corpus_exits_2(tmp_path, capsys):
    corpus = tmp_path / "tiny.txt"
    corpus.write_text("one two three", encoding="utf-8")
    assert main(["demo", "--corpus", str(corpus)]) == 2
    assert "corpus too small" in capsys.readouterr().err


def test_demo_with_unknown_backend_exits_2_with_one_line_message(capsys):
    assert main(["demo", "--backend", "no-such-backend", "--max-tokens", "1000"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("refopt demo: error: --backend no-such-backend: ")
    assert captured.err.count("\n") == 1
    assert "Traceback" not in captured.err
    assert "epoch" not in captured.out  # nothing was trained


def test_python_dash_m_refopt_demo_with_unknown_backend_exits_2_without_traceback():
    proc = _run_module("demo", "--backend", "no-such-backend", "--max-tokens", "1000")
    assert proc.returncode == 2
    assert proc.stderr.startswith("refopt demo: error: --backend no-such-backend: ")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("option", [["--epochs", "0"], ["--dim", "x"], ["--learning-rate", "-1"]])
def test_demo_with_invalid_option_value_exits_2(option, capsys):
    assert main(["demo", *option]) == 2
    assert "refopt demo: error: argument" in capsys.readouterr().err


def test_main_without_command_returns_0_and_prints_help(capsys):
    assert main([]) == 0
    assert "usage: refopt" in capsys.readouterr().out


def test_main_help_returns_0(capsys):
    assert main(["demo", "--help"]) == 0
    assert "--backend" in capsys.readouterr().out


def test_demo_with_one_epoch_reports_the_loss_without_a_trend(capsys):
    assert main(["demo", "--max-tokens", "3000", "--epochs", "1", "--dim", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "after one epoch" in out and "did NOT fall" not in out


def test_demo_refuses_an_output_path_that_is_a_directory_before_training(tmp_path, capsys):
    (tmp_path / "embeddings.npz").mkdir()
    assert main(["demo", "--max-tokens", "3000", "--epochs", "1", "--out", str(tmp_path), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert "is a directory" in captured.err and "epoch" not in captured.out


def test_demo_names_the_learning_rate_option_when_it_is_refused(capsys):
    assert main(["demo", "--max-tokens", "3000", "--learning-rate", "1e39", "--quiet"]) == 2
    assert "--learning-rate" in capsys.readouterr().err


def test_demo_defaults_to_cpu_and_reports_the_speedup_over_the_reference(capsys):
    assert main(["demo", "--max-tokens", "3000", "--epochs", "2", "--dim", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "(backend 'cpu')" in out
    line = next(l for l in out.splitlines() if l.startswith("optimizer"))
    assert "x faster" in line and line.endswith("results bit-identical")


def test_demo_on_the_reference_backend_does_not_compare(capsys):
    args = ["demo", "--max-tokens", "3000", "--epochs", "2", "--dim", "8", "--quiet"]
    assert main(args + ["--backend", "reference"]) == 0
    assert "optimizer   one LazyAdam step" not in capsys.readouterr().out


def test_cpu_and_reference_training_give_identical_embeddings():
    from refopt.demo import train_skipgram, tokenize, load_corpus

    tokens = tokenize(load_corpus()[0])[:3000]
    a = train_skipgram(tokens, epochs=2, dim=8, backend="cpu")
    b = train_skipgram(tokens, epochs=2, dim=8, backend="reference")
    assert np.array_equal(a.embeddings, b.embeddings) and a.losses == b.losses


def test_sparse_update_line_for_tf_keras_ftrl_says_untouched_rows_move_once():
    # tf_keras' Ftrl densifies an IndexedSlices gradient and recomputes every weight from its
    # linear term: a row no batch has touched is set on the first step (to 0), then stays.
    from refopt.demo import sparse_update

    import refopt

    line = sparse_update(refopt.Ftrl(learning_rate=0.1))
    assert line.startswith("Ftrl is not lazy here") and \
        "a row no batch has touched yet moves on the first step only" in line


def test_a_closed_pipe_ends_quietly():
    # `refopt conformance --list | head -1`: the reader leaves early; no BrokenPipeError traceback.
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "refopt", "conformance", "--list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) in (0, 141)
    assert first.strip() and "Traceback" not in err and "BrokenPipe" not in err
