"""The stateful optimizer API: ``base.py`` owns the pipeline order; each optimizer writes its update."""

from refopt.optimizers.adam import Adam, AdamW, LazyAdam
from refopt.optimizers.base import Optimizer
from refopt.optimizers.rmsprop import RMSprop
from refopt.optimizers.sgd import SGD

__all__ = ["Adam", "AdamW", "LazyAdam", "Optimizer", "RMSprop", "SGD"]
