"""`seqpar tune`: every valid configuration for a world size, profiled and ranked (WallFacer Eq. 11)."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import console, display_table


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
        "--prune", help="Profile only the K configurations the cost model ranks fastest.")] = None,
    cluster: Annotated[str, typer.Option(
        "--cluster", help="Cost-model cluster for --prune: cpu | a100-ib | h100-ib.")] = "cpu",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the tuning space only.")] = False,
) -> None:
    """Profile every valid (algorithm, options, layout) for this world and rank by tokens/s."""
    from seqpar.cli.sweep import execute
    from seqpar.sweeps.tune import tuning_plan

    plan = tuning_plan(world, model, seq_len, nodes, iters=iters, device=device, prune=prune,
                       cluster=cluster, dtype=dtype or ("bfloat16" if device == "cuda" else "float32"))
    console.print(f"tuning space: {len(plan.points)} point(s), {len(plan.trials)} valid")
    sweep_id = execute(plan, resume=None, dry_run=dry_run, retries=0, strict=False,
            again=f"seqpar tune -P {world} --model {model} --seq-len {seq_len} --nodes {nodes}")
    if sweep_id is not None:
        _ranking(sweep_id)


def _ranking(sweep_id: str) -> None:
    from seqpar.cli import options
    from seqpar.sweeps import report

    cmp = report.comparison(options.tracker(), sweep=sweep_id, metric="tokens_per_s")
    col = cmp.columns.index("tokens/s")

    def tps(row: list) -> float:
        return float(row[col].replace(",", "")) if row[col] != "-" else -1.0

    ranked = sorted(cmp.rows, key=tps, reverse=True)
    display_table("tuning ranking: arg max tokens/s (WallFacer Eq. 11)", ["rank", *cmp.columns],
                  [[i + 1, *r] for i, r in enumerate(ranked)], highlight_row=0)
