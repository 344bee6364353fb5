"""MODEL argument -> config, weights and tokenizer, whatever the file kind."""

from dataclasses import dataclass
from functools import cached_property

from ..errors import located
from ..model.config import ModelConfig, load_hf_config
from ..sources.source import ModelSource, resolve
from ..text.reply_formats import turn_end_ids


@dataclass
class Model:
    source: ModelSource
    cfg: ModelConfig
    gguf: object = None  # the parsed GGUFFile (header + mmap) for .gguf sources: parsed once, shared

    @cached_property
    def weights(self):
        if self.gguf is not None:
            from ..weights.gguf_model import load_gguf_weights

            return load_gguf_weights(self.gguf, self.cfg)
        from ..weights.hf import load_hf_weights

        return load_hf_weights(self.source.path, self.cfg)

    @cached_property
    def tokenizer(self):
        if self.gguf is not None:
            from ..families import FAMILIES
            from ..text.gguf_tokenizer import tokenizer_from_gguf

            tok = located(self.gguf.path, lambda: tokenizer_from_gguf(self.gguf.meta))
            if tok.chat_template is None:  # a file without one gets its family's (Gemma 3's 270M has none)
                tok.chat_template = FAMILIES[self.cfg.family].chat_template
            return tok
        from ..text.tokenizer import Tokenizer

        return Tokenizer.from_dir(self.source.path)

    def prefetch(self):
        """Maps the weights' pages into the process in the background (weights/prefetch.py): the
        commands that run the model call it before they build the tokenizer, which keeps the main
        thread busy for a few tenths of a second meanwhile. Returns the mapping thread, or None
        where nothing is mapped (weights/prefetch.py's start)."""
        from ..weights.prefetch import start

        stored = self.gguf.tensors.values() if self.gguf is not None else self.weights.tensors()
        return start([t.data for t in stored])

    def eos_ids(self) -> set:
        own = self.tokenizer.eos_token_id
        # a harmony (gpt-oss) turn ends at <|return|> or <|call|>, a Gemma 4 one at <turn|> or
        # <|tool_response>, where a GGUF names one EOS
        return set(self.cfg.eos_token_ids) | ({own} if own is not None else set()) | turn_end_ids(self.tokenizer)


def open_model(model: str, revision: str | None = None, hf_file: str | None = None) -> Model:
    """Resolves MODEL and reads its config; weights and tokenizer load on first use."""
    source = resolve(model, revision, hf_file)
    if source.kind == "gguf":
        from ..weights.gguf import read_gguf
        from ..weights.gguf_model import gguf_config

        gf = read_gguf(source.path)
        return Model(source, gguf_config(gf), gf)
    from ..weights.safetensors import checkpoint_bytes

    return Model(source, load_hf_config(source.path, checkpoint_bytes(source.path)))


def open_tokenizer(model: str, revision: str | None = None, hf_file: str | None = None):
    """(source, Tokenizer) for MODEL without reading weights or config: a .gguf file's metadata
    (a vocabulary-only file will do), or a directory (or hub repo) with a tokenizer.json."""
    source = resolve(model, revision, hf_file, tokenizer_only=True)
    if source.kind == "gguf":
        from ..text.gguf_tokenizer import tokenizer_from_gguf
        from ..weights.gguf import read_gguf

        meta = read_gguf(source.path, tensors=False).meta
        return source, located(str(source.path), lambda: tokenizer_from_gguf(meta))
    from ..text.tokenizer import Tokenizer

    return source, Tokenizer.from_dir(source.path)
