"""The study over a set of tasks: patching per task, then transfer, head overlap and clustering.

:func:`run_study` takes finished :class:`~site_interp.pipeline.TaskRun` s (task embeddings and
alphas), runs every analysis of :mod:`site_interp.studies` on them and writes everything under
``<out>/<model>/study/``:

* ``patching_summary.csv`` / ``patching_records.csv`` / ``patching_references.csv``;
* ``transfer.csv`` (alphas from x evaluated on, %), ``transfer_normalized.csv``,
  ``transfer_references.csv``, ``transfer_records.csv``;
* ``similarity_{jaccard,cosine,spearman}.csv``, ``overlap.csv`` (Jaccard vs a permutation null),
  ``clustering.json`` (linkage and leaf order), ``similarity_vs_transfer.{csv,json}``;
* ``study.json`` with the configuration, provenance and headline numbers.

Figures are drawn from those files by :mod:`site_interp.plots.run_figures`
(``python -m site_interp.figures``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd

from site_interp.checks import check_choice, check_int
from site_interp.artifacts import provenance, write_json, write_text
from site_interp.pipeline import TaskRun
from site_interp.studies.patching import PatchConfig, PatchingResult, patching_sweep
from site_interp.studies.similarity import (
    METRICS,
    SimilarityMetric,
    cluster_tasks,
    overlap_table,
    similarity_matrix,
    similarity_vs_transfer,
)
from site_interp.studies.transfer import TransferResult, transfer_matrix

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class StudyConfig:
    """What the study computes."""

    patch: PatchConfig = field(default_factory=PatchConfig)
    """The patching sweep."""
    transfer: bool = True
    """Compute the cross-task transfer matrix (needs >= 2 tasks)."""
    top_k: int | None = None
    """Head sets for Jaccard overlap: the top-k heads by alpha (None: alpha > 0.5)."""
    cluster_metric: SimilarityMetric = "jaccard"
    """Similarity used for the clustering and dendrogram (jaccard, cosine, spearman)."""
    n_perm: int = 1000
    """Permutations of the overlap null."""
    seed: int = 0
    """Seed of the null and the bootstraps."""

    def __post_init__(self) -> None:
        check_int(self.top_k, "top_k", minimum=1, none_ok=True, option="--top-k")
        check_choice(self.cluster_metric, "cluster_metric", METRICS, option="--cluster-metric")
        # with fewer than 19 permutations no p-value can fall below 0.05
        check_int(self.n_perm, "n_perm", minimum=19, option="--n-perm")
        check_int(self.seed, "seed", minimum=0, option="--seed")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StudyResult:
    """Everything the study computed (also written to disk)."""

    patching: dict[str, PatchingResult]
    """Per task."""
    transfer: TransferResult | None
    """The transfer matrix (None with fewer than 2 tasks or when disabled)."""
    similarity: dict[str, pd.DataFrame]
    """Task x task similarity per metric."""
    overlap: pd.DataFrame | None
    """Jaccard overlap of head sets against the permutation null, per task pair."""
    order: list[str]
    """Tasks in clustering (dendrogram leaf) order."""
    relation: dict | None
    """Similarity vs transfer: correlation with a bootstrap interval."""
    directory: Path | None = None
    """Where the files are."""

    def patching_summary(self) -> pd.DataFrame:
        return pd.concat([p.summary() for p in self.patching.values()], ignore_index=True)


def _jsonable_relation(rel: dict) -> dict:
    out = {k: v for k, v in rel.items() if k != "pairs"}
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in out.items()}


def run_study(
    bridge: TransformerBridge, runs: Sequence[TaskRun], config: StudyConfig = StudyConfig(), out: str | Path | None = None,
    *, progress: bool = True,
) -> StudyResult:
    """Patching per task, then transfer, similarity and clustering across tasks."""
    patching: dict[str, PatchingResult] = {}
    for run in runs:
        icl = [m for m in run.evaluation.to_dataframe()["method"].unique() if m.endswith("ICL")]
        refs = {m: 100 * run.evaluation.accuracy(m, config.patch.metric) for m in icl}
        patching[run.task.name] = patching_sweep(
            bridge, run.task, run.embedding.t, run.site.alpha, config.patch, references=refs, progress=progress
        )
    alphas = {run.task.name: run.site.alpha for run in runs}
    transfer = None
    if config.transfer and len(runs) > 1:
        transfer = transfer_matrix(
            bridge, [r.task for r in runs], {r.task.name: r.embedding.t for r in runs}, alphas,
            n_test=config.patch.n_test, chunk=config.patch.chunk, progress=progress,
        )
    sims = {m: similarity_matrix(alphas, m, k=config.top_k if m == "jaccard" else None) for m in METRICS}
    overlap = order = relation = None
    linkage = None
    if len(runs) > 1:
        overlap = overlap_table(alphas, k=config.top_k, n_perm=config.n_perm, seed=config.seed)
        linkage, order = cluster_tasks(sims[config.cluster_metric])
        if transfer is not None:
            relation = similarity_vs_transfer(sims["jaccard"], transfer.matrix, seed=config.seed)
    result = StudyResult(patching=patching, transfer=transfer, similarity=sims, overlap=overlap,
                         order=list(order or alphas), relation=relation)
    if out is not None:
        result.directory = Path(out)
        _write(result, config, Path(out), linkage)
    return result


def _write(result: StudyResult, config: StudyConfig, d: Path, linkage) -> None:
    write_text(d / "patching_summary.csv", result.patching_summary().to_csv(index=False))
    write_text(d / "patching_records.csv",
               pd.concat([p.to_dataframe() for p in result.patching.values()]).to_csv(index=False))
    write_text(d / "patching_references.csv",
               pd.concat([p.references_frame() for p in result.patching.values()]).to_csv(index=False))
    for metric, sim in result.similarity.items():
        write_text(d / f"similarity_{metric}.csv", sim.to_csv())
    headline: dict = {"order": result.order}
    if result.overlap is not None:
        write_text(d / "overlap.csv", result.overlap.to_csv(index=False))
        write_json(d / "clustering.json", {"metric": config.cluster_metric, "order": result.order,
                                           "linkage": linkage.tolist() if linkage is not None else []})
    if result.transfer is not None:
        t = result.transfer
        write_text(d / "transfer.csv", t.matrix.to_csv())
        write_text(d / "transfer_normalized.csv", t.normalized().to_csv())
        write_text(d / "transfer_references.csv", t.references.to_csv())
        write_text(d / "transfer_records.csv", t.records.to_csv(index=False))
        headline["transfer"] = t.diagonal_summary()
    if result.relation is not None:
        write_text(d / "similarity_vs_transfer.csv", result.relation["pairs"].to_csv(index=False))
        write_json(d / "similarity_vs_transfer.json", _jsonable_relation(result.relation))
        headline["similarity_vs_transfer"] = _jsonable_relation(result.relation)
    write_json(d / "study.json", {"config": config.to_dict(), "provenance": provenance(config.seed), **headline})


__all__ = ["StudyConfig", "StudyResult", "run_study"]
