"""A pool of 0-shot prompts (of one or many tasks) scored under per-row injections.

Training, patching and transfer all ask the same question many times: "with these alphas and
this task embedding injected at the last token, what does the model predict for this query?".
A :class:`PromptPool` holds the prompts once (with a prefix cache, so each question costs one
token) and answers it for any list of ``(row, alpha, t)`` in large batches: one forward serves
many tasks, many patching configurations or many transfer entries.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.forward import last_token_logits, prefix_cache_for
from site_interp.hooks import injection_hooks
from site_interp.prompts import PromptBatch


class PromptPool:
    """0-shot prompts of several batches (usually one per task) under one index.

    ``owner[row]`` is the index of the batch (task) a row came from; ``ranges[k]`` its rows.
    """

    def __init__(self, bridge, batches: Sequence[PromptBatch], *, fast: bool = True, max_cache_gib: float = 8.0):
        self.bridge = bridge
        self.token_ids = [ids for b in batches for ids in b.token_ids]
        self.targets = torch.cat([b.target_ids for b in batches])
        self.owner = torch.cat([torch.full((len(b),), k, dtype=torch.long) for k, b in enumerate(batches)])
        starts = torch.tensor([0] + [len(b) for b in batches]).cumsum(0).tolist()
        self.ranges = [torch.arange(starts[k], starts[k + 1]) for k in range(len(batches))]
        self.prefix = prefix_cache_for(bridge, [b.token_ids for b in batches], fast=fast, max_cache_gib=max_cache_gib)

    def __len__(self) -> int:
        return len(self.token_ids)

    def logits(
        self,
        rows: Int[Tensor, " batch"],
        alpha: Float[Tensor, "batch layer head"] | None = None,
        t: Float[Tensor, "batch layer head d_head"] | None = None,
    ) -> Float[Tensor, "batch vocab"]:
        """Last-token logits of ``rows``, each with its own alphas and embedding (None: no injection)."""
        hooks = injection_hooks(alpha, t) if alpha is not None else []
        return last_token_logits(self.bridge, self.token_ids, hooks, prefix=self.prefix, rows=rows)

    def losses(self, rows: Tensor, alpha: Tensor | None = None, t: Tensor | None = None) -> Float[Tensor, " batch"]:
        """Cross-entropy of each row's first answer token (differentiable in ``alpha`` and ``t``)."""
        logits = self.logits(rows, alpha, t).float()
        return F.cross_entropy(logits, self.targets[rows].to(logits.device), reduction="none").cpu()

    @torch.no_grad()
    def correct(
        self,
        rows: Int[Tensor, " n"],
        alpha: Float[Tensor, "n layer head"] | None = None,
        t: Float[Tensor, "n layer head d_head"] | None = None,
        *,
        chunk: int = 128,
        progress: bool = False,
        desc: str = "scoring",
    ) -> Bool[Tensor, " n"]:
        """First-token correctness of every row, in chunks of ``chunk`` rows."""
        out = []
        for start in tqdm(range(0, len(rows), chunk), desc=desc, disable=not progress, leave=False):
            sl = slice(start, start + chunk)
            a = alpha[sl] if alpha is not None else None
            tt = t[sl] if t is not None else None
            pred = self.logits(rows[sl], a, tt).argmax(-1).cpu()
            out.append(pred == self.targets[rows[sl]])
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.bool)
