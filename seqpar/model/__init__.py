"""The model level: a LLaMA-style decoder trained with any registered sequence-parallel attention
(no Ray, no MLflow). Built in issue 10; the shape lives in `config.py`."""

from seqpar.model.config import PRESETS, ModelConfig

__all__ = ["PRESETS", "ModelConfig"]
