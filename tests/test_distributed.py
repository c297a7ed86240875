import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import refopt
from refopt.demo import (
    load_corpus,
    make_optimizer,
    micro_batch_bounds,
    skipgram_batch,
    tokenize,
    train_skipgram,
    train_skipgram_sharded,
)
from refopt.distributed import SelfComm, ShardedEmbedding, ShardedOptimizer
from refopt.distributed.norms import combine_parts, local_parts
from refopt.distributed.zero import ALIGN, tensor_owners

SCRIPTS = Path(__file__).parent / "mpi_scripts"
MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the mpich wheel's, in the venv
TIMEOUT = 120  # seconds per mpiexec run: a hang fails the test instead of stalling CI


def mpiexec(n, argv, timeout=TIMEOUT):
    pytest.importorskip("mpi4py")
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to {sys.executable} (pip install 'refopt[mpi]')")
    # -launcher fork: local processes only, no ssh
    cmd = [str(MPIEXEC), "-launcher", "fork", "-n", str(n), *map(str, argv)]
    return subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONHASHSEED": "0"})


def mpirun(n, script, *args, returncode=0, timeout=TIMEOUT):
    # -m mpi4py: an exception on one rank aborts all of them (non-zero exit) instead of
    # leaving the others waiting
    proc = mpiexec(n, [sys.executable, "-m", "mpi4py", SCRIPTS / script, *args],
                   timeout=timeout)
    if returncode == 0:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        assert proc.returncode != 0, proc.stdout[-3000:]
    # the last JSON line (mpiexec reports a killed rank on stdout after it)
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_zero_exact_matches_one_process_bit_for_bit(ranks):
    out = mpirun(ranks, "zero_trajectories.py")
    assert out["ranks"] == ranks and len(out["cases"]) == 24
    n_elements = 91 + 300 + 5 + 1 + 24 + 700
    layouts = [c["layout"] for c in out["cases"]]
    # torch's norms, Lamb, Adafactor, RowWiseAdagrad: whole tensors; TF1's proximal ops: slices
    assert layouts == ["slice"] * 13 + ["tensor"] * 9 + ["slice"] * 2
    for case in out["cases"]:
        single, per_rank = case["single_bytes"], case["state_bytes"]
        assert sum(per_rank) == single, case
        if case["layout"] == "slice":
            # each rank owns 1/R of the elements, give or take an aligned boundary per dtype
            slack = 2 * (ALIGN + 1) * single / n_elements
            assert max(per_rank) <= single / ranks + slack, case
        elif ranks > 1:  # whole tensors: the largest (700 elements) alone on one rank
            assert max(per_rank) < single and sorted(per_rank)[-2] > 0, case


def test_zero_exact_on_the_cpu_backend():
    args = ("zero_trajectories.py", "--backend", "cpu", "--cases", "Adam,AdamW,Lamb,Adafactor")
    # One rank first compiles the kernels into the shared on-disk cache (on a fresh machine
    # three ranks compiling the same kernels at once on two busy cores take minutes), then
    # the three ranks load them.
    mpirun(1, *args, timeout=600)
    out = mpirun(3, *args)
    assert [c["case"] for c in out["cases"]] == [
        "Adam/tf_keras", "AdamW/torch", "AdamW/torch", "Lamb/keras3", "Lamb/optax",
        "Adafactor/tf_keras", "Adafactor/keras3", "Adafactor/torch", "Adafactor/optax"]


@pytest.mark.parametrize("ranks", [4])
def test_zero_fast_mode_sums_per_rank_then_in_rank_order(ranks):
    out = mpirun(ranks, "zero_trajectories.py", "--mode", "fast", "--cases",
                 "Adam,RMSprop,Lamb")
    assert len(out["cases"]) == 4


@pytest.mark.parametrize("ranks", [3, 4])
def test_row_sharded_embedding_matches_one_process(ranks):
    out = mpirun(ranks, "embedding_trajectories.py")
    # every lazy optimizer, RowWiseAdagrad's per-row accumulator (V,) included
    assert [c["case"].split("/")[0] for c in out["cases"]] == [
        "LazyAdam", "LazyAdam", "LazyAdam", "Adagrad", "Adagrad", "RowWiseAdagrad",
        "RowWiseAdagrad", "Ftrl", "Adadelta", "Adamax", "SGD", "ProximalAdagrad",
        "ProximalGradientDescent"]
    for case in out["cases"]:
        assert sum(case["local_rows"]) == 53
        assert max(case["local_rows"]) == -(-53 // ranks)


def test_faults_killed_rank_and_checkpoints_resharded_or_refused(tmp_path):
    # one run: a refused step (bad input on rank 2), a checkpoint at step 2, then rank 1
    # killed (SIGKILL) inside the third step while the others wait in the exchange
    good = tmp_path / "step2"
    start = time.monotonic()
    out = mpirun(3, "zero_faults_checkpoints.py", "--faults", "--save", good, "--kill-rank",
                 1, returncode="non-zero")
    # mpiexec notices the dead rank and ends the others: well within the run's timeout
    assert time.monotonic() - start < TIMEOUT / 2
    assert out["message"].startswith("rank 2: ValueError: micro_grads[3][2] must have")
    assert "shape=(6,)" in out["message"]
    assert sorted(p.name for p in good.iterdir()) == [
        "manifest.json", "shard-00000-of-00003.npz", "shard-00001-of-00003.npz",
        "shard-00002-of-00003.npz"]

    truncated = tmp_path / "truncated"
    shutil.copytree(good, truncated)
    shard = truncated / "shard-00001-of-00003.npz"
    shard.write_bytes(shard.read_bytes()[:1000])

    missing = tmp_path / "missing"
    shutil.copytree(good, missing)
    (missing / "shard-00002-of-00003.npz").unlink()
    no_manifest = tmp_path / "no_manifest"
    shutil.copytree(good, no_manifest)
    (no_manifest / "manifest.json").unlink()
    manifest = json.loads((good / "manifest.json").read_text())
    tensor = json.loads((Path(f"{good}-tensor") / "manifest.json").read_text())

    def altered(name, change, base=good, man=manifest):
        path = tmp_path / name
        shutil.copytree(base, path)
        m = json.loads(json.dumps(man))
        m = change(m) or m
        (path / "manifest.json").write_text(json.dumps(m))
        return path

    def swap(items, a=0, b=1):
        items[a], items[b] = items[b], items[a]

    def permute(m):  # the variables' order in a group with their shapes: a consistent lie
        g = m["groups"][0]
        for key in ("positions", "shapes", "sizes"):
            swap(g[key], 1, 2)

    damaged = [
        altered("reordered", lambda m: swap(m["shards"])),
        altered("permuted", permute),
        altered("permuted_tensor", permute, Path(f"{good}-tensor"), tensor),
        altered("bounds", lambda m: m["groups"][0]["bounds"].__setitem__(1, 64)),
        altered("groups_null", lambda m: m.__setitem__("groups", None)),
        altered("a_list", lambda m: [m]),
        altered("not_json", lambda m: None),
        altered("iterations_str", lambda m: m.__setitem__("iterations", "x")),
    ]
    (damaged[-2] / "manifest.json").write_text("{not json")
    # the last complete checkpoint, resumed on 4 ranks: the four steps of one process;
    # each damaged copy refused on every rank (the same message), nothing changed; then the
    # settings checks and edge cases (the "checks" entry)
    out = mpirun(4, "zero_faults_checkpoints.py", "--checks", "--resume", good,
                 "--expect-load-error", truncated, missing, no_manifest, *damaged)
    assert out["resumed"]
    cut, gone, none, *bad = out["load_errors"]
    assert cut.startswith("ShardedCheckpointError")
    assert "'shard-00001-of-00003.npz'" in cut and "truncated" in cut
    assert gone.startswith("FileNotFoundError") and "'shard-00002-of-00003.npz'" in gone
    assert none.startswith("FileNotFoundError") and "No manifest.json" in none
    for x in bad:  # a ValueError subclass, the same on every rank
        assert x.startswith("ShardedCheckpointError: rank 0: ShardedCheckpointError: "), x
        assert x.endswith("(ranks [0, 1, 2, 3] failed; the first is shown)"), x
    order, perm, perm_tensor, bounds, null, listed, not_json, iterations = bad
    assert "lists 'shard-00001-of-00003.npz' as shard 0 of 3" in order
    assert "entries permuted" in perm and "entries permuted" in perm_tensor
    assert "'shard-00000-of-00003.npz'" in bounds and "array 'g0_param' is of shape" in bounds
    assert "malformed 'groups'" in null and "groups=None" in null
    assert "must hold a JSON object. Received: list" in listed
    assert "is not valid JSON" in not_json
    assert "malformed 'iterations'" in iterations and "iterations='x'" in iterations
    checks = out["checks"]
    for key, what in [("mode", "mode (ranks [0, 1, 2]: exact; ranks [3]: fast)"),
                      ("clip", "config['global_clipnorm'] (ranks [0, 1, 2]: null; ranks [3]: 1.0)"),
                      ("lr", "config['learning_rate'] (ranks [0, 1, 2]: 0.00999"),
                      ("iterations", "iterations (ranks [0, 1, 2]: 0; ranks [3]: 5)"),
                      ("exclusion", "weight-decay exclusions (positions) (ranks [0, 1, 2]: [0]"),
                      ("values", "variables' values (CRC-32 of each)"),
                      ("reduction", "reduction (ranks [0, 1, 2]: sum; ranks [3]: mean)"),
                      ("step lr", "step settings differ between ranks: learning rate"),
                      ("step config", "build a new ShardedOptimizer for others): beta_1: 0.9 -> 0.5"),
                      ("table", "ShardedEmbedding's settings differ between ranks: table"),
                      ("embedding step lr", "learning rate now (ranks [0, 1, 2]: 0.00999")]:
        assert checks[key].startswith("ValueError: ") and what in checks[key], (key, checks)
    assert "ShardedEmbedding's step settings" in checks["embedding step lr"]
    assert checks["edge"] == [True, True, True]
    assert checks["empty"] and checks["schedule"] and checks["lr changed"]


# The demo on a small corpus: 200-pair batches cut into 4 micro-batches (uneven ones at the
# end of an epoch), the default LazyAdam on the default cpu backend.
DEMO = ["--max-tokens", "2500", "--epochs", "2", "--dim", "8", "--batch-size", "200",
        "--min-count", "3", "--seed", "1", "--quiet", "--no-compare", "--words", "the"]


def _losses(stdout):
    return [line.split()[3] for line in stdout.splitlines() if line.startswith("epoch ")]


def test_demo_distributed_prints_and_writes_the_single_process_bits(tmp_path, capsys):
    from refopt.cli import main

    assert main(["demo", *DEMO, "--out", str(tmp_path / "one")]) == 0
    single = capsys.readouterr().out
    script = Path(sys.executable).parent / "refopt"  # what `mpiexec -n 2 refopt demo` runs
    command = [script] if script.exists() else [sys.executable, "-m", "refopt"]
    proc = mpiexec(2, [*command, "demo", "--distributed", "--micro-batches", "4", *DEMO,
                       "--out", tmp_path / "two"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "distributed 2 rank(s) (mpi), 4 micro-batches per batch" in proc.stdout
    assert proc.stdout.count("refopt demo:") == 1  # rank 0 reports
    assert len(_losses(single)) == 2 and _losses(proc.stdout) == _losses(single)
    loss_line = [x for x in single.splitlines() if x.startswith("loss ")]
    assert loss_line == [x for x in proc.stdout.splitlines() if x.startswith("loss ")]
    with np.load(tmp_path / "one" / "embeddings.npz") as a, \
            np.load(tmp_path / "two" / "embeddings.npz") as b:
        assert a.files == b.files
        for key in a.files:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key
    # a usage error, the same on every rank, is printed by rank 0 only
    proc = mpiexec(2, [*command, "demo", "--distributed", "--micro-batches", "3", *DEMO])
    assert proc.returncode == 2
    assert proc.stderr.count("refopt demo: error: --micro-batches 3: must be a multiple") == 1


# --------------------------------------------------------------------- in one process
def test_demo_as_micro_batches_is_the_demo_bit_for_bit():
    tokens = tokenize(load_corpus()[0])[:2000]
    kwargs = {"epochs": 2, "dim": 8, "batch_size": 100, "min_count": 3, "seed": 2}
    single = train_skipgram(tokens, optimizer=make_optimizer(None, "reference"), **kwargs)
    # 7 micro-batches of a 100-pair batch: 14 or 15 pairs each, the last batch smaller
    sharded = train_skipgram_sharded(tokens, micro_batches=7, comm=SelfComm(),
                                     optimizer=make_optimizer(None, "reference"), **kwargs)
    assert [x.hex() for x in sharded.losses] == [x.hex() for x in single.losses]
    assert sharded.embeddings.tobytes() == single.embeddings.tobytes()
    assert sharded.context_embeddings.tobytes() == single.context_embeddings.tobytes()
    assert sharded.iterations == single.iterations > 0


def test_micro_batch_gradients_are_rows_of_the_batch_gradient():
    rng = np.random.default_rng(0)
    center, context = rng.standard_normal((2, 30, 6)).astype(np.float32)
    centers, targets = rng.integers(0, 30, 37), rng.integers(0, 30, (37, 4))
    loss, g_in, g_out = skipgram_batch(center, context, centers, targets)
    cut = micro_batch_bounds(37, 5)
    assert cut == [0, 7, 14, 22, 29, 37]
    from refopt.demo import _sgns_rows

    parts = [_sgns_rows(center[centers[a:b]], context[targets[a:b]], 37)
             for a, b in itertools.pairwise(cut)]
    assert np.concatenate([p[1] for p in parts]).tobytes() == g_in.values.tobytes()
    assert np.concatenate([p[2] for p in parts]).tobytes() == g_out.values.tobytes()
    terms = np.concatenate([p[0] for p in parts])
    assert float(terms.sum(dtype=np.float64) / 37) == loss


def _vars():
    return [np.ones((3, 4), np.float32), np.ones(5, np.float32)]


def test_norm_parts_give_numpys_sum_for_any_split():
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 128, 129, 1000, 4099):
        for dtype in (np.float32, np.float64):
            terms = (rng.standard_normal(n) * 10) ** 2
            terms = terms.astype(dtype)
            for ranks in (1, 2, 3, 5):
                cuts = [0, *sorted(rng.integers(0, n + 1, ranks - 1).tolist()), n]
                parts = [local_parts(terms[a:b], a, n) for a, b in itertools.pairwise(cuts)]
                got = combine_parts(parts, n, dtype)
                assert got.tobytes() == np.sum(terms, dtype=dtype).tobytes(), (n, cuts)


def test_self_comm_runs_the_single_process_step():
    ref_vars, dist_vars = _vars(), _vars()
    single = refopt.Adam(learning_rate=0.1, global_clipnorm=0.5, backend="reference")
    dist = ShardedOptimizer(refopt.Adam(learning_rate=0.1, global_clipnorm=0.5,
                                        backend="reference"),
                            dist_vars, micro_batches=2, comm=SelfComm())
    g0 = [np.full((3, 4), 0.3, np.float32), np.full(5, -1.0, np.float32)]
    g1 = [np.full((3, 4), 0.7, np.float32), np.full(5, 2.0, np.float32)]
    single.apply_gradients(zip([a + b for a, b in zip(g0, g1)], ref_vars))
    assert dist.apply_gradients([g0, g1]) == 1
    for a, b in zip(ref_vars, dist_vars):
        np.testing.assert_array_equal(a, b)


class _MyAdam(refopt.Adam):
    pass


# a subclass of the user's own that happens to be called Adam: refused as well
Adam = type("Adam", (refopt.Adam,), {})


@pytest.mark.parametrize("opt, variables, error, match", [
    (lambda: _MyAdam(), _vars, TypeError, "_MyAdam is not sharded"),
    (lambda: Adam(), _vars, TypeError, r"TypeError: test_distributed\.Adam is not sharded"),
    (lambda: refopt.Adam(clipnorm=1.0), lambda: [np.ones(3, np.float16)],
     NotImplementedError, "float16"),
])
def test_refused_optimizers(opt, variables, error, match):
    with pytest.raises(error, match=match):
        ShardedOptimizer(opt(), variables(), micro_batches=1, comm=SelfComm())


def test_tensor_owners_balance_greedily_and_deterministically():
    # largest first to the least loaded rank, ties to the lower position and rank
    # 100 -> r0; 60 -> r1; 40 (pos 0) -> r1 (100 each); 40 (pos 2) -> r0 (tie); 30, 30 -> r1
    assert tensor_owners([40, 100, 40, 30, 30, 60], 2) == [1, 0, 0, 1, 1, 1]
    assert tensor_owners([8, 8, 8], 4) == [0, 1, 2]
    assert tensor_owners([5, 7], 1) == [0, 0]


def test_lamb_and_adafactor_shard_whole_tensors_with_their_slot_shapes():
    v = [np.ones((4, 6), np.float32), np.ones(3, np.float32)]
    dist = ShardedOptimizer(refopt.Adafactor(convention="keras3", backend="reference"), v,
                            micro_batches=1, comm=SelfComm())
    assert dist.layout == "tensor"
    dist.apply_gradients([[np.full((4, 6), 0.5, np.float32), np.full(3, 0.5, np.float32)]])
    rows = dist.gather_slot("velocity_row")
    assert rows[0].shape == (4,) and rows[1].shape == ()  # a 0-d placeholder for 1-d
    assert ShardedOptimizer(refopt.Adam(clipnorm=1.0, convention="torch"), _vars(),
                            micro_batches=1, comm=SelfComm()).layout == "tensor"
    assert ShardedOptimizer(refopt.Adam(), _vars(), micro_batches=1,
                            comm=SelfComm()).layout == "slice"


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="mode"):
        ShardedOptimizer(refopt.Adam(), _vars(), micro_batches=1, mode="quick", comm=SelfComm())
    with pytest.raises(ValueError, match="micro_batches=0"):
        ShardedOptimizer(refopt.Adam(), _vars(), micro_batches=0, comm=SelfComm())
    v = _vars()
    dist = ShardedOptimizer(refopt.Adam(backend="reference"), v, micro_batches=1,
                            comm=SelfComm())
    with pytest.raises(TypeError, match=r"micro_grads\[0\]\[1\] must be a dense"):
        dist.apply_gradients([[np.zeros((3, 4), np.float32), None]])
    assert dist.iterations == 0 and np.all(v[0] == 1)


def test_embedding_refuses_a_non_lazy_optimizer_and_bad_rows():
    table = np.zeros((6, 2), np.float32)
    with pytest.raises(TypeError, match="lazy optimizer"):
        ShardedEmbedding(refopt.Adam(), table, micro_batches=1, comm=SelfComm())
    with pytest.raises(TypeError, match=r"TypeError: test_distributed\.LazyAdam is not sharded"):
        ShardedEmbedding(type("LazyAdam", (refopt.LazyAdam,), {})(), table, micro_batches=1,
                         comm=SelfComm())
    # a sparse step the configuration refuses: at construction (a trial step), not mid-step
    with pytest.raises(TypeError, match="weight_decay is not compatible with sparse"):
        ShardedEmbedding(refopt.Adagrad(weight_decay=0.01, convention="torch",
                                        backend="reference"), table, micro_batches=1,
                         comm=SelfComm())
    emb = ShardedEmbedding(refopt.LazyAdam(backend="reference"), table, micro_batches=1,
                           comm=SelfComm())
    with pytest.raises(ValueError, match=r"must lie in \[0, 6\)"):
        emb.lookup(np.array([0, 6]))
    bad = refopt.IndexedSlices(np.ones((1, 2), np.float32), np.array([6]), (7, 2))
    with pytest.raises(ValueError, match=r"dense_shape=\(6, 2\)"):
        emb.apply_gradients([bad])
    assert emb.iterations == 0


def test_save_errors_keep_their_os_error_type(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    dist = ShardedOptimizer(refopt.Adam(backend="reference"), _vars(), micro_batches=1,
                            comm=SelfComm())
    with pytest.raises(OSError, match="rank 0: (FileExistsError|NotADirectoryError)"):
        dist.save(blocker / "checkpoint")
