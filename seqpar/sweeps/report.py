"""Tables and plots from MLflow runs (read back from the store, never from memory).

`comparison` builds the rows `seqpar compare` prints (the best run by the metric highlighted);
`log_plots` draws the sweep's PNGs (throughput and memory vs seq_len, speed-up and efficiency vs
world, bytes by link) and logs them as artifacts of the sweep's parent run.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from seqpar.errors import ConfigError
from seqpar.platform.tracking import RunRecord, Tracker

LOWER_IS_BETTER = ("step_ms", "fwd_ms", "bwd_ms", "peak_mem", "bytes", "load_imbalance", "setup_s",
                   "run_s", "activation_bytes", "recomputed_flops")


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
            config(run), run.params.get("plan.layout", ""))


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
    # local at the same (N, H, Hkv) is the baseline for the speed-up column
    local = {(_int(r, "workload.seq_len"), _int(r, "model.heads"), _int(r, "model.kv_heads")):
             r.metrics.get("tokens_per_s") for r in runs
             if r.params.get("plan.algorithm") == "local" and r.status == "FINISHED"}
    columns = ["algorithm", "P", "nodes", "layout", "N", "H/Hkv", "step ms", "tokens/s",
               "x local", "peak MiB", "MB sent", "imbalance", "status"]
    inter = any(r.metrics.get("bytes_inter", 0) > 0 for r in runs)  # the plan spans nodes
    if inter:
        columns.insert(columns.index("MB sent") + 1, "MB inter")
    extra = metric not in ("step_ms", "tokens_per_s", "peak_mem_bytes", "bytes_total",
                           "load_imbalance", "bytes_inter")
    if extra:
        columns.insert(-1, metric)
    rows, scores = [], []
    for r in runs:
        m = r.metrics
        base = local.get((_int(r, "workload.seq_len"), _int(r, "model.heads"),
                          _int(r, "model.kv_heads")))
        row = [config(r), r.params.get("plan.world"), r.params.get("plan.nodes"),
               r.params.get("plan.layout"), r.params.get("workload.seq_len"),
               f"{r.params.get('model.heads')}/{r.params.get('model.kv_heads')}",
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
    return Comparison(f"{title}: best by {metric} ({direction} is better)", columns, rows, best,
                      metric)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


# ------------------------------------------------------------------------------------- plots
def _series(runs: list[RunRecord], x_key: str, metric: str) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in runs:
        if r.status == "FINISHED" and metric in r.metrics:
            label = f"{config(r)} P={r.params.get('plan.world')}" if x_key != "plan.world" \
                else config(r)
            out[label].append((_int(r, x_key), r.metrics[metric]))
    return {k: sorted(v) for k, v in out.items()}


def scaling_series(ok: list[RunRecord]) -> dict[str, list[tuple[int, float]]]:
    """Speed-up over a one-rank run (local preferred) per configuration: against the run at the
    same N (strong scaling) or at N/P (weak scaling); only series with two world sizes or more."""
    base: dict[int, float] = {}
    for r in ok:
        n = _int(r, "workload.seq_len")
        if _int(r, "plan.world") == 1 and (n not in base or r.params.get("plan.algorithm") == "local"):
            base[n] = r.metrics["tokens_per_s"]
    series: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in ok:
        p, n = _int(r, "plan.world"), _int(r, "workload.seq_len")
        tps = r.metrics["tokens_per_s"]
        if n in base:
            series[f"{config(r)} N={n}"].append((p, tps / base[n]))
        if p and n % p == 0 and n // p in base and (p == 1 or n not in base):
            series[f"{config(r)} N/P={n // p}"].append((p, tps / base[n // p]))
    return {k: sorted(v) for k, v in series.items() if len({p for p, _ in v}) >= 2}


def figures(runs: list[RunRecord]) -> dict[str, Any]:
    """The plots these runs support: name -> matplotlib Figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs: dict[str, Any] = {}
    ok = [r for r in runs if r.status == "FINISHED"]
    if len({_int(r, "workload.seq_len") for r in ok}) > 1:
        for metric, name, ylabel in (("tokens_per_s", "throughput_vs_seq_len", "tokens/s"),
                                     ("peak_mem_bytes", "memory_vs_seq_len", "peak bytes per rank")):
            fig, ax = plt.subplots(figsize=(7, 4.5))
            for label, pts in _series(ok, "workload.seq_len", metric).items():
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
            ax.set(xlabel="seq_len (tokens)", ylabel=ylabel, xscale="log", title=name)
            ax.legend(fontsize=7)
            figs[name] = fig
    series = scaling_series(ok)
    if series:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.5))
        top = max(p for pts in series.values() for p, _ in pts)
        a1.plot([1, top], [1, top], "k--", lw=0.8, label="ideal")
        a2.axhline(1.0, color="k", ls="--", lw=0.8)
        for label, pts in series.items():
            a1.plot([p for p, _ in pts], [s for _, s in pts], marker="o", label=label)
            a2.plot([p for p, _ in pts], [s / p for p, s in pts], marker="o", label=label)
        a1.set(xlabel="world", ylabel="speed-up over one rank", title="speed-up")
        a2.set(xlabel="world", ylabel="efficiency = speed-up / world", title="parallel efficiency")
        a1.legend(fontsize=7)
        figs["scaling_vs_world"] = fig
    if any(k.startswith("bytes_") for r in ok for k in r.metrics):
        fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(ok)), 4.5))
        labels = [f"{config(r)} P={r.params.get('plan.world')} {r.params.get('plan.layout')} "
                  f"N={r.params.get('workload.seq_len')} Hkv={r.params.get('model.kv_heads')}"
                  for r in ok]
        intra = [r.metrics.get("bytes_intra", 0) / 1e6 for r in ok]
        inter = [r.metrics.get("bytes_inter", 0) / 1e6 for r in ok]
        ax.bar(labels, intra, label="intra-node")
        ax.bar(labels, inter, bottom=intra, label="inter-node")
        ax.set(ylabel="MB sent per step (all ranks)", title="bytes by link")
        ax.tick_params(axis="x", rotation=75, labelsize=6)
        ax.legend()
        fig.tight_layout()
        figs["bytes_by_link"] = fig
    train = [r for r in ok if "train.model" in r.params]
    if train:  # model training trials (issue 10): what each configuration keeps and what it costs
        figs["train_memory_and_time"] = _train_figure(plt, train)
    return figs


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


def log_plots(tracker: Tracker, sweep_id: str) -> list[str]:
    import matplotlib.pyplot as plt

    names = []
    for name, fig in figures(tracker.trials(sweep_id)).items():
        tracker.log_figure(sweep_id, fig, f"plots/{name}.png")
        plt.close(fig)
        names.append(name)
    return names
