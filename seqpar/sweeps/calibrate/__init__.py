"""`seqpar calibrate`: measure this machine into a Cluster file. `compute` times one thread's kernels,
merges and copies (no ranks); `ranks` measures what needs two local ranks (the link, the fixed host
costs per call, ring step and collective) and runs the whole calibration."""

from __future__ import annotations

from seqpar.sweeps.calibrate.ranks import calibrate

__all__ = ["calibrate"]
