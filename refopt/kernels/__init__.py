"""Fast backends of refopt, each checked bit for bit against :mod:`refopt.reference`.

``refopt.kernels.cpu`` holds the Numba CPU kernels behind ``backend="cpu"``. It is imported
only when asked for (``import refopt`` does not import Numba, and nothing is compiled until a
kernel is first called), so this package imports no backend itself.
"""

__all__ = ["cpu"]


def __getattr__(name):
    if name == "cpu":
        import importlib

        return importlib.import_module("refopt.kernels.cpu")
    raise AttributeError(f"module 'refopt.kernels' has no attribute {name!r}")
