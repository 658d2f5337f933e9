"""Steps of variable-length sequences (docs/lengths.md): each policy's TGS per algorithm with the
ranks' idle time, one step's timeline per rank (which sequences ran on which group, when), and the
length distribution itself (lengths, and the share of tokens and of attention work by length)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from seqpar.rules import lengths as length_rules
from seqpar.sweeps import style
from seqpar.sweeps.report.plots.common import trial_label
from seqpar.sweeps.report.view import TrialView

POLICY_COLOURS = {"static best-fit": "#4c72b0", "static cost-balanced": "#55a868",
                  "dynamic": "#c44e52"}
SIZE_COLOURS = ("#8c8c8c", "#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd")


def policy_of(t: TrialView) -> str:
    return "dynamic" if t.sp_policy == "dynamic" else f"static {t.packing or 'best-fit'}"


def policies_figure(runs: list[TrialView]) -> Any:
    """TGS per algorithm, one bar per policy (the whiskers: the step's 95% interval), and below the
    ranks' idle time of a step (mean, and the most idle rank)."""
    fig, axes = style.new_figure(8.0, 6.2, nrows=2)
    top, bottom = axes[0][0], axes[1][0]
    by_alg: dict[str, dict[str, TrialView]] = defaultdict(dict)
    for t in runs:
        by_alg[t.config.split(" SP=")[0]][policy_of(t)] = t
    algs = sorted(by_alg)
    names = [p for p in POLICY_COLOURS if any(p in v for v in by_alg.values())]
    width = 0.8 / max(1, len(names))
    for j, name in enumerate(names):
        xs, tgs, lo, hi, idle, idle_max = [], [], [], [], [], []
        for i, alg in enumerate(algs):
            t = by_alg[alg].get(name)
            if t is None or "tgs" not in t.metrics:
                continue
            m = t.metrics
            xs.append(i + (j - (len(names) - 1) / 2) * width)
            tgs.append(m["tgs"])
            ci = t.interval
            scale = m["step_ms"] / ci[1] if ci else 1.0, m["step_ms"] / ci[0] if ci else 1.0
            lo.append(m["tgs"] - m["tgs"] * scale[0])
            hi.append(m["tgs"] * scale[1] - m["tgs"])
            idle.append(m.get("idle_ms_mean", 0.0))
            idle_max.append(m.get("idle_ms_max", 0.0))
        colour = POLICY_COLOURS[name]
        top.bar(xs, tgs, width, color=colour, label=name, yerr=[lo, hi], capsize=2)
        bottom.bar(xs, idle, width, color=colour, label=name)
        bottom.scatter(xs, idle_max, marker="_", s=80, color="black",
                       label="the most idle rank" if j == 0 else None)
    for ax in (top, bottom):
        ax.set_xticks(range(len(algs)), algs, fontsize=8)
    top.set(ylabel="tokens / s / rank (TGS)", title="each SP policy's throughput (whiskers: 95% "
            "interval of the step)")
    bottom.set(ylabel="ms a step", title="the ranks' idle time a step (no micro-batch before the "
               "pool's last one ended): mean; bar: the most idle rank")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    fig.tight_layout()
    return fig


def timeline_figure(items: list[tuple[TrialView, list[list[list[Any]]]]]) -> Any:
    """One step per trial: a row per rank, a bar per micro-batch from its start to its end (the
    forward's end marked), coloured by its group's size, labelled by its sequences."""
    n = len(items)
    fig, axes = style.new_figure(9.0, 1.2 + 0.45 * sum(len(r) for _, r in items) + 0.5 * n,
                                 nrows=n)
    sizes_seen: dict[int, str] = {}
    for i, (t, ranks) in enumerate(items):
        ax = axes[i][0]
        for rank, micro in enumerate(ranks):
            for seqs, group, _tokens, start, fwd_end, end in micro:
                size = max(1, len(group))
                colour = SIZE_COLOURS[min(int(math.log2(size)) if size > 0 else 0,
                                          len(SIZE_COLOURS) - 1)]
                sizes_seen.setdefault(size, colour)
                ax.barh(rank, (end - start) * 1e3, left=start * 1e3, height=0.7, color=colour,
                        edgecolor="white", linewidth=0.5)
                ax.plot([fwd_end * 1e3] * 2, [rank - 0.35, rank + 0.35], color="black", lw=0.6)
                if seqs and (end - start) * 1e3 > 0.04 * _span(ranks):
                    ax.text((start + end) * 5e2, rank, ",".join(str(s) for s in seqs[:4]) +
                            ("…" if len(seqs) > 4 else ""), ha="center", va="center", fontsize=6,
                            color="white")
        ax.set_yticks(range(len(ranks)), [f"rank {r}" for r in range(len(ranks))], fontsize=7)
        ax.invert_yaxis()
        ax.set(xlabel="ms from the step's start", title=trial_label(t))
    from matplotlib.patches import Patch  # matplotlib: loaded by style.new_figure, not at import

    handles = [Patch(color=c, label=f"group of {s}") for s, c in sorted(sizes_seen.items())]
    fig.legend(handles=handles, loc="upper center", ncol=len(handles), fontsize=7,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return fig


def _span(ranks: list[list[list[Any]]]) -> float:
    return max((m[5] for micro in ranks for m in micro), default=0.0) * 1e3 or 1.0


def distribution_figure(spec: str, longest: int | None = None) -> Any | None:
    """The lengths of a distribution (a seeded sample; a file's or a text's own), and by length the
    cumulative share of the sequences, of their tokens and of their attention work (~L²). None
    when its file cannot be read here."""
    try:
        dist = length_rules.parse(spec)
    except Exception:  # a path of another machine: nothing to draw
        return None
    sample = dist.sample() if not isinstance(dist, length_rules.LogNormal) else dist.sample(20000)
    lengths = sorted(min(n, longest) if longest else n for n in sample)
    fig, axes = style.new_figure(9.0, 3.6, ncols=2)
    left, right = axes[0][0], axes[0][1]
    low, high = int(4 * math.log2(lengths[0])), int(4 * math.log2(lengths[-1])) + 2
    bins = sorted({round(2 ** (k / 4)) for k in range(low, high + 1)})
    left.hist(lengths, bins=bins, color="#4c72b0")
    left.set_xscale("log")
    left.set(xlabel="sequence length (tokens)", ylabel="sequences", title=spec[:60])
    total_tokens = sum(lengths)
    total_work = sum(n * n for n in lengths)
    cum_t = cum_w = 0
    xs, seqs, toks, work = [], [], [], []
    for i, n in enumerate(lengths):
        cum_t += n
        cum_w += n * n
        xs.append(n)
        seqs.append((i + 1) / len(lengths))
        toks.append(cum_t / total_tokens)
        work.append(cum_w / total_work)
    right.plot(xs, seqs, label="sequences", color="#8c8c8c")
    right.plot(xs, toks, label="tokens", color="#4c72b0")
    right.plot(xs, work, label="attention work (L²)", color="#c44e52")
    right.set_xscale("log")
    right.set(xlabel="sequence length (tokens)", ylabel="share at or below this length",
              title="where the tokens and the attention work are")
    right.legend(fontsize=8)
    fig.tight_layout()
    return fig
