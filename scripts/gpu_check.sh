#!/usr/bin/env bash
# The prepared GPU check of backend="cuda" (issue #4). Needs an NVIDIA GPU and a driver; run
# from the repository root. Budget: 7 minutes in all (the step timeouts below add up to 400 s;
# kernels compile on first use: the rule-built ones, one per rule, flag set and dtype, take
# about a second each). Run it with the device tool's timeout_s=540.
# NOT RUN YET on a device: written on a machine without a GPU.
#
# Offline: the lent GPU machines reach no package registry, so nothing is installed. The
# image's python3 must already have numpy, numba, numba-cuda, scipy, tqdm, pytest and
# hypothesis (the workplace's 'cuda' image has them); refopt runs from the checkout through
# PYTHONPATH. Step 1 says which import is missing, if one is.
#
# 1. imports, the device, and one tiny float32 and float16 Adam step compiled and run on it
#    against the reference (the whole toolchain: NVVM, NVRTC for cuda_fp16, the driver);
# 2. the PTX audit (no FMA, no approximations, 4 KiB params): of what a launch compiles on
#    this device (after link-time optimisation), then of compile_ptx for its capability;
# 3. the CUDA tests on the device, not the simulator: elementwise results bit for bit against
#    the reference (every multiply/add is an explicitly rounded libdevice operation, see
#    refopt/rules/ops.py), with fewer Hypothesis examples (REFOPT_CUDA_EXAMPLES),
#    then the tests marked gpu (24 tensors in one launch, torch arrays, repeatable norms);
# 4. benchmarks/bench_cuda.py (dense Adam on 1e8 float32 against a same-run device copy and
#    torch fused Adam, 500 small tensors, lazy Adam on a 4e6 x 64 table).
# Every step runs even if an earlier one failed (the figures are worth having); each step's
# full output also goes to $OUT/gpu_check_step*.log ($OUT: the folder the device tool brings
# back; /tmp/gpu_check otherwise); the summary at the end lists each step's exit status and
# time, and the script exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_ENABLE_CUDASIM=0
export PYTHONUNBUFFERED=1                    # a step killed by its timeout keeps its output
export NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS=0   # tiny test launches would warn on every call
export REFOPT_CUDA_EXAMPLES="${REFOPT_CUDA_EXAMPLES:-20}"
if [ -z "${CUDA_HOME:-}" ] && [ -d /usr/local/cuda/nvvm ]; then
    export CUDA_HOME=/usr/local/cuda         # where numba-cuda finds libNVVM if no wheel has it
fi
LOGDIR="${OUT:-/tmp/gpu_check}"
mkdir -p "$LOGDIR"
PY="${PYTHON:-python3}"
declare -a SUMMARY=()
FAILED=0
step() {  # step N NAME TIMEOUT_S COMMAND...
    local n=$1 name=$2 limit=$3
    shift 3
    echo "=== $n $name (timeout ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$LOGDIR/gpu_check_step$n.log"
    local rc=${PIPESTATUS[0]}
    SUMMARY+=("$n $name: rc=$rc in $((SECONDS - t0)) s")
    [ "$rc" -eq 0 ] || FAILED=1
    return 0
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
step 1 "imports, device, one tiny step" 45 "$PY" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("numpy", "numba", "numba_cuda", "scipy", "tqdm", "pytest", "hypothesis")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing on this machine: {missing} (carry them as wheels)")
import numba, numba_cuda, numpy as np
from numba import cuda
assert cuda.is_available(), "no usable CUDA GPU"
dev = cuda.get_current_device()
print(f"python {sys.version.split()[0]}, numpy {np.__version__}, numba {numba.__version__}, "
      f"numba-cuda {getattr(numba_cuda, '__version__', '?')}; device {getattr(dev, 'name', dev)} "
      f"cc {dev.compute_capability}")
from refopt import reference as R
from refopt.kernels import cuda as kc
for dt in (np.float32, np.float16):
    rng = np.random.default_rng(0)
    p, g, m = (rng.standard_normal(1000).astype(dt) for _ in range(3))
    v = np.abs(rng.standard_normal(1000)).astype(dt)
    hp = dict(learning_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-7, step=3)
    got, want = kc.adam_update(p, g, m, v, v, **hp), R.adam_update(p, g, m, v, v, **hp)
    same = all(np.array_equal(a, b) for a, b in zip(got, want))
    print(f"{np.dtype(dt).name} Adam step on the device, bit-identical to the reference: {same}")
    assert same
EOF
CC=$("$PY" -c "from numba import cuda; print('%d.%d' % cuda.get_current_device().compute_capability)" 2>/dev/null || echo 9.0)
step 2a "PTX audit of what a launch compiles (after LTO)" 60 "$PY" -m refopt.kernels.cuda.ptx --device
step 2b "PTX audit, compile_ptx (cc $CC)" 90 "$PY" -m refopt.kernels.cuda.ptx --cc "$CC" --jobs 8
step 3a "CUDA tests on the device" 150 "$PY" -m pytest -q -p no:cacheprovider --maxfail=10 \
    -rfE --tb=short -m "not gpu" tests/test_cuda_optimizers.py tests/test_cuda_properties.py \
    tests/test_cuda_conventions.py
step 3b "tests marked gpu" 40 "$PY" -m pytest -q -p no:cacheprovider -rfE --tb=short -m gpu \
    tests/test_cuda_optimizers.py
step 4 "benchmarks" 60 "$PY" benchmarks/bench_cuda.py --elements 1e8 --repeats 20
echo "=== summary (logs in $LOGDIR)"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
