"""Speed benchmark: ratios measured side by side in one run, on the embedded model.

    python benchmarks/speed.py                      # P1 + P2 (about 10 minutes on 2 CPU cores)
    python benchmarks/speed.py --p3 --p4            # + full FV-57 run and 57 x 57 transfer (long on CPU)
    python benchmarks/speed.py --no-p1p2 --p3       # P3 alone; its artifacts (runs/bench-fv57) are
                                                          # reused by python -m site_interp.bench
    python benchmarks/speed.py --no-p1p2 --p3-profile   # P3's embedding seconds per task vs its tokens
    python benchmarks/speed.py --no-p1p2 --prefix-pieces  # prefix cache: one piece per task vs width pieces

P1  task-embedding extraction / a plain hook-free forward over the same batches   (target <= 1.10)
P2  alpha training: the paper's procedure (batch 1, 400 full-prompt steps, one task at a time)
    vs our fast path (prefix cache, all tasks in one batch, same schedule -> same alphas),
    per task, with held-out accuracy of both                                       (target >= 5x)
P3  FV-57: embeddings + alphas + held-out SITE evaluation, total and per task      (target <= 20 min)
P4  57 x 57 transfer matrix, 50 queries per task                                   (target <= 10 min)

Timings are wall-clock on whatever machine runs this; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from site_interp import EmbeddingConfig, EvalConfig, SiteConfig, compute_task_embedding, evaluate, load_model
from site_interp.loading import model_context, model_device
from site_interp.evaluation import Method
from site_interp.pipeline import RunConfig, get_embedding, task_dir
from site_interp.prompts import icl_prompt_batch, left_pad, pad_id
from site_interp.training import train_site, train_site_many
from site_interp.tasks import load_task_dir
from site_interp.studies.transfer import transfer_matrix

FV57 = Path(__file__).resolve().parents[2] / "shared" / "data" / "fv57"
P2_TASKS = ("antonym", "country-capital", "capitalize_first_letter", "present-past", "singular-plural",
            "english-french", "choose_first_of_3", "next_item", "person-sport", "landmark-country",
            "synonym", "english-german", "country-currency", "lowercase_first_letter", "prev_item",
            "person-occupation", "product-company", "alphabetically_first_3", "animal_v_object_3", "word_length")


def p1(bridge, task, cfg: EmbeddingConfig, repeats: int = 3) -> dict:
    batch = icl_prompt_batch(bridge.tokenizer, task, cfg.n_prompts, cfg.n_shots, cfg.seed, max_length=model_context(bridge))
    device = model_device(bridge)
    ids = sorted(batch.token_ids, key=len)  # the embedding's own batching (similar lengths together)
    chunks = [left_pad(ids[i : i + cfg.batch_size], pad_id(bridge.tokenizer), device)
              for i in range(0, len(ids), cfg.batch_size)]

    @torch.no_grad()
    def plain():
        for ids, mask in chunks:
            bridge(ids, attention_mask=mask, logits_to_keep=1)

    def ours():
        compute_task_embedding(bridge, task, cfg, progress=False)

    times = {"plain": [], "embedding": []}
    for _ in range(repeats):  # interleaved, so drift hits both alike
        for name, fn in (("plain", plain), ("embedding", ours)):
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in times.items()}
    return {"task": task.name, "plain_s": best["plain"], "embedding_s": best["embedding"],
            "ratio": best["embedding"] / best["plain"]}


def p2(bridge, tasks, embeddings, steps: int, n_test: int) -> dict:
    cfg = SiteConfig(steps=steps, batch_size=1)
    t0 = time.perf_counter()
    joint = train_site_many(bridge, tasks, embeddings, cfg, progress=False)
    ours_s = time.perf_counter() - t0
    paper_task, paper_emb = tasks[0], embeddings[0]
    t0 = time.perf_counter()
    paper = train_site(bridge, paper_task, paper_emb, SiteConfig(steps=steps, batch_size=1, fast=False), progress=False)
    paper_s = time.perf_counter() - t0
    evcfg = EvalConfig(n_test=n_test, exact_match=False)
    acc = {}
    for name, alpha in (("paper", paper.alpha), ("ours", joint[0].alpha)):
        ev = evaluate(bridge, paper_task, [Method("SITE", alpha=alpha, t=paper_emb.t)], evcfg, progress=False)
        acc[name] = 100 * ev.accuracy("SITE")
    return {"tasks_in_batch": len(tasks), "steps": steps, "paper_s_per_task": paper_s, "ours_s_total": ours_s,
            "ours_s_per_task": ours_s / len(tasks), "speedup": paper_s / (ours_s / len(tasks)),
            "max_alpha_diff": float((paper.alpha - joint[0].alpha).abs().max()),
            "heldout_acc_paper": acc["paper"], "heldout_acc_ours": acc["ours"], "task": paper_task.name}


def p3(bridge, tasks, n_test: int, out: str) -> tuple[tuple[dict, dict, dict], dict | None]:
    """Embeddings + alphas (``run_tasks``: artifacts under ``out``) + held-out SITE first token."""
    from site_interp.pipeline import RunConfig, run_tasks

    cfg = RunConfig(eval=EvalConfig(n_test=n_test, exact_match=False))
    t0 = time.perf_counter()
    runs = run_tasks(bridge, tasks, cfg, out, progress=True, evaluate_methods=False)
    t_emb = sum(r.timings["embedding"] for r in runs)
    t_train = sum(r.timings["training"] for r in runs)
    if t_emb == 0 or t_train == 0:
        print(f"warning: some stages were reused from {out}; P3 times are only valid on a fresh --p3-out", flush=True)
    t2 = time.perf_counter()
    # everything reused: the timed run's evaluation stands (None)
    accs: dict | None = None if t_emb == 0 and t_train == 0 else {}
    if accs is not None:
        for r in runs:
            ev = evaluate(bridge, r.task, [Method("0-shot"), Method("SITE", alpha=r.site.alpha, t=r.embedding.t)],
                          cfg.eval, progress=False)
            accs[r.task.name] = {"0-shot": 100 * ev.accuracy("0-shot"), "SITE": 100 * ev.accuracy("SITE")}
    t_eval = time.perf_counter() - t2
    total = time.perf_counter() - t0
    return ({"tasks": len(tasks), "embedding_s": t_emb, "training_s": t_train, "evaluation_s": t_eval,
             "total_min": total / 60, "per_task_s": total / len(tasks), "artifacts": out},
            {r.task.name: r.embedding.t for r in runs}, {r.task.name: r.site.alpha for r in runs}), accs


def p2_vs_p3(bridge, tasks, embs57: dict, alphas57: dict, p3_times: dict, steps: int, n_test: int,
             name: str = "antonym") -> dict:
    """The paper's procedure on one task, timed now, against P3's joint training time per task."""
    task = next(t for task in tasks if task.name == name)
    t0 = time.perf_counter()
    paper = train_site(bridge, task, embs57[name], SiteConfig(steps=steps, batch_size=1, fast=False), progress=False)
    paper_s = time.perf_counter() - t0
    ours_s = p3_times["training_s"] / p3_times["tasks"]
    evcfg = EvalConfig(n_test=n_test, exact_match=False)
    acc = {}
    for key, alpha in (("paper", paper.alpha), ("ours", alphas57[name])):
        ev = evaluate(bridge, task, [Method("SITE", alpha=alpha, t=embs57[name])], evcfg, progress=False)
        acc[key] = 100 * ev.accuracy("SITE")
    return {"tasks_in_batch": p3_times["tasks"], "task": name, "paper_s_per_task": paper_s, "ours_s_per_task": ours_s,
            "speedup": paper_s / ours_s, "max_alpha_diff": float((paper.alpha - alphas57[name]).abs().max()),
            "heldout_acc_paper": acc["paper"], "heldout_acc_ours": acc["ours"]}


def p3_profile(bridge, tasks, out: str, cfg: EmbeddingConfig = EmbeddingConfig()) -> dict:
    """Where P3's embedding time went: seconds per task (from the artifacts' sidecars) against
    the ICL prompt tokens of each task (real and as padded in the embedding's batches)."""
    from site_interp.artifacts import read_json
    from site_interp.pipeline import task_dir

    rows = []
    for task in tasks:
        sidecar = task_dir(out, bridge, task) / "embedding.json"
        if not sidecar.exists():
            continue
        ids = sorted(icl_prompt_batch(bridge.tokenizer, task, cfg.n_prompts, cfg.n_shots, cfg.seed,
                                      max_length=model_context(bridge)).token_ids, key=len)
        chunks = [ids[i : i + cfg.batch_size] for i in range(0, len(ids), cfg.batch_size)]
        rows.append({"task": task.name, "embedding_s": float(read_json(sidecar)["seconds"]),
                     "tokens": sum(map(len, ids)), "padded_tokens": sum(len(c) * len(c[-1]) for c in chunks),
                     "max_prompt_tokens": len(ids[-1])})
    rows.sort(key=lambda r: -r["embedding_s"])
    total_s, total_tok = sum(r["embedding_s"] for r in rows), sum(r["tokens"] for r in rows)
    return {"tasks": len(rows), "embedding_s": total_s, "tokens": total_tok,
            "padded_tokens": sum(r["padded_tokens"] for r in rows), "tokens_per_s": total_tok / total_s,
            "per_task": rows}


PIECE_TASKS = ("conll2003_person", "commonsense_qa", "sentiment", "landmark-country")


def prefix_pieces(bridge, tasks, n_rows: int = 100, repeats: int = 2) -> dict:
    """Building the prefix caches of SITE's validation prompts: one piece per task (padded to the
    task's longest prompt) vs pieces of similar widths (the default); interleaved, best of repeats."""
    from site_interp.batching import PREFIX_PIECE_OVERHEAD_TOKENS
    from site_interp.prefix_cache import prefix_cache_for
    from site_interp.prompts import zero_shot_batch

    segments = [zero_shot_batch(bridge, task, "valid", n_rows).token_ids for task in tasks]
    times: dict[str, list[float]] = {"one_piece_s": [], "pieces_s": []}
    stored = {}
    for _ in range(repeats):
        for key, overhead in (("one_piece_s", 10**9), ("pieces_s", PREFIX_PIECE_OVERHEAD_TOKENS)):
            t0 = time.perf_counter()
            cache = prefix_cache_for(bridge, segments, piece_overhead=overhead)
            times[key].append(time.perf_counter() - t0)
            stored[key] = sum(s.mask.numel() for s in cache.segments)
    out = {k: min(v) for k, v in times.items()}
    return {"tasks": [task.name for task in tasks], "rows": sum(len(s) for s in segments), **out,
            "ratio": out["one_piece_s"] / out["pieces_s"], "padded_tokens_one_piece": stored["one_piece_s"],
            "padded_tokens_pieces": stored["pieces_s"], "real_tokens": sum(len(x) for s in segments for x in s)}


def save(report: dict, out: str) -> None:
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(report, indent=2) + "\n")


def p1p2(bridge, args, report: dict) -> None:
    task_list = list(load_task_dir(args.data_dir, P2_TASKS[: args.p2_tasks]).values())
    report["P1"] = p1(bridge, task_list[0], EmbeddingConfig())
    print(f"P1 embedding / plain forward: {report['P1']['ratio']:.3f} "
          f"({report['P1']['embedding_s']:.2f} s vs {report['P1']['plain_s']:.2f} s)", flush=True)

    # embeddings are not part of P2's timing: reuse (and add to) a store's when one is named
    store = {t.name: task_dir(args.embeddings_from, bridge, t) if args.embeddings_from else None for t in task_list}
    embs = [get_embedding(bridge, task, RunConfig(), store[task.name], progress=False)[0] for task in task_list]
    report["P2"] = p2(bridge, task_list, embs, args.steps, args.n_test)
    r = report["P2"]
    print(f"P2 training per task: paper {r['paper_s_per_task']:.1f} s, ours {r['ours_s_per_task']:.1f} s "
          f"({r['tasks_in_batch']} tasks in one batch) -> {r['speedup']:.2f}x; held-out {r['task']}: "
          f"paper {r['heldout_acc_paper']:.0f}%, ours {r['heldout_acc_ours']:.0f}% (max |alpha diff| "
          f"{r['max_alpha_diff']:.1e})", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gemma-3-270m")
    p.add_argument("--data-dir", default=str(FV57))
    p.add_argument("--p2-tasks", type=int, default=20, help="tasks trained in one batch for P2 (at most 20)")
    p.add_argument("--no-p1p2", action="store_true", help="skip P1 and P2")
    p.add_argument("--embeddings-from", default=None,
                   help="P2's task embeddings: load them from this artifact directory (e.g. results/fv57), "
                        "computing and saving the missing ones there, instead of computing all of them")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--n-test", type=int, default=50)
    p.add_argument("--p3", action="store_true", help="run the full FV-57 pipeline (long on CPU)")
    p.add_argument("--p4", action="store_true", help="57 x 57 transfer (needs --p3's embeddings and alphas)")
    p.add_argument("--p2-vs-p3", action="store_true",
                   help="P2 with all FV-57 tasks per batch: the paper procedure on antonym vs P3's joint training "
                        "(needs a timed P3 in --out and its artifacts)")
    p.add_argument("--p4-tasks", type=int, default=None,
                   help="P4 on a K x K slice (every (57/K)-th task) and extrapolated by rows; default: all 57")
    p.add_argument("--p3-profile", action="store_true",
                   help="per-task embedding seconds of the timed P3 run against its prompt tokens (no forward)")
    p.add_argument("--prefix-pieces", action="store_true",
                   help="time building prefix caches as one piece per task vs pieces of similar widths")
    p.add_argument("--p3-out", default="runs/bench-fv57", help="P3's artifact directory (use a fresh one to time it)")
    p.add_argument("--out", default="benchmarks/results.json", help="report (merged into an existing one)")
    args = p.parse_args()
    torch.set_grad_enabled(True)
    bridge = load_model(args.model)
    report: dict = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    report.update({"model": args.model, "threads": torch.get_num_threads(), "device": str(model_device(bridge))})
    if not args.no_p1p2:
        p1p2(bridge, args, report)

    if args.p3_profile:
        prof = report["P3_profile"] = p3_profile(bridge, list(load_task_dir(args.data_dir).values()), args.p3_out)
        print(f"P3 embeddings: {prof['embedding_s'] / 60:.1f} min for {prof['tokens']} prompt tokens "
              f"({prof['tokens_per_s']:.0f} tokens/s); slowest:", flush=True)
        for r in prof["per_task"][:5]:
            print(f"  {r['task']}: {r['embedding_s']:.0f} s, {r['tokens']} tokens "
                  f"(longest prompt {r['max_prompt_tokens']}), {r['tokens'] / r['embedding_s']:.0f} tokens/s")
    if args.prefix_pieces:
        r = report["prefix_pieces"] = prefix_pieces(bridge, list(load_task_dir(args.data_dir, PIECE_TASKS).values()))
        print(f"prefix caches of {r['rows']} prompts: one piece per task {r['one_piece_s']:.1f} s "
              f"({r['padded_tokens_one_piece']} padded tokens), width pieces {r['pieces_s']:.1f} s "
              f"({r['padded_tokens_pieces']}; real {r['real_tokens']}) -> {r['ratio']:.2f}x", flush=True)
        save(report, args.out)
    if args.p3:
        all_tasks = list(load_task_dir(args.data_dir).values())
        (p3_times, embs57, alphas57), accs = p3(bridge, all_tasks, args.n_test, args.p3_out)
        if p3_times["embedding_s"] > 0 and p3_times["training_s"] > 0 or "P3" not in report:
            report["P3"] = p3_times  # a rerun on cached artifacts keeps the timed run's numbers
        if accs is not None:
            report["P3_accuracy"] = accs
        print(f"P3 FV-57: {report['P3']['total_min']:.1f} min ({report['P3']['per_task_s']:.1f} s per task: "
              f"embeddings {report['P3']['embedding_s']:.0f} s, training {report['P3']['training_s']:.0f} s, "
              f"evaluation {report['P3']['evaluation_s']:.0f} s)", flush=True)
        save(report, args.out)  # P3 survives an interrupted P4
        if args.p2_vs_p3:
            report["P2_57"] = p2_vs_p3(bridge, all_tasks, embs57, alphas57, report["P3"], args.steps, args.n_test)
            r = report["P2_57"]
            print(f"P2 (57 tasks per batch, from P3): paper {r['paper_s_per_task']:.1f} s, ours "
                  f"{r['ours_s_per_task']:.1f} s per task -> {r['speedup']:.2f}x; held-out {r['task']}: paper "
                  f"{r['heldout_acc_paper']:.0f}%, ours {r['heldout_acc_ours']:.0f}%", flush=True)
            save(report, args.out)
        if args.p4:
            p4_tasks = all_tasks
            if args.p4_tasks:
                step = len(all_tasks) / args.p4_tasks
                p4_tasks = [all_tasks[int(i * step)] for i in range(args.p4_tasks)]
            t0 = time.perf_counter()
            tr = transfer_matrix(bridge, p4_tasks, embs57, alphas57, n_test=args.n_test, progress=True)
            minutes = (time.perf_counter() - t0) / 60
            rows, full_rows = len(tr.records), None
            if len(p4_tasks) < len(all_tasks):  # rows of the full matrix: every target's queries x (T + 2) sources
                full_rows = sum(min(len(task.test), args.n_test) for task in all_tasks) * (len(all_tasks) + 2)
            report["P4"] = {"tasks": len(p4_tasks), "queries_per_task": args.n_test, "rows": rows, "minutes": minutes,
                            "rows_per_s": rows / (minutes * 60), **tr.diagonal_summary()}
            if full_rows:
                report["P4"]["extrapolated_57_minutes"] = full_rows / report["P4"]["rows_per_s"] / 60
            print(f"P4 {len(p4_tasks)} x {len(p4_tasks)} transfer: {minutes:.1f} min ({rows} rows, "
                  f"{report['P4']['rows_per_s']:.0f} rows/s)"
                  + (f"; 57 x 57 by rows: {report['P4']['extrapolated_57_minutes']:.1f} min" if full_rows else ""),
                  flush=True)
    save(report, args.out)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
