"""Alias of the older home: `TrainCase` lives in `seqpar.case`, training steps in
`seqpar.workers.measure.train`."""

from seqpar.case import TrainCase
from seqpar.workers.measure.train import build, gang_train, measure_training, train_steps

__all__ = ["TrainCase", "build", "gang_train", "measure_training", "train_steps"]
