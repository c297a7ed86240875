import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import refopt
from refopt.distributed import SelfComm, ShardedEmbedding, ShardedOptimizer
from refopt.distributed.norms import combine_parts, local_parts
from refopt.distributed.zero import ALIGN

SCRIPTS = Path(__file__).parent / "mpi_scripts"
MPIEXEC = Path(sys.executable).parent / "mpiexec"  # the mpich wheel's, in the venv
TIMEOUT = 120  # seconds per mpiexec run: a hang fails the test instead of stalling CI


def mpirun(n, script, *args):
    pytest.importorskip("mpi4py")
    if not MPIEXEC.exists():
        pytest.skip(f"no mpiexec next to {sys.executable} (pip install 'refopt[mpi]')")
    # -launcher fork: local processes only, no ssh; -m mpi4py: an exception on one rank
    # aborts all of them (non-zero exit) instead of leaving the others waiting
    cmd = [str(MPIEXEC), "-launcher", "fork", "-n", str(n), sys.executable, "-m", "mpi4py",
           str(SCRIPTS / script), *map(str, args)]
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=TIMEOUT,
                          env={**os.environ, "PYTHONHASHSEED": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_zero_exact_matches_one_process_bit_for_bit(ranks):
    out = mpirun(ranks, "zero_trajectories.py")
    assert out["ranks"] == ranks and len(out["cases"]) == 13
    n_elements = 91 + 300 + 5 + 1 + 24 + 700
    for case in out["cases"]:
        single, per_rank = case["single_bytes"], case["state_bytes"]
        assert sum(per_rank) == single, case
        # each rank owns 1/R of the elements, give or take an aligned boundary per dtype
        slack = 2 * (ALIGN + 1) * single / n_elements
        assert max(per_rank) <= single / ranks + slack, case


def test_zero_exact_on_the_cpu_backend():
    out = mpirun(3, "zero_trajectories.py", "--backend", "cpu", "--cases", "Adam,AdamW")
    assert [c["case"] for c in out["cases"]] == ["Adam/tf_keras", "AdamW/torch"]


@pytest.mark.parametrize("ranks", [4])
def test_zero_fast_mode_sums_per_rank_then_in_rank_order(ranks):
    out = mpirun(ranks, "zero_trajectories.py", "--mode", "fast", "--cases", "Adam,RMSprop")
    assert len(out["cases"]) == 2


@pytest.mark.parametrize("ranks", [3, 4])
def test_row_sharded_embedding_matches_one_process(ranks):
    out = mpirun(ranks, "embedding_trajectories.py")
    for case in out["cases"]:
        assert sum(case["local_rows"]) == 53
        assert max(case["local_rows"]) == -(-53 // ranks)


def test_faults_and_checkpoints_resharded_or_refused(tmp_path):
    # one run: a refused step (bad input on rank 2), then a checkpoint at step 2
    good = tmp_path / "step2"
    out = mpirun(3, "zero_faults_checkpoints.py", "--faults", "--save", good)
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
    # resumed on 4 ranks: the four steps of one process; each damaged copy refused
    out = mpirun(4, "zero_faults_checkpoints.py", "--resume", good, "--expect-load-error",
                 truncated, missing, no_manifest)
    assert out["resumed"]
    cut, gone, none = out["load_errors"]
    assert "'shard-00001-of-00003.npz'" in cut and "truncated" in cut
    assert gone.startswith("FileNotFoundError") and "'shard-00002-of-00003.npz'" in gone
    assert none.startswith("FileNotFoundError") and "No manifest.json" in none


# --------------------------------------------------------------------- in one process
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


@pytest.mark.parametrize("opt, error, match", [
    (lambda: refopt.Lamb(learning_rate=0.1), TypeError, "Lamb is not sharded"),
    (lambda: refopt.Adam(clipnorm=1.0, convention="torch"), NotImplementedError,
     "PyTorch's formula"),
])
def test_refused_optimizers(opt, error, match):
    with pytest.raises(error, match=match):
        ShardedOptimizer(opt(), _vars(), micro_batches=1, comm=SelfComm())


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
    emb = ShardedEmbedding(refopt.LazyAdam(backend="reference"), table, micro_batches=1,
                           comm=SelfComm())
    with pytest.raises(ValueError, match=r"must lie in \[0, 6\)"):
        emb.lookup(np.array([0, 6]))
    bad = refopt.IndexedSlices(np.ones((1, 2), np.float32), np.array([6]), (7, 2))
    with pytest.raises(ValueError, match=r"dense_shape=\(6, 2\)"):
        emb.apply_gradients([bad])
    assert emb.iterations == 0
