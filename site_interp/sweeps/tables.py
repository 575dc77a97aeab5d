"""The tables over a sweep's grid: accuracy per model x task x seed, means with bootstrap
intervals over seeds and over tasks, head-set stability over seeds, and every head's alpha by
relative depth (for the cross-model figure).

* ``per_seed``: one row per model, overrides, task, seed and method (accuracies in %, from each
  run's :meth:`~site_interp.pipeline.TaskRun.summary`, plus the number of selected heads);
* ``by_task``: per model, overrides, task and method, the mean over seeds with a 95% bootstrap
  interval over seeds;
* ``by_model``: per model, overrides and method, the mean over tasks of the seed means, with a
  95% bootstrap interval over tasks (``_lo_tasks``/``_hi_tasks``) and one over seeds of the
  task means (``_lo_seeds``/``_hi_seeds``);
* ``stability``: per model, overrides and task, the Jaccard overlap of the head sets
  (alpha > 0.5) of every pair of seeds;
* ``heads``: one row per model, cell, task and head: layer, head, ``rel_depth`` =
  layer / (n_layers - 1) (0 = first layer, 1 = last, so models of any depth share one axis), alpha.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from site_interp.artifacts import write_json, write_text
from site_interp.pipeline import TaskRun
from site_interp.stats import bootstrap_ci
from site_interp.studies.similarity import stability_table
from site_interp.sweeps.grid import Cell

METRICS = ("first_token", "exact_match")
"""Accuracy columns, as in :meth:`~site_interp.evaluation.TaskEvaluation.summary` (percent)."""
TABLE_FILES = ("grid_per_seed", "grid_by_task", "grid_by_model", "stability", "heads")
"""The CSV files :meth:`GridTables.write` writes (plus ``grid.md`` and ``grid.json``)."""


def cell_rows(cell: Cell, model_id: str, runs: Sequence[TaskRun]) -> pd.DataFrame:
    """``per_seed`` rows of one cell: one per task and method."""
    frames = []
    for run in runs:
        s = run.summary().drop(columns=[c for c in run.summary().columns if c.endswith(("_lo", "_hi"))])
        s.insert(0, "model", cell.model)
        s.insert(1, "model_id", model_id)
        for i, (name, value) in enumerate(cell.override_values().items()):
            s.insert(2 + i, name, value)
        s.insert(2 + len(cell.overrides), "seed", cell.seed)
        s["n_selected"] = run.site.n_selected
        s["best_step"] = run.site.best_step
        frames.append(s)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def head_rows(cell: Cell, model_id: str, runs: Sequence[TaskRun]) -> pd.DataFrame:
    """``heads`` rows of one cell: every head of every task's alphas."""
    rows = []
    for run in runs:
        alpha = run.site.alpha.float()  # [layer, head]
        n_layers, n_heads = alpha.shape
        for layer in range(n_layers):
            depth = layer / (n_layers - 1) if n_layers > 1 else 0.0
            for head in range(n_heads):
                rows.append({"model": cell.model, "model_id": model_id, **cell.override_values(), "seed": cell.seed,
                             "task": run.task.name, "layer": layer, "head": head, "n_layers": n_layers,
                             "rel_depth": depth, "alpha": float(alpha[layer, head])})
    return pd.DataFrame(rows)


def _metrics(df: pd.DataFrame) -> list[str]:
    return [m for m in METRICS if m in df.columns and df[m].notna().any()]


def _ci(values: pd.Series) -> tuple[float, float]:
    vals = values.dropna().tolist()
    return bootstrap_ci(vals) if len(vals) > 1 else (float("nan"), float("nan"))


def by_task(per_seed: pd.DataFrame, overrides: Sequence[str]) -> pd.DataFrame:
    """Mean over seeds per model, overrides, task and method, with a bootstrap interval over seeds."""
    keys = ["model", *overrides, "task", "method"]
    rows = []
    for key, g in per_seed.groupby(keys, sort=False):
        row = dict(zip(keys, key))
        for m in _metrics(per_seed):
            row[m] = g[m].mean()
            row[f"{m}_lo"], row[f"{m}_hi"] = _ci(g[m])
        row["n_seeds"] = g["seed"].nunique()
        row["n_selected"] = g["n_selected"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def by_model(per_seed: pd.DataFrame, overrides: Sequence[str]) -> pd.DataFrame:
    """Mean over tasks and seeds per model, overrides and method; intervals over tasks and over seeds."""
    keys = ["model", *overrides, "method"]
    tasks = by_task(per_seed, overrides)
    seeds = per_seed.groupby([*keys, "seed"], sort=False)[_metrics(per_seed)].mean().reset_index()
    rows = []
    for key, g in tasks.groupby(keys, sort=False):
        row = dict(zip(keys, key))
        s = seeds
        for k, v in row.items():
            s = s[s[k] == v]
        for m in _metrics(per_seed):
            row[m] = g[m].mean()
            row[f"{m}_lo_tasks"], row[f"{m}_hi_tasks"] = _ci(g[m])
            row[f"{m}_lo_seeds"], row[f"{m}_hi_seeds"] = _ci(s[m])
        row["n_tasks"], row["n_seeds"] = len(g), len(s)
        rows.append(row)
    return pd.DataFrame(rows)


def seed_stability(runs: dict[tuple, list[TaskRun]], overrides: Sequence[str]) -> pd.DataFrame:
    """Jaccard overlap of the head sets of every pair of seeds, per model, overrides and task.
    ``runs`` maps ``(model, *override values)`` to the runs of every seed."""
    frames = []
    for key, group in runs.items():
        alphas: dict[str, list] = {}
        for run in group:
            alphas.setdefault(run.task.name, []).append(run.site.alpha)
        table = stability_table(alphas)
        for i, name in enumerate(["model", *overrides]):
            table.insert(i, name, key[i])
        frames.append(table)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _cell(mean: float, lo: float, hi: float) -> str:
    if pd.isna(mean):
        return ""
    return f"{mean:.1f}" if pd.isna(lo) else f"{mean:.1f} ({lo:.1f}–{hi:.1f})"


@dataclass
class GridTables:
    """The sweep's tables (see the module docstring for each one's rows and columns)."""

    per_seed: pd.DataFrame
    """Accuracy per model, overrides, task, seed and method (%)."""
    by_task: pd.DataFrame
    """Mean and bootstrap interval over seeds, per model, overrides, task and method."""
    by_model: pd.DataFrame
    """Mean over tasks and seeds; intervals over tasks and over seeds; per model, overrides and method."""
    stability: pd.DataFrame
    """Pairwise Jaccard of head sets over seeds, per model, overrides and task."""
    heads: pd.DataFrame
    """Every head's alpha and relative depth, per model, cell and task."""
    overrides: tuple[str, ...] = ()
    """The swept settings (extra key columns of every table)."""

    def __post_init__(self) -> None:
        for name in ("per_seed", "by_task", "by_model"):
            df = getattr(self, name)
            missing = [c for c in ("model", "method", *self.overrides) if not df.empty and c not in df.columns]
            if missing:
                raise ValueError(f"GridTables.{name} lacks the columns {missing}")

    def to_dataframe(self) -> pd.DataFrame:
        """The headline table, ``by_model``."""
        return self.by_model

    def to_markdown(self) -> str:
        """``by_model`` and ``by_task`` as markdown: mean (95% bootstrap interval), %."""
        metrics = _metrics(self.per_seed)
        keys = ["model", *self.overrides]
        head = keys + ["method"] + [f"{m} (CI over tasks)" for m in metrics] + [f"{m} (CI over seeds)" for m in metrics] \
            + ["tasks", "seeds"]
        lines = ["## Mean over tasks and seeds (%)", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, r in self.by_model.iterrows():
            vals = [str(r[k]) for k in keys] + [str(r["method"])]
            vals += [_cell(r[m], r[f"{m}_lo_tasks"], r[f"{m}_hi_tasks"]) for m in metrics]
            vals += [_cell(r[m], r[f"{m}_lo_seeds"], r[f"{m}_hi_seeds"]) for m in metrics]
            vals += [str(int(r["n_tasks"])), str(int(r["n_seeds"]))]
            lines.append("| " + " | ".join(vals) + " |")
        for m in metrics:
            lines += ["", f"## {m} per task: mean over seeds (95% CI over seeds), %", ""]
            wide = self.by_task.assign(v=[_cell(a, b, c) for a, b, c in zip(self.by_task[m], self.by_task[f"{m}_lo"],
                                                                               self.by_task[f"{m}_hi"])])
            wide = wide.pivot_table(index=[*keys, "task"], columns="method", values="v", aggfunc="first", sort=False)
            cols = list(wide.columns)
            lines += ["| " + " | ".join([*keys, "task", *cols]) + " |", "|" + "---|" * (len(keys) + 1 + len(cols))]
            for idx, r in wide.iterrows():
                idx = idx if isinstance(idx, tuple) else (idx,)
                lines.append("| " + " | ".join([*map(str, idx), *(str(r[c]) if pd.notna(r[c]) else "" for c in cols)]) + " |")
        return "\n".join(lines) + "\n"

    def write(self, directory: str | Path, extra: dict | None = None) -> list[Path]:
        """CSV per table, ``grid.md`` and ``grid.json`` (every table's records plus ``extra``)."""
        d = Path(directory)
        out = [write_text(d / f"{name}.csv", getattr(self, name.removeprefix("grid_")).to_csv(index=False))
               for name in TABLE_FILES]
        out.append(write_text(d / "grid.md", self.to_markdown()))
        tables = {name: getattr(self, name).to_dict(orient="records")
                  for name in ("by_model", "by_task", "per_seed", "stability")}
        out.append(write_json(d / "grid.json", {**(extra or {}), "overrides": list(self.overrides), **tables}))
        return out


def grid_tables(results: Sequence[tuple[Cell, str, Sequence[TaskRun]]], overrides: Sequence[str]) -> GridTables:
    """The tables of finished cells, given as ``(cell, model id, runs)`` in grid order."""
    per_seed = pd.concat([cell_rows(c, mid, runs) for c, mid, runs in results], ignore_index=True) \
        if results else pd.DataFrame(columns=["model", *overrides, "seed", "task", "method"])
    heads = pd.concat([head_rows(c, mid, runs) for c, mid, runs in results], ignore_index=True) \
        if results else pd.DataFrame()
    groups: dict[tuple, list[TaskRun]] = {}
    for cell, _, runs in results:
        groups.setdefault((cell.model, *cell.override_values().values()), []).extend(runs)
    if per_seed.empty:
        return GridTables(per_seed, pd.DataFrame(), pd.DataFrame(), pd.DataFrame(), heads, tuple(overrides))
    return GridTables(per_seed, by_task(per_seed, overrides), by_model(per_seed, overrides),
                      seed_stability(groups, overrides), heads, tuple(overrides))


__all__ = ["METRICS", "TABLE_FILES", "GridTables", "by_model", "by_task", "cell_rows", "grid_tables", "head_rows",
           "seed_stability"]
