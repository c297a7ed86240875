#!/usr/bin/env bash
# The prepared GPU check of backend="cuda" (issue #4). Needs an NVIDIA GPU and a driver; run
# from the repository root. Installs the package, runs the CUDA tests on the device (not the
# simulator), then benchmarks (benchmarks/bench_cuda.py). Budget: about 5 minutes in all
# (the timeouts below add up to 5 minutes; kernels compile on first use, a few seconds each).
# NOT RUN YET on a device: written on a machine without a GPU.
#
# On the device: tests/test_cuda_optimizers.py compares with the reference within a few ulp
# (NVVM may contract a * b + c into an FMA); the tests marked gpu check what the simulator
# cannot (24 tensors in one launch fit the 4 KiB kernel parameter space, torch/CuPy arrays,
# repeatable norms). tests/test_cuda_properties.py asserts bit-identity, which holds on the
# simulator only, and skips itself on a device.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
python -m pip install -q ".[test,cuda]"
export NUMBA_ENABLE_CUDASIM=0
python -c "from numba import cuda; assert cuda.is_available(), 'no usable CUDA GPU'; print(cuda.get_current_device().name)"
timeout 120 python -m pytest -q -x -m "not gpu" tests/test_cuda_optimizers.py
timeout 60 python -m pytest -q -x -m gpu tests/test_cuda_optimizers.py
timeout 120 python benchmarks/bench_cuda.py --elements 1e8 --repeats 20
