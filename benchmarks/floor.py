"""Floor model (issue #17): every stage's measured time against its arithmetic floor.

    OMP_NUM_THREADS=1 python benchmarks/floor.py --small            # 4 FV tasks, small settings: runs every stage
    OMP_NUM_THREADS=1 python benchmarks/floor.py --fv57 --from-run results/fv57   # census of FV-57 + a run's stage seconds

Per stage (task embeddings, prefix caches, training steps, validation, test evaluation,
generation for exact match, transfer rows): the rows and tokens it processes, its matmul FLOPs
(``floor_model``: transformer blocks, attention at the lengths it runs, the unembedding where
logits are computed; in training, the backward to the activations only, the weights being frozen),
the rate ``torch.matmul`` sustains on this machine at the same shapes, dtype and thread count
(``floor_measure.Rates``, measured in the same run), the floor = sum over its matmuls of FLOPs /
rate at that shape, the measured seconds and measured / floor, and the peak RSS while it ran.

``--small`` runs the stages itself with the library's functions (as ``pipeline.run_tasks`` and
``transfer_matrix`` do), recording every forward, and reports the census beside the recording
(they must agree; generation's census is an upper bound, the recording is what ran).
``--fv57`` needs no model forward: the census of all 57 tasks at the default settings, the rates,
and, with ``--from-run``, the seconds a run's artifacts record (``embedding.json``: per task;
``alphas.json``: training per group = prefix caches + steps + validation; ``bench/*.json``: test
evaluation and generation; ``transfer/*.json``: the 57 x 57 transfer matrix, once every column is
stored). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from floor_census import STAGES, census, training_census, transfer_forwards  # noqa: E402
from floor_measure import ForwardRecorder, Rates, StageClock  # noqa: E402
from floor_model import Dims, Forward, merge, totals  # noqa: E402

FV57 = Path(__file__).resolve().parents[2] / "shared" / "data" / "fv57"
SMALL_TASKS = ("antonym", "country-capital", "present-past", "sentiment")


def small_config():
    from site_interp import EmbeddingConfig, EvalConfig, SiteConfig
    from site_interp.pipeline import RunConfig

    return RunConfig(embedding=EmbeddingConfig(n_prompts=16), site=SiteConfig(steps=40, eval_every=20, n_valid=32),
                     eval=EvalConfig(n_test=16))


def run_stages(bridge, tasks, cfg, clock: StageClock, *, transfer_n_test: int | None) -> None:
    """Every stage on ``tasks`` through the library, each in ``clock.stage``; inside training,
    the prefix caches and validations get their own stages (wrapped for the run, then restored)."""
    from site_interp import compute_task_embedding, evaluate, train_site_many
    from site_interp import scoring
    from site_interp.evaluation import standard_methods
    from site_interp.studies.transfer import transfer_matrix

    with clock.stage("task embeddings"):
        embs = [compute_task_embedding(bridge, t, cfg.embedding, progress=False) for t in tasks]
    build, mean_losses = scoring.prefix_cache_for, scoring.LastTokenScorer.mean_losses

    def timed_build(*args, **kwargs):
        with clock.stage("prefix caches"):
            return build(*args, **kwargs)

    def timed_validation(self, *args, **kwargs):
        with clock.stage("validation"):
            return mean_losses(self, *args, **kwargs)

    scoring.prefix_cache_for, scoring.LastTokenScorer.mean_losses = timed_build, timed_validation
    try:
        with clock.stage("training steps"):
            torch.manual_seed(cfg.site.seed)
            sites = train_site_many(bridge, tasks, embs, cfg.site, progress=False)
    finally:
        scoring.prefix_cache_for, scoring.LastTokenScorer.mean_losses = build, mean_losses
    methods = [standard_methods(e.t, s.alpha, cfg.eval.n_shots) for e, s in zip(embs, sites)]
    first_token = type(cfg.eval)(**{**cfg.eval.to_dict(), "exact_match": False})
    with clock.stage("test evaluation"):
        for t, m in zip(tasks, methods):
            evaluate(bridge, t, m, first_token, progress=False)
    exact = type(cfg.eval)(**{**cfg.eval.to_dict(), "exact_match": True})
    with clock.stage("generation (exact match)"):
        for t, m in zip(tasks, methods):
            evaluate(bridge, t, m, exact, progress=False)
    with clock.stage("transfer rows"):
        transfer_matrix(bridge, tasks, {t.name: e.t for t, e in zip(tasks, embs)},
                        {t.name: s.alpha for t, s in zip(tasks, sites)}, n_test=transfer_n_test, progress=False)


def stage_row(dims: Dims, rates: Rates, name: str, forwards: list[Forward], measured_s: float | None,
              peak_mb: float | None, note: str = "") -> dict:
    tot = totals(dims, forwards)
    floor_s = rates.seconds(dims, forwards) if forwards else 0.0
    return {"stage": name, **tot, "gflop": tot["flops"] / 1e9,
            "rate_gflop_s": tot["flops"] / floor_s / 1e9 if floor_s else None, "floor_s": floor_s,
            "measured_s": measured_s, "ratio": measured_s / floor_s if measured_s is not None and floor_s else None,
            "peak_mb": peak_mb, "note": note}


def table(rows: list[dict]) -> str:
    def f(x, spec):
        return "—" if x is None else format(x, spec)

    lines = ["| stage | rows | tokens (real) | GFLOP | rate GFLOP/s at its shapes | floor s | measured s | "
             "measured / floor | peak MB |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['stage']}{r['note']} | {r['rows']} | {r['tokens']} ({r['real_tokens']}) | "
                     f"{r['gflop']:.1f} | {f(r['rate_gflop_s'], '.1f')} | {r['floor_s']:.1f} | "
                     f"{f(r['measured_s'], '.1f')} | {f(r['ratio'], '.2f')} | {f(r['peak_mb'], '.0f')} |")
    return "\n".join(lines)


def small(args, bridge, dims: Dims, rates: Rates) -> dict:
    from site_interp.tasks import load_task_dir

    tasks = list(load_task_dir(args.data_dir, args.tasks).values())
    cfg = small_config()
    clock = StageClock()
    recorder = ForwardRecorder(bridge, clock)
    t0 = time.perf_counter()
    run_stages(bridge, tasks, cfg, clock, transfer_n_test=cfg.eval.n_test)
    wall = time.perf_counter() - t0
    recorder.close()
    planned = census(bridge, tasks, cfg, eval_shots=(0, cfg.eval.n_shots, 0), transfer_n_test=cfg.eval.n_test)
    rows, agree = [], {}
    for name in STAGES:
        ran = recorder.forwards.get(name, [])
        key = lambda f: (f.rows, f.q_len, f.k_len, f.logits_rows, f.backward, f.real_tokens)  # noqa: E731
        agree[name] = sorted(map(key, merge(ran))) == sorted(map(key, merge(planned["stages"][name])))
        rows.append(stage_row(dims, rates, name, ran, clock.seconds[name], clock.peak_mb[name]))
    ub = totals(dims, planned["stages"]["generation (exact match)"])
    return {"tasks": [t.name for t in tasks], "config": cfg.to_dict(), "wall_s": wall, "stages": rows,
            "census_equals_recorded": agree, "generation_upper_bound_gflop": ub["flops"] / 1e9,
            "peak_rss_resettable": clock.resettable, "untracked_forwards": len(recorder.forwards.get(None, []))}


def run_groups(trained_with: dict[str, tuple[str, ...] | None], seconds: dict[str, float]) -> list[list[str]]:
    """The training groups a run actually had, from its alphas sidecars: their ``trained_with``
    record, or (alphas saved before that record) tasks whose ``seconds`` -- the group's time
    divided among its tasks -- are equal to the last digit. Only groups whose every task is present."""
    groups: dict[tuple, list[str]] = {}
    for name, members in trained_with.items():
        groups.setdefault(members if members is not None else (None, seconds[name]), []).append(name)
    out = []
    for key, names in groups.items():
        if key[0] is None:
            out.append(sorted(names))
        elif set(key) <= set(trained_with):
            out.append(list(key))
    return out


def _evaluation_seconds(out: str, bridge, tasks, cfg) -> dict[str, float]:
    """Per task, the evaluation seconds a comparison run recorded for 0-shot, ICL and SITE (the
    methods the census evaluates), for tasks that have all three at ``cfg``'s evaluation settings."""
    from site_interp.artifacts import read_json_object
    from site_interp.pipeline import task_dir

    seconds = {}
    for t in tasks:
        recs = [read_json_object(task_dir(out, bridge, t) / "bench" / f"{m}.json", warn=False) for m in ("0-shot", "icl", "site")]
        if all(r is not None and r.get("key", {}).get("eval") == cfg.eval.to_dict() for r in recs):
            seconds[t.name] = sum(float(r["eval_s"]) for r in recs)
    return seconds


LONG_PROMPTS = 1000
"""Mean embedding-prompt length (tokens) from which a task counts as long: eager attention's
score, mask and softmax work, which the floor does not count, grows with the square of it."""


def _embedding_split(plan: dict, seconds: dict[str, float], done: list[str], dims: Dims, rates: Rates) -> list[dict]:
    """The measured embeddings twice split: tasks with short and long prompts (the attention the
    bridge computes eagerly), and the per-task measured / floor spread (a task's time is one
    measurement, so a task that ran beside a busy job stands out from the rest)."""
    rows, ratios = [], []
    for name in done:
        tot = totals(dims, plan["embedding_by_task"][name])
        ratios.append((seconds[name] / rates.seconds(dims, plan["embedding_by_task"][name]), name, tot["tokens"] / tot["rows"]))
    for label, keep in ((f"prompts under {LONG_PROMPTS} tokens", lambda r: r[2] < LONG_PROMPTS),
                        (f"prompts of {LONG_PROMPTS} tokens or more", lambda r: r[2] >= LONG_PROMPTS)):
        names = [r[1] for r in ratios if keep(r)]
        if names and len(names) < len(done):
            shown = ", ".join(names) if len(names) <= 3 else f"{len(names)} tasks"
            rows.append(stage_row(dims, rates, f"  task embeddings, {label} ({shown})",
                                  [f for n in names for f in plan["embedding_by_task"][n]],
                                  sum(seconds[n] for n in names), None, ""))
    ratios.sort()
    q = [ratios[int(round(x * (len(ratios) - 1)))][0] for x in (0.0, 0.25, 0.5, 0.75, 1.0)]
    print(f"task embeddings, measured / floor per task: min {q[0]:.2f}, quartiles {q[1]:.2f} / {q[2]:.2f} / {q[3]:.2f}, "
          f"max {q[4]:.2f}; highest: " + ", ".join(f"{n} {r:.2f} ({t:.0f} tokens)" for r, n, t in ratios[-4:][::-1]),
          file=sys.stderr)
    return rows


def _transfer_rows(out: str, bridge, tasks, cfg, plan: dict, dims: Dims, rates: Rates) -> list[dict]:
    """P4: the seconds the report's stored transfer columns took (its default ``ScaleConfig``,
    the census's 50 queries per task) -- measured whole once every column of the matrix is there,
    else the columns stored so far against their own census (every source, those targets)."""
    from site_interp.artifacts import ArtifactMismatchError
    from site_interp.studies.report_runs import ScaleConfig, transfer_seconds

    try:
        seconds = transfer_seconds(bridge, tasks, cfg, out, ScaleConfig())
    except ArtifactMismatchError as err:  # as for embeddings and alphas: other settings are not measured here
        print(f"transfer: not measured, {err}", file=sys.stderr)
        return []
    if not seconds:
        return []
    if len(seconds) == len(tasks):
        return [stage_row(dims, rates, f"transfer rows ({len(tasks)} x {len(tasks)}, measured whole)",
                          plan["stages"]["transfer rows"], sum(seconds.values()), None,
                          f", measured: {len(seconds)} columns")]
    targets = [t for t in tasks if t.name in seconds]  # a run stopped part way: its columns' own census
    return [stage_row(dims, rates, f"transfer rows, measured: {len(seconds)} of {len(tasks)} columns",
                      transfer_forwards(bridge, targets, ScaleConfig().n_test, n_sources=len(tasks)),
                      sum(seconds.values()), None, "")]


def fv57(args, bridge, dims: Dims, rates: Rates, cfg=None) -> dict:
    """The census of every task under ``args.data_dir`` at ``cfg`` (default: ``RunConfig()``, the
    settings of the results store), and, with ``args.from_run``, the seconds the run's artifacts
    record where their settings are ``cfg``'s."""
    from site_interp.artifacts import read_json
    from site_interp.pipeline import RunConfig, task_dir
    from site_interp.tasks import load_task_dir

    tasks = list(load_task_dir(args.data_dir).values())
    cfg = cfg if cfg is not None else RunConfig()
    t0 = time.perf_counter()
    from site_interp.studies.report_runs import ScaleConfig

    plan = census(bridge, tasks, cfg, eval_shots=(0, cfg.eval.n_shots, 0), transfer_n_test=ScaleConfig().n_test)
    census_s = time.perf_counter() - t0
    seconds: dict[str, dict[str, float]] = {"embedding": {}, "alphas": {}}
    trained_with: dict[str, tuple[str, ...] | None] = {}
    if args.from_run:
        for t in tasks:
            for kind in seconds:
                side = task_dir(args.from_run, bridge, t) / f"{kind}.json"
                if side.exists():
                    meta = read_json(side)
                    stored = meta.get("key", {}).get("embedding")
                    if stored == cfg.embedding.to_dict() and (kind == "embedding" or
                                                              meta["key"].get("site") == cfg.site.result_key()):
                        seconds[kind][t.name] = float(meta["seconds"])
                        if kind == "alphas":
                            trained_with[t.name] = tuple(meta["trained_with"]) if "trained_with" in meta else None
    rows = []
    for name in STAGES:
        fw = plan["stages"][name]
        note = " (upper bound)" if name in plan["upper_bound"] else ""
        rows.append(stage_row(dims, rates, name, fw, None, None, note))
    done = [n for n in plan["embedding_by_task"] if n in seconds["embedding"]]
    if done:
        fw = [f for n in done for f in plan["embedding_by_task"][n]]
        rows.append(stage_row(dims, rates, "task embeddings", fw, sum(seconds["embedding"][n] for n in done), None,
                              f", measured: {len(done)} of {len(tasks)} tasks"))
        rows += _embedding_split(plan, seconds["embedding"], done, dims, rates)
    ran = run_groups(trained_with, seconds["alphas"])
    if ran:  # the groups the run trained (a report run trains chunk by chunk, not the plan's groups)
        by_name = {t.name: t for t in tasks}
        groups = [g for names in ran for g in training_census(bridge, [by_name[n] for n in names], cfg.site)]
        fw = [f for g in groups for s in ("prefix caches", "training steps", "validation") for f in g[s]]
        n = sum(len(g["tasks"]) for g in groups)
        rows.append(stage_row(dims, rates, "training (caches + steps + validation)", fw,
                              sum(seconds["alphas"][t] for g in groups for t in g["tasks"]), None,
                              f", measured: the {len(groups)} group{'s' if len(groups) != 1 else ''} the run trained, {n} tasks"))
        for g in groups:  # one row per group: a group's time is one measurement, whatever ran beside it
            gfw = [f for s in ("prefix caches", "training steps", "validation") for f in g[s]]
            first = g["tasks"][0] + (f" + {len(g['tasks']) - 1}" if len(g["tasks"]) > 1 else "")
            rows.append(stage_row(dims, rates, f"  training group {first}", gfw,
                                  sum(seconds["alphas"][t] for t in g["tasks"]), None, ""))
    evals = _evaluation_seconds(args.from_run, bridge, tasks, cfg) if args.from_run else {}
    if evals and len(evals) == len(tasks):  # the census plans all tasks' evaluation at once
        fw = plan["stages"]["test evaluation"] + plan["stages"]["generation (exact match)"]
        rows.append(stage_row(dims, rates, "test evaluation + generation (0-shot, ICL, SITE)", fw, sum(evals.values()),
                              None, ", measured: floor from generation's upper bound"))
    if args.from_run:
        rows += _transfer_rows(args.from_run, bridge, tasks, cfg, plan, dims, rates)
    return {"tasks": len(tasks), "config": cfg.to_dict(), "census_s": census_s, "from_run": args.from_run,
            "training_groups": [g["tasks"] for g in plan["training_groups"]], "stages": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--data-dir", default=str(FV57))
    p.add_argument("--small", action="store_true", help="run every stage on --tasks at small settings")
    p.add_argument("--tasks", nargs="+", default=list(SMALL_TASKS), help="the small run's tasks")
    p.add_argument("--fv57", action="store_true", help="census of all FV-57 tasks at the default settings")
    p.add_argument("--from-run", default=None, help="a run's --out: measured seconds from its artifacts")
    p.add_argument("--strided-unembed", action="store_true",
                   help="measure the old path: remove loading.contiguous_unembedding's pre-hook, so the unembedding "
                        "of logits_to_keep=1 runs on a strided view (a bmm reading the weights once per row)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="model and rate dtype (bfloat16 on CPU uses AVX-512 BF16 where the CPU has it)")
    p.add_argument("--out", default="runs/floor.json", help="the report (JSON)")
    args = p.parse_args()
    from site_interp import load_model
    from site_interp.artifacts import write_json

    bridge = load_model(args.model, dtype=getattr(torch, args.dtype))
    if args.strided_unembed:  # undo loading.contiguous_unembedding (added at load since issue #17)
        head = bridge.original_model.get_output_embeddings()
        head._site_contiguous.remove()
        del head._site_contiguous
    dims = Dims.of(bridge)
    rates = Rates(bridge.cfg.dtype)
    report = {"model": args.model, "dims": dims.to_dict(), "threads": torch.get_num_threads(),
              "contiguous_unembed": not args.strided_unembed}
    for flag, fn in (("small", small), ("fv57", fv57)):
        if getattr(args, flag):
            t0 = time.perf_counter()
            report[flag] = fn(args, bridge, dims, rates)
            report[flag]["total_s"] = time.perf_counter() - t0
            print(f"\n{flag} ({report['threads']} thread(s), {dims.dtype}):\n" + table(report[flag]["stages"]), flush=True)
            if flag == "small":
                r = report[flag]
                same = [k for k, v in r["census_equals_recorded"].items() if v]
                print(f"census = recorded forwards: {', '.join(same)}; generation: "
                      f"{r['stages'][STAGES.index('generation (exact match)')]['gflop']:.0f} GFLOP ran, census upper bound "
                      f"{r['generation_upper_bound_gflop']:.0f}; wall {r['wall_s']:.0f} s", flush=True)
    report["rates"] = rates.to_dict()
    write_json(args.out, report)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
