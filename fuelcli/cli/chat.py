"""`fuel chat MODEL`: a multi-turn conversation, streamed, kept in the KV cache (fuelcli/text/chat.py)."""

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import (OPEN_ENDED_CTX, Activations, CacheType, ChatTemplate, ChatTemplateKwargs, Device, DraftMax,
                      DraftModel, DraftPMin, HfFile, LookupDecoding, MinKeep, MinP, ModelArg, RepeatLastN,
                      RepeatPenalty, Revision, Seed, Stop, System, SystemFile, Temp, Threads, TopK, TopP,
                      VerbosePrompt, ctx_size_option, err, unescape)

COMMANDS = """commands:
  /system TEXT   set the system message (/system alone shows it)
  /clear         forget the conversation
  /exit, /bye    leave (or Ctrl-D)
  /help          this list
a line ending in \\ continues on the next line; Ctrl-C stops a reply"""


@app.command(short_help="Chat with a model, turn by turn.")
def chat(
    model: str = ModelArg,
    system: Optional[str] = System,
    system_file: Optional[Path] = SystemFile,
    max_tokens: int = typer.Option(-1, "-n", "--max-tokens", help="most tokens per reply; -1 = until the end of "
                                   "the reply or a full context"),
    temp: float = Temp,
    top_k: int = TopK,
    top_p: float = TopP,
    min_p: float = MinP,
    min_keep: int = MinKeep,
    repeat_penalty: float = RepeatPenalty,
    repeat_last_n: int = RepeatLastN,
    seed: Optional[int] = Seed,
    stop: list[str] = Stop,
    chat_template: Optional[Path] = ChatTemplate,
    chat_template_kwargs: Optional[str] = ChatTemplateKwargs,
    ctx_size: Optional[int] = ctx_size_option(f"{OPEN_ENDED_CTX}, or the model's if smaller"),
    threads: Optional[int] = Threads,
    verbose_prompt: bool = VerbosePrompt,
    stats: bool = typer.Option(False, "--stats", help="a stats line on stderr after each reply"),
    draft_model: Optional[str] = DraftModel,
    lookup_decoding: bool = LookupDecoding,
    draft_max: Optional[int] = DraftMax,
    draft_p_min: Optional[float] = DraftPMin,
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = Activations,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Chat with a model, turn by turn; replies stream to stdout.

    The conversation stays in the KV cache, so each turn prefills only its own tokens; when it
    outgrows the context (-c) its oldest exchanges are dropped. Commands: /system TEXT, /clear,
    /exit (or Ctrl-D), /help. Ctrl-C stops the current reply and returns to the prompt; the part
    already written stays in the conversation. Line editing and history (FUEL_HOME/chat_history)
    come from readline.

    When stdin is not a terminal, each input line is one user turn and each reply is written to
    stdout followed by a newline, so a chat can be scripted: printf 'Hi\\nAnd then?\\n' | fuel chat MODEL.
    Read at a terminal, each such turn is shown as `>>> TEXT` and its reply ends with a blank line.

    Sampling as in fuel run (llama.cpp's chain: repetition penalty -> top-k -> top-p -> min-p ->
    temperature); speculative decoding too (--draft-model, --lookup-decoding).
    """
    from ..assembly.loader import open_model
    from ..text.chat import ChatSession
    from ..text.generate import Sampler, SamplerParams
    from ..process.threads import set_threads
    from ..sources.demo import is_base
    from .textgen import SpeculationOptions, context_size, ready_engine, system_text, template_options

    if max_tokens == 0 or max_tokens < -1:
        raise InputError(f"--max-tokens must be at least 1, or -1 (no limit), got {max_tokens}")
    params = SamplerParams(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, min_keep)
    sampler = Sampler(params)
    speculating = SpeculationOptions(draft_model, lookup_decoding, draft_max, draft_p_min)
    system = system_text(system, system_file)
    set_threads(threads)
    m = open_model(model, revision, hf_file)
    m.prefetch()
    tok = m.tokenizer
    kwargs = template_options(tok, chat_template, chat_template_kwargs)
    n_ctx = context_size(ctx_size, m.cfg.max_position, OPEN_ENDED_CTX)
    interactive = sys.stdin.isatty()
    if not tok.chat_template:
        raise InputError("fuel chat needs a chat template; this model has none (give --chat-template FILE)")
    speculating.open(m)
    engine, _ = ready_engine(m, n_ctx, device, quiet=False, cache_type=cache_type, rows=speculating.on,
                             activations=activations)
    session = ChatSession(engine, tok, sampler, m.eos_ids(), system, kwargs, [unescape(s) for s in stop],
                          max_tokens if max_tokens > 0 else None,
                          speculating.build(m, params, n_ctx, device, cache_type, activations))
    if is_base(m.source):
        err(f"fuel chat: {m.source.name} is a base model, not tuned to chat: its replies may wander "
            "(fuel pull --list says which demos are)")
    if interactive:
        _line_editing()
        err(f"fuel chat: {m.source.name}, context {n_ctx} tokens. /help for commands, Ctrl-D to leave.")
    _loop(session, tok, interactive, verbose_prompt, stats)


def _loop(session, tok, interactive: bool, verbose_prompt: bool, show_stats: bool):
    from ..process.memory import peak_rss_bytes
    from ..text.generate import Stats
    from .textgen import show_prompt

    # piped turns read at a terminal: no echo shows where a reply ends and the next turn begins, so
    # write the turn as a prompt would show it; into a pipe, a line per reply stays as scripts read it
    transcript = not interactive and sys.stdout.isatty()
    while True:
        text = _read_turn(interactive)
        if text is None:
            break
        if not text.strip():
            continue
        if text.startswith("/"):
            if _command(session, text.strip()):
                break
            continue
        turn = session.prepare(text)
        if turn.dropped:
            err(f"(dropped the {turn.dropped} oldest exchange{'s' if turn.dropped > 1 else ''} to fit the "
                f"context of {session.engine.n_ctx} tokens)")
        if verbose_prompt:
            err(f"reusing {turn.cached} cached tokens")
            show_prompt(tok, turn.ids[turn.cached:], "turn")
        if transcript:
            sys.stdout.write(">>> " + text + "\n")
        st = Stats()
        reply = session.reply(turn, st)
        interrupted = False
        try:
            for piece in reply:
                sys.stdout.write(piece)
                sys.stdout.flush()
        except KeyboardInterrupt:
            if not interactive:
                raise
            interrupted = True
        finally:
            reply.close()  # the session records what was written, also when interrupted
        sys.stdout.write("\n\n" if interactive or transcript else "\n")
        sys.stdout.flush()
        if st.stop_reason == "context full":
            err("(the context is full: the reply was cut; older exchanges will be dropped, or /clear)")
        if show_stats:
            err(st.line(peak_rss_bytes()) + (" | interrupted" if interrupted else ""))


def _read_turn(interactive: bool):
    """The next user message (lines ending in a backslash continue it, at a terminal); None at the end."""
    lines = []
    while True:
        try:
            line = input((">>> " if not lines else "... ") if interactive else "")
        except EOFError:
            if interactive:
                sys.stdout.write("\n")
            return "\n".join(lines) if lines else None
        except KeyboardInterrupt:
            if not interactive:
                raise
            sys.stdout.write("\n")
            err("(Ctrl-D or /exit to leave)")
            lines = []
            continue
        if interactive and line.endswith("\\"):
            lines.append(line[:-1])
            continue
        lines.append(line)
        return "\n".join(lines)


def _command(session, line: str) -> bool:
    """Run a /command; True to leave."""
    name, _, arg = line.partition(" ")
    if name in ("/exit", "/bye", "/quit"):
        return True
    if name == "/clear":
        session.clear()
        err("(conversation cleared)")
    elif name == "/system":
        if arg.strip():
            session.set_system(arg.strip())
            err("(system message set)")
        else:
            err(f"system message: {session.system!r}" if session.system else "(no system message)")
    elif name in ("/help", "/?"):
        err(COMMANDS)
    else:
        err(f"unknown command {name}; /help lists them")
    return False


def _line_editing():
    """readline: line editing and a history kept in FUEL_HOME/chat_history."""
    try:
        import atexit
        import readline
    except ImportError:  # no readline (e.g. Windows): input() still works, without editing
        return
    from ..fileio.derived_cache import fuel_home

    path = fuel_home() / "chat_history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    atexit.register(save)
