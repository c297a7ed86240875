"""The optimizer API (the top layer): the base class and each optimizer's class; the step order is :mod:`refopt.pipeline`'s."""

from refopt.optimizers.adagrad import Adagrad
from refopt.optimizers.adam import Adam, AdamW, LazyAdam
from refopt.optimizers.base import Optimizer
from refopt.optimizers.rmsprop import RMSprop
from refopt.optimizers.sgd import SGD

__all__ = ["Adagrad", "Adam", "AdamW", "LazyAdam", "Optimizer", "RMSprop", "SGD"]
