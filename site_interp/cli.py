"""The scaffold every command shares: argument groups, model loading, and how a command ends.

A command module (``python -m site_interp.run``, ``patch``, ``bench``, ``figures``) defines
``build_parser()`` and a ``body(args) -> int``, and its ``main(argv)`` is
``run_command(build_parser(), body, argv)``: a :class:`~site_interp.errors.UserError` (a bad task
file, an unknown model, an artifact made with other settings...) is printed as one line and
exits with status 2; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from site_interp.embeddings import EmbeddingConfig
from site_interp.errors import UserError
from site_interp.evaluation import EvalConfig
from site_interp.loading import DEFAULT_MODEL, available_models, load_model
from site_interp.pipeline import RunConfig, model_id
from site_interp.tasks.core import Task
from site_interp.tasks.specs import resolve_tasks
from site_interp.training import SiteConfig

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

DEFAULT_TASKS = ("capitalize", "first_letter", "country_capital", "past_tense", "plural", "next_item")
"""Built-in tasks run by default: different kinds, each learnable by gemma-3-270m from 10 demos."""


def add_model_args(p: argparse.ArgumentParser, *, several: bool = False) -> None:
    """``--model`` (or ``--models``, several, for a sweep) and how to place and load it."""
    g = p.add_argument_group("models" if several else "model")
    if several:
        g.add_argument("--models", nargs="+", default=None,
                       help=f"models to sweep ({', '.join(available_models())}, local HF directories, hub ids). "
                            f"Default: {DEFAULT_MODEL}")
    else:
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
                        f"Hugging Face benchmarks (anli:r1, bbh:<subtask>...), or 'all'. Default: {' '.join(default)}")
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
    """The pipeline configuration of :func:`add_pipeline_args`' options."""
    return RunConfig(
        embedding=EmbeddingConfig(n_prompts=args.n_prompts, n_shots=args.n_shots, seed=args.seed),
        site=SiteConfig(steps=args.steps, lr=args.lr, batch_size=args.batch_size, eval_every=args.eval_every,
                        sparsity=args.sparsity, seed=args.seed, fast=not args.full_prompts),
        eval=EvalConfig(n_test=args.n_test or None, n_shots=args.n_shots, seed=args.seed,
                        exact_match=not args.no_exact_match, max_new_tokens=args.max_new_tokens),
    )


def tasks_from_args(args: argparse.Namespace) -> list[Task]:
    """The tasks of :func:`add_task_args`' options."""
    return resolve_tasks(args.tasks, args.data_dir, seed=args.seed)


def load_from_args(args: argparse.Namespace, *, announce: bool = True) -> TransformerBridge:
    """The model of :func:`add_model_args`' options; prints its shape and load time."""
    dtype = getattr(torch, args.dtype) if args.dtype else None
    t0 = time.perf_counter()
    bridge = load_model(args.model, device=args.device, dtype=dtype, device_map=args.device_map,
                        load_in_4bit=args.load_in_4bit)
    if announce:
        print(f"model {model_id(bridge)}: {bridge.cfg.n_layers} layers x {bridge.cfg.n_heads} heads, "
              f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    return bridge


def check_output_dir(out: str | Path, option: str = "--out") -> Path:
    """``out`` (the value of ``option``) as a writable directory (created if missing), checked
    before any work is done."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {out} is a file; give a directory for the artifacts")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-test-"):
            pass
    except OSError as err:
        raise UserError(f"{option} {out} cannot be written ({err.strerror}); choose a directory you can write to") from None
    return path


def run_command(
    parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], int], argv: Sequence[str] | None = None
) -> int:
    """Parse ``argv``, set up logging, run ``body``; a :class:`UserError` becomes one line and exit 2."""
    args = parser.parse_args(argv)
    quiet = getattr(args, "quiet", False)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s")
    try:
        return body(args)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: finished artifacts and the training checkpoint are saved; run the same command "
              "again to resume", file=sys.stderr)
        return 130


__all__ = [
    "DEFAULT_TASKS",
    "add_model_args",
    "add_pipeline_args",
    "add_task_args",
    "check_output_dir",
    "config_from_args",
    "load_from_args",
    "run_command",
    "tasks_from_args",
]
