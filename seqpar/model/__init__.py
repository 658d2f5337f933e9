"""The model level: a decoder of any family seqpar models (docs/models.md: LLaMA's with what Qwen,
Gemma, gpt-oss, Mixtral and DeepSeek change over it), trained with any sequence-parallel attention
(no Ray, no MLflow; torch only). `config.py` holds the shape, `transformer.py` the model,
`checkpointing.py` the activation checkpointing modes, `head.py` the (fused) LM head with
cross-entropy, `init.py` the parameter values drawn shard by shard, `states.py` replicated or FSDP2
states and offload, `grads.py` the replicated gradients' reduction, `hf.py` Hugging Face
checkpoints, `memory.py` measured and predicted memory."""

from seqpar.model.checkpointing import MODES as CHECKPOINT_MODES
from seqpar.model.config import MODELS, ModelConfig
from seqpar.model.transformer import Transformer

__all__ = ["CHECKPOINT_MODES", "MODELS", "ModelConfig", "Transformer"]
