"""The shape of a decoder of any family seqpar models: re-exported from `seqpar.rules.model`,
where it lives without torch (the planner reads it too).

    cfg = ModelConfig(vocab=97, hidden=64, layers=2, heads=4, kv_heads=2, ffn=128)
    cfg = ModelConfig.load("llama3.1-8b")        # a preset, a YAML of its fields or a config.json
"""

from __future__ import annotations

from seqpar.rules.model import (
    ModelConfig,
    block_shapes,
    from_hf,
    load,
    param_shapes,
    preset_names,
    presets,
)

MODELS: dict[str, ModelConfig] = presets()  # the model presets, by name

__all__ = ["MODELS", "ModelConfig", "block_shapes", "from_hf", "load", "param_shapes",
           "preset_names", "presets"]
