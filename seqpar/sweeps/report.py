"""Tables and plots from MLflow runs (read back from the store, never from memory).

`comparison` builds the rows `seqpar compare` prints (the best run by the metric highlighted;
oversubscribed CPU runs, more ranks than cores, flagged). `figures` draws the sweep's plots in one
style (`sweeps.style`): throughput and memory vs sequence length with p10-p90 bands, speed-up and
efficiency vs world with the ideal line, bytes by link, bytes measured vs analytic, and each rank's
compute / waiting / communication from the trials' per_rank.json. `log_summary` puts all of it,
the headline metrics and the HTML report (`sweeps.html`) on the sweep's parent run.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqpar.errors import ConfigError
from seqpar.platform.tracking import RunRecord, Tracker

LOWER_IS_BETTER = ("step_ms", "fwd_ms", "bwd_ms", "peak_mem", "bytes", "load_imbalance", "setup_s",
                   "run_s", "activation_bytes", "recomputed_flops", "err_", "attn_flops")


def higher_is_better(metric: str) -> bool:
    return not metric.startswith(LOWER_IS_BETTER)


def _int(run: RunRecord, key: str) -> int:
    try:
        return int(run.params.get(key, 0))
    except ValueError:
        return 0


def config(run: RunRecord) -> str:
    """algorithm and its options: 'usp dcp=2 dhp=2'."""
    opts = sorted((k.removeprefix("plan.options."), v) for k, v in run.params.items()
                  if k.startswith("plan.options."))
    words = [run.params.get("plan.algorithm", "?")] + [f"{k}={v}" for k, v in opts]
    if "train.model" in run.params:  # a training trial: its memory levers and DP x SP split
        words.append(_train_bits(run))
    return " ".join(words)


def _sort_key(run: RunRecord) -> tuple:
    return (_int(run, "workload.seq_len"), _int(run, "model.kv_heads"), _int(run, "plan.world"),
            config(run), run.params.get("plan.layout", ""), -(window(run) or 1 << 62),
            run.params.get("workload.dtype", ""))


def _param(run: RunRecord, key: str) -> str | None:
    """A param as logged, None when absent or logged as None."""
    value = run.params.get(key)
    return None if value in (None, "", "None") else value


def window(run: RunRecord) -> int | None:
    """The run's sliding window W (None: none)."""
    w = _param(run, "workload.window")
    return int(w) if w is not None else None


def documents(run: RunRecord) -> str | None:
    """The run's packed documents, short: '12 drawn (spread 1.25, seed 0)' or '3 given'."""
    count = _param(run, "workload.documents.count")
    if count is not None:
        return (f"{count} drawn (spread {run.params.get('workload.documents.spread')}, "
                f"seed {run.params.get('workload.documents.seed')})")
    lengths = _param(run, "workload.documents.lengths")
    return f"{len(lengths.strip('[]').split(','))} given" if lengths is not None else None


def mask(run: RunRecord) -> str:
    """causal | full, with its documents and window: 'causal docs=12 W=512'."""
    out = "causal" if run.params.get("workload.causal", "True") == "True" else "full"
    docs = documents(run)
    if docs is not None:
        out += f" docs={docs.split()[0]}"
    if window(run) is not None:
        out += f" W={window(run)}"
    return out


@dataclass
class Comparison:
    title: str
    columns: list[str]
    rows: list[list[Any]]
    best: int | None
    metric: str


def _select(tracker: Tracker, study: str | None, sweep: str | None) -> tuple[str, list[RunRecord]]:
    if sweep is not None:
        record = tracker.sweep(sweep)
        return f"sweep {record.name} ({sweep})", tracker.trials(sweep)
    if study is not None:
        return f"study {study}", tracker.study_trials(study)
    latest = tracker.latest_sweep()
    if latest is None:
        raise ConfigError("tracking-uri", tracker.uri, "holds no sweep yet; run `seqpar sweep` first")
    return f"sweep {latest.name} ({latest.run_id})", tracker.trials(latest.run_id)


def comparison(tracker: Tracker, study: str | None = None, sweep: str | None = None,
               metric: str | None = None) -> Comparison:
    title, runs = _select(tracker, study, sweep)
    if sweep is None and study is None and runs:
        metric = metric or runs[0].tags.get("seqpar.headline")
    if metric is None and sweep is not None:
        metric = tracker.sweep(sweep).tags.get("seqpar.headline")
    metric = metric or "tokens_per_s"
    logged = {k for r in runs for k in r.metrics}
    if logged and metric not in logged:
        raise ConfigError("metric", metric, f"is not logged here; one of {', '.join(sorted(logged))}")
    runs = sorted(runs, key=_sort_key)
    # local at the same (N, H, Hkv, mask, dtype) is the baseline for the speed-up column
    def same(r: RunRecord) -> tuple:
        return (_int(r, "workload.seq_len"), _int(r, "model.heads"), _int(r, "model.kv_heads"),
                mask(r), r.params.get("workload.dtype"))

    local = {same(r): r.metrics.get("tokens_per_s") for r in runs
             if r.params.get("plan.algorithm") == "local" and r.status == "FINISHED"}
    columns = ["algorithm", "P", "nodes", "layout", "N", "H/Hkv", "step ms", "tokens/s",
               "x local", "peak MiB", "MB sent", "imbalance", "status"]
    masks = len({mask(r) for r in runs}) > 1 or any(mask(r) not in ("causal", "full") for r in runs)
    if masks:
        columns.insert(columns.index("H/Hkv") + 1, "mask")
    dtypes = len({r.params.get("workload.dtype") for r in runs}) > 1
    if dtypes:
        columns.insert(columns.index("H/Hkv") + 1, "dtype")
    inter = any(r.metrics.get("bytes_inter", 0) > 0 for r in runs)  # the plan spans nodes
    if inter:
        columns.insert(columns.index("MB sent") + 1, "MB inter")
    extra = metric not in ("step_ms", "tokens_per_s", "peak_mem_bytes", "bytes_total",
                           "load_imbalance", "bytes_inter")
    if extra:
        columns.insert(-1, metric)
    over = any(oversubscribed(r) for r in runs)
    if over:
        columns.insert(columns.index("P") + 1, "cores")
    rows, scores = [], []
    for r in runs:
        m = r.metrics
        base = local.get(same(r))
        row = [config(r), r.params.get("plan.world")]
        if over:
            row.append(f"{cores(r)} OVERSUBSCRIBED" if oversubscribed(r) else str(cores(r) or "-"))
        row += [r.params.get("plan.nodes"),
               r.params.get("plan.layout"), r.params.get("workload.seq_len"),
               f"{r.params.get('model.heads')}/{r.params.get('model.kv_heads')}",
               *([r.params.get("workload.dtype")] if dtypes else []),
               *([mask(r)] if masks else []),
               _fmt(m.get("step_ms"), ".1f"), _fmt(m.get("tokens_per_s"), ",.0f"),
               _fmt(m["tokens_per_s"] / base if base and "tokens_per_s" in m else None, ".2f"),
               _fmt(m["peak_mem_bytes"] / 2**20 if "peak_mem_bytes" in m else None, ".1f"),
               _fmt(m["bytes_total"] / 1e6 if "bytes_total" in m else None, ".2f")]
        if inter:
            row.append(_fmt(m["bytes_inter"] / 1e6 if "bytes_inter" in m else None, ".2f"))
        row.append(_fmt(m.get("load_imbalance"), ".2f"))
        if extra:
            row.append(_fmt(m.get(metric), ".4g"))
        cause = r.tags.get("seqpar.cause", "")
        row.append(r.status if r.status == "FINISHED" else f"{r.status}: {cause[:80]}")
        rows.append(row)
        scores.append(m.get(metric) if r.status == "FINISHED" else None)
    valid = [(s, i) for i, s in enumerate(scores) if s is not None]
    best = None
    if valid:
        best = (max(valid) if higher_is_better(metric) else min(valid))[1]
    direction = "higher" if higher_is_better(metric) else "lower"
    note = "; OVERSUBSCRIBED = more ranks than cores: times measure contention" if over else ""
    return Comparison(f"{title}: best by {metric} ({direction} is better){note}", columns, rows,
                      best, metric)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# ------------------------------------------------------------------------------------- plots
def cores(run: RunRecord) -> int | None:
    """The cores of the machine the run's ranks shared (tag seqpar.cpu_count), if recorded."""
    try:
        return int(run.tags["seqpar.cpu_count"])
    except (KeyError, ValueError):
        return None


def oversubscribed(run: RunRecord) -> bool:
    """A CPU run with more ranks on one machine than it has cores: its times measure contention
    (the efficiency of world 4 on 2 cores is at most 0.5), not the algorithm."""
    have = cores(run)
    if have is None or run.tags.get("seqpar.device", "cpu") != "cpu":
        return False
    world, nodes = max(1, _int(run, "plan.world")), max(1, _int(run, "plan.nodes"))
    per_machine = world if run.tags.get("seqpar.topology", "virtual") != "real" else world // nodes
    return per_machine > have


def _algorithm(run: RunRecord) -> str:
    return run.params.get("plan.algorithm", "?")


def _band(run: RunRecord, metric: str) -> tuple[float, float] | None:
    """The p10-p90 spread of a metric over the timed iterations (from the step-time spread)."""
    m = run.metrics
    if "step_ms_p10" not in m or "step_ms_p90" not in m or "step_ms" not in m:
        return None
    if metric == "step_ms":
        return m["step_ms_p10"], m["step_ms_p90"]
    if metric in ("tokens_per_s", "tokens_per_s_per_rank") and metric in m:
        work = m[metric] * m["step_ms"]  # tokens (per rank) x ms: constant over iterations
        return work / m["step_ms_p90"], work / m["step_ms_p10"]
    return None


def _series(runs: list[RunRecord], x_key: str, metric: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in runs:
        if r.status == "FINISHED" and metric in r.metrics:
            out[_series_label(r, x_key)].append((_int(r, x_key), r.metrics[metric]))
    return {k: sorted(v) for k, v in out.items()}


def _series_label(r: RunRecord, x_key: str) -> str:
    label = config(r)
    if x_key != "plan.world":
        label += f" P={r.params.get('plan.world')}"
    if r.params.get("model.kv_heads") != r.params.get("model.heads"):
        label += f" Hkv={r.params.get('model.kv_heads')}"
    return label


def _scaling_points(ok: list[RunRecord]) -> dict[str, list[tuple[int, float, RunRecord, float]]]:
    """label -> (world, speed-up, run, baseline tokens/s) per configuration and length."""
    base: dict[int, float] = {}
    for r in ok:
        n = _int(r, "workload.seq_len")
        if _int(r, "plan.world") == 1 and (n not in base or _algorithm(r) == "local"):
            base[n] = r.metrics["tokens_per_s"]
    series: dict[str, list[tuple[int, float, RunRecord, float]]] = defaultdict(list)
    for r in ok:
        p, n = _int(r, "plan.world"), _int(r, "workload.seq_len")
        tps = r.metrics["tokens_per_s"]
        if n in base:
            series[f"{config(r)} N={n}"].append((p, tps / base[n], r, base[n]))
        if p and n % p == 0 and n // p in base and (p == 1 or n not in base):
            series[f"{config(r)} N/P={n // p}"].append((p, tps / base[n // p], r, base[n // p]))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in series.items()
            if len({t[0] for t in v}) >= 2}


def scaling_series(ok: list[RunRecord]) -> dict[str, list[tuple[int, float]]]:
    """Speed-up over a one-rank run (local preferred) per configuration: against the run at the
    same N (strong scaling) or at N/P (weak scaling); only series with two world sizes or more."""
    return {k: [(p, s) for p, s, _, _ in v] for k, v in _scaling_points(ok).items()}


def _line_styles(labels: list[str]) -> dict[str, str]:
    """Same algorithm, same colour; its second, third... series get dashed/dotted lines."""
    seen: dict[str, int] = defaultdict(int)
    out = {}
    for label in labels:
        algo = label.split(" ")[0]
        out[label] = ("-", "--", ":", "-.")[seen[algo] % 4]
        seen[algo] += 1
    return out


def _vs_seq_len(ok: list[RunRecord], metric: str, title: str, ylabel: str,
                scale: float = 1.0, mark: bool = True) -> Any:
    from seqpar.sweeps import style

    fig, axes = style.new_figure()
    ax = axes[0][0]
    groups: dict[str, list[RunRecord]] = defaultdict(list)
    for r in ok:
        if metric in r.metrics:
            groups[_series_label(r, "workload.seq_len")].append(r)
    styles = _line_styles(sorted(groups))
    flagged = False
    for label in sorted(groups):
        rs = sorted(groups[label], key=lambda r: _int(r, "workload.seq_len"))
        xs = [_int(r, "workload.seq_len") for r in rs]
        ys = [r.metrics[metric] * scale for r in rs]
        c = style.colour(_algorithm(rs[0]))
        ax.plot(xs, ys, marker="o", ls=styles[label], color=c, label=label)
        bands = [_band(r, metric) for r in rs]
        if all(b is not None for b in bands) and len(rs) > 1:
            ax.fill_between(xs, [b[0] * scale for b in bands], [b[1] * scale for b in bands],
                            color=c, alpha=0.15, lw=0)
        over = [(x, y) for x, y, r in zip(xs, ys, rs, strict=True) if mark and oversubscribed(r)]
        style.mark_oversubscribed(ax, [x for x, _ in over], [y for _, y in over], not flagged)
        flagged = flagged or bool(over)
    style.seq_len_axis(ax, [_int(r, "workload.seq_len") for r in ok])
    ax.set(ylabel=ylabel, title=title)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig


def _scaling_figure(points: dict[str, list[tuple[int, float, RunRecord, float]]]) -> Any:
    from seqpar.sweeps import style

    fig, axes = style.new_figure(11, 4.5, ncols=2)
    a1, a2 = axes[0]
    worlds = sorted({p for pts in points.values() for p, *_ in pts})
    a1.plot(worlds, worlds, color="k", ls="--", lw=0.8, label="ideal (speed-up = world)")
    a2.axhline(1.0, color="k", ls="--", lw=0.8, label="ideal")
    styles = _line_styles(sorted(points))
    flagged = False
    for label in sorted(points):
        pts = points[label]
        c, ls = style.colour(label.split(" ")[0]), styles[label]
        ps = [p for p, *_ in pts]
        a1.plot(ps, [s for _, s, _, _ in pts], marker="o", color=c, ls=ls, label=label)
        a2.plot(ps, [s / p for p, s, _, _ in pts], marker="o", color=c, ls=ls, label=label)
        bands = [_band(r, "tokens_per_s") for _, _, r, _ in pts]
        if all(b is not None for b in bands):
            lo = [b[0] / base for b, (_, _, _, base) in zip(bands, pts, strict=True)]
            hi = [b[1] / base for b, (_, _, _, base) in zip(bands, pts, strict=True)]
            a1.fill_between(ps, lo, hi, color=c, alpha=0.15, lw=0)
            a2.fill_between(ps, [v / p for v, p in zip(lo, ps, strict=True)],
                            [v / p for v, p in zip(hi, ps, strict=True)], color=c, alpha=0.15, lw=0)
        over = [(p, s) for p, s, r, _ in pts if oversubscribed(r)]
        style.mark_oversubscribed(a1, [p for p, _ in over], [s for _, s in over], not flagged)
        style.mark_oversubscribed(a2, [p for p, _ in over], [s / p for p, s in over], False)
        flagged = flagged or bool(over)
    for ax in (a1, a2):
        style.world_axis(ax, worlds)
    a1.set(ylabel="speed-up over one rank (p10-p90 band)", title="speed-up")
    a2.set(ylabel="efficiency = speed-up / world", title="parallel efficiency", ylim=(0, None))
    a1.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    return fig


def _trial_label(r: RunRecord) -> str:
    hkv = r.params.get("model.kv_heads")
    return (f"{config(r)}  P={r.params.get('plan.world')} {r.params.get('plan.layout', '')} "
            f"N={style_tokens(_int(r, 'workload.seq_len'))}"
            + (f" Hkv={hkv}" if hkv != r.params.get("model.heads") else "")
            + ("  [oversub]" if oversubscribed(r) else ""))


def style_tokens(n: int) -> str:
    from seqpar.sweeps.style import tokens

    return tokens(n)


def _bytes_by_link(ok: list[RunRecord]) -> Any:
    """Horizontal bars (readable labels): MB each trial's gang sends per step, by link."""
    from seqpar.sweeps import style

    rs = [r for r in ok if _int(r, "plan.world") > 1] or ok
    fig, axes = style.new_figure(8, max(2.5, 0.32 * len(rs) + 1.2))
    ax = axes[0][0]
    labels = [_trial_label(r) for r in rs]
    intra = [r.metrics.get("bytes_intra", 0) / 1e6 for r in rs]
    inter = [r.metrics.get("bytes_inter", 0) / 1e6 for r in rs]
    y = list(range(len(rs)))
    ax.barh(y, intra, color=[style.colour(_algorithm(r)) for r in rs], label="intra-node")
    if any(inter):
        ax.barh(y, inter, left=intra, color=[style.colour(_algorithm(r)) for r in rs],
                hatch="///", edgecolor="white", label="inter-node (hatched)")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="MB sent per step, all ranks", title="bytes by link")
    if any(inter):
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _bytes_vs_analytic(rs: list[RunRecord]) -> Any:
    """Per rank and step: the ledger's measured bytes (mean over ranks) beside the algorithm's
    analytic count; a ratio other than 1.00 is a booking or formula error worth a look."""
    from seqpar.sweeps import style

    fig, axes = style.new_figure(8, max(2.5, 0.45 * len(rs) + 1.2))
    ax = axes[0][0]
    y = list(range(len(rs)))
    measured = [r.metrics["bytes_total"] / max(1, _int(r, "plan.world")) / 1e6 for r in rs]
    analytic = [r.metrics["bytes_analytic_per_rank"] / 1e6 for r in rs]
    colours = [style.colour(_algorithm(r)) for r in rs]
    ax.barh([v - 0.2 for v in y], measured, height=0.4, color=colours, label="measured (ledger)")
    ax.barh([v + 0.2 for v in y], analytic, height=0.4, color=colours, alpha=0.35,
            hatch="..", edgecolor="k", lw=0.3, label="analytic (formula)")
    for i, (m, a) in enumerate(zip(measured, analytic, strict=True)):
        ax.text(max(m, a), i, f"  {m / a:.2f}x" if a else "  -", va="center", fontsize=7)
    ax.set_yticks(y, [_trial_label(r) for r in rs], fontsize=7)
    ax.invert_yaxis()
    ax.set(xlabel="MB one rank sends per step", title="bytes: measured vs analytic (ratio)")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def rank_breakdown(detail: dict[str, Any], rate: float | None) -> list[dict[str, float]] | None:
    """Each rank's median step split into compute, waiting and (exposed) communication.

    The ranks record their time per step and their attention FLOPs, not a timeline, so the split
    is a model: compute = the rank's FLOPs at `rate` (the one-rank FLOP/s measured in this sweep,
    else the fastest rank's FLOPs/step); waiting = the busiest rank's compute minus this rank's
    (load imbalance); communication = what is left of the step (exposed communication)."""
    ranks = detail.get("per_rank") or []
    if len(ranks) < 2:
        return None
    steps = [statistics.median(m["step_ms"]) / 1e3 for m in ranks]
    flops = [sum(m.get("flops", {}).values()) for m in ranks]
    if not any(flops):
        return None
    rate = rate or max(f / s for f, s in zip(flops, steps, strict=True) if s > 0)
    compute = [f / rate for f in flops]
    busiest = max(compute)
    out = []
    for step, c in zip(steps, compute, strict=True):
        c = min(c, step)
        wait = min(busiest - c, step - c)
        out.append({"step": step * 1e3, "compute": c * 1e3, "waiting": wait * 1e3,
                    "communication": max(0.0, step - c - wait) * 1e3})
    return out


def _per_rank_figure(items: list[tuple[RunRecord, list[dict[str, float]]]],
                     one_rank_rate: bool) -> Any:
    from seqpar.sweeps import style

    n = len(items)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = style.new_figure(4.2 * cols, 3.0 * rows + 0.6, ncols=cols, nrows=rows)
    for i, (r, parts) in enumerate(items):
        ax = axes[i // cols][i % cols]
        x = list(range(len(parts)))
        bottom = [0.0] * len(parts)
        for phase in ("compute", "waiting", "communication"):
            vals = [p[phase] for p in parts]
            ax.bar(x, vals, bottom=bottom, color=style.PHASE_COLOURS[phase],
                   label=phase if i == 0 else None, width=0.7)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_xticks(x, [str(v) for v in x])
        ax.set_title(_trial_label(r), fontsize=8, color=style.colour(_algorithm(r)))
        ax.set(xlabel="rank", ylabel="ms per step")
    for j in range(n, rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    rate = ("the one-rank rate" if one_rank_rate
            else "its trial's fastest rank's rate (no one-rank run in this sweep)")
    fig.suptitle(f"each rank's median step: compute (its FLOPs at {rate}), waiting (load "
                 "imbalance), communication (the rest, exposed)", fontsize=9, y=0.99)
    fig.legend(loc="upper center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, 0.955))
    fig.tight_layout(rect=(0, 0, 1, 0.9))
    return fig


def _one_rank_rate(ok: list[RunRecord]) -> float | None:
    """FLOP/s of the sweep's one-rank runs (median), the rate compute is measured against."""
    rates = [r.metrics["attn_tflops"] * 1e12 for r in ok
             if _int(r, "plan.world") == 1 and r.metrics.get("attn_tflops")]
    return statistics.median(rates) if rates else None


def figures(runs: list[RunRecord],
            details: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The plots these runs support: name -> matplotlib Figure. `details` (run id -> the trial's
    per_rank.json) adds the per-rank breakdown."""
    figs: dict[str, Any] = {}
    ok = [r for r in runs if r.status == "FINISHED"]
    errs = [r for r in ok if "err_max" in r.metrics]
    if errs:
        figs["accuracy_vs_world"] = _accuracy_figure(errs)
        ok = [r for r in ok if "err_max" not in r.metrics]  # one pass each: no timing plots
    if len({_int(r, "workload.seq_len") for r in ok}) > 1:
        figs["throughput_vs_seq_len"] = _vs_seq_len(ok, "tokens_per_s", "throughput (p10-p90 band)",
                                                    "tokens/s")
        figs["memory_vs_seq_len"] = _vs_seq_len(ok, "peak_mem_bytes", "peak memory per rank",
                                                "MiB", 1 / 2**20, mark=False)
    points = _scaling_points(ok)
    if points:
        figs["scaling_vs_world"] = _scaling_figure(points)
    if any(k.startswith("bytes_") for r in ok for k in r.metrics):
        figs["bytes_by_link"] = _bytes_by_link(ok)
    analytic = [r for r in ok if "bytes_analytic_per_rank" in r.metrics and "bytes_total" in r.metrics
                and _int(r, "plan.world") > 1]
    if analytic:
        figs["bytes_measured_vs_analytic"] = _bytes_vs_analytic(analytic)
    if details:
        rate = _one_rank_rate(ok)
        ordered = sorted(ok, key=lambda r: (_algorithm(r), _sort_key(r)))
        items = [(r, parts) for r in ordered if r.run_id in details
                 for parts in [rank_breakdown(details[r.run_id], rate)] if parts]
        if items:
            figs["per_rank_breakdown"] = _per_rank_figure(items[:12], rate is not None)
    docs = [r for r in ok if documents(r) is not None and "load_imbalance" in r.metrics]
    if docs:
        figs["varlen_balance"] = _varlen_figure(docs)
    if any(window(r) is not None for r in ok):
        savings = window_savings(ok)
        if savings:
            figs["window_savings"] = _window_figure(savings)
    train = [r for r in ok if "train.model" in r.params]
    if train:  # model training trials: what each configuration keeps and what it costs
        import matplotlib.pyplot as plt

        figs["train_memory_and_time"] = _train_figure(plt, train)
    return figs


# ------------------------------------------------------- documents, windows, accuracy (issue 12)
TENSORS = ("out", "dq", "dk", "dv")
DTYPE_ORDER = ("float64", "float32", "float16", "bfloat16")
LAYOUT_HATCH = {"contiguous": "", "zigzag": "///", "stripe": "..."}


def accuracy_series(runs: list[RunRecord]) -> dict[tuple[str, str], list[tuple[int, RunRecord]]]:
    """(dtype, algorithm) -> (world, run) sorted by world; the one-process kernel (`local`, world
    1) starts every algorithm's series of its dtype: world 1 is where every algorithm begins."""
    local = {r.params.get("workload.dtype", ""): r for r in runs if _algorithm(r) == "local"}
    out: dict[tuple[str, str], dict[int, RunRecord]] = defaultdict(dict)
    for r in runs:
        if _algorithm(r) == "local":
            continue
        dt, p = r.params.get("workload.dtype", ""), _int(r, "plan.world")
        key = (dt, _algorithm(r))
        if p not in out[key] or r.metrics["err_max"] > out[key][p].metrics["err_max"]:
            out[key][p] = r  # two configurations at one world: the worse one
        if dt in local:
            out[key].setdefault(1, local[dt])
    return {k: sorted(v.items(), key=lambda t: t[0]) for k, v in out.items()}


def _accuracy_figure(runs: list[RunRecord]) -> Any:
    """Relative error against float64 vs world size, one line per algorithm: a row per dtype, a
    column per tensor (out, dq, dk, dv)."""
    from seqpar.sweeps import style

    dtypes = sorted({r.params.get("workload.dtype", "") for r in runs},
                    key=lambda d: DTYPE_ORDER.index(d) if d in DTYPE_ORDER else 9)
    series = accuracy_series(runs)
    fig, axes = style.new_figure(3.2 * len(TENSORS), 3.0 * len(dtypes) + 0.9, ncols=len(TENSORS),
                                 nrows=len(dtypes))
    worlds = sorted({_int(r, "plan.world") for r in runs})
    for i, dt in enumerate(dtypes):
        row_limits = style.decades([r.metrics[f"err_{n}"] for r in runs for n in TENSORS
                                    if r.params.get("workload.dtype") == dt])
        for j, name in enumerate(TENSORS):
            ax = axes[i][j]
            for (d, algo), pts in sorted(series.items()):
                if d != dt:
                    continue
                ax.plot([p for p, _ in pts], [r.metrics[f"err_{name}"] for _, r in pts],
                        marker="o", ms=3.5, color=style.colour(algo), label=algo)
            base = [r for r in runs if _algorithm(r) == "local" and
                    r.params.get("workload.dtype") == dt]
            if base:
                ax.scatter([1], [base[0].metrics[f"err_{name}"]], marker="*", s=110, zorder=5,
                           color=style.colour("local"), label="local (one process)")
            ax.set_yscale("log")
            ax.set_ylim(*row_limits)
            style.world_axis(ax, worlds)
            ax.set_title(f"{name}, {dt}", fontsize=9)
            if j == 0:
                ax.set_ylabel("max |x - ref| / max |ref|")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle("error against a float64 single-process reference on the same inputs "
                 "(fixed seed), by world size", fontsize=10, y=0.995)
    fig.legend(handles, labels, loc="upper center", ncol=min(8, len(labels)), fontsize=8,
               bbox_to_anchor=(0.5, 0.965))
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    return fig


def _documents_title(r: RunRecord) -> str:
    """The documents of a run, in words: count, and the drawn lengths' range."""
    n = _int(r, "workload.seq_len")
    count = _param(r, "workload.documents.count")
    if count is None:
        return f"N={style_tokens(n)}, {documents(r)} documents"
    from seqpar.experiments.documents import draw_lengths

    lengths = draw_lengths(n, int(count), float(r.params["workload.documents.spread"]),
                           int(r.params["workload.documents.seed"]))
    return (f"N={style_tokens(n)}, {documents(r)}: lengths {min(lengths)}..{max(lengths)}, "
            f"longest {max(lengths) / statistics.median(lengths):.1f}x the median")


def _varlen_figure(runs: list[RunRecord]) -> Any:
    """Per trial (algorithm x layout): tokens/s with what equal work would give, and the load
    imbalance (max/mean FLOPs over ranks) beside the ideal 1.0."""
    from seqpar.sweeps import style

    rs = sorted(runs, key=lambda r: (_int(r, "plan.world") > 1, _algorithm(r),
                                     list(LAYOUT_HATCH).index(r.params.get("plan.layout", "zigzag"))
                                     if r.params.get("plan.layout") in LAYOUT_HATCH else 9))
    fig, axes = style.new_figure(11, max(3.0, 0.3 * len(rs) + 1.6), ncols=2)
    a1, a2 = axes[0]
    y = list(range(len(rs)))
    colours = [style.colour(_algorithm(r)) for r in rs]
    hatches = [LAYOUT_HATCH.get(r.params.get("plan.layout", ""), "") for r in rs]
    tps = [r.metrics["tokens_per_s"] for r in rs]
    imb = [r.metrics["load_imbalance"] for r in rs]
    for ax, values in ((a1, tps), (a2, imb)):
        for yi, v, c, h in zip(y, values, colours, hatches, strict=True):
            ax.barh(yi, v, color=c, hatch=h, edgecolor="white", lw=0)
    a1.scatter([t * i for t, i in zip(tps, imb, strict=True)], y, marker="|", s=160, color="k",
               zorder=5, label="equal work (tokens/s x max/mean: the ranks' mean FLOPs at the "
                               "measured pace)")
    over = [(t, yi) for t, yi, r in zip(tps, y, rs, strict=True) if oversubscribed(r)]
    style.mark_oversubscribed(a1, [t for t, _ in over], [yi for _, yi in over], True)
    a2.axvline(1.0, color="k", ls="--", lw=0.9, label="ideal (equal work)")
    for yi, v in zip(y, imb, strict=True):
        a2.text(v, yi, f" {v:.3f}", va="center", fontsize=7)
    a1.set_yticks(y, [f"{config(r)} P={r.params.get('plan.world')} "
                      f"{r.params.get('plan.layout', '')}" for r in rs], fontsize=7)
    a2.set_yticks(y, [""] * len(y))
    for ax in (a1, a2):
        ax.invert_yaxis()
    a1.set(xlabel="tokens/s", title="throughput")
    a2.set(xlabel="max / mean attention FLOPs over ranks", title="load imbalance",
           xlim=(0, max(imb) * 1.15))
    handles = [h for ax in (a1, a2) for h in ax.get_legend_handles_labels()[0]]
    labels = [lab for ax in (a1, a2) for lab in ax.get_legend_handles_labels()[1]]
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7)  # the bars fill the panels
    fig.suptitle(f"packed documents, {_documents_title(rs[0])} (hatch: layout; contiguous "
                 "plain, zigzag ///, stripe ...)", fontsize=9)
    fig.tight_layout(rect=(0, 0.45 / fig.get_figheight(), 1, 1))
    return fig


WINDOW_METRICS = (("step_ms", "step time"), ("attn_flops", "attention FLOPs"),
                  ("bytes_total", "bytes sent"))


def window_savings(runs: list[RunRecord]) -> dict[str, list[tuple[int, dict[str, float], RunRecord]]]:
    """label -> (W, {metric: windowed / full causal}, run) per configuration that has both a
    full-causal run (no window) and windowed ones, sorted by W."""
    def key(r: RunRecord) -> tuple:
        return (config(r), _int(r, "plan.world"), r.params.get("plan.layout"),
                _int(r, "workload.seq_len"), r.params.get("workload.dtype"),
                r.params.get("model.kv_heads"), documents(r))

    full = {key(r): r for r in runs if window(r) is None}
    out: dict[str, list[tuple[int, dict[str, float], RunRecord]]] = defaultdict(list)
    for r in runs:
        base = full.get(key(r))
        w = window(r)
        if w is None or base is None:
            continue
        ratios = {m: r.metrics[m] / base.metrics[m] for m, _ in WINDOW_METRICS
                  if base.metrics.get(m) and m in r.metrics}
        label = f"{config(r)} P={r.params.get('plan.world')} {r.params.get('plan.layout', '')}"
        out[label].append((w, ratios, r))
    return {k: sorted(v, key=lambda t: t[0]) for k, v in out.items()}


def visible_fraction(seq_len: int, w: int) -> float:
    """Visible (query, key) pairs of a causal window W over causal attention, one document
    (`layouts.Relation.pairs`: the relation's own count)."""
    import torch

    from seqpar.algorithms import layouts

    t = torch.arange(seq_len)
    return layouts.Relation(True, None, w).pairs(t, t) / layouts.Relation(True).pairs(t, t)


def _window_figure(savings: dict[str, list[tuple[int, dict[str, float], RunRecord]]]) -> Any:
    """Step time, FLOPs and bytes of each window as a fraction of full causal, against W, with
    the visible-pair fraction (what a kernel that skips everything invisible needs)."""
    from seqpar.sweeps import style

    fig, axes = style.new_figure(13, 4.3, ncols=len(WINDOW_METRICS))
    styles = _line_styles(sorted(savings))
    windows = sorted({w for pts in savings.values() for w, _, _ in pts})
    lengths = sorted({_int(r, "workload.seq_len") for pts in savings.values() for _, _, r in pts})
    for ax, (metric, title) in zip(axes[0], WINDOW_METRICS, strict=True):
        for label in sorted(savings):
            pts = [(w, ratios[metric]) for w, ratios, _ in savings[label] if metric in ratios]
            if pts:
                ax.plot([w for w, _ in pts], [v for _, v in pts], marker="o", ls=styles[label],
                        color=style.colour(label.split(" ")[0]), label=label)
        if len(lengths) == 1 and metric != "bytes_total":  # what the kernels cannot skip
            ax.plot(windows, [visible_fraction(lengths[0], w) for w in windows], color="k",
                    ls="--", lw=0.9, label="visible pairs / causal pairs")
        ax.axhline(1.0, color="#888888", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(windows, [style_tokens(w) for w in windows])
        ax.minorticks_off()
        ax.set(xlabel="window W (tokens)", title=f"{title}, windowed / full causal",
               ylim=(0, None))
    axes[0][0].set_ylabel("fraction of full causal (1 - saved)")
    axes[0][0].legend(fontsize=7, loc="best")
    n = f"N={style_tokens(lengths[0])}" if len(lengths) == 1 else ""
    fig.suptitle(f"sliding window against full causal {n}".strip(), fontsize=10)
    fig.tight_layout()
    return fig


def _train_bits(r: RunRecord) -> str:
    p = r.params
    ckpt = p.get("train.checkpoint", "")
    if "sequence" in ckpt:
        ckpt += f"({p.get('train.seq_fraction')})"
    head = " fused-head" if str(p.get("train.fused_head")) == "True" else ""
    vocab = p.get("train.vocab")
    vocab = f" V={vocab}" if vocab not in (None, "", "None") else ""
    return (f"SP={_int(r, 'plan.world') // max(_int(r, 'train.dp'), 1)} DP={p.get('train.dp')} "
            f"ckpt={ckpt}{head}{vocab}")


def _train_label(r: RunRecord) -> str:
    return f"{config(r)} N={r.params.get('workload.seq_len')}"


def _train_figure(plt: Any, runs: list[RunRecord]) -> Any:
    """Activation and peak bytes, and step time, per training configuration (horizontal bars)."""
    labels = [_train_label(r) for r in runs]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, max(3.0, 0.35 * len(runs) + 1.5)), sharey=True)
    y = range(len(runs))
    a1.barh([i + 0.2 for i in y], [r.metrics.get("peak_mem_bytes", 0) / 2**20 for r in runs],
            height=0.4, label="peak (RSS high-water)")
    a1.barh([i - 0.2 for i in y], [r.metrics.get("activation_bytes", 0) / 2**20 for r in runs],
            height=0.4, label="kept for backward")
    a1.set(xlabel="MiB per rank", title="memory")
    a1.set_yticks(list(y), labels, fontsize=6)
    a1.legend(fontsize=7)
    a2.barh(list(y), [r.metrics.get("step_ms", 0) for r in runs])
    a2.set(xlabel="step ms (slowest rank, median)", title="time")
    fig.tight_layout()
    return fig


def per_rank_details(tracker: Tracker, runs: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """run id -> per_rank.json of each finished multi-rank trial (downloaded from the store)."""
    import json
    import tempfile

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in runs:
            if r.status != "FINISHED" or _int(r, "plan.world") < 2:
                continue
            try:
                path = tracker.download(r.run_id, "per_rank.json", Path(tmp) / r.run_id)
                out[r.run_id] = json.loads(path.read_text())
            except Exception:  # an older run or an unreachable artifact store: no breakdown
                continue
    return out


# ------------------------------------------------------------------------------ sweep summary
def headline_metrics(runs: list[RunRecord], metric: str) -> dict[str, float]:
    """The best finished trial's metric (`best.<metric>`) and each algorithm's best
    (`<algorithm>.<metric>`), for the sweep's parent run."""
    ok = [r for r in runs if r.status == "FINISHED" and metric in r.metrics]
    pick = max if higher_is_better(metric) else min
    out: dict[str, float] = {}
    if ok:
        out[f"best.{metric}"] = pick(r.metrics[metric] for r in ok)
    for algo in sorted({_algorithm(r) for r in ok}):
        out[f"{algo}.{metric}"] = pick(r.metrics[metric] for r in ok if _algorithm(r) == algo)
    return out


def best_run(runs: list[RunRecord], metric: str) -> RunRecord | None:
    ok = [r for r in runs if r.status == "FINISHED" and metric in r.metrics]
    if not ok:
        return None
    return (max if higher_is_better(metric) else min)(ok, key=lambda r: r.metrics[metric])


def log_summary(tracker: Tracker, sweep_id: str) -> list[str]:
    """Everything the sweep's parent run shows in the MLflow UI: headline metrics, the comparison
    table (a sortable MLflow table), the figures, and the self-contained HTML report."""
    import matplotlib.pyplot as plt

    from seqpar.sweeps import html

    record = tracker.sweep(sweep_id)
    runs = tracker.trials(sweep_id)
    metric = record.tags.get("seqpar.headline") or "tokens_per_s"
    tracker.log_metrics(sweep_id, headline_metrics(runs, metric))
    best = best_run(runs, metric)
    if best is not None:
        tracker.set_tags(sweep_id, {"seqpar.best_trial": best.name, "seqpar.best_run_id": best.run_id})
    cmp = comparison(tracker, sweep=sweep_id, metric=metric)
    tracker.log_table(sweep_id, cmp.columns, cmp.rows, "comparison.json")
    figs = figures(runs, per_rank_details(tracker, runs))
    for name, fig in figs.items():
        tracker.log_figure(sweep_id, fig, f"plots/{name}.png")
    page = html.render(tracker, sweep_id, cmp=cmp, figs=figs)
    for fig in figs.values():
        plt.close(fig)
    tracker.log_text(sweep_id, page, "report.html")
    return list(figs)


def log_plots(tracker: Tracker, sweep_id: str) -> list[str]:
    """The parent run's summary (kept under its old name for callers)."""
    return log_summary(tracker, sweep_id)
