"""Why one predicted step loses to the best of its search, in one line: memory when it does not
fit, else the part of the step that grew most (a whole step's and a step of lengths' alike); and
"host-bound" where the host's issue is what sets the step's pace."""

from __future__ import annotations

from typing import Any

PART_NAMES = {"attention": "attention", "attention_comm": "attention comm",
              "other_compute": "other compute", "recompute": "recompute", "idle": "idle",
              "exposed_comm": "exposed comm", "optimizer": "optimizer", "host": "host issue",
              "ep_comm": "EP all-to-all"}


def why_slower(s: Any, best: Any, unit: str = "s") -> str:
    """Why step `s` loses to `best` (one search, the same ranks; both with `fits`,
    `peak_mem_bytes`, `step_ms`, `parts` in ms and `tgs`): how much slower, by tokens a GPU a
    second, and the part that grew most, `s`'s parts taken over `best`'s tokens (splits that
    train one sequence a DP replica step different tokens). `unit`: how the grown part is said,
    "s" or "ms"."""
    if not s.fits:
        return f"no fit: {s.peak_mem_bytes / 1e9:.0f} GB"
    bound = "; host-bound" if host_paced(s) else ""
    if s is best:
        return "best" + bound
    per = _tokens(s) / _tokens(best)  # 1 where the two steps train the same tokens
    slower = s.step_ms / per / best.step_ms
    if slower <= 1 + 5e-4:
        return "ties #1" + bound
    extra = {k: s.parts[k] / per - best.parts.get(k, 0.0) for k in s.parts}
    part = max(extra, key=lambda k: extra[k])
    grown = f"+{extra[part] / 1e3:.2g}s" if unit == "s" else f"+{extra[part]:.3g} ms"
    return f"+{100 * (slower - 1):.0f}%: {PART_NAMES[part]} {grown}{bound}"


def _tokens(s: Any) -> float:
    """What a step's tokens are proportional to at a given world (TGS x step time); 1 without."""
    tgs = getattr(s, "tgs", None)
    return tgs * s.step_ms if tgs else 1.0


def host_paced(s: Any) -> bool:
    """The host's issue sets the step's pace: the step is host-bound (`host_bound`: it issues
    longer than its device works) and what the device does not hide of it (`parts["host"]`) is
    the step's largest part. A step that issues a little longer than it computes but waits
    mostly on its links is not said to be host-bound: its parts say what paces it."""
    parts = getattr(s, "parts", {})
    return bool(getattr(s, "host_bound", False) and parts
                and parts.get("host", 0.0) >= max(parts.values()))
