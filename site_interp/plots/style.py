"""What the static (matplotlib) and interactive (plotly) figures share.

One table gives each known head selection a colour, an abstract dash kind and a marker kind;
:data:`MPL_LINESTYLES` and :data:`PLOTLY_DASHES` translate the dash kind into each library's
own name, so a selection looks the same in a paper figure and in a notebook. The palettes for
unknown selections and reference methods, the task reordering of square matrices, the k tick
labels and the tensor-to-array conversion live here too.

This module imports neither matplotlib nor plotly.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Literal, NamedTuple, Sequence

import numpy as np
import pandas as pd

Dash = Literal["solid", "dashed", "dotted", "dashdot"]
"""Library-neutral line dash; see :data:`MPL_LINESTYLES` and :data:`PLOTLY_DASHES`."""
Marker = Literal["circle", "square", "triangle-up", "triangle-down", "diamond"]
"""Library-neutral marker shape; see :data:`MPL_MARKERS`."""

MPL_LINESTYLES: dict[str, str] = {"solid": "-", "dashed": "--", "dotted": ":", "dashdot": "-."}
"""Dash kind -> matplotlib ``linestyle``."""
PLOTLY_DASHES: dict[str, str] = {"solid": "solid", "dashed": "dash", "dotted": "dot", "dashdot": "dashdot"}
"""Dash kind -> plotly ``line.dash``."""
MPL_MARKERS: dict[str, str] = {"circle": "o", "square": "s", "triangle-up": "^", "triangle-down": "v", "diamond": "D"}
"""Marker kind -> matplotlib ``marker`` (the kinds are already plotly symbol names)."""


class SelectionStyle(NamedTuple):
    """How one head selection is drawn, independent of the plotting library."""

    color: str
    dash: Dash
    marker: Marker


SELECTIONS: dict[str, SelectionStyle] = {
    "top": SelectionStyle("#08519c", "solid", "circle"),
    "bottom": SelectionStyle("#8fa3bf", "solid", "square"),
    "random": SelectionStyle("#404040", "dashed", "triangle-up"),
    "ablate_top": SelectionStyle("#d62728", "dotted", "triangle-down"),
}
"""The known head selections: the same colour, dash and marker in every figure."""
EXTRA_COLORS = ("#1b9e77", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d")
"""Colours given, in order of appearance, to selections not in :data:`SELECTIONS`."""
EXTRA_DASH: Dash = "dashdot"
EXTRA_MARKER: Marker = "diamond"
REFERENCE_COLORS = ("#7f7f7f", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")
"""Colours of the reference methods (horizontal lines), in order of appearance."""
BAND_ALPHA = 0.18
"""Opacity of the 95% interval band drawn around a selection's curve."""


def selection_styles(selections: Iterable[Hashable]) -> dict[Hashable, SelectionStyle]:
    """Style of each distinct selection in ``selections``, in drawing (and legend) order.

    The known selections come first, in the order of :data:`SELECTIONS`; the others follow
    in order of first appearance, coloured from :data:`EXTRA_COLORS` (cycled) with a
    dash-dot line and a diamond marker.
    """
    seen = list(dict.fromkeys(selections))
    present = set(seen)
    out: dict[Hashable, SelectionStyle] = {name: s for name, s in SELECTIONS.items() if name in present}
    others = [s for s in seen if s not in SELECTIONS]
    for i, name in enumerate(others):
        out[name] = SelectionStyle(EXTRA_COLORS[i % len(EXTRA_COLORS)], EXTRA_DASH, EXTRA_MARKER)
    return out


def reference_colors(methods: Iterable[Hashable]) -> dict[Hashable, str]:
    """A colour per distinct reference method, from :data:`REFERENCE_COLORS` in order of first
    appearance, so a method keeps its colour in every panel."""
    names = dict.fromkeys(methods)
    return {m: REFERENCE_COLORS[i % len(REFERENCE_COLORS)] for i, m in enumerate(names)}


def to_numpy(x: Any) -> np.ndarray:
    """A float array from a tensor (detached, on the CPU) or anything array-like."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor, without importing torch here
        return x.detach().cpu().float().numpy()
    return np.asarray(x, dtype=float)


def format_k(k: float) -> str:
    """Tick label of a head count: ``4`` rather than ``4.0``, ``1.5`` as is."""
    return str(int(k)) if float(k).is_integer() else f"{k:g}"


def require_columns(df: pd.DataFrame, columns: Sequence[str], what: str) -> None:
    """Raise ValueError naming the columns of ``columns`` that ``df`` lacks."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} lacks columns {missing}; has {list(df.columns)}")


def reorder_tasks(m: pd.DataFrame, order: Sequence[str] | None) -> pd.DataFrame:
    """Rows and columns of ``m`` in ``order`` first (names not in ``m`` skipped), the rest after."""
    if order is None:
        return m
    seen = set(order)
    rows = [o for o in order if o in m.index] + [r for r in m.index if r not in seen]
    cols = [o for o in order if o in m.columns] + [c for c in m.columns if c not in seen]
    return m.loc[rows, cols]


__all__ = [
    "BAND_ALPHA",
    "EXTRA_COLORS",
    "MPL_LINESTYLES",
    "MPL_MARKERS",
    "PLOTLY_DASHES",
    "REFERENCE_COLORS",
    "SELECTIONS",
    "SelectionStyle",
    "format_k",
    "reference_colors",
    "reorder_tasks",
    "require_columns",
    "selection_styles",
    "to_numpy",
]
