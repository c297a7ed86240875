#!/usr/bin/env bash
# The prepared GPU check of backend="cuda" (issue #4). Needs an NVIDIA GPU and a driver; run
# from the repository root. Budget: 5 minutes in all (the step timeouts below add up to 300 s;
# kernels compile on first use, well under a second each).
# NOT RUN YET on a device: written on a machine without a GPU.
#
# Offline: the lent GPU machines reach no package registry, so nothing is installed. The
# image's python3 must already have numpy, numba, numba-cuda, scipy, tqdm, pytest and
# hypothesis (the workplace's 'cuda' image has them); refopt runs from the checkout through
# PYTHONPATH. Step 1 says which import is missing, if one is.
#
# 1. imports and the device;  2. the PTX audit (no FMA, no approximations, 4 KiB params)
# for the device's own compute capability;  3. the CUDA tests on the device, not the
# simulator: elementwise results bit for bit against the reference (every multiply/add is an
# explicitly rounded libdevice operation, see refopt/kernels/cuda/_kernels.py), then the
# tests marked gpu (24 tensors in one launch, torch/CuPy arrays, repeatable norms);
# 4. benchmarks/bench_cuda.py (dense Adam on 1e8 float32 against a same-run copy kernel and
# torch fused Adam, 500 small tensors, lazy Adam on a 4e6 x 64 table).
# Every step runs even if an earlier one failed (the figures are worth having); the summary
# at the end lists each step's exit status, and the script exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NUMBA_ENABLE_CUDASIM=0
PY="${PYTHON:-python3}"
declare -a SUMMARY=()
FAILED=0
step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "=== $name (timeout ${limit}s)"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    SUMMARY+=("$name: rc=$rc in $((SECONDS - t0)) s")
    [ "$rc" -eq 0 ] || FAILED=1
    return 0
}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
step "1 imports and device" 30 "$PY" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("numpy", "numba", "numba_cuda", "scipy", "tqdm", "pytest", "hypothesis")
           if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing on this machine: {missing} (carry them as wheels)")
import numba, numba_cuda, numpy
from numba import cuda
assert cuda.is_available(), "no usable CUDA GPU"
dev = cuda.get_current_device()
print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}, numba {numba.__version__}, "
      f"numba-cuda {getattr(numba_cuda, '__version__', '?')}; device {dev.name} "
      f"cc {dev.compute_capability}")
EOF
CC=$("$PY" -c "from numba import cuda; print('%d.%d' % cuda.get_current_device().compute_capability)" 2>/dev/null || echo 9.0)
step "2 PTX audit (sm_${CC/./})" 30 "$PY" -m refopt.kernels.cuda.ptx --cc "$CC"
step "3a CUDA tests on the device" 150 "$PY" -m pytest -q -x -p no:cacheprovider -m "not gpu" \
    tests/test_cuda_optimizers.py tests/test_cuda_properties.py
step "3b tests marked gpu" 30 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_optimizers.py
step "4 benchmarks" 60 "$PY" benchmarks/bench_cuda.py --elements 1e8 --repeats 20
echo "=== summary"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
