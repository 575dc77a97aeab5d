"""SITE beside every baseline, on many tasks, in one table (``python -m site_interp.bench``).

Methods (all on the same tasks, prompts, test queries and first-token metric):

==============  =====================================================================  ==========
name            what                                                                   trained
==============  =====================================================================  ==========
``0-shot``      the bare 0-shot prompt                                                 0
``icl``         N-shot ICL (N = ``n_shots``; demos from train)                         0
``uniform-0.5`` the task embedding injected at every head with alpha = 0.5 (SITE's     0
                starting point)
``uniform-1``   ... with alpha = 1 (every head's output replaced by its ICL mean)      0
``site``        SITE: learned alphas                                                   L x H
``fv``          function vector (:mod:`~site_interp.baselines.function_vectors`);      0
                heads ranked **once**, by the AIE averaged over ``fv_rank_tasks``
``tv``          task vector (:mod:`~site_interp.baselines.task_vectors`), from the     0
                embedding pass's residual stream; layer chosen on valid
``lora``        LoRA rank 8 on q and v (:mod:`~site_interp.baselines.lora`)            r(d_in+d_out) per matrix
==============  =====================================================================  ==========

Everything is cached under ``<out>/<model>/<task>/`` (seed 0; seed k > 0 under
``<out>/seed<k>/``): the embedding and alphas are the artifacts of the SITE pipeline (shared
with ``python -m site_interp.run``), each method's per-query records go to
``bench/<method>.json`` with the settings that made them, so an interrupted run resumes where
it stopped and a finished one only rebuilds the tables. Methods run column by column (cheap ones
first, LoRA last), so a partial run still gives complete columns. The tables are
:mod:`site_interp.studies.comparison_tables`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Sequence

import torch
from tqdm.auto import tqdm

from site_interp.artifacts import (
    exclusive,
    load_if_valid,
    load_json_if_valid,
    read_json,
    save_artifact,
    save_json_artifact,
)
from site_interp.baselines import (
    FunctionVectorConfig,
    TaskVectorConfig,
    average_indirect_effect,
    fit_function_vector,
    fit_task_vector,
)
from site_interp.baselines.lora import LoraConfig, count_lora_params, lora_adapter, train_lora
from site_interp.checks import check_int, check_subset
from site_interp.errors import ConfigError
from site_interp.evaluation import Method, evaluate
from site_interp.pipeline import RunConfig, TaskRun, get_embedding, model_id, run_tasks, task_dir
from site_interp.studies.comparison_tables import ComparisonTables, build_tables
from site_interp.tasks.core import Task, TaskError
from site_interp.training import uniform_alpha

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

MethodName = Literal["0-shot", "uniform-0.5", "uniform-1", "site", "tv", "fv", "icl", "lora"]
"""A method of the comparison (see the module docstring)."""
METHODS: tuple[MethodName, ...] = ("0-shot", "uniform-0.5", "uniform-1", "site", "tv", "fv", "icl", "lora")
"""Every method, in the order they run (cheap first)."""
EMBEDDING_METHODS = frozenset({"uniform-0.5", "uniform-1", "site", "tv", "fv"})
"""Methods that need the task embedding (and hence the SITE pipeline's artifacts)."""
LORA_ADAPTER = "lora_adapter.safetensors"
"""The fitted LoRA adapter, beside the method results (``bench/lora.json`` is LoRA's result)."""
RESULT_FIELDS = ("records", "params", "fit_s", "eval_s")
"""What every ``bench/<method>.json`` result holds (see ``_run_method``)."""


@dataclass(frozen=True)
class ComparisonConfig:
    """Everything that determines a benchmark's results."""

    run: RunConfig = field(default_factory=RunConfig)
    """Embedding, SITE training and evaluation settings (shared by every method)."""
    methods: tuple[MethodName, ...] = METHODS
    """Methods to run (see :data:`METHODS`)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds: each changes ICL prompts, demos, training order and adapter initialisation."""
    fv: FunctionVectorConfig = field(default_factory=FunctionVectorConfig)
    """Function-vector settings (AIE prompts, heads, layer scan)."""
    fv_rank_tasks: tuple[str, ...] | None = None
    """Tasks whose averaged AIE ranks the heads once for all tasks; None: the first six. They may
    lie outside the tasks compared (``rank_tasks=`` of :func:`collect_results`), so that a
    benchmark run in chunks ranks its heads as the whole would."""
    tv: TaskVectorConfig = field(default_factory=TaskVectorConfig)
    """Task-vector settings (layer scan)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA settings."""

    def __post_init__(self) -> None:
        check_subset(self.methods, "methods", METHODS, option="--methods")
        if not self.seeds:
            raise ConfigError("seeds (--seeds) must name at least one seed")
        for seed in self.seeds:
            check_int(seed, "seeds", minimum=0, option="--seeds")
        if self.fv_rank_tasks is not None:
            if not self.fv_rank_tasks:
                raise ConfigError("fv_rank_tasks (--fv-rank-tasks) must name at least one task")
            twice = sorted({n for n in self.fv_rank_tasks if self.fv_rank_tasks.count(n) > 1})
            if twice:
                raise ConfigError(f"fv_rank_tasks (--fv-rank-tasks) names {', '.join(twice)} more than once; "
                                  "name each ranking task once")

    def to_dict(self) -> dict:
        return asdict(self)


def seed_config(cfg: ComparisonConfig, seed: int) -> RunConfig:
    r = cfg.run
    return RunConfig(embedding=replace(r.embedding, seed=seed), site=replace(r.site, seed=seed),
                     eval=replace(r.eval, seed=seed))


def seed_out(out: str | Path, seed: int) -> Path:
    return Path(out) if seed == 0 else Path(out) / f"seed{seed}"


def _method_key(bridge: TransformerBridge, task: Task, cfg: ComparisonConfig, run_cfg: RunConfig, method: str, rank_tasks: list[str]) -> dict:
    key = {"model_id": model_id(bridge), "task": task.name, "task_fingerprint": task.fingerprint(), "method": method,
           "eval": run_cfg.eval.to_dict()}
    if method in ("uniform-0.5", "uniform-1", "site", "fv", "tv"):
        key["embedding"] = run_cfg.embedding.to_dict()
    if method == "site":
        key["site"] = run_cfg.site.result_key()
    if method == "fv":
        key["fv"] = {**replace(cfg.fv, seed=run_cfg.embedding.seed).to_dict(), "rank_tasks": rank_tasks}
    if method == "tv":
        key["tv"] = cfg.tv.to_dict()
    if method == "lora":
        key["lora"] = replace(cfg.lora, seed=run_cfg.site.seed).to_dict()
    return key


def _fv_ranking(bridge: TransformerBridge, runs: dict[str, TaskRun], cfg: ComparisonConfig, run_cfg: RunConfig, out: Path,
                rank_tasks: list[Task], progress: bool) -> tuple[torch.Tensor, float]:
    """Mean AIE over ``rank_tasks`` (each cached beside its task's embedding); total seconds spent.
    A task's embedding is read from ``runs`` or loaded / computed only when its AIE is not cached."""
    fv_cfg = replace(cfg.fv, seed=run_cfg.embedding.seed, n_shots=run_cfg.embedding.n_shots)
    effects, seconds = [], 0.0
    for task in tqdm(rank_tasks, desc="FV head ranking", disable=not progress, leave=False):
        key = {"model_id": model_id(bridge), "task": task.name, "task_fingerprint": task.fingerprint(),
               "embedding": run_cfg.embedding.to_dict(),
               "aie": {"n_aie_prompts": fv_cfg.n_aie_prompts, "n_shots": fv_cfg.n_shots, "seed": fv_cfg.seed}}
        directory = task_dir(out, bridge, task)
        path = directory / "bench" / "fv_aie.safetensors"
        # chunks run side by side share the ranking tasks: the first computes, the others wait and read
        with exclusive(directory / "bench" / ".fv_aie.lock"):
            cached = load_if_valid(path, key)
            if cached is not None:
                effects.append(cached[0]["aie"])
                seconds += cached[1].get("seconds", 0.0)
                continue
            run = runs.get(task.name)
            t = run.embedding.t if run is not None else get_embedding(bridge, task, run_cfg, directory, progress)[0].t
            t0 = time.perf_counter()
            aie = average_indirect_effect(bridge, task, t, fv_cfg, progress=progress)
            dt = time.perf_counter() - t0
            save_artifact(path, {"aie": aie}, key, {"seconds": dt}, seed=fv_cfg.seed)
        effects.append(aie)
        seconds += dt
    return torch.stack(effects).mean(0), seconds


def _fit(bridge: TransformerBridge, task: Task, run: TaskRun | None, method: str, cfg: ComparisonConfig, run_cfg: RunConfig,
         aie: torch.Tensor | None, progress: bool) -> tuple[list[Method], dict, int]:
    """The method's evaluable form, what was fitted (layer, steps...) and its trainable parameters."""
    if method == "0-shot":
        return [Method("0-shot")], {}, 0
    if method == "icl":
        return [Method("icl", n_shots=run_cfg.eval.n_shots)], {}, 0
    assert run is not None, f"{method} needs the task embedding"
    t, L, H = run.embedding.t, bridge.cfg.n_layers, bridge.cfg.n_heads
    if method.startswith("uniform-"):
        value = float(method.split("-", 1)[1])
        return [Method(method, alpha=uniform_alpha(L, H, value), t=t)], {"alpha": value}, 0
    if method == "site":
        return [Method("site", alpha=run.site.alpha, t=t)], {"best_step": run.site.best_step,
                                                              "heads_alpha_gt_0.5": run.site.n_selected}, L * H
    if method == "tv":
        res = fit_task_vector(bridge, run.task, replace(cfg.tv, seed=run_cfg.embedding.seed), vectors=run.embedding.resid,
                              progress=progress)
        return [res.method("tv")], {"layer": res.layer}, 0
    if method == "fv":
        fv_cfg = replace(cfg.fv, seed=run_cfg.embedding.seed, n_shots=run_cfg.embedding.n_shots)
        res = fit_function_vector(bridge, run.task, fv_cfg, embedding=run.embedding, aie=aie, progress=progress)
        return [res.method("fv")], {"layer": res.layer, "heads": res.top_heads}, 0
    raise ValueError(f"unknown method {method!r}; choose from {', '.join(METHODS)}")


def _evaluate_lora(bridge: TransformerBridge, task: Task, cfg: ComparisonConfig, run_cfg: RunConfig, directory: Path, progress: bool):
    """Fit LoRA (or reuse the adapter a killed run saved) and evaluate it.

    The adapter lives in ``lora_adapter.safetensors`` (sidecar ``lora_adapter.json``), never at
    ``lora.json``, which is the method's result: the two used to share that path."""
    lcfg = replace(cfg.lora, seed=run_cfg.site.seed)
    path = directory / LORA_ADAPTER
    key = {"model_id": model_id(bridge), "task": task.name, "task_fingerprint": task.fingerprint(), "lora": lcfg.to_dict()}
    cached = load_if_valid(path, key)
    if cached is None:
        t0 = time.perf_counter()
        res = train_lora(bridge, task, lcfg, progress=progress)
        fit_s = time.perf_counter() - t0
        state, info = res.state, {"best_step": res.best_step, "best_valid_loss": res.best_valid_loss}
        # "training_s", not "seconds": the compute table counts the fit once, from the result
        save_artifact(path, state, key, {**info, "history": res.history, "training_s": fit_s}, seed=lcfg.seed)
    else:
        state, meta = cached
        fit_s, info = float(meta.get("training_s", 0.0)), {k: meta.get(k) for k in ("best_step", "best_valid_loss")}
    t0 = time.perf_counter()
    with lora_adapter(bridge, lcfg, state=state):
        ev = evaluate(bridge, task, [Method("lora")], run_cfg.eval, progress=False)
    return ev.records, info, count_lora_params(bridge, lcfg), fit_s, time.perf_counter() - t0


def _seconds(sidecar: Path) -> float:
    """The ``seconds`` recorded next to an artifact (0 if it does not exist)."""
    return float(read_json(sidecar).get("seconds", 0.0)) if sidecar.exists() else 0.0


def compare_methods(bridge: TransformerBridge, tasks: list[Task], cfg: ComparisonConfig, out: str | Path, *, progress: bool = True,
                    compute: bool = True, rank_tasks: Sequence[Task] = ()) -> ComparisonTables:
    """Run (or resume) every method on every task for every seed; return the tables.

    ``compute=False`` only reads what is cached (tables of a partial run: missing entries are
    left out, and each method's row says on how many tasks it ran). ``rank_tasks``: as for
    :func:`collect_results`.
    """
    results = collect_results(bridge, tasks, cfg, out, progress=progress, compute=compute, rank_tasks=rank_tasks)
    return build_tables(results, model_id(bridge), n_shots=cfg.run.eval.n_shots)


def collect_results(bridge: TransformerBridge | str, tasks: list[Task], cfg: ComparisonConfig, out: str | Path, *,
                    progress: bool = True, compute: bool = True, rank_tasks: Sequence[Task] = ()) -> list[dict]:
    """What :func:`compare_methods` tabulates: one dict per (seed, task, method) that ran, with
    ``seed, task, method, records, info, params, fit_s, eval_s, stages``.

    ``bridge`` may be the model id alone when ``compute`` is False (nothing is run).
    ``rank_tasks``: tasks that ``cfg.fv_rank_tasks`` may name beyond ``tasks``. They are run only
    as far as the FV head ranking needs (embedding and AIE, each when not cached; no alphas),
    never compared, so a chunk of a benchmark ranks the FV heads on the same tasks, with the
    same result keys, as the whole.
    """
    if isinstance(bridge, str) and compute:
        raise ValueError("collect_results needs the model itself to compute; pass compute=False to only read")
    unknown = [m for m in cfg.methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {', '.join(METHODS)}")
    methods = [m for m in METHODS if m in cfg.methods]
    if len({task.name for task in tasks}) != len(tasks):
        raise TaskError("two tasks have the same name; their artifacts would collide")
    by_name = {t.name: t for t in [*rank_tasks, *tasks]}
    results: list[dict] = []
    for seed in cfg.seeds:
        run_cfg, out_s = seed_config(cfg, seed), seed_out(out, seed)
        runs: dict[str, TaskRun] = {}
        rank_names: list[str] = []
        if "fv" in methods:
            rank_names = list(cfg.fv_rank_tasks) if cfg.fv_rank_tasks else [task.name for task in tasks[:6]]
            missing = [n for n in rank_names if n not in by_name]
            if missing:
                raise TaskError(f"--fv-rank-tasks {missing} are not among the benchmark's tasks; "
                                "name tasks that exist under --data-dir")
        if compute:
            # the SITE pipeline (embedding, alphas) only for tasks with an embedding method still to
            # run: finished columns need neither, so a results store without embeddings resumes cheaply
            # (the FV ranking tasks need an embedding only, and only where their AIE is not cached)
            pending = [task for task in tasks if _pending(bridge, task, cfg, run_cfg, out_s, rank_names)]
            if pending:
                runs = {r.task.name: r for r in run_tasks(bridge, pending, run_cfg, out_s, progress=progress,
                                                          evaluate_methods=False)}
        aie, rank_s = None, 0.0
        if "fv" in methods:
            if compute and any(not _fv_done(bridge, task, cfg, run_cfg, out_s, rank_names) for task in tasks):
                aie, rank_s = _fv_ranking(bridge, runs, cfg, run_cfg, out_s, [by_name[n] for n in rank_names], progress)
            else:
                rank_s = sum(_seconds(task_dir(out_s, bridge, by_name[n]) / "bench" / "fv_aie.json") for n in rank_names)
        for method in methods:
            bar = tqdm(tasks, desc=f"{method} (seed {seed})", disable=not progress or not compute)
            for task in bar:
                directory = task_dir(out_s, bridge, task)
                bench, key = directory / "bench", _method_key(bridge, task, cfg, run_cfg, method, rank_names)
                done = _stored(bench, method, key)
                if done is None:
                    if not compute:
                        continue
                    done = _run_method(bridge, task, runs.get(task.name), method, cfg, run_cfg, aie, bench, progress)
                    save_json_artifact(bench / f"{method}.json", key, done, seed=seed)
                stage = {"embedding_s": _seconds(directory / "embedding.json") if method in EMBEDDING_METHODS else 0.0,
                         "site_training_s": _seconds(directory / "alphas.json") if method == "site" else 0.0,
                         "fv_ranking_s": rank_s / len(tasks) if method == "fv" else 0.0}
                results.append({"seed": seed, "task": task.name, "method": method, **done, "stages": stage})
    return results


def _pending(bridge: TransformerBridge, task: Task, cfg: ComparisonConfig, run_cfg: RunConfig, out: Path,
             rank_names: list[str]) -> bool:
    """Whether an embedding method of ``cfg`` has no valid result for ``task`` yet."""
    bench = task_dir(out, bridge, task) / "bench"
    return any(_stored(bench, m, _method_key(bridge, task, cfg, run_cfg, m, rank_names)) is None
               for m in cfg.methods if m in EMBEDDING_METHODS)


def _fv_done(bridge: TransformerBridge, task: Task, cfg: ComparisonConfig, run_cfg: RunConfig, out: Path,
             rank_names: list[str]) -> bool:
    return _stored(task_dir(out, bridge, task) / "bench", "fv", _method_key(bridge, task, cfg, run_cfg, "fv", rank_names)) is not None


def _stored(bench: Path, method: str, key: dict) -> dict | None:
    """The result of ``method`` in ``bench`` made with ``key``; None when absent or damaged."""
    return load_json_if_valid(bench / f"{method}.json", key, fields=RESULT_FIELDS)


def _run_method(bridge: TransformerBridge, task: Task, run: TaskRun | None, method: str, cfg: ComparisonConfig, run_cfg: RunConfig,
                aie: torch.Tensor | None, directory: Path, progress: bool) -> dict:
    if method == "lora":
        records, info, params, fit_s, eval_s = _evaluate_lora(bridge, task, cfg, run_cfg, directory, progress)
    else:
        t0 = time.perf_counter()
        evaluable, info, params = _fit(bridge, task, run, method, cfg, run_cfg, aie, progress)
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        records = evaluate(bridge, task, evaluable, run_cfg.eval, progress=False).records
        eval_s = time.perf_counter() - t0
    slim = [{k: r[k] for k in ("query", "target", "pred_token", "first_token", "exact_match")} for r in records]
    return {"records": slim, "info": info, "params": params, "fit_s": fit_s, "eval_s": eval_s}


__all__ = ["EMBEDDING_METHODS", "METHODS", "ComparisonConfig", "MethodName", "collect_results", "compare_methods", "seed_config", "seed_out"]
