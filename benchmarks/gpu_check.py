"""The GPU path in one command: the embedded models on CUDA against the same run on the CPU.

    python benchmarks/gpu_check.py                  # gemma-3-270m and smollm2-135m, two tasks each

For each model it runs SITE (task embedding, alphas, evaluation) twice with the same settings and
seed: on the CPU in float32 (the reference) and on ``--device`` (default ``cuda``) in
``--dtype`` (default bfloat16, what ``load_model`` picks on CUDA). It prints the seconds per stage
(load, embedding, training, evaluation) of both, and compares them within bfloat16's tolerance:

* task embedding ``t``: relative error ||t - t_ref|| / ||t_ref|| <= ``--tol-embedding``;
* alphas: Pearson correlation with the reference >= ``--min-alpha-corr`` (bf16 rounding moves
  near-zero gradients, so single alphas may differ; the selection should not);
* accuracy (first token, every method): within ``--tol-accuracy`` points.

Exit status 0 when every check passes, 1 when one fails, 2 when there is no GPU (with a message
saying so) or an option is wrong. ``--device cpu`` runs the same comparison on the CPU (bfloat16
against float32), e.g. to try the script without a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from site_interp.errors import UserError
from site_interp.loading import TINY_MODELS, load_model
from site_interp.pipeline import RunConfig, TaskRun, run_tasks
from site_interp.sweeps.grid import SETTINGS, Cell
from site_interp.tasks.specs import resolve_tasks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["gemma-3-270m", "smollm2-135m"])
    p.add_argument("--tasks", nargs="+", default=["capitalize", "country_capital"])
    p.add_argument("--device", default="cuda", help="cuda, cuda:K (or cpu to try the comparison without a GPU)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--n-prompts", type=int, default=20)
    p.add_argument("--n-shots", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--n-test", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tol-embedding", type=float, default=0.05, help="max relative error of t (0.05)")
    p.add_argument("--min-alpha-corr", type=float, default=0.8, help="min correlation of the alphas (0.8)")
    p.add_argument("--tol-accuracy", type=float, default=10.0, help="max accuracy difference, points (10)")
    return p


def _config(args: argparse.Namespace) -> RunConfig:
    values = {**{k: s.default for k, s in SETTINGS.items()}, "n_prompts": args.n_prompts, "n_shots": args.n_shots,
              "steps": args.steps, "eval_every": args.eval_every, "n_test": args.n_test}
    cell = Cell("check", ("check",), args.seed, tuple((k, values[k]) for k in SETTINGS), exact_match=False)
    return cell.run_config()


def _timed_run(model: str, device: str, dtype: torch.dtype, tasks, cfg: RunConfig) -> tuple[list[TaskRun], dict]:
    t0 = time.perf_counter()
    bridge = load_model(model, device=device, dtype=dtype)
    if model in TINY_MODELS and dtype != torch.float32:  # tiny test models are built in float32 on the CPU
        bridge = bridge.to(dtype)
        bridge.cfg.dtype = dtype
    load_s = time.perf_counter() - t0
    runs = run_tasks(bridge, tasks, cfg, None, progress=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    stages = {"load": load_s}
    for stage in ("embedding", "training", "evaluation"):
        stages[stage] = sum(r.timings.get(stage, 0.0) for r in runs)
    del bridge
    return runs, stages


def _corr(a: Float[Tensor, "layer head"], b: Float[Tensor, "layer head"]) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    if a.std() == 0 or b.std() == 0:
        return 1.0 if torch.equal(a, b) else 0.0
    return float(torch.corrcoef(torch.stack([a, b]))[0, 1])


def compare(ref: list[TaskRun], new: list[TaskRun], args: argparse.Namespace) -> list[dict]:
    """One row per task: embedding error, alpha agreement, accuracy differences, and pass/fail."""
    rows = []
    for r, n in zip(ref, new):
        t_ref, t_new = r.embedding.t.float(), n.embedding.t.float()
        rel = float((t_new - t_ref).norm() / t_ref.norm().clamp_min(1e-12))
        corr = _corr(r.site.alpha, n.site.alpha)
        acc_r = r.summary().set_index("method")["first_token"]
        acc_n = n.summary().set_index("method")["first_token"]
        worst = float((acc_n - acc_r).abs().max())
        ok = rel <= args.tol_embedding and corr >= args.min_alpha_corr and worst <= args.tol_accuracy
        rows.append({"task": r.task.name, "t rel err": rel, "alpha corr": corr,
                     "max |alpha diff|": float((r.site.alpha - n.site.alpha).abs().max()),
                     "SITE acc ref": float(acc_r.get("SITE", float("nan"))),
                     "SITE acc new": float(acc_n.get("SITE", float("nan"))), "max |acc diff|": worst,
                     "ok": ok})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"error: no CUDA GPU here (torch {torch.__version__}, CUDA build {torch.version.cuda}, "
              "torch.cuda.is_available() is False): run this on a machine with a GPU and a CUDA build of torch, "
              "or pass --device cpu to try the comparison on the CPU", file=sys.stderr)
        return 2
    import pandas as pd

    try:
        tasks = resolve_tasks(args.tasks, None, seed=args.seed)
        cfg = _config(args)
        dtype = getattr(torch, args.dtype)
        name = torch.cuda.get_device_name(torch.device(args.device)) if args.device.startswith("cuda") else "CPU"
        print(f"device {args.device} ({name}), {args.dtype}, against CPU float32; tasks: {' '.join(args.tasks)}")
        all_ok = True
        for model in args.models:
            ref, ref_t = _timed_run(model, "cpu", torch.float32, tasks, cfg)
            new, new_t = _timed_run(model, args.device, dtype, tasks, cfg)
            times = pd.DataFrame({"cpu float32": ref_t, f"{args.device} {args.dtype}": new_t})
            times["speed-up"] = times.iloc[:, 0] / times.iloc[:, 1]
            rows = pd.DataFrame(compare(ref, new, args))
            all_ok &= bool(rows["ok"].all())
            print(f"\n== {model}: seconds per stage (all tasks)\n{times.round(2).to_string()}")
            print(f"\n{model}: {args.device} {args.dtype} against CPU float32\n{rows.round(4).to_string(index=False)}")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print("\nPASS: within bfloat16 tolerance" if all_ok else
          f"\nFAIL: outside tolerance (t rel err <= {args.tol_embedding}, alpha corr >= {args.min_alpha_corr}, "
          f"|acc diff| <= {args.tol_accuracy} points)")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
