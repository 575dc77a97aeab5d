"""Soft head selection: learn ``alpha = sigmoid(logit)`` per head with the model frozen.

At the last token of 0-shot prompts every head's output becomes
``(1 - alpha) * z + alpha * t``; Adam minimises the cross-entropy of the answer's first token
(plus an optional sparsity penalty ``coef * sum(alpha)``). Every ``eval_every`` steps the
validation loss is measured and the alphas with the lowest one are returned, with their step.

Two equivalent execution paths (same alphas up to float rounding, see tests):
``fast=True`` caches the prompt prefix once and runs only the last token per step;
``fast=False`` runs the whole 0-shot prompt every step, as the paper's procedure does.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.embeddings import TaskEmbedding
from site_interp.pool import PromptPool
from site_interp.prompts import DEFAULT_TEMPLATE, PromptBatch, PromptTemplate, build_prompts, model_context
from site_interp.tasks import Task, TaskError


@dataclass(frozen=True)
class SiteConfig:
    """Alpha training settings (defaults: the paper's)."""

    steps: int = 400
    """Adam steps."""
    lr: float = 0.2
    """Adam learning rate on the alpha logits."""
    batch_size: int = 1
    """0-shot train prompts per step (the paper: 1). Larger batches average the gradient over
    more queries: steadier and, per example, cheaper; 8 x 100 steps matched 1 x 400 on
    gemma-3-270m."""
    eval_every: int = 50
    """Validate every this many steps (and after the last); the best validation loss wins."""
    n_valid: int | None = 100
    """Validation queries: the first ``n_valid`` of the valid split (None: all of it). Capped so
    that tasks with large valid splits (commonsense_qa: 987) do not spend more time validating
    than training."""
    sparsity: float = 0.0
    """Coefficient of ``sum(alpha)`` added to the loss (0 = the paper)."""
    seed: int = 0
    """Seeds the order of training examples."""
    fast: bool = True
    """Reuse the prompt prefix (last token only per step); False runs full prompts."""

    def to_dict(self) -> dict:
        return asdict(self)

    def result_key(self) -> dict:
        """The fields that change the trained alphas (``fast`` only changes float rounding)."""
        d = self.to_dict()
        d.pop("fast")
        return d


@dataclass
class SiteResult:
    """Trained alphas and how training went."""

    task: str
    """Task name."""
    alpha: Float[Tensor, "layer head"]
    """The selected alphas (best validation loss), float32 on CPU."""
    best_step: int
    """The step whose alphas were kept."""
    best_valid_loss: float
    """Their validation loss."""
    history: list[dict] = field(default_factory=list)
    """One row per step: ``step``, ``train_loss``, and ``valid_loss`` where validated."""
    seconds: float = 0.0
    """Training wall time (prefix caching included)."""
    config: SiteConfig = field(default_factory=SiteConfig)
    """The settings used."""

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.history)

    @property
    def n_selected(self) -> int:
        """Heads with alpha > 0.5."""
        return int((self.alpha > 0.5).sum())


def zero_shot_batch(bridge, task: Task, split: str, limit: int | None = None, template: PromptTemplate = DEFAULT_TEMPLATE) -> PromptBatch:
    """Tokenized 0-shot prompts of one split (the first ``limit`` examples)."""
    examples = task.split(split)[:limit] if limit else task.split(split)
    if not examples:
        raise TaskError(f"{task.name}: the {split} split is empty")
    return build_prompts(bridge.tokenizer, examples, template=template, max_length=model_context(bridge), task=task.name)


def _order(n: int, steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Rows for each step: epochs of seeded permutations, cut into batches."""
    g = torch.Generator().manual_seed(seed)
    flat: list[int] = []
    while len(flat) < steps * batch_size:
        flat.extend(torch.randperm(n, generator=g).tolist())
    return [flat[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


def train_site(
    bridge,
    task: Task,
    embedding: TaskEmbedding | Float[Tensor, "layer head d_head"],
    config: SiteConfig = SiteConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> SiteResult:
    """Learn one alpha per head for ``task`` (see the module docstring)."""
    return train_site_many(bridge, [task], [embedding], config, template=template, progress=progress)[0]


def train_site_many(
    bridge,
    tasks: Sequence[Task],
    embeddings: Sequence[TaskEmbedding | Float[Tensor, "layer head d_head"]],
    config: SiteConfig = SiteConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
    max_cache_gib: float = 8.0,
    on_group: Callable[[list[int], list[SiteResult]], None] | None = None,
) -> list[SiteResult]:
    """Train the alphas of several tasks at once, each on its own rows of one shared batch.

    Each task keeps its own parameters, schedule of training examples (seeded as if alone),
    validation and best step. The loss summed over tasks has, for each task's alphas, exactly
    that task's gradient, and Adam acts element-wise, so this equals training every task
    separately (up to float rounding) while every weight read serves all tasks. Tasks are
    trained in groups whose prefix caches fit in ``max_cache_gib``; ``on_group(indices, results)``
    is called as each group finishes (e.g. to save its alphas, so an interrupted run keeps them).
    """
    results: dict[int, SiteResult] = {}
    for group in _groups(bridge, tasks, config, max_cache_gib):
        trained = _train_joint(bridge, [tasks[k] for k in group], [embeddings[k] for k in group], config,
                               template=template, progress=progress, max_cache_gib=max_cache_gib)
        results.update(zip(group, trained))
        if on_group is not None:
            on_group(list(group), list(trained))
    return [results[k] for k in range(len(tasks))]


def _groups(bridge, tasks: Sequence[Task], config: SiteConfig, max_cache_gib: float) -> list[list[int]]:
    """Groups of task indices whose training + validation caches fit the budget.

    Tasks are taken shortest prompts first, so that rows padded together have similar lengths.
    """
    from site_interp.forward import prefix_cache_bytes
    from site_interp.prompts import encode

    budget = max_cache_gib * 2**30
    per_row, needs = [], []
    for task in tasks:
        n_rows = min(len(task.train), config.steps * config.batch_size)
        n_valid = len(task.valid) if config.n_valid is None else min(len(task.valid), config.n_valid)
        sample = [encode(bridge.tokenizer, e["input"]) for e in task.train[:200] + task.valid[:200]]
        # prompt = template + input: a few tokens more than the input alone
        per_row.append(prefix_cache_bytes(bridge, [s + [0] * 8 for s in sample]) / len(sample))
        needs.append(per_row[-1] * (n_rows + n_valid))
    groups: list[list[int]] = [[]]
    used = 0.0
    for k in sorted(range(len(tasks)), key=lambda i: per_row[i]):  # shortest prompts first
        need = needs[k]
        if groups[-1] and used + need > budget:
            groups.append([])
            used = 0.0
        groups[-1].append(k)
        used += need
    return groups


def _train_joint(
    bridge,
    tasks: Sequence[Task],
    embeddings: Sequence[TaskEmbedding | Float[Tensor, "layer head d_head"]],
    config: SiteConfig,
    *,
    template: PromptTemplate,
    progress: bool,
    max_cache_gib: float,
) -> list[SiteResult]:
    t0 = time.perf_counter()
    ts = torch.stack([e.t if isinstance(e, TaskEmbedding) else e for e in embeddings]).float()
    n_tasks, n_layers, n_heads = ts.shape[:3]
    if (n_layers, n_heads) != (bridge.cfg.n_layers, bridge.cfg.n_heads):
        raise ValueError(
            f"{tasks[0].name}: task embeddings have {n_layers} layers x {n_heads} heads but the model has "
            f"{bridge.cfg.n_layers} x {bridge.cfg.n_heads}: they were made with another model"
        )
    # each task's schedule as if trained alone; only the examples it visits are prepared at all
    schedules, train_batches = [], []
    for task in tasks:
        order = _order(len(task.train), config.steps, config.batch_size, config.seed)
        used = sorted({i for rows in order for i in rows})
        local = {row: k for k, row in enumerate(used)}
        schedules.append([[local[i] for i in rows] for rows in order])
        subset = Task(task.name, [task.train[i] for i in used], task.valid, task.test)
        train_batches.append(zero_shot_batch(bridge, subset, "train", template=template))
    train = PromptPool(bridge, train_batches, fast=config.fast, max_cache_gib=max_cache_gib, progress=progress)
    valid_batches = [zero_shot_batch(bridge, t, "valid", config.n_valid, template=template) for t in tasks]
    valid = PromptPool(bridge, valid_batches, fast=config.fast, max_cache_gib=max_cache_gib, progress=progress)

    logit = torch.zeros(n_tasks, n_layers, n_heads, requires_grad=True)
    opt = torch.optim.Adam([logit], lr=config.lr)
    best = [(math.inf, 0, torch.full((n_layers, n_heads), 0.5)) for _ in tasks]
    histories: list[list[dict]] = [[] for _ in tasks]
    names = ", ".join(t.name for t in tasks)
    bar = tqdm(range(1, config.steps + 1), desc=f"SITE {names}"[:60], disable=not progress, leave=False)
    for step in bar:
        rows = torch.cat([train.ranges[k][schedules[k][step - 1]] for k in range(n_tasks)])
        alpha = torch.sigmoid(logit)
        losses = train.losses(rows, alpha[train.owner[rows]], ts[train.owner[rows]])
        task_loss = torch.zeros(n_tasks).index_add(0, train.owner[rows], losses) / config.batch_size
        total = task_loss.sum()
        if config.sparsity:
            total = total + config.sparsity * alpha.sum()
        if not torch.isfinite(total):
            bad = [tasks[k].name for k in range(n_tasks) if not torch.isfinite(task_loss[k])] or [names]
            raise FloatingPointError(
                f"{', '.join(bad)}: the SITE loss became {total.item()} at step {step}; lower the learning "
                f"rate (--lr, now {config.lr}) or check the task embedding for NaNs"
            )
        opt.zero_grad(set_to_none=True)
        total.backward()
        opt.step()
        validate = step % config.eval_every == 0 or step == config.steps
        v_loss = _valid_losses(valid, torch.sigmoid(logit.detach()), ts, n_tasks) if validate else None
        for k in range(n_tasks):
            row = {"step": step, "train_loss": float(task_loss[k].detach())}
            if v_loss is not None:
                row["valid_loss"] = float(v_loss[k])
                if v_loss[k] < best[k][0]:
                    best[k] = (float(v_loss[k]), step, torch.sigmoid(logit.detach()[k]).clone())
            histories[k].append(row)
        if v_loss is not None:
            bar.set_postfix(valid=f"{float(v_loss.mean()):.3f}")
    seconds = time.perf_counter() - t0
    return [
        SiteResult(task=task.name, alpha=best[k][2], best_step=best[k][1], best_valid_loss=best[k][0],
                   history=histories[k], seconds=seconds / n_tasks, config=config)
        for k, task in enumerate(tasks)
    ]


@torch.no_grad()
def _valid_losses(pool: PromptPool, alpha: Tensor, t: Tensor, n_tasks: int, chunk: int = 64) -> Tensor:
    """Mean validation loss per task."""
    parts = []
    for start in range(0, len(pool), chunk):
        rows = torch.arange(start, min(start + chunk, len(pool)))
        owner = pool.owner[rows]
        parts.append(pool.losses(rows, alpha[owner], t[owner]))
    losses = torch.cat(parts)
    sums = torch.zeros(n_tasks).index_add(0, pool.owner, losses)
    counts = torch.zeros(n_tasks).index_add(0, pool.owner, torch.ones_like(losses))
    return sums / counts


def uniform_alpha(n_layers: int, n_heads: int, value: float = 0.5) -> Float[Tensor, "layer head"]:
    """A constant alpha (0.5 is SITE's starting point), for controls."""
    return torch.full((n_layers, n_heads), float(value))


__all__: Sequence[str] = ["SiteConfig", "SiteResult", "train_site", "train_site_many", "uniform_alpha", "zero_shot_batch"]
