"""The layers of a step import only downwards (issue #11): api -> pipeline -> executors ->
rules, kernels, reference. Checked on the source, so a new import above its layer fails here."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1] / "refopt"

# layer -> the refopt packages/modules it must not import (those above it)
FORBIDDEN = {
    "pipeline.py": ("refopt.optimizers",),
    "executors": ("refopt.optimizers", "refopt.pipeline"),
    "rules": ("refopt.optimizers", "refopt.pipeline", "refopt.executors"),
    "reference": ("refopt.optimizers", "refopt.pipeline", "refopt.executors", "refopt.rules",
                  "refopt.kernels"),
    "kernels": ("refopt.optimizers", "refopt.pipeline", "refopt.executors"),
}
# The PTX audit is a tool over every optimizer's variants, not a layer of the step.
TOOLS = {ROOT / "kernels" / "cuda" / "ptx.py"}


def _imports(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            for alias in node.names:
                yield f"{node.module}.{alias.name}"


def _files(layer):
    p = ROOT / layer
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_import_from_a_layer_above(layer):
    files = [f for f in _files(layer) if f not in TOOLS]
    assert files
    bad = []
    for f in files:
        for name in _imports(f):
            if any(name == up or name.startswith(up + ".") for up in FORBIDDEN[layer]):
                bad.append(f"{f.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_optimizer_classes_do_not_branch_on_the_backend():
    """The API layer holds an executor; no optimizer module compares ``backend``."""
    for f in _files("optimizers"):
        src = f.read_text()
        assert 'backend ==' not in src and 'backend !=' not in src, f.name


def test_every_executor_implements_the_interface():
    """Each backend's executor overrides every method of ``refopt.executors.Executor`` that
    the base leaves abstract (``quick_step`` has a default: no quick path)."""
    import inspect

    from refopt.executors import Executor
    from refopt.executors.cpu import CpuExecutor
    from refopt.executors.cuda import CudaExecutor
    from refopt.executors.reference import ReferenceExecutor

    abstract = [name for name, fn in vars(Executor).items()
                if callable(fn) and not name.startswith("_") and "raise NotImplementedError"
                in inspect.getsource(fn)]
    assert set(abstract) >= {"check_var_list", "check_pairs", "allocate", "run_step",
                             "finalize", "checkpoint_arrays"}
    for cls in (ReferenceExecutor, CpuExecutor, CudaExecutor):
        missing = [name for name in abstract
                   if getattr(cls, name) is getattr(Executor, name)]
        assert missing == [], (cls.__name__, missing)
    assert CpuExecutor.quick_step is not Executor.quick_step
