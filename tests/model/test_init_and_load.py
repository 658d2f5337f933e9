"""A model of any size starts on any number of ranks, and continues from a Hugging Face checkpoint.

- Parameter values do not depend on who draws them: any row range drawn alone equals the same rows
  of the whole draw, and a model sharded by FSDP2 over 2 ranks holds exactly the one-process
  model's parameters.
- No rank allocates a whole parameter it does not hold while the model is built (the old way drew
  every parameter whole, in float64, on every rank).
- A LLaMA-style safetensors checkpoint written here (Hugging Face names, two files, with and
  without a tied head) loads into the one-process model and into FSDP2 shards on 2 ranks with the
  same values and the same loss; a tensor of the wrong shape is a one-line error.
"""

from __future__ import annotations

import pytest
import torch

from seqpar.errors import ConfigError
from seqpar.model import ModelConfig, Transformer, hf
from seqpar.model.init import ROW_BLOCK, draw_rows
from seqpar.model.memory import AllocationMeter

CFG = ModelConfig(vocab=1000, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)
WIDE = ModelConfig(vocab=8192, hidden=32, layers=2, heads=4, kv_heads=2, ffn=48)  # blocks << shards


def test_rows_drawn_alone_equal_the_same_rows_of_the_whole_draw(seed):
    gen = torch.Generator().manual_seed(seed)
    shape = (3 * ROW_BLOCK + 17, 5)
    whole = draw_rows(seed, 3, shape, 0, shape[0])
    assert whole.std().item() == pytest.approx(0.02, rel=0.1)
    for _ in range(4):
        a = int(torch.randint(0, shape[0] - 1, (1,), generator=gen))
        b = int(torch.randint(a + 1, shape[0] + 1, (1,), generator=gen))
        assert torch.equal(draw_rows(seed, 3, shape, a, b), whole[a:b])
    assert not torch.equal(draw_rows(seed, 4, shape, 0, 8), whole[:8])  # parameters differ


def _build_sharded(env, seed):
    with AllocationMeter() as mem:
        net = Transformer(WIDE, group=env.group(2), states="fsdp", seed=seed)
    full = {name: p.full_tensor() for name, p in net.named_parameters()}
    return mem.peak, full


@pytest.mark.multirank
def test_fsdp_ranks_draw_only_their_rows_and_hold_the_one_process_model(gang, seed):
    whole = Transformer(WIDE, seed=seed)
    model_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    embed_bytes = whole.embed.numel() * whole.embed.element_size()
    for peak, full in gang.run(_build_sharded, seed, size=2):
        for name, p in whole.named_parameters():
            assert torch.equal(full[name], p.detach()), name
        # about half the model each, never a whole (float64) embedding or head
        assert peak < model_bytes * 0.6 and peak < 2 * embed_bytes * 0.6, (peak, model_bytes)


# ------------------------------------------------------------------------ Hugging Face checkpoints
def _write_checkpoint(path, values: dict[str, torch.Tensor], tied: bool) -> None:
    from safetensors.torch import save_file

    tensors = {hf.hf_name(name): t.to(torch.bfloat16).contiguous() for name, t in values.items()}
    if tied:
        del tensors["lm_head.weight"]
    names = sorted(tensors)
    half = len(names) // 2
    save_file({k: tensors[k] for k in names[:half]}, str(path / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in names[half:]}, str(path / "model-00002-of-00002.safetensors"))


def _hf_values(seed: int, tied: bool) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = {name: tuple(p.shape) for name, p in Transformer(CFG, device="meta").named_parameters()}
    values = {name: torch.randn(shape, generator=gen) * 0.05 for name, shape in shapes.items()}
    if tied:
        values["head"] = values["embed"]
    return {name: v.to(torch.bfloat16) for name, v in values.items()}


def _tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, CFG.vocab, (2, 17), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tied", [False, True])
def test_a_checkpoint_loads_into_the_one_process_model(tmp_path, seed, tied):
    values = _hf_values(seed, tied)
    _write_checkpoint(tmp_path, values, tied)
    net = Transformer(CFG, seed=seed + 1, master_dtype=torch.float32, dtype=torch.float32)
    hf.load(net, str(tmp_path))
    for name, p in net.named_parameters():
        assert p.dtype == torch.float32 and torch.equal(p.detach(), values[name].float()), name


def _load_sharded(env, path, seed):
    net = Transformer(CFG, attention="ring", layout="zigzag", group=env.group(2), states="fsdp",
                      seed=seed + 1)
    hf.load(net, path)
    local_rows = net.embed.to_local().shape[0]
    return ({name: p.full_tensor() for name, p in net.named_parameters()},
            net.loss(_tokens(seed)).item(), local_rows)


@pytest.mark.multirank
def test_a_checkpoint_loads_into_fsdp_shards_with_the_one_process_loss(gang, tmp_path, seed):
    values = _hf_values(seed, tied=False)
    _write_checkpoint(tmp_path, values, tied=False)
    whole = Transformer(CFG, seed=seed + 1)
    hf.load(whole, str(tmp_path))
    want = whole.loss(_tokens(seed)).item()
    for full, loss, rows in gang.run(_load_sharded, str(tmp_path), seed, size=2):
        assert rows == CFG.vocab // 2  # each rank holds (and read) half the embedding's rows
        for name, p in whole.named_parameters():
            assert torch.equal(full[name], p.detach()), name
        assert loss == pytest.approx(want, rel=1e-6)


def test_a_checkpoint_of_another_shape_is_a_one_line_error(tmp_path, seed):
    _write_checkpoint(tmp_path, _hf_values(seed, tied=False), tied=False)
    other = ModelConfig(vocab=1000, hidden=32, layers=2, heads=4, kv_heads=4, ffn=48)
    with pytest.raises(ConfigError, match=r"self_attn.k_proj.weight is \[16, 32\].*\[32, 32\]") as e:
        hf.load(Transformer(other), str(tmp_path))
    assert "\n" not in str(e.value)
    assert hf.hf_name("blocks.1.w3") == "model.layers.1.mlp.up_proj.weight"
