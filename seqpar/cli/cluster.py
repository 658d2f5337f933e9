"""`seqpar cluster status`: the Ray cluster's nodes (CPUs, GPUs, memory) and the running gangs."""

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
    """Nodes with their CPUs/GPUs and the seqpar gangs (rank actors by gang id)."""
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
