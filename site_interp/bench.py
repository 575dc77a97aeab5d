"""``python -m site_interp.bench``: SITE beside every baseline, on many tasks, in one table.

The comparison itself (methods, caching, resuming) is :mod:`site_interp.studies.comparison`;
its tables :mod:`site_interp.studies.comparison_tables`. Tables are written to
``<out>/<model>/bench_per_task.csv``, ``bench_summary.csv``, ``bench.json`` and ``bench.md``
(means over tasks with 95% bootstrap intervals over tasks, trainable parameters, seconds per stage).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

from site_interp import cli
from site_interp.artifacts import slug
from site_interp.baselines import FunctionVectorConfig, LoraConfig, TaskVectorConfig
from site_interp.studies.comparison import METHODS, ComparisonConfig, compare_methods


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m site_interp.bench",
        description="SITE beside 0-shot, ICL, uniform-alpha controls, function vectors, task vectors and LoRA: "
                    "per-task and mean held-out accuracy with bootstrap CIs, trainable parameters, time per stage.",
    )
    cli.add_model_args(p)
    cli.add_task_args(p)
    cli.add_pipeline_args(p)
    b = p.add_argument_group("benchmark")
    b.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD",
                   help=f"methods to run (default: all): {' '.join(METHODS)}")
    b.add_argument("--seeds", nargs="+", type=int, default=None,
                   help="seeds to run (default: --seed); results are averaged over seeds per task")
    b.add_argument("--fv-rank-tasks", nargs="+", default=None,
                   help="tasks whose mean AIE ranks the FV heads once for all tasks (default: the first six of --tasks); "
                        "they may lie outside --tasks, so a benchmark run in parts ranks its heads as the whole")
    b.add_argument("--fv-heads", type=int, default=None, help="heads in the function vector (default: 2%% of heads, >= 4)")
    b.add_argument("--fv-aie-prompts", type=int, default=25, help="shuffled-label prompts per ranking task (25)")
    b.add_argument("--scan-valid", type=int, default=100,
                   help="valid queries for the FV / TV layer choice (100; each costs n_layers last-token rows)")
    b.add_argument("--report-only", action="store_true",
                   help="compute nothing: build the tables from what is cached (a partial or finished run)")
    b.add_argument("--lora-rank", type=int, default=8, help="LoRA rank (8)")
    b.add_argument("--lora-steps", type=int, default=100, help="LoRA Adam steps (100)")
    b.add_argument("--lora-batch-size", type=int, default=4, help="LoRA prompts per step (4: 400 examples, as SITE)")
    b.add_argument("--lora-lr", type=float, default=1e-3, help="LoRA learning rate (1e-3)")
    return p


def config_from_bench_args(args: argparse.Namespace) -> ComparisonConfig:
    return ComparisonConfig(
        run=cli.config_from_args(args), methods=tuple(args.methods),
        seeds=tuple(args.seeds) if args.seeds else (args.seed,),
        fv=FunctionVectorConfig(n_aie_prompts=args.fv_aie_prompts, n_heads=args.fv_heads, n_valid=args.scan_valid),
        fv_rank_tasks=tuple(args.fv_rank_tasks) if args.fv_rank_tasks else None,
        tv=TaskVectorConfig(n_valid=args.scan_valid),
        lora=LoraConfig(rank=args.lora_rank, steps=args.lora_steps, batch_size=args.lora_batch_size, lr=args.lora_lr),
    )


def body(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    t0 = time.perf_counter()
    tasks = cli.tasks_from_args(args)
    cli.check_output_dir(args.out)
    cfg = config_from_bench_args(args)
    named = {t.name for t in tasks}
    outside = [n for n in cfg.fv_rank_tasks or () if n not in named] if "fv" in cfg.methods else []
    rank_tasks = cli.tasks_from_args(argparse.Namespace(tasks=outside, data_dir=args.data_dir, seed=args.seed)) if outside else []
    bridge = cli.load_from_args(args)
    tables = compare_methods(bridge, tasks, cfg, args.out, progress=not args.quiet, compute=not args.report_only,
                             rank_tasks=rank_tasks)
    root = Path(args.out) / slug(tables.model_id)
    tables.write(root, command=["python -m site_interp.bench", *(argv if argv is not None else sys.argv[1:])],
                 config=cfg.to_dict(), wall_s=time.perf_counter() - t0)
    print(tables.markdown())
    print(f"\ntables: {root}/bench.md (and bench_per_task.csv, bench_summary.csv, bench.json)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), lambda args: body(args, argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
