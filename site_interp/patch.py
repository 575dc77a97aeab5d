"""``python -m site_interp.patch``: SITE on some tasks, then the whole study around it.

For every task: train (or reuse) the task embedding and alphas, evaluate 0-shot / ICL / SITE,
then hard-patch the task embedding into the top-k, bottom-k and random-k heads (and ablate the
top-k from full SITE) over a sweep of k. Across tasks: the alpha transfer matrix, Jaccard /
cosine / Spearman similarity of the alphas with a permutation null, hierarchical clustering,
and whether head overlap predicts transfer (:mod:`site_interp.studies`). Writes CSV/JSON and
figures under ``<out>/<model>/study`` and ``<out>/<model>/figures`` and prints a short summary.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from site_interp import cli
from site_interp.artifacts import slug, write_json, write_text
from site_interp.pipeline import model_id, run_tasks
from site_interp.plots.run_figures import make_figures, save_alpha_heatmaps
from site_interp.studies.patching import MODES, PatchConfig
from site_interp.studies.runner import StudyConfig, run_study
from site_interp.studies.similarity import METRICS
from site_interp.studies.stability import head_set_stability, variant_configs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m site_interp.patch", description=__doc__.split("\n\n")[1])
    cli.add_model_args(p)
    cli.add_task_args(p)
    cli.add_pipeline_args(p)
    g = p.add_argument_group("patching study")
    g.add_argument("--ks", type=int, nargs="+", default=None,
                   help="numbers of heads to patch (default 1 2 4 ... all heads, plus #heads with alpha > 0.5)")
    g.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                   help="patch: hard-patch t into top/bottom/random-k heads; ablate: SITE with top-k alphas zeroed")
    g.add_argument("--n-random", type=int, default=5, help="seeds of the random-k head sets (5)")
    g.add_argument("--metric", choices=["first_token", "exact_match"], default="first_token",
                   help="patching accuracy metric (exact match generates: slower)")
    g.add_argument("--no-transfer", action="store_true", help="skip the cross-task transfer matrix")
    g.add_argument("--top-k", type=int, default=None,
                   help="head sets for overlap: top-k heads by alpha (default: heads with alpha > 0.5)")
    g.add_argument("--cluster-metric", choices=list(METRICS), default="jaccard", help="similarity to cluster on")
    g.add_argument("--n-perm", type=int, default=1000, help="permutations of the overlap null (1000)")
    g.add_argument("--stability-seeds", type=int, nargs="*", default=[],
                   help="also retrain every task with these seeds and report how stable its head set is")
    g.add_argument("--stability-batch-sizes", type=int, nargs="*", default=[],
                   help="also retrain with these batch sizes (steps scaled to keep steps x batch) for stability")
    g.add_argument("--formats", nargs="+", default=["png"], choices=["png", "pdf", "svg"], help="figure formats")
    return p


def _headline(result) -> str:
    s = result.patching_summary()
    lines = []
    for task, g in s.groupby("task", sort=False):
        refs = result.patching[task].references
        ks = sorted(g["k"].unique())
        show = [k for k in ks if k in (1, 4, 16)] + [result.patching[task].n_selected]
        parts = []
        for k in dict.fromkeys(show):
            acc = g[g.k == k].set_index("selection")["accuracy"]
            parts.append(f"k={k}: top {acc.get('top', float('nan')):.0f} / bottom {acc.get('bottom', float('nan')):.0f}"
                         f" / random {acc.get('random', float('nan')):.0f}")
        ref = ", ".join(f"{m} {v:.0f}" for m, v in refs.items())
        lines.append(f"  {task} ({ref}; {result.patching[task].n_selected} heads > 0.5)\n    " + "\n    ".join(parts))
    return "\n".join(lines)


def body(args: argparse.Namespace) -> int:
    progress = not args.quiet
    tasks = cli.tasks_from_args(args)
    cli.check_output_dir(args.out)
    run_cfg = cli.config_from_args(args)
    study_cfg = StudyConfig(
        patch=PatchConfig(ks=tuple(args.ks) if args.ks else None, modes=tuple(args.modes), n_random=args.n_random,
                          n_test=args.n_test or None, metric=args.metric, max_new_tokens=args.max_new_tokens,
                          seed=args.seed),
        transfer=not args.no_transfer, top_k=args.top_k, cluster_metric=args.cluster_metric,
        n_perm=args.n_perm, seed=args.seed,
    )
    bridge = cli.load_from_args(args)
    t1 = time.perf_counter()
    runs = run_tasks(bridge, tasks, run_cfg, args.out, progress=progress)
    save_alpha_heatmaps(runs, model_id(bridge))
    t_pipeline = time.perf_counter() - t1
    root = Path(args.out) / slug(model_id(bridge))
    t2 = time.perf_counter()
    result = run_study(bridge, runs, study_cfg, root / "study", progress=progress)
    stability = None
    variants = variant_configs(run_cfg, args.stability_seeds, args.stability_batch_sizes)
    if variants:
        stability = head_set_stability(bridge, runs, variants, root, top_k=args.top_k, progress=progress)
        write_text(root / "study" / "stability.csv", stability[0].to_csv(index=False))
        write_json(root / "study" / "stability.json", {"variants": {k: v.to_dict() for k, v in variants.items()},
                                                      **stability[1]})
    t_study = time.perf_counter() - t2
    figures = make_figures(root, formats=args.formats)
    summary = pd.concat([r.summary() for r in runs], ignore_index=True)
    print("\nHeld-out first-token accuracy (%):")
    print(summary.pivot_table(index="task", columns="method", values="first_token", sort=False).round(1).to_string())
    print(f"\nPatching the task embedding into k heads (first-token accuracy, %; random = mean of {args.n_random} seeds):")
    print(_headline(result))
    if result.transfer is not None:
        d = result.transfer.diagonal_summary()
        print(f"\nTransfer: own alphas {d['diagonal_mean']:.1f}%, other tasks' alphas {d['off_diagonal_mean']:.1f}%, "
              f"uniform 0.5 {d['uniform_0.5_mean']:.1f}%, 0-shot {d['zero_shot_mean']:.1f}%")
    if result.overlap is not None:
        o = result.overlap
        print(f"Head overlap (Jaccard): mean {o['jaccard'].mean():.2f} vs permutation null {o['null_mean'].mean():.2f}; "
              f"{int((o['p_value'] < 0.05).sum())}/{len(o)} pairs above the null at p < 0.05")
        print(f"Clustering order ({args.cluster_metric}): {' | '.join(result.order)}")
    if stability is not None:
        w = stability[1]
        print(f"Head-set stability ({len(variants) + 1} runs per task): Jaccard within a task {w['within']:.2f}, "
              f"across tasks {w['across']:.2f}")
        print(stability[0].round(2).to_string(index=False))
    if result.relation is not None and result.relation.get("pearson_r") is not None:
        r = result.relation
        print(f"Overlap vs transfer: Pearson r = {r['pearson_r']:.2f} (95% CI {r['pearson_ci'][0]:.2f} to "
              f"{r['pearson_ci'][1]:.2f}, {r['n']} task pairs)")
    print(f"\npipeline {t_pipeline:.0f} s, study {t_study:.0f} s; {len(figures)} figure files in {root / 'figures'}")
    print(f"tables: {root / 'study'}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
