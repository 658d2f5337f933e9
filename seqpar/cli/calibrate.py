"""`seqpar calibrate`: measure this machine into the `local` cluster file of the performance model."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import console, display_table


def calibrate(
    out: Annotated[str | None, typer.Option(
        "--out", help="Where to write (default: the packaged cluster_files/local.yaml).")] = None,
    links: Annotated[bool, typer.Option(help="Also measure the link between two local ranks.")
                     ] = True,
) -> None:
    """Kernel throughput by block size and local link latency/bandwidth -> the `local` cluster."""
    from seqpar.experiments import clusters
    from seqpar.experiments.perf.calibrate import measure

    cluster, rates = measure(with_link=links)
    display_table("attention kernel, causal fwd+bwd (float32)", ["block tokens", "GFLOP/s"],
                  [[t, f"{r / 1e9:.2f}"] for t, r in rates.items()])
    path = clusters.save(cluster, out)
    console.print(f"rate {cluster.attention_tflops['float32'] * 1e3:.2f} GFLOP/s at large blocks, "
                  f"half rate at {cluster.kernel_half_tokens} tokens; link "
                  f"{cluster.intra.latency_us} us, {cluster.intra.bandwidth_gb_per_s} GB/s -> {path}")
