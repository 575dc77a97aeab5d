"""The numbers behind the results page: seed-aware method tables, paired differences, alpha
binarity, patching over all tasks, head overlap vs transfer, and the paper's claims.

Everything here works on what the studies already computed (the comparison's per-query records,
the alphas, the patching and transfer results); nothing runs a model. Accuracies are percentages.

Intervals are over **tasks and seeds** (:func:`~site_interp.stats.hierarchical_ci`): a difference
"survives the seed noise" when that interval excludes zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as sps

from site_interp.stats import hierarchical_ci
from site_interp.tasks.kinds import KINDS

Metric = Literal["first_token", "exact_match"]
METRICS: tuple[Metric, ...] = ("first_token", "exact_match")
Verdict = Literal["holds", "does not hold", "unresolved", "not measured"]


def score_frame(results: Sequence[Mapping]) -> pd.DataFrame:
    """One row per (task, method, seed, metric): accuracy (%) over that run's test queries.

    ``results`` are :func:`~site_interp.studies.comparison.collect_results` dicts; a metric a run
    did not record (exact match off) gives no row.
    """
    rows = []
    for r in results:
        for metric in METRICS:
            values = [float(x[metric]) for x in r["records"] if x.get(metric) is not None]
            if values:
                rows.append({"task": r["task"], "method": r["method"], "seed": int(r["seed"]), "metric": metric,
                             "accuracy": 100 * float(np.mean(values)), "n": len(values),
                             "params": float(r.get("params", 0)), "fit_s": float(r.get("fit_s", 0.0)),
                             "eval_s": float(r.get("eval_s", 0.0))})
    return pd.DataFrame(rows, columns=["task", "method", "seed", "metric", "accuracy", "n", "params", "fit_s", "eval_s"])


def _groups(scores: pd.DataFrame, method: str, metric: Metric) -> dict[str, list[float]]:
    g = scores[(scores["method"] == method) & (scores["metric"] == metric)]
    return {task: sub.sort_values("seed")["accuracy"].tolist() for task, sub in g.groupby("task", sort=False)}


def method_summary(scores: pd.DataFrame, kinds: Mapping[str, str], methods: Sequence[str]) -> pd.DataFrame:
    """Per (method, metric): mean over tasks of the per-task seed mean, its interval over tasks and
    seeds, the tasks and seeds it ran, the spread of the task-mean between seeds (max - min), and
    the means over each task kind."""
    rows = []
    for method in methods:
        for metric in METRICS:
            groups = _groups(scores, method, metric)
            if not groups:
                continue
            task_means = {t: float(np.mean(v)) for t, v in groups.items()}
            lo, hi = hierarchical_ci(list(groups.values()))
            sub = scores[(scores["method"] == method) & (scores["metric"] == metric)]
            per_seed = sub.groupby("seed")["accuracy"].agg(["mean", "count"])
            full = per_seed[per_seed["count"] == len(groups)]["mean"]  # seeds that ran every task
            row = {"method": method, "metric": metric, "mean": float(np.mean(list(task_means.values()))),
                   "lo": lo, "hi": hi, "tasks": len(groups), "seeds": int(sub["seed"].nunique()),
                   "fewest_seeds": min(len(v) for v in groups.values()),
                   "seed_spread": float(full.max() - full.min()) if len(full) > 1 else float("nan"),
                   "params": float(sub["params"].mean())}
            for kind in KINDS:
                vals = [m for t, m in task_means.items() if kinds.get(t) == kind]
                row[kind] = float(np.mean(vals)) if vals else float("nan")
                row[f"{kind}_tasks"] = len(vals)
            rows.append(row)
    return pd.DataFrame(rows)


def per_task_table(scores: pd.DataFrame, methods: Sequence[str], metric: Metric) -> pd.DataFrame:
    """Tasks x methods: seed mean (%) and, where there are several seeds, their spread (max - min)."""
    sub = scores[(scores["metric"] == metric) & scores["method"].isin(methods)]
    agg = sub.groupby(["task", "method"], sort=False)["accuracy"].agg(["mean", "min", "max", "count"]).reset_index()
    agg["spread"] = np.where(agg["count"] > 1, agg["max"] - agg["min"], np.nan)
    return agg.rename(columns={"count": "seeds"})[["task", "method", "mean", "spread", "seeds"]]


@dataclass
class Difference:
    """A paired per-task difference ``a - b`` (percentage points)."""

    a: str
    b: str
    metric: Metric
    mean: float
    lo: float
    hi: float
    tasks: int
    wins: int
    losses: int
    seeds_a: int
    """The most seeds ``a`` has on a task (and ``seeds_b`` for ``b``)."""
    seeds_b: int
    fewest_seeds_a: int
    """The fewest seeds ``a`` has on a task: below ``seeds_a`` while a store is still running its
    seeds. Likewise ``fewest_seeds_b``."""
    fewest_seeds_b: int

    @property
    def survives(self) -> bool:
        """The interval over tasks and seeds excludes zero."""
        return bool(self.lo > 0 or self.hi < 0)


def paired_difference(scores: pd.DataFrame, a: str, b: str, metric: Metric) -> Difference | None:
    """``a - b`` per task on the tasks both ran. Seeds are paired by seed number where both
    methods have it; a method with one seed is compared with the other's seed mean."""
    ga, gb = _by_seed(scores, a, metric), _by_seed(scores, b, metric)
    common = [t for t in ga if t in gb]
    if not common:
        return None
    groups = []
    for t in common:
        shared = sorted(set(ga[t]) & set(gb[t]))
        if len(shared) > 1:
            groups.append([ga[t][s] - gb[t][s] for s in shared])
        else:
            groups.append([float(np.mean(list(ga[t].values())) - np.mean(list(gb[t].values())))])
    means = np.array([np.mean(g) for g in groups])
    lo, hi = hierarchical_ci(groups)
    counts_a, counts_b = [len(ga[t]) for t in common], [len(gb[t]) for t in common]
    return Difference(a, b, metric, float(means.mean()), lo, hi, len(common), int((means > 0).sum()),
                      int((means < 0).sum()), max(counts_a), max(counts_b), min(counts_a), min(counts_b))


def seed_range(most: int, fewest: int) -> str:
    """``"3"``, or ``"1–3"`` where some tasks have fewer seeds than others."""
    return f"{fewest}–{most}" if fewest < most else str(most)


def _by_seed(scores: pd.DataFrame, method: str, metric: Metric) -> dict[str, dict[int, float]]:
    sub = scores[(scores["method"] == method) & (scores["metric"] == metric)]
    out: dict[str, dict[int, float]] = {}
    for r in sub.itertuples():
        out.setdefault(r.task, {})[int(r.seed)] = float(r.accuracy)
    return out


def metric_gaps(scores: pd.DataFrame, results: Sequence[Mapping], method: str, top: int = 8) -> pd.DataFrame:
    """Tasks where first-token and exact-match accuracy of ``method`` differ most, with what
    their answers look like (share that are numbers, mean words per answer)."""
    ft = scores[(scores["method"] == method) & (scores["metric"] == "first_token")].groupby("task")["accuracy"].mean()
    em = scores[(scores["method"] == method) & (scores["metric"] == "exact_match")].groupby("task")["accuracy"].mean()
    both = pd.concat([ft.rename("first_token"), em.rename("exact_match")], axis=1).dropna()
    if both.empty:
        return pd.DataFrame(columns=["task", "first_token", "exact_match", "gap", "numeric", "words"])
    targets: dict[str, list[str]] = {}
    for r in results:
        if r["method"] == method and r["task"] not in targets:
            targets[r["task"]] = [str(x["target"]) for x in r["records"]]
    both["gap"] = both["first_token"] - both["exact_match"]
    both["numeric"] = [100 * np.mean([_is_number(t) for t in targets.get(task, [])] or [np.nan]) for task in both.index]
    both["words"] = [np.mean([len(t.split()) for t in targets.get(task, [])] or [np.nan]) for task in both.index]
    out = both.reindex(both["gap"].abs().sort_values(ascending=False).index).head(top)
    return out.rename_axis("task").reset_index()


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
        return True
    except ValueError:
        return False


def binary_share(alphas: Mapping[str, Sequence[np.ndarray]], low: float = 0.1, high: float = 0.9) -> dict[str, float]:
    """Share (%) of alphas below ``low`` or above ``high``: per run, then mean over tasks of the
    per-task seed mean, with the interval over tasks and seeds; also the shares below and above."""
    groups = {t: [100 * float(((np.asarray(a) < low) | (np.asarray(a) > high)).mean()) for a in runs]
              for t, runs in alphas.items() if len(runs)}
    if not groups:
        return {"share": float("nan"), "lo": float("nan"), "hi": float("nan"), "below": float("nan"),
                "above": float("nan"), "tasks": 0}
    lo, hi = hierarchical_ci(list(groups.values()))
    flat = [np.asarray(a) for runs in alphas.values() for a in runs]
    return {"share": float(np.mean([np.mean(v) for v in groups.values()])), "lo": lo, "hi": hi,
            "below": 100 * float(np.mean([(a < low).mean() for a in flat])),
            "above": 100 * float(np.mean([(a > high).mean() for a in flat])), "tasks": len(groups)}


def patching_claim(patching: pd.DataFrame) -> dict[str, float]:
    """``patching``: one row per task with ``top, bottom, random, site, zero_shot, k`` accuracies
    (%). Means over tasks, top - bottom with an interval over tasks, and top-k as a share of SITE."""
    if patching.empty:
        return {}
    diff = (patching["top"] - patching["bottom"]).to_numpy()
    lo, hi = hierarchical_ci([[d] for d in diff])
    site = patching["site"].mean()
    return {"tasks": len(patching), "top": float(patching["top"].mean()), "bottom": float(patching["bottom"].mean()),
            "random": float(patching["random"].mean()), "site": float(site),
            "zero_shot": float(patching["zero_shot"].mean()), "k_mean": float(patching["k"].mean()),
            "top_minus_bottom": float(diff.mean()), "lo": lo, "hi": hi,
            "top_share_of_site": float(100 * patching["top"].mean() / site) if site > 0 else float("nan")}


def mantel(x: pd.DataFrame, y: pd.DataFrame, n_perm: int = 2000, seed: int = 0) -> dict[str, float]:
    """Spearman correlation of two task x task matrices over ordered off-diagonal pairs, with a
    permutation p-value that shuffles the task labels of ``x`` (rows and columns together).

    Pairs that share a task are not independent, so a per-pair test would overstate the evidence;
    shuffling whole tasks keeps that dependence in the null (a Mantel test). Two-sided p.
    """
    tasks = [t for t in x.index if t in y.index and t in y.columns and t in x.columns]
    n = len(tasks)
    if n < 4:
        return {"rho": float("nan"), "p_value": float("nan"), "tasks": n, "pairs": 0}
    xv, yv = x.loc[tasks, tasks].to_numpy(float), y.loc[tasks, tasks].to_numpy(float)
    off = ~np.eye(n, dtype=bool)
    ok = off & ~np.isnan(yv)

    def rho(perm: np.ndarray) -> float:
        xp = xv[np.ix_(perm, perm)]
        m = ok & ~np.isnan(xp)
        a, b = xp[m], yv[m]
        if a.size < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
            return float("nan")  # a constant matrix has no rank correlation
        return float(sps.spearmanr(a, b).statistic)

    observed = rho(np.arange(n))
    if np.isnan(observed):
        return {"rho": float("nan"), "p_value": float("nan"), "tasks": n, "pairs": int(ok.sum())}
    rng = np.random.default_rng(seed)
    null = np.array([rho(rng.permutation(n)) for _ in range(n_perm)])
    null = null[~np.isnan(null)]
    p = (int(np.sum(np.abs(null) >= abs(observed) - 1e-12)) + 1) / (null.size + 1)
    return {"rho": observed, "p_value": p, "tasks": n, "pairs": int(ok.sum())}


def centred_transfer(matrix: pd.DataFrame) -> pd.DataFrame:
    """Transfer accuracy minus the mean of its column's off-diagonal entries: how much better
    task A's alphas serve task B than other tasks' alphas do (removes B's difficulty)."""
    m = matrix.copy().astype(float)
    for b in m.columns:
        others = [a for a in m.index if a != b]
        m[b] = m[b] - m.loc[others, b].mean()
    return m


def kind_separation(sim: pd.DataFrame, kinds: Mapping[str, str], n_perm: int = 2000, seed: int = 0) -> dict[str, float]:
    """Mean similarity of task pairs of the same kind vs of different kinds, with a permutation
    p-value (kind labels shuffled over tasks; one-sided: same-kind pairs more similar)."""
    tasks = [t for t in sim.index if t in kinds]
    if len(tasks) < 4 or len({kinds[t] for t in tasks}) < 2:
        return {}  # nothing to separate
    s = sim.loc[tasks, tasks].to_numpy(float)
    labels = np.array([kinds[t] for t in tasks])
    iu = np.triu_indices(len(tasks), 1)

    def gap(lab: np.ndarray) -> tuple[float, float]:
        same = (lab[:, None] == lab[None, :])[iu]
        v = s[iu]
        return float(np.nanmean(v[same])), float(np.nanmean(v[~same]))

    within, across = gap(labels)
    rng = np.random.default_rng(seed)
    null = np.array([np.subtract(*gap(rng.permutation(labels))) for _ in range(n_perm)])
    p = (int(np.sum(null >= within - across - 1e-12)) + 1) / (n_perm + 1)
    return {"within": within, "across": across, "p_value": p}


def verdict(lo: float, hi: float) -> Verdict:
    """From an interval of ``ours - reference``: above zero holds, below does not, else unresolved."""
    if np.isnan(lo) or np.isnan(hi):
        return "not measured"
    return "holds" if lo > 0 else "does not hold" if hi < 0 else "unresolved"


__all__ = ["METRICS", "Difference", "Metric", "Verdict", "binary_share", "centred_transfer", "kind_separation",
           "mantel", "method_summary", "metric_gaps", "paired_difference", "patching_claim", "per_task_table",
           "score_frame", "seed_range", "verdict"]
