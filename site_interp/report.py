"""``python -m site_interp.report``: docs/results.md and its figures, from the artifacts on disk.

For each model it runs (or resumes) the parts of the evidence, cheapest and most telling first:

``core``       0-shot, 10-shot ICL, uniform alphas and SITE at the first seed (exact match + first token);
``transfer``   the T x T alpha-transfer matrix at the first seed;
``patching``   top-k / bottom-k / random-k head patching on every task;
``seeds``      ICL, uniform alphas and SITE at the other seeds;
``baselines``  task vectors, function vectors and LoRA at the first seed.

After every part the page is rewritten from whatever exists, so an interrupted run still leaves
a page whose status line says what is missing; ``--report-only`` computes nothing. The comparison
itself is :mod:`site_interp.studies.comparison`, the full-scale studies
:mod:`site_interp.studies.report_runs`, the numbers :mod:`site_interp.studies.results_data` and
the text :mod:`site_interp.studies.results_page`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

from site_interp import cli
from site_interp.artifacts import write_text
from site_interp.embeddings import EmbeddingConfig
from site_interp.errors import UserError
from site_interp.evaluation import EvalConfig
from site_interp.loading import resolve_model_id
from site_interp.pipeline import RunConfig
from site_interp.plots.report_figures import save_report_figures
from site_interp.studies.comparison import compare_methods
from site_interp.studies.report_runs import ScaleConfig, patching_rows, transfer_columns
from site_interp.studies.results_data import ReportConfig, fv_rank_pool, gather
from site_interp.studies.results_page import BEGIN, END, headline, render, replace_block
from site_interp.tasks.core import Task
from site_interp.training import SiteConfig

PARTS = ("core", "transfer", "patching", "seeds", "baselines")
EMBEDDED = ("gemma-3-270m", "smollm2-135m")
FV57 = "../shared/data/fv57"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m site_interp.report",
                                description="Run or resume the evidence of docs/results.md and write the page from "
                                            "the artifacts (FV-57 table over seeds, claims, transfer, dendrogram).")
    cli.add_model_args(p, several=True)
    t = p.add_argument_group("tasks")
    t.add_argument("--tasks", nargs="+", default=["all"], help="as for run (default: all tasks under --data-dir)")
    t.add_argument("--data-dir", default=FV57, help=f"function-vector style task directory (default {FV57})")
    r = p.add_argument_group("report")
    r.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS, metavar="PART",
                   help=f"what to compute, in this order: {' '.join(PARTS)} (default: all)")
    r.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds of ICL, uniform alphas and SITE (0 1 2)")
    r.add_argument("--report-only", action="store_true", help="compute nothing: write the page from what exists")
    r.add_argument("--out", default="results/fv57",
                   help="artifact directory (results/fv57: the committed results store, see docs/results.md)")
    r.add_argument("--page", default="docs/results.md", help="the page to write (docs/results.md)")
    r.add_argument("--figures-dir", default=None, help="where the figures go (default: <page dir>/img/results)")
    r.add_argument("--readme", default=None,
                   help="also rewrite this file's block between <!-- results:begin --> and <!-- results:end --> "
                        "with the headline numbers (e.g. README.md)")
    r.add_argument("--quiet", action="store_true", help="no progress bars")
    s = p.add_argument_group("settings (defaults: the page's; smaller values for a quick look)")
    s.add_argument("--n-prompts", type=int, default=50, help="M: ICL prompts per task embedding (50)")
    s.add_argument("--n-shots", type=int, default=10, help="N: demonstrations per prompt and in the ICL baseline (10)")
    s.add_argument("--steps", type=int, default=400, help="SITE Adam steps (400)")
    s.add_argument("--eval-every", type=int, default=50, help="SITE validation interval (50)")
    s.add_argument("--n-test", type=int, default=50, help="test queries per task (50)")
    s.add_argument("--lora-steps", type=int, default=100, help="LoRA steps (100)")
    s.add_argument("--fv-aie-prompts", type=int, default=10, help="FV: shuffled-label prompts per ranking task (10)")
    s.add_argument("--scan-valid", type=int, default=50, help="FV/TV: valid queries for the layer choice (50)")
    s.add_argument("--n-perm", type=int, default=2000, help="permutations of the overlap, Mantel and kind tests (2000)")
    return p


def config_from_args(args: argparse.Namespace) -> ReportConfig:
    base = ReportConfig()
    run = RunConfig(embedding=EmbeddingConfig(n_prompts=args.n_prompts, n_shots=args.n_shots),
                    site=SiteConfig(steps=args.steps, eval_every=args.eval_every),
                    eval=EvalConfig(n_test=args.n_test, n_shots=args.n_shots))
    return ReportConfig(run=run, seeds=tuple(args.seeds), fv=replace(base.fv, n_aie_prompts=args.fv_aie_prompts,
                                                                     n_valid=args.scan_valid),
                        tv=replace(base.tv, n_valid=args.scan_valid), lora=replace(base.lora, steps=args.lora_steps),
                        scale=ScaleConfig(n_test=args.n_test), n_perm=args.n_perm)


def compute_part(part: str, bridge, tasks: list[Task], cfg: ReportConfig, out: str, progress: bool,  # noqa: ANN001
                 rank_tasks: Sequence[Task] = ()) -> None:
    """Run (or resume) one of :data:`PARTS` for ``tasks`` (``rank_tasks``: :func:`fv_rank_pool`)."""
    first = cfg.seeds[0]
    if part == "core":
        compare_methods(bridge, tasks, cfg.comparison(("0-shot", *cfg.seeded_methods), (first,), tasks), out,
                        progress=progress)
    elif part == "seeds" and len(cfg.seeds) > 1:
        compare_methods(bridge, tasks, cfg.comparison(cfg.seeded_methods, cfg.seeds[1:], tasks), out, progress=progress)
    elif part == "baselines":
        others = tuple(m for m in cfg.single_seed_methods if m != "0-shot")
        compare_methods(bridge, tasks, cfg.comparison(others, (first,), tasks, rank_tasks), out, progress=progress,
                        rank_tasks=rank_tasks)
    elif part == "patching":
        patching_rows(bridge, tasks, cfg.seed_run(first), out, cfg.scale, progress=progress)
    elif part == "transfer":
        if transfer_columns(bridge, tasks, cfg.seed_run(first), out, cfg.scale, progress=progress) is None:
            print("transfer: skipped, some tasks have no seed-0 alphas yet (run the core part first)", flush=True)


def write_page(model_ids: Sequence[str], tasks: list[Task], cfg: ReportConfig, args: argparse.Namespace,
               argv: Sequence[str], rank_tasks: Sequence[Task] = ()) -> Path:
    page = Path(args.page)
    fig_dir = Path(args.figures_dir) if args.figures_dir else page.parent / "img" / "results"
    evidence, figures = [], {}
    for mid in model_ids:
        e = gather(mid, tasks, cfg, args.out, rank_tasks)
        evidence.append(e)
        figures[mid] = {k: os.path.relpath(v, page.parent) for k, v in save_report_figures(e, fig_dir).items()}
    command = " ".join(["python -m site_interp.report", *argv])
    text = render(evidence, cfg, command=command, figures=figures, generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                  store=f"the artifacts under `{args.out}` (the results store: docs/commands.md)")
    write_text(page, text + "\n")
    if args.readme:
        readme = Path(args.readme)
        link = os.path.relpath(page, readme.parent)
        new = replace_block(readme.read_text(encoding="utf-8"), headline(evidence, cfg.run.eval.n_shots, link))
        write_text(readme, new)
    return page


def body(args: argparse.Namespace, argv: Sequence[str]) -> int:
    cfg = config_from_args(args)
    tasks = cli.tasks_from_args(argparse.Namespace(tasks=args.tasks, data_dir=args.data_dir, seed=0))
    rank_tasks = fv_rank_pool(tasks, args.data_dir)
    cli.check_output_dir(args.out)
    page = Path(args.page)
    if page.is_dir():
        raise UserError(f"--page {args.page} is a directory; give the path of the markdown file to write")
    cli.check_output_dir(page.parent, "--page's directory")
    if args.figures_dir:
        cli.check_output_dir(args.figures_dir, "--figures-dir")
    if args.readme:
        readme = Path(args.readme)
        if not readme.is_file() or replace_block(readme.read_text(encoding="utf-8", errors="replace"), "") is None:
            raise UserError(f"--readme {args.readme} is not a file with a {BEGIN} ... {END} block; add the two "
                            "markers where the headline should go")
    models = args.models or list(EMBEDDED)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model_ids = [resolve_model_id(m, device=args.device, dtype=dtype, device_map=args.device_map,
                                  load_in_4bit=args.load_in_4bit) for m in models]
    if not args.report_only:
        for name in models:
            bridge = cli.load_from_args(argparse.Namespace(model=name, device=args.device, dtype=args.dtype,
                                                           device_map=args.device_map, load_in_4bit=args.load_in_4bit))
            for part in [p for p in PARTS if p in args.parts]:
                t0 = time.perf_counter()
                compute_part(part, bridge, tasks, cfg, args.out, not args.quiet, rank_tasks)
                print(f"{name}: {part} done in {(time.perf_counter() - t0) / 60:.1f} min", flush=True)
                write_page(model_ids, tasks, cfg, args, argv, rank_tasks)
            del bridge
    page = write_page(model_ids, tasks, cfg, args, argv, rank_tasks)
    print(f"page: {page}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return cli.run_command(build_parser(), lambda args: body(args, argv), argv)


if __name__ == "__main__":
    raise SystemExit(main())
