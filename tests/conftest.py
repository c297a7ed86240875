import os

# The CUDA tests (tests/test_cuda_*.py) run on numba's CUDA simulator unless told otherwise
# (scripts/gpu_check.sh sets NUMBA_ENABLE_CUDASIM=0 on a GPU machine). numba reads the variable
# once, when numba.cuda is first imported, and other test modules import numba (CPU backend)
# at collection, so it is set here, in the conftest that pytest imports before any test
# module. It changes nothing for the CPU backend (numba's CPU JIT does not read it).
os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

# Optimizers created without `backend=` get $REFOPT_BACKEND, else "cpu" (refopt's default for
# users). The suite names a backend wherever it tests one; the tests that do not (API, errors,
# configs) are about the reference semantics and run on it, without compiling kernels for every
# variant. tests/test_default_backend.py tests the default itself.
os.environ.setdefault("REFOPT_BACKEND", "reference")

from hypothesis import settings

# Hypothesis profiles, chosen with REFOPT_HYPOTHESIS_PROFILE (default "ci"):
#   ci  - deterministic (examples derived from each test's source, no example database), about
#         40 examples per test, no deadline (CI machines are slow and noisy), and a reproduction
#         blob printed with every failure.
#   dev - 1000 random examples per test, for a thorough local search.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=40,
    deadline=None,
    print_blob=True,
)
settings.register_profile(
    "dev",
    max_examples=1000,
    deadline=None,
    print_blob=True,
)

_PROFILE = os.environ.get("REFOPT_HYPOTHESIS_PROFILE", "ci")
if _PROFILE not in ("ci", "dev"):
    raise ValueError(
        "REFOPT_HYPOTHESIS_PROFILE must be 'ci' or 'dev'. "
        f"Received: REFOPT_HYPOTHESIS_PROFILE={_PROFILE!r}"
    )
settings.load_profile(_PROFILE)


def pytest_collection_modifyitems(config, items):
    """Skip the tests marked ``gpu`` on the CUDA simulator (they need a real device).

    Off the simulator (``NUMBA_ENABLE_CUDASIM=0``) each such test also carries a ``skipif``
    that checks ``numba.cuda.is_available()``, so a machine without a GPU skips them too.
    """
    import pytest

    if os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        return
    skip = pytest.mark.skip(reason="needs a real NVIDIA GPU (running on the CUDA simulator)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
