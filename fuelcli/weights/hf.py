"""HF checkpoint -> ModelWeights, under the family's HF tensor names (families/schema.py)."""

from pathlib import Path

from ..families import FAMILIES
from ..model.config import ModelConfig
from .build import Lookup, ModelWeights, build_weights
from .safetensors import read_checkpoint


def load_hf_weights(model_dir: Path, cfg: ModelConfig) -> ModelWeights:
    w = Lookup(read_checkpoint(model_dir), str(model_dir))
    return build_weights(w, FAMILIES[cfg.family].weights, "hf", cfg)
