"""`fuel diff --plot FILE`: KL(oracle ‖ fuel) against context position (every window faint, the max
over windows bold, --tol dashed; log scale) and, with --layers, a heat map of each layer's
divergence against position. PNG or SVG by the file's suffix; matplotlib is the optional `plot`
extra."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..errors import InputError, MissingDependency
from ..process.extras import pip_install

FORMATS = (".png", ".svg")


def check(path: str | Path) -> Path:
    """Validate --plot before anything heavy runs: a known suffix, a writable folder, matplotlib."""
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise InputError(f"--plot {path}: the file must end in .png or .svg")
    if not path.parent.resolve().is_dir():
        raise InputError(f"--plot {path}: no such directory {path.parent}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingDependency(f"--plot needs matplotlib: {pip_install('plot')} (or pip install matplotlib)") from None
    return path


def write(path: str | Path, kl_windows: list, tol: float, title: str, layer_rel: np.ndarray | None = None,
          layer_tol: float | None = None):
    path = check(path)
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    rows = 2 if layer_rel is not None else 1
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.6 * rows), squeeze=False, constrained_layout=True)
    ax = axes[0, 0]
    floor = 1e-12
    for kl in kl_windows:
        ax.plot(np.maximum(kl, floor), lw=0.5, alpha=0.25 if len(kl_windows) > 1 else 0.9, color="tab:blue")
    if len(kl_windows) > 1:
        ax.plot(np.maximum(np.max(kl_windows, axis=0), floor), lw=1.2, color="tab:blue", label="max over windows")
    ax.axhline(tol, ls="--", color="tab:red", lw=1, label=f"tol {tol:g}")
    ax.set_yscale("log")
    ax.set_xlabel("context position")
    ax.set_ylabel("KL(oracle ‖ fuel), nats")
    ax.set_title(title, fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    if layer_rel is not None:
        ax2 = axes[1, 0]
        im = ax2.imshow(np.log10(np.maximum(layer_rel, 1e-12)), aspect="auto", interpolation="nearest",
                        cmap="viridis", origin="lower")
        ax2.set_yticks(range(len(layer_rel)), ["embed"] + [str(i) for i in range(len(layer_rel) - 1)], fontsize=6)
        ax2.set_xlabel("context position")
        ax2.set_ylabel("layer")
        ax2.set_title(f"log10 max|Δ| / layer scale (layer tol {layer_tol:g})", fontsize=9)
        fig.colorbar(im, ax=ax2)
    tmp = path.with_name(f".{path.name}.{os.getpid()}{path.suffix}")
    try:  # never leave a half-written picture
        fig.savefig(tmp, dpi=120)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
