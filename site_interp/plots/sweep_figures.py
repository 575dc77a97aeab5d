"""The cross-model figure of a sweep: where each model's selected heads sit by relative depth.

Models of different depth (an 18-layer Gemma, a 30-layer SmolLM2, a 32-layer Llama) share one
axis through ``rel_depth = layer / (n_layers - 1)``. :func:`head_depth_figure` draws, from the
``heads`` table of :mod:`site_interp.sweeps.tables` (one row per model, cell, task and head):

* left: every head's alpha against its relative depth, one colour per model (points jittered
  a little along x so the heads of a layer do not hide each other), each model's mean alpha per
  layer as a line, the selection threshold dashed;
* right: per model, how its selected heads (alpha > threshold) spread over relative depth: the
  share of them in each depth bin, over all tasks, seeds and settings.

:func:`save_sweep_figures` writes it as ``<dir>/head_depth.<fmt>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from site_interp.artifacts import write_text
from site_interp.plots.static import figure_width, paper_style, save_figure
from site_interp.plots.style import EXTRA_COLORS, require_columns

HEAD_COLUMNS = ("model", "rel_depth", "alpha")
"""Columns :func:`head_depth_figure` needs."""


def depth_histogram(heads: pd.DataFrame, *, threshold: float = 0.5, bins: int = 10) -> pd.DataFrame:
    """Per model, the share of its selected heads (alpha > ``threshold``) in each of ``bins``
    equal relative-depth bins: columns ``model, bin_lo, bin_hi, share, n_selected``. A model
    with no selected head has share 0 in every bin."""
    require_columns(heads, HEAD_COLUMNS, "the heads table")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    edges = np.linspace(0.0, 1.0, bins + 1)
    rows = []
    for model, g in heads.groupby("model", sort=False):
        depth = g.loc[g["alpha"] > threshold, "rel_depth"].to_numpy(dtype=float)
        counts, _ = np.histogram(depth, bins=edges)
        total = counts.sum()
        for lo, hi, c in zip(edges[:-1], edges[1:], counts):
            rows.append({"model": model, "bin_lo": lo, "bin_hi": hi, "share": c / total if total else 0.0,
                         "n_selected": int(total)})
    return pd.DataFrame(rows)


def head_depth_figure(heads: pd.DataFrame, *, threshold: float = 0.5, bins: int = 10, width: float | str = "two",
                      title: str = "", seed: int = 0) -> Figure:
    """Alpha vs relative depth per model (left) and the depth spread of selected heads (right)."""
    require_columns(heads, HEAD_COLUMNS, "the heads table")
    models: Sequence[str] = list(dict.fromkeys(heads["model"]))
    colors = {m: EXTRA_COLORS[i % len(EXTRA_COLORS)] for i, m in enumerate(models)}
    hist = depth_histogram(heads, threshold=threshold, bins=bins)
    rng = np.random.default_rng(seed)
    with paper_style():
        import matplotlib.pyplot as plt

        w = figure_width(width)
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(w, 0.48 * w), layout="constrained")
        for m in models:
            g = heads[heads["model"] == m]
            n_layers = int(g["n_layers"].iloc[0]) if "n_layers" in g else 0
            jitter = rng.uniform(-0.3, 0.3, len(g)) / max(n_layers - 1, 1)
            ax.scatter(g["rel_depth"] + jitter, g["alpha"], s=3, alpha=0.25, color=colors[m], linewidths=0,
                       rasterized=True)
            mean = g.groupby("rel_depth")["alpha"].mean()
            h = hist[hist["model"] == m]
            n_sel = int(h["n_selected"].iloc[0]) if len(h) else 0
            label = f"{m}: {n_layers} layers, {n_sel} selected" if n_layers else f"{m}: {n_sel} selected"
            ax.plot(mean.index, mean.to_numpy(), color=colors[m], linewidth=1.4, label=label)
            bx.plot((h["bin_lo"] + h["bin_hi"]) / 2, h["share"], color=colors[m], marker="o")
        ax.axhline(threshold, color="black", linestyle="--", linewidth=0.6)
        ax.set(xlabel="relative depth (layer / (layers - 1))", ylabel="alpha", xlim=(-0.05, 1.05), ylim=(-0.03, 1.03),
               title="every head (dots) and the mean per layer (line)")
        bx.set(xlabel="relative depth", ylabel=f"share of heads with alpha > {threshold:g}", xlim=(0, 1),
               title="where the selected heads sit")
        bx.set_ylim(bottom=0)
        for a in (ax, bx):
            a.spines[["top", "right"]].set_visible(False)
        fig.legend(loc="outside lower center", ncols=min(len(models), 3))
        if title:
            fig.suptitle(title)
    plt.close(fig)
    return fig


def save_sweep_figures(heads: pd.DataFrame, directory: str | Path, formats: Sequence[str] = ("png",), *,
                       threshold: float = 0.5) -> list[Path]:
    """``head_depth.<fmt>`` and its numbers, ``head_depth.csv``, in ``directory``; [] without heads."""
    if heads.empty:
        return []
    d = Path(directory)
    write_text(d / "head_depth.csv", depth_histogram(heads, threshold=threshold).to_csv(index=False))
    return save_figure(head_depth_figure(heads, threshold=threshold), d / "head_depth", formats)


__all__ = ["HEAD_COLUMNS", "depth_histogram", "head_depth_figure", "save_sweep_figures"]
