"""Which golden cases the per-function replays (``tests/test_*_reference.py``) take."""


def replayed_by_functions(entry):
    """False for the low-precision cases computed op by op in the optimizer's step
    (:mod:`refopt.reference.bf16` and its companions: bfloat16 in its dtype, float16 under
    torch's for-loop), which the reference *functions* do not compute and
    ``tests/test_conformance.py`` replays through the optimizer classes."""
    if entry["dtype"] == "bfloat16":
        return False
    return not (entry["dtype"] == "float16" and entry["convention"] in ("torch", "fbgemm"))
