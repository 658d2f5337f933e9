"""A comparison that reads in one screen whatever the sweep's size (`seqpar compare`, the end of a
sweep, the page's table).

    screen(cmp)                    # the table as it is (SCREEN trials or fewer), else its digest
    digest(cmp, max_groups=20)     # the winner of each group, the trials near it, the rest counted
    top(cmp, 10)                   # the 10 best trials by the metric
    where(runs, ["N=4096"])        # the trials whose table cell KEY reads VALUE

A group is what the sweep varies besides the algorithm (its length, world, heads, mask...: the
describing columns whose value is not the same in every row); its winner is its best finished trial
by the metric; the trials within NEAR of the winner are named beside it; the rest are counted. The
flags are counted by kind (unstable: by reason), not listed one line a trial, and the last lines
say how to list every trial (`--all`), the best N (`--top N`) or a slice (`--where KEY=VALUE`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import replace

from seqpar.errors import ConfigError
from seqpar.experiments.registry import higher_is_better
from seqpar.sweeps.report.table import DESCRIBING, FLAGS, Comparison, naming_columns
from seqpar.sweeps.report.view import TrialView
from seqpar.workers.stability import short_reason

SCREEN = 30        # a comparison of more trials than this is digested
MAX_GROUPS = 20    # the groups whose winner the terminal shows (evenly spaced over the rest)
NEAR = 0.05        # a trial within 5% of its group's winner is named beside it
ALIASES = {"world": "P", "seq_len": "N", "heads": "H/Hkv", "config": "algorithm"}


def _score(cmp: Comparison, i: int) -> float | None:
    t = cmp.trials[i]
    return t.metrics.get(cmp.metric) if t.finished else None


def _better(metric: str, a: float, b: float) -> bool:
    return a > b if higher_is_better(metric) else a < b


def _behind(metric: str, value: float, best: float) -> float:
    """How far `value` is behind `best`, as a fraction of `best` (0: as good)."""
    if best == 0:
        return 0.0
    gap = (best - value) / abs(best)
    return gap if higher_is_better(metric) else -gap


def group_columns(cmp: Comparison) -> list[int]:
    """The describing columns (besides the algorithm) whose value varies between rows."""
    return naming_columns(cmp.columns, cmp.rows)


def screen(cmp: Comparison, again: str = "seqpar compare") -> Comparison:
    """The comparison as a terminal shows it: as it is for SCREEN trials or fewer, else its
    digest (`again`: the command that lists more, see `digest`)."""
    return cmp if len(cmp.rows) <= SCREEN else digest(cmp, again=again)


def digest(cmp: Comparison, max_groups: int | None = MAX_GROUPS, again: str = "seqpar compare"
           ) -> Comparison:
    """The winner of every group (at most `max_groups` of them, evenly spaced, when there are
    more), with a column naming the trials near it; the counts of the rest, the flags and the
    commands that list more (`again`: the command that printed this) in `notes`."""
    keys = group_columns(cmp)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, row in enumerate(cmp.rows):
        groups[tuple(str(row[k]) for k in keys)].append(i)
    winners, near_cells, near_n = [], [], 0
    for members in groups.values():
        scored = [(s, i) for i in members if (s := _score(cmp, i)) is not None]
        if not scored:
            winners.append(members[0])
            near_cells.append("")
            continue
        best_s, best_i = scored[0]
        for s, i in scored[1:]:
            if _better(cmp.metric, s, best_s):
                best_s, best_i = s, i
        near = sorted(((_behind(cmp.metric, s, best_s), i) for s, i in scored if i != best_i
                       and _behind(cmp.metric, s, best_s) <= NEAR))
        near_n += len(near)
        winners.append(best_i)
        near_cells.append(_near_text(cmp, near))
    shown = list(range(len(winners)))
    if max_groups is not None and len(shown) > max_groups:
        step = (len(shown) - 1) / (max_groups - 1)
        shown = sorted({round(j * step) for j in range(max_groups)})
    rows = [[*cmp.rows[winners[j]], near_cells[j]] for j in shown]
    trials = [cmp.trials[winners[j]] for j in shown]
    best = _best(cmp, [winners[j] for j in shown])
    varied = ", ".join(cmp.columns[k] for k in keys) or "nothing"
    told = (f"{len(shown)} of {len(winners)} groups (evenly spaced)" if len(shown) < len(winners)
            else f"{len(winners)} group(s)")
    title = (f"{cmp.title}; {len(cmp.rows)} trials: the winner of each group by {varied}, "
             f"{told}")
    notes = [*_wins(cmp, winners, keys, list(groups)),
             f"near the winners (within {NEAR:.0%}): {near_n} trial(s); the other "
             f"{len(cmp.rows) - len(winners) - near_n} trial(s) are further behind",
             *_flag_counts(cmp.trials),
             f"every trial: {again} --all",
             f"  or --top N (the best N), --where KEY=VALUE (KEY: {', '.join(_keys(cmp))})"]
    return replace(cmp, title=title, columns=[*cmp.columns, f"near (<{NEAR:.0%})"], rows=rows,
                   best=best, legend="", notes=notes, trials=trials)


def _best(cmp: Comparison, indices: list[int]) -> int | None:
    """The position among `indices` of the best trial (None: none finished)."""
    scored = [(s, j) for j, i in enumerate(indices) if (s := _score(cmp, i)) is not None]
    if not scored:
        return None
    return (max(scored) if higher_is_better(cmp.metric) else min(scored))[1]


def _near_text(cmp: Comparison, near: list[tuple[float, int]], most: int = 3) -> str:
    """'ulysses -1.2%, ring -3.4%' (+k more)."""
    words = [f"{cmp.trials[i].config} -{gap:.1%}" for gap, i in near[:most]]
    more = f" +{len(near) - most}" if len(near) > most else ""
    return ", ".join(words) + more


def _wins(cmp: Comparison, winners: list[int], keys: list[int], labels: list[tuple]
          ) -> list[str]:
    """One line a configuration: the groups it wins, as ranges of consecutive groups."""
    runs: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for j, i in enumerate(winners):
        if _score(cmp, i) is None:
            continue
        name = cmp.trials[i].config
        spans = runs[name]
        if spans and spans[-1][1] == j - 1:
            spans[-1] = (spans[-1][0], j)
        else:
            spans.append((j, j))

    def label(j: int) -> str:
        return " ".join(f"{cmp.columns[k]}={v}" for k, v in zip(keys, labels[j], strict=True))

    out = []
    for name, spans in sorted(runs.items(), key=lambda kv: (-sum(b - a + 1 for a, b in kv[1]),
                                                            kv[1][0][0])):
        won = sum(b - a + 1 for a, b in spans)
        text = ", ".join(label(a) if a == b else f"{label(a)}..{label(b)}" for a, b in spans[:3])
        more = f" (+{len(spans) - 3} more ranges)" if len(spans) > 3 else ""
        out.append(f"wins {name}: {won} of {len(winners)} groups: {text}{more}")
    return out


def _flag_counts(runs: list[TrialView]) -> list[str]:
    """The flags counted, unstable trials by reason, failed ones by their cause's first words."""
    parts = []
    over = sum(t.oversubscribed for t in runs)
    if over:
        parts.append(f"O {over} {FLAGS['O']}")
    shaky = Counter(_kind(short_reason(t.unstable)) for t in runs if t.unstable)
    if shaky:
        parts.append(f"U {sum(shaky.values())} unstable (" + ", ".join(
            f"{k}: {n}" for k, n in shaky.most_common(3)) + "; --rerun-unstable N)")
    failed = Counter(f"{t.status}: {_kind(t.cause)}" for t in runs if not t.finished)
    if failed:
        parts.append(f"F {sum(failed.values())} failed (" + ", ".join(
            f"{k}: {n}" for k, n in failed.most_common(3)) + ")")
    return ["flags: " + "; ".join(parts)] if parts else []


def _kind(text: str) -> str:
    """A reason's kind: its words before the first number ('interval ±31% ...' -> 'interval')."""
    words = re.split(r"[\d±(:]", text or "?", maxsplit=1)[0].strip()
    return words[:40] or "?"


def _keys(cmp: Comparison) -> list[str]:
    return [c for c in cmp.columns if c in DESCRIBING and c != "cores"] + ["flags", "status"]


def where(cmp: Comparison, conditions: list[str]) -> Comparison:
    """The rows whose cell KEY reads VALUE for every `KEY=VALUE` (a column of the table, or world,
    seq_len, heads; `algorithm=usp` also matches 'usp dcp=2 dhp=2'; `flags=U` any row flagged U)."""
    keep = list(range(len(cmp.rows)))
    for condition in conditions:
        key, sep, value = condition.partition("=")
        key = ALIASES.get(key.strip(), key.strip())
        if not sep or key not in cmp.columns:
            raise ConfigError("--where", condition, "is KEY=VALUE with KEY one of "
                                                    + ", ".join(_keys(cmp)))
        col, value = cmp.columns.index(key), value.strip()
        keep = [i for i in keep if _matches(key, str(cmp.rows[i][col]), value)]
    return _subset(cmp, keep, f"{cmp.title}; where {' and '.join(conditions)}")


def _matches(key: str, text: str, value: str) -> bool:
    if key == "algorithm":
        return text == value or text.split(" ")[0] == value
    if key == "flags":
        return all(f in text for f in value)
    if key == "status":
        return text.split(":")[0] == value
    return text == value


def top(cmp: Comparison, n: int) -> Comparison:
    """The `n` best finished trials by the metric, best first."""
    if n < 1:
        raise ConfigError("--top", n, "must be >= 1")
    scored = [(s, i) for i in range(len(cmp.rows)) if (s := _score(cmp, i)) is not None]
    scored.sort(key=lambda si: si[0], reverse=higher_is_better(cmp.metric))
    return _subset(cmp, [i for _, i in scored[:n]],
                   f"{cmp.title}; the best {min(n, len(scored))} of {len(cmp.rows)}")


def _subset(cmp: Comparison, keep: list[int], title: str) -> Comparison:
    trials = [cmp.trials[i] for i in keep]
    labels = cmp.labels()  # the notes name the rows as the whole table tells them apart
    kept = {f"{f} {labels[i]}:" for i in keep for f in "UF"}
    notes = [n for n in cmp.notes if any(n.startswith(k) for k in kept)] if len(keep) < len(
        cmp.rows) else cmp.notes
    rows = [cmp.rows[i] for i in keep]
    return replace(cmp, title=title, rows=rows, best=_best(cmp, keep), trials=trials,
                   notes=notes, legend=cmp.legend_of(rows))


def csv_text(cmp: Comparison) -> str:
    """Every row and column of the comparison as CSV (the report's downloadable full table)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(cmp.columns)
    writer.writerows([[str(v) for v in row] for row in cmp.rows])
    return out.getvalue()


__all__ = ["SCREEN", "csv_text", "digest", "group_columns", "screen", "top", "where"]
