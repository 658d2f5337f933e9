"""`seqpar cluster status`: the Ray cluster's nodes (CPUs, GPUs, memory), the running gangs and each
running sweep's progress (trials done of the total, trials a minute and the time left, the trial in
flight, its ranks' phases and
iterations: the state API and the metrics, platform.dashboard.sweep_progress)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from seqpar.cli.display import console, display_table
from seqpar.cli.options import Settings
from seqpar.platform import cluster, connection

app = typer.Typer(name="cluster", no_args_is_help=True, help="The Ray cluster seqpar runs on.")


@app.command("status")
def status(
    ctx: typer.Context,
    address: Annotated[str | None, typer.Option(
        help="Ray cluster to ask: 'auto' (the one `ray start` began here), 'host:6379' or "
             "'ray://host:10001'; default: `seqpar --address`, else 'auto'.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Nodes with their CPUs/GPUs, the seqpar gangs (rank actors by gang id) and the running
    sweeps' progress."""
    address = address or Settings.of(ctx).address or "auto"
    conn = connection.connect(address, ship_code=False)
    try:
        info = cluster.status()
    finally:
        conn.close()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    nodes = info["nodes"]
    display_table("Ray nodes", ["node", "ip", "CPUs", "GPUs", "memory GB"],
                  [[n["node_id"][:12], n["ip"], f"{n['cpus']:g}", f"{n['gpus']:g}", n["memory_gb"]]
                   for n in nodes])
    if not info["gangs"]:
        console.print("no seqpar gangs running")
        return
    display_table("seqpar gangs", ["gang", "ranks", "actors (rank@node:state)"],
                  [[g["gang"], g["ranks"], " ".join(g["actors"])] for g in info["gangs"]])
    rows = [[s["sweep"], s["name"] or "?", _trials(s["trials"]), _pace(s), s["in_flight"] or "-",
             " ".join(_rank(r) for r in s["ranks"])] for s in info["sweeps"]]
    if rows:
        display_table("seqpar sweeps", ["sweep", "name", "trials", "pace, left", "in flight",
                                        "ranks (rank:phase:iterations)"], rows)


def _trials(counts: dict[str, int] | None) -> str:
    """`3/8 done, 1 failed` (the driver's series), or why it is not known."""
    if not counts:
        return "? (no driver series yet)"
    total = sum(counts.values())
    failed = f", {counts['failed']} failed" if counts.get("failed") else ""
    return f"{counts.get('done', 0)}/{total} done{failed}"


def _pace(s: dict) -> str:
    """`9.5/min, 1:43:10 left` (the driver's series), `-` before its first trial ends."""
    per_min, left = s.get("per_min"), s.get("left_s")
    if per_min is None:
        return "-"
    text = f"{per_min:.1f}/min"
    if left is not None:
        whole = int(round(left))
        text += f", {whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d} left"
    return text


def _rank(r: dict) -> str:
    it = "?" if r["iterations"] is None else r["iterations"]
    return f"{r['rank']}:{r['phase'] or '?'}:{it}"
