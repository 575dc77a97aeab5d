"""What the explorer reads from a finished run directory, and nothing it has to recompute.

A run directory is ``<out>/<model>/`` of ``python -m site_interp.run`` or ``patch``: one folder per
task with ``alphas.safetensors`` (and its JSON sidecar, whose ``key`` names the model and the task
data), ``embedding.safetensors`` (``t``, ``resid``) and, for evaluated runs, ``config.json`` and
``summary.csv``; after ``python -m site_interp.patch`` also ``study/clustering.json`` (task order
and linkage) and ``study/transfer.csv``. :func:`load_run_data` reads all of it into a
:class:`RunData`; when the run has no clustering, the tasks are clustered here by head overlap
(:func:`~site_interp.studies.similarity.cluster_tasks`), as the study does. :func:`find_runs`
lists the run directories under one or more output folders (the explorer's model and run menus),
and :func:`resolve_task` finds a task's data again (for prompts), checked against its fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from safetensors.torch import load_file
from scipy.cluster.hierarchy import leaves_list
from torch import Tensor

from site_interp.artifacts import read_json
from site_interp.errors import UserError
from site_interp.studies.similarity import SimilarityMetric, cluster_tasks, similarity_matrix
from site_interp.tasks.builtin import BUILTIN_TASKS, builtin_task
from site_interp.tasks.core import Task, TaskError, load_json_task, load_task
from site_interp.tasks.specs import resolve_tasks

STUDY = "study"
"""Sub-directory of a run directory with the study's tables."""


class RunDataError(UserError):
    """A directory is not a finished run the explorer can read; the message says what is missing."""


@dataclass
class RunData:
    """A finished run, as the explorer shows it: tasks in dendrogram order, alphas, clustering."""

    run_dir: Path
    """``<out>/<model>`` directory it was read from."""
    model_id: str
    """Model the alphas were trained on (from the artifacts' keys)."""
    tasks: list[str]
    """Task names in display order (dendrogram leaf order)."""
    alphas: Float[Tensor, "task layer head"]
    """Trained alphas, rows in :attr:`tasks` order."""
    labels: list[str]
    """Task names in the order the linkage matrix indexes them."""
    linkage: np.ndarray
    """scipy linkage matrix over :attr:`labels` (``(n - 1, 4)``; empty for one task)."""
    clustering_source: str
    """``"study"`` (read from ``study/clustering.json``) or ``"computed"`` (clustered here)."""
    transfer: pd.DataFrame | None = None
    """Accuracy (%) with the alphas of the row task on the column task, when the study wrote it."""
    summaries: dict[str, pd.DataFrame] = field(default_factory=dict)
    """Per task, its ``summary.csv`` (accuracy per method), when the run was evaluated."""
    keys: dict[str, dict] = field(default_factory=dict)
    """Per task, the ``key`` of its alphas' sidecar (model id, task fingerprint, settings)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Per task, where its data came from (``config.json``'s ``task_source``), when known."""
    _embeddings: dict[str, Tensor] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.alphas.dim() != 3 or self.alphas.shape[0] != len(self.tasks):
            raise ValueError(f"alphas must be [task, layer, head] with {len(self.tasks)} tasks, got {tuple(self.alphas.shape)}")
        if sorted(self.labels) != sorted(self.tasks):
            raise ValueError(f"linkage labels {self.labels} are not the tasks {self.tasks}")

    @property
    def n_layers(self) -> int:
        return int(self.alphas.shape[1])

    @property
    def n_heads(self) -> int:
        return int(self.alphas.shape[2])

    def alpha(self, task: str) -> Float[Tensor, "layer head"]:
        """The alphas of one task."""
        return self.alphas[self.index(task)]

    def index(self, task: str) -> int:
        if task not in self.tasks:
            raise RunDataError(f"{self.run_dir}: no task {task!r}; tasks: {', '.join(self.tasks)}")
        return self.tasks.index(task)

    def embedding(self, task: str) -> Float[Tensor, "layer head d_head"]:
        """The task embedding ``t`` of one task (read from disk once, then kept)."""
        if task not in self._embeddings:
            path = self.run_dir / task_folder(self.run_dir, task) / "embedding.safetensors"
            if not path.exists():
                raise RunDataError(f"{path} is missing: the explorer needs the task embedding for this part of a card")
            self._embeddings[task] = load_file(str(path))["t"].float()
        return self._embeddings[task]

    def head_alphas(self, layer: int, head: int) -> Float[Tensor, " task"]:
        """One head's alpha in every task (display order)."""
        return self.alphas[:, layer, head]

    def top_heads(self, n: int) -> list[tuple[int, int]]:
        """The ``n`` heads with the largest alpha in any task (largest first, ties: lower index)."""
        best = self.alphas.amax(0).flatten()
        order = torch.sort(best, descending=True, stable=True).indices[: max(0, n)]
        return [divmod(int(i), self.n_heads) for i in order]

    def accuracy(self, task: str) -> dict[str, float]:
        """First-token accuracy (%) per method of one task, when its summary exists."""
        s = self.summaries.get(task)
        if s is None or "first_token" not in s:
            return {}
        return {str(m): float(a) for m, a in zip(s["method"], s["first_token"])}


def task_folder(run_dir: Path, task: str) -> str:
    """The folder of ``task`` under ``run_dir`` (task folders are slugs; names usually equal them)."""
    for path in run_dir.glob("*/alphas.json"):
        if read_json(path).get("key", {}).get("task") == task:
            return path.parent.name
    return task


def _task_dirs(run_dir: Path) -> list[Path]:
    return sorted(p.parent for p in run_dir.glob("*/alphas.safetensors"))


def load_run_data(
    run_dir: str | Path, *, metric: SimilarityMetric = "jaccard", tasks: Sequence[str] | None = None
) -> RunData:
    """Read a finished run directory (``<out>/<model>``) for the explorer.

    ``tasks`` keeps only those tasks. The clustering comes from ``study/clustering.json`` when it
    covers exactly these tasks, otherwise the tasks are clustered here by ``metric``.
    Raises :class:`RunDataError` when the directory holds no trained alphas or mixes models.
    """
    run_dir = Path(run_dir)
    dirs = _task_dirs(run_dir)
    if not dirs:
        raise RunDataError(f"{run_dir}: no */alphas.safetensors; is this <out>/<model> of a finished run?")
    alphas: dict[str, Tensor] = {}
    keys: dict[str, dict] = {}
    sources: dict[str, str] = {}
    summaries: dict[str, pd.DataFrame] = {}
    for d in dirs:
        sidecar = d / "alphas.json"
        key = read_json(sidecar).get("key", {}) if sidecar.exists() else {}
        name = str(key.get("task", d.name))
        if tasks is not None and name not in tasks:
            continue
        alphas[name] = load_file(str(d / "alphas.safetensors"))["alpha"].float()
        keys[name] = key
        if (d / "config.json").exists():
            sources[name] = str(read_json(d / "config.json").get("task_source", ""))
        if (d / "summary.csv").exists():
            summaries[name] = pd.read_csv(d / "summary.csv")
    if not alphas:
        raise RunDataError(f"{run_dir}: none of the tasks {list(tasks or [])} has trained alphas here")
    models = {k.get("model_id") for k in keys.values() if k.get("model_id")}
    if len(models) > 1:
        raise RunDataError(f"{run_dir}: task folders were made with different models ({', '.join(sorted(models))})")
    model = models.pop() if models else run_dir.name
    shapes = {tuple(a.shape) for a in alphas.values()}
    if len(shapes) > 1:
        raise RunDataError(f"{run_dir}: alphas of different shapes {sorted(shapes)}")
    labels, linkage, order, source = _clustering(run_dir, alphas, metric)
    transfer = None
    if (run_dir / STUDY / "transfer.csv").exists():
        transfer = pd.read_csv(run_dir / STUDY / "transfer.csv", index_col=0)
    return RunData(
        run_dir=run_dir, model_id=model, tasks=order, alphas=torch.stack([alphas[t] for t in order]),
        labels=labels, linkage=linkage, clustering_source=source, transfer=transfer,
        summaries=summaries, keys=keys, sources=sources,
    )


def _clustering(
    run_dir: Path, alphas: dict[str, Tensor], metric: SimilarityMetric
) -> tuple[list[str], np.ndarray, list[str], str]:
    """(linkage labels, linkage, leaf order, source) from the study's files, or computed here.
    The order is the linkage's leaf order (as the study's ``order``), so the dendrogram's leaves
    line up with the grid's rows."""
    path = run_dir / STUDY / "clustering.json"
    if path.exists():
        stored = read_json(path)
        sim_path = run_dir / STUDY / f"similarity_{stored.get('metric', metric)}.csv"
        if sim_path.exists():
            labels = [str(x) for x in pd.read_csv(sim_path, index_col=0).index]
            linkage = np.asarray(stored.get("linkage") or np.empty((0, 4)), dtype=float).reshape(-1, 4)
            if sorted(labels) == sorted(alphas) and len(linkage) == len(labels) - 1:
                order = [labels[i] for i in leaves_list(linkage)] if len(labels) > 1 else labels
                return labels, linkage, order, "study"
    sim = similarity_matrix(alphas, metric)
    linkage, order = cluster_tasks(sim)
    return list(alphas), np.asarray(linkage, dtype=float), order, "computed"


def find_runs(roots: str | Path | Sequence[str | Path]) -> dict[str, dict[str, Path]]:
    """Run directories under each root: ``{run label: {model folder: <root>/<model>}}``.

    A root is an output folder (``runs/``, holding one folder per model) or a run directory
    itself; its label is the path as given.
    """
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    found: dict[str, dict[str, Path]] = {}
    for root in roots:
        root = Path(root)
        if _task_dirs(root):
            models = {root.name: root}
        elif root.is_dir():
            models = {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and _task_dirs(p)}
        else:
            models = {}
        if models:
            found[str(root)] = models
    if not found:
        raise RunDataError(f"no finished run under {', '.join(map(str, roots))}: expected <out>/<model>/<task>/alphas.safetensors")
    return found


def resolve_task(
    data: RunData, name: str, *, known: Sequence[Task] = (), data_dir: str | Path | None = None
) -> Task:
    """The task data of ``name`` in ``data``, checked against the fingerprint its alphas were made with.

    Tried in turn: a task of that name in ``known`` (tasks the caller holds), the recorded source (a built-in task, a task directory or JSON file), a task
    under ``data_dir``, a built-in task of that name. Raises :class:`TaskError` when none matches.
    """
    want = data.keys.get(name, {}).get("task_fingerprint")
    source = data.sources.get(name, "")
    candidates: list[Task] = [t for t in known if t.name == name]
    tried: list[str] = ["the tasks given"] if candidates else []
    path = Path(source.split(" (")[0]) if source else None

    def attempt(what: str, make) -> None:
        tried.append(what)
        try:
            candidates.append(make())
        except (TaskError, OSError, ValueError):
            pass

    if source.startswith("builtin:") or name in BUILTIN_TASKS:
        attempt(f"built-in task {name}", lambda: builtin_task(name))
    if path is not None and path.is_dir():
        attempt(str(path), lambda: load_task(path))
    elif path is not None and path.suffix == ".json" and path.exists():
        attempt(str(path), lambda: load_json_task(path, name=name))
    if data_dir is not None:
        attempt(f"{name} under {data_dir}", lambda: resolve_tasks([name], data_dir)[0])
    for task in candidates:
        if want is None or task.fingerprint() == want:
            return task
    raise TaskError(
        f"{data.run_dir}: cannot find the data of task {name!r} as it was trained (tried: {', '.join(tried) or 'nothing'}); "
        "pass the task itself (tasks=[...]) or its folder (data_dir=...) to show prompts and patching effects"
    )


def head_label(layer: int, head: int) -> str:
    """``L3H1``: how the explorer names a head."""
    return f"L{layer}H{head}"


__all__ = [
    "RunData",
    "RunDataError",
    "find_runs",
    "head_label",
    "load_run_data",
    "resolve_task",
    "task_folder",
]
