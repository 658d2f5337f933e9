"""`seqpar compare --baseline NAME`: every trial's step time over the baseline's at the same shape,
with the ratio's interval and what it says (faster, slower, or no measurable difference where the
two 95% intervals overlap; `workers.stability`).

The baseline of a trial is the trial named NAME (its algorithm, or its algorithm with options as
the table prints it: 'usp dcp=2 dhp=2') at the same N, heads, mask and dtype, at the same world size
when there is one (else the one at that shape: `local` runs at world 1).
"""

from __future__ import annotations

from seqpar.errors import ConfigError
from seqpar.platform.tracking import Tracker
from seqpar.sweeps.report.table import Comparison, interval, select, sort_key, status
from seqpar.sweeps.report.view import TrialView
from seqpar.workers import stability


def _shape(t: TrialView) -> tuple:
    return (t.seq_len, t.heads, t.kv_heads, t.mask, t.dtype)


def _is(t: TrialView, name: str) -> bool:
    return t.finished and name in (t.algorithm, t.config)


def baseline_of(t: TrialView, bases: list[TrialView]) -> TrialView | None:
    """The baseline trial for `t`: same shape, same world if any, else the only one at the shape."""
    same = [b for b in bases if _shape(b) == _shape(t)]
    by_world = [b for b in same if b.world == t.world]
    if by_world:
        return by_world[0]
    return same[0] if len(same) == 1 else None


def against(title: str, runs: list[TrialView], name: str) -> Comparison:
    """The rows: each trial's step time, the baseline's, the ratio with its interval, the verdict."""
    bases = [t for t in runs if _is(t, name)]
    if not bases:
        names = sorted({t.algorithm for t in runs if t.finished})
        raise ConfigError("--baseline", name,
                          f"no finished trial of that name here; one of {', '.join(names)}")
    columns = ["algorithm", "P", "layout", "N", "H/Hkv", "step ms", "95% CI", "baseline ms",
               "baseline CI", "time ratio", "ratio 95% CI", "verdict", "unstable", "status"]
    rows = []
    runs = sorted(runs, key=sort_key)
    for t in runs:
        base = baseline_of(t, bases) if t.finished else None
        r = stability.ratio(t.metrics, base.metrics) if base is not None and base is not t else None
        if base is t:
            verdict = "baseline"
        elif r is None:
            verdict = "-" if t.finished else ""
        else:
            verdict = stability.verdict(r[1], r[2])
        shaky = [f"{who}: {stability.short_reason(x.unstable)}"
                 for who, x in (("this", t), ("baseline", base))
                 if x is not None and x.unstable and not (who == "baseline" and base is t)]
        rows.append([t.config, str(t.world), t.layout, str(t.seq_len), f"{t.heads}/{t.kv_heads}",
                     f"{t.metrics['step_ms']:.1f}" if "step_ms" in t.metrics else "-", interval(t),
                     f"{base.metrics['step_ms']:.1f}" if base is not None else "-",
                     interval(base) if base is not None else "-",
                     f"{r[0]:.2f}" if r else "1.00" if base is t else "-",
                     f"{r[1]:.2f}-{r[2]:.2f}" if r else "-",
                     verdict, "; ".join(shaky), status(t)])
    return Comparison(f"{title}: step time over {name}'s at the same shape (ratio < 1: faster); "
                      f"'{stability.NO_DIFFERENCE}' where the 95% intervals overlap",
                      columns, rows, None, "step_ms", trials=runs)


def baseline_comparison(tracker: Tracker, name: str, study: str | None = None,
                        sweep: str | None = None) -> Comparison:
    """`against` for a sweep, a study, or (neither given) the latest sweep in the store."""
    title, runs, _ = select(tracker, study, sweep)
    return against(title, runs, name)
