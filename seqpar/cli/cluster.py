"""`seqpar cluster status`: the Ray cluster's nodes (CPUs, GPUs, memory) and the running gangs."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import console, display_table

app = typer.Typer(name="cluster", no_args_is_help=True, help="The Ray cluster seqpar runs on.")


def _global_address() -> str | None:
    try:
        from seqpar.cli.options import GLOBALS
    except ImportError:
        return None
    return GLOBALS.address


@app.command("status")
def status(
    address: Annotated[str | None, typer.Option(
        help="Ray cluster to ask: 'auto' (the one `ray start` began here), 'host:6379' or "
             "'ray://host:10001'; default: `seqpar --address`, else 'auto'.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")] = False,
) -> None:
    """Nodes with their CPUs/GPUs and the seqpar gangs (rank actors by gang id)."""
    import json

    from seqpar.platform import cluster, connection

    address = address or _global_address() or "auto"
    embedded = connection.connect(address, ship_code=False)
    try:
        info = cluster.status()
    finally:
        connection.disconnect(embedded)
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
