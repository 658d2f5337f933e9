"""`seqpar studies`: the named studies, what each measures and how many trials each has; then the
peers (other projects' attentions a sweep can run as `plan.algorithm: peer:<name>`) and whether
each can run on this machine."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import display_table


def studies(
    preset: Annotated[str, typer.Option(help="cpu | gpu-cluster: the sizes the trials use.")] = "cpu",
    peers: Annotated[bool, typer.Option("--peers", help="List only the peers.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """List the studies `seqpar run <study>` takes, with their trials and headline metric, and the
    peers (`plan.algorithm: peer:<name>`) with whether each is installed here."""
    if not peers:
        from seqpar.experiments.registry import STUDIES

        rows = []
        for study in STUDIES.values():
            points = study.points(preset)
            ok = sum(p.spec is not None for p in points)
            rows.append([study.name, study.description, study.headline, f"{ok}/{len(points)}"])
        display_table(f"studies ({preset} preset): seqpar run <study> [--set key=value] "
                      "[--preset P]", ["study", "what it measures", "headline", "trials"], rows,
                      as_json=as_json)
        if as_json:
            return
    _peers(as_json)


def _peers(as_json: bool) -> None:
    from rich.markup import escape

    from seqpar.peers import catalogue

    rows = [[p.name, p.summary, "yes" if p.unavailable is None else f"no: {p.unavailable}"]
            for p in catalogue()]
    if not as_json:  # an install hint such as seqpar[peers] is text, not rich markup
        rows = [[escape(c) for c in row] for row in rows]
    display_table("peers: plan.algorithm: peer:<name> (the peer's own code, seqpar's harness)",
                  ["peer", "what it is", "runs here"], rows, as_json=as_json)
