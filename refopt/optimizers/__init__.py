"""The optimizer API (the top layer): the base class and each optimizer's class; the step order is :mod:`refopt.pipeline`'s."""

from refopt.optimizers.adadelta import Adadelta
from refopt.optimizers.adafactor import Adafactor
from refopt.optimizers.adagrad import Adagrad
from refopt.optimizers.adam import Adam, AdamW, LazyAdam
from refopt.optimizers.adamax import Adamax
from refopt.optimizers.asgd import ASGD
from refopt.optimizers.base import Optimizer
from refopt.optimizers.eightbit import Adam8bit, AdamW8bit, Lion8bit
from refopt.optimizers.ftrl import Ftrl
from refopt.optimizers.proximal import ProximalAdagrad, ProximalGradientDescent
from refopt.optimizers.lamb import Lamb
from refopt.optimizers.lion import Lion
from refopt.optimizers.loss_scale import GradScaler as GradScaler
from refopt.optimizers.loss_scale import LossScaleOptimizer as LossScaleOptimizer
from refopt.optimizers.multi_steps import MultiSteps as MultiSteps
from refopt.optimizers.averaging import SWA as SWA
from refopt.optimizers.averaging import MovingAverage as MovingAverage
from refopt.optimizers.nadam import Nadam
from refopt.optimizers.partial_rowwise_adam import PartialRowWiseAdam
from refopt.optimizers.radam import RAdam
from refopt.optimizers.rmsprop import RMSprop
from refopt.optimizers.rprop import Rprop
from refopt.optimizers.rowwise_adagrad import RowWiseAdagrad
from refopt.optimizers.sgd import SGD
from refopt.optimizers.sgdw import SGDW

__all__ = [
    "ASGD",
    "Adadelta",
    "Adafactor",
    "Adagrad",
    "Adam",
    "Adam8bit",
    "AdamW",
    "AdamW8bit",
    "Adamax",
    "Ftrl",
    "ProximalAdagrad",
    "ProximalGradientDescent",
    "Lamb",
    "LazyAdam",
    "Lion",
    "Lion8bit",
    "Nadam",
    "Optimizer",
    "PartialRowWiseAdam",
    "RAdam",
    "RMSprop",
    "Rprop",
    "RowWiseAdagrad",
    "SGD",
    "SGDW",
]

#: Wrappers around an optimizer (their state is the inner one's plus their own): importable
#: from here and from ``refopt``, kept out of ``__all__`` (the per-class shortcuts of
#: ``refopt.functional``, ``refopt.optax`` and the CLI are for the optimizers themselves).
WRAPPERS = ["LossScaleOptimizer", "MultiSteps", "MovingAverage", "SWA"]
