"""One explorer session: a run's data, the model it was trained on, and every card part on demand.

:class:`ExplorerSession` is what the widget and the HTML export share. It holds the
:class:`~site_interp.explorer.data.RunData`, a bridge of the run's model (given, or loaded on
first need with :func:`load_run_model`), the tasks' data (found with
:func:`~site_interp.explorer.data.resolve_task`), and caches: direct logit attribution per head
in memory, attention samples and head effects on disk under ``<run_dir>/<task>/explorer/``
(``cache_dir`` moves them), keyed like every other artifact.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pandas as pd

from site_interp.errors import UserError
from site_interp.explorer.cards import (
    AttentionSample,
    CardConfig,
    EffectScorer,
    cached_attention,
    direct_logit_attribution,
    head_effects,
)
from site_interp.explorer.data import RunData, resolve_task, task_folder
from site_interp.loading import EMBEDDED_MODELS, load_model, split_precision
from site_interp.pipeline import model_id
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


class ModelMismatchError(UserError):
    """The bridge given to the explorer is not the model the run was trained on."""


def model_name_for(run_model_id: str) -> str:
    """What :func:`~site_interp.loading.load_model` needs to load ``run_model_id`` again: the
    embedded model's short name when it is one (``google/gemma-3-270m`` -> ``gemma-3-270m``),
    else the id itself (a local directory, or a hub id), without its precision tag."""
    base = split_precision(run_model_id)[0]
    for name, spec in EMBEDDED_MODELS.items():
        if spec.hf_id == base:
            return name
    return base


def load_run_model(data: RunData) -> TransformerBridge:
    """Load the model ``data`` was trained on, in its precision (see :func:`model_name_for`)."""
    _, dtype, four = split_precision(data.model_id)
    return load_model(model_name_for(data.model_id), dtype=dtype, load_in_4bit=four)


class ExplorerSession:
    """A run and the model behind it; computes card parts on demand and caches them."""

    def __init__(
        self,
        data: RunData,
        bridge: TransformerBridge | None = None,
        *,
        tasks: Sequence[Task] = (),
        data_dir: str | Path | None = None,
        config: CardConfig = CardConfig(),
        cache_dir: str | Path | None = None,
        loader: Callable[[RunData], TransformerBridge] | None = load_run_model,
    ):
        self.data = data
        self.config = config
        self.known = list(tasks)
        self.data_dir = data_dir
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.loader = loader
        self._bridge = None
        if bridge is not None:
            self.bridge = bridge
        self._dla: dict[tuple[int, int], pd.DataFrame] = {}
        self._tasks: dict[str, Task] = {}
        self._scorers: dict[str, EffectScorer] = {}

    @property
    def bridge(self) -> TransformerBridge:
        """The run's model; loaded on first use when none was given (and a loader is set)."""
        if self._bridge is None:
            if self.loader is None:
                raise UserError(f"no model for {self.data.model_id}: pass bridge= to the explorer to compute this part")
            self.bridge = self.loader(self.data)
        return self._bridge

    @bridge.setter
    def bridge(self, bridge: TransformerBridge) -> None:
        got = model_id(bridge)
        if got != self.data.model_id:
            raise ModelMismatchError(
                f"{self.data.run_dir} was trained on {self.data.model_id}, but the bridge is {got}; "
                f"pass a bridge of {self.data.model_id} (load_model({model_name_for(self.data.model_id)!r}))"
            )
        self._bridge = bridge

    @property
    def has_model(self) -> bool:
        """Whether a model is at hand or can be loaded."""
        return self._bridge is not None or self.loader is not None

    def task(self, name: str) -> Task:
        if name not in self._tasks:
            self._tasks[name] = resolve_task(self.data, name, known=self.known, data_dir=self.data_dir)
        return self._tasks[name]

    def cache_for(self, task: str) -> Path:
        """Where the cached card parts of ``task`` go."""
        if self.cache_dir is not None:
            return self.cache_dir / task
        return self.data.run_dir / task_folder(self.data.run_dir, task) / "explorer"

    def dla(self, layer: int, head: int) -> pd.DataFrame:
        """Top promoted / suppressed tokens of the head, every task
        (:func:`~site_interp.explorer.cards.direct_logit_attribution`)."""
        if (layer, head) not in self._dla:
            embeddings = {t: self.data.embedding(t) for t in self.data.tasks}
            self._dla[(layer, head)] = direct_logit_attribution(self.bridge, embeddings, layer, head, self.config.top_tokens)
        return self._dla[(layer, head)]

    def attention(self, task: str) -> AttentionSample:
        """Every head's attention at the last token of a sample prompt of ``task`` (cached on disk)."""
        return cached_attention(self.bridge, self.task(task), self.config, self.cache_for(task))

    def effects(self, task: str, heads: Sequence[tuple[int, int]], *, progress: bool = False) -> dict[tuple[int, int], pd.DataFrame]:
        """Patch / removal effects of ``heads`` on ``task`` (cached on disk per head)."""
        if task not in self._scorers:
            self._scorers[task] = EffectScorer(self.bridge, self.task(task), self.data.embedding(task),
                                               self.data.alpha(task), self.config)
        return head_effects(self._scorers[task], heads, self.cache_for(task), progress=progress)


__all__ = ["ExplorerSession", "ModelMismatchError", "load_run_model", "model_name_for"]
