"""`seqpar tune`: every valid configuration for a world size, profiled and ranked (WallFacer Eq. 11)."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli import options
from seqpar.cli.display import console, display_table
from seqpar.cli.sweep import execute
from seqpar.planner import clusters
from seqpar.planner import plan as perf_plan
from seqpar.planner.search import check_counts


def tune(
    world: Annotated[int, typer.Option("--world", "-P", help="Ranks in the group.")] = 4,
    model: Annotated[str, typer.Option("--model", help="A model preset: tiny, tiny-gqa, "
                                                       "llama2-7b, llama3-8b, ...")] = "tiny",
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens in the sequence.")] = 2048,
    nodes: Annotated[int, typer.Option("--nodes", help="Nodes the ranks span (virtual here).")] = 1,
    iters: Annotated[int, typer.Option("--iters", min=1, help="Timed iterations per "
                                                              "configuration.")] = 2,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto.")] = "cpu",
    dtype: Annotated[str | None, typer.Option(
        help="float32 | bfloat16 | ...; default bfloat16 on cuda, float32 on cpu.")] = None,
    prune: Annotated[int | None, typer.Option(
        "--prune", help="Profile only the K configurations the performance model ranks fastest.")
    ] = None,
    cluster: Annotated[str, typer.Option(
        "--cluster", help="Performance-model cluster for --prune and the predicted column: local "
                          "(this machine, measured), loongtrain-a100, ... or a YAML file.")] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the tuning space only.")] = False,
) -> None:
    """Profile every valid (algorithm, options, layout) for this world and rank by tokens/s."""
    from seqpar.sweeps.tune import tuning_plan  # torch: not for --help

    check_counts(nodes=nodes)  # the rest are a sweep's fields, refused by name when the plan is made

    plan = tuning_plan(world, model, seq_len, nodes, iters=iters, device=device, prune=prune,
                       cluster=cluster, dtype=dtype or ("bfloat16" if device == "cuda" else "float32"))
    console.print(f"tuning space: {len(plan.points)} point(s), {len(plan.trials)} valid")
    sweep_id = execute(plan, resume=None, dry_run=dry_run, retries=0, strict=False,
            again=f"seqpar tune -P {world} --model {model} --seq-len {seq_len} --nodes {nodes}")
    if sweep_id is not None:
        _ranking(sweep_id, cluster)


def _ranking(sweep_id: str, cluster: str = "local") -> None:
    """Measured ranking by tokens/s, with the performance model's prediction next to each."""
    from seqpar.experiments.spec import specs_of

    trials = [t for t in options.tracker().trials(sweep_id) if "tokens_per_s" in t.metrics]
    checks = perf_plan.validate(specs_of((t.params, t.metrics) for t in trials),
                                clusters.load(cluster))
    predicted = {c.label: c.predicted_ms for c in checks}
    rows = []
    for t in sorted(trials, key=lambda t: -t.metrics["tokens_per_s"]):
        pred = predicted.get(t.name)
        rows.append([t.name, f"{t.metrics['step_ms']:.2f}", "-" if pred is None else f"{pred:.2f}",
                     f"{t.metrics['tokens_per_s']:,.0f}"])
    display_table(f"tuning ranking: arg max tokens/s (WallFacer Eq. 11), predicted on {cluster}",
                  ["rank", "configuration", "measured ms", "predicted ms", "tokens/s"],
                  [[i + 1, *r] for i, r in enumerate(rows)], highlight_row=0)
    s = perf_plan.summary(checks)
    if s["trials"]:
        console.print(f"model: median |error| {100 * s['median_abs_error']:.1f}%; its pick is "
                      f"{100 * s['max_regret']:.1f}% off the measured best")
