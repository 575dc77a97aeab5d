"""Paper-ready static figures (matplotlib/seaborn).

Every function takes plain tensors, arrays or DataFrames, draws inside :func:`paper_style`
(8–9 pt fonts, thin lines), sizes the figure for a one-column (3.5 in) or two-column (7 in)
layout through ``width`` (``"one"``, ``"two"`` or inches), and returns the Figure
(:func:`similarity_clustermap` returns seaborn's ClusterGrid). Nothing is ever shown, and
returned Figures are already closed in pyplot (a notebook shows the returned figure once;
``display(fig)`` or :func:`save_figure` work as usual); :func:`save_figure` writes png/pdf/svg.
Selection colours, palettes and task orderings come from :mod:`site_interp.plots.style`,
shared with the plotly figures of :mod:`site_interp.plots.interactive`.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence, TypeVar, cast

import matplotlib

# Headless by default, but keep a backend the user chose (Jupyter sets MPLBACKEND to inline).
if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from jaxtyping import Float  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.colors import TwoSlopeNorm  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402
from scipy.cluster import hierarchy  # noqa: E402
from torch import Tensor  # noqa: E402

from site_interp.artifacts import write_atomic  # noqa: E402
from site_interp.plots.style import EXTRA_COLORS as EXTRA_COLORS  # noqa: E402  (re-exported)
from site_interp.plots.style import REFERENCE_COLORS as REFERENCE_COLORS  # noqa: E402  (re-exported)
from site_interp.plots.style import (  # noqa: E402
    BAND_ALPHA,
    MPL_LINESTYLES,
    MPL_MARKERS,
    SELECTIONS,
    SelectionStyle,
    reference_colors,
    reorder_tasks,
    selection_styles,
)
from site_interp.plots.style import format_k as _fmt_k  # noqa: E402
from site_interp.plots.style import require_columns as _require  # noqa: E402
from site_interp.plots.style import to_numpy as _np  # noqa: E402

FORMATS = ("png", "pdf", "svg")
Width = Literal["one", "two"] | float
"""Figure width: ``"one"`` column (3.5 in), ``"two"`` columns (7 in), or inches."""
WIDTHS: dict[str, float] = {"one": 3.5, "two": 7.0}
PAPER_RC: dict[str, Any] = {
    "font.size": 8, "axes.titlesize": 9, "axes.labelsize": 8, "figure.titlesize": 9,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "legend.fontsize": 7, "legend.title_fontsize": 8,
    "axes.linewidth": 0.6, "xtick.major.width": 0.6, "ytick.major.width": 0.6,
    "xtick.major.size": 2.5, "ytick.major.size": 2.5, "lines.linewidth": 1.2, "lines.markersize": 3.5,
    "legend.frameon": False, "figure.dpi": 100,
}
"""rcParams applied by :func:`paper_style` to every figure of this module."""


def _mpl_style(style: SelectionStyle) -> dict[str, Any]:
    """matplotlib ``plot`` keywords of a selection style."""
    return {"color": style.color, "linestyle": MPL_LINESTYLES[style.dash], "marker": MPL_MARKERS[style.marker]}


SELECTION_STYLES: dict[str, dict[str, Any]] = {name: _mpl_style(s) for name, s in SELECTIONS.items()}
"""matplotlib line styles of the known head selections (from :data:`style.SELECTIONS`)."""
MARK_COLOR = "black"

_F = TypeVar("_F", bound=Callable[..., Any])


def figure_width(width: Width) -> float:
    """Inches for ``width`` (``"one"`` = 3.5, ``"two"`` = 7.0, or a positive number)."""
    if isinstance(width, str):
        if width not in WIDTHS:
            raise ValueError(f"width must be 'one', 'two' or inches, got {width!r}")
        return WIDTHS[width]
    w = float(width)
    if not (w > 0 and math.isfinite(w)):
        raise ValueError(f"width must be positive, got {width!r}")
    return w


def paper_style(**overrides: Any):
    """Context manager applying :data:`PAPER_RC` (plus ``overrides``) to figures made inside it."""
    return plt.rc_context({**PAPER_RC, **overrides})


def _styled(func: _F) -> _F:
    """Run a figure function inside :func:`paper_style`; detach a Figure it created from pyplot
    (so a notebook displays the returned figure once and loops do not pile up open figures).
    A ClusterGrid stays open: notebooks display it through pyplot, as it has no image repr."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # Load the backend outside the rc context: one first loaded inside it (Jupyter's inline
        # backend) would have its settings, interactive mode included, undone on exit.
        getattr(plt, "_get_backend_mod", lambda: None)()
        before = set(plt.get_fignums())
        with paper_style():
            out = func(*args, **kwargs)
        if isinstance(out, Figure) and getattr(out, "number", None) not in before:
            plt.close(out)
        return out

    return cast(_F, wrapper)


@_styled
def alpha_heatmap(
    alpha: Float[Tensor, "layer head"] | np.ndarray, *, title: str = "", ax: plt.Axes | None = None,
    vmin: float = 0.0, vmax: float = 1.0, cmap: str = "viridis", colorbar: bool = True, width: Width = "one",
    mark_above: float | None = None,
) -> Figure:
    """Heads (x) by layers (y, layer 0 at the bottom), coloured by alpha on a fixed 0–1 scale.

    ``mark_above`` outlines the heads whose alpha exceeds it. With ``ax`` the map is drawn
    there (``width`` is then ignored) and ``ax``'s figure is returned.
    """
    a = _np(alpha)
    if a.ndim != 2:
        raise ValueError(f"alpha must be (layer, head), got shape {a.shape}")
    n_layers, n_heads = a.shape
    if ax is None:
        w = figure_width(width)
        h = float(np.clip(0.6 + (w - 0.9) * n_layers / max(n_heads, 1), 1.8, min(1.3 * w, 5.0)))
        _, ax = plt.subplots(figsize=(w, h), layout="constrained")
    im = ax.imshow(a, origin="lower", aspect="auto", vmin=vmin, vmax=vmax, cmap=cmap, interpolation="nearest")
    if mark_above is not None:
        ys, xs = np.nonzero(a > mark_above)
        if len(xs):
            boxes = [Rectangle((x - 0.5, y - 0.5), 1, 1) for x, y in zip(xs, ys)]
            ax.add_collection(
                PatchCollection(boxes, facecolor="none", edgecolor=MARK_COLOR, linewidth=1.0), autolim=False
            )
    ax.set(xlabel="head", ylabel="layer")
    ax.set_xticks(range(0, n_heads, max(1, math.ceil(n_heads / 8))))
    ax.set_yticks(range(0, n_layers, max(1, math.ceil(n_layers / 9))))
    ax.set_title(title)
    if colorbar:
        cb = ax.figure.colorbar(im, ax=ax, label="alpha", shrink=0.9, pad=0.02)
        cb.outline.set_linewidth(0.4)
    return cast(Figure, ax.figure)


@_styled
def alpha_grid(
    alphas: Mapping[str, Float[Tensor, "layer head"] | np.ndarray], *, ncols: int = 4, title: str = "",
    width: Width = "two", mark_above: float | None = None, cmap: str = "viridis",
) -> Figure:
    """One heatmap per task on a shared 0–1 colour scale, with one colour bar.

    The figure holds one visible Axes per task plus the colour bar; unused grid cells are hidden.
    """
    names = list(alphas)
    if not names:
        raise ValueError("alpha_grid needs at least one task")
    arrays = {n: _np(alphas[n]) for n in names}
    ncols = max(1, min(ncols, len(names)))
    nrows = -(-len(names) // ncols)
    n_layers, n_heads = arrays[names[0]].shape
    w = figure_width(width)
    panel_w = (w - 0.6) / ncols
    panel_h = float(np.clip(panel_w * n_layers / max(n_heads, 1), 0.6 * panel_w, 1.4 * panel_w)) + 0.3
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(w, nrows * panel_h + (0.25 if title else 0.0)), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    for i, (ax, name) in enumerate(zip(flat, names)):
        alpha_heatmap(arrays[name], title=str(name), ax=ax, colorbar=False, cmap=cmap, mark_above=mark_above)
        if i % ncols:
            ax.set_ylabel("")
        if i + ncols < len(names):
            ax.set_xlabel("")
    for ax in flat[len(names):]:
        ax.set_visible(False)
    visible = flat[: len(names)]
    cb = fig.colorbar(visible[0].images[0], ax=visible, label="alpha", shrink=0.8, pad=0.02)
    cb.outline.set_linewidth(0.4)
    if title:
        fig.suptitle(title)
    return fig


def _k_axis(ax: plt.Axes, ks: np.ndarray) -> None:
    """log2 x axis (symlog when some k <= 0) with ticks at ``ks``, labels thinned to about 6."""
    if len(ks) and ks.min() > 0:
        ax.set_xscale("log", base=2)
    else:
        ax.set_xscale("symlog", base=2, linthresh=1)
    step = max(1, math.ceil(len(ks) / 6))
    ax.set_xticks(ks, [_fmt_k(k) if j % step == 0 else "" for j, k in enumerate(ks)])
    ax.xaxis.set_minor_locator(NullLocator())


@_styled
def patching_curves(
    summary: pd.DataFrame, references: pd.DataFrame | None = None, *, metric_label: str = "accuracy (%)",
    ncols: int = 3, width: Width = "two", title: str = "",
) -> Figure:
    """Accuracy against the number of heads k, one panel per task.

    ``summary``: columns ``task, selection, k, accuracy`` and optionally ``lo, hi`` (95%
    interval, drawn as a band). Each selection keeps one style across panels (top: dark blue,
    bottom: grey-blue, random: dashed, ablate_top: red dotted, others: palette, dash-dot).
    ``references``: columns ``task, method, accuracy``, drawn as horizontal lines. One legend
    below the panels; unused grid cells are hidden, so visible Axes = tasks.
    """
    _require(summary, ("task", "selection", "k", "accuracy"), "summary")
    tasks = list(dict.fromkeys(summary["task"]))
    if not tasks:
        raise ValueError("summary is empty")
    styles = {sel: _mpl_style(st) for sel, st in selection_styles(summary["selection"]).items()}
    refs = references if references is not None and len(references) else None
    ref_styles: dict[Any, dict[str, Any]] = {}
    if refs is not None:
        _require(refs, ("task", "method", "accuracy"), "references")
        ref_styles = {m: {"color": c, "linewidth": 0.9} for m, c in reference_colors(refs["method"]).items()}
    has_band = {"lo", "hi"} <= set(summary.columns)
    ncols = max(1, min(ncols, len(tasks)))
    nrows = -(-len(tasks) // ncols)
    w = figure_width(width)
    panel_h = min(0.75 * w / ncols, 2.2) + 0.3
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(w, nrows * panel_h + 0.4 + (0.25 if title else 0.0)), squeeze=False, layout="constrained"
    )
    flat = list(axes.flat)
    handles: dict[str, Any] = {}
    for i, (ax, task) in enumerate(zip(flat, tasks)):
        rows = summary[summary["task"] == task]
        for sel, style in styles.items():
            s = rows[rows["selection"] == sel].sort_values("k")
            if s.empty:
                continue
            x = s["k"].to_numpy(float)
            (line,) = ax.plot(x, s["accuracy"].to_numpy(float), label=str(sel), **style)
            handle: Any = line
            if has_band:
                lo, hi = s["lo"].to_numpy(float), s["hi"].to_numpy(float)
                ok = np.isfinite(lo) & np.isfinite(hi)
                if ok.any():
                    band = ax.fill_between(x[ok], lo[ok], hi[ok], color=style["color"], alpha=BAND_ALPHA, linewidth=0)
                    handle = (band, line)
            handles.setdefault(str(sel), handle)
        if refs is not None:
            for r in refs[refs["task"] == task].itertuples(index=False):
                ref = ax.axhline(float(r.accuracy), label=str(r.method), **ref_styles[r.method])
                handles.setdefault(str(r.method), ref)
        _k_axis(ax, np.sort(rows["k"].unique()).astype(float))
        ax.set_title(str(task))
        if i % ncols == 0:
            ax.set_ylabel(metric_label)
        if i + ncols >= len(tasks):
            ax.set_xlabel("k (heads)")
        ax.spines[["top", "right"]].set_visible(False)
    for ax in flat[len(tasks):]:
        ax.set_visible(False)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncols=min(len(handles), 4 if w < 5 else 7))
    if title:
        fig.suptitle(title)
    return fig


@_styled
def transfer_heatmap(
    matrix: pd.DataFrame, *, order: Sequence[str] | None = None, normalized: bool = False,
    annotate: bool = True, title: str = "", width: Width | None = None, cmap: str | None = None,
    vmin: float | None = None, vmax: float | None = None, cbar_label: str | None = None,
) -> Figure:
    """Cross-task transfer: rows = task whose alphas are used, columns = task evaluated.

    Values are accuracies in percent on a 0–100 scale, or (``normalized``) ratios on a
    diverging colormap centred at 1.0. ``order`` reorders rows and columns; cells are
    annotated when ``annotate`` and at most 15 tasks; the diagonal cells are outlined.
    ``width`` defaults to one column up to 8 tasks, two columns beyond.
    """
    m = reorder_tasks(matrix, order).astype(float)
    n_rows, n_cols = m.shape
    n = max(n_rows, n_cols)
    w = figure_width(width if width is not None else ("one" if n <= 8 else "two"))
    h = float(np.clip(0.85 * w * n_rows / max(n_cols, 1), 1.5, 1.2 * w))
    fig, ax = plt.subplots(figsize=(w, h), layout="constrained")
    if normalized:
        finite = m.to_numpy()[np.isfinite(m.to_numpy())]
        d = max(float(np.abs(finite - 1.0).max()) if finite.size else 0.0, 0.05)
        lo, hi = 1.0 - d if vmin is None else vmin, 1.0 + d if vmax is None else vmax
        kw: dict[str, Any] = {"cmap": cmap or "RdBu_r", "norm": TwoSlopeNorm(1.0, lo, hi)}
        fmt, label = ".2f", cbar_label or "relative accuracy"
    else:
        kw = {"cmap": cmap or "viridis", "vmin": 0.0 if vmin is None else vmin, "vmax": 100.0 if vmax is None else vmax}
        fmt, label = ".0f", cbar_label or "accuracy (%)"
    sns.heatmap(
        m, ax=ax, annot=bool(annotate and n <= 15), fmt=fmt, annot_kws={"fontsize": 6 if n > 8 else 7},
        linewidths=0.4, linecolor="white", xticklabels=True, yticklabels=True,
        cbar_kws={"label": label, "shrink": 0.85, "pad": 0.02}, **kw,
    )
    cols = list(m.columns)
    for i, src in enumerate(m.index):
        if src in cols:
            ax.add_patch(Rectangle((cols.index(src), i), 1, 1, fill=False, edgecolor="black", linewidth=0.8))
    ax.set(xlabel="evaluated on", ylabel="alphas from")
    ax.tick_params(length=0)
    plt.setp(ax.get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
    plt.setp(ax.get_yticklabels(), rotation=0)
    ax.set_title(title)
    return fig


@_styled
def similarity_clustermap(
    sim: pd.DataFrame, linkage: np.ndarray, *, title: str = "", vmin: float | None = None,
    vmax: float | None = None, width: Width | None = None, cmap: str = "mako", label: str = "similarity",
) -> sns.matrix.ClusterGrid:
    """Task-by-task similarity ordered and bordered by dendrograms of ``linkage``.

    ``linkage`` (scipy format, ``(n - 1, 4)``) must be built over the tasks in ``sim.index``
    order; it is used for rows and columns alike. Returns the ClusterGrid; pass it to
    :func:`save_figure`. ``width`` defaults to one column up to 10 tasks, two beyond.
    """
    n = len(sim.index)
    if sim.shape != (n, n):
        raise ValueError(f"sim must be square, got shape {sim.shape}")
    z = np.asarray(linkage, dtype=float)
    if z.shape != (n - 1, 4):
        raise ValueError(f"linkage must have shape ({n - 1}, 4) for {n} tasks, got {z.shape}")
    if set(sim.columns) == set(sim.index):
        sim = sim.loc[:, list(sim.index)]
    w = figure_width(width if width is not None else ("one" if n <= 10 else "two"))
    g = sns.clustermap(
        sim.astype(float), row_linkage=z, col_linkage=z, cmap=cmap, vmin=vmin, vmax=vmax,
        figsize=(w, w), dendrogram_ratio=0.14, cbar_pos=(0.03, 0.87, 0.025, 0.11),
        xticklabels=True, yticklabels=True, tree_kws={"linewidths": 0.6},
    )
    g.ax_cbar.set_title(label, fontsize=PAPER_RC["xtick.labelsize"], loc="left")
    g.ax_heatmap.set(xlabel="", ylabel="")
    g.ax_heatmap.tick_params(length=0)
    plt.setp(g.ax_heatmap.get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
    if title:
        g.ax_col_dendrogram.set_title(title)
    return g


@_styled
def dendrogram_plot(
    linkage: np.ndarray, labels: Sequence[str], *, title: str = "", width: Width = "one",
    orientation: Literal["top", "left"] = "top", color_threshold: float | None = None,
    distance_label: str = "distance", label_colors: Mapping[str, str] | None = None,
) -> Figure:
    """scipy dendrogram of ``linkage`` with leaf ``labels`` (rotated 45° under a top tree,
    horizontal beside a left tree, which suits many or long labels); ``label_colors`` colours
    leaf labels by name (e.g. by task kind)."""
    z = np.asarray(linkage, dtype=float)
    labels = [str(x) for x in labels]
    if z.ndim != 2 or z.shape != (len(labels) - 1, 4):
        raise ValueError(f"linkage must have shape ({len(labels) - 1}, 4) for {len(labels)} labels, got {z.shape}")
    w = figure_width(width)
    longest = max(len(x) for x in labels)
    if orientation == "top":
        h = float(np.clip(1.4 + 0.05 * longest, 1.8, 4.0))
    elif orientation == "left":
        h = float(np.clip(0.5 + 0.13 * len(labels), 1.5, 9.0))
    else:
        raise ValueError(f"orientation must be 'top' or 'left', got {orientation!r}")
    fig, ax = plt.subplots(figsize=(w, h), layout="constrained")
    hierarchy.dendrogram(
        z, labels=labels, ax=ax, orientation=orientation, color_threshold=color_threshold,
        above_threshold_color="0.45", leaf_font_size=PAPER_RC["xtick.labelsize"],
    )
    for coll in ax.collections:
        coll.set_linewidth(0.9)
    if orientation == "top":
        rotation, ha = (45, "right") if len(labels) <= 30 else (90, "center")
        plt.setp(ax.get_xticklabels(), rotation=rotation, ha=ha, rotation_mode="anchor")
        ax.set_ylabel(distance_label)
        ax.spines[["top", "right", "bottom"]].set_visible(False)
    else:
        ax.set_xlabel(distance_label)
        ax.spines[["top", "right", "left"]].set_visible(False)
    for tick in (ax.get_xticklabels() if orientation == "top" else ax.get_yticklabels()):
        if label_colors and tick.get_text() in label_colors:
            tick.set_color(label_colors[tick.get_text()])
    ax.set_title(title)
    return fig


@_styled
def similarity_vs_transfer_plot(
    pairs: pd.DataFrame, *, r: float | None = None, ci: tuple[float, float] | None = None,
    x_label: str = "head overlap (Jaccard)", y_label: str = "transfer accuracy (%)", width: Width = "one",
    title: str = "",
) -> Figure:
    """Scatter of task-pair similarity against transfer, with the least-squares line.

    ``pairs``: columns ``source, target, similarity, transfer`` (rows with NaN dropped).
    When ``r`` and/or ``ci`` (a 95% interval) are given they are written in a corner
    (upper left for r >= 0, upper right otherwise) together with the number of pairs.
    """
    _require(pairs, ("similarity", "transfer"), "pairs")
    d = pairs[["similarity", "transfer"]].astype(float).dropna()
    x, y = d["similarity"].to_numpy(), d["transfer"].to_numpy()
    w = figure_width(width)
    fig, ax = plt.subplots(figsize=(w, min(0.8 * w, 4.0)), layout="constrained")
    ax.scatter(x, y, s=14, color="#08519c", alpha=0.75, edgecolors="white", linewidths=0.3, zorder=3)
    if len(x) >= 2 and np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
        xs = np.linspace(x.min(), x.max(), 50)
        ax.plot(xs, intercept + slope * xs, color="#d62728", linewidth=1.1, zorder=2)
    lines = []
    if r is not None:
        lines.append(f"r = {r:.2f}")
    if ci is not None:
        if len(ci) != 2:
            raise ValueError(f"ci must be (low, high), got {ci!r}")
        lines.append(f"95% CI [{ci[0]:.2f}, {ci[1]:.2f}]")
    if lines:
        lines.append(f"n = {len(x)}")
        right = r is not None and r < 0
        ax.text(0.97 if right else 0.03, 0.97, "\n".join(lines), transform=ax.transAxes, va="top",
                ha="right" if right else "left", fontsize=PAPER_RC["legend.fontsize"],
                bbox={"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "0.8", "alpha": 0.85})
    ax.set(xlabel=x_label, ylabel=y_label)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title)
    return fig


def _as_figure(obj: Any) -> Figure:
    """``obj`` if it is a Figure, else its ``.figure`` or ``.fig`` (e.g. a seaborn grid)."""
    if isinstance(obj, Figure):
        return obj
    for attr in ("figure", "fig"):
        fig = getattr(obj, attr, None)
        if isinstance(fig, Figure):
            return fig
    raise TypeError(f"expected a matplotlib Figure or an object with .figure/.fig, got {type(obj).__name__}")


def save_figure(fig: Any, path: str | Path, formats: Sequence[str] = ("png",), dpi: int = 200) -> list[Path]:
    """Save ``fig`` (a Figure, or anything with ``.figure``/``.fig``, e.g. a ClusterGrid) as
    ``path`` plus each suffix in ``formats`` (png, pdf, svg); close it; return the files.

    A suffix already on ``path`` that is one of the formats is replaced, not doubled. PDF
    text is embedded as TrueType and SVG text stays text, so both remain editable. Each file
    is written to a temporary file beside it and renamed into place
    (:func:`site_interp.artifacts.write_atomic`), so an interrupted save leaves no partial file.
    """
    figure = _as_figure(fig)
    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise ValueError(f"unknown figure format {bad[0]!r}; use {FORMATS}")
    path = Path(path)
    if path.suffix.lstrip(".") in FORMATS:
        path = path.with_suffix("")
    out = []
    with plt.rc_context({"pdf.fonttype": 42, "svg.fonttype": "none"}):
        for fmt in formats:
            target = path.parent / f"{path.name}.{fmt}"
            # The temporary name ends in .tmp, so the format is given explicitly.
            write_atomic(target, functools.partial(figure.savefig, format=fmt, dpi=dpi, bbox_inches="tight"))
            out.append(target)
    plt.close(figure)
    return out
