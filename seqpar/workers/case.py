"""Alias: the trial description lives in `seqpar.case` (used by experiments and workers alike)."""

from seqpar.case import MODES, Case

__all__ = ["MODES", "Case"]
