"""The SITE pipeline for one task, with cached artifacts.

``run_task`` = task embedding -> alpha training -> evaluation (0-shot, N-shot ICL, SITE), each
stage reused from ``<out>/<model>/<task>/`` when a matching artifact exists (see
:mod:`site_interp.artifacts`), and the run's tables (config, per-query results, summary) written
there. Figures are drawn by the commands (:mod:`site_interp.plots`), not here. Used by
``python -m site_interp.run`` and the studies.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pandas as pd
import torch

from site_interp.artifacts import (
    DamagedArtifact,
    check_tensor,
    load_if_valid,
    provenance,
    read_json_object,
    remove_stale_temporaries,
    save_artifact,
    slug,
    write_json,
    write_text,
)
from site_interp.embeddings import EmbeddingConfig, TaskEmbedding, compute_task_embedding
from site_interp.evaluation import EvalConfig, TaskEvaluation, evaluate, standard_methods
from site_interp.prompts import has_whitespace_lead
from site_interp.tasks.core import Task
from site_interp.trainer import Checkpoint
from site_interp.training import SiteConfig, SiteResult, train_site_many

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class RunConfig:
    """Everything that determines a run's artifacts."""

    embedding: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    """Task-embedding settings (M prompts, N shots)."""
    site: SiteConfig = field(default_factory=SiteConfig)
    """Alpha training settings."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation settings."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TaskRun:
    """The outcome of the pipeline on one task."""

    task: Task
    """The task."""
    embedding: TaskEmbedding
    """Its task embedding."""
    site: SiteResult
    """Trained alphas."""
    evaluation: TaskEvaluation
    """Per-query results of 0-shot, ICL and SITE."""
    timings: dict[str, float]
    """Seconds per stage (``embedding``, ``training``, ``evaluation``); 0 where reused from cache."""
    directory: Path | None = None
    """Where the artifacts are."""

    def summary(self) -> pd.DataFrame:
        return self.evaluation.summary()


def model_id(model: TransformerBridge | str) -> str:
    """The model's id as recorded in artifacts (hub id or resolved directory); a string is
    taken as the id itself (a sweep's driver writes artifacts without loading the model)."""
    if isinstance(model, str):
        return model
    info = getattr(model, "site_info", None)
    return info.model_id if info is not None else str(getattr(model.cfg, "model_name", "unknown"))


def task_dir(out: str | Path, model: TransformerBridge | str, task: Task) -> Path:
    """``<out>/<model>/<task>/``: where a task's artifacts live."""
    return Path(out) / slug(model_id(model)) / slug(task.name)


def embedding_key(model: TransformerBridge | str, task: Task, cfg: RunConfig) -> dict:
    """What a task embedding artifact must have been made with to be reused."""
    return {
        "model_id": model_id(model),
        "task": task.name,
        "task_fingerprint": task.fingerprint(),
        "embedding": cfg.embedding.to_dict(),
    }


def alpha_key(model: TransformerBridge | str, task: Task, cfg: RunConfig) -> dict:
    """What an alpha artifact must have been made with to be reused."""
    return {**embedding_key(model, task, cfg), "site": cfg.site.result_key()}


def _shape(model: TransformerBridge | str) -> tuple[int | None, int | None, int | None]:
    """(layers, heads, d_head) of a bridge; unknown (None) for a bare model id."""
    if isinstance(model, str):
        return None, None, None
    return model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_head


def load_embedding(model: TransformerBridge | str, task: Task, cfg: RunConfig, directory: Path) -> TaskEmbedding | None:
    """The task embedding saved in ``directory`` if it was made with these settings, else None
    (also when it is damaged: wrong shape for this model, NaNs... it is then recomputed)."""

    def check(tensors: dict, meta: dict) -> None:
        check_tensor(tensors, "t", _shape(model))
        if "resid" in tensors:
            check_tensor(tensors, "resid", (_shape(model)[0], None))

    cached = load_if_valid(directory / "embedding.safetensors", embedding_key(model, task, cfg), check)
    if cached is None:
        return None
    tensors, meta = cached
    return TaskEmbedding(task.name, tensors["t"], cfg.embedding, meta.get("seconds", 0.0), tensors.get("resid"))


def save_embedding(model: TransformerBridge | str, task: Task, cfg: RunConfig, directory: Path,
                   emb: TaskEmbedding) -> None:
    tensors = {"t": emb.t} if emb.resid is None else {"t": emb.t, "resid": emb.resid}
    save_artifact(directory / "embedding.safetensors", tensors, embedding_key(model, task, cfg),
                  {"seconds": emb.seconds}, seed=cfg.embedding.seed)


def get_embedding(bridge: TransformerBridge, task: Task, cfg: RunConfig, directory: Path | None, progress: bool) -> tuple[TaskEmbedding, bool]:
    """Load the cached task embedding or compute and save it. Returns (embedding, computed?)."""
    cached = load_embedding(bridge, task, cfg, directory) if directory else None
    if cached is not None:
        return cached, False
    emb = compute_task_embedding(bridge, task, cfg.embedding, progress=progress)
    if directory:
        save_embedding(bridge, task, cfg, directory, emb)
    return emb, True


ANSWER_TOKEN_RULE = 2
"""Recorded with trained alphas: 2 = targets are the answer's first token that carries content
(:func:`~site_interp.prompts.answer_start`). Alphas trained before (no record) on a task where some
answer starts with a whitespace-only token were trained on a bare space target; they are recomputed."""


def load_alphas(model: TransformerBridge | str, task: Task, cfg: RunConfig, directory: Path) -> SiteResult | None:
    """The trained alphas saved in ``directory`` if they were made with these settings, else None
    (also when they are damaged: wrong shape, NaN or outside [0, 1], an incomplete sidecar...)."""

    def check(tensors: dict, meta: dict) -> None:
        check_tensor(tensors, "alpha", _shape(model)[:2], low=0.0, high=1.0)
        if not isinstance(meta.get("best_step"), int) or not isinstance(meta.get("history"), list) \
                or not isinstance(meta.get("best_valid_loss"), (int, float)):
            raise DamagedArtifact("the sidecar lacks best_step, best_valid_loss or history")
        if meta.get("answer_token_rule") != ANSWER_TOKEN_RULE and not isinstance(model, str) and has_whitespace_lead(
                model.tokenizer, task.train[:1000] + task.valid[: cfg.site.n_valid or len(task.valid)]):
            raise DamagedArtifact("trained before answers starting with a space-only token got a content target")

    cached = load_if_valid(directory / "alphas.safetensors", alpha_key(model, task, cfg), check)
    if cached is None:
        return None
    tensors, meta = cached
    return SiteResult(
        task=task.name, alpha=tensors["alpha"], best_step=meta["best_step"],
        best_valid_loss=meta["best_valid_loss"], history=meta["history"],
        seconds=meta.get("seconds", 0.0), config=cfg.site,
    )


def save_alphas(model: TransformerBridge | str, task: Task, cfg: RunConfig, directory: Path, res: SiteResult,
                trained_with: Sequence[str] | None = None) -> None:
    """``trained_with``: the tasks of its joint training group, recorded so that the time
    (``seconds`` = the group's time / its tasks) can be set against that group's work
    (benchmarks/floor.py)."""
    info = {"best_step": res.best_step, "best_valid_loss": res.best_valid_loss, "history": res.history,
            "seconds": res.seconds, "n_selected": res.n_selected, "answer_token_rule": ANSWER_TOKEN_RULE}
    if trained_with is not None:
        info["trained_with"] = list(trained_with)
    save_artifact(directory / "alphas.safetensors", {"alpha": res.alpha}, alpha_key(model, task, cfg), info,
                  seed=cfg.site.seed)


def run_tasks(
    bridge: TransformerBridge, tasks: list[Task], cfg: RunConfig = RunConfig(), out: str | Path | None = None, *, progress: bool = True,
    evaluate_methods: bool = True,
) -> list[TaskRun]:
    """Embedding -> alphas -> evaluation for every task; artifacts under ``out`` when given.

    Alphas missing from the cache are trained for all those tasks at once
    (:func:`~site_interp.training.train_site_many`: same result as one by one, one weight read
    per step for all of them). Training time is reported per task as the joint time / tasks.
    ``evaluate_methods=False`` stops after training (the runs then carry an empty evaluation).
    """
    dirs = [task_dir(out, bridge, task) if out is not None else None for task in tasks]
    if out is not None:  # what a killed run was writing when it died
        root = Path(out) / slug(model_id(bridge))
        for directory in [root, root / ".checkpoints", *dirs]:
            remove_stale_temporaries(directory)
    timings: list[dict[str, float]] = [{} for _ in tasks]
    embs = []
    for k, task in enumerate(tasks):
        emb, made = get_embedding(bridge, task, cfg, dirs[k], progress)
        timings[k]["embedding"] = emb.seconds if made else 0.0
        embs.append(emb)
    sites: list[SiteResult | None] = [load_alphas(bridge, task, cfg, d) if d else None for task, d in zip(tasks, dirs)]
    todo = [k for k, s in enumerate(sites) if s is None]
    checkpoints = Path(out) / slug(model_id(bridge)) / ".checkpoints" if out is not None else None
    if checkpoints is not None:
        # a group killed while its alphas were being saved trains again as that group (resuming its
        # checkpoint), so every task gets exactly the alphas of an uninterrupted run
        names = {task.name: k for k, task in enumerate(tasks)}
        for group, checkpoint in Checkpoint.unfinished_groups(checkpoints):
            if not set(group) <= set(names):
                continue
            if any(names[n] in todo for n in group):
                todo = sorted(set(todo) | {names[n] for n in group})
            else:  # every result was saved, only the clean-up was missed
                checkpoint.remove()
    if todo:
        torch.manual_seed(cfg.site.seed)

        def save_group(group: list[int], trained: list[SiteResult]) -> None:  # as each group ends: resumable
            names = [tasks[todo[j]].name for j in group]
            for j, res in zip(group, trained):
                k = todo[j]
                sites[k] = res
                if dirs[k] is not None:
                    save_alphas(bridge, tasks[k], cfg, dirs[k], res, trained_with=names)

        train_site_many(bridge, [tasks[k] for k in todo], [embs[k] for k in todo], cfg.site, progress=progress,
                        on_group=save_group, checkpoint_dir=checkpoints,
                        checkpoint_key={"model_id": model_id(bridge)})
    runs = []
    for k, task in enumerate(tasks):
        site = sites[k]
        assert site is not None
        timings[k]["training"] = site.seconds if k in todo else 0.0
        t0 = time.perf_counter()
        if not evaluate_methods:
            runs.append(TaskRun(task=task, embedding=embs[k], site=site, evaluation=TaskEvaluation(task.name),
                                timings=timings[k], directory=dirs[k]))
            continue
        stored = load_evaluation(bridge, task, cfg, dirs[k], embs[k], site) if dirs[k] is not None else None
        if stored is not None:  # made from this very embedding and these alphas: nothing to redo
            timings[k]["evaluation"] = 0.0
            run = TaskRun(task=task, embedding=embs[k], site=site, evaluation=stored, timings=timings[k],
                          directory=dirs[k])
            if not all((dirs[k] / f).is_file() for f in ("results.csv", "summary.csv")):
                write_run_files(bridge, run, cfg)  # (a run killed between its writes)
            runs.append(run)
            continue
        evaluation = evaluate(bridge, task, standard_methods(embs[k].t, site.alpha, cfg.eval.n_shots), cfg.eval,
                              progress=progress)
        timings[k]["evaluation"] = time.perf_counter() - t0
        run = TaskRun(task=task, embedding=embs[k], site=site, evaluation=evaluation, timings=timings[k],
                      directory=dirs[k])
        if dirs[k] is not None:
            write_run_files(bridge, run, cfg)
        runs.append(run)
    return runs


def run_task(
    bridge: TransformerBridge, task: Task, cfg: RunConfig = RunConfig(), out: str | Path | None = None, *, progress: bool = True
) -> TaskRun:
    """:func:`run_tasks` for one task."""
    return run_tasks(bridge, [task], cfg, out, progress=progress)[0]


def inputs_digest(embedding: TaskEmbedding, site: SiteResult) -> str:
    """A digest of the task embedding and the alphas an evaluation was made with (results.json
    records it, so a stored evaluation is reused only with exactly these)."""
    h = hashlib.sha256()
    for x in (embedding.t, site.alpha):
        h.update(str(tuple(x.shape)).encode())
        h.update(x.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


def _made_with(task: Task, cfg: RunConfig, embedding: TaskEmbedding, site: SiteResult) -> dict:
    """What results.json records of how its evaluation was made, and a reuse must match."""
    return {"task_fingerprint": task.fingerprint(), "config": json.loads(json.dumps(cfg.to_dict())),
            "inputs": inputs_digest(embedding, site)}


def load_evaluation(model: TransformerBridge | str, task: Task, cfg: RunConfig, directory: Path,
                    embedding: TaskEmbedding, site: SiteResult, *, legacy: bool = False) -> TaskEvaluation | None:
    """The stored evaluation of ``task`` in ``directory`` when it was made by this model with these
    settings, from this embedding and these alphas; None otherwise (absent, damaged, stale).

    A results.json from before it recorded what made it (``made_with``) is reused only when
    ``legacy`` is set, as before: by model id and config.json's settings (a sweep's finished cells)."""
    results = directory / "results.json"
    if not results.exists():
        return None
    data, config = read_json_object(results), read_json_object(directory / "config.json")
    if data is None or not isinstance(data.get("records"), list) or config is None:
        return None  # damaged (logged): the evaluation is run again, and its files rewritten
    if data.get("model_id") != model_id(model):
        return None
    made, wanted = data.get("made_with"), _made_with(task, cfg, embedding, site)
    if isinstance(made, dict):
        if made != wanted:
            return None
    elif not legacy or config.get("config") != wanted["config"]:
        return None
    return TaskEvaluation(task.name, records=data["records"])


def write_run_files(model: TransformerBridge | str, run: TaskRun, cfg: RunConfig) -> None:
    """config.json, results.csv, summary.csv and, last, results.json of one task run (results.json
    records what made it, so a run killed among these writes never leaves it beside another's)."""
    d = run.directory
    assert d is not None
    write_json(d / "config.json", {
        "model_id": model_id(model), "task": run.task.name, "task_source": run.task.source,
        "task_fingerprint": run.task.fingerprint(), "config": cfg.to_dict(), "provenance": provenance(cfg.site.seed),
    })
    write_text(d / "results.csv", run.evaluation.to_dataframe().to_csv(index=False))
    write_text(d / "summary.csv", run.summary().to_csv(index=False))
    write_json(d / "results.json", {
        "task": run.task.name, "model_id": model_id(model),
        "made_with": _made_with(run.task, cfg, run.embedding, run.site),
        "summary": run.summary().to_dict(orient="records"),
        "best_step": run.site.best_step, "best_valid_loss": run.site.best_valid_loss,
        "n_selected_heads": run.site.n_selected, "timings": run.timings,
        "records": run.evaluation.records,
    })


def save_run(model: TransformerBridge | str, run: TaskRun, cfg: RunConfig, out: str | Path) -> Path:
    """Write everything :func:`run_tasks` writes for ``run`` under ``<out>/<model>/<task>/``
    (e.g. a sweep's driver, for a run computed elsewhere); returns the directory."""
    directory = task_dir(out, model, run.task)
    save_embedding(model, run.task, cfg, directory, run.embedding)
    save_alphas(model, run.task, cfg, directory, run.site)
    run.directory = directory
    if run.evaluation.records:
        write_run_files(model, run, cfg)
    return directory


def load_run(model: TransformerBridge | str, task: Task, cfg: RunConfig, out: str | Path) -> TaskRun | None:
    """The finished run of ``task`` under ``out`` (embedding, alphas and evaluation, all made with
    these settings), or None when any part is missing; other settings raise
    :class:`~site_interp.artifacts.ArtifactMismatchError`."""
    directory = task_dir(out, model, task)
    emb = load_embedding(model, task, cfg, directory)
    site = load_alphas(model, task, cfg, directory)
    if emb is None or site is None:
        return None
    evaluation = load_evaluation(model, task, cfg, directory, emb, site, legacy=True)
    if evaluation is None:
        return None
    return TaskRun(task=task, embedding=emb, site=site, evaluation=evaluation,
                   timings={"embedding": 0.0, "training": 0.0, "evaluation": 0.0}, directory=directory)


__all__ = [
    "RunConfig",
    "TaskRun",
    "alpha_key",
    "embedding_key",
    "get_embedding",
    "inputs_digest",
    "load_evaluation",
    "load_alphas",
    "load_embedding",
    "load_run",
    "model_id",
    "run_task",
    "run_tasks",
    "save_alphas",
    "save_embedding",
    "save_run",
    "task_dir",
    "write_run_files",
]
