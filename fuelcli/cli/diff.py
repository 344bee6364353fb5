"""`fuel diff MODEL --oracle self|transformers|llama.cpp|PATH|URL (--tokens | --prompt | --text FILE)`:
does fuel's fast path match an oracle?

Exit 0 on pass, 3 (Mismatch) when KL(oracle ‖ fuel) at some position > --tol, top-1 agreement <
--min-top1 or (if given) max|Δ| > --atol; 2 on bad input, 4 when the oracle's (or --plot's)
packages are missing, 5 when a peer or an oracle server fails.
"""

import json
import os
from typing import Optional

import typer

from ..errors import InputError, Mismatch
from ..oracle import (DEFAULT_CTX, DEFAULT_DECODE_STEPS, DEFAULT_LAYER_RTOL, DEFAULT_MIN_TOP1, DEFAULT_TOL,
                      DEFAULT_TOP_K)
from .app import app
from .options import (Activations, CacheType, Device, HfFile, Json, ModelArg, Revision, Threads, check_tolerances, err,
                      parse_tokens)


@app.command("diff", short_help="Compare fuel's logits with an oracle; exit 3 on mismatch.")
def diff_cmd(
    model: str = ModelArg,
    oracle: str = typer.Option("self", "--oracle", help="self (fuel's numpy reference, full-prefix forward) | "
                               "transformers (HF eager f32 on the same weights) | llama.cpp (llama-cpp-python on "
                               "the same .gguf) | PATH to saved logits [seq, vocab] (.npy, .npz, .safetensors, "
                               "or llama.cpp's raw float32 .bin) | http(s)://HOST:PORT/v1, an OpenAI-compatible "
                               "server's top-k logprobs (vLLM, llama-server, fuel serve)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="text, encoded with special tokens, no template"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token ids, e.g. 1,2,3"),
    text: Optional[str] = typer.Option(None, "--text", help="a text FILE, compared in llama-perplexity windows "
                                       "of --ctx tokens"),
    ctx: int = typer.Option(DEFAULT_CTX, "--ctx", help="with --text: window length in tokens"),
    chunks: Optional[int] = typer.Option(None, "--chunks", help="with --text: at most this many windows "
                                         "(default: every whole window of the file)"),
    path: str = typer.Option("decode", "--path", help="fuel path on trial: decode (prefill all but the last "
                             "--decode-steps tokens, then one token at a time through the KV cache) | "
                             "prefill (the whole sequence batched)"),
    decode_steps: int = typer.Option(DEFAULT_DECODE_STEPS, "--decode-steps",
                                     help="tokens decoded one at a time on the decode path (≥ 1 prefilled)"),
    tol: float = typer.Option(DEFAULT_TOL, "--tol", help="largest allowed KL(oracle ‖ fuel) at any position (nats)"),
    atol: Optional[float] = typer.Option(None, "--atol", help="also bound max|Δ| of the logits (absolute)"),
    min_top1: float = typer.Option(DEFAULT_MIN_TOP1, "--min-top1", help="smallest allowed top-1 agreement rate"),
    layers: bool = typer.Option(False, "--layers", help="per-layer max|Δ| of the residual stream; names the "
                                "first layer out of tolerance"),
    layer_tol: float = typer.Option(DEFAULT_LAYER_RTOL, "--layer-tol",
                                    help="per-layer tolerance: max|Δ| / max|oracle state| of the layer"),
    top_k: int = typer.Option(DEFAULT_TOP_K, "--top-k", help="with a server oracle: log-probabilities asked per "
                              "position (vLLM's --max-logprobs and fuel serve allow 20, OpenAI's completions 5)"),
    server_model: Optional[str] = typer.Option(None, "--server-model", metavar="ID", help="with a server oracle: "
                                               "the model to ask, one of its /v1/models (default: its only one)"),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="with a server oracle: sent as `Authorization: "
                                          "Bearer KEY` (default: FUEL_API_KEY)"),
    plot: Optional[str] = typer.Option(None, "--plot", help="also draw KL against position (and the layers) "
                                       "into FILE.png or FILE.svg (needs matplotlib)"),
    as_json: bool = Json,
    threads: Optional[int] = Threads,
    device: Optional[str] = Device,
    cache_type: str = CacheType,
    activations: Optional[str] = Activations,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Compare fuel's logits (per position) with an oracle; exit 3 on mismatch."""
    from ..model.plan import layer_plans
    from ..oracle.http_json import is_url
    from ..assembly.loader import open_model
    from ..process.threads import set_threads
    from . import diff_view

    if sum(x is not None for x in (prompt, tokens, text)) != 1:
        raise InputError("give exactly one of --prompt, --tokens and --text")
    check_tolerances(tol=tol, atol=atol, layer_tol=layer_tol, min_top1=min_top1)
    if not is_url(oracle) and (top_k != DEFAULT_TOP_K or server_model is not None or api_key is not None):
        raise InputError("--top-k, --server-model and --api-key go with a server oracle (--oracle http://HOST:PORT/v1)")
    if plot is not None:
        from ..oracle.plot import check

        check(plot)
    set_threads(threads)
    m = open_model(model, revision, hf_file)
    if text is not None:
        from ..oracle import diff_text

        r = diff_text(m, text, oracle, ctx, chunks, path, tol, min_top1, layers, layer_tol, decode_steps, atol,
                      device, progress=diff_view.progress, cache_type=cache_type, activations=activations,
                      within=diff_view.within_windows(ctx))
    else:
        from ..oracle import diff

        ids = parse_tokens(tokens) if tokens is not None else m.tokenizer.encode(prompt)
        server = {"top_k": top_k, "server_model": server_model,
                  "api_key": api_key if api_key is not None else os.environ.get("FUEL_API_KEY") or None}
        r = diff(m, ids, oracle, path, tol, min_top1, layers, layer_tol, decode_steps, atol, device, cache_type,
                 server, activations)
    if plot is not None:
        diff_view.plot(plot, m.source.name, r)
    labels = [lp.label(m.cfg) for lp in layer_plans(m.cfg)]
    if as_json:
        out = {"model": m.source.name, **r.to_json()}
        for lay in out.get("layers") or []:
            lay["block"] = labels[lay["layer"]] if lay["layer"] >= 0 else "embeddings"
        print(json.dumps(out, indent=1 if text is not None else 2))
    else:
        diff_view.render(m.source.name, r, labels)
    if plot is not None:
        err(f"plot written to {plot}")
    if not r.passed:
        where = (f"; first layer out of tolerance: {diff_view.layer_name(r.first_bad_layer, labels)}"
                 if r.first_bad_layer is not None else "")
        raise Mismatch(f"fuel {r.path} path vs {oracle}: " + "; ".join(r.reasons()) + where)
