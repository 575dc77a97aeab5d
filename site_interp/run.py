"""``python -m site_interp.run``: SITE end to end (embedding, alphas, evaluation) on some tasks.

Prints a table of held-out accuracy (0-shot, N-shot ICL, SITE; first token and exact match) and
writes per-task artifacts under ``--out``. A rerun with the same settings reuses the cached
embeddings and alphas; other settings in the same ``--out`` are refused with a clear message.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch

from site_interp.artifacts import ArtifactMismatchError, slug, write_json, write_text
from site_interp.embeddings import EmbeddingConfig
from site_interp.evaluation import EvalConfig
from site_interp.loading import DEFAULT_MODEL, available_models, load_model
from site_interp.pipeline import RunConfig, model_id, run_tasks
from site_interp.selection import SiteConfig
from site_interp.tasks import TaskError, resolve_tasks

#: Built-in tasks run by default: different kinds, each learnable by gemma-3-270m from 10 demos.
DEFAULT_TASKS = ("capitalize", "first_letter", "country_capital", "past_tense", "plural", "next_item")


def add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", default=DEFAULT_MODEL,
                   help=f"embedded/tiny model ({', '.join(available_models())}), a local HF directory, "
                        f"or a hub id (needs a network). Default: {DEFAULT_MODEL}")
    g.add_argument("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if available)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="default float32 on CPU, bfloat16 on CUDA")
    g.add_argument("--device-map", default=None, help="shard a large model over GPUs, e.g. 'auto'")
    g.add_argument("--load-in-4bit", action="store_true", help="4-bit weights via bitsandbytes (CUDA)")


def add_task_args(p: argparse.ArgumentParser, default: Sequence[str] = DEFAULT_TASKS) -> None:
    g = p.add_argument_group("tasks")
    g.add_argument("--tasks", nargs="+", default=list(default),
                   help="built-in task names, task names under --data-dir, task directories, JSON files, "
                        f"or 'all'. Default: {' '.join(default)}")
    g.add_argument("--data-dir", default=None,
                   help="a function-vector style directory <dir>/<task>/{train,valid,test}.json, "
                        "e.g. ../shared/data/fv57")


def add_pipeline_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("SITE")
    g.add_argument("--n-prompts", type=int, default=50, help="M: ICL prompts averaged into the task embedding (50)")
    g.add_argument("--n-shots", type=int, default=10, help="N: demonstrations per ICL prompt, also for the ICL baseline (10)")
    g.add_argument("--steps", type=int, default=400, help="Adam steps for the alphas (400)")
    g.add_argument("--lr", type=float, default=0.2, help="Adam learning rate (0.2)")
    g.add_argument("--batch-size", type=int, default=1, help="0-shot prompts per training step (1, as the paper)")
    g.add_argument("--eval-every", type=int, default=50, help="validate every this many steps (50)")
    g.add_argument("--sparsity", type=float, default=0.0, help="coefficient of sum(alpha) in the loss (0)")
    g.add_argument("--full-prompts", action="store_true",
                   help="train on full prompts every step (the paper's procedure) instead of reusing the prefix")
    e = p.add_argument_group("evaluation")
    e.add_argument("--n-test", type=int, default=50, help="test queries per task (50; 0 = all)")
    e.add_argument("--no-exact-match", action="store_true", help="first-token accuracy only (faster)")
    e.add_argument("--max-new-tokens", type=int, default=20, help="generation budget for exact match (20)")
    o = p.add_argument_group("output")
    o.add_argument("--seed", type=int, default=0, help="seed for prompts, demos and training order (0)")
    o.add_argument("--out", default="runs", help="output directory (runs/)")
    o.add_argument("--quiet", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    return RunConfig(
        embedding=EmbeddingConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed),
        site=SiteConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, eval_every=args.eval_every,
                        sparsity=args.sparsity, seed=args.seed, fast=not args.full_prompts),
        eval=EvalConfig(n_test=args.n_test or None, n_shots=args.n_shots, seed=args.seed,
                        exact_match=not args.no_exact_match, max_new_tokens=args.max_new_tokens),
    )


def load_from_args(args: argparse.Namespace):
    dtype = getattr(torch, args.dtype) if args.dtype else None
    return load_model(args.model, device=args.device, dtype=dtype, device_map=args.device_map,
                      load_in_4bit=args.load_in_4bit)


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
    add_model_args(p)
    add_task_args(p)
    add_pipeline_args(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    try:
        tasks = resolve_tasks(args.tasks, args.data_dir, seed=args.seed)
        cfg = config_from_args(args)
        t0 = time.perf_counter()
        bridge = load_from_args(args)
        load_s = time.perf_counter() - t0
        print(f"model {model_id(bridge)}: {bridge.cfg.n_layers} layers x {bridge.cfg.n_heads} heads, "
              f"loaded in {load_s:.1f} s", flush=True)
        summaries, timing_rows = [], []
        for run in run_tasks(bridge, tasks, cfg, args.out, progress=not args.quiet):
            summaries.append(run.summary())
            timing_rows.append({"task": run.task.name, **run.timings, "best_step": run.site.best_step,
                                "heads_alpha_gt_0.5": run.site.n_selected})
    except (TaskError, ArtifactMismatchError, FloatingPointError, ValueError, ModuleNotFoundError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    summary = pd.concat(summaries, ignore_index=True)
    timings = pd.DataFrame(timing_rows)
    table = format_table(summary)
    print(f"\nHeld-out accuracy (%) on {model_id(bridge)}, {cfg.eval.n_test or 'all'} test queries per task:")
    print(table)
    print("\nSeconds per stage (0 = reused from cache):")
    print(timings.round(1).to_string(index=False))
    root = Path(args.out) / slug(model_id(bridge))
    write_text(root / "summary.csv", summary.to_csv(index=False))
    write_text(root / "timings.csv", timings.to_csv(index=False))
    write_json(root / "run.json", {"argv": list(argv) if argv is not None else sys.argv[1:],
                                   "load_seconds": load_s, "config": cfg.to_dict()})
    print(f"\nartifacts: {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
