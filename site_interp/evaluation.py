"""Evaluation on the test split: 0-shot, N-shot ICL and 0-shot + injection, side by side.

Two metrics per query:

* **first token**: the argmax at the last prompt token equals the answer's first token (in context);
* **exact match**: greedy generation (KV cache, up to ``max_new_tokens``, stopping early once
  the outcome is decided), first line, stripped;
  correct when it starts with the target and the target ends at a word boundary
  (``"Paris, France"`` matches ``Paris``; ``"Parisian"`` does not). Both sides are lower-cased
  unless the task is case-sensitive (capitalisation tasks).

Injected methods run at the last prompt token only, on the prompt pass; 0-shot methods share
one prefix cache, so each extra method costs one token per query.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.checks import check_int
from site_interp.errors import ConfigError
from site_interp.generation import greedy_generate
from site_interp.hooks import HookFn, Hooks, injection_hooks
from site_interp.loading import model_context
from site_interp.prefix_cache import prefix_cache_for
from site_interp.prompts import DEFAULT_TEMPLATE, PromptBatch, PromptTemplate, build_prompts
from site_interp.scoring import last_token_logits
from site_interp.stats import bootstrap_ci
from site_interp.tasks.core import Task, TaskError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

Metric = Literal["first_token", "exact_match"]
"""The two accuracy metrics: the argmax's first token, or greedy generation (see the module doc)."""

MAX_BATCH_TOKENS = 16384
"""Rows x longest prompt per full-prompt forward (ICL, generation): long prompts run in smaller
batches, since eager attention materialises rows x heads x length^2 scores. Results do not depend on it."""


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation settings."""

    n_test: int | None = 50
    """Test queries per task (the first ones of the test split); None = all."""
    n_shots: int = 10
    """Demonstrations in the ICL baseline (from train, seeded, never the query)."""
    seed: int = 0
    """Seed of the ICL demonstrations."""
    batch_size: int = 64
    """Prompts per forward pass (generation is memory-bound on CPU: large batches pay off)."""
    exact_match: bool = True
    """Also generate and score exact match (slower than first token alone)."""
    max_new_tokens: int = 20
    """Generation budget for exact match."""

    def __post_init__(self) -> None:
        check_int(self.n_test, "n_test", minimum=1, none_ok=True, option="--n-test")
        check_int(self.n_shots, "n_shots", minimum=0, option="--n-shots")
        check_int(self.seed, "seed", minimum=0, option="--seed")
        check_int(self.batch_size, "batch_size", minimum=1)
        check_int(self.max_new_tokens, "max_new_tokens", minimum=1, option="--max-new-tokens")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Method:
    """One way of answering: a prompt format plus an optional SITE injection and/or any hooks
    (a baseline's steering vector, a patched head set...), all active on the prompt pass."""

    name: str
    """Label in tables (``0-shot``, ``10-shot ICL``, ``SITE``...)."""
    n_shots: int = 0
    """Demonstrations in the prompt."""
    alpha: Float[Tensor, "layer head"] | None = None
    """Per-head injection weights (None: no injection)."""
    t: Float[Tensor, "layer head d_head"] | None = None
    """The task embedding injected with ``alpha``."""
    fwd_hooks: tuple[tuple[str, HookFn], ...] = ()
    """Further hooks (they edit the last prompt token), after the injection."""

    def __post_init__(self) -> None:
        if self.alpha is not None and self.t is None:
            raise ValueError(f"method {self.name!r} has alphas but no task embedding")

    def hooks(self) -> Hooks:
        """Everything this method hooks into the prompt pass."""
        injected = injection_hooks(self.alpha, self.t) if self.alpha is not None else []
        return injected + list(self.fwd_hooks)


def standard_methods(
    t: Float[Tensor, "layer head d_head"] | None = None, alpha: Float[Tensor, "layer head"] | None = None,
    n_shots: int = 10,
) -> list[Method]:
    """0-shot, N-shot ICL and (when ``alpha`` is given) 0-shot + SITE."""
    methods = [Method("0-shot"), Method(f"{n_shots}-shot ICL", n_shots=n_shots)]
    if alpha is not None:
        methods.append(Method("SITE", alpha=alpha, t=t))
    return methods


def normalize(text: str, case_sensitive: bool) -> str:
    text = text.strip()
    return text if case_sensitive else text.lower()


def exact_match_decided(generation: str, target: str) -> bool:
    """Whether more tokens can no longer change :func:`exact_match` (a line ended, or the first
    line is already longer than the target), so generation can stop early."""
    text = generation.lstrip()
    return "\n" in text or len(text) > len(target.strip())


def exact_match(generation: str, target: str, case_sensitive: bool = False) -> bool:
    """First line of ``generation`` starts with ``target`` at a word boundary (see module doc)."""
    lines = generation.strip().splitlines()
    pred = normalize(lines[0] if lines else "", case_sensitive)
    gold = normalize(target, case_sensitive)
    if not pred.startswith(gold):
        return False
    rest = pred[len(gold) :]
    return not rest or not (rest[0].isalnum() and gold[-1:].isalnum())


@dataclass
class TaskEvaluation:
    """Per-query outcomes of several methods on one task."""

    task: str
    """Task name."""
    records: list[dict] = field(default_factory=list)
    """One row per (method, query): method, query, target, pred_token, first_token, generation, exact_match."""
    seconds: float = 0.0
    """Wall time."""

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.records)

    def accuracy(self, method: str, metric: Metric = "first_token") -> float:
        vals = [r[metric] for r in self.records if r["method"] == method and r.get(metric) is not None]
        return float(sum(vals) / len(vals)) if vals else float("nan")

    def summary(self, ci: bool = True) -> pd.DataFrame:
        """Accuracy per method (percent), with 95% bootstrap intervals over queries."""
        df = self.to_dataframe()
        rows = []
        for method, g in df.groupby("method", sort=False):
            row = {"task": self.task, "method": method, "n": len(g)}
            for metric in ("first_token", "exact_match"):
                if metric in g and g[metric].notna().all():
                    vals = g[metric].astype(float).tolist()
                    row[metric] = 100 * sum(vals) / len(vals)
                    if ci:
                        lo, hi = bootstrap_ci(vals)
                        row[f"{metric}_lo"], row[f"{metric}_hi"] = 100 * lo, 100 * hi
            rows.append(row)
        return pd.DataFrame(rows)


@torch.no_grad()
def evaluate(
    bridge: TransformerBridge,
    task: Task,
    methods: list[Method],
    config: EvalConfig = EvalConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> TaskEvaluation:
    """Score every method on the first ``config.n_test`` test queries of ``task``."""
    t0 = time.perf_counter()
    queries = task.test[: config.n_test] if config.n_test else task.test
    if not queries:
        raise TaskError(f"{task.name}: the test split is empty")
    batches: dict[int, PromptBatch] = {}
    for m in methods:
        if m.n_shots not in batches:
            batches[m.n_shots] = build_prompts(
                bridge.tokenizer, queries, n_shots=m.n_shots, demo_pool=task.train, seed=config.seed,
                template=template, max_length=model_context(bridge), task=task.name,
            )
    context = model_context(bridge)
    longest = max(len(ids) for b in batches.values() for ids in b.token_ids)
    if config.exact_match and context is not None and longest + config.max_new_tokens > context:
        raise ConfigError(f"{task.name}: the longest prompt has {longest} tokens, and {config.max_new_tokens} new tokens "
                          f"(--max-new-tokens) would run past the model's context of {context}; lower "
                          "--max-new-tokens or --n-shots")
    zero = batches.get(0)
    # 0-shot methods share one prefix cache (only needed for first-token scoring)
    prefix = prefix_cache_for(bridge, [zero.token_ids], fast=not config.exact_match) if zero is not None else None
    result = TaskEvaluation(task=task.name)
    for m in tqdm(methods, desc=f"eval {task.name}", disable=not progress, leave=False):
        batch = batches[m.n_shots]
        hooks = m.hooks()
        preds: list[int] = []
        gens: list[str | None] = []
        step = config.batch_size
        if config.exact_match or m.n_shots > 0:  # full prompts: bound the tokens per forward (attention memory)
            step = max(1, min(step, MAX_BATCH_TOKENS // max(map(len, batch.token_ids))))
        for start in range(0, len(batch), step):
            rows = torch.arange(start, min(start + step, len(batch)))
            ids = [batch.token_ids[i] for i in rows.tolist()]
            if config.exact_match:
                # the first generated token is the argmax at the last prompt token
                golds = [batch.targets[i] for i in rows.tolist()]
                out = greedy_generate(bridge, ids, hooks, max_new_tokens=config.max_new_tokens,
                                      stop=lambda i, text: exact_match_decided(text, golds[i]))
                preds.extend(g[0] for g in out)
                gens.extend(bridge.tokenizer.decode(g, skip_special_tokens=True) for g in out)
                continue
            logits = last_token_logits(bridge, batch.token_ids, hooks, prefix=prefix if m.n_shots == 0 else None,
                                       rows=rows)
            preds.extend(logits.argmax(-1).tolist())
            gens.extend([None] * len(ids))
        for q, target_id, pred, gen in zip(queries, batch.target_ids.tolist(), preds, gens):
            result.records.append({
                "task": task.name, "method": m.name, "query": q["input"], "target": q["output"],
                "pred_token": bridge.tokenizer.decode([pred]), "first_token": pred == target_id,
                "generation": gen,
                "exact_match": None if gen is None else exact_match(gen, q["output"], task.case_sensitive),
            })
    result.seconds = time.perf_counter() - t0
    return result


__all__ = [
    "EvalConfig",
    "Method",
    "Metric",
    "TaskEvaluation",
    "evaluate",
    "exact_match",
    "exact_match_decided",
    "standard_methods",
]
