"""Task embeddings: the mean of every head's output ``z`` at the last token of N-shot ICL prompts.

The same pass also records the mean residual stream at the input of every block at that token:
these are the task vectors of Hendel et al. (their prompts are exactly these: demonstrations
plus a query whose answer is not shown), so the task-vector baseline costs no extra forward.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.checks import check_int
from site_interp.hooks import capture_hooks, stack_captured
from site_interp.loading import model_context, model_device
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, icl_prompt_batch, left_pad, pad_id
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class EmbeddingConfig:
    """How a task embedding is extracted."""

    n_prompts: int = 50
    """M: number of ICL prompts averaged (queries drawn from train, with replacement if train is small)."""
    n_shots: int = 10
    """N: demonstrations per prompt, drawn from train, never the query itself."""
    batch_size: int = 8
    """Prompts per forward pass (left-padded)."""
    seed: int = 0
    """Seed for the queries and demonstrations."""

    def __post_init__(self) -> None:
        check_int(self.n_prompts, "n_prompts", minimum=1, option="--n-prompts")
        check_int(self.n_shots, "n_shots", minimum=1, option="--n-shots")
        check_int(self.batch_size, "batch_size", minimum=1)
        check_int(self.seed, "seed", minimum=0, option="--seed")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TaskEmbedding:
    """``t[layer, head]``: mean per-head attention output at the last token of ICL prompts."""

    task: str
    """Task name."""
    t: Float[Tensor, "layer head d_head"]
    """The embedding (float32, CPU)."""
    config: EmbeddingConfig
    """How it was made."""
    seconds: float = 0.0
    """Wall time of the extraction."""
    resid: Float[Tensor, "layer d_model"] | None = None
    """Mean residual stream at the input of every block at the same token (float32, CPU): the
    task vectors of Hendel et al., from the same prompts and forward. None when loaded from an
    artifact that predates it."""


@torch.no_grad()
def compute_task_embedding(
    bridge: TransformerBridge,
    task: Task,
    config: EmbeddingConfig = EmbeddingConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> TaskEmbedding:
    """Average ``blocks.L.attn.hook_z`` at the last token of ``config.n_prompts`` ICL prompts.

    Also averages ``blocks.L.hook_resid_pre`` there (``.resid``). Only the last position's logits
    are computed (``logits_to_keep=1``).
    """
    t0 = time.perf_counter()
    batch = icl_prompt_batch(
        bridge.tokenizer, task, config.n_prompts, config.n_shots, config.seed,
        max_length=model_context(bridge), template=template,
    )
    n_layers = bridge.cfg.n_layers
    total: Tensor | None = None
    resid = torch.zeros(n_layers, bridge.cfg.d_model)
    device = model_device(bridge)
    # prompts of similar length share a batch (less padding; the mean does not depend on order)
    by_length = sorted(range(len(batch)), key=lambda i: len(batch.token_ids[i]))
    starts = range(0, len(batch), config.batch_size)
    for start in tqdm(starts, desc=f"embedding {task.name}", disable=not progress, leave=False):
        chunk = [batch.token_ids[i] for i in by_length[start : start + config.batch_size]]
        ids, mask = left_pad(chunk, pad_id(bridge.tokenizer), device)
        store: dict = {}
        hooks = capture_hooks(n_layers, store) + capture_hooks(n_layers, store, act="resid_pre")
        bridge.run_with_hooks(ids, fwd_hooks=hooks, attention_mask=mask, logits_to_keep=1)
        z = stack_captured(store, n_layers).sum(0)  # [layer, head, d_head]
        total = z if total is None else total + z
        resid += stack_captured(store, n_layers, act="resid_pre").sum(0)  # [layer, d_model]
    assert total is not None
    return TaskEmbedding(task=task.name, t=total / len(batch), config=config, seconds=time.perf_counter() - t0,
                         resid=resid / len(batch))


__all__ = ["EmbeddingConfig", "TaskEmbedding", "compute_task_embedding"]
