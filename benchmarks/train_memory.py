"""Model states and activations: what the planner predicts (seqpar.model.memory, the planner's
memory model) against what a rank holds (state_bytes after a step; AllocationMeter over a forward),
for the tiny and small decoders on CPU at P = 1, 2, 4, replicated vs fsdp, every checkpoint mode.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/train_memory.py [--algorithms ring,ulysses]
"""

from __future__ import annotations

import argparse
import gc

import torch

from seqpar.algorithms.base import AttnShape
from seqpar.model import CHECKPOINT_MODES, ModelConfig, Transformer
from seqpar.model.memory import (
    AllocationMeter,
    TrainPolicy,
    predicted_activations,
    predicted_states,
    state_bytes,
)
from seqpar.planner.memory import attention_held
from seqpar.platform.localgang import LocalGang

MODELS = {"tiny": ModelConfig.preset("tiny"),
          "small": ModelConfig(vocab=512, hidden=128, layers=2, heads=8, kv_heads=8, ffn=344)}
OPTIONS = {"usp": {"dhp": 2}}


def measure(env, model: str, algorithm: str, world: int, seq_len: int, states: str, mode: str):
    cfg = MODELS[model]
    net = Transformer(cfg, attention=algorithm, layout="zigzag", group=env.group(world),
                      checkpoint=mode, dtype=torch.float32, states=states,
                      **(OPTIONS.get(algorithm, {}) if world > 1 else {}))
    opt = torch.optim.AdamW(net.parameters())
    tokens = torch.randint(0, cfg.vocab, (1, seq_len + 1), generator=torch.Generator().manual_seed(0))
    net.loss(tokens).backward()
    opt.step()
    held = state_bytes(net, opt)
    opt.zero_grad(set_to_none=True)
    retained = []
    for _ in range(2):  # the least of two: another thread's allocation can land in one of them
        gc.collect()
        with AllocationMeter() as mem:
            loss = net.loss(tokens)
        retained.append(mem.retained)
        loss.backward()  # as in a step: FSDP reshards its root after backward, not after forward
        opt.zero_grad(set_to_none=True)
        del loss
    return held, min(retained)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--algorithms", default="ring")
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args()
    print("| model | alg | P | states | ckpt | states pred/meas | activations pred | meas | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    with LocalGang(4, sizes=(1, 2, 4), device="cpu") as gang:
        for model, cfg in MODELS.items():
            for algorithm in args.algorithms.split(","):
                for world in (1, 2, 4):
                    alg = algorithm if world > 1 else "local"
                    for states in ("replicated", "fsdp"):
                        if world == 1 and states == "fsdp":
                            continue
                        for mode in CHECKPOINT_MODES:
                            held, act = gang.run(measure, model, alg, world, args.seq_len, states,
                                                 mode, size=world)[0]
                            policy = TrainPolicy(states=states, checkpoint=mode)
                            shape = AttnShape(1, args.seq_len, cfg.heads, cfg.kv_heads,
                                              cfg.head_dim, 4)
                            ps = predicted_states(cfg, "float32", policy, world)["device"]
                            pa = predicted_activations(
                                cfg, 1, args.seq_len // world, "float32", policy,
                                attention_held(alg, shape, world, OPTIONS.get(alg, {})))
                            err = max(abs(ps - held) / held, abs(pa - act) / act)
                            worst = max(worst, err)
                            print(f"| {model} | {alg} | {world} | {states} | {mode} | "
                                  f"{ps}/{held} | {pa} | {act} | {err:.1%} |", flush=True)
    print(f"worst relative error: {worst:.1%}")


if __name__ == "__main__":
    main()
