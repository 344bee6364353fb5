"""`fuel diff MODEL --oracle self|transformers|PATH`: does fuel's fast path match an oracle?

Exit 0 on pass, 3 (Mismatch) when KL(oracle ‖ fuel) at some position > --tol, top-1 agreement <
--min-top1 or (if given) max|Δ| > --atol; 2 on bad input,
4 when --oracle transformers lacks its packages.
"""

import json
from typing import Optional

import typer

from ..errors import InputError, Mismatch
from ..oracle import DEFAULT_DECODE_STEPS, DEFAULT_LAYER_RTOL, DEFAULT_MIN_TOP1, DEFAULT_TOL
from .app import app
from .options import Device, HfFile, Json, ModelArg, Revision, Threads, check_tolerances, parse_tokens


@app.command("diff", short_help="Compare fuel's logits with an oracle; exit 3 on mismatch.")
def diff_cmd(
    model: str = ModelArg,
    oracle: str = typer.Option("self", "--oracle", help="self (fuel's numpy reference, full-prefix forward) | "
                               "transformers (HF eager f32 on the same weights) | PATH to saved logits "
                               "[seq, vocab] (.npy, .npz, .safetensors)"),
    prompt: Optional[str] = typer.Option(None, "--prompt", help="text, encoded with special tokens, no template"),
    tokens: Optional[str] = typer.Option(None, "--tokens", help="token ids, e.g. 1,2,3"),
    path: str = typer.Option("decode", "--path", help="fuel path on trial: decode (prefill all but the last "
                             "--decode-steps tokens, then one token at a time through the KV cache) | "
                             "prefill (the whole sequence as one batch)"),
    decode_steps: int = typer.Option(DEFAULT_DECODE_STEPS, "--decode-steps",
                                     help="tokens decoded one at a time on the decode path (≥ 1 prefilled)"),
    tol: float = typer.Option(DEFAULT_TOL, "--tol", help="largest allowed KL(oracle ‖ fuel) at any position (nats)"),
    atol: Optional[float] = typer.Option(None, "--atol", help="also bound max|Δ| of the logits (absolute)"),
    min_top1: float = typer.Option(DEFAULT_MIN_TOP1, "--min-top1", help="smallest allowed top-1 agreement rate"),
    layers: bool = typer.Option(False, "--layers", help="per-layer max|Δ| of the residual stream; names the "
                                "first layer out of tolerance"),
    layer_tol: float = typer.Option(DEFAULT_LAYER_RTOL, "--layer-tol",
                                    help="per-layer tolerance: max|Δ| / max|oracle state| of the layer"),
    as_json: bool = Json,
    threads: Optional[int] = Threads,
    device: Optional[str] = Device,
    revision: Optional[str] = Revision,
    hf_file: Optional[str] = HfFile,
):
    """Compare fuel's logits (per position) with an oracle; exit 3 on mismatch."""
    from ..loader import open_model
    from ..threads import set_threads
    from ..oracle import diff

    if (prompt is None) == (tokens is None):
        raise InputError("give exactly one of --prompt and --tokens")
    check_tolerances(tol=tol, atol=atol, layer_tol=layer_tol, min_top1=min_top1)
    set_threads(threads)
    m = open_model(model, revision, hf_file)
    ids = parse_tokens(tokens) if tokens is not None else m.tokenizer.encode(prompt)
    r = diff(m, ids, oracle, path, tol, min_top1, layers, layer_tol, decode_steps, atol, device)
    if as_json:
        print(json.dumps({"model": m.source.name, **r.to_json()}, indent=2))
    else:
        _render(m.source.name, r)
    if not r.passed:
        where = f"; first layer out of tolerance: {r.first_bad_layer}" if r.first_bad_layer is not None else ""
        raise Mismatch(f"fuel {r.path} path vs {oracle}: " + "; ".join(r.reasons()) + where)


def _render(name: str, r):
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console()
    t = Table(title=escape(f"{name}: fuel {r.path} path vs {r.oracle}") + "\nKL = KL(oracle ‖ fuel), nats",
              title_justify="left")
    for c, j in (("pos", "right"), ("token", "right"), ("step", "left"), ("max|Δ|", "right"),
                 ("top-1 fuel/oracle", "right"), ("KL", "right")):
        t.add_column(c, justify=j)
    for p in r.positions:
        bad = not r.position_ok(p)
        t.add_row(str(p.pos), str(p.token), p.step, f"{p.max_abs:.3e}",
                  f"{p.top1_fuel}/{p.top1_oracle} {'✓' if p.top1_agree else '✗'}", f"{p.kl:.2e}",
                  style="red" if bad else None)
    con.print(t)
    if r.layers:
        lt = Table(title=f"residual stream after each layer vs {r.layer_oracle}\n(ok: max|Δ| / max|oracle| ≤ {r.layer_tol:g})",
                   title_justify="left")
        for c, j in (("layer", "right"), ("max|Δ|", "right"), ("max|oracle|", "right"), ("relative", "right"),
                     ("ok", "center")):
            lt.add_column(c, justify=j)
        for lay in r.layers:
            lt.add_row("embed" if lay.layer < 0 else str(lay.layer), f"{lay.max_abs:.3e}", f"{lay.scale:.3g}",
                       f"{lay.rel:.3e}", "✓" if lay.ok else "✗", style=None if lay.ok else "red")
        con.print(lt)
        bad = r.first_bad_layer
        con.print("first layer out of tolerance: " + ("none" if bad is None else ("embeddings" if bad < 0 else str(bad))),
                  highlight=False)
    steps = f"{r.prefill_len} prefilled + {len(r.tokens) - r.prefill_len} decoded" if r.path == "decode" \
        else f"{len(r.tokens)} prefilled"
    atol = "" if r.atol is None else f" (atol {r.atol:g})"
    con.print(f"tokens: {len(r.tokens)} ({steps}) | max|Δ| {r.max_abs:.3e}{atol} | mean KL {r.mean_kl:.3e} | "
              f"max KL {r.max_kl:.3e} (tol {r.tol:g}) | top-1 {r.top1_rate:.3f} (min {r.min_top1:g})",
              highlight=False)
    con.print("verdict: PASS" if r.passed else "verdict: MISMATCH — " + "; ".join(r.reasons()),
              style="bold green" if r.passed else "bold red", highlight=False)
