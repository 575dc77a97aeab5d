"""Static figures (matplotlib). Everything takes plain tensors/arrays and returns the Figure."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import matplotlib

matplotlib.use("Agg", force=False)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from jaxtyping import Float  # noqa: E402
from torch import Tensor  # noqa: E402

FORMATS = ("png", "pdf", "svg")


def _np(x) -> np.ndarray:
    return x.detach().cpu().float().numpy() if isinstance(x, Tensor) else np.asarray(x, dtype=float)


def alpha_heatmap(
    alpha: Float[Tensor, "layer head"] | np.ndarray,
    *,
    title: str = "",
    ax=None,
    vmin: float = 0.0,
    vmax: float = 1.0,
    cmap: str = "viridis",
    colorbar: bool = True,
):
    """Heads (x) by layers (y, layer 0 at the bottom), coloured by alpha on a fixed 0–1 scale."""
    a = _np(alpha)
    n_layers, n_heads = a.shape
    if ax is None:
        width = min(max(2.2 + 0.35 * n_heads, 3.0), 12.0)
        _, ax = plt.subplots(figsize=(width, min(max(1.5 + 0.2 * n_layers, 3.0), 12.0)), constrained_layout=True)
    im = ax.imshow(a, origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest")
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(0, n_heads, max(1, n_heads // 8)))
    ax.set_yticks(range(0, n_layers, max(1, n_layers // 9)))
    if title:
        ax.set_title(title, fontsize=10)
    if colorbar:
        ax.figure.colorbar(im, ax=ax, label="alpha", shrink=0.9)
    return ax.figure


def alpha_grid(alphas: Mapping[str, Float[Tensor, "layer head"]], *, ncols: int = 4, title: str = ""):
    """One heatmap per task on a shared 0–1 colour scale, with one colour bar."""
    names = list(alphas)
    ncols = max(1, min(ncols, len(names)))
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.2 * ncols + 1, 2.6 * nrows), squeeze=False, constrained_layout=True)
    im = None
    for ax, name in zip(axes.flat, names):
        alpha_heatmap(alphas[name], title=name, ax=ax, colorbar=False)
        im = ax.images[0]
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=axes, label="alpha", shrink=0.8)
    if title:
        fig.suptitle(title)
    return fig


def save_figure(fig, path: str | Path, formats: Sequence[str] = ("png",), dpi: int = 200) -> list[Path]:
    """Save ``fig`` as ``path`` with each suffix in ``formats``; close it; return the files."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for fmt in formats:
        if fmt not in FORMATS:
            raise ValueError(f"unknown figure format {fmt!r}; use {FORMATS}")
        target = path.with_suffix(f".{fmt}")
        fig.savefig(target, dpi=dpi, bbox_inches="tight")
        out.append(target)
    plt.close(fig)
    return out
