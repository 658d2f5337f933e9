"""`seqpar plan`: every valid configuration ranked by the performance model on a cluster."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from seqpar.cli.display import console, display_table


def plan(
    cluster: Annotated[str, typer.Option("--cluster", help="A cluster preset (loongtrain-a100, "
                                         "burst-a800, wallfacer-h100, ..., local) or a YAML file.")
                       ] = "local",
    model: Annotated[str, typer.Option("--model", help="llama2-7b, llama3-8b, 14b, tiny, ...")
                     ] = "llama2-7b",
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens in the sequence.")] = 131072,
    world: Annotated[int, typer.Option("--world", "-P", help="Ranks in the group.")] = 8,
    nodes: Annotated[int | None, typer.Option(
        "--nodes", help="Nodes the ranks span (default: world / GPUs per node).")] = None,
    scope: Annotated[str, typer.Option(help="attention (one layer fwd+bwd) | model (a step)")
                     ] = "attention",
    dtype: Annotated[str, typer.Option(help="bfloat16 | float32 | ...")] = "bfloat16",
    top: Annotated[int, typer.Option("--top", help="Rows in the table.")] = 20,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    validate: Annotated[str | None, typer.Option(
        "--validate", help="A finished sweep's id: predicted vs measured per trial.")] = None,
    max_seq: Annotated[bool, typer.Option(
        "--max-seq", help="Per configuration, the longest sequence that fits in the device's "
        "memory (--seq-len is ignored).")] = False,
) -> None:
    """Rank every valid configuration by predicted time; the longest sequence each fits
    (--max-seq); or --validate a finished sweep."""
    from seqpar.experiments import clusters
    from seqpar.experiments.perf import plan as perf_plan

    c = clusters.load(cluster)
    if validate is not None:
        _validate(validate, c, as_json)
        return
    from seqpar import algorithms
    from seqpar.sweeps.tune import option_space

    nodes = nodes or max(1, -(-world // c.gpus_per_node))
    space = [(name, opts) for name in algorithms.REGISTRY if (name == "local") == (world == 1)
             for opts in option_space(name, world)]
    if max_seq:
        _max_seq(c, model, world, space, nodes, scope, dtype, top, as_json)
        return
    ranked = perf_plan.rank(c, model, seq_len, world, space, nodes=nodes, scope=scope, dtype=dtype)
    if as_json:
        print(json.dumps({"cluster": c.name, "configs": [p.json() for p in ranked]}, indent=1))
        return
    groups = perf_plan.equivalents(ranked)
    model_scope = scope == "model"
    columns = ["#", "algorithm", "options", "layout", "attn\nms",
               *(["step\nms", "MFU"] * model_scope), "compute\nms", "exposed\nintra ms",
               "exposed\ninter ms", "MB\nintra", "MB\ninter", "mem\nGB", "bound"]
    rows = []
    for i, group in enumerate(groups[:top]):
        p = group[0]
        options, layouts = _describe(group)
        rows.append([i + 1 if p.fits else "no fit", p.algorithm, options, layouts,
                     f"{p.attention_ms:.2f}",
                     *([f"{p.step_ms:.1f}", f"{100 * p.mfu:.1f}%"] if model_scope else []),
                     f"{p.compute_ms:.2f}", f"{p.exposed_ms['intra']:.2f}",
                     f"{p.exposed_ms['inter']:.2f}", f"{p.bytes_intra / 1e6:.1f}",
                     f"{p.bytes_inter / 1e6:.1f}", f"{p.peak_mem_bytes / 1e9:.2f}",
                     p.bottleneck.replace(" communication", "")])
    display_table(f"{model} N={seq_len} P={world} on {c.name} ({nodes} node(s)), scope {scope}",
                  columns, rows, highlight_row=0, compact=True, wrap=("options", "layout"))
    unfit = sum(not p.fits for p in ranked)
    console.print(f"{len(ranked)} configurations in {len(groups)} rows (a row: configurations "
                  f"with identical predictions; --json lists each), {unfit} do not fit in "
                  f"{c.memory_gb:g} GB")


def _max_seq(c, model: str, world: int, space: list, nodes: int, scope: str, dtype: str,
             top: int, as_json: bool) -> None:
    from seqpar.experiments.perf.maxseq import max_seq

    found = max_seq(c, model, world, space, nodes=nodes, scope=scope, dtype=dtype)
    if as_json:
        print(json.dumps({"cluster": c.name, "memory_gb": c.memory_gb,
                          "configs": [r.json() for r in found]}, indent=1))
        return
    groups: dict[tuple, list] = {}
    for r in found:
        groups.setdefault((r.algorithm, r.max_tokens, r.peak_mem_bytes), []).append(r)
    rows = []
    for i, group in enumerate(list(groups.values())[:top]):
        r = group[0]
        options, layouts = _describe(group)
        rows.append([i + 1, r.algorithm, options, layouts,
                     f"{r.max_tokens:,}" if r.max_tokens else "none fits",
                     f"{r.max_tokens / 2**20:.2f}M" if r.max_tokens else "-",
                     f"{r.peak_mem_bytes / 1e9:.2f}"])
    display_table(f"longest sequence that fits: {model} P={world} on {c.name} ({nodes} node(s), "
                  f"{c.memory_gb:g} GB), scope {scope}",
                  ["#", "algorithm", "options", "layout", "max tokens", "Mi tokens", "mem GB at it"],
                  rows,
                  highlight_row=0, compact=True, wrap=("options", "layout"))
    console.print(f"{len(found)} configurations in {len(groups)} rows; lengths are multiples of "
                  "each configuration's granularity (--json)")


SHORT = {"head-first": "hf", "context-first": "cf", "collective-intra": "coll",
         "p2p-intra": "p2p", "contiguous": "contig"}
KEYS = {"inner_ring": "ring", "team_size": "C", "checkpoint": "", "placement": ""}
LAYOUTS = ("contiguous", "zigzag", "stripe")


def _describe(group: list) -> tuple[str, str]:
    """(options, layouts) of configurations with identical predictions: each option's values
    joined by '|' (with how many configurations when they are not every combination)."""
    configs = [{**{k: v for k, v in p.options.items() if k != "dcp" and v is not None},
                "layout": p.layout} for p in group]
    values: dict[str, list] = {}
    for c in configs:
        for k, v in c.items():
            values.setdefault(k, [])
            if v not in values[k]:
                values[k].append(v)
    combinations = 1
    for v in values.values():
        combinations *= len(v)
    layouts = values.pop("layout")
    opts = " ".join(_option(k, v) for k, v in values.items())
    if combinations != len(configs):
        opts += f" ({len(configs)} of these)"
    shown = "any" if set(layouts) == set(LAYOUTS) else "|".join(SHORT.get(x, x) for x in layouts)
    return opts, shown


def _option(key: str, values: list) -> str:
    text = "|".join(str(SHORT.get(v, v)) for v in values)
    name = KEYS.get(key, key)
    return f"{name}={text}" if name else text


def _memory_cell(pair: tuple[float, float] | None) -> str:
    if pair is None:
        return ""
    predicted, measured = pair
    error = f" ({100 * (predicted - measured) / measured:+.0f}%)" if measured else ""
    return f"{predicted / 1e6:.2f}/{measured / 1e6:.2f}{error}"


def _validate(sweep_id: str, cluster, as_json: bool) -> None:
    from seqpar.cli import options
    from seqpar.experiments.perf import plan as perf_plan

    tracker = options.tracker()
    checks = perf_plan.validate(((t.params, t.metrics) for t in tracker.trials(sweep_id)), cluster)
    s = perf_plan.summary(checks)
    memory = [k for k in ("state_bytes", "activation_bytes") if any(k in c.memory for c in checks)]
    rows = [[c.label, f"{c.measured_ms:.2f}", f"{c.predicted_ms:.2f}", f"{100 * c.error:+.1f}%",
             *(_memory_cell(c.memory.get(k)) for k in memory)]
            for c in sorted(checks, key=lambda c: c.measured_ms)]
    if as_json:
        print(json.dumps({"cluster": cluster.name, "summary": s, "trials": [
            {"label": c.label, "measured_ms": c.measured_ms, "predicted_ms": c.predicted_ms,
             **{k: {"predicted": v[0], "measured": v[1]} for k, v in c.memory.items()}}
            for c in checks]}, indent=1))
        return
    display_table(f"sweep {sweep_id} on {cluster.name}: predicted vs measured step",
                  ["trial", "measured ms", "predicted ms", "error",
                   *(f"{k.split('_')[0]}s MB pred/meas" for k in memory)], rows)
    if s["trials"]:
        console.print(f"median |error| {100 * s['median_abs_error']:.1f}% over {s['trials']} trials")
        for group, regret in s["regret"].items():
            console.print(f"  {group}: predicted best {s['predicted_best'][group]} is "
                          f"{100 * regret:.1f}% off the measured best")
