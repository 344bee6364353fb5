"""What `fuel run` and `fuel chat` share: prompt text from arguments, pipes and files; the chat
template options; the context size; an engine warmed up before any clock starts."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..errors import InputError
from .options import err


def read_text(path: Path, flag: str, strip_newline: bool = True) -> str:
    """A UTF-8 text file given by `flag`; one trailing newline dropped, as llama-cli's -f does."""
    try:  # a FIFO is read too: `-f <(command)` is one
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{flag} {path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except OSError as e:
        raise InputError(f"{flag} {path}: cannot read: {e.strerror or e}") from None
    return text[:-1] if strip_newline and text.endswith("\n") else text


def stdin_piped() -> bool:
    return sys.stdin is not None and not sys.stdin.isatty()


def at_a_terminal() -> bool:
    """Someone types at stdin and reads stderr: a question may be asked, a chat started."""
    return sys.stdin is not None and sys.stdin.isatty() and sys.stderr.isatty()


def _stdin_text() -> str:
    text = sys.stdin.read()
    return text[:-1] if text.endswith("\n") else text


def prompt_text(prompt: str | None, file: Path | None) -> str:
    """PROMPT, `-` (all of stdin), or -f FILE; text piped in (or FILE) goes before a PROMPT, joined
    by a space, as ollama and llm do (`cat notes.txt | fuel run M "Summarise:"`)."""
    if prompt == "-":
        if file is not None:
            raise InputError("give the prompt as - (stdin) or with --file, not both")
        return _stdin_text()
    parts = []
    if file is not None:
        parts.append(read_text(file, "--file"))
    elif stdin_piped():
        piped = _stdin_text()
        if piped:
            parts.append(piped)
    if prompt is not None:
        parts.append(prompt)
    if not parts:
        raise InputError("no prompt: give PROMPT, - to read stdin, --file FILE, or pipe text in")
    return " ".join(parts)


def system_text(system: str | None, system_file: Path | None) -> str | None:
    if system is not None and system_file is not None:
        raise InputError("give --system or --system-file, not both")
    return read_text(system_file, "--system-file") if system_file is not None else system


def template_options(tok, template_file: Path | None, kwargs_json: str | None) -> dict | None:
    """Install --chat-template FILE on the tokenizer; parse --chat-template-kwargs."""
    if template_file is not None:
        tok.chat_template = read_text(template_file, "--chat-template", strip_newline=False)
        if not tok.chat_template.strip():
            raise InputError(f"--chat-template {template_file} is empty")
    if kwargs_json is None:
        return None
    try:
        kwargs = json.loads(kwargs_json)
    except ValueError as e:
        raise InputError(f"--chat-template-kwargs is not valid JSON: {e}") from None
    if not isinstance(kwargs, dict):
        raise InputError(f"--chat-template-kwargs must be a JSON object, got {type(kwargs).__name__}")
    return kwargs


def output_grammar(json_schema: Path | None, grammar: Path | None):
    """--json-schema FILE / --grammar FILE as a grammar.Grammar (None without either); checked, with
    llguidance's presence, before any model is loaded."""
    if json_schema is not None and grammar is not None:
        raise InputError("give --json-schema or --grammar, not both")
    if json_schema is None and grammar is None:
        return None
    from ..text import grammar as g

    g.require()
    if grammar is not None:
        return g.gbnf(read_text(grammar, "--grammar", strip_newline=False), what=f"--grammar {grammar}")
    text = read_text(json_schema, "--json-schema", strip_newline=False)
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise InputError(f"--json-schema {json_schema}: not valid JSON: {e}") from None
    return g.json_schema(schema, what=f"--json-schema {json_schema}")


def context_size(ctx_size: int | None, model_ctx: int, default: int) -> int:
    """-c: None = `default` (at most the model's), 0 = the model's, else at most the model's."""
    if ctx_size is None:
        return min(default, model_ctx)
    if ctx_size < 0:
        raise InputError(f"-c/--ctx-size must be >= 0 (0 = the model's), got {ctx_size}")
    if ctx_size > model_ctx:
        raise InputError(f"-c {ctx_size} exceeds the model's context of {model_ctx} tokens")
    return ctx_size or model_ctx


def show_prompt(tok, ids: list[int], label: str = "prompt"):
    """--verbose-prompt, as llama-cli: the text the model sees, then one line per id."""
    err(f"{label}: '{tok.decode(ids)}'")
    err(f"number of tokens in {label} = {len(ids)}")
    for i, piece in zip(ids, tok.token_text(ids)):
        err(f"{i:6d} -> {piece!r}")


def ready_engine(m, n_ctx: int, device: str | None, quiet: bool, cache_type: str = "f32", slots: int = 1,
                 rows: bool = False, activations: str | None = None):
    """An engine of n_ctx positions (for each of `slots` sequences), warmed up (with `rows` or
    several slots also for forwards of several decode rows: speculation's verify); also the compile
    time when this run compiled the kernels (0.0 when they came from the cache), so that no timing
    includes it. The start is over: the garbage collector resumes (process/collector.py)."""
    from ..backends import make_engine
    from ..process import collector

    engine = make_engine(m.cfg, m.weights, n_ctx=n_ctx, device=device, cache_type=cache_type, slots=slots,
                         activations=activations)
    compiling = not engine.compiled()
    if compiling and not quiet:
        formats = ", ".join(sorted({t.fmt for t in m.weights.tensors()}))
        err(f"compiling fuel's CPU kernels for {formats} weights (once per weight format on this machine, "
            "cached afterwards)...")
    t0 = time.perf_counter()
    engine.warm_up()
    if rows or slots > 1:
        engine.warm_up_rows()
    compile_s = time.perf_counter() - t0 if compiling else 0.0
    collector.resume(collect=compiling)
    return engine, compile_s


class SpeculationOptions:
    """--draft-model / --lookup-decoding and their settings, checked before anything loads;
    `open` reads the draft (and checks its vocabulary against the model's) before the model's
    engine is built, `build` makes the speculative.Speculation."""

    def __init__(self, draft_model: str | None, lookup: bool, draft_max: int | None, p_min: float | None):
        from ..text.speculative import DRAFT_MAX

        if draft_model is not None and lookup:
            raise InputError("give --draft-model or --lookup-decoding, not both")
        if draft_max is not None and not 1 <= draft_max <= DRAFT_MAX:
            raise InputError(f"--draft-max must be within 1..{DRAFT_MAX}, got {draft_max}")
        if p_min is not None and not 0 <= p_min <= 1:
            raise InputError(f"--draft-p-min must be within 0..1, got {p_min}")
        if draft_model is None and p_min is not None:
            raise InputError("--draft-p-min needs --draft-model")
        if draft_model is None and not lookup and draft_max is not None:
            raise InputError("--draft-max needs --draft-model or --lookup-decoding")
        self.draft_model, self.lookup, self.draft_max, self.p_min = draft_model, lookup, draft_max, p_min
        self.draft = None

    @property
    def on(self) -> bool:
        return self.lookup or self.draft_model is not None

    def open(self, m):
        if self.draft_model is not None:
            from ..assembly.loader import open_model
            from ..text.speculative import check_vocabularies

            self.draft = open_model(self.draft_model)
            check_vocabularies(m.tokenizer, self.draft.tokenizer, self.draft_model)
            self.draft.prefetch()

    def build(self, m, params, n_ctx: int, device: str | None, cache_type: str, activations: str | None = None):
        """The Speculation (None when off); a draft model's engine of n_ctx positions, warmed up."""
        from ..text import speculative

        if self.lookup:
            return speculative.lookup(self.draft_max)
        if self.draft is None:
            return None
        from ..backends import make_engine

        engine = make_engine(self.draft.cfg, self.draft.weights, n_ctx=n_ctx, device=device, cache_type=cache_type,
                             activations=activations)
        engine.warm_up()
        engine.warm_up_rows()  # a round's new tokens go through its decode kernels (DraftModel.follow)
        return speculative.draft_model(engine, m.cfg.vocab_size, params, self.draft_max,
                                       speculative.DRAFT_P_MIN if self.p_min is None else self.p_min)
