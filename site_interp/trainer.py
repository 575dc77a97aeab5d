"""The training loop SITE and the LoRA baseline share: Adam, validation, keep the best.

Both train a few parameters of a frozen model on the first-answer-token cross-entropy of 0-shot
prompts, validate every ``eval_every`` steps (and after the last) and return the parameters
with the lowest validation loss, with their step, never simply the last ones. SITE trains many
tasks in one loop (one loss per task; each task keeps its own best), LoRA one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.errors import TrainingDivergedError


def step_schedule(n: int, steps: int, batch_size: int, seed: int) -> list[list[int]]:
    """Example indices for each step: epochs of seeded permutations of ``range(n)``, cut into batches."""
    g = torch.Generator().manual_seed(seed)
    flat: list[int] = []
    while len(flat) < steps * batch_size:
        flat.extend(torch.randperm(n, generator=g).tolist())
    return [flat[i * batch_size : (i + 1) * batch_size] for i in range(steps)]


@dataclass
class FitResult:
    """How a keep-best training run went for one task (SITE's and LoRA's results extend it)."""

    task: str
    """Task name."""
    best_step: int
    """The step whose parameters were kept (0: the initial ones)."""
    best_valid_loss: float
    """Their validation loss."""
    history: list[dict] = field(default_factory=list)
    """One row per step: ``step``, ``train_loss``, and ``valid_loss`` where validated."""
    seconds: float = 0.0
    """Training wall time."""

    def to_dataframe(self) -> pd.DataFrame:
        """The history, one row per step."""
        return pd.DataFrame(self.history)


@dataclass
class Best:
    """The best validated state of one task so far."""

    loss: float
    step: int
    state: Any


def train_keep_best(
    params: Sequence[Tensor],
    train_losses: Callable[[int], Float[Tensor, " task"]],
    valid_losses: Callable[[], Float[Tensor, " task"]],
    snapshot: Callable[[int], Any],
    *,
    names: Sequence[str],
    steps: int,
    lr: float,
    eval_every: int,
    penalty: Callable[[], Tensor] | None = None,
    validate_first: bool = False,
    what: str = "the loss",
    hint: str = "lower the learning rate",
    desc: str = "training",
    progress: bool = True,
) -> tuple[list[Best], list[list[dict]]]:
    """Adam on ``params`` for ``steps`` steps; returns each task's best state and history.

    ``train_losses(step)`` gives one differentiable loss per task (their sum, plus
    ``penalty()``, is minimised; a task's parameters only get its own loss's gradient when they
    are disjoint); ``valid_losses()`` one validation loss per task; ``snapshot(k)`` the state of
    task ``k`` worth keeping. ``validate_first`` also validates the initial state (step 0).
    A loss that is not finite raises :class:`~site_interp.errors.TrainingDivergedError` naming
    the tasks and ``hint``.
    """
    n_tasks = len(names)
    best = [Best(math.inf, 0, snapshot(k)) for k in range(n_tasks)]
    histories: list[list[dict]] = [[] for _ in range(n_tasks)]

    def validate(step: int, rows: list[dict]) -> Tensor:
        with torch.no_grad():
            v = valid_losses()
        for k in range(n_tasks):
            rows[k]["valid_loss"] = float(v[k])
            if v[k] < best[k].loss:
                best[k] = Best(float(v[k]), step, snapshot(k))
        return v

    if validate_first:
        start = [{"step": 0} for _ in range(n_tasks)]
        validate(0, start)
        for k in range(n_tasks):
            histories[k].append(start[k])
    opt = torch.optim.Adam(list(params), lr=lr)
    label = ", ".join(names)
    bar = tqdm(range(1, steps + 1), desc=f"{desc} {label}"[:60], disable=not progress, leave=False)
    for step in bar:
        with torch.enable_grad():
            task_loss = train_losses(step)
            total = task_loss.sum() + (penalty() if penalty is not None else 0.0)
            if not torch.isfinite(total):
                bad = [names[k] for k in range(n_tasks) if not torch.isfinite(task_loss[k])] or [label]
                raise TrainingDivergedError(f"{', '.join(bad)}: {what} became {total.item()} at step {step}; {hint}")
            opt.zero_grad(set_to_none=True)
            total.backward()
        opt.step()
        rows = [{"step": step, "train_loss": float(task_loss[k].detach())} for k in range(n_tasks)]
        if step % eval_every == 0 or step == steps:
            v = validate(step, rows)
            bar.set_postfix(valid=f"{float(v.mean()):.3f}")
        for k in range(n_tasks):
            histories[k].append(rows[k])
    for k in range(n_tasks):
        if not math.isfinite(best[k].loss):
            raise TrainingDivergedError(f"{names[k]}: the validation loss is {best[k].loss}; {hint}")
    return best, histories


__all__ = ["Best", "FitResult", "step_schedule", "train_keep_best"]
