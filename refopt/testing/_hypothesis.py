"""The one message for a missing Hypothesis (``refopt.testing``'s optional dependency)."""

from __future__ import annotations

#: What to install: the extra that brings Hypothesis at a version refopt is tested with.
INSTALL_HINT = 'pip install "refopt[testing]"'


def missing_hypothesis(what, exc):
    """The error to raise when importing Hypothesis failed for ``what``.

    Parameters
    ----------
    what : str
        What needs it (``"refopt.testing.strategies"``, ``"assert_conforms"``).
    exc : ImportError
        The failed import.

    Returns
    -------
    ImportError
        A :class:`ModuleNotFoundError` naming ``what`` and the install command when
        Hypothesis itself is missing (``name="hypothesis"``, so handlers of the plain error
        still match); ``exc`` unchanged when something else failed to import.
    """
    if getattr(exc, "name", None) != "hypothesis":
        return exc
    return ModuleNotFoundError(
        f"{what} needs Hypothesis, which is not installed: {INSTALL_HINT} "
        "(the golden files, Trajectory and run_reference work without it)",
        name="hypothesis",
    )
