"""The training loop SITE and the LoRA baseline share: Adam, validation, keep the best.

Both train a few parameters of a frozen model on the first-answer-token cross-entropy of 0-shot
prompts, validate every ``eval_every`` steps (and after the last) and return the parameters
with the lowest validation loss, with their step, never simply the last ones. SITE trains many
tasks in one loop (one loss per task; each task keeps its own best), LoRA one.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.artifacts import ArtifactMismatchError, load_if_valid, save_artifact
from site_interp.errors import TrainingDivergedError

log = logging.getLogger(__name__)


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


class Checkpoint:
    """Where a training run saves its progress at every validation, so an interrupted run
    (Ctrl-C, a killed process) resumes at its last validated step with exactly the state it had:
    the parameters, Adam's moments and step counts, each task's best-so-far state and history.

    ``key`` says what is being trained (model, tasks, settings, inputs); a checkpoint made for
    anything else is ignored and overwritten. Saved through :func:`~site_interp.artifacts.save_artifact`
    (atomic; damaged files are ignored), removed by :meth:`remove` once the result is saved.
    """

    def __init__(self, path: str | Path, key: dict):
        self.path = Path(path)
        self.key = key

    def save(self, step: int, params: Sequence[Tensor], opt: torch.optim.Optimizer, best: list[Best],
             histories: list[list[dict]]) -> None:
        tensors = {f"param.{i}": p.detach() for i, p in enumerate(params)}
        state = opt.state_dict()
        for i, st in state["state"].items():
            for name, value in st.items():
                tensors[f"adam.{i}.{name}"] = torch.as_tensor(value)
        for k, b in enumerate(best):
            items = b.state.items() if isinstance(b.state, dict) else [("", b.state)]
            for name, value in items:
                tensors[f"best.{k}.{name}"] = value
        info = {"step": step, "best": [{"loss": b.loss, "step": b.step, "dict": isinstance(b.state, dict)} for b in best],
                "histories": histories}
        save_artifact(self.path, tensors, self.key, info)

    def load(self, params: Sequence[Tensor], opt: torch.optim.Optimizer, n_tasks: int) -> tuple[int, list[Best], list[list[dict]]] | None:
        """Restore ``params`` and ``opt`` in place; returns (step, best, histories), or None when
        there is no checkpoint of this training."""
        try:
            cached = load_if_valid(self.path, self.key)
        except ArtifactMismatchError:
            return None  # another training's checkpoint: it is overwritten at the next validation
        if cached is None:
            return None
        tensors, meta = cached
        if len(meta.get("best", [])) != n_tasks or len(meta.get("histories", [])) != n_tasks:
            return None
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(tensors[f"param.{i}"])
        state = opt.state_dict()
        for i in range(len(params)):
            prefix = f"adam.{i}."
            state["state"][i] = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
        opt.load_state_dict(state)
        best = []
        for k, b in enumerate(meta["best"]):
            prefix = f"best.{k}."
            if b["dict"]:
                value = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
            else:
                value = tensors[prefix]
            best.append(Best(b["loss"], b["step"], value))
        return meta["step"], best, meta["histories"]

    @staticmethod
    def unfinished_groups(directory: str | Path) -> list[tuple[list[str], Checkpoint]]:
        """Task names and checkpoint of every training group with a checkpoint in ``directory``:
        groups whose results were not all saved (a checkpoint is removed only after that)."""
        groups = []
        for sidecar in Path(directory).glob("site-*.json"):
            try:
                key = json.loads(sidecar.read_text())["key"]
                groups.append(([name for name, _ in key["tasks"]], Checkpoint(sidecar.with_suffix(".safetensors"), key)))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # damaged: ignored, as load() would
        return groups

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        self.path.with_suffix(".json").unlink(missing_ok=True)


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
    checkpoint: Checkpoint | None = None,
) -> tuple[list[Best], list[list[dict]]]:
    """Adam on ``params`` for ``steps`` steps; returns each task's best state and history.

    ``train_losses(step)`` gives one differentiable loss per task (their sum, plus
    ``penalty()``, is minimised; a task's parameters only get its own loss's gradient when they
    are disjoint); ``valid_losses()`` one validation loss per task; ``snapshot(k)`` the state of
    task ``k`` worth keeping. ``validate_first`` also validates the initial state (step 0).
    A loss that is not finite raises :class:`~site_interp.errors.TrainingDivergedError` naming
    the tasks and ``hint``. With a ``checkpoint`` the state is saved at every validation and a
    run resumes from it: the result is the same as an uninterrupted run's, bit for bit.
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

    opt = torch.optim.Adam(list(params), lr=lr)
    resumed = checkpoint.load(params, opt, n_tasks) if checkpoint is not None else None
    first = 1
    if resumed is not None:
        done, best, histories = resumed
        first = done + 1
        log.info("resuming %s at step %d from %s", ", ".join(names), first, checkpoint.path)
    elif validate_first:
        start = [{"step": 0} for _ in range(n_tasks)]
        validate(0, start)
        for k in range(n_tasks):
            histories[k].append(start[k])
    label = ", ".join(names)
    bar = tqdm(range(first, steps + 1), desc=f"{desc} {label}"[:60], disable=not progress, leave=False)
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
        validating = step % eval_every == 0 or step == steps
        if validating:
            v = validate(step, rows)
            bar.set_postfix(valid=f"{float(v.mean()):.3f}")
        for k in range(n_tasks):
            histories[k].append(rows[k])
        if validating and checkpoint is not None:
            checkpoint.save(step, params, opt, best, histories)
    for k in range(n_tasks):
        if not math.isfinite(best[k].loss):
            raise TrainingDivergedError(f"{names[k]}: the validation loss is {best[k].loss}; {hint}")
    return best, histories


__all__ = ["Best", "Checkpoint", "FitResult", "step_schedule", "train_keep_best"]
