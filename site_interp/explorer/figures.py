"""Plotly figures of the explorer: the tasks x heads grid with its dendrogram, and card parts.

The grid puts tasks on rows in dendrogram order (the dendrogram drawn to their left, leaves
aligned with the rows) and every head on a column, ordered by layer then head, with a thin line
between layers. Heads whose alpha exceeds a threshold are outlined by one line trace
(:func:`outline_path`), so moving a threshold slider updates one trace. Hover shows task, layer,
head and alpha. Card figures: a head's alpha across tasks, its attention over a prompt's tokens,
its patch / removal effects, and two tasks side by side.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots
from scipy.cluster.hierarchy import dendrogram

from site_interp.explorer.cards import CONDITIONS, AttentionSample
from site_interp.explorer.data import RunData, head_label

COLORSCALE = "Viridis"
"""Colour scale of alphas (0 to 1), as in :mod:`site_interp.plots.interactive`."""
OUTLINE_COLOR = "#e8112d"
"""Colour of the outline of heads above the threshold."""
SELECTED_COLOR = "#ff7f0e"
"""Colour of the selected head's column."""
ROLE_COLORS = {"bos": "#bbbbbb", "separator": "#dddddd", "query": "#d62728", "input": "#6baed6", "answer": "#08519c"}
"""Bar colour of a prompt token by role (demonstration input / answer, query, separator, BOS)."""
CONDITION_COLORS = dict(zip(CONDITIONS, ("#bbbbbb", "#1b9e77", "#d95f02", "#08519c")))
_LAYOUT: dict[str, Any] = {"template": "simple_white", "font": {"size": 11}}


def head_columns(n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """(layer, head) of each grid column, by layer then head."""
    return [(layer, head) for layer in range(n_layers) for head in range(n_heads)]


def outline_path(z: np.ndarray, threshold: float) -> tuple[list[float | None], list[float | None]]:
    """x and y of one line trace drawing a square around every cell of ``z`` above ``threshold``
    (cells at integer coordinates, ``None`` between squares)."""
    xs: list[float | None] = []
    ys: list[float | None] = []
    for row, col in np.argwhere(np.asarray(z) > threshold):
        x0, x1, y0, y1 = col - 0.5, col + 0.5, row - 0.5, row + 0.5
        xs += [x0, x1, x1, x0, x0, None]
        ys += [y0, y0, y1, y1, y0, None]
    return xs, ys


def dendrogram_lines(data: RunData) -> list[tuple[list[float], list[float]]]:
    """Segments of the dendrogram, in grid coordinates: y is the task's row (0 = first task of
    :attr:`RunData.tasks`), x the merge distance."""
    if len(data.labels) < 2:
        return []
    d = dendrogram(data.linkage, labels=data.labels, no_plot=True)
    if list(d["ivl"]) != list(data.tasks):
        raise ValueError(f"the tasks {data.tasks} are not in the dendrogram's leaf order {d['ivl']}")
    # leaves sit at y = 5, 15, 25...: row i of the grid
    return [([float(x) for x in dc], [(y - 5.0) / 10.0 for y in ic]) for ic, dc in zip(d["icoord"], d["dcoord"])]


def grid_figure(data: RunData, threshold: float = 0.5, selected: tuple[int, int] | None = None,
                *, height: int | None = None) -> go.Figure:
    """Tasks x heads alpha heatmap with the dendrogram beside it (see the module doc).

    Trace 0 is the heatmap (``customdata``: task, layer, head), trace 1 the threshold outline,
    trace 2 the selected head's column; the dendrogram's segments follow.
    """
    cols = head_columns(data.n_layers, data.n_heads)
    z = data.alphas.reshape(len(data.tasks), -1).numpy()
    custom = [[[task, layer, head] for layer, head in cols] for task in data.tasks]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, column_widths=[0.12, 0.88], horizontal_spacing=0.005)
    fig.add_trace(go.Heatmap(
        z=z, x=list(range(len(cols))), y=list(range(len(data.tasks))), customdata=custom, zmin=0.0, zmax=1.0,
        colorscale=COLORSCALE, colorbar={"title": {"text": "alpha"}, "len": 0.9}, xgap=0.5, ygap=1, name="alpha",
        hovertemplate="task: %{customdata[0]}<br>layer %{customdata[1]}, head %{customdata[2]}<br>alpha: %{z:.3f}<extra></extra>",
    ), row=1, col=2)
    ox, oy = outline_path(z, threshold)
    fig.add_trace(go.Scatter(x=ox, y=oy, mode="lines", line={"color": OUTLINE_COLOR, "width": 1.5}, hoverinfo="skip",
                             name=f"alpha > {threshold:g}", showlegend=False), row=1, col=2)
    sx, sy = _selected_path(selected, data)
    fig.add_trace(go.Scatter(x=sx, y=sy, mode="lines", line={"color": SELECTED_COLOR, "width": 2.5}, hoverinfo="skip",
                             name="selected head", showlegend=False), row=1, col=2)
    for xs, ys in dendrogram_lines(data):
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"color": "#444", "width": 1}, hoverinfo="skip",
                                 showlegend=False), row=1, col=1)
    n = len(data.tasks)
    for layer in range(1, data.n_layers):
        fig.add_vline(x=layer * data.n_heads - 0.5, line={"color": "white", "width": 2}, row=1, col=2)
    fig.update_xaxes(autorange="reversed", visible=False, row=1, col=1)
    fig.update_xaxes(
        row=1, col=2, title_text="head (by layer)", range=[-0.5, len(cols) - 0.5],
        tickvals=[layer * data.n_heads + (data.n_heads - 1) / 2 for layer in range(data.n_layers)],
        ticktext=[f"L{layer}" for layer in range(data.n_layers)],
    )
    fig.update_yaxes(range=[n - 0.5, -0.5], tickvals=list(range(n)), ticktext=data.tasks, row=1, col=1)
    fig.update_yaxes(showticklabels=True, side="right", row=1, col=2, tickvals=[], ticks="")
    fig.update_layout(
        **_LAYOUT, height=height or int(np.clip(140 + 26 * n, 300, 1400)), margin={"l": 140, "r": 30, "t": 40, "b": 50},
        title={"text": f"{data.model_id}: alpha per task and head (outlined: alpha > {threshold:g})", "x": 0.01},
        clickmode="event",
    )
    fig.update_yaxes(showticklabels=True, row=1, col=1)
    return fig


def _selected_path(selected: tuple[int, int] | None, data: RunData) -> tuple[list, list]:
    if selected is None:
        return [], []
    x = selected[0] * data.n_heads + selected[1]
    n = len(data.tasks)
    return [x - 0.5, x + 0.5, x + 0.5, x - 0.5, x - 0.5], [-0.5, -0.5, n - 0.5, n - 0.5, -0.5]


def alpha_bar_figure(data: RunData, layer: int, head: int, threshold: float = 0.5) -> go.Figure:
    """One head's alpha in every task, tasks in the grid's (dendrogram) order."""
    values = data.head_alphas(layer, head).numpy()
    fig = go.Figure(go.Bar(
        x=data.tasks, y=values, marker={"color": [OUTLINE_COLOR if v > threshold else "#08519c" for v in values]},
        hovertemplate="%{x}: alpha %{y:.3f}<extra></extra>",
    ))
    fig.add_hline(y=threshold, line={"dash": "dot", "color": "#888"})
    fig.update_layout(**_LAYOUT, height=300, margin={"l": 50, "r": 10, "t": 40, "b": 90},
                      title={"text": f"{head_label(layer, head)}: alpha across tasks", "x": 0.01})
    fig.update_yaxes(title_text="alpha", range=[0, 1.02])
    fig.update_xaxes(tickangle=-40, type="category")
    return fig


def role_color(role: str) -> str:
    """Bar colour of a token role."""
    for key in ("input", "answer"):
        if role.endswith(key):
            return ROLE_COLORS[key]
    return ROLE_COLORS.get(role, "#999999")


def attention_figure(sample: AttentionSample, layer: int, head: int) -> go.Figure:
    """Attention of ``(layer, head)`` at the last token over the sample prompt's tokens,
    coloured by role (demonstration inputs light blue, answers dark blue, the query red)."""
    weights = sample.head(layer, head).numpy()
    labels = [f"{i}:{tok!r}"[: 24] for i, tok in enumerate(sample.tokens)]
    fig = go.Figure(go.Bar(
        x=list(range(len(weights))), y=weights, marker={"color": [role_color(r) for r in sample.roles]},
        customdata=[[label, role] for label, role in zip(labels, sample.roles)],
        hovertemplate="%{customdata[0]}<br>%{customdata[1]}<br>attention %{y:.3f}<extra></extra>",
    ))
    fig.update_layout(**_LAYOUT, height=320, margin={"l": 50, "r": 10, "t": 40, "b": 90},
                      title={"text": f"{head_label(layer, head)}: attention at the last token ({sample.task})", "x": 0.01})
    fig.update_xaxes(tickvals=list(range(len(weights))), ticktext=[repr(t)[1:-1][:8] for t in sample.tokens],
                     tickangle=-90, tickfont={"size": 8})
    fig.update_yaxes(title_text="attention", rangemode="tozero")
    return fig


def effects_figure(effects: pd.DataFrame) -> go.Figure:
    """Accuracy under each condition of :data:`~site_interp.explorer.cards.CONDITIONS`
    (hover adds the mean answer log-probability)."""
    row = effects.iloc[0]
    fig = go.Figure(go.Bar(
        x=effects["condition"], y=effects["accuracy"],
        marker={"color": [CONDITION_COLORS.get(c, "#888") for c in effects["condition"]]},
        customdata=effects[["answer_logprob"]].to_numpy(),
        text=[f"{a:.0f}%" for a in effects["accuracy"]], textposition="outside",
        hovertemplate="%{x}<br>accuracy %{y:.1f}%<br>mean log p(answer) %{customdata[0]:.2f}<extra></extra>",
    ))
    fig.update_layout(**_LAYOUT, height=300, margin={"l": 50, "r": 10, "t": 40, "b": 60},
                      title={"text": f"{head_label(int(row['layer']), int(row['head']))} on {row['task']} "
                                     f"({int(row['n'])} test queries, first token)", "x": 0.01})
    fig.update_yaxes(title_text="accuracy (%)", range=[0, 105])
    return fig


def compare_figure(data: RunData, a: str, b: str, threshold: float = 0.5) -> go.Figure:
    """Two tasks' alphas (layer x head) side by side and the heads above ``threshold`` in both."""
    za, zb = data.alpha(a).numpy(), data.alpha(b).numpy()
    shared = ((za > threshold) & (zb > threshold)).astype(float)
    fig = make_subplots(rows=1, cols=3, subplot_titles=[a, b, f"both > {threshold:g} ({int(shared.sum())} heads)"],
                        shared_yaxes=True, horizontal_spacing=0.04)
    for i, (z, name) in enumerate(((za, a), (zb, b)), 1):
        fig.add_trace(go.Heatmap(z=z, zmin=0, zmax=1, colorscale=COLORSCALE, coloraxis="coloraxis", xgap=1, ygap=1,
                                 name=name, hovertemplate=f"{name}<br>layer %{{y}}, head %{{x}}<br>alpha %{{z:.3f}}<extra></extra>"),
                      row=1, col=i)
    fig.add_trace(go.Heatmap(z=shared, zmin=0, zmax=1, colorscale=[[0, "#f2f2f2"], [1, OUTLINE_COLOR]], showscale=False,
                             xgap=1, ygap=1, hovertemplate="layer %{y}, head %{x}<extra></extra>"), row=1, col=3)
    title = f"{a} vs {b}"
    entry = transfer_entry(data, a, b)
    if entry:
        title += " | " + entry
    fig.update_layout(**_LAYOUT, height=int(np.clip(120 + 18 * data.n_layers, 300, 800)),
                      coloraxis={"cmin": 0, "cmax": 1, "colorscale": COLORSCALE, "colorbar": {"title": {"text": "alpha"}}},
                      title={"text": title, "x": 0.01}, margin={"l": 50, "r": 20, "t": 70, "b": 40})
    fig.update_xaxes(title_text="head")
    fig.update_yaxes(title_text="layer", col=1)
    return fig


def transfer_entry(data: RunData, a: str, b: str) -> str:
    """``"transfer a->b 71%, b->a 40% (own: 90%, 85%)"`` from ``study/transfer.csv``, or ``""``."""
    m = data.transfer
    if m is None or not {a, b} <= set(m.index) or not {a, b} <= set(m.columns):
        return ""
    return (f"transfer {a}\u2192{b} {m.loc[a, b]:.0f}%, {b}\u2192{a} {m.loc[b, a]:.0f}% "
            f"(own alphas: {m.loc[b, b]:.0f}%, {m.loc[a, a]:.0f}%)")


def shared_heads(data: RunData, a: str, b: str, threshold: float = 0.5) -> list[tuple[int, int]]:
    """Heads whose alpha exceeds ``threshold`` in both tasks."""
    both = (data.alpha(a) > threshold) & (data.alpha(b) > threshold)
    return [(int(layer), int(head)) for layer, head in both.nonzero().tolist()]


def dla_html(table: pd.DataFrame, tasks: Sequence[str] | None = None) -> str:
    """An HTML table: one row per task, its promoted and suppressed tokens with their logits."""
    rows = []
    for task in tasks or list(dict.fromkeys(table["task"])):
        t = table[table["task"] == task]
        cells = []
        for direction in ("promoted", "suppressed"):
            part = t[t["direction"] == direction].sort_values("rank")
            cells.append(" ".join(f"<code>{_esc(tok)}</code>&nbsp;<small>{v:+.2f}</small>"
                                  for tok, v in zip(part["token"], part["logit"])))
        rows.append(f"<tr><td>{_esc(task)}</td><td>{cells[0]}</td><td>{cells[1]}</td></tr>")
    return ("<table class='site-dla'><tr><th>task</th><th>promoted</th><th>suppressed</th></tr>"
            + "".join(rows) + "</table>")


def _esc(text: str) -> str:
    return (repr(text)[1:-1] if text.strip() != text or not text else text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


__all__ = [
    "COLORSCALE",
    "alpha_bar_figure",
    "attention_figure",
    "compare_figure",
    "dendrogram_lines",
    "dla_html",
    "effects_figure",
    "grid_figure",
    "head_columns",
    "outline_path",
    "role_color",
    "shared_heads",
    "transfer_entry",
]
