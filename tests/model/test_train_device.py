"""The training path on a device and in mixed precision, each checked on the CPU:

- the model is built on the case's device with its states in the master dtype;
- every timestamp of a step follows a device sync (on CUDA the clock would see the enqueue);
- a training trial passes its device and its node map down to the ranks' measurement;
- fp32 master weights let a bf16 model's norm weights move where pure bf16 rounds the update away;
- FSDP-sharded states and ZeRO-1's sharded moments follow the one-process float64 trajectory, and
  state_bytes shrink with them (ZeRO-1's: exactly its partition's).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seqpar.algorithms.comm import LinkModel
from seqpar.case import TrainCase
from seqpar.model.memory import state_breakdown
from seqpar.rules.memory import zero1_partition
from seqpar.rules.model import param_shapes
from seqpar.workers.measure import train

TINY = TrainCase(algorithm="local", sp=1, layout="contiguous", seq_len=32, warmup=1, iters=2)


def test_the_model_is_built_on_the_cases_device_in_its_master_dtype():
    case = dataclasses.replace(TINY, dtype="bfloat16", master_dtype="float32")
    net = train.build(case, None, device="meta")
    assert {p.device.type for p in net.parameters()} == {"meta"}
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    assert net.dtype == torch.bfloat16


def test_every_timestamp_follows_a_device_sync(monkeypatch):
    events: list[str] = []

    class Clock:
        @staticmethod
        def perf_counter() -> float:
            events.append("clock")
            return float(len(events))

    monkeypatch.setattr(train, "time", Clock)
    monkeypatch.setattr(train, "sync", lambda device: events.append(f"sync:{device.type}"))
    train.train_steps(TINY, 0, None, device="cpu")
    clocks = [i for i, e in enumerate(events) if e == "clock"]
    assert len(clocks) == 3 * (TINY.warmup + TINY.iters)  # start, after forward, after the step
    assert all(i > 0 and events[i - 1] == "sync:cpu" for i in clocks), events


def test_a_training_trial_passes_its_device_and_node_map_to_the_rank(monkeypatch):
    seen = {}

    def fake_train_steps(case, rank, sp_group, dp_group, replica, device_name, *, mesh, device,
                         node_of_rank):
        seen.update(device=device, nodes=node_of_rank, mesh_nodes=mesh.nodes,
                    mesh_links=mesh.links)
        raise RuntimeError("stop here")

    monkeypatch.setattr(train, "train_steps", fake_train_steps)
    monkeypatch.setattr(train, "dp_sp_mesh", lambda case, nodes=None, links=None: type(
        "M", (), {"nodes": nodes, "links": links, "comms": {}})())
    links = {"inter": LinkModel(1e-3, 1e9)}
    with pytest.raises(RuntimeError, match="stop here"):
        train.measure_training(TINY, 0, "cpu", device=torch.device("meta"), nodes=[0, 0, 1, 1],
                               links=links)
    assert seen == {"device": torch.device("meta"), "nodes": [0, 0, 1, 1],
                    "mesh_nodes": [0, 0, 1, 1], "mesh_links": links}


def _norms_after(case: TrainCase, steps: int) -> torch.Tensor:
    net = train.build(case, None)
    opt = torch.optim.AdamW(net.parameters(), lr=case.lr)
    for i in range(steps):
        tokens, _ = train.batch_tokens(case, i, 0)
        net.loss(tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return torch.cat([b.attn_norm.detach().float() for b in net.blocks])


def test_master_weights_let_bf16_norm_weights_move():
    pure = dataclasses.replace(TINY, dtype="bfloat16", lr=1e-3)
    mixed = dataclasses.replace(pure, master_dtype="float32")
    assert torch.equal(_norms_after(pure, 3), torch.ones(2 * 64)), "bf16 steps of 1e-3 moved 1.0"
    moved = (_norms_after(mixed, 3) - 1).abs()
    assert moved.min() > 0 and moved.max() < 1e-2


def _sharded_losses(env, case: TrainCase):
    out = train.train_steps(case, env.rank, env.group(case.sp))
    return out.losses, out.summary["state_bytes"], env.rank


@pytest.mark.multirank
def test_fsdp_and_zero1_training_follow_the_one_process_trajectory(gang):
    case = TrainCase(algorithm="ring", sp=2, layout="zigzag", model="tiny",
                     model_overrides=(("vocab", 61), ("hidden", 32), ("ffn", 48)), seq_len=16,
                     batch=2, dtype="float64", checkpoint="sc++", fused_head=True,
                     head_tiles=(5, 16), warmup=1, iters=3, seed=4, lr=1e-2)
    ref = train.train_steps(dataclasses.replace(case, algorithm="local", sp=1, layout="contiguous"),
                            0, None)
    whole = state_breakdown(train.build(case, None))["params"]
    share = zero1_partition(case.config(), 2)
    assert sum(share) * 8 == whole and min(share) > 0
    for states in ("fsdp", "zero1"):
        for losses, held, rank in gang.run(_sharded_losses, dataclasses.replace(case, states=states),
                                           size=2):
            for a, b in zip(losses, ref.losses, strict=True):
                assert abs(a - b) < 1e-10, (states, losses, ref.losses)
            if states == "fsdp":  # half the parameters (their gradients, two moments) a rank
                assert held == pytest.approx(4 * whole / 2, rel=0.05)
            else:  # every parameter and gradient, the moments of the rank's share (and
                # AdamW's step count, a 4-byte scalar per parameter)
                steps = held - 2 * whole - 2 * share[rank] * 8
                assert 0 < steps <= 4 * len(param_shapes(case.config())) and steps % 4 == 0


def test_the_activation_meter_reads_the_cuda_allocator_on_a_gpu(monkeypatch):
    """On CUDA the meter reads the caching allocator (the profiler sees host allocations only)."""
    from seqpar.model.memory import AllocationMeter

    allocated = iter([1000, 1600])
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: next(allocated))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 2500)
    with AllocationMeter("cuda") as mem:
        pass
    assert (mem.retained, mem.peak) == (600, 1500)
    assert calls == ["sync", "reset", "sync"]


def test_offload_on_a_cpu_mesh_is_one_clear_error():
    from seqpar.errors import ConfigError
    from seqpar.model import ModelConfig, Transformer

    with pytest.raises(ConfigError, match=r"offload=\['optimizer', 'params'\]: needs CUDA"):
        Transformer(ModelConfig.preset("tiny"), states="fsdp", offload=True)
    with pytest.raises(ConfigError, match=r"offload=\['optimizer', 'params'\]: 'params' needs "
                       "states='fsdp'"):
        Transformer(ModelConfig.preset("tiny"), offload=True)
    with pytest.raises(ConfigError, match="states="):
        Transformer(ModelConfig.preset("tiny"), states="zero3")
