"""``python -m site_interp.run``: SITE end to end (embedding, alphas, evaluation) on some tasks.

Prints a table of held-out accuracy (0-shot, N-shot ICL, SITE; first token and exact match) and
writes per-task artifacts under ``--out``. A rerun with the same settings reuses the cached
embeddings and alphas; other settings in the same ``--out`` are refused with a clear message.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd

from site_interp import cli
from site_interp.artifacts import slug, write_json, write_text
from site_interp.pipeline import model_id, run_tasks
from site_interp.plots.run_figures import save_alpha_heatmaps


def format_table(summary: pd.DataFrame) -> str:
    """Tasks as rows; per method first-token / exact-match accuracy (percent)."""
    df = summary.copy()
    cols = ["first_token"] + (["exact_match"] if "exact_match" in df else [])
    wide = df.pivot_table(index="task", columns="method", values=cols, sort=False)
    wide.columns = [f"{m} {'1st-tok' if c == 'first_token' else 'exact'}" for c, m in wide.columns]
    methods = list(dict.fromkeys(df["method"]))
    order = [f"{m} {k}" for k in ("1st-tok", "exact") for m in methods if f"{m} {k}" in wide.columns]
    wide = wide[order]
    wide.loc["mean"] = wide.mean()
    return wide.round(1).to_string()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m site_interp.run",
        description="Run SITE (task embedding, soft head selection, 0-shot inference) and report held-out "
                    "accuracy next to 0-shot and N-shot ICL.",
    )
    cli.add_model_args(p)
    cli.add_task_args(p)
    cli.add_pipeline_args(p)
    return p


def body(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    tasks = cli.tasks_from_args(args)
    cli.check_output_dir(args.out)
    cfg = cli.config_from_args(args)
    t0 = time.perf_counter()
    bridge = cli.load_from_args(args)
    load_s = time.perf_counter() - t0
    runs = run_tasks(bridge, tasks, cfg, args.out, progress=not args.quiet)
    save_alpha_heatmaps(runs, model_id(bridge))
    summary = pd.concat([run.summary() for run in runs], ignore_index=True)
    timings = pd.DataFrame([{"task": run.task.name, **run.timings, "best_step": run.site.best_step,
                             "heads_alpha_gt_0.5": run.site.n_selected} for run in runs])
    print(f"\nHeld-out accuracy (%) on {model_id(bridge)}, {cfg.eval.n_test or 'all'} test queries per task:")
    print(format_table(summary))
    print("\nSeconds per stage (0 = reused from cache):")
    print(timings.round(1).to_string(index=False))
    root = Path(args.out) / slug(model_id(bridge))
    write_text(root / "summary.csv", summary.to_csv(index=False))
    write_text(root / "timings.csv", timings.to_csv(index=False))
    write_json(root / "run.json", {"argv": list(argv) if argv is not None else sys.argv[1:],
                                   "load_seconds": load_s, "config": cfg.to_dict()})
    print(f"\nartifacts: {root}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), lambda args: body(args, argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
