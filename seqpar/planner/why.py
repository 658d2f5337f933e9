"""Why one predicted step loses to the best of its search, in one line: memory when it does not
fit, else the part of the step that grew most (a whole step's and a step of lengths' alike)."""

from __future__ import annotations

from typing import Any

PART_NAMES = {"attention": "attention", "attention_comm": "attention comm",
              "other_compute": "other compute", "recompute": "recompute", "idle": "idle",
              "exposed_comm": "exposed comm", "optimizer": "optimizer", "host": "host issue"}


def why_slower(s: Any, best: Any, unit: str = "s") -> str:
    """Why step `s` loses to `best` (one search: the same ranks and tokens a step, so their step
    times compare; both with `fits`, `peak_mem_bytes`, `step_ms` and `parts` in ms). `unit`: how
    the grown part is said, "s" or "ms"."""
    if not s.fits:
        return f"no fit: {s.peak_mem_bytes / 1e9:.0f} GB"
    bound = "; host-bound" if getattr(s, "host_bound", False) else ""
    if s is best:
        return "best" + bound
    if s.step_ms <= best.step_ms * (1 + 5e-4):
        return "ties #1" + bound
    extra = {k: s.parts[k] - best.parts.get(k, 0.0) for k in s.parts}
    part = max(extra, key=lambda k: extra[k])
    grown = f"+{extra[part] / 1e3:.2g}s" if unit == "s" else f"+{extra[part]:.3g} ms"
    return f"+{100 * (s.step_ms / best.step_ms - 1):.0f}%: {PART_NAMES[part]} {grown}{bound}"
