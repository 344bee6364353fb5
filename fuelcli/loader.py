"""MODEL argument -> config, weights and tokenizer, whatever the file kind."""

from dataclasses import dataclass
from functools import cached_property

from .config import ModelConfig, load_hf_config
from .source import ModelSource, resolve


@dataclass
class Model:
    source: ModelSource
    cfg: ModelConfig

    @cached_property
    def weights(self):
        from .weights.hf import load_hf_weights

        return load_hf_weights(self.source.path, self.cfg)

    @cached_property
    def tokenizer(self):
        from .tokenizer import Tokenizer

        return Tokenizer.from_dir(self.source.path)

    def eos_ids(self) -> set:
        return set(self.cfg.eos_token_ids) | set(self.tokenizer.eos_token_ids)


def open_model(model: str, revision: str | None = None) -> Model:
    """Resolves MODEL and reads its config; weights and tokenizer load on first use."""
    source = resolve(model, revision)
    return Model(source, load_hf_config(source.path))
