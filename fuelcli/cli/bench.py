"""`fuel bench MODEL`: llama-bench-style pp/tg throughput, optionally side by side with a peer runner."""

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import (Activations, BenchThreads, CacheType, Device, DraftMax, DraftModel, DraftPMin, HfFile,
                      LookupDecoding, ModelArg, Revision)

B_FIRST_PROMPT = "Write a Python function that reverses a string."


@app.command(short_help="Measure prefill and decode speed (llama-bench style).")
def bench(
    model: str = ModelArg,
    n_prompt: str = typer.Option("512", "-p", "--n-prompt", help="pp tests: prompt sizes, comma list; 0 = none"),
    n_gen: str = typer.Option("128", "-n", "--n-gen", help="tg tests: tokens to generate, comma list; 0 = none"),
    depth: str = typer.Option("0", "-d", "--n-depth", help="context depth: tokens cached (untimed) before each run, comma list"),
    parallel: str = typer.Option("1", "--parallel", "-np", help="tg tests: sequences decoding side by side, "
                                 "comma list (as `serve --parallel`): tokens/s summed over them, and per sequence"),
    repetitions: int = typer.Option(5, "-r", "--repetitions", help="timed runs per test, after one untimed warm-up"),
    threads: Optional[int] = BenchThreads,
    output: str = typer.Option("md", "-o", "--output", help="md | json | csv"),
    compare: Optional[str] = typer.Option(None, "--compare", help="also run the tests on a peer, interleaved: "
                                          "llama.cpp (GGUF, needs llama-cpp-python) | transformers (float32)"),
    seed: int = typer.Option(0, "--seed", help="seed of the random token ids"),
    roofline: bool = typer.Option(True, "--roofline/--no-roofline", help="tg tests: measure read bandwidth "
                                  "before and after the tests and report the fraction of the memory roofline "
                                  "reached (against the higher)"),
    first_token: bool = typer.Option(False, "--first-token", help="instead of pp/tg: seconds from starting "
                                     "`fuel run` to its first token, with an empty and a warm kernel cache "
                                     "(and llama.cpp's load + first token with --compare llama.cpp)"),
    prompt: str = typer.Option(B_FIRST_PROMPT, "--prompt", help="--first-token, speculation: the prompt"),
    file: Optional[Path] = typer.Option(None, "-f", "--file", metavar="FILE", help="speculation: read the prompt "
                                        "from FILE"),
    draft_model: Optional[str] = DraftModel,
    lookup_decoding: bool = LookupDecoding,
    draft_max: Optional[int] = DraftMax,
    draft_p_min: Optional[float] = DraftPMin,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="progress on stderr: a bar on a "
                                  "terminal, a line per run in a pipe or a log"),
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = typer.Option(None, "--activations", metavar="KIND", help=Activations.help + "; a "
                                              "comma list (int16,q8) runs an engine of each, interleaved, a row "
                                              "each with its rate against the first"),
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Measure prefill (pp<N>) and decode (tg<N>) speed in tokens/s: mean ± std over -r runs.

    The table (or JSON / CSV) goes to stdout, the progress to stderr (a line per run where stderr is
    not a terminal). A peer (--compare)
    runs in a process of its own with the same number of threads as fuel (-t).

    With --lookup-decoding or --draft-model D: speculative decoding's speed-up instead, greedy
    decoding of -n tokens after the prompt (--prompt or -f FILE, through the chat template),
    plain and speculative alternating; with --compare llama.cpp also llama.cpp plain and with its
    prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding).
    """
    from ..measure import bench as B
    from .textgen import SpeculationOptions

    speculating = SpeculationOptions(draft_model, lookup_decoding, draft_max, draft_p_min)
    if first_token:
        if speculating.on:
            raise InputError("--first-token does not take --draft-model or --lookup-decoding")
        return _first_token(model, compare, repetitions, threads, prompt, output, progress, revision)
    if file is not None and not speculating.on:
        raise InputError("-f/--file needs --lookup-decoding or --draft-model (the prompt of a speculation run)")
    kinds = _activation_kinds(activations, device)
    if speculating.on:
        if len(kinds) > 1:
            raise InputError(f"--activations {activations}: a speculation run takes one kind")
        unused = [f for f, v, default in (("-p", n_prompt, "512"), ("-d", depth, "0"), ("--parallel", parallel, "1"))
                  if v != default]
        if unused:
            raise InputError(f"{unused[0]} does not apply to a speculation run (greedy -n tokens after the prompt)")
        return _speculation(model, speculating, prompt, file, n_gen, compare, repetitions, threads, output,
                            progress, device, cache_type, revision, hf_file, activations)
    if output not in B.RENDERERS:
        raise InputError(f"-o must be one of {', '.join(B.RENDERERS)}, got {output!r}")
    if repetitions < 1:
        raise InputError(f"-r must be at least 1, got {repetitions}")
    tests = B.make_tests(B.parse_int_list(n_prompt, "-p"), B.parse_int_list(n_gen, "-n"),
                         B.parse_int_list(depth, "-d"), B.parse_int_list(parallel, "--parallel"))

    from ..backends import make_engine
    from ..process.memory import peak_rss_bytes
    from ..assembly.loader import open_model
    from ..process.threads import set_threads

    n_threads = set_threads(threads)

    if compare is not None:
        from ..peers import require

        require(compare, "--compare")  # fail fast: an unknown or missing peer, before loading anything heavy
    m = open_model(model, revision, hf_file)
    kind = B.check_peer(compare, m.source.kind) if compare is not None else None
    n_ctx = B.context_needed(tests)
    if n_ctx > m.cfg.max_position:
        raise InputError(f"the tests need a context of {n_ctx} (depth + tokens + 1); the model's is {m.cfg.max_position}")
    # every page of the weights mapped before the runs, as llama.cpp maps its file (MAP_POPULATE): a
    # MoE file's experts are otherwise faulted in by the first token that picks each, inside a timed
    # run (the 8-layer Qwen3-30B-A3B shape: ~130 faults and +50% CPU time a token at the start)
    mapping = m.prefetch()
    engines = [make_engine(m.cfg, m.weights, n_ctx=n_ctx, device=device, cache_type=cache_type,
                           slots=B.seqs_needed(tests), activations=kind) for kind in kinds]
    for e in engines:
        e.free_cpus = None  # a benchmark runs on its thread count throughout, as its peer does
        if e.device == "cpu":  # its forward compiles in a child (jit.compile_elsewhere): not in the peak RSS
            e.warm_up()
    engine = engines[0]
    runners = [B.FuelRunner(e, "fuel" if len(engines) == 1 else f"fuel {kind}") for e, kind in zip(engines, kinds)]
    if mapping is not None:
        mapping.join()
    info = B.model_info(m.source, m.cfg, m.weights)

    peer_factory = None
    if kind is not None:
        peer_factory = lambda: B.start_peer(kind, m.source, n_threads, n_ctx, tests)  # noqa: E731

    total = B.steps_total(len(tests), repetitions, peer_factory is not None, len(runners))
    load_before = B.load_average()
    tg_specs, bw_before = [t for t in tests if t.kind == "tg"], None
    if roofline and tg_specs:  # the largest working set a tg test reads per step
        ws = max(_bytes_per_token(m, engine, t) * t.seqs for t in tg_specs)
        bw_before = _bandwidth(engine, ws, n_threads)
    console = None
    if progress:
        from rich.console import Console

        console = Console(stderr=True)
    if console is not None and console.is_terminal:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       console=console, transient=True)
        with bar:
            task = bar.add_task("fuel warm-up", total=total)
            results, peer = B.run_bench(runners, tests, repetitions, m.cfg.vocab_size, seed,
                                        peer_factory, lambda d: bar.update(task, advance=1, description=d))
    else:  # a pipe or a log shows no bar: a plain line per run there, as llama-bench's --progress
        results, peer = B.run_bench(runners, tests, repetitions, m.cfg.vocab_size, seed, peer_factory,
                                    _progress_lines(total) if progress else None)

    report = B.Report(info, n_threads, repetitions, seed, n_ctx, results, peak_rss_bytes(), engine.kv_bytes,
                      backend=engine.backend)
    load_after = B.load_average()
    if load_before is not None and load_after is not None:
        report.load = {"cpus": os.cpu_count() or 1, "threads": n_threads if engine.device == "cpu" else 1,
                       "before": load_before, "after": load_after}
    tg = [r for r in results if r.spec.kind == "tg"]
    for r in tg:
        r.bytes_per_token = _bytes_per_token(m, engine, r.spec)
    if bw_before:
        report.bandwidth = _roofline(bw_before, _bandwidth(engine, ws, n_threads))
    if peer is not None:
        report.peer = {"name": peer.name, "detail": peer.detail, "threads": peer.threads,
                       "peak_rss_bytes": peer.peak_rss_bytes()}
        peer.close()
    sys.stdout.write(B.RENDERERS[output](report))
    sys.stdout.flush()


def _activation_kinds(activations: str | None, device: str | None) -> list:
    """--activations as a list of kinds (a comma list: an engine of each), each checked as make_engine
    checks one; a kind twice is an error."""
    from ..backends import resolve_activations, resolve_device

    if activations is None or "," not in activations:
        return [activations]
    if any(not k.strip() for k in activations.split(",")):
        raise InputError(f"--activations {activations!r}: an empty kind in the list")
    kinds = [resolve_activations(k, resolve_device(device)) for k in activations.split(",")]
    if len(set(kinds)) < len(kinds):
        raise InputError(f"--activations {activations}: a kind twice")
    return kinds


def _progress_lines(total: int):
    """run_bench's tick where stderr is not a terminal: `fuel bench: 3/12 fuel pp512 1/5`, flushed at
    once, so a log or a pipe shows how far the runs have come."""
    done = 0

    def tick(desc: str):
        nonlocal done
        done += 1
        print(f"fuel bench: {done}/{total} {desc}", file=sys.stderr, flush=True)

    return tick


def _bytes_per_token(m, engine, spec) -> int:
    """A tg test's bytes read per token made: the KV cache read grows along the run, so count its
    mean length."""
    from ..measure import bench as B

    return B.bytes_per_token(m.cfg, m.weights, spec.depth + (spec.n_tokens + 1) / 2, engine.kv_value_bytes, spec.seqs)


def _roofline(before: dict, after: dict | None) -> dict:
    """The roofline's bandwidth from the measurements before and after the tests: the higher (a
    shared host's memory moved between ~50 and ~89 GB/s within minutes here, so one measurement
    could put a test above 100%), both kept."""
    if after is None:
        return before
    return dict(before, bytes_per_s=max(before["bytes_per_s"], after["bytes_per_s"]),
                measured=[before["bytes_per_s"], after["bytes_per_s"]])


def _bandwidth(engine, ws: int, n_threads: int) -> dict | None:
    """The roofline's read bandwidth over the working set ws: the CPU's with the test's threads, a
    GPU's in-process (its buffer is device memory, at most 1 GiB), None on the simulator or when the
    GPU has no room for the buffer (the table then has no roofline columns)."""
    from ..measure import bench as B

    if engine.device == "cpu":
        return {"bytes": ws, "threads": n_threads, "bytes_per_s": B.measure_bandwidth(ws, n_threads)}
    from ..backends.cuda import bandwidth
    from ..backends.cuda.runtime import simulator

    if simulator():
        return None
    try:
        bps = bandwidth.measure(ws)
    except Exception as e:  # noqa: BLE001 - an out-of-memory device: the table goes on without the column
        print(f"note: no roofline: the GPU's read bandwidth could not be measured ({' '.join(str(e).split())[:160]})",
              file=sys.stderr)
        return None
    return {"bytes": min(ws, bandwidth.MAX_BYTES), "threads": None, "bytes_per_s": bps}


def _first_token(model, compare, repetitions, threads, prompt, output, progress, revision):
    from ..measure import bench as B
    from ..sources.source import resolve

    if output not in ("md", "json"):
        raise InputError(f"--first-token: -o must be md or json, got {output!r}")
    if repetitions < 1:
        raise InputError(f"-r must be at least 1, got {repetitions}")
    source = resolve(model, revision)
    kind = None
    if compare is not None:
        kind = B.check_peer(compare, source.kind)
        if compare != "llama.cpp":
            raise InputError("--first-token compares with llama.cpp only (--compare llama.cpp)")
    import numba

    n_threads = threads or numba.config.NUMBA_NUM_THREADS
    tick = lambda desc: None  # noqa: E731
    if progress:
        from rich.console import Console

        console = Console(stderr=True)
        tick = lambda desc: console.print(f"[dim]{desc}[/dim]")  # noqa: E731
    rep = B.first_token_runs(model, source, prompt, repetitions, n_threads, kind, tick)
    sys.stdout.write(B.render_first_token_md(rep) if output == "md" else B.render_json_obj(rep))
    sys.stdout.flush()


def _speculation(model, speculating, prompt, file, n_gen, compare, repetitions, threads, output, progress, device,
                 cache_type, revision, hf_file, activations):
    from ..measure import bench as B
    from ..measure import speculation as S
    from ..process.threads import set_threads
    from ..assembly.loader import open_model
    from ..text.generate import SamplerParams
    from .textgen import prompt_text, ready_engine

    if output not in ("md", "json"):
        raise InputError(f"speculation: -o must be md or json, got {output!r}")
    if repetitions < 1:
        raise InputError(f"-r must be at least 1, got {repetitions}")
    ns = B.parse_int_list(n_gen, "-n")
    if len(ns) != 1 or ns[0] < 2:
        raise InputError(f"speculation: -n takes one count of at least 2 tokens, got {n_gen!r}")
    n = ns[0]
    text = prompt_text(None, file) if file is not None else prompt
    n_threads = set_threads(threads)
    m = open_model(model, revision, hf_file)
    kind = B.check_peer(compare, m.source.kind) if compare is not None else None
    if kind is not None and kind.name != "llama.cpp":
        raise InputError("speculation compares with llama.cpp only (--compare llama.cpp)")
    tok = m.tokenizer
    speculating.open(m)
    ids = tok.encode_prompt(text, chat=bool(tok.chat_template))
    n_ctx = len(ids) + n + 1
    if n_ctx > m.cfg.max_position:
        raise InputError(f"the prompt and -n need a context of {n_ctx}; the model's is {m.cfg.max_position}")
    engine, _ = ready_engine(m, n_ctx, device, quiet=True, cache_type=cache_type, rows=True, activations=activations)
    engine.free_cpus = None  # a benchmark runs on its thread count throughout, as its peer does
    params = SamplerParams(temp=0.0)
    first = speculating.build(m, params, n_ctx, device, cache_type, activations)
    if speculating.draft is not None:
        first.drafter.engine.free_cpus = None
    peer = B.PeerRunner(kind, n_threads, path=str(m.source.path), name=m.source.name, n_ctx=n_ctx,
                        n_batch=512) if kind is not None else None
    tick = (lambda d: print(f"  {d}", file=sys.stderr)) if progress else (lambda d: None)  # noqa: E731
    try:
        sides = S.runs(engine, ids, n, set(m.eos_ids()), first.fresh, first.name, repetitions, peer, tick)
        rep = {"model": m.source.name, "prompt": str(file) if file is not None else repr(text), "prompt_tokens": len(ids),
               "n": n, "threads": n_threads, "repetitions": repetitions, "draft": speculating.draft_model,
               "peer": f"{peer.name}: {peer.detail}" if peer else None, "sides": sides}
    finally:
        if peer is not None:
            peer.close()
    sys.stdout.write(S.render_md(rep) if output == "md" else B.render_json_obj(rep))
    sys.stdout.flush()
