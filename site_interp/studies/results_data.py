"""What the results page reports for one model, gathered from the artifacts on disk.

:class:`ReportConfig` fixes every setting of the page's runs (the FV-57 comparison at several
seeds, the costly baselines at one, the full-scale studies); :func:`gather` reads what exists for
one model -- nothing is computed here -- and returns a :class:`ModelEvidence` with the tables the
page renders (:mod:`site_interp.studies.results_page`) and the figures draw
(:mod:`site_interp.plots.report_figures`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from site_interp.baselines import FunctionVectorConfig, LoraConfig, TaskVectorConfig
from site_interp.checks import check_float, check_int, check_subset
from site_interp.errors import ConfigError
from site_interp.pipeline import RunConfig
from site_interp.studies import evidence as ev
from site_interp.studies.comparison import METHODS, ComparisonConfig, collect_results, seed_config, seed_out
from site_interp.studies.report_runs import (
    ScaleConfig,
    alphas_by_seed,
    patching_rows,
    stage_seconds,
    transfer_columns,
)
from site_interp.studies.similarity import cluster_tasks, overlap_table, similarity_matrix
from site_interp.studies.transfer import TransferResult
from site_interp.tasks.core import Task, TaskError, list_task_dir, load_task_dir
from site_interp.tasks.kinds import task_kind

log = logging.getLogger(__name__)

FV_RANK_TASKS = ("antonym", "capitalize", "country-capital", "english-french", "present-past", "singular-plural")
"""The FV head ranking's tasks when all are present (the function-vector paper's six), else the first six."""


@dataclass(frozen=True)
class ReportConfig:
    """Every setting of the results page's runs."""

    run: RunConfig = field(default_factory=RunConfig)
    """Embedding, SITE and evaluation settings (exact match on: the paper's metric)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of the seeded methods (ICL demonstrations; SITE's embedding prompts and training order)."""
    seeded_methods: tuple[str, ...] = ("icl", "uniform-0.5", "uniform-1", "site")
    """Methods run at every seed."""
    single_seed_methods: tuple[str, ...] = ("0-shot", "tv", "fv", "lora")
    """Methods run at the first seed only (0-shot is deterministic; the rest are the costly baselines)."""
    fv: FunctionVectorConfig = field(default_factory=lambda: FunctionVectorConfig(n_aie_prompts=10, n_valid=50))
    """Function-vector settings (10 AIE prompts per ranking task, layer chosen on 50 valid queries)."""
    tv: TaskVectorConfig = field(default_factory=lambda: TaskVectorConfig(n_valid=50))
    """Task-vector settings (layer chosen on 50 valid queries)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings (rank 8 on q and v, 100 steps of 4 prompts: the 400 examples SITE sees)."""
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """Patching and transfer settings."""
    overlap_threshold: float = 0.5
    """A task's head set: heads with alpha above this."""
    n_perm: int = 2000
    """Permutations of the overlap null, the Mantel test and the kind-separation test."""

    def __post_init__(self) -> None:
        if not self.seeds:
            raise ConfigError("seeds (--seeds) must name at least one seed")
        for s in self.seeds:
            check_int(s, "seeds", minimum=0, option="--seeds")
        check_subset(self.seeded_methods, "seeded_methods", METHODS)
        check_subset(self.single_seed_methods, "single_seed_methods", METHODS)
        check_float(self.overlap_threshold, "overlap_threshold", minimum=0.0, maximum=1.0)
        check_int(self.n_perm, "n_perm", minimum=1, option="--n-perm")

    def comparison(self, methods: Sequence[str], seeds: Sequence[int], tasks: Sequence[Task],
                   rank_tasks: Sequence[Task] = ()) -> ComparisonConfig:
        """The comparison of ``methods`` at ``seeds``; FV heads ranked on :data:`FV_RANK_TASKS`
        when ``tasks`` and ``rank_tasks`` (:func:`fv_rank_pool`) hold them all."""
        names = {t.name for t in [*tasks, *rank_tasks]}
        rank = FV_RANK_TASKS if set(FV_RANK_TASKS) <= names else None
        return ComparisonConfig(run=self.run, methods=tuple(m for m in METHODS if m in methods), seeds=tuple(seeds),
                                fv=self.fv, fv_rank_tasks=rank, tv=self.tv, lora=self.lora)

    def seed_run(self, seed: int) -> RunConfig:
        return seed_config(ComparisonConfig(run=self.run), seed)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ModelEvidence:
    """Everything the page says about one model (percentages unless named otherwise)."""

    model_id: str
    tasks: list[str]
    kinds: dict[str, str]
    scores: pd.DataFrame
    """:func:`~site_interp.studies.evidence.score_frame` of every method, seed and metric."""
    summary: pd.DataFrame
    """:func:`~site_interp.studies.evidence.method_summary`."""
    differences: list[ev.Difference]
    gaps: pd.DataFrame
    """Tasks where first-token and exact-match accuracy of ``gaps_method`` differ most."""
    gaps_method: str
    binary: dict[str, float]
    patching: pd.DataFrame
    patching_claim: dict[str, float]
    transfer: TransferResult | None
    similarity: pd.DataFrame | None
    overlap: pd.DataFrame | None
    order: list[str]
    """Every task: those with seed-0 alphas in dendrogram order, then the rest in input order."""
    linkage: np.ndarray | None
    overlap_vs_transfer: dict[str, dict[str, float]]
    kind_separation: dict[str, float]
    seconds: dict[str, float]
    trained: dict[int, int]
    """Seed -> tasks with trained alphas."""

    def to_dataframe(self) -> pd.DataFrame:
        return self.scores


PAIRS = (("site", "icl"), ("site", "lora"), ("site", "uniform-0.5"), ("site", "uniform-1"), ("site", "tv"),
         ("site", "fv"), ("site", "0-shot"), ("icl", "0-shot"), ("lora", "icl"))


def fv_rank_pool(tasks: Sequence[Task], data_dir: str | Path) -> list[Task]:
    """The :data:`FV_RANK_TASKS` that ``tasks`` lacks, loaded from ``data_dir``, when ``tasks`` is
    a chunk of the benchmark under ``data_dir``: the chunk then ranks the FV heads as the whole
    benchmark does. Empty when ``tasks`` holds them all, comes from elsewhere, or ``data_dir``
    lacks some (named in a warning: the FV heads are then ranked on the chunk's first six)."""
    directory = Path(data_dir)
    have = {t.name for t in tasks}
    outside = [n for n in FV_RANK_TASKS if n not in have]
    if not outside or not all(_under(t, directory) for t in tasks):
        return []
    try:
        available = set(list_task_dir(directory))
    except TaskError:
        return []
    missing = [n for n in outside if n not in available]
    if missing:
        log.warning("%s lacks the FV ranking task(s) %s: the FV heads are ranked on the chunk's first six tasks, "
                    "and its FV results do not combine with a whole run's", directory, ", ".join(missing))
        return []
    return list(load_task_dir(directory, outside).values())


def _under(task: Task, directory: Path) -> bool:
    """Whether ``task`` was loaded from a folder of ``directory``."""
    try:
        return Path(task.source).resolve().parent == directory.resolve()
    except (OSError, ValueError):
        return False


def gather(model_id: str, tasks: Sequence[Task], cfg: ReportConfig, out: str | Path,
           rank_tasks: Sequence[Task] = ()) -> ModelEvidence:
    """Read every artifact of ``model_id`` under ``out`` and compute the page's numbers
    (``rank_tasks``: :func:`fv_rank_pool`)."""
    tasks = list(tasks)
    results: list[dict] = []
    for methods, seeds in ((cfg.seeded_methods, cfg.seeds), (cfg.single_seed_methods, cfg.seeds[:1])):
        results += collect_results(model_id, tasks, cfg.comparison(methods, seeds, tasks, rank_tasks), out,
                                   progress=False, compute=False, rank_tasks=rank_tasks)
    kinds = {t.name: task_kind(t) for t in tasks}
    scores = ev.score_frame(results)
    methods = [m for m in METHODS if m in set(scores["method"])]
    summary = ev.method_summary(scores, kinds, methods)
    diffs = [d for a, b in PAIRS for metric in ev.METRICS
             if (d := ev.paired_difference(scores, a, b, metric)) is not None]
    gaps_method = "site" if (scores["method"] == "site").any() else "icl"  # SITE's, or ICL's before SITE ran
    gaps = ev.metric_gaps(scores, results, gaps_method)
    configs = {s: cfg.seed_run(s) for s in cfg.seeds}
    outs = {s: seed_out(out, s) for s in cfg.seeds}
    alphas = alphas_by_seed(model_id, tasks, configs, outs)
    trained = {s: sum(1 for v in alphas.values() if s in v) for s in cfg.seeds}
    first = cfg.seeds[0]
    patching = patching_rows(model_id, tasks, configs[first], outs[first], cfg.scale, compute=False)
    transfer = transfer_columns(model_id, tasks, configs[first], outs[first], cfg.scale, compute=False)
    first_alphas = {t: v[first] for t, v in alphas.items() if first in v}
    sim = overlap = linkage = None
    order = [t.name for t in tasks]
    kind_sep: dict[str, float] = {}
    relation: dict[str, dict[str, float]] = {}
    if len(first_alphas) >= 3:
        sim = similarity_matrix(first_alphas, "jaccard", threshold=cfg.overlap_threshold)
        overlap = overlap_table(first_alphas, threshold=cfg.overlap_threshold, n_perm=cfg.n_perm)
        linkage, clustered = cluster_tasks(sim)
        order = clustered + [t for t in order if t not in clustered]  # untrained tasks last
        kind_sep = ev.kind_separation(sim, kinds, n_perm=cfg.n_perm)
        if transfer is not None:
            m = transfer.matrix
            relation = {"raw": ev.mantel(sim, m, n_perm=cfg.n_perm),
                        "centred": ev.mantel(sim, ev.centred_transfer(m), n_perm=cfg.n_perm)}
    return ModelEvidence(
        model_id=model_id, tasks=[t.name for t in tasks], kinds=kinds, scores=scores, summary=summary,
        differences=diffs, gaps=gaps, gaps_method=gaps_method,
        binary=ev.binary_share({t: list(v.values()) for t, v in alphas.items()}), patching=patching,
        patching_claim=ev.patching_claim(patching), transfer=transfer, similarity=sim, overlap=overlap,
        order=order, linkage=linkage, overlap_vs_transfer=relation, kind_separation=kind_sep,
        seconds=stage_seconds(model_id, tasks, sorted(set(outs.values()))), trained=trained)


__all__ = ["FV_RANK_TASKS", "ModelEvidence", "PAIRS", "ReportConfig", "fv_rank_pool", "gather"]
