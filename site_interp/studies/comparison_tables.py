"""Tables of the method comparison (:mod:`site_interp.studies.comparison`): per task, per method,
with bootstrap intervals and costs.

* **per task**: accuracy (%) of every method on every task (averaged over seeds), with a 95%
  bootstrap interval over that task's queries (all seeds pooled);
* **summary**: per method the mean over tasks, a 95% bootstrap interval over tasks (the
  variation that matters when the claim is "method A beats method B on this kind of task"),
  trainable parameters and seconds per task per stage;
* **paired differences** (SITE - ICL, SITE - LoRA, ...): mean over tasks of the per-task
  difference, with a bootstrap interval over tasks, on the tasks both methods ran.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from site_interp.artifacts import provenance, write_json, write_text
from site_interp.stats import bootstrap_ci


def display_names(n_shots: int) -> dict[str, str]:
    return {"0-shot": "0-shot", "icl": f"{n_shots}-shot ICL", "uniform-0.5": "uniform alpha 0.5",
            "uniform-1": "uniform alpha 1", "site": "SITE", "fv": "FV", "tv": "TV", "lora": "LoRA"}


PAIRS = (("site", "icl"), ("site", "lora"), ("site", "uniform-0.5"), ("site", "fv"), ("site", "tv"), ("lora", "icl"))
"""Paired differences reported when both methods ran."""


@dataclass
class ComparisonTables:
    """The benchmark's tables (percent accuracy)."""

    model_id: str
    """The model."""
    per_task: pd.DataFrame
    """One row per (task, method): accuracy, its query-bootstrap interval, n queries, seeds."""
    summary: pd.DataFrame
    """One row per method: mean over tasks, task-bootstrap interval, tasks, parameters, seconds."""
    pairs: pd.DataFrame
    """Paired per-task differences between methods, with task-bootstrap intervals."""
    metric: str = "first_token"
    """The accuracy metric (``first_token`` or ``exact_match``)."""
    names: dict[str, str] = field(default_factory=dict)
    """Method -> display name."""

    def to_dataframe(self) -> pd.DataFrame:
        return self.per_task

    def wide(self) -> pd.DataFrame:
        """Tasks as rows, methods as columns (accuracy %)."""
        w = self.per_task.pivot_table(index="task", columns="method", values="accuracy", sort=False)
        order = [m for m in self.names if m in w.columns]
        return w[order].rename(columns=self.names)

    def markdown(self) -> str:
        s = self.summary
        lines = [f"Held-out {self.metric.replace('_', '-')} accuracy (%) on {self.model_id}.", "",
                 "| method | mean | 95% CI (tasks) | tasks | trainable params | embedding s/task | fit s/task | eval s/task |",
                 "|---|---:|---|---:|---:|---:|---:|---:|"]
        for r in s.itertuples():
            lines.append(f"| {self.names.get(r.method, r.method)} | {r.mean:.1f} | {r.lo:.1f} – {r.hi:.1f} | {r.tasks} "
                         f"| {int(r.params):,} | {r.embedding_s:.1f} | {r.fit_s:.1f} | {r.eval_s:.1f} |")
        if len(self.pairs):
            lines += ["", "| difference (per task, paired) | mean | 95% CI (tasks) | tasks | wins / ties / losses |",
                      "|---|---:|---|---:|---|"]
            for r in self.pairs.itertuples():
                lines.append(f"| {self.names.get(r.a, r.a)} − {self.names.get(r.b, r.b)} | {r.mean:+.1f} "
                             f"| {r.lo:+.1f} – {r.hi:+.1f} | {r.tasks} | {r.wins} / {r.ties} / {r.losses} |")
        w = self.wide()
        lines += ["", "| task | " + " | ".join(w.columns) + " |", "|---|" + "---:|" * len(w.columns)]
        for task, row in w.iterrows():
            lines.append(f"| {task} | " + " | ".join("" if np.isnan(v) else f"{v:.0f}" for v in row) + " |")
        return "\n".join(lines)

    def write(self, root: str | Path, *, command: Sequence[str], config: dict, wall_s: float) -> None:
        root = Path(root)
        write_text(root / "bench_per_task.csv", self.per_task.to_csv(index=False))
        write_text(root / "bench_summary.csv", self.summary.to_csv(index=False))
        write_json(root / "bench.json", {
            "model_id": self.model_id, "metric": self.metric, "command": " ".join(command), "wall_s": wall_s,
            "config": config, "provenance": provenance(config.get("seeds", [None])[0]),
            "summary": self.summary.to_dict(orient="records"), "pairs": self.pairs.to_dict(orient="records"),
            "per_task": self.per_task.to_dict(orient="records"),
        })
        write_text(root / "bench.md", f"`{' '.join(command)}` ({wall_s / 60:.1f} min)\n\n" + self.markdown() + "\n")


def _task_ci(values: Sequence[float]) -> tuple[float, float]:
    return bootstrap_ci(values) if len(values) > 1 else (float(values[0]), float(values[0]))


def build_tables(results: list[dict], model_id: str, *, n_shots: int = 10, metric: str = "first_token") -> ComparisonTables:
    """``results``: one dict per (seed, task, method) with ``records``, ``params``, ``fit_s``,
    ``eval_s`` and ``stages`` (``embedding_s``, ``site_training_s``, ``fv_ranking_s``)."""
    names = display_names(n_shots)
    rows = []
    by_key: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        by_key.setdefault((r["task"], r["method"]), []).append(r)
    for (task, method), group in by_key.items():
        per_seed = [[float(x[metric]) for x in g["records"] if x.get(metric) is not None] for g in group]
        per_seed = [v for v in per_seed if v]
        if not per_seed:
            continue
        pooled = [v for seed_vals in per_seed for v in seed_vals]
        lo, hi = bootstrap_ci(pooled)
        st = [g["stages"] for g in group]
        rows.append({
            "task": task, "method": method, "accuracy": 100 * float(np.mean([np.mean(v) for v in per_seed])),
            "lo": 100 * lo, "hi": 100 * hi, "n": len(pooled), "seeds": len(per_seed),
            "params": float(np.mean([g["params"] for g in group])),
            "embedding_s": float(np.mean([s["embedding_s"] for s in st])),
            "fit_s": float(np.mean([g["fit_s"] + s["site_training_s"] + s["fv_ranking_s"] for g, s in zip(group, st)])),
            "eval_s": float(np.mean([g["eval_s"] for g in group])),
        })
    per_task = pd.DataFrame(rows, columns=["task", "method", "accuracy", "lo", "hi", "n", "seeds", "params",
                                           "embedding_s", "fit_s", "eval_s"])
    summary_rows = []
    for method in [m for m in names if m in set(per_task["method"])]:
        g = per_task[per_task["method"] == method]
        lo, hi = _task_ci(g["accuracy"].tolist())
        summary_rows.append({"method": method, "name": names[method], "mean": g["accuracy"].mean(), "lo": lo, "hi": hi,
                             "tasks": len(g), "params": g["params"].mean(), "embedding_s": g["embedding_s"].mean(),
                             "fit_s": g["fit_s"].mean(), "eval_s": g["eval_s"].mean()})
    summary = pd.DataFrame(summary_rows, columns=["method", "name", "mean", "lo", "hi", "tasks", "params",
                                                  "embedding_s", "fit_s", "eval_s"])
    wide = per_task.pivot_table(index="task", columns="method", values="accuracy") if len(per_task) else pd.DataFrame()
    pair_rows = []
    for a, b in PAIRS:
        if a in wide and b in wide:
            both = wide[[a, b]].dropna()
            if len(both) == 0:
                continue
            diff = (both[a] - both[b]).tolist()
            lo, hi = _task_ci(diff)
            pair_rows.append({"a": a, "b": b, "mean": float(np.mean(diff)), "lo": lo, "hi": hi, "tasks": len(diff),
                              "wins": int(sum(d > 0 for d in diff)), "ties": int(sum(d == 0 for d in diff)),
                              "losses": int(sum(d < 0 for d in diff))})
    pairs = pd.DataFrame(pair_rows, columns=["a", "b", "mean", "lo", "hi", "tasks", "wins", "ties", "losses"])
    return ComparisonTables(model_id=model_id, per_task=per_task, summary=summary, pairs=pairs, metric=metric, names=names)


def load_tables(path: str | Path) -> ComparisonTables:
    """The tables of a finished run, from its ``bench.json``."""
    data = json.loads(Path(path).read_text())
    names = display_names(data.get("config", {}).get("run", {}).get("eval", {}).get("n_shots", 10))
    return ComparisonTables(model_id=data["model_id"], per_task=pd.DataFrame(data["per_task"]),
                       summary=pd.DataFrame(data["summary"]), pairs=pd.DataFrame(data["pairs"]),
                       metric=data.get("metric", "first_token"), names=names)


__all__ = ["PAIRS", "ComparisonTables", "build_tables", "display_names", "load_tables"]
