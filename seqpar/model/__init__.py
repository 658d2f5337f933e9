"""The model level: a LLaMA-style decoder trained with any registered sequence-parallel attention
(no Ray, no MLflow). `config.py` holds the shape, `transformer.py` the model, `checkpointing.py`
the activation checkpointing modes, `head.py` the (fused) LM head with cross-entropy."""

from seqpar.model.checkpointing import MODES as CHECKPOINT_MODES
from seqpar.model.config import PRESETS, ModelConfig
from seqpar.model.transformer import Transformer

__all__ = ["CHECKPOINT_MODES", "PRESETS", "ModelConfig", "Transformer"]
