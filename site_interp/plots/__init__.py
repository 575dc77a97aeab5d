"""Figures of site_interp, static and interactive, kept apart from the method itself.

Modules:

- :mod:`~site_interp.plots.style`: what both kinds of figure share (selection colours and
  dashes, palettes, task reordering, k tick labels); imports no plotting library.
- :mod:`~site_interp.plots.static`: paper-ready matplotlib/seaborn figures and
  :func:`save_figure` (png/pdf/svg, written atomically).
- :mod:`~site_interp.plots.interactive`: plotly figures for notebooks; import it explicitly
  (``from site_interp.plots import interactive``), as this package never loads plotly itself.
- :mod:`~site_interp.plots.run_figures`: every figure of a finished run from its files
  (``python -m site_interp.figures``), and the per-task alpha heatmaps of a pipeline run.

The static figure functions are available from here (``from site_interp.plots import
alpha_heatmap``). They are loaded on first use, so ``import site_interp.plots`` imports
neither matplotlib nor plotly; :mod:`~site_interp.plots.static` then picks the headless Agg
backend only when the user has not chosen a backend already.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from site_interp.plots.static import (
        FORMATS,
        alpha_grid,
        alpha_heatmap,
        dendrogram_plot,
        figure_width,
        paper_style,
        patching_curves,
        save_figure,
        similarity_clustermap,
        similarity_vs_transfer_plot,
        transfer_heatmap,
    )

_STATIC = (
    "FORMATS",
    "alpha_grid",
    "alpha_heatmap",
    "dendrogram_plot",
    "figure_width",
    "paper_style",
    "patching_curves",
    "save_figure",
    "similarity_clustermap",
    "similarity_vs_transfer_plot",
    "transfer_heatmap",
)

__all__ = list(_STATIC)


def __getattr__(name: str) -> Any:
    if name in _STATIC:
        value = getattr(importlib.import_module("site_interp.plots.static"), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_STATIC))
