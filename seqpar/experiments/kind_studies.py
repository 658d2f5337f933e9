"""The study `attention-kinds` (registry.STUDIES names it): the mission's "MHA vs GQA" extended to
the attention kinds long-context training uses now, trained alike at equal width.

Equal width: the same vocabulary, hidden size, layer count, query heads, dense SwiGLU feed-forward
and RoPE base; each kind's attention as its family builds it (models/kinds-*.json, read as any
config.json is):

- MHA and GQA (LLaMA): H query heads of hidden / H; K,V heads H and H / 4;
- MLA (DeepSeek-V3's latent attention): H heads of q/k width 1.5 hidden / H (a RoPE key of a third
  of it, shared by the heads) and V width hidden / H, a K,V latent of 4 hidden / H (512 at 8B, as
  DeepSeek-V3's); its ring carries each rank's K,V (`mla_pass: kv`) or its latent (`latent`, K,V
  rebuilt on arrival);
- the linear hybrid (Qwen3-Next's): three gated DeltaNet layers to one gated full-attention layer
  (GQA, H / 4 K,V heads), the DeltaNet's value heads H of hidden / H (key heads H / 2), its layers
  under LASP-2 (one all-gather of states a layer), and again under LASP-1 (each rank's state
  sent on to the next: the serial baseline LASP-2 is measured against).

Each kind trains with ring and Ulysses (Ulysses moves heads after the up-projection: MLA's latent
ring has no Ulysses point, skipped with the rule's reason). The layout is contiguous for every
kind (LASP's rule; the same causal imbalance for all).
"""

from __future__ import annotations

from typing import Any

from seqpar.experiments.sweep_bases import Sweep
from seqpar.experiments.train_studies import _train_base, family_axis

# the kinds by their model presets (cpu: hidden 128, 4 layers, 8 query heads; gpu: Llama-3-8B's
# width) and the training options each runs with
KINDS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("mha", "kinds-mha", {}),
    ("gqa", "kinds-gqa", {}),
    ("mla-kv", "kinds-mla", {"train.mla_pass": "kv"}),
    ("mla-latent", "kinds-mla", {"train.mla_pass": "latent"}),
    ("hybrid", "kinds-hybrid", {"train.linear_sp": "lasp2"}),
    ("hybrid-lasp1", "kinds-hybrid", {"train.linear_sp": "lasp1"}),  # the serial baseline
)


def kind_axis(suffix: str = "") -> list[dict[str, Any]]:
    """A grid axis over the kinds: each its model preset (with `suffix`), attention shape and
    options."""
    return [{**family_axis((model + suffix,))[0], **options} for _, model, options in KINDS]


def _attention_kinds(preset: str) -> Sweep:
    """Each kind trained with ring and Ulysses at equal width: TGS, bytes sent and peak memory. The
    cpu preset runs P = 2 (one rank a core) on 1024 random tokens a step, 10 timed steps."""
    if preset == "cpu":
        return (_train_base(preset, model="kinds-mha", plan={"world": 2, "layout": "contiguous"},
                            workload={"seq_len": 1024, "warmup": 1, "iters": 10}),
                {"kind": kind_axis(), "plan.algorithm": ["ring", "ulysses"]})
    return (_train_base(preset, model="kinds-mha-8b",
                        plan={"world": 16, "nodes": 2, "layout": "contiguous"},
                        workload={"seq_len": 262144}, train={"checkpoint": "sc++"}),
            {"kind": kind_axis("-8b"), "plan": [{"algorithm": "ring"}, {"algorithm": "ulysses"},
                                                 {"algorithm": "usp", "options": {"dhp": 4}}]})
