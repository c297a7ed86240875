"""Tools for people porting or testing optimizers against refopt.

- :func:`assert_conforms`: Hypothesis-driven check that a candidate (a factory of stateful
  optimizers, or a pure step function) computes refopt's trajectories, step by step, with
  resync; :func:`check_trajectory` does it for one given trajectory; :func:`ulp_distance`
  measures the error. See :mod:`refopt.testing.conformance`.
- :mod:`refopt.testing.strategies`: public Hypothesis strategies (hyperparameters, dense and
  sparse gradients, multi-variable problems, trajectories).
- :mod:`refopt.testing.golden`: golden trajectory files (``.npz`` and JSON with exact hex
  floats) for test suites in other languages; ``refopt golden`` writes them.
- :func:`explain`: which convention knobs or classic slip reproduce a foreign trajectory
  (a golden file, a bundled case or a candidate); ``refopt explain`` prints it. See
  :mod:`refopt.testing.explain`.
- :class:`Trajectory` and :func:`run_reference`: the data they share.

:func:`assert_conforms` and :mod:`refopt.testing.strategies` need Hypothesis (refopt's ``test``
extra); the rest does not.
"""

from refopt.testing.conformance import (
    ConformanceError,
    assert_conforms,
    check_trajectory,
    ulp_distance,
)
from refopt.testing.explain import explain
from refopt.testing.trajectory import (
    OPTIMIZERS,
    State,
    Trajectory,
    run_reference,
    slot_names,
)

__all__ = [
    "OPTIMIZERS",
    "ConformanceError",
    "State",
    "Trajectory",
    "assert_conforms",
    "check_trajectory",
    "explain",
    "run_reference",
    "slot_names",
    "ulp_distance",
]
