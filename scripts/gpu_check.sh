#!/usr/bin/env bash
# The prepared GPU check of backend="cuda" (issue #4). Needs an NVIDIA GPU and a driver; run
# from the repository root. Installs the package, runs the CUDA tests on the device (not the
# simulator), then benchmarks (benchmarks/bench_cuda.py). Budget: about 5 minutes.
# NOT RUN YET on a device: written on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python -m pip install -q ".[test,cuda]"
export NUMBA_ENABLE_CUDASIM=0
python -c "from numba import cuda; assert cuda.is_available(), 'no usable CUDA GPU'; print(cuda.get_current_device().name)"
# The CUDA tests on the device (elementwise within a few ulp: NVVM may contract into FMA),
# then the tests that need a real device.
timeout 150 python -m pytest -q tests/test_cuda_optimizers.py
timeout 60 python -m pytest -q -m gpu tests/test_cuda_optimizers.py
timeout 120 python benchmarks/bench_cuda.py --elements 1e8 --repeats 20
