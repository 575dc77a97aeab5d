"""Interactive figures (plotly) for notebooks.

Every function returns a ``plotly.graph_objects.Figure`` and never shows it (a notebook
displays the returned figure). Hover text is built with ``hovertemplate`` over
``customdata``, so each point carries its own labels (task, layer, head, ...). Colours,
dashes and task orderings come from :mod:`site_interp.plots.style`, as in the static figures
of :mod:`site_interp.plots.static`; this module does not import matplotlib.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from site_interp.plots.style import EXTRA_COLORS as EXTRA_COLORS  # re-exported
from site_interp.plots.style import REFERENCE_COLORS as REFERENCE_COLORS  # re-exported
from site_interp.plots.style import (
    BAND_ALPHA,
    PLOTLY_DASHES,
    SELECTIONS,
    reference_colors,
    reorder_tasks,
    selection_styles,
)
from site_interp.plots.style import format_k as _fmt_k
from site_interp.plots.style import require_columns as _require
from site_interp.plots.style import to_numpy as _np

ALPHA_HOVER = (
    "task: %{customdata[2]}<br>layer: %{customdata[0]}<br>head: %{customdata[1]}"
    "<br>alpha: %{z:.3f}<extra></extra>"
)
"""Hover text of every alpha heatmap cell; customdata is ``[layer, head, task]``."""
SELECTION_COLORS: dict[str, tuple[str, str]] = {name: (s.color, PLOTLY_DASHES[s.dash]) for name, s in SELECTIONS.items()}
"""(colour, plotly dash) of the known head selections (from :data:`style.SELECTIONS`)."""
_LAYOUT: dict[str, Any] = {"template": "simple_white", "font": {"size": 12}, "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i:i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _alpha_trace(alpha: Float[Tensor, "layer head"] | np.ndarray, task: str, **kwargs: Any) -> go.Heatmap:
    a = _np(alpha)
    if a.ndim != 2:
        raise ValueError(f"alpha must be (layer, head), got shape {a.shape}")
    n_layers, n_heads = a.shape
    custom = [[[layer, head, task] for head in range(n_heads)] for layer in range(n_layers)]
    return go.Heatmap(
        z=a, x=list(range(n_heads)), y=list(range(n_layers)), customdata=custom,
        hovertemplate=ALPHA_HOVER, name=task, xgap=1, ygap=1, **kwargs,
    )


def interactive_alpha_heatmap(
    alpha: Float[Tensor, "layer head"] | np.ndarray,
    task: str = "",
    *,
    colorscale: str = "Viridis",
    height: int | None = None,
) -> go.Figure:
    """Heads (x) by layers (y, layer 0 at the bottom) on a fixed 0–1 scale; hover shows
    task, layer, head and alpha (3 decimals)."""
    trace = _alpha_trace(alpha, task, zmin=0.0, zmax=1.0, colorscale=colorscale, colorbar={"title": {"text": "alpha"}})
    n_layers = len(trace.y)
    fig = go.Figure(trace)
    fig.update_layout(
        **_LAYOUT, title={"text": task} if task else None,
        height=height or int(np.clip(120 + 18 * n_layers, 300, 800)), width=None,
    )
    fig.update_xaxes(title_text="head", dtick=1 if len(trace.x) <= 16 else None)
    fig.update_yaxes(title_text="layer")
    return fig


def interactive_alpha_grid(
    alphas: Mapping[str, Float[Tensor, "layer head"] | np.ndarray],
    ncols: int = 4,
    *,
    colorscale: str = "Viridis",
    panel_height: int = 260,
) -> go.Figure:
    """One heatmap per task in a grid of subplots sharing one 0–1 colour axis (one colour bar);
    hover shows task, layer, head and alpha. Unused grid cells have hidden axes."""
    names = list(alphas)
    if not names:
        raise ValueError("interactive_alpha_grid needs at least one task")
    ncols = max(1, min(ncols, len(names)))
    nrows = -(-len(names) // ncols)
    fig = make_subplots(
        rows=nrows, cols=ncols, subplot_titles=[str(n) for n in names],
        horizontal_spacing=min(0.05, 0.9 / max(ncols - 1, 1)),
        vertical_spacing=min(0.12, 0.9 / max(nrows - 1, 1)),
    )
    for i, name in enumerate(names):
        fig.add_trace(_alpha_trace(alphas[name], str(name), coloraxis="coloraxis"), row=i // ncols + 1, col=i % ncols + 1)
    for i in range(len(names), nrows * ncols):
        fig.update_xaxes(visible=False, row=i // ncols + 1, col=i % ncols + 1)
        fig.update_yaxes(visible=False, row=i // ncols + 1, col=i % ncols + 1)
    fig.update_layout(
        **_LAYOUT, height=panel_height * nrows + 80,
        coloraxis={"cmin": 0.0, "cmax": 1.0, "colorscale": colorscale, "colorbar": {"title": {"text": "alpha"}}},
    )
    fig.update_xaxes(title_text="head", row=nrows)
    fig.update_yaxes(title_text="layer", col=1)
    return fig


def _matrix_figure(m: pd.DataFrame, hover: str, x_title: str, y_title: str, text: str | None, **kwargs: Any) -> go.Figure:
    """Heatmap of a task-by-task matrix, first row at the top, categorical axes;
    customdata is ``[row name, column name]``."""
    rows, cols = [str(r) for r in m.index], [str(c) for c in m.columns]
    custom = [[[r, c] for c in cols] for r in rows]
    trace = go.Heatmap(
        z=m.to_numpy(dtype=float), x=cols, y=rows, customdata=custom, hovertemplate=hover,
        xgap=1, ygap=1, **({"texttemplate": text} if text else {}), **kwargs,
    )
    fig = go.Figure(trace)
    side = int(np.clip(140 + 40 * max(len(rows), len(cols)), 400, 900))
    fig.update_layout(**_LAYOUT, height=side, width=side + 120)
    fig.update_xaxes(title_text=x_title, type="category", tickangle=-45)
    fig.update_yaxes(title_text=y_title, type="category", autorange="reversed")
    return fig


def interactive_transfer(
    matrix: pd.DataFrame,
    order: Sequence[str] | None = None,
    *,
    normalized: bool = False,
    annotate: bool = True,
) -> go.Figure:
    """Cross-task transfer (rows: alphas from, columns: evaluated on), in percent on 0–100,
    or (``normalized``) ratios on a diverging scale centred at 1. ``order`` reorders rows and
    columns; values are written in the cells when ``annotate`` and at most 15 tasks."""
    m = reorder_tasks(matrix, order)
    small = annotate and max(m.shape) <= 15
    if normalized:
        value, text = "relative accuracy: %{z:.2f}", "%{z:.2f}"
        kwargs: dict[str, Any] = {"colorscale": "RdBu", "reversescale": True, "zmid": 1.0}
    else:
        value, text = "accuracy: %{z:.1f}%", "%{z:.0f}"
        kwargs = {"colorscale": "Viridis", "zmin": 0.0, "zmax": 100.0}
    hover = f"alphas from: %{{customdata[0]}}<br>evaluated on: %{{customdata[1]}}<br>{value}<extra></extra>"
    kwargs["colorbar"] = {"title": {"text": "ratio" if normalized else "accuracy (%)"}}
    return _matrix_figure(m, hover, "evaluated on", "alphas from", text if small else None, **kwargs)


def interactive_similarity(
    sim: pd.DataFrame,
    order: Sequence[str] | None = None,
    *,
    zmin: float | None = None,
    zmax: float | None = None,
    colorscale: str = "Viridis",
) -> go.Figure:
    """Task-by-task similarity heatmap; ``order`` (e.g. dendrogram leaves) reorders rows and
    columns; hover shows task a (row), task b (column) and the similarity."""
    hover = "task a: %{customdata[0]}<br>task b: %{customdata[1]}<br>similarity: %{z:.3f}<extra></extra>"
    return _matrix_figure(
        reorder_tasks(sim, order), hover, "task b", "task a", None,
        colorscale=colorscale, zmin=zmin, zmax=zmax, colorbar={"title": {"text": "similarity"}},
    )


def interactive_patching(
    summary: pd.DataFrame,
    task: str,
    *,
    references: pd.DataFrame | None = None,
    metric_label: str = "accuracy (%)",
) -> go.Figure:
    """Accuracy against k for one task: a line per selection with its 95% band (``lo``/``hi``
    columns, when present) and, from ``references`` (``task, method, accuracy``), one
    horizontal line per method. x is logarithmic with ticks at the k values (linear when some
    k <= 0). Hover shows the selection, k, accuracy and interval."""
    _require(summary, ("task", "selection", "k", "accuracy"), "summary")
    rows = summary[summary["task"] == task]
    if rows.empty:
        raise ValueError(f"no rows for task {task!r}; tasks: {list(dict.fromkeys(summary['task']))}")
    styles = selection_styles(rows["selection"])
    has_band = {"lo", "hi"} <= set(rows.columns)
    ks = np.sort(rows["k"].unique()).astype(float)
    fig = go.Figure()
    for sel, style in styles.items():
        color, dash = style.color, PLOTLY_DASHES[style.dash]
        s = rows[rows["selection"] == sel].sort_values("k")
        x, y = s["k"].to_numpy(float), s["accuracy"].to_numpy(float)
        lo = s["lo"].to_numpy(float) if has_band else np.full_like(y, np.nan)
        hi = s["hi"].to_numpy(float) if has_band else np.full_like(y, np.nan)
        ok = np.isfinite(lo) & np.isfinite(hi)
        if ok.any():
            fig.add_trace(go.Scatter(
                x=np.concatenate([x[ok], x[ok][::-1]]), y=np.concatenate([hi[ok], lo[ok][::-1]]),
                fill="toself", fillcolor=_rgba(color, BAND_ALPHA), line={"width": 0}, hoverinfo="skip",
                showlegend=False, legendgroup=str(sel), name=f"{sel} 95% interval",
            ))
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines+markers", name=str(sel), legendgroup=str(sel),
            line={"color": color, "dash": dash}, marker={"size": 7},
            customdata=[[str(sel), a, b] for a, b in zip(lo, hi)],
            hovertemplate=(
                "selection: %{customdata[0]}<br>k: %{x}<br>accuracy: %{y:.1f}%"
                "<br>95% interval: [%{customdata[1]:.1f}, %{customdata[2]:.1f}]<extra></extra>"
            ),
        ))
    if references is not None and len(references):
        colors = reference_colors(references["method"])  # over all tasks: a method keeps its colour
        for r in references[references["task"] == task].itertuples(index=False):
            fig.add_trace(go.Scatter(
                x=[ks.min(), ks.max()], y=[float(r.accuracy)] * 2, mode="lines", name=str(r.method),
                line={"color": colors[r.method], "width": 1.5},
                hovertemplate="%{fullData.name}: %{y:.1f}%<extra></extra>",
            ))
    log = bool(len(ks)) and ks.min() > 0
    fig.update_layout(**_LAYOUT, title={"text": str(task)}, height=420, hovermode="closest")
    fig.update_xaxes(
        title_text="k (heads)", type="log" if log else "linear",
        tickvals=list(ks), ticktext=[_fmt_k(k) for k in ks],
    )
    fig.update_yaxes(title_text=metric_label)
    return fig
