"""How `fuel diff` shows a result: rich tables, the terminal picture, the --plot file, the per-window
progress lines of a long text."""

from __future__ import annotations

import sys
import time

import numpy as np

from ..oracle.report import DiffResult
from .options import err


def _windows(n: int) -> str:
    return f"{n} window" + ("" if n == 1 else "s")


def _console():
    from .options import console

    return console()


def _table(title, *columns):
    from rich.table import Table

    t = Table(title=title, title_justify="left")
    for c, j in columns:
        t.add_column(c, justify=j)
    return t


def render(name: str, r, labels: list):
    """labels: each layer's block in words (plan.LayerPlan.label)."""
    if isinstance(r, DiffResult):
        _render_tokens(name, r, labels)
    else:
        _render_text(name, r, labels)


def within_windows(ctx: int):
    """Where stderr is not a terminal (a log, CI), a plain line each slice of positions a window
    compares: a window of a long --ctx takes minutes, and its own line comes at its end. None at a
    terminal."""
    if sys.stderr.isatty():
        return None
    from ..oracle import tolerances

    t0, shown = time.perf_counter(), {}

    def line(c: int, n: int, done: int):
        mark = done // tolerances.SLICE
        if done < ctx and mark > shown.get(c, 0):
            shown[c] = mark
            err(f"[{c + 1}/{n}] {done}/{ctx} positions compared, {time.perf_counter() - t0:.0f} s")

    return line


def progress(c: int, n: int, r):
    s = r.chunk(c)
    err(f"[{c + 1}/{n}] mean KL {s['mean_kl']:.3e} | p99 {s['p99_kl']:.3e} | max {s['max_kl']:.3e} | "
        f"top-1 {s['top1_rate']:.4f} | PPL fuel {s['ppl_fuel']:.4f} oracle {s['ppl_oracle']:.4f}")


def plot(path: str, name: str, r):
    from ..oracle import plot as P

    if isinstance(r, DiffResult):
        kl, st = [r.window.kl], r.window
        rel = st.layer_abs / np.maximum(st.layer_scale, 1e-30)[:, None] if r.layers else None
        what = f"{len(r.tokens)} tokens"
    else:
        kl, rel = [s.kl for s in r.stats], (r.layer_rel_by_position if r.has_layers else None)
        what = f"{_windows(len(r.stats))} of {r.windows.ctx} tokens of {r.windows.file}"
    P.write(path, kl, r.tol, f"{name}: fuel {r.path} path vs {r.oracle}; {what}", rel, r.layer_tol)


def layer_name(layer: int | None, labels: list) -> str:
    """A residual-stream row's name: embeddings, or the layer and what its block is."""
    if layer is None:
        return "none"
    return "embeddings" if layer < 0 else f"{layer} ({labels[layer]})"


def _layers_table(con, r, labels: list):
    from rich.markup import escape

    lt = _table(escape(f"residual stream after each layer vs {r.layer_oracle}") +
                f"\n(ok: max|Δ| / max|oracle| ≤ {r.layer_tol:g})",
                ("layer", "right"), ("block", "left"), ("max|Δ|", "right"), ("max|oracle|", "right"), ("relative", "right"),
                ("ok", "center"))
    for lay in r.layer_list:
        lt.add_row("embed" if lay.layer < 0 else str(lay.layer), "" if lay.layer < 0 else escape(labels[lay.layer]),
                   f"{lay.max_abs:.3e}", f"{lay.scale:.3g}", f"{lay.rel:.3e}", "✓" if lay.ok else "✗",
                   style=None if lay.ok else "red")
    con.print(lt)
    con.print(f"first layer out of tolerance: {layer_name(r.first_bad_layer, labels)}", highlight=False)


def _verdict(con, r):
    con.print("verdict: PASS" if r.passed else "verdict: MISMATCH — " + "; ".join(r.reasons()),
              style="bold green" if r.passed else "bold red", highlight=False)


def _render_tokens(name: str, r: DiffResult, labels: list):
    from rich.markup import escape

    con = _console()
    kl_is = ("KL(oracle ‖ fuel) over its top-k + one bucket of the rest (≤ the full KL), nats;\n"
             "max|Δ|: of the top-k log-probabilities") if r.top_k else "KL(oracle ‖ fuel), nats"
    t = _table(escape(f"{name}: fuel {r.path} path vs {r.oracle}") + f"\nKL = {kl_is}",
               ("pos", "right"), ("token", "right"), ("step", "left"), ("max|Δ|", "right"),
               ("top-1 fuel/oracle", "right"), ("KL", "right"))
    for p in r.positions:
        t.add_row(str(p.pos), str(p.token), p.step, f"{p.max_abs:.3e}",
                  f"{p.top1_fuel}/{p.top1_oracle} {'✓' if p.top1_agree else '✗'}", f"{p.kl:.2e}",
                  style=None if r.position_ok(p) else "red")
    con.print(t)
    if r.layers:
        _layers_table(con, r, labels)
    steps = f"{r.prefill_len} prefilled + {len(r.tokens) - r.prefill_len} decoded" if r.path == "decode" \
        else f"{len(r.tokens)} prefilled"
    atol = "" if r.atol is None else f" (atol {r.atol:g})"
    con.print(f"tokens: {len(r.tokens)} ({steps}) | max|Δ| {r.max_abs:.3e}{atol} | mean KL {r.mean_kl:.3e} | "
              f"max KL {r.max_kl:.3e} (tol {r.tol:g}) | top-1 {r.top1_rate:.3f} (min {r.min_top1:g})",
              highlight=False)
    _verdict(con, r)


def _render_text(name: str, r, labels: list):
    from ..oracle.picture import kl_chart, layer_map

    con, w = _console(), r.windows
    con.print(f"{name}: fuel {r.path} path vs {r.oracle}\n{w.file}: {len(w.ids)} tokens, {_windows(len(r.stats))} "
              f"of {w.ctx} (perplexity over positions {w.first}..{w.ctx - 2}); KL = KL(oracle ‖ fuel), nats",
              highlight=False, markup=False)
    con.print(f"{'chunk':>5} {'mean KL':>9} {'p99 KL':>9} {'max KL':>9} {'KL>tol at':>9} {'top-1':>7} "
              f"{'PPL fuel':>10} {'PPL oracle':>10}", style="bold", highlight=False)
    for c in range(len(r.stats)):
        s = r.chunk(c)
        first = "—" if s["first_over_tol"] is None else str(s["first_over_tol"])
        con.print(f"{c + 1:>5} {s['mean_kl']:>9.2e} {s['p99_kl']:>9.2e} {s['max_kl']:>9.2e} {first:>9} "
                  f"{s['top1_rate']:>7.4f} {s['ppl_fuel']:>10.4f} {s['ppl_oracle']:>10.4f}",
                  style="red" if s["max_kl"] > r.tol else None, highlight=False)
    width = max(16, min(96, con.width - 16))
    con.print(kl_chart(r.by_position["max_kl"], r.tol, width=width,
                       title=f"max KL over {len(r.stats)} window(s) by context position (log10 scale)"))
    if r.has_layers:
        con.print(layer_map(r.layer_rel_by_position, r.layer_tol, width=width,
                            title="per-layer divergence by context position"))
        _layers_table(con, r, labels)
    (pf, ef), (po, eo) = r.ppl("fuel"), r.ppl("oracle")
    first = r.first_over_tol
    where = "none" if first is None else f"position {first['pos']} (chunk {first['chunk'] + 1}, KL {first['kl']:.3e})"
    kl = r.kl
    atol = "" if r.atol is None else f" (atol {r.atol:g})"
    con.print(f"positions: {len(kl)} | mean KL {kl.mean():.3e} | p99 KL {np.percentile(kl, 99):.3e} | "
              f"max KL {kl.max():.3e} (tol {r.tol:g}) | max|Δ| {r.max_abs:.3e}{atol} | "
              f"top-1 {r.top1_rate:.4f} (min {r.min_top1:g})", highlight=False)
    con.print(f"PPL fuel = {pf:.4f} +/- {ef:.5f} | PPL oracle = {po:.4f} +/- {eo:.5f} | first KL > tol: {where}",
              highlight=False)
    sp = r.speed
    con.print("speed: " + " | ".join(f"{k} {v['tokens_per_second']} tok/s" for k, v in sp.items()), highlight=False)
    _verdict(con, r)
