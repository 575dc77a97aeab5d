"""Does bfloat16 on the CPU change SITE's alphas or accuracy beyond the seed noise? (issue #17)

    OMP_NUM_THREADS=1 python benchmarks/bf16_accuracy.py [--out results/fv57] [--model gemma-3-270m]

Reads, never computes, the results store: SITE at the report's settings in float32 (the page's
runs, ``python -m site_interp.report``) and in bfloat16 (``python -m site_interp.bench --dtype
bfloat16 --methods site --seeds 0 1 2 --out results/fv57 ...``), on the tasks and seeds both have.
It prints, per metric, the paired difference bf16 - fp32 (same task, same seed) with its interval
over tasks and seeds, beside the yardstick: the same statistic between two float32 seeds. Then
how far the alphas move (correlation and the heads SITE selects, alpha > 0.5) under each change,
and the seconds the artifacts recorded per stage. Precision is "within the seed noise" when its
interval holds zero and its typical per-task change is no larger than a change of seed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from site_interp.loading import resolve_model_id
from site_interp.stats import hierarchical_ci
from site_interp.studies import evidence as ev
from site_interp.studies.comparison import collect_results, seed_out
from site_interp.studies.report_runs import alphas_by_seed, stage_seconds
from site_interp.studies.results_data import ReportConfig
from site_interp.tasks import load_task_dir


def _scores(model_id: str, tasks, cfg: ReportConfig, out: str) -> pd.DataFrame:
    results = collect_results(model_id, tasks, cfg.comparison(("site",), cfg.seeds, tasks), out, progress=False,
                              compute=False)
    return ev.score_frame(results)


def _jaccard(a: np.ndarray, b: np.ndarray) -> float:
    sa, sb = a > 0.5, b > 0.5
    union = (sa | sb).sum()
    return float((sa & sb).sum() / union) if union else 1.0


def _change(groups: list[list[float]]) -> dict:
    """Mean signed change over tasks (seeds averaged first), its interval, and the mean |change|."""
    groups = [g for g in groups if g]
    means = [float(np.mean(g)) for g in groups]
    lo, hi = hierarchical_ci(groups)
    return {"mean": float(np.mean(means)), "lo": lo, "hi": hi,
            "mean_abs": float(np.mean([np.mean(np.abs(g)) for g in groups])), "tasks": len(groups),
            "pairs": sum(len(g) for g in groups)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results/fv57", help="the results store (results/fv57)")
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--data-dir", default="../shared/data/fv57")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    cfg = ReportConfig()
    tasks = list(load_task_dir(args.data_dir).values())
    fp32, bf16 = resolve_model_id(args.model), resolve_model_id(args.model, dtype=torch.bfloat16)
    s32, s16 = _scores(fp32, tasks, cfg, args.out), _scores(bf16, tasks, cfg, args.out)
    if s16.empty:
        print(f"no bfloat16 SITE results for {bf16} under {args.out}: run the bench command of this script's "
              "docstring first", file=sys.stderr)
        return 2
    key = ["task", "seed", "metric"]
    both = s32.merge(s16, on=key, suffixes=("_fp32", "_bf16"))
    names = sorted(set(both["task"]))
    seeds = sorted(set(both["seed"]))
    report: dict = {"model": args.model, "tasks": names, "seeds": seeds, "metrics": {}}
    print(f"{args.model}: SITE in float32 vs bfloat16 on {len(names)} tasks x seeds {seeds} "
          f"(the report's settings; store {args.out})\n")
    print("| metric | fp32 | bf16 | bf16 - fp32 [95% CI] | mean abs per task | fp32 seed a - seed b [95% CI] | mean abs per task |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for metric in ev.METRICS:
        sub = both[both["metric"] == metric]
        if sub.empty:
            continue
        prec = _change([list(g["accuracy_bf16"] - g["accuracy_fp32"]) for _, g in sub.groupby("task")])
        seed_groups = []
        own = s32[(s32["metric"] == metric) & s32["task"].isin(names)]
        for _, g in own.groupby("task"):
            acc = dict(zip(g["seed"], g["accuracy"]))
            seed_groups.append([acc[b] - acc[a] for a, b in itertools.combinations(sorted(acc), 2)])
        noise = _change(seed_groups) if any(seed_groups) else None
        report["metrics"][metric] = {"fp32": float(sub["accuracy_fp32"].mean()), "bf16": float(sub["accuracy_bf16"].mean()),
                                     "precision": prec, "seed": noise}
        ns = (f"{noise['mean']:+.2f} [{noise['lo']:+.2f}, {noise['hi']:+.2f}] | {noise['mean_abs']:.1f}"
              if noise else "— | —")
        print(f"| {metric} | {sub['accuracy_fp32'].mean():.1f} | {sub['accuracy_bf16'].mean():.1f} | "
              f"{prec['mean']:+.2f} [{prec['lo']:+.2f}, {prec['hi']:+.2f}] | {prec['mean_abs']:.1f} | {ns} |")
    configs = {s: cfg.seed_run(s) for s in cfg.seeds}
    outs = {s: seed_out(args.out, s) for s in cfg.seeds}
    selected = [t for t in tasks if t.name in names]
    a32, a16 = alphas_by_seed(fp32, selected, configs, outs), alphas_by_seed(bf16, selected, configs, outs)
    prec_r, prec_j, seed_r, seed_j = [], [], [], []
    for t in names:
        for s in seeds:
            if s in a32.get(t, {}) and s in a16.get(t, {}):
                x, y = a32[t][s].ravel(), a16[t][s].ravel()
                prec_r.append(float(np.corrcoef(x, y)[0, 1]))
                prec_j.append(_jaccard(x, y))
        for a, b in itertools.combinations(sorted(a32.get(t, {})), 2):
            x, y = a32[t][a].ravel(), a32[t][b].ravel()
            seed_r.append(float(np.corrcoef(x, y)[0, 1]))
            seed_j.append(_jaccard(x, y))
    report["alphas"] = {"precision": {"r": float(np.mean(prec_r)), "jaccard": float(np.mean(prec_j)), "n": len(prec_r)},
                        "seed": {"r": float(np.mean(seed_r)) if seed_r else None,
                                 "jaccard": float(np.mean(seed_j)) if seed_j else None, "n": len(seed_r)}}
    print("\n| alphas | correlation | Jaccard of selected heads (alpha > 0.5) | pairs |")
    print("|---|---:|---:|---:|")
    print(f"| fp32 vs bf16, same seed | {np.mean(prec_r):.3f} | {np.mean(prec_j):.3f} | {len(prec_r)} |")
    if seed_r:
        print(f"| fp32 seed a vs seed b | {np.mean(seed_r):.3f} | {np.mean(seed_j):.3f} | {len(seed_r)} |")
    paired_outs = [outs[s] for s in seeds]
    t32, t16 = stage_seconds(fp32, selected, paired_outs), stage_seconds(bf16, selected, paired_outs)
    report["seconds"] = {"fp32": t32, "bf16": t16}
    print("\nSeconds the artifacts recorded, each under the load its run had (not a controlled comparison; "
          "for speed per stage run floor.py --small with and without --dtype bfloat16, one after the other):\n")
    print("| stage (same tasks and seeds) | fp32 | bf16 | fp32 / bf16 |")
    print("|---|---:|---:|---:|")
    for stage in ("embedding", "SITE training", "site (fit + eval)"):
        if stage in t32 and stage in t16:
            print(f"| {stage} | {t32[stage]:.0f} | {t16[stage]:.0f} | {t32[stage] / t16[stage]:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
