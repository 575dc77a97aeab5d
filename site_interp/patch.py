"""``python -m site_interp.patch``: the patching study, transfer matrix and head-overlap clustering.

For every task: train (or reuse) the task embedding and alphas, evaluate 0-shot / ICL / SITE,
then hard-patch the task embedding into the top-k, bottom-k and random-k heads (and ablate the
top-k from full SITE) over a sweep of k. Across tasks: the alpha transfer matrix, Jaccard /
cosine / Spearman similarity of the alphas with a permutation null, hierarchical clustering,
and whether head overlap predicts transfer. Writes CSV/JSON and figures under
``<out>/<model>/study`` and prints a short summary.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pandas as pd

from site_interp.artifacts import ArtifactMismatchError, slug, write_json, write_text
from site_interp.figures import make_figures
from site_interp.patching import MODES, PatchConfig
from site_interp.pipeline import RunConfig, model_id, run_tasks
from site_interp.run import add_model_args, add_pipeline_args, add_task_args, config_from_args, load_from_args
from site_interp.study import METRICS, StudyConfig, run_study, stability_study
from site_interp.tasks import TaskError, resolve_tasks

#: Default study: six built-in tasks of different kinds (about 15 minutes on a 2-core CPU).
DEFAULT_TASKS = ("capitalize", "first_letter", "country_capital", "past_tense", "plural", "next_item")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m site_interp.patch", description=__doc__.split("\n\n")[1])
    add_model_args(p)
    add_task_args(p, DEFAULT_TASKS)
    add_pipeline_args(p)
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


def _variants(cfg: RunConfig, seeds: Sequence[int], batch_sizes: Sequence[int]) -> dict[str, RunConfig]:
    """Other seeds (everything seeded changes: prompts, demos, order) and batch sizes for stability."""
    out = {}
    for seed in seeds:
        out[f"seed{seed}"] = replace(cfg, embedding=replace(cfg.embedding, seed=seed), site=replace(cfg.site, seed=seed))
    for bs in batch_sizes:
        steps = max(1, cfg.site.steps * cfg.site.batch_size // bs)
        out[f"batch{bs}"] = replace(cfg, site=replace(cfg.site, batch_size=bs, steps=steps,
                                                      eval_every=max(1, cfg.site.eval_every * steps // cfg.site.steps)))
    return out


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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    progress = not args.quiet
    try:
        tasks = resolve_tasks(args.tasks, args.data_dir, seed=args.seed)
        run_cfg = config_from_args(args)
        study_cfg = StudyConfig(
            patch=PatchConfig(ks=tuple(args.ks) if args.ks else None, modes=tuple(args.modes), n_random=args.n_random,
                              n_test=args.n_test or None, metric=args.metric, max_new_tokens=args.max_new_tokens,
                              seed=args.seed),
            transfer=not args.no_transfer, top_k=args.top_k, cluster_metric=args.cluster_metric,
            n_perm=args.n_perm, seed=args.seed,
        )
        t0 = time.perf_counter()
        bridge = load_from_args(args)
        print(f"model {model_id(bridge)}: {bridge.cfg.n_layers} layers x {bridge.cfg.n_heads} heads, "
              f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
        t1 = time.perf_counter()
        runs = run_tasks(bridge, tasks, run_cfg, args.out, progress=progress)
        t_pipeline = time.perf_counter() - t1
        root = Path(args.out) / slug(model_id(bridge))
        t2 = time.perf_counter()
        result = run_study(bridge, runs, study_cfg, root / "study", progress=progress)
        stability = None
        variants = _variants(run_cfg, args.stability_seeds, args.stability_batch_sizes)
        if variants:
            stability = stability_study(bridge, runs, variants, root, top_k=args.top_k, progress=progress)
            write_text(root / "study" / "stability.csv", stability[0].to_csv(index=False))
            write_json(root / "study" / "stability.json", {"variants": {k: v.to_dict() for k, v in variants.items()},
                                                          **stability[1]})
        t_study = time.perf_counter() - t2
    except (TaskError, ArtifactMismatchError, FloatingPointError, ValueError, ModuleNotFoundError,
            FileNotFoundError, KeyError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
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


if __name__ == "__main__":
    raise SystemExit(main())
