"""An analytic step time for an experiment on a cluster: compute, communication, and their overlap.

    est = estimate(spec, CLUSTERS["a100-ib"])
    est.step_s, est.compute_s, est.comm_s

Compute is the attention FLOPs per rank (the one formula in `algorithms.kernels`, backward 2.5x
forward) at the device's sustained rate, on the busiest rank (a causal mask over a contiguous layout
loads the last rank ~(2P-1)/P times the mean). Communication is the algorithm's own analytic bytes per
rank (`algorithms.expected_bytes`, the same numbers the ledger is checked against) over the slowest
link the plan crosses: inter-node once the ranks span nodes. The estimate assumes perfect overlap
(`max(compute, comm)`) plus one latency per message round, so it is a lower bound meant for ranking
and pruning a tuning space, not for predicting wall time; `seqpar tune --prune K` profiles only the
K configurations it ranks best.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from seqpar import algorithms
from seqpar.algorithms import layouts
from seqpar.algorithms.kernels import attention_flops
from seqpar.experiments.spec import ExperimentSpec


@dataclass(frozen=True)
class ClusterSpec:
    device_flops: float                 # attention FLOP/s one rank sustains
    intra_bytes_per_s: float            # one rank's share of intra-node bandwidth
    inter_bytes_per_s: float            # one rank's share of inter-node bandwidth (its NIC)
    latency_s: float = 5e-6             # per message round


# rough sustained numbers (about half of the datasheet peak for attention kernels)
CLUSTERS: dict[str, ClusterSpec] = {
    "cpu": ClusterSpec(20e9, 5e9, 1e9, 50e-6),
    "a100-ib": ClusterSpec(150e12, 150e9, 25e9, 5e-6),
    "h100-ib": ClusterSpec(450e12, 300e9, 50e9, 5e-6),
}


@dataclass(frozen=True)
class Estimate:
    compute_s: float
    comm_s: float
    bytes_per_rank: int

    @property
    def step_s(self) -> float:
        return max(self.compute_s, self.comm_s)

    def tokens_per_s(self, tokens: int) -> float:
        return tokens / self.step_s if self.step_s > 0 else float("inf")


@lru_cache(maxsize=256)
def causal_imbalance(layout: str, world: int) -> float:
    """max/mean causal work over ranks when each rank attends its own queries to every earlier key
    (ring, allgather, ...): query t sees t + 1 keys. Scale-free, so measured on a short proxy."""
    n = layouts.chunk_count(layout, world) * 64
    work = [sum(t + 1 for t in layouts.positions(layout, r, world, n).tolist())
            for r in range(world)]
    return max(work) / (sum(work) / world)


def estimate(spec: ExperimentSpec, cluster: ClusterSpec) -> Estimate:
    w, p = spec.workload, spec.plan
    n, shape = w.seq_len, spec.shape
    mask = "causal" if w.causal else "full"
    flops = attention_flops(w.batch, n, n, spec.model.heads, spec.model.head_dim, mask)
    if w.mode == "fwd+bwd":
        flops *= 3.5
    compute_s = flops / p.world / cluster.device_flops
    if w.causal and p.algorithm != "ulysses":  # ulysses attends the whole sequence per head
        compute_s *= causal_imbalance(p.layout, p.world)  # the busiest rank sets the pace
    by_phase = algorithms.expected_bytes(p.algorithm, shape, p.world, **spec.options)
    sent = by_phase["forward"] + (by_phase["backward"] if w.mode == "fwd+bwd" else 0)
    link = cluster.inter_bytes_per_s if p.nodes > 1 else cluster.intra_bytes_per_s
    rounds = (p.world - 1) * (2 if w.mode == "fwd+bwd" else 1)
    comm_s = sent / link + rounds * cluster.latency_s if p.world > 1 else 0.0
    return Estimate(compute_s, comm_s, sent)
