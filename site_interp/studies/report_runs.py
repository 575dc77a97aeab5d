"""The full-scale studies of the results page, cached per task so that they resume.

* :func:`patching_rows` -- on every task, the task embedding hard-patched into the k heads with
  the highest alphas, the k lowest, and k random heads (5 draws), k = the heads SITE selects
  (alpha > 0.5, at least 1), first-token accuracy. One JSON artifact per task.
* :func:`transfer_columns` -- the T x T alpha-transfer matrix (first token), computed a few target
  columns at a time; one JSON artifact per target column.
* :func:`load_seed_runs` -- the embeddings and alphas of one seed's tasks (embeddings recomputed
  when they were set aside; alphas never trained here).

Artifacts live beside the comparison's, under ``<out>/<model>/<task>/`` (``patching.json``) and
``<out>/<model>/transfer/<target>.json``; each is keyed by the model, the tasks' fingerprints and
every setting that changes it, so a rerun reuses what is valid and refuses what is not.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from site_interp.artifacts import load_json_if_valid, read_json_object, save_json_artifact, slug
from site_interp.checks import check_int
from site_interp.pipeline import RunConfig, alpha_key, get_embedding, load_alphas, load_embedding, model_id, task_dir
from site_interp.studies.patching import PatchConfig, patching_sweep
from site_interp.studies.transfer import REFERENCES, TransferResult, concat_transfer, transfer_matrix
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class ScaleConfig:
    """Settings of the full-scale studies (defaults: the results page's)."""

    n_test: int = 50
    """Test queries per task (the first ones of the split)."""
    n_random: int = 5
    """Random head sets per task in patching."""
    columns_per_part: int = 4
    """Target tasks per transfer forward group (each is saved as soon as its group is done)."""

    def __post_init__(self) -> None:
        check_int(self.n_test, "n_test", minimum=1)
        check_int(self.n_random, "n_random", minimum=1)
        check_int(self.columns_per_part, "columns_per_part", minimum=1)

    def to_dict(self) -> dict:
        return asdict(self)


def load_seed_runs(model: TransformerBridge | str, tasks: Sequence[Task], cfg: RunConfig, out: str | Path, *,
                   embeddings_for: Sequence[str] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(embeddings, alphas) of one seed's tasks that have trained alphas under ``out``.

    Embeddings are returned for ``embeddings_for`` (default: every task with alphas); one whose
    artifact is missing (a results store keeps alphas but not embeddings) is recomputed and saved
    when ``model`` is a bridge, else left out -- with its alphas, so both dicts agree on the tasks
    that can be studied. Alphas are never trained here (that is the core part's job).
    """
    wanted = None if embeddings_for is None else set(embeddings_for)
    embeddings, alphas = {}, {}
    for task in tasks:
        directory = task_dir(out, model, task)
        site = load_alphas(model, task, cfg, directory)
        if site is None:
            continue
        if wanted is not None and task.name not in wanted:
            alphas[task.name] = site.alpha
            continue
        if isinstance(model, str):
            emb = load_embedding(model, task, cfg, directory)
        else:
            emb, _ = get_embedding(model, task, cfg, directory, progress=False)
        if emb is not None:
            embeddings[task.name], alphas[task.name] = emb.t, site.alpha
    return embeddings, alphas


def selected_k(alpha: torch.Tensor) -> int:
    """Heads SITE selects (alpha > 0.5), at least 1 and at most all heads but one."""
    return int(min(max(int((alpha > 0.5).sum()), 1), alpha.numel() - 1))


def _patching_key(model: TransformerBridge | str, task: Task, run_cfg: RunConfig, cfg: ScaleConfig) -> dict:
    return {**alpha_key(model, task, run_cfg), "study": "patching", "n_test": cfg.n_test, "n_random": cfg.n_random,
            "k_rule": "alpha > 0.5, at least 1", "metric": "first_token"}


def patching_rows(bridge: TransformerBridge | str, tasks: Sequence[Task], run_cfg: RunConfig, out: str | Path,
                  cfg: ScaleConfig = ScaleConfig(), *, compute: bool = True, progress: bool = True) -> pd.DataFrame:
    """One row per task: ``task, k, top, bottom, random, site, zero_shot, seconds`` (accuracy %).

    Tasks without trained alphas are skipped; ``compute=False`` only reads cached rows.
    """
    rows = []
    paths = {t.name: task_dir(out, bridge, t) / "patching.json" for t in tasks}
    keys = {t.name: _patching_key(bridge, t, run_cfg, cfg) for t in tasks}
    cached = {t.name: load_json_if_valid(paths[t.name], keys[t.name]) for t in tasks}
    todo = [name for name, done in cached.items() if done is None]
    embeddings, alphas = load_seed_runs(bridge, tasks, run_cfg, out, embeddings_for=todo) if compute and todo else ({}, {})
    for task in tqdm(tasks, desc="patching", disable=not progress or not compute):
        path, key, done = paths[task.name], keys[task.name], cached[task.name]
        if done is None and compute and task.name in embeddings:
            alpha = alphas[task.name]
            k = selected_k(alpha)
            res = patching_sweep(bridge, task, embeddings[task.name], alpha,
                                 PatchConfig(ks=(k,), modes=("patch",), n_random=cfg.n_random, n_test=cfg.n_test),
                                 progress=False)
            s = res.summary().set_index("selection")["accuracy"]
            done = {"row": {"task": task.name, "k": k, "top": float(s["top"]), "bottom": float(s["bottom"]),
                            "random": float(s["random"]), "site": res.references["SITE"],
                            "zero_shot": res.references["0-shot"], "seconds": res.seconds}}
            save_json_artifact(path, key, done, seed=run_cfg.site.seed)
        if done is not None:
            rows.append(done["row"])
    return pd.DataFrame(rows, columns=["task", "k", "top", "bottom", "random", "site", "zero_shot", "seconds"])


def _transfer_key(model: TransformerBridge | str, target: Task, sources: Sequence[Task], run_cfg: RunConfig,
                  cfg: ScaleConfig) -> dict:
    return {"model_id": model_id(model), "study": "transfer", "target": target.name,
            "target_fingerprint": target.fingerprint(), "sources": [[s.name, s.fingerprint()] for s in sources],
            "embedding": run_cfg.embedding.to_dict(), "site": run_cfg.site.result_key(), "n_test": cfg.n_test,
            "metric": "first_token"}


def _load_column(path: Path, key: dict) -> dict | None:
    """A stored transfer column for ``key``, or one made for more source tasks that include
    ``key``'s (a report run over a chunk of the tasks reads the store's whole matrix): its other
    sources are left out when it is read, and its seconds are scaled to the rows kept. Anything
    else made with other settings raises :class:`ArtifactMismatchError`, as for every artifact."""
    stored = (read_json_object(path, warn=False) or {}).get("key")
    if not (isinstance(stored, dict) and _covers(stored, key)):
        return load_json_if_valid(path, key)
    data = load_json_if_valid(path, stored)
    if data is None:
        return None
    kept = (len(key["sources"]) + len(REFERENCES)) / (len(stored["sources"]) + len(REFERENCES))
    return {**data, "seconds": float(data["seconds"]) * kept}


def _covers(stored: dict, key: dict) -> bool:
    """``stored`` is ``key`` with more source tasks, every one of ``key``'s among them."""
    sources = stored.get("sources")
    return (isinstance(sources, list) and len(sources) > len(key["sources"])
            and all(pair in sources for pair in key["sources"])
            and {k: v for k, v in stored.items() if k != "sources"} == {k: v for k, v in key.items() if k != "sources"})


def transfer_columns(bridge: TransformerBridge | str, tasks: Sequence[Task], run_cfg: RunConfig, out: str | Path,
                     cfg: ScaleConfig = ScaleConfig(), *, compute: bool = True, progress: bool = True
                     ) -> TransferResult | None:
    """The transfer matrix over ``tasks`` (every task both source and target), from cached columns,
    computing the missing ones when ``compute``; None when a column is missing and not computed
    (the matrix needs every task's alphas: it is only built once all are trained)."""
    directory = Path(out) / slug(model_id(bridge)) / "transfer"
    keys = {t.name: _transfer_key(bridge, t, tasks, run_cfg, cfg) for t in tasks}
    parts: dict[str, TransferResult] = {}
    for t in tasks:
        done = _load_column(directory / f"{slug(t.name)}.json", keys[t.name])
        if done is not None:
            parts[t.name] = _column_from_json(done, t.name, [s.name for s in tasks])
    missing = [t for t in tasks if t.name not in parts]
    if missing and compute:
        embeddings, alphas = load_seed_runs(bridge, tasks, run_cfg, out, embeddings_for=[t.name for t in missing])
        if len(alphas) == len(tasks) and all(t.name in embeddings for t in missing):
            groups = [missing[i:i + cfg.columns_per_part] for i in range(0, len(missing), cfg.columns_per_part)]
            for group in tqdm(groups, desc="transfer columns", disable=not progress):
                res = transfer_matrix(bridge, group, embeddings, alphas, n_test=cfg.n_test, progress=False,
                                      sources=[s.name for s in tasks])
                for t in group:
                    col = res.records[res.records["target"] == t.name]
                    part = TransferResult(tasks=[t.name], records=col.reset_index(drop=True),
                                          seconds=res.seconds * len(col) / len(res.records),
                                          sources=[s.name for s in tasks])
                    save_json_artifact(directory / f"{slug(t.name)}.json", keys[t.name], _column_to_json(part),
                                       seed=run_cfg.site.seed)
                    parts[t.name] = part
    if len(parts) < len(tasks):
        return None
    return concat_transfer([parts[t.name] for t in tasks])


def transfer_seconds(model: TransformerBridge | str, tasks: Sequence[Task], run_cfg: RunConfig, out: str | Path,
                     cfg: ScaleConfig = ScaleConfig()) -> dict[str, float]:
    """Target task -> the seconds its stored transfer column took, for the columns that are valid
    for ``tasks`` as sources at these settings (read only; what ``transfer_columns`` would reuse)."""
    directory = Path(out) / slug(model_id(model)) / "transfer"
    seconds = {}
    for t in tasks:
        done = load_json_if_valid(directory / f"{slug(t.name)}.json", _transfer_key(model, t, tasks, run_cfg, cfg))
        if done is not None:
            seconds[t.name] = float(done["seconds"])
    return seconds


def _column_to_json(part: TransferResult) -> dict:
    rec = part.records
    correct = {src: "".join("1" if c else "0" for c in g.sort_values("query_index")["correct"])
               for src, g in rec.groupby("source", sort=False)}
    return {"seconds": part.seconds, "correct": correct}


def _column_from_json(data: Mapping, target: str, sources: list[str]) -> TransferResult:
    rows = []
    for src in sources + list(REFERENCES):
        bits = data["correct"][src]
        rows += [(src, target, i, b == "1") for i, b in enumerate(bits)]
    records = pd.DataFrame(rows, columns=["source", "target", "query_index", "correct"])
    return TransferResult(tasks=[target], records=records, seconds=float(data["seconds"]), sources=sources)


def alphas_by_seed(model: TransformerBridge | str, tasks: Sequence[Task], configs: Mapping[int, RunConfig],
                   outs: Mapping[int, Path]) -> dict[str, dict[int, np.ndarray]]:
    """Task -> seed -> trained alphas, for every seed that has them (read only)."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for seed, cfg in configs.items():
        for task in tasks:
            site = load_alphas(model, task, cfg, task_dir(outs[seed], model, task))
            if site is not None:
                out.setdefault(task.name, {})[seed] = site.alpha.float().numpy()
    return out


def stage_seconds(model: TransformerBridge | str, tasks: Sequence[Task], outs: Sequence[Path]) -> dict[str, float]:
    """Compute time recorded in the artifacts (embedding, SITE training, each comparison method,
    patching, transfer), summed over tasks and seeds: the cost of the page, however many
    sessions it took."""
    total: dict[str, float] = {}

    def _recorded_json(path: Path) -> dict:  # absent or unreadable: it adds no time
        return read_json_object(path, warn=False) or {}

    def add(name: str, seconds: float) -> None:
        total[name] = total.get(name, 0.0) + float(seconds)

    for out in outs:
        for task in tasks:
            d = task_dir(out, model, task)
            for name, file in (("embedding", "embedding.json"), ("SITE training", "alphas.json")):
                add(name, _recorded_json(d / file).get("seconds", 0.0))
            for f in sorted((d / "bench").glob("*.json")) if (d / "bench").is_dir() else []:
                data = _recorded_json(f)
                if "fit_s" in data:
                    add(f"{f.stem} (fit + eval)", data.get("fit_s", 0.0) + data.get("eval_s", 0.0))
                elif "seconds" in data:
                    add(f"{f.stem}", data["seconds"])
            add("patching", _recorded_json(d / "patching.json").get("row", {}).get("seconds", 0.0))
        tdir = Path(out) / slug(model_id(model)) / "transfer"
        for f in sorted(tdir.glob("*.json")) if tdir.is_dir() else []:
            add("transfer", _recorded_json(f).get("seconds", 0.0))
    return {k: v for k, v in total.items() if v > 0}


__all__ = ["ScaleConfig", "alphas_by_seed", "load_seed_runs", "patching_rows", "selected_k", "stage_seconds",
           "transfer_columns", "transfer_seconds"]
