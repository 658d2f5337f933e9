"""`seqpar calibrate`: measure this machine into the `local` cluster file of the performance model."""

from __future__ import annotations

from typing import Annotated

import typer

from seqpar.cli.display import console, display_table
from seqpar.planner import clusters


def calibrate(
    out: Annotated[str | None, typer.Option(
        "--out", help="Where to write (default: the packaged cluster_files/local.yaml).")] = None,
    links: Annotated[bool, typer.Option(help="Also measure the link between two local ranks.")
                     ] = True,
) -> None:
    """Kernel throughput by block size, merge and copy rates, local link latency/bandwidth and the
    transport's CPU cost, a ring step's fixed cost -> the `local` cluster; on a CUDA machine also
    each attention kernel's rates (the planner's --kernel takes them first)."""
    from seqpar.sweeps.calibrate import calibrate as measure  # torch: not for --help

    c, table = measure(with_link=links)
    display_table("attention kernel fwd+bwd (float32, one thread), GFLOP/s",
                  ["block tokens", *table],
                  [[t, *(f"{table[m][t] / 1e9:.2f}" for m in table)] for t in table["causal"]])
    if c.kernels:
        display_table("attention kernels on CUDA (16K-token calls), TFLOP/s",
                      ["kernel", "forward", "forward causal", "backward"],
                      [[k, r.forward_full, r.forward_causal, r.backward]
                       for k, r in c.kernels.items()])
    path = clusters.save(c, out)
    console.print(
        f"{c.cores} cores; kernel {c.attention_tflops['float32'] * 1e3:.2f} GFLOP/s at large blocks, "
        f"half rate at {c.kernel_half_tokens} tokens; merge "
        f"{c.merge_gb_per_s} GB/s + {c.merge_us} us; copy {c.copy_gb_per_s} GB/s; link "
        f"{c.intra.latency_us} us, {c.intra.bandwidth_gb_per_s} GB/s; transport "
        f"{c.transport_gb_per_s} GB/s + {c.message_us} us per message; fixed host costs: call "
        f"{c.call_us} us, ring step {c.step_us} us, collective {c.collective_us} us"
        + "".join(f"; {w} ranks side by side: the last {100 * s:.1f}% past the mean, the "
                  f"transport's threads {c.transport_cpu_us.get(w, (0, 0))[0]:.0f} us CPU a "
                  f"message, {c.transport_cpu_us.get(w, (0, 0))[1]:.0f} a collective"
                  for w, s in sorted(c.spread.items())) + f" -> {path}")
