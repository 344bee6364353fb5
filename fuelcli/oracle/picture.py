"""Where a curve lifts off, drawn in the terminal with rich: KL(oracle ‖ fuel) against context
position (log scale, positions binned to the terminal's width, red above --tol) and, with --layers, a
heat map of each layer's divergence against position (shade = max|Δ| / layer scale against
--layer-tol)."""

from __future__ import annotations

import math

import numpy as np
from rich.text import Text

BLOCKS = " ▁▂▃▄▅▆▇█"
SHADES = [(0.0, "█", "bold red"), (-1.0, "▓", "yellow"), (-2.0, "▒", "green"), (-3.0, "░", "dim green")]
FLOOR = -12  # KL below 1e-12 nats draws as empty


def bins(n: int, width: int) -> np.ndarray:
    """Edges of at most `width` bins over n positions."""
    k = max(1, min(width, n))
    return np.linspace(0, n, k + 1).round().astype(int)


def binned_max(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.array([np.nanmax(values[a:b]) if b > a else np.nan for a, b in zip(edges[:-1], edges[1:])])


def _axis(n: int, edges: np.ndarray, pad: int) -> Text:
    k = len(edges) - 1
    line = [" "] * (k + 1)
    for frac in (0.0, 0.5, 1.0):
        col = min(k, round(frac * k))
        label = str(n if frac == 1.0 else int(edges[col]))
        start = min(max(0, col - (len(label) if frac == 1.0 else len(label) // 2)), k + 1 - len(label))
        line[start:start + len(label)] = list(label)
    return Text(" " * pad + "".join(line), style="dim")


def kl_chart(kl: np.ndarray, tol: float, width: int = 64, height: int = 10, title: str = "") -> Text:
    """kl [n] (per context position; give the max over windows): a bar per bin of positions, one or
    more whole decades per row (at most `height` rows)."""
    n = len(kl)
    edges = bins(n, width)
    v = binned_max(np.asarray(kl, np.float64), edges)
    logs = np.log10(np.maximum(np.nan_to_num(v, nan=0.0), 10.0 ** FLOOR))
    lo = math.floor(max(FLOOR, min(logs.min(), math.log10(tol) - 1)))
    hi = math.ceil(max(logs.max(), math.log10(tol) + 1))
    per_row = math.ceil((hi - lo) / height)
    rows = math.ceil((hi - lo) / per_row)
    hi = lo + rows * per_row
    eighths = np.clip((logs - lo) / per_row * 8, 0, rows * 8).round().astype(int)
    tol_row = min(rows - 1, max(0, math.ceil((math.log10(tol) - lo) / per_row) - 1))  # the row holding tol
    out = Text(title + "\n" if title else "")
    for r in range(rows - 1, -1, -1):
        out.append(f"{f'1e{lo + (r + 1) * per_row}':>5} ┤", style="dim")
        for c, e in enumerate(eighths):
            out.append(BLOCKS[min(8, max(0, e - r * 8))], style="red" if v[c] > tol else "green")
        out.append(" ◀ tol\n" if r == tol_row else "\n", style="dim")
    out.append("      └" + "─" * len(eighths) + "\n", style="dim")
    out.append_text(_axis(n, edges, 7))
    out.append(f"\n{7 * ' '}context position; row tops are the labels; red: KL > tol {tol:g}", style="dim")
    return out


def layer_map(rel: np.ndarray, rtol: float, width: int = 64, title: str = "") -> Text:
    """rel [L+1, n]: per layer (first row = embeddings) and position, max|Δ| / the layer's scale."""
    n_layers, n = rel.shape
    edges = bins(n, width)
    out = Text(title + "\n" if title else "")
    for i in range(n_layers):
        out.append(f"{'embed' if i == 0 else i - 1:>5} │", style="dim")
        for x in binned_max(rel[i], edges):
            d = math.log10(max(x, 1e-30) / rtol)
            char, style = next(((ch, st) for level, ch, st in SHADES if d >= level), (" ", None))
            out.append(char, style=style)
        out.append("\n")
    out.append("      └" + "─" * (len(edges) - 1) + "\n", style="dim")
    out.append_text(_axis(n, edges, 7))
    out.append(f"\n       shade: max|Δ|/scale against layer tol {rtol:g} — █ over, ▓ within 10x, ▒ 100x, "
               "░ 1000x", style="dim")
    return out
