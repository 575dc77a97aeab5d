"""How stable is a task's head set? Retrain under other seeds or batch sizes and compare.

Every task's alphas are retrained under each variant configuration (artifacts under
``<out>/variants/<name>``); per task, the Jaccard overlap of its head sets across runs, and
overall, the overlap within a task against the overlap across tasks.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd

from site_interp.pipeline import RunConfig, TaskRun, run_tasks
from site_interp.studies.similarity import stability_table, within_vs_across

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


def variant_configs(cfg: RunConfig, seeds: Sequence[int] = (), batch_sizes: Sequence[int] = ()) -> dict[str, RunConfig]:
    """Other seeds (everything seeded changes: prompts, demos, order) and batch sizes (steps scaled
    to keep steps x batch) of ``cfg``, named ``seed<k>`` and ``batch<b>``."""
    out = {}
    for seed in seeds:
        out[f"seed{seed}"] = replace(cfg, embedding=replace(cfg.embedding, seed=seed), site=replace(cfg.site, seed=seed))
    for bs in batch_sizes:
        steps = max(1, cfg.site.steps * cfg.site.batch_size // bs)
        out[f"batch{bs}"] = replace(cfg, site=replace(cfg.site, batch_size=bs, steps=steps,
                                                      eval_every=max(1, cfg.site.eval_every * steps // cfg.site.steps)))
    return out


def head_set_stability(
    bridge: TransformerBridge, runs: Sequence[TaskRun], variants: Mapping[str, RunConfig], out: str | Path | None = None,
    *, top_k: int | None = None, progress: bool = True,
) -> tuple[pd.DataFrame, dict]:
    """Retrain every task's alphas under other settings (seeds, batch sizes) and measure how stable
    its head set is: per task, Jaccard between its runs; overall, within-task vs across-task.

    ``variants`` maps a name (e.g. ``seed1``) to a configuration; their artifacts go under
    ``out/variants/<name>``. The original runs count as one run per task.
    """
    alphas: dict[str, list] = {r.task.name: [r.site.alpha] for r in runs}
    tasks = [r.task for r in runs]
    for name, cfg in variants.items():
        target = Path(out) / "variants" / name if out is not None else None
        for r in run_tasks(bridge, tasks, cfg, target, progress=progress, evaluate_methods=False):
            alphas[r.task.name].append(r.site.alpha)
    table = stability_table(alphas, k=top_k)
    return table, within_vs_across(alphas, k=top_k)


__all__ = ["head_set_stability", "variant_configs"]
