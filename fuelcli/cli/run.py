"""`fuel run MODEL [PROMPT]`: generate, streamed to stdout, with a stats line on stderr."""

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import (OPEN_ENDED_CTX, Activations, CacheType, ChatTemplate, ChatTemplateKwargs, Device, DraftMax,
                      DraftModel, DraftPMin, HfFile, LookupDecoding, MinKeep, MinP, ModelArg, RepeatLastN, GrammarFile,
                      JsonSchemaFile, RepeatPenalty, Revision, Seed, Stop, System, SystemFile, Temp, Threads, TopK,
                      TopP, VerbosePrompt, ctx_size_option, err, unescape)


@app.command(short_help="Generate text from a prompt, streamed.")
def run(
    ctx: typer.Context,
    model: str = ModelArg,
    prompt: Optional[str] = typer.Argument(None, metavar="PROMPT", help="the prompt (the user message when a chat "
                                           "template is applied); - reads it from stdin"),
    prompt_option: Optional[str] = typer.Option(None, "-p", "--prompt", metavar="TEXT",
                                                help="the prompt, as llama-cli takes it (instead of PROMPT)"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", metavar="FILE", help="read the prompt from FILE"),
    max_tokens: int = typer.Option(256, "-n", "--max-tokens", help="most tokens to generate; -1 = until EOS or a "
                                   "full context"),
    temp: float = Temp,
    top_k: int = TopK,
    top_p: float = TopP,
    min_p: float = MinP,
    min_keep: int = MinKeep,
    repeat_penalty: float = RepeatPenalty,
    repeat_last_n: int = RepeatLastN,
    seed: Optional[int] = Seed,
    stop: list[str] = Stop,
    json_schema: Optional[Path] = JsonSchemaFile,
    grammar: Optional[Path] = GrammarFile,
    system: Optional[str] = System,
    system_file: Optional[Path] = SystemFile,
    use_chat_template: Optional[bool] = typer.Option(None, "--use-chat-template/--no-chat-template", help="apply "
                                                     "the model's chat template, or send the prompt as raw text "
                                                     "(default: the template, but raw text for a base model's demo "
                                                     "alias; fuel pull --list says which)"),
    chat_template: Optional[Path] = ChatTemplate,
    chat_template_kwargs: Optional[str] = ChatTemplateKwargs,
    ctx_size: Optional[int] = ctx_size_option(f"the prompt + -n; with -n -1, {OPEN_ENDED_CTX} or the model's "
                                              "if smaller"),
    threads: Optional[int] = Threads,
    verbose_prompt: bool = VerbosePrompt,
    draft_model: Optional[str] = DraftModel,
    lookup_decoding: bool = LookupDecoding,
    draft_max: Optional[int] = DraftMax,
    draft_p_min: Optional[float] = DraftPMin,
    as_json: bool = typer.Option(False, "--json", help="no streaming: print one JSON object (text, token ids, "
                                 "stats) when done"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="no stats line on stderr"),
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = Activations,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Generate text from a prompt, streamed to stdout; a stats line goes to stderr. At a terminal
    without a prompt it starts `fuel chat`, as `ollama run` does, and a demo alias not pulled yet is
    offered to be pulled.

    The prompt is PROMPT (or -p TEXT), stdin (PROMPT -) or --file; text piped in or read with
    --file goes before PROMPT, joined by a space (cat notes.txt | fuel run MODEL "Summarise:").

    Sampling follows llama.cpp's chain: repetition penalty -> top-k -> top-p -> min-p ->
    temperature, so top-p and min-p see the probabilities at temperature 1; --temp 0 is greedy.
    Generation stops at an EOS token, a --stop string, -n tokens or a full context.

    --json-schema FILE or --grammar FILE (GBNF) constrain the output: a token the grammar refuses
    is never drawn, and EOS only comes where the grammar may end (so -n can still cut it short).

    --draft-model MODEL or --lookup-decoding: speculative decoding. Proposals (a small model's, or
    the n-grams of the text so far) are verified several per forward of the model; greedy output
    is the plain decoding's, sampled output follows the model's distribution (rejection sampling).
    The stats line (and --json) gives how many proposals were accepted.
    """
    from ..process.memory import peak_rss_bytes
    from ..assembly.loader import open_model
    from ..text.generate import Sampler, SamplerParams, Stats, generate
    from ..text.reply_formats import readable
    from ..process.threads import set_threads
    from ..sources.demo import is_base
    from .run_defaults import chat_instead, offer_pull
    from .textgen import (at_a_terminal, context_size, output_grammar, prompt_text, ready_engine, show_prompt,
                          SpeculationOptions, system_text, template_options)

    if max_tokens == 0 or max_tokens < -1:
        raise InputError(f"--max-tokens must be at least 1, or -1 (no limit), got {max_tokens}")
    if prompt_option is not None:
        if prompt is not None:
            raise InputError("give the prompt as PROMPT or with -p/--prompt, not both")
        prompt = prompt_option
    if at_a_terminal():
        offer_pull(model)
        if prompt is None and file is None:
            return chat_instead(ctx)
    params = SamplerParams(temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, seed, min_keep)
    wanted = output_grammar(json_schema, grammar)
    speculating = SpeculationOptions(draft_model, lookup_decoding, draft_max, draft_p_min)
    text = prompt_text(prompt, file)
    system = system_text(system, system_file)
    n_threads = set_threads(threads)
    m = open_model(model, revision, hf_file)
    m.prefetch()
    tok = m.tokenizer
    kwargs = template_options(tok, chat_template, chat_template_kwargs)
    needs = [flag for flag, used in (("--system", system is not None), ("--chat-template-kwargs", kwargs is not None))
             if used]
    if needs and (use_chat_template is False or not tok.chat_template):
        raise InputError(f"{needs[0]} needs the model's chat template" +
                         (" (drop --no-chat-template)" if use_chat_template is False else "; this model has none"))
    if use_chat_template is None:  # a base model's template is used only when asked for (a file, its features)
        use_chat_template = not is_base(m.source) or chat_template is not None or bool(needs)
    speculating.open(m)
    ids = tok.encode_prompt(text, system=system, chat=use_chat_template, template_kwargs=kwargs)
    unlimited = max_tokens == -1
    n_ctx = context_size(ctx_size, m.cfg.max_position, OPEN_ENDED_CTX if unlimited else len(ids) + max_tokens)
    if unlimited:
        max_tokens = n_ctx  # more than the context leaves: EOS, a stop string or the full context ends it
    if len(ids) >= n_ctx:
        raise InputError(f"the prompt has {len(ids)} tokens; the context is {n_ctx}"
                         + ("" if n_ctx < m.cfg.max_position else " (the model's)"))
    if verbose_prompt:
        show_prompt(tok, ids)
    constraint = None
    if wanted is not None:
        from ..text.grammar import Constraint

        constraint = Constraint(wanted, tok, m.cfg.vocab_size, m.eos_ids())
    sampler = Sampler(params, constraint)
    engine, compile_s = ready_engine(m, n_ctx, device, quiet, cache_type, rows=speculating.on,
                                     activations=activations)
    spec = speculating.build(m, params, n_ctx, device, cache_type, activations)
    stats = Stats(compile_s=compile_s)
    pieces, interrupted = [], False
    # a harmony (gpt-oss) or Gemma 4 reply: its reasoning shown between <think> and </think>, then the answer
    reader = readable(tok.chat_template) if use_chat_template else None
    try:
        for piece in generate(engine, tok, ids, max_tokens, sampler, m.eos_ids(), [unescape(s) for s in stop], stats,
                              speculation=spec, reader=reader):
            if as_json:
                pieces.append(piece)
            else:
                sys.stdout.write(piece)
                sys.stdout.flush()
    except KeyboardInterrupt:
        interrupted = True
    if as_json:
        out = {"model": m.source.name, "text": "".join(pieces), "tokens": stats.tokens, "n_ctx": engine.n_ctx,
               "threads": n_threads, "stats": stats.to_json(peak_rss_bytes()), "interrupted": interrupted}
        print(json.dumps(out, ensure_ascii=False, indent=2))
    else:
        sys.stdout.write("\n")
        if not quiet:
            err(stats.line(peak_rss_bytes()) + (" | interrupted" if interrupted else ""))
    if interrupted:
        raise typer.Exit(130)
