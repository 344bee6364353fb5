"""`fuel serve MODEL`: an OpenAI- and Anthropic-compatible HTTP server (fuelcli/serve) for one model."""

from __future__ import annotations

import os
import time
from typing import Optional

import typer

from ..errors import InputError, MissingDependency
from .app import app
from .options import (Activations, CacheType, ChatTemplateKwargs, Device, DraftMax, DraftModel, DraftPMin, HfFile,
                      LookupDecoding, ModelArg, Revision, Threads, ctx_size_option, err)

DEFAULT_CTX = 4096  # as llama-server: the KV cache of a model's full context can be far larger


@app.command()
def serve(
    model: str = ModelArg,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (0.0.0.0: every interface)"),
    port: int = typer.Option(8080, "--port", help="port to listen on (0: any free port)"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="require `Authorization: Bearer KEY` or "
                                          "`x-api-key: KEY` (FUEL_API_KEY also sets it)"),
    ctx_size: Optional[int] = ctx_size_option(f"{DEFAULT_CTX} or the model's if smaller"),
    threads: Optional[int] = Threads,
    parallel: int = typer.Option(1, "--parallel", "-np", help="requests generated together, each on its own "
                                 "slot of the KV cache (continuous batching, llama-server's -np); -c is split "
                                 "between them"),
    queue: int = typer.Option(32, "--queue", help="requests that may wait for the engine; more get 503"),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error"),
    metrics: bool = typer.Option(False, "--metrics", help="serve /metrics in Prometheus' text format (off by "
                                 "default, as llama-server's: it tells whoever reaches the port how the server is used)"),
    chat_template_kwargs: Optional[str] = ChatTemplateKwargs,
    reasoning_format: str = typer.Option("auto", "--reasoning-format", help="auto: a reply's <think>...</think> "
                                         "goes to reasoning_content (models whose template knows <think>), and "
                                         "a harmony reply's analysis channel (gpt-oss), a Gemma 4 reply's thought "
                                         "channel; none: it stays in "
                                         "content. A request's reasoning_format wins"),
    pooling: Optional[str] = typer.Option(None, "--pooling", help="/v1/embeddings' pooling: mean, cls or last "
                                          "(default: the model's own: GGUF pooling_type, sentence-transformers' "
                                          "1_Pooling/config.json, else last token as Qwen3-Embedding)"),
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
    """Serve MODEL over HTTP with OpenAI's API: /v1/chat/completions, /v1/completions, /v1/responses,
    /v1/embeddings, /v1/models; Anthropic's: /v1/messages, /v1/messages/count_tokens (and /metrics with --metrics).

    --draft-model or --lookup-decoding: speculative decoding as in fuel run (with --parallel 1);
    a reply's usage then carries completion_tokens_details.accepted_prediction_tokens and
    rejected_prediction_tokens. With --lookup-decoding a chat request's `prediction` (the expected
    reply) is searched for proposals too; otherwise that field is accepted and not used."""
    try:
        import pydantic  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        from ..process.extras import pip_install

        raise MissingDependency(f"fuel serve needs {e.name}: {pip_install('serve')}") from None
    if ctx_size is not None and ctx_size < 0:
        raise InputError(f"-c must be >= 0 (0 = the model's context), got {ctx_size}")
    if queue < 1:
        raise InputError(f"--queue must be at least 1, got {queue}")
    if not 1 <= parallel <= 64:
        raise InputError(f"--parallel must be between 1 and 64, got {parallel}")
    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise InputError(f"--log-level must be debug, info, warning or error, got {log_level!r}")
    if pooling is not None and pooling not in ("mean", "cls", "last"):
        raise InputError(f"--pooling must be mean, cls or last, got {pooling!r}")
    if reasoning_format not in ("auto", "none", "deepseek"):
        raise InputError(f"--reasoning-format must be auto, deepseek or none, got {reasoning_format!r}")
    api_key = api_key if api_key is not None else os.environ.get("FUEL_API_KEY") or None
    from .textgen import SpeculationOptions

    speculating = SpeculationOptions(draft_model, lookup_decoding, draft_max, draft_p_min)
    if speculating.on and parallel > 1:
        raise InputError("speculative decoding (--draft-model, --lookup-decoding) runs on one slot: drop --parallel "
                         f"{parallel}")

    from ..serve.jobs import ServedModel
    from ..serve.pooling import Embedder, model_pooling
    from ..serve.server import bind, run, url
    from ..serve.worker import EngineWorker
    from ..assembly.loader import open_model
    from ..text.generate import SamplerParams
    from ..process.threads import set_threads
    from .textgen import ready_engine, template_options

    set_threads(threads)  # checked before loading; the engine thread applies it again (numba's is per thread)
    m = open_model(model, revision, hf_file)
    limit = m.cfg.max_position
    if ctx_size is not None and ctx_size > limit:
        raise InputError(f"-c {ctx_size} exceeds the model's context of {limit} tokens")
    n_ctx = min(DEFAULT_CTX, limit) if ctx_size is None else (ctx_size or limit)
    if n_ctx // parallel < 2:
        raise InputError(f"-c {n_ctx} split between --parallel {parallel} slots leaves {n_ctx // parallel} tokens each; "
                         "each needs at least 2")
    n_ctx //= parallel  # each slot's, as llama-server splits -c between its -np slots
    sock = bind(host, port)  # before loading: a port in use fails fast
    m.prefetch()
    tok = m.tokenizer
    kwargs = template_options(tok, None, chat_template_kwargs)
    speculating.open(m)
    # loads or compiles the kernels before serving
    engine, _ = ready_engine(m, n_ctx, device, quiet=False, cache_type=cache_type, slots=parallel,
                             rows=speculating.on, activations=activations)
    # each request's settings: start()
    spec = speculating.build(m, SamplerParams(), n_ctx, device, cache_type, activations)
    served = ServedModel(id=m.source.name, names={m.source.name, model}, tokenizer=tok, n_ctx=n_ctx,
                         vocab_size=m.cfg.vocab_size, eos_ids=m.eos_ids(), created=int(time.time()),
                         template_kwargs=kwargs, reasoning_format=reasoning_format,
                         embedder=Embedder(m.weights.final_norm, m.cfg.rms_norm_eps,
                                           model_pooling(m.source.kind, m.source.path,
                                                         m.gguf.meta if m.gguf is not None else None, pooling),
                                           m.cfg.hidden_size))
    worker = EngineWorker(engine, tok, served.eos_ids, queue_size=queue, threads=threads, speculation=spec)
    slots = f"{parallel} slots of {n_ctx} tokens" if parallel > 1 else f"context {n_ctx} tokens"
    err(f"fuel serve: {served.id} on {url(sock)} ({slots}" + (f", speculative: {spec.name}" if spec else "")
        + (", API key required" if api_key else "") + "); Ctrl-C stops")
    run(served, worker, sock, api_key, log_level.lower(), metrics)
