"""Hugging Face LLaMA-style checkpoints (safetensors, one file or sharded) loaded straight into each
rank's shards, for continued training at long context.

    net = Transformer(cfg, attention="ring", mesh=mesh, states="fsdp", device="cuda", ...)
    hf.load(net, "/path/to/Meta-Llama-3.1-8B")   # every rank calls it

torch's distributed checkpoint reader for Hugging Face files (`HuggingFaceStorageReader`) plans
the reads: under FSDP2 a rank reads only the rows of each tensor its shard holds (safetensors
slices), so no rank ever holds a whole model; replicated states read every tensor whole. Values
are cast to the parameters' dtype as they are copied (a bf16 checkpoint into fp32 master weights).
The model's shape comes from its `ModelConfig`, built to match the checkpoint's config.json; a
tensor whose shape differs is a one-line error before anything is read. A checkpoint without
`lm_head.weight` ties the head to the embedding (tie_word_embeddings): the head is read from
`model.embed_tokens.weight`.

seqpar's decoder is LLaMA's with rotate-half RoPE, which is the convention of Hugging Face's
weights: q_proj and k_proj load as they are. Needs the `safetensors` package (`pip install
seqpar[hf]`).
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from torch import nn

from seqpar.errors import ConfigError, require

# seqpar's parameter names -> Hugging Face LLaMA / Mistral / Qwen2 names
_BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
          "wq": "self_attn.q_proj", "wk": "self_attn.k_proj", "wv": "self_attn.v_proj",
          "wo": "self_attn.o_proj", "w1": "mlp.gate_proj", "w3": "mlp.up_proj",
          "w2": "mlp.down_proj"}
_TOP = {"embed": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}
TIED_HEAD = "model.embed_tokens.weight"


def hf_name(name: str) -> str:
    """The Hugging Face name of one of seqpar's parameters (`blocks.3.wq` ->
    `model.layers.3.self_attn.q_proj.weight`)."""
    if name in _TOP:
        return _TOP[name] + ".weight"
    parts = name.split(".")
    require(len(parts) == 3 and parts[0] == "blocks" and parts[2] in _BLOCK, "parameter", name,
            "is not one of seqpar's decoder parameters")
    return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.weight"


def checkpoint_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} of the safetensors files in `path` (their headers only)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    meta = HuggingFaceStorageReader(path).read_metadata()
    return {k: tuple(v.size) for k, v in meta.state_dict_metadata.items()}


def load(net: nn.Module, path: str) -> None:
    """Read the checkpoint in directory `path` into `net`'s parameters (every rank of the model
    calls it; each reads only what it holds)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load

    shapes = checkpoint_shapes(path)
    require(bool(shapes), "checkpoint", path, "holds no .safetensors file")
    tied = "lm_head.weight" not in shapes
    targets: dict[str, torch.Tensor] = {}
    head: dict[str, torch.Tensor] = {}
    for name, p in net.named_parameters():
        key = TIED_HEAD if name == "head" and tied else hf_name(name)
        if key not in shapes:
            raise ConfigError("checkpoint", path, f"has no tensor {key} (seqpar's {name})")
        require(shapes[key] == tuple(p.shape), "checkpoint", path,
                f"{key} is {list(shapes[key])}, the model's {name} is {list(p.shape)}: build the "
                "ModelConfig from the checkpoint's config.json")
        (head if name == "head" and tied else targets)[key] = p.detach()
    group = _shard_group(net)
    with torch.no_grad(), warnings.catch_warnings():
        # replicated states read on their own (no_dist): say nothing of a missing process group
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        for part in (targets, head):  # the head: the embedding's tensor again, when tied
            if part:
                dcp_load(part, storage_reader=HuggingFaceStorageReader(path),
                         process_group=group, no_dist=group is None)


def _shard_group(net: nn.Module) -> dist.ProcessGroup | None:
    """The group the parameters are sharded over (FSDP2: the load plans collectively there), or
    None: replicated states, every rank reads every tensor on its own."""
    for p in net.parameters():
        if hasattr(p, "device_mesh"):
            return p.device_mesh.get_group()
    return None
