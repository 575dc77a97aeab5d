"""SITE's training: learn one ``alpha = sigmoid(logit)`` per head with the model frozen.

At the last token of 0-shot prompts every head's output becomes
``(1 - alpha) * z + alpha * t``; Adam minimises the cross-entropy of the answer's first token
(plus an optional sparsity penalty ``coef * sum(alpha)``). Every ``eval_every`` steps the
validation loss is measured and the alphas with the lowest one are returned, with their step
(the loop is :func:`site_interp.trainer.train_keep_best`, shared with the LoRA baseline).

Two equivalent execution paths (same alphas up to float rounding, see tests):
``fast=True`` caches the prompt prefix once and runs only the last token per step;
``fast=False`` runs the whole 0-shot prompt every step, as the paper's procedure does.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from site_interp.checks import check_float, check_int
from site_interp.embeddings import TaskEmbedding
from site_interp.errors import ConfigError
from site_interp.prefix_cache import prefix_cache_bytes
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, encode, zero_shot_batch
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Task
from site_interp.trainer import Checkpoint, FitResult, step_schedule, train_keep_best

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


MAX_LR = 10.0
"""The largest learning rate :class:`SiteConfig` accepts: Adam moves every alpha logit by about
``lr`` per step, so beyond this the alphas saturate at exactly 0 or 1 and validation cannot tell
steps apart."""


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

    def __post_init__(self) -> None:
        check_int(self.steps, "steps", minimum=1, option="--steps")
        # Adam moves every logit by about lr per step: beyond 10, alphas saturate at exactly 0 or 1
        check_float(self.lr, "lr", above=0, maximum=MAX_LR, option="--lr")
        check_int(self.batch_size, "batch_size", minimum=1, option="--batch-size")
        check_int(self.eval_every, "eval_every", minimum=1, option="--eval-every")
        check_int(self.n_valid, "n_valid", minimum=1, none_ok=True)
        check_float(self.sparsity, "sparsity", minimum=0, option="--sparsity")
        check_int(self.seed, "seed", minimum=0, option="--seed")

    def to_dict(self) -> dict:
        return asdict(self)

    def result_key(self) -> dict:
        """The fields that change the trained alphas (``fast`` only changes float rounding)."""
        d = self.to_dict()
        d.pop("fast")
        return d


@dataclass(kw_only=True)
class SiteResult(FitResult):
    """Trained alphas and how training went (``best_step``, ``best_valid_loss``, ``history``,
    ``seconds`` as in :class:`~site_interp.trainer.FitResult`)."""

    alpha: Float[Tensor, "layer head"]
    """The selected alphas (best validation loss), float32 on CPU."""
    config: SiteConfig = field(default_factory=SiteConfig)
    """The settings used."""

    @property
    def n_selected(self) -> int:
        """Heads with alpha > 0.5."""
        return int((self.alpha > 0.5).sum())


def train_site(
    bridge: TransformerBridge,
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
    bridge: TransformerBridge,
    tasks: Sequence[Task],
    embeddings: Sequence[TaskEmbedding | Float[Tensor, "layer head d_head"]],
    config: SiteConfig = SiteConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
    max_cache_gib: float = 8.0,
    on_group: Callable[[list[int], list[SiteResult]], None] | None = None,
    checkpoint_dir: str | Path | None = None,
    checkpoint_key: dict | None = None,
) -> list[SiteResult]:
    """Train the alphas of several tasks at once, each on its own rows of one shared batch.

    Each task keeps its own parameters, schedule of training examples (seeded as if alone),
    validation and best step. The loss summed over tasks has, for each task's alphas, exactly
    that task's gradient, and Adam acts element-wise, so this equals training every task
    separately (up to float rounding) while every weight read serves all tasks. Tasks are
    trained in groups whose prefix caches fit in ``max_cache_gib``; ``on_group(indices, results)``
    is called as each group finishes (e.g. to save its alphas, so an interrupted run keeps them).
    With ``checkpoint_dir``, each group also saves its progress there at every validation and
    resumes from it (:class:`~site_interp.trainer.Checkpoint`; ``checkpoint_key`` adds what the
    caller knows, e.g. the model id); the checkpoint is removed after ``on_group``.
    """
    results: dict[int, SiteResult] = {}
    for group in training_groups(bridge, tasks, config, max_cache_gib):
        members, embs = [tasks[k] for k in group], [embeddings[k] for k in group]
        checkpoint = None
        if checkpoint_dir is not None:
            key = {**(checkpoint_key or {}), "tasks": [[t.name, t.fingerprint()] for t in members],
                   "embeddings": [_tensor_hash(e.t if isinstance(e, TaskEmbedding) else e) for e in embs],
                   "site": config.to_dict(), "template": asdict(template)}
            name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
            checkpoint = Checkpoint(Path(checkpoint_dir) / f"site-{name}.safetensors", key)
        trained = _train_joint(bridge, members, embs, config, template=template, progress=progress,
                               max_cache_gib=max_cache_gib, checkpoint=checkpoint)
        results.update(zip(group, trained))
        if on_group is not None:
            on_group(list(group), list(trained))
        if checkpoint is not None:
            checkpoint.remove()
    return [results[k] for k in range(len(tasks))]


def _tensor_hash(t: Tensor) -> str:
    return hashlib.sha256(t.detach().float().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def training_rows(bridge: TransformerBridge, task: Task, config: SiteConfig, template: PromptTemplate = DEFAULT_TEMPLATE):
    """``task``'s step schedule as if trained alone (per step, rows of the batch) and the 0-shot
    batch of the training examples it visits (only those are prepared at all)."""
    order = step_schedule(len(task.train), config.steps, config.batch_size, config.seed)
    used = sorted({i for rows in order for i in rows})
    local = {row: k for k, row in enumerate(used)}
    subset = Task(task.name, [task.train[i] for i in used], task.valid, task.test)
    return [[local[i] for i in rows] for rows in order], zero_shot_batch(bridge, subset, "train", template=template)


def training_groups(bridge: TransformerBridge, tasks: Sequence[Task], config: SiteConfig, max_cache_gib: float) -> list[list[int]]:
    """Groups of task indices whose training + validation caches fit the budget.

    Tasks are taken shortest prompts first, so that rows padded together have similar lengths.
    """
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
    bridge: TransformerBridge,
    tasks: Sequence[Task],
    embeddings: Sequence[TaskEmbedding | Float[Tensor, "layer head d_head"]],
    config: SiteConfig,
    *,
    template: PromptTemplate,
    progress: bool,
    max_cache_gib: float,
    checkpoint: Checkpoint | None = None,
) -> list[SiteResult]:
    t0 = time.perf_counter()
    ts = torch.stack([e.t if isinstance(e, TaskEmbedding) else e for e in embeddings]).float()
    n_tasks, n_layers, n_heads = ts.shape[:3]
    if (n_layers, n_heads) != (bridge.cfg.n_layers, bridge.cfg.n_heads):
        raise ConfigError(
            f"{tasks[0].name}: task embeddings have {n_layers} layers x {n_heads} heads but the model has "
            f"{bridge.cfg.n_layers} x {bridge.cfg.n_heads}: they were made with another model"
        )
    # each task's schedule as if trained alone; only the examples it visits are prepared at all
    schedules, train_batches = map(list, zip(*(training_rows(bridge, task, config, template) for task in tasks)))
    train = LastTokenScorer(bridge, train_batches, fast=config.fast, max_cache_gib=max_cache_gib, progress=progress)
    valid_batches = [zero_shot_batch(bridge, task, "valid", config.n_valid, template=template) for task in tasks]
    valid = LastTokenScorer(bridge, valid_batches, fast=config.fast, max_cache_gib=max_cache_gib, progress=progress)

    logit = torch.zeros(n_tasks, n_layers, n_heads, requires_grad=True)

    def train_losses(step: int) -> Tensor:
        rows = torch.cat([train.ranges[k][schedules[k][step - 1]] for k in range(n_tasks)])
        alpha = torch.sigmoid(logit)
        losses = train.losses(rows, alpha[train.owner[rows]], ts[train.owner[rows]])
        return torch.zeros(n_tasks).index_add(0, train.owner[rows], losses) / config.batch_size

    best, histories = train_keep_best(
        [logit], train_losses, lambda: valid.mean_losses(torch.sigmoid(logit.detach()), ts),
        lambda k: torch.sigmoid(logit.detach()[k]).clone(),
        names=[task.name for task in tasks], steps=config.steps, lr=config.lr, eval_every=config.eval_every,
        penalty=(lambda: config.sparsity * torch.sigmoid(logit).sum()) if config.sparsity else None,
        what="the SITE loss", desc="SITE", progress=progress,
        hint=f"lower the learning rate (--lr, now {config.lr}) or check the task embedding for NaNs",
        checkpoint=checkpoint,
    )
    seconds = time.perf_counter() - t0
    return [
        SiteResult(task=task.name, alpha=b.state, best_step=b.step, best_valid_loss=b.loss,
                   history=histories[k], seconds=seconds / n_tasks, config=config)
        for k, (task, b) in enumerate(zip(tasks, best))
    ]


def uniform_alpha(n_layers: int, n_heads: int, value: float = 0.5) -> Float[Tensor, "layer head"]:
    """A constant alpha (0.5 is SITE's starting point), for controls."""
    return torch.full((n_layers, n_heads), float(value))


__all__ = ["SiteConfig", "SiteResult", "train_site", "train_site_many", "training_groups", "training_rows", "uniform_alpha"]
