"""What one trial is, as plain data: what a rank needs to run it, and every rule it must keep.

`Case` (`case.attention`) is one attention experiment on one process group (modes fwd, fwd+bwd,
accuracy); `TrainCase` (`case.train`) is training steps of the decoder (mode train). Each has one
`validate()` holding all its rules (the algorithm's own rules come from `seqpar.algorithms.check`).
`Trial` (`case.trial`) is a case with its placement (nodes, ranks per node, emulated links,
timeout, the ranks' environment variables) in an explicit gang: made once
(`ExperimentSpec.to_trial()`, or by hand), validated once, when it is made, and carried unchanged
from the sweep runner through the gang to every rank. The check, the benchmark and the Ray rank
workers (workers/) run them. It lives at the top of the package, beside the errors, so that both
layers use it without either importing the other.
"""

from seqpar.case.attention import MODES, Case
from seqpar.case.train import TrainCase
from seqpar.case.trial import Trial

__all__ = ["MODES", "Case", "TrainCase", "Trial"]
