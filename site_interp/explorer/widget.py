"""The head explorer in Jupyter: :func:`explore` on one or more finished runs.

The widget (ipywidgets, with plotly ``FigureWidget`` through anywidget) shows the tasks x heads
grid with its dendrogram, a threshold slider that outlines the heads above it, dropdowns for run
and model, and the card of the clicked head: alpha across tasks, what it writes (direct logit
attribution per task), where it looks (attention on a sample prompt of the selected task), what
it does (accuracy with only this head patched and with it removed from SITE, computed on demand
and cached). Below it, two tasks side by side. The same cards are available without widgets
(:meth:`HeadExplorer.card`, :meth:`HeadExplorer.card_static`); where ipywidgets or anywidget are missing,
displaying the explorer shows static figures and says how to get the widget.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd
import plotly.graph_objects as go

from site_interp.errors import ConfigError, UserError
from site_interp.explorer import figures as F
from site_interp.explorer.cards import CardConfig, HeadCard
from site_interp.explorer.data import RunData, find_runs, head_label, load_run_data
from site_interp.explorer.session import ExplorerSession, load_run_model
from site_interp.pipeline import model_id
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from transformer_lens.model_bridge import TransformerBridge

INSTALL_HINT = "pip install 'site_interp[explorer]' (ipywidgets and anywidget), then restart the kernel"


def widgets_available() -> str | None:
    """None when ipywidgets and plotly's FigureWidget (anywidget) work here, else why not."""
    try:
        import anywidget  # noqa: F401
        import ipywidgets  # noqa: F401

        go.FigureWidget()
    except Exception as err:  # ImportError, or plotly refusing FigureWidget without anywidget
        return f"{type(err).__name__}: {err}"
    return None


class HeadExplorer:
    """Runs, their grid, and head cards; a widget where ipywidgets work (see the module doc)."""

    def __init__(
        self,
        roots: str | Path | Sequence[str | Path],
        bridge: TransformerBridge | None = None,
        *,
        tasks: Sequence[Task] = (),
        data_dir: str | Path | None = None,
        config: CardConfig = CardConfig(),
        threshold: float = 0.5,
        cache_dir: str | Path | None = None,
        load_models: bool = True,
        widgets: bool | None = None,
    ):
        if not 0.0 <= threshold <= 1.0:
            raise ConfigError(f"threshold must be in [0, 1], got {threshold}")
        self.runs = find_runs(roots)
        self.config, self.threshold = config, threshold
        self._tasks, self._data_dir, self._cache_dir = list(tasks), data_dir, cache_dir
        self._load = load_models
        self._bridges: dict[str, TransformerBridge] = {}
        if bridge is not None:
            self._bridges[model_id(bridge)] = bridge
        self.selected: tuple[int, int] | None = None
        self.problem = widgets_available() if widgets in (None, True) else "widgets=False"
        if widgets and self.problem:
            raise UserError(f"the explorer widget needs ipywidgets and anywidget ({self.problem}); {INSTALL_HINT}")
        run = next(iter(self.runs))
        self.session = self._open(run, next(iter(self.runs[run])))
        self.card_task = self.data.tasks[0]
        self.widget = self._build() if self.problem is None else None

    # ------------------------------------------------------------------ data

    @property
    def data(self) -> RunData:
        return self.session.data

    def _open(self, run: str, model: str) -> ExplorerSession:
        data = load_run_data(self.runs[run][model])
        session = ExplorerSession(data, self._bridges.get(data.model_id), tasks=self._tasks, data_dir=self._data_dir,
                                  config=self.config, cache_dir=self._cache_dir,
                                  loader=self._load_model if self._load else None)
        self.run_label, self.model_label = run, model
        return session

    def _load_model(self, data: RunData) -> TransformerBridge:
        """The run's model, loaded once per model id for all runs."""
        if data.model_id not in self._bridges:
            self._bridges[data.model_id] = load_run_model(data)
        return self._bridges[data.model_id]

    def select_run(self, run: str, model: str | None = None) -> None:
        """Show another run (and model folder in it)."""
        model = model or next(iter(self.runs[run]))
        self.session = self._open(run, model)
        self.card_task = self.card_task if self.card_task in self.data.tasks else self.data.tasks[0]
        self.selected = None
        if self.widget is not None:
            self._refresh_run()

    def card(self, layer: int, head: int, task: str | None = None, *, effects: bool = True) -> HeadCard:
        """The card of ``(layer, head)``; ``task`` (default: the selected one) is the task of the
        attention sample and the effects. A part that cannot be computed says why in ``errors``."""
        task = task or self.card_task
        self.data.index(task)
        card = HeadCard(layer, head, task, pd.Series(self.data.head_alphas(layer, head).numpy(), index=self.data.tasks),
                        self.threshold)
        parts = [("dla", lambda: self.session.dla(layer, head)), ("attention", lambda: self.session.attention(task))]
        if effects:
            parts.append(("effects", lambda: self.session.effects(task, [(layer, head)])[(layer, head)]))
        for name, compute in parts:
            try:
                setattr(card, name, compute())
            except UserError as err:
                card.errors[name] = str(err)
        return card

    def grid(self) -> go.Figure:
        """The grid as a plotly figure."""
        return F.grid_figure(self.data, self.threshold, self.selected)

    def card_static(self, layer: int, head: int, task: str | None = None) -> Figure:
        """The card of ``(layer, head)`` as one matplotlib figure (renders on code hosts)."""
        from site_interp.explorer.static import card_static

        return card_static(self.card(layer, head, task))

    def grid_static(self) -> Figure:
        """The grid as a matplotlib figure (renders on code hosts)."""
        from site_interp.explorer.static import grid_static

        return grid_static(self.data, self.threshold, self.selected)

    def compare(self, a: str, b: str) -> go.Figure:
        """Two tasks side by side: alphas, heads above the threshold in both, transfer entry."""
        return F.compare_figure(self.data, a, b, self.threshold)

    # ------------------------------------------------------------------ widget

    def select_head(self, layer: int, head: int, task: str | None = None) -> HeadCard:
        """Select a head (as a click on the grid does) and show its card; returns the card."""
        if not (0 <= layer < self.data.n_layers and 0 <= head < self.data.n_heads):
            raise UserError(f"no head L{layer}H{head}: the model has {self.data.n_layers} layers x {self.data.n_heads} heads")
        self.selected = (layer, head)
        if task is not None:
            self.card_task = task
        if self.widget is not None:
            self._status(f"computing the card of {head_label(layer, head)} on {self.card_task}...")
        card = self.card(layer, head)
        if self.widget is not None:
            self._show_card(card)
        return card

    def _build(self) -> Any:
        import ipywidgets as W

        self._w_run = W.Dropdown(options=list(self.runs), value=self.run_label, description="run")
        self._w_model = W.Dropdown(options=list(self.runs[self.run_label]), value=self.model_label, description="model")
        self._w_thr = W.FloatSlider(value=self.threshold, min=0.0, max=1.0, step=0.01, description="threshold",
                                    continuous_update=False)
        self._w_task = W.Dropdown(options=self.data.tasks, value=self.card_task, description="card task")
        self._w_grid = go.FigureWidget(self.grid())
        self._w_grid.data[0].on_click(self._on_click)
        self._w_status = W.HTML()
        self._w_title = W.HTML("<i>Click a cell of the grid to open its head's card.</i>")
        self._w_alpha, self._w_attn, self._w_eff = go.FigureWidget(), go.FigureWidget(), go.FigureWidget()
        self._w_dla = W.HTML()
        self._w_a = W.Dropdown(options=self.data.tasks, value=self.data.tasks[0], description="task A")
        self._w_b = W.Dropdown(options=self.data.tasks, value=self.data.tasks[min(1, len(self.data.tasks) - 1)],
                               description="task B")
        self._w_cmp, self._w_cmp_text = go.FigureWidget(), W.HTML()
        self._w_run.observe(lambda ch: self._on_run(ch["new"], None), names="value")
        self._w_model.observe(lambda ch: self._on_run(self._w_run.value, ch["new"]), names="value")
        self._w_thr.observe(self._on_threshold, names="value")
        self._w_task.observe(self._on_task, names="value")
        for w in (self._w_a, self._w_b):
            w.observe(lambda ch: self._update_compare(), names="value")
        self._update_compare()
        card = W.VBox([self._w_title, W.HBox([self._w_alpha, W.VBox([W.HTML("<b>What it writes</b>"), self._w_dla])]),
                       W.HBox([self._w_attn, self._w_eff])])
        return W.VBox([
            W.HBox([self._w_run, self._w_model]), W.HBox([self._w_thr, self._w_task]), self._w_grid, self._w_status,
            card, W.HTML("<h3>Compare two tasks</h3>"), W.HBox([self._w_a, self._w_b]), self._w_cmp_text, self._w_cmp,
        ])

    def _status(self, text: str) -> None:
        self._w_status.value = f"<span style='color:#666'>{html.escape(text)}</span>"

    @staticmethod
    def _set(fw: go.FigureWidget, fig: go.Figure) -> None:
        with fw.batch_update():
            fw.data = ()
            fw.add_traces(list(fig.data))
            fw.layout = fig.layout

    def _on_click(self, trace: Any, points: Any, selector: Any) -> None:
        if not points.xs:
            return
        col, row = int(round(points.xs[0])), int(round(points.ys[0]))
        task = self.data.tasks[row]
        self.selected = divmod(col, self.data.n_heads)
        if task != self._w_task.value:
            self._w_task.value = task  # _on_task shows the selected head's card on that task
        else:
            self.select_head(*self.selected)

    def _on_run(self, run: str, model: str | None) -> None:
        if getattr(self, "_switching", False):  # options being replaced by select_run itself
            return
        self._switching = True
        try:
            self.select_run(run, model)
        finally:
            self._switching = False

    def _refresh_run(self) -> None:
        before, self._switching = getattr(self, "_switching", False), True
        try:
            self._w_run.value = self.run_label
            self._w_model.options = list(self.runs[self.run_label])
            self._w_model.value = self.model_label
        finally:
            self._switching = before
        self._w_task.options = self.data.tasks
        self._w_task.value = self.card_task
        self._w_a.options, self._w_b.options = self.data.tasks, self.data.tasks
        self._set(self._w_grid, self.grid())
        self._w_grid.data[0].on_click(self._on_click)
        self._update_compare()

    def _on_threshold(self, change: dict) -> None:
        self.threshold = float(change["new"])
        xs, ys = F.outline_path(self.data.alphas.reshape(len(self.data.tasks), -1).numpy(), self.threshold)
        with self._w_grid.batch_update():
            self._w_grid.data[1].x, self._w_grid.data[1].y = xs, ys
            self._w_grid.layout.title.text = f"{self.data.model_id}: alpha per task and head (outlined: alpha > {self.threshold:g})"
        self._update_compare()

    def _on_task(self, change: dict) -> None:
        self.card_task = change["new"]
        if self.selected is not None and change["old"] != change["new"]:
            self.select_head(*self.selected)

    def _show_card(self, card: HeadCard) -> None:
        sx, sy = F._selected_path((card.layer, card.head), self.data)
        with self._w_grid.batch_update():
            self._w_grid.data[2].x, self._w_grid.data[2].y = sx, sy
        self._w_title.value = (f"<h3>Head {head_label(card.layer, card.head)} <small>(layer {card.layer}, head {card.head};"
                               f" task {html.escape(card.task)})</small></h3>")
        self._set(self._w_alpha, F.alpha_bar_figure(self.data, card.layer, card.head, self.threshold))
        self._w_dla.value = F.dla_html(card.dla) if card.dla is not None else html.escape(card.note("dla"))
        self._set(self._w_attn, F.attention_figure(card.attention, card.layer, card.head) if card.attention is not None
                  else _message(card.note("attention")))
        self._set(self._w_eff, F.effects_figure(card.effects) if card.effects is not None else _message(card.note("effects")))
        self._status(f"{head_label(card.layer, card.head)}: card ready" + (f" ({'; '.join(card.errors.values())})" if card.errors else ""))

    def _update_compare(self) -> None:
        a, b = self._w_a.value, self._w_b.value
        self._set(self._w_cmp, self.compare(a, b))
        shared = ", ".join(head_label(*h) for h in F.shared_heads(self.data, a, b, self.threshold)) or "none"
        entry = F.transfer_entry(self.data, a, b) or "no transfer entry (run python -m site_interp.patch for study/transfer.csv)"
        self._w_cmp_text.value = f"shared heads (alpha > {self.threshold:g} in both): {shared}<br>{html.escape(entry)}"

    def _ipython_display_(self) -> None:
        from IPython.display import Markdown, display

        if self.widget is not None:
            display(self.widget)
            return
        display(Markdown(f"**Interactive explorer unavailable** ({self.problem}); showing static figures. To get it: `{INSTALL_HINT}`."))
        display(self.grid_static())
        if self.selected is not None:
            display(self.card_static(*self.selected))


def _message(text: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=html.escape(text)[:200], showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=200, xaxis={"visible": False}, yaxis={"visible": False}, template="simple_white")
    return fig


def explore(
    roots: str | Path | Sequence[str | Path],
    bridge: TransformerBridge | None = None,
    **kwargs: Any,
) -> HeadExplorer:
    """The head explorer on finished runs: ``roots`` are output folders (``runs/``) or run
    directories (``runs/<model>``). ``bridge`` is the model (loaded on first need otherwise);
    other keywords go to :class:`HeadExplorer` (``tasks``, ``data_dir``, ``config``, ``threshold``,
    ``cache_dir``, ``load_models``, ``widgets``). Display the result in a notebook."""
    return HeadExplorer(roots, bridge, **kwargs)


__all__ = ["HeadCard", "HeadExplorer", "INSTALL_HINT", "explore", "widgets_available"]
