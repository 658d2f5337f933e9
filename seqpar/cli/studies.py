"""`seqpar studies`: the named studies, what each measures and how many trials each has."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import display_table


def studies(
    preset: Annotated[str, typer.Option(help="cpu | gpu-cluster: the sizes the trials use.")] = "cpu",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
) -> None:
    """List the studies `seqpar run <study>` takes, with their trials and headline metric."""
    from seqpar.experiments.registry import STUDIES

    rows = []
    for study in STUDIES.values():
        points = study.points(preset)
        ok = sum(p.spec is not None for p in points)
        rows.append([study.name, study.description, study.headline, f"{ok}/{len(points)}"])
    display_table(f"studies ({preset} preset): seqpar run <study> [--set key=value] [--preset P]",
                  ["study", "what it measures", "headline", "trials"], rows,
                  as_json=as_json)
