"""`fuel inspect mask-plan|config|weights|rope|tokens MODEL`: how a model is built, as rich tables or --json."""

import json
from typing import Optional

import typer

from ..errors import InputError
from .app import app
from .options import HfFile, Json, ModelArg, Revision

inspect_app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                          help="Show how a model is built: mask plan, config, weights, RoPE, tokens.")
app.add_typer(inspect_app, name="inspect")



def _open(model: str, revision, hf_file=None):
    from ..assembly.loader import open_model

    return open_model(model, revision, hf_file)


def _dump(data):
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _console():
    from .options import console

    return console()


def _table(title=None, *columns):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c in columns:
        if isinstance(c, tuple):
            t.add_column(c[0], justify=c[1])
        else:
            t.add_column(c)
    return t


def _row(table, *cells, **kw):
    """Cells are plain text: names like `experts[0]` or values like `[false, true]` are not rich markup."""
    from rich.markup import escape

    table.add_row(*(escape(str(c)) for c in cells), **kw)


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


@inspect_app.command("mask-plan")
def mask_plan_cmd(model: str = ModelArg, as_json: bool = Json, revision: Optional[str] = Revision,
                  hf_file: Optional[str] = HfFile):
    """Per layer: attention (full | window w), the mask variant it reads, its RoPE (or none), its norms
    (pre | pre + post), FFN (dense | MoE k of n, and its activation). Reads the config only."""
    from ..assembly.inspect_views import mask_plan_view
    from ..model.plan import LINEAR_MASK

    v = mask_plan_view(_open(model, revision, hf_file))
    if as_json:
        return _dump(v)
    con = _console()
    t = _table(f"{v['model']} ({v['family']}, {v['num_layers']} layers)", ("layer", "right"), "attention", "mask",
               "RoPE", "norms", "FFN")
    for r in v["layers"]:
        _row(t, str(r["index"]), r["attention"], r["mask"], r["rope"], r["norms"], r["ffn"])
    con.print(t)
    con.print(f"{v['num_variants']} distinct mask variant{'s' if v['num_variants'] != 1 else ''}:")
    for var in v["variants"]:
        if var["name"] == LINEAR_MASK:
            what = "a recurrent state, no mask"
        else:
            what = "full causal" if var["window"] == 0 else f"causal, window {var['window']} (i-{var['window']} < j ≤ i)"
        con.print(f"  {var['name']:<10} {what}: layers {var['layer_ranges']}", highlight=False)
    con.print(f"rule: {v['rule']}", highlight=False)
    con.print(f"RoPE: {v['rope_rule']}", highlight=False)


# config_view's rows with one value per layer (assembly/inspect_views._block_rows); --json keeps the lists
PER_LAYER_ROWS = ("windows", "qkv_bias", "o_bias", "qk_norm", "attention_scale", "activation", "sandwich_norms",
                  "moe_layers", "rope_layers")
LONGEST_LIST = 60  # columns; a longer per-layer list is shown as runs of layers (30 `false` made 759 columns)


def layer_runs(values: list) -> str:
    """[4, 4, 4, 0, 4] -> 'layers 0-2: 4, 3: 0, 4: 4': each run of equal values as its layers' range."""
    runs, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            layers = f"{start}-{i - 1}" if i - 1 > start else f"{start}"
            runs.append(f"{layers}: {json.dumps(values[start], ensure_ascii=False)}")
            start = i
    return "layers " + ", ".join(runs)


@inspect_app.command("config")
def config_cmd(model: str = ModelArg, as_json: bool = Json, revision: Optional[str] = Revision,
               hf_file: Optional[str] = HfFile):
    """Every resolved config value and where it came from (file, default, derived, family, gguf)."""
    from ..assembly.inspect_views import config_view

    v = config_view(_open(model, revision, hf_file))
    if as_json:
        return _dump(v)
    t = _table(f"{v['model']} ({v['source_kind']})", "name", "value", "origin")
    for r in v["values"]:
        val = r["value"]
        text = json.dumps(val, ensure_ascii=False) if isinstance(val, (list, bool)) or val is None else str(val)
        if r["name"] in PER_LAYER_ROWS and len(text) > LONGEST_LIST:
            text = layer_runs(val)
        _row(t, r["name"], text, r["origin"])
    _console().print(t)


@inspect_app.command("weights")
def weights_cmd(model: str = ModelArg, as_json: bool = Json, revision: Optional[str] = Revision,
                hf_file: Optional[str] = HfFile):
    """Name, shape, format and bytes of every stored tensor; totals per format; parameter count."""
    from ..assembly.inspect_views import weights_view

    v = weights_view(_open(model, revision, hf_file))
    if as_json:
        return _dump(v)
    con = _console()
    t = _table(f"{v['model']} — {v['num_tensors']} tensors ({v['table']})", "name", "shape", "format",
               ("bytes", "right"))
    for r in v["tensors"]:
        _row(t, r["name"], "×".join(map(str, r["shape"])), r["format"], f"{r['bytes']:,}")
    con.print(t)
    s = _table("per format", "format", ("tensors", "right"), ("params", "right"), ("bytes", "right"),
               ("bits/weight", "right"))
    for a in v["formats"]:
        _row(s, a["format"], str(a["tensors"]), f"{a['params']:,}", _bytes(a["bytes"]), f"{a['bits_per_weight']:.2f}")
    _row(s, "total", str(v["num_tensors"]), f"{v['params']:,}", _bytes(v["bytes"]),
              f"{8 * v['bytes'] / max(v['params'], 1):.2f}", style="bold")
    con.print(s)
    con.print(f"parameters: {v['params']:,} ({v['params'] / 1e6:.2f} M)"
              + ("; embeddings tied to the output (counted once)" if v["tie_embeddings"] else ""), highlight=False)


@inspect_app.command("rope")
def rope_cmd(model: str = ModelArg, as_json: bool = Json, revision: Optional[str] = Revision,
             hf_file: Optional[str] = HfFile):
    """Per frequency index: base inverse frequency, the scaled one, wavelength, llama3 band; one table
    per RoPE when the layers differ (Gemma 3's local and global bases)."""
    from ..assembly.inspect_views import rope_view

    v = rope_view(_open(model, revision, hf_file))
    if as_json:
        return _dump(v)
    con = _console()
    for var in v["variants"]:
        params = ", ".join(f"{k}={val:g}" if isinstance(val, float) else f"{k}={val}" for k, val in var["rope"].items())
        where = f", layers {var['layer_ranges']}" if len(v["variants"]) > 1 or v["nope_layers"] else ""
        t = _table(f"{v['model']} — RoPE {params}, head_dim {v['head_dim']}{where}", ("i", "right"), "dims",
                   ("base inv_freq", "right"), ("scaled inv_freq", "right"), ("wavelength", "right"),
                   ("scaled wavelength", "right"), "band")
        for r in var["frequencies"]:
            _row(t, str(r["index"]), f"{r['dims'][0]},{r['dims'][1]}", f"{r['base_inv_freq']:.4e}",
                 f"{r['inv_freq']:.4e}", f"{r['wavelength']:.4g}", f"{r['scaled_wavelength']:.4g}", r["band"] or "—")
        con.print(t)
        if var["band_counts"]:
            con.print("bands: " + ", ".join(f"{k} {n}" for k, n in var["band_counts"].items()), highlight=False)
    if v["nope_layers"]:
        from ..assembly.inspect_views import ranges

        con.print(f"no RoPE: layers {ranges(v['nope_layers'])}", highlight=False)
    con.print(f"rule: {v['rule']}", highlight=False)


@inspect_app.command("tokens")
def tokens_cmd(model: str = ModelArg,
               text: Optional[str] = typer.Option(None, "--text", help="the text to tokenize"),
               file: Optional[str] = typer.Option(None, "--file", help="a UTF-8 file to tokenize"),
               special: bool = typer.Option(False, "--special", help="add the BOS/EOS the model adds and match "
                                            "special-token text (default: plain text, as llama.cpp's "
                                            "tokenizer tests)"),
               as_json: bool = Json, revision: Optional[str] = Revision, hf_file: Optional[str] = HfFile):
    """The token ids (and pieces) MODEL's tokenizer gives a text: fuel's llama-tokenize. Needs only
    the tokenizer: a vocabulary-only .gguf or a directory with just tokenizer.json will do."""
    from ..oracle.windows import read_text
    from ..assembly.loader import open_tokenizer

    if (text is None) == (file is None):
        raise InputError("give exactly one of --text and --file")
    source, tok = open_tokenizer(model, revision, hf_file)
    ids = tok.encode(read_text(file) if file is not None else text, add_special_tokens=special,
                     parse_special=special)
    if as_json:
        return _dump({"ids": ids})
    pieces = tok.pieces(ids)
    t = _table(f"{source.name}: {len(ids)} tokens" + (" (with special tokens)" if special else ""),
               ("#", "right"), ("id", "right"), "piece", "vocabulary entry")
    for i, (tid, piece) in enumerate(zip(ids, pieces)):
        _row(t, str(i), str(tid), repr(piece), tok.backend.id_to_token(tid))
    _console().print(t)
