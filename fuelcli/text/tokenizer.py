"""Text <-> token ids, chat templates and streaming detokenization.

Built on the `tokenizers` library so ids match transformers' fast tokenizers exactly: the
tokenizer.json pipeline (normalizer, pre-tokenizer, BPE/Unigram model, post-processor, decoder) is
used as-is, and only the transformers-side conventions are re-done here (when BOS/EOS are added,
how the chat template is rendered).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import tokenizers
from tokenizers import processors

from ..errors import InputError
from ..process.panic_guard import call_quietly
from ..fileio.files import is_present, open_regular, read_regular
from ..fileio.jsondoc import MAX_BYTES, kind, read_object
from .gemma4_messages import folds_tool_results, for_template

_REPLACEMENT = "\ufffd"  # what the decoders emit for an incomplete UTF-8 sequence


def _read_json(path: Path) -> dict:
    return read_object(path, required=False) or {}


def _read_template(path: Path) -> str | None:
    """chat_template.jinja (transformers 5 saves the template there), which must be UTF-8 text."""
    if not is_present(path):
        return None
    try:
        return read_regular(path, MAX_BYTES).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not UTF-8 text (byte {e.start})") from None


def _token_str(value) -> str | None:
    # tokenizer_config stores special tokens as plain strings or as serialized AddedToken dicts.
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def _pick_template(value, where: Path) -> str | None:
    # A string, or a list of {name, template} of which transformers uses "default".
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if value is not None and not isinstance(value, str):
        raise InputError(f"{where}: chat_template must be a string (or a list of {{name, template}} with a "
                         f"string 'default'), got {kind(value)}")
    return value


def _set_post_processor(
    tok: tokenizers.Tokenizer, bos: str | None, eos: str | None, add_bos: bool, add_eos: bool
) -> None:
    """Same template transformers' TokenizersBackend.update_post_processor builds."""
    add_bos = add_bos and bos is not None and tok.token_to_id(bos) is not None
    add_eos = add_eos and eos is not None and tok.token_to_id(eos) is not None
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
    special = ([(bos, tok.token_to_id(bos))] if add_bos else []) + ([(eos, tok.token_to_id(eos))] if add_eos else [])
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


_JINJA_ENV = None


def _jinja_env():
    """The environment transformers' apply_chat_template renders in (utils/chat_template_utils.py)."""
    global _JINJA_ENV
    if _JINJA_ENV is None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            # Not jinja's own tojson: that one HTML-escapes, and templates expect plain JSON.
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _generation_tag()])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        _JINJA_ENV = env
    return _JINJA_ENV


def _generation_tag():
    """transformers' `{% generation %}...{% endgeneration %}` (AssistantTracker): it marks the
    assistant's part for training masks; rendering a prompt keeps the body as it is."""
    import jinja2.ext
    import jinja2.nodes

    class GenerationTag(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    return GenerationTag


class Tokenizer:
    def __init__(
        self,
        tok: tokenizers.Tokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
        template_tokens: dict[str, str] | None = None,
    ):
        self._tok = tok
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.bos_token_id = tok.token_to_id(bos_token) if bos_token else None
        # The tokenizer's own EOS; config.json / generation_config.json / GGUF ones live in ModelConfig.
        self.eos_token_id = tok.token_to_id(eos_token) if eos_token else None
        # Special-token strings the chat template sees (transformers passes its whole special_tokens_map).
        self._template_tokens = {k: v for k, v in (template_tokens or {}).items() if v is not None}
        self._template_tokens.update({k: v for k, v in (("bos_token", bos_token), ("eos_token", eos_token)) if v})
        self.vocab_size: int = tok.get_vocab_size(with_added_tokens=True)
        self._special_ids = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}

    # --- construction ---------------------------------------------------------------------------

    @classmethod
    def from_dir(cls, path: Path) -> "Tokenizer":
        path = Path(path)
        tj = path / "tokenizer.json"
        if not is_present(tj):
            raise InputError(f"{path}: no tokenizer.json")
        open_regular(tj).close()  # a FIFO or a directory is refused, not waited on
        try:  # the Rust side raises a plain Exception on a malformed file, or panics
            tok = call_quietly(tokenizers.Tokenizer.from_file, str(tj))
        except RuntimeError as e:
            raise InputError(f"{tj}: cannot load tokenizer ({e})") from None
        tc = _read_json(path / "tokenizer_config.json")
        config = _read_json(path / "config.json")

        def special(name: str) -> str | None:
            s = _token_str(tc.get(name))
            if s is None and config.get(f"{name}_id") is not None:  # fall back to config.json's id
                s = tok.id_to_token(_ids(config[f"{name}_id"])[0])
            return s

        bos, eos = special("bos_token"), special("eos_token")
        # BOS/EOS on encode: tokenizer.json's post-processor alone decides. transformers 5 drops
        # tokenizer_config's add_bos_token/add_eos_token whenever tokenizer.json exists (4.x honoured them).

        template = _read_template(path / "chat_template.jinja")  # transformers 5 saves it there; it wins
        if template is None:
            template = _pick_template(tc.get("chat_template"), path / "tokenizer_config.json")
        others = {k: _token_str(tc.get(k)) for k in ("unk_token", "pad_token")}
        return cls(tok, template, bos, eos, others)

    @classmethod
    def from_parts(
        cls,
        tok: tokenizers.Tokenizer,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        add_bos: bool,
        add_eos: bool = False,
    ) -> "Tokenizer":
        """For tokenizers built in code (GGUF metadata): the post-processor follows add_bos/add_eos."""
        _set_post_processor(tok, bos_token, eos_token, add_bos, add_eos)
        return cls(tok, chat_template, bos_token, eos_token)

    # --- ids <-> text ---------------------------------------------------------------------------

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True, parse_special: bool = True) -> list[int]:
        """parse_special=False reads special-token text ("<|im_end|>") as plain text, as llama.cpp's
        tokenizer does by default (llama-perplexity, the tokenizer test vectors)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # argv bytes that were not UTF-8 arrive as lone surrogates
            raise InputError(f"the text is not valid UTF-8 (an undecodable byte at character {e.start})") from None
        if parse_special:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        self._tok.encode_special_tokens = True
        try:
            return self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        finally:
            self._tok.encode_special_tokens = False

    @property
    def adds_bos(self) -> bool:
        """Whether encoding with special tokens puts BOS in front."""
        if self.bos_token_id is None:
            return False
        return self._tok.encode("a", add_special_tokens=True).ids[:1] == [self.bos_token_id] != \
            self._tok.encode("a", add_special_tokens=False).ids[:1]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_text(self, ids) -> list[str]:
        """Each id decoded on its own (byte pieces of a split character show as U+FFFD)."""
        return [self._tok.decode([int(i)], skip_special_tokens=False) for i in ids]

    def pieces(self, ids) -> list[str]:
        """The text each id adds after the one before it (a SentencePiece word keeps its leading
        space, which decoding a token alone strips); a token holding part of a character shows as
        U+FFFD."""
        ids = [int(i) for i in ids]
        out = []
        for i, t in enumerate(ids):
            if i:
                prev, both = self.decode(ids[i - 1:i]), self.decode(ids[i - 1:i + 1])
                if both.startswith(prev) and "\ufffd" not in prev:
                    out.append(both[len(prev):])
                    continue
            out.append(self.decode([t]))
        return out

    def is_special(self, token_id: int) -> bool:
        """True for the ids decode(skip_special_tokens=True) drops."""
        return token_id in self._special_ids

    # --- chat -----------------------------------------------------------------------------------

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                    template_kwargs: dict | None = None, tools: list[dict] | None = None) -> str:
        """`template_kwargs`: extra template variables (transformers' apply_chat_template **kwargs,
        llama-server's chat_template_kwargs), e.g. Qwen3's enable_thinking; they win over the
        special-token strings. `tools`: OpenAI's tool definitions, as transformers passes them.
        The first Gemma 4 template gets the tool results on the calling turn (gemma4_messages.py)."""
        reserved = {"messages", "add_generation_prompt", "tools"} & set(template_kwargs or {})
        if reserved:
            raise InputError(f"chat template kwargs cannot set {', '.join(sorted(reserved))}")
        if self.chat_template is None:
            raise InputError("the model has no chat template (use --no-chat for a raw prompt)")
        import jinja2

        if folds_tool_results(self.chat_template):
            messages = for_template(messages)
        try:
            template = _jinja_env().from_string(self.chat_template)
            return template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                tools=tools or None,
                documents=None,
                **{**self._template_tokens, **(template_kwargs or {})},
            )
        except jinja2.TemplateError as e:
            raise InputError(f"chat template error: {e}") from None
        except Exception as e:  # the template is data: anything it raises (1 // 0, range(10**9)) is its fault
            raise InputError(f"chat template error: {type(e).__name__}: {e}") from None

    def encode_prompt(self, prompt: str, system: str | None = None, chat: bool = True,
                      template_kwargs: dict | None = None) -> list[int]:
        if chat and self.chat_template is not None:
            messages = ([{"role": "system", "content": system}] if system is not None else []) + [
                {"role": "user", "content": prompt}
            ]
            return self.encode_messages(messages, template_kwargs=template_kwargs)
        return self.encode(prompt, add_special_tokens=True)

    def encode_messages(self, messages: list[dict], add_generation_prompt: bool = True,
                        template_kwargs: dict | None = None) -> list[int]:
        """A conversation rendered by the chat template, as ids. The template writes BOS itself
        where the model wants it, as apply_chat_template(tokenize=True)."""
        text = self.render_chat(messages, add_generation_prompt, template_kwargs)
        return self.encode(text, add_special_tokens=False)

    # --- streaming ------------------------------------------------------------------------------

    def stream(self, skip_special_tokens: bool = False) -> "StreamDecoder":
        return StreamDecoder(self, skip_special_tokens)


class StreamDecoder:
    """Incremental detokenizer: the concatenation of push() and flush() results equals decode(all ids).

    Decoding single tokens is wrong in two ways: a token may carry only part of a UTF-8 character
    (byte-level BPE, SentencePiece byte fallback), and decoders treat a sequence's first token
    specially (Metaspace/Strip drop its leading space). So each push decodes a short window that
    starts one emitted chunk back (prefix) and emits the part past the prefix's text, holding back
    while the text ends in U+FFFD (an incomplete character).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._prefix = 0  # window start
        self._read = 0  # ids before this index have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)

    def push(self, token_id: int) -> str:
        # Skipped specials are dropped here rather than in decode, so a window never starts with one
        # (decode would then strip the leading space of the token after it).
        if self._skip and self._tokenizer.is_special(token_id):
            return ""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        if len(text) <= len(prefix_text) or text.endswith(_REPLACEMENT):
            return ""  # nothing new yet, or a character still incomplete
        self._prefix, self._read = self._read, len(self._ids)
        # a multi-byte character cut off by the end of generation decodes to U+FFFD: drop it
        return text[len(prefix_text) :].rstrip("\ufffd")

    def flush(self) -> str:
        prefix_text = self._decode(self._ids[self._prefix : self._read])
        text = self._decode(self._ids[self._prefix :])
        self._prefix, self._read = self._read, len(self._ids)
        return text[len(prefix_text) :]
