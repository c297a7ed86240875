import doctest
import importlib

import pytest

MODULES = [
    "refopt.indexed_slices",
    "refopt.optimizers.adam",
    "refopt.optimizers.sgd",
    "refopt.reference.adam",
    "refopt.reference.lazy_adam",
    "refopt.reference.clipping",
    "refopt.schedules",
    "refopt.demo",
]
MODULES += ["refopt.optimizers.lamb", "refopt.optimizers.adafactor"]
MODULES += ["refopt.optimizers.proximal", "refopt.reference.proximal"]
MODULES += ["refopt.lr_scheduler"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
