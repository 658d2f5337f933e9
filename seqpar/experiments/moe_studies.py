"""The study `moe-placement` (registry.STUDIES names it): a mixture of experts trained with expert
parallelism beside sequence parallelism, EP groups within a node or across nodes.

EP borrows its ranks from the DP x SP world (`plan.ep`; `rules.groups`: an EP group is ep
consecutive ranks, SP-inner), so with DP 2 x SP 2 on 2 (virtual) nodes of 2 ranks the SP groups
sit inside the nodes and:

- EP 1: every rank holds every expert (the families' MoE: replicated states);
- EP 2: an EP group is an SP group, inside a node: the dispatch and combine all-to-alls on
  intra-node links;
- EP 4: the group spans both nodes: half of each rank's pairs cross the inter-node link.

The `within` placement puts the 4 ranks on one node (every EP group inside it), `across` on two
(EP 4 across them); each EP runs under ring and Ulysses. Metrics: tokens/s, memory, the
all-to-alls' bytes by link (the ledger's group `ep`) and the experts' load imbalance per step
(`expert_imbalance`: the busiest expert's routed pairs over the mean, a layer's). The links are
emulated as the LoongTrain testbed's over this machine's compute (`TWIN`), so crossing nodes
costs what it would on A100s. The gpu-cluster preset: Qwen3-30B-A3B at 128K on 16 GPUs over 2
nodes, DP 2 x SP 8, EP 1/8/16 (EP 16 across the nodes).
"""

from __future__ import annotations

from typing import Any

from seqpar.experiments.sweep_bases import TWIN, Sweep
from seqpar.experiments.train_studies import _train_base

PLACEMENTS = {"within": {"plan.nodes": 1}, "across": {"plan.nodes": 2}}


def placement_axis(eps: tuple[int, ...], placements: dict[str, dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """EP x placement as one axis: each EP degree under each placement (EP 1 and EP groups that
    fit a node under both: the same EP, on other links for the rest of the step)."""
    return [{"plan.ep": ep, **where} for ep in eps for where in placements.values()]


def _moe_placement(preset: str) -> Sweep:
    """EP 1/2/4 x ring and Ulysses x EP groups within a node or across nodes: tokens/s, memory,
    the all-to-all bytes by link and the experts' load imbalance. The cpu preset: tiny-qwen3-moe
    (8 experts, top-2) on 4 ranks, DP 2 x SP 2, 1,024 random tokens a sequence, 10 timed steps."""
    if preset == "cpu":
        return (_train_base(preset, model="tiny-qwen3-moe",
                            plan={"world": 4, "layout": "zigzag"},
                            workload={"seq_len": 1024, "warmup": 1, "iters": 10},
                            train={"dp": 2}, env={"link_emulation": TWIN}),
                {"placement": placement_axis((1, 2, 4), PLACEMENTS),
                 "plan.algorithm": ["ring", "ulysses"]})
    # 8 GPUs a node: EP 8 is a node, EP 16 both; states sharded by FSDP (experts by EP first)
    return (_train_base(preset, model="qwen3-30b-a3b", plan={"world": 16, "nodes": 2},
                        workload={"seq_len": 131072}, train={"checkpoint": "sc++", "dp": 2}),
            {"plan.ep": [1, 8, 16], "plan.algorithm": ["ring", "ulysses"]})
