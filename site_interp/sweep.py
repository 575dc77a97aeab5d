"""``python -m site_interp.sweep``: SITE over a grid of models x tasks x seeds x settings.

Every cell (a model, its tasks, a seed, one value per setting) is one ``run`` pipeline (task
embedding, alphas, evaluation; with ``--study`` also patching, transfer, similarity and
clustering over the cell's tasks). Settings given several values are swept
(``--n-shots 5 10 --sparsity 0 0.02``), as are ``--models`` and ``--seeds``; the grid can also come
from a TOML file (``--grid``). Cells run in this process (``--executor local``: each model loaded
once, its tasks trained as one multi-task batch) or on a Ray cluster (``--executor ray``: an actor
per model keeps it loaded; ``--address`` joins a running cluster). The driver writes every
artifact in ``run``'s layout under ``<out>/<cell>/<model>/<task>/`` and skips complete cells,
so a sweep killed halfway resumes; the grid's tables and the cross-model head-depth figure go to
``<out>/sweep/``. See docs/scale.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from site_interp import cli
from site_interp.artifacts import provenance, write_json, write_text
from site_interp.errors import UserError
from site_interp.loading import DEFAULT_MODEL
from site_interp.plots.sweep_figures import save_sweep_figures
from site_interp.sweeps.executors import LocalExecutor, RayExecutor
from site_interp.sweeps.grid import SETTINGS, Cell, SweepGrid, read_grid_file
from site_interp.sweeps.placement import parse_per_model, plan_placement
from site_interp.sweeps.runner import SweepResult, run_sweep
from site_interp.tasks.specs import resolve_tasks


def add_grid_args(p: argparse.ArgumentParser) -> None:
    """The multi-valued options of a sweep: models, tasks, seeds and every ``run`` setting."""
    cli.add_model_args(p, several=True)
    t = p.add_argument_group("tasks")
    t.add_argument("--tasks", nargs="+", default=None,
                   help="as for run: built-in names, names under --data-dir, directories, JSON files, 'all'. "
                        f"Default: {' '.join(cli.DEFAULT_TASKS)}")
    t.add_argument("--data-dir", default=None, help="a function-vector style task directory, e.g. ../shared/data/fv57")
    t.add_argument("--task-chunk", type=int, default=None,
                   help="tasks per cell (default: all of them in one cell, trained as one multi-task batch)")
    g = p.add_argument_group("grid (several values sweep a setting)")
    g.add_argument("--grid", default=None, help="a TOML file with models, tasks, seeds and [settings]; "
                                                "options given here win")
    g.add_argument("--seeds", nargs="+", type=int, default=None, help="seeds (default 0)")
    for spec in SETTINGS.values():
        g.add_argument(spec.option, nargs="+", type=spec.kind, default=None, metavar="V",
                       help=f"{spec.help} ({spec.default})")
    g.add_argument("--full-prompts", action="store_true", default=None,
                   help="train on full prompts every step (the paper's procedure)")
    g.add_argument("--no-exact-match", action="store_true", default=None, help="first-token accuracy only (faster)")
    g.add_argument("--study", action="store_true",
                   help="also run the study (patching, transfer, similarity, clustering) over each cell's tasks")


def add_executor_args(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("executor")
    e.add_argument("--executor", choices=["local", "ray"], default="local",
                   help="local: this process, one model at a time; ray: actors on a Ray cluster (pip install -e \".[ray]\")")
    e.add_argument("--address", default=None,
                   help="join a running Ray cluster: 'auto' or host:port (default: start a local one)")
    e.add_argument("--ray-cpus", type=int, default=None, help="CPUs of the local Ray cluster started (default: all)")
    e.add_argument("--gpus-per-model", nargs="+", default=None, metavar="N|MODEL=N",
                   help="Ray: GPUs per model actor, fractions below 1 allowed (default 1 on CUDA, 0 on CPU)")
    e.add_argument("--cpus-per-model", nargs="+", default=None, metavar="N|MODEL=N",
                   help="CPUs per model: its torch threads, and what its Ray actor reserves "
                        "(default 1 on Ray; locally torch's default)")
    e.add_argument("--replicas", type=int, default=1, help="Ray: actors per model, each with the model loaded (1)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default="runs", help="output directory (runs/); tables and figures in <out>/sweep/")
    o.add_argument("--formats", nargs="+", default=["png"], choices=["png", "pdf", "svg"], help="figure formats")
    o.add_argument("--report-only", action="store_true", help="compute nothing: tables and figure of the complete cells")
    o.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m site_interp.sweep",
        description="SITE over a grid of models x tasks x seeds x settings, locally or on a Ray cluster, "
                    "with tables over the grid and a cross-model head-depth figure.",
    )
    add_grid_args(p)
    add_executor_args(p)
    return p


def grid_from_args(args: argparse.Namespace) -> SweepGrid:
    """The grid of the options, on top of ``--grid``'s file."""
    base: dict[str, Any] = read_grid_file(args.grid) if args.grid else {"settings": {}}
    settings = dict(base.get("settings", {}))
    for name in SETTINGS:
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)

    def pick(option: str, key: str, default: Any) -> Any:
        value = getattr(args, option)
        return value if value is not None else base.get(key, default)

    no_exact = args.no_exact_match if args.no_exact_match is not None else not base.get("exact_match", True)
    return SweepGrid(
        models=tuple(pick("models", "models", [DEFAULT_MODEL])), tasks=tuple(pick("tasks", "tasks", cli.DEFAULT_TASKS)),
        seeds=tuple(pick("seeds", "seeds", [0])), settings={k: tuple(v) for k, v in settings.items()},
        data_dir=pick("data_dir", "data_dir", None), full_prompts=bool(pick("full_prompts", "full_prompts", False)),
        exact_match=not no_exact, task_chunk=pick("task_chunk", "task_chunk", None),
    )


def study_config(cell: Cell) -> Any:
    """``patch``'s default study for one cell: its test queries, generation budget and seed."""
    from site_interp.studies.patching import PatchConfig
    from site_interp.studies.runner import StudyConfig

    cfg = cell.run_config()
    return StudyConfig(patch=PatchConfig(n_test=cfg.eval.n_test, max_new_tokens=cfg.eval.max_new_tokens,
                                         seed=cell.seed), seed=cell.seed)


def timing_table(result: SweepResult) -> pd.DataFrame:
    """Per model, seconds per computed task (worker side): total and per stage, and the load time."""
    df = result.to_dataframe()
    df = df[df["status"] == "computed"]
    rows = []
    for model, g in df.groupby("model", sort=False):
        n = int(g["n_computed"].sum())
        row = {"model": model, "cells": len(g), "tasks_computed": n, "seconds_per_task": g["seconds"].sum() / n,
               "load_seconds": g["load_seconds"].max()}
        for stage in ("embedding", "training", "evaluation"):
            if f"{stage}_seconds" in g:
                row[f"{stage}_per_task"] = g[f"{stage}_seconds"].sum() / n
        rows.append(row)
    return pd.DataFrame(rows)


def body(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    grid = grid_from_args(args)
    tasks_by_seed = {s: resolve_tasks(list(grid.tasks), grid.data_dir, seed=s) for s in grid.seeds}
    gpus, gpu_map = parse_per_model(args.gpus_per_model, "--gpus-per-model", grid.models)
    cpus, cpu_map = parse_per_model(args.cpus_per_model, "--cpus-per-model", grid.models)
    if args.executor == "local" and (args.address or args.gpus_per_model or args.replicas != 1 or args.ray_cpus):
        raise UserError("--address, --ray-cpus, --gpus-per-model and --replicas are for --executor ray")
    ray_executor = RayExecutor(args.address, replicas=args.replicas, num_cpus=args.ray_cpus) \
        if args.executor == "ray" and not args.report_only else None  # a report computes nothing: no cluster
    try:
        placements = plan_placement(grid.models, dtype=args.dtype, load_in_4bit=args.load_in_4bit) \
            if args.report_only else plan_placement(  # a report loads nothing, but finds the artifacts by precision
            grid.models, executor=args.executor, device=args.device, device_map=args.device_map, dtype=args.dtype,
            load_in_4bit=args.load_in_4bit,
            gpus_per_model={m: gpu_map.get(m, gpus) for m in grid.models} if args.gpus_per_model else None,
            cpus_per_model={m: cpu_map.get(m, cpus or 1.0) for m in grid.models},
            available_gpus=ray_executor.available_gpus if ray_executor else torch.cuda.device_count(),
        )
        executor: LocalExecutor | RayExecutor
        if ray_executor is not None:
            ray_executor.placements = placements
            executor = ray_executor
        else:
            executor = LocalExecutor(placements, set_threads=bool(args.cpus_per_model))
        study = study_config if args.study else None
        result = run_sweep(grid, tasks_by_seed, executor, args.out, study=study, progress=not args.quiet,
                           report_only=args.report_only)
    finally:
        if ray_executor is not None:
            ray_executor.close()
    root = Path(args.out) / "sweep"
    result.tables.write(root, {"grid": grid.to_dict()})
    cells = result.to_dataframe()
    write_text(root / "cells.csv", cells.to_csv(index=False))
    timings = timing_table(result)
    write_text(root / "timings.csv", timings.to_csv(index=False))
    figures = save_sweep_figures(result.tables.heads, root, args.formats)
    write_json(root / "sweep.json", {
        "argv": list(argv) if argv is not None else sys.argv[1:], "grid": grid.to_dict(), "executor": args.executor,
        "placements": {m: p.to_dict() for m, p in placements.items()}, "wall_seconds": result.seconds,
        "cells": len(result.cells), "computed": result.n_computed, "cached": result.n_cached,
        "provenance": provenance(None),
    })
    print(f"\n{len(result.cells)} cells: {result.n_computed} computed, {result.n_cached} reused"
          + (f", {len(result.cells) - result.n_computed - result.n_cached} missing" if args.report_only else "")
          + f"; wall time {result.seconds:.1f} s ({args.executor} executor)")
    if not result.tables.by_model.empty:
        print("\n" + result.tables.to_markdown().split("\n## ")[0].strip())
    if not timings.empty:
        print("\nSeconds per computed task (worker side) and model load:")
        print(timings.round(2).to_string(index=False))
    print(f"\ntables: {root}" + (f"; figure: {figures[0]}" if figures else ""))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), lambda args: body(args, argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
