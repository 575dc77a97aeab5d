"""The explorer's figures with matplotlib: for notebooks without widgets and for code hosts.

A code host renders a notebook's PNG outputs but neither widgets nor plotly, so the explorer
also draws its grid (with the dendrogram and the threshold outline) and a head card (its four
parts in one figure) as matplotlib figures. Returned figures are closed in pyplot, as in
:mod:`site_interp.plots.static`; a notebook displays the returned figure once.
"""

from __future__ import annotations

import os
import sys

import matplotlib

if "matplotlib.pyplot" not in sys.modules and not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from scipy.cluster.hierarchy import dendrogram  # noqa: E402

from site_interp.explorer.cards import HeadCard  # noqa: E402
from site_interp.explorer.data import RunData, head_label  # noqa: E402
from site_interp.explorer.figures import CONDITION_COLORS, OUTLINE_COLOR, SELECTED_COLOR, role_color  # noqa: E402


def printable(token: str, limit: int = 12) -> str:
    """A token as matplotlib's default fonts can draw it: whitespace and control characters as
    escapes, characters beyond the Latin scripts as ``\\uXXXX``."""
    text = repr(token)[1:-1]
    return "".join(c if ord(c) < 0x250 else f"\\u{ord(c):04x}" for c in text)[:limit]


def grid_static(data: RunData, threshold: float = 0.5, selected: tuple[int, int] | None = None) -> Figure:
    """Tasks x heads alphas (dendrogram on the left, heads above ``threshold`` outlined)."""
    n, cols = len(data.tasks), data.n_layers * data.n_heads
    z = data.alphas.reshape(n, cols).numpy()
    fig, (ax_d, ax) = plt.subplots(1, 2, figsize=(min(16, 4 + cols * 0.12), 1.4 + 0.32 * n),
                                   gridspec_kw={"width_ratios": [1, 8], "wspace": 0.01}, sharey=True)
    if len(data.labels) > 1:
        d = dendrogram(data.linkage, labels=data.labels, no_plot=True)
        for ic, dc in zip(d["icoord"], d["dcoord"]):
            ax_d.plot(dc, [(y - 5.0) / 10.0 for y in ic], color="#444", lw=0.8)
        ax_d.invert_xaxis()
    ax_d.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax_d.spines[side].set_visible(False)
    ax_d.set_yticks(range(n), data.tasks, fontsize=8)
    im = ax.imshow(z, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    for row, col in np.argwhere(z > threshold):
        ax.add_patch(Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, ec=OUTLINE_COLOR, lw=0.8))
    if selected is not None:
        c = selected[0] * data.n_heads + selected[1]
        ax.add_patch(Rectangle((c - 0.5, -0.5), 1, n, fill=False, ec=SELECTED_COLOR, lw=2))
    for layer in range(1, data.n_layers):
        ax.axvline(layer * data.n_heads - 0.5, color="white", lw=1)
    ax.set_xticks([layer * data.n_heads + (data.n_heads - 1) / 2 for layer in range(data.n_layers)],
                  [f"L{layer}" for layer in range(data.n_layers)], fontsize=7)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("head (by layer)")
    ax.tick_params(axis="y", left=False)
    fig.colorbar(im, ax=ax, fraction=0.03, pad=0.01, label="alpha")
    fig.suptitle(f"{data.model_id}: alpha per task and head (outlined: alpha > {threshold:g})", fontsize=10, x=0.02, ha="left")
    plt.close(fig)
    return fig


def card_static(card: HeadCard) -> Figure:
    """A head card's four parts in one figure: alpha across tasks, what it writes (on the card's
    task and its neighbours), where it looks, what it does."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 7.5))
    (ax_a, ax_w), (ax_l, ax_e) = axes
    name = head_label(card.layer, card.head)
    tasks, values = list(card.alphas.index), card.alphas.to_numpy()
    ax_a.bar(range(len(tasks)), values, color=[OUTLINE_COLOR if v > card.threshold else "#08519c" for v in values])
    ax_a.axhline(card.threshold, ls=":", color="#888")
    ax_a.set_xticks(range(len(tasks)), tasks, rotation=40, ha="right", fontsize=7)
    ax_a.set_ylim(0, 1.02)
    ax_a.set_title(f"{name}: alpha across tasks", fontsize=9, loc="left")
    ax_w.axis("off")
    ax_w.set_title("what it writes: top promoted / suppressed tokens (DLA)", fontsize=9, loc="left")
    if card.dla is not None:
        lines = []
        show = [card.task] + [t for t in tasks if t != card.task][:5]
        for task in show:
            part = card.dla[card.dla["task"] == task]
            up = " ".join(printable(t) for t in part[part["direction"] == "promoted"]["token"].head(6))
            down = " ".join(printable(t) for t in part[part["direction"] == "suppressed"]["token"].head(6))
            lines += [f"{task}:", f"  + {up}", f"  - {down}"]
        ax_w.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=7.5, transform=ax_w.transAxes)
    else:
        ax_w.text(0, 0.5, card.note("dla"), fontsize=8, wrap=True)
    if card.attention is not None:
        w = card.attention.head(card.layer, card.head).numpy()
        ax_l.bar(range(len(w)), w, color=[role_color(r) for r in card.attention.roles])
        labels = [printable(t, 6) for t in card.attention.tokens]
        step = max(1, len(labels) // 60)
        ax_l.set_xticks(range(0, len(labels), step), labels[::step], rotation=90, fontsize=6)
        ax_l.set_title(f"where it looks: attention at the last token ({card.task})", fontsize=9, loc="left")
    else:
        ax_l.axis("off")
        ax_l.text(0, 0.5, card.note("attention"), fontsize=8, wrap=True)
    if card.effects is not None:
        e = card.effects
        ax_e.bar(range(len(e)), e["accuracy"], color=[CONDITION_COLORS.get(c, "#888") for c in e["condition"]])
        for i, (acc, lp) in enumerate(zip(e["accuracy"], e["answer_logprob"])):
            ax_e.text(i, acc + 1, f"{acc:.0f}%\nlog p {lp:.2f}", ha="center", va="bottom", fontsize=7)
        ax_e.set_xticks(range(len(e)), list(e["condition"]), fontsize=7)
        ax_e.set_ylim(0, 118)
        ax_e.set_ylabel("accuracy (%)")
        ax_e.set_title(f"what it does on {card.task} ({int(e['n'].iloc[0])} test queries)", fontsize=9, loc="left")
    else:
        ax_e.axis("off")
        ax_e.text(0, 0.5, card.note("effects"), fontsize=8, wrap=True)
    fig.suptitle(f"Head {name} (layer {card.layer}, head {card.head})", fontsize=11, x=0.02, ha="left")
    fig.tight_layout()
    plt.close(fig)
    return fig


__all__ = ["card_static", "grid_static", "printable"]
