"""The explorer as one self-contained HTML file, for people who do not run Python.

:func:`export_html` writes the tasks x heads grid (dendrogram, threshold slider) and
precomputed cards of the top heads (largest alpha in any task): alpha across tasks, direct
logit attribution per task, attention on a sample prompt of every task, and the patch / removal
effects on the selected task (or on every task, or none: :class:`ExportConfig`). plotly.js is
inlined, so the page opens from disk without a network; clicking a grid cell shows that head's
card (plain JavaScript in :mod:`site_interp.explorer.page`).
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import plotly.offline
from tqdm.auto import tqdm

from site_interp.artifacts import write_text
from site_interp.errors import ConfigError, UserError
from site_interp.explorer.cards import CardConfig
from site_interp.explorer.data import head_label
from site_interp.explorer.figures import grid_figure
from site_interp.explorer.page import render_page
from site_interp.explorer.session import ExplorerSession

EffectTasks = Literal["selected", "all", "none"]
"""Tasks whose patch / removal effects are precomputed: the selected task, every task, none."""

DLA_NOTE = ("t[l, h] through W_O[l, h] (and, on Gemma, the post-attention norm linearised at the layer's mean output), "
            "the final norm's gain (its 1/RMS factor dropped: no change of ranking) and W_U; logits in those units.")


@dataclass(frozen=True)
class ExportConfig:
    """What the exported page contains."""

    top_heads: int = 12
    """Heads with precomputed cards: the largest alpha in any task first."""
    threshold: float = 0.5
    """Initial threshold of the outline (the page's slider moves it)."""
    effects: EffectTasks = "selected"
    """Tasks whose patch / removal effects are precomputed for the top heads."""
    selected_task: str | None = None
    """The card's initial task (None: the first task of the grid)."""
    card: CardConfig = field(default_factory=CardConfig)
    """How the measured card parts are computed."""
    title: str | None = None
    """Page title (None: the model and run directory)."""

    def __post_init__(self) -> None:
        if self.top_heads < 0:
            raise ConfigError(f"ExportConfig.top_heads must be >= 0, got {self.top_heads}")
        if not 0.0 <= self.threshold <= 1.0:
            raise ConfigError(f"ExportConfig.threshold must be in [0, 1], got {self.threshold}")
        if self.effects not in ("selected", "all", "none"):
            raise ConfigError(f"ExportConfig.effects must be 'selected', 'all' or 'none', got {self.effects!r}")


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(float(x)) else None


def page_data(session: ExplorerSession, config: ExportConfig, *, progress: bool = True) -> dict:
    """Everything the page's script reads: grid values, cards of the top heads, attention, transfer."""
    data = session.data
    selected = config.selected_task or data.tasks[0]
    data.index(selected)
    heads = data.top_heads(config.top_heads)
    cards: dict[str, dict] = {label: {"layer": layer, "head": head} for label, (layer, head) in
                              ((head_label(*lh), lh) for lh in heads)}
    attention: dict[str, dict] = {}
    effect_tasks: list[str] = []
    notes: list[str] = []
    if heads and session.has_model:
        for layer, head in tqdm(heads, desc="card: what it writes", disable=not progress, leave=False):
            table = session.dla(layer, head)
            cards[head_label(layer, head)]["dla"] = {
                task: {d: [[tok, round(v, 3)] for tok, v in zip(g["token"], g["logit"])]
                       for d, g in part.groupby("direction")}
                for task, part in table.groupby("task", sort=False)
            }
        for task in tqdm(data.tasks, desc="card: where it looks", disable=not progress, leave=False):
            try:
                sample = session.attention(task)
            except UserError as err:  # the task's data could not be found: no prompt to show
                notes.append(str(err))
                continue
            attention[task] = {"tokens": sample.tokens, "roles": sample.roles, "text": sample.text,
                               "heads": {head_label(l, h): [round(float(v), 4) for v in sample.head(l, h)] for l, h in heads}}
        todo = {"selected": [selected], "all": list(data.tasks), "none": []}[config.effects]
        for task in tqdm(todo, desc="card: what it does", disable=not progress, leave=False):
            try:
                effects = session.effects(task, heads)
            except UserError as err:
                notes.append(str(err))
                continue
            effect_tasks.append(task)
            for (layer, head), df in effects.items():
                cards[head_label(layer, head)].setdefault("effects", {})[task] = [
                    {"condition": r["condition"], "accuracy": float(r["accuracy"]),
                     "answer_logprob": float(r["answer_logprob"]), "n": int(r["n"])} for r in df.to_dict(orient="records")
                ]
    elif heads:
        notes.append("no model: cards hold the alphas only")
    transfer = None
    if data.transfer is not None:
        transfer = {str(a): {str(b): _finite(v) for b, v in row.items()} for a, row in data.transfer.iterrows()}
    return {
        "model_id": data.model_id, "run_dir": str(data.run_dir), "tasks": data.tasks,
        "n_layers": data.n_layers, "n_heads": data.n_heads, "threshold": config.threshold,
        "alphas": [[round(float(v), 4) for v in row] for row in data.alphas.reshape(len(data.tasks), -1)],
        "top_heads": [list(h) for h in heads], "cards": cards, "attention": attention, "effect_tasks": effect_tasks,
        "card_task": selected, "transfer": transfer, "n_shots": session.config.n_shots, "dla_note": DLA_NOTE,
        "accuracy": {t: data.accuracy(t) for t in data.tasks}, "notes": notes,
    }


def export_html(session: ExplorerSession, path: str | Path, config: ExportConfig = ExportConfig(), *,
                progress: bool = True) -> Path:
    """Write the explorer page of ``session``'s run to ``path`` (atomically); returns the path."""
    data = session.data
    payload = page_data(session, config, progress=progress)
    fig = grid_figure(data, config.threshold)
    title = config.title or f"SITE head explorer: {data.model_id}"
    meta = (f"run <code>{html.escape(str(data.run_dir))}</code>; {len(data.tasks)} tasks, {data.n_layers} layers x "
            f"{data.n_heads} heads; tasks ordered by clustering ({data.clustering_source}, dendrogram on the left)")
    if payload["notes"]:
        meta += "<br>" + "<br>".join(html.escape(n) for n in payload["notes"])
    page = render_page(title=title, meta=meta, plotly_js=plotly.offline.get_plotlyjs(), grid_json=fig.to_json(),
                       data=payload, threshold=config.threshold)
    return write_text(Path(path), page)


__all__ = ["DLA_NOTE", "EffectTasks", "ExportConfig", "export_html", "page_data"]
