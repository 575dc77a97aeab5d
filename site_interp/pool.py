"""A pool of 0-shot prompts (of one or many tasks) scored under per-row injections.

Training, patching and transfer all ask the same question many times: "with these alphas and
this task embedding injected at the last token, what does the model predict for this query?".
A :class:`PromptPool` holds the prompts once (with a prefix cache, so each question costs one
token) and answers it for any list of ``(row, alpha, t)`` in large batches: one forward serves
many tasks, many patching configurations or many transfer entries.

Rows are padded to the widest prompt of their forward, so a batch that mixes one long prompt
with many short ones pays the long width on every row (FV-57: squad_val's 348-token prefixes
against a median of 12). :func:`width_buckets` splits each batch into forwards of similar
widths when that saves more padded tokens than a forward's fixed cost; the logits are the same
(padding is masked), only cheaper.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.forward import BUCKET_OVERHEAD_TOKENS, last_token_logits, prefix_cache_for, unsplit, width_buckets
from site_interp.hooks import injection_hooks
from site_interp.prompts import PromptBatch


class PromptPool:
    """0-shot prompts of several batches (usually one per task) under one index.

    ``owner[row]`` is the index of the batch (task) a row came from; ``ranges[k]`` its rows.
    """

    def __init__(
        self,
        bridge,
        batches: Sequence[PromptBatch],
        *,
        fast: bool = True,
        max_cache_gib: float = 8.0,
        bucket_overhead: int = BUCKET_OVERHEAD_TOKENS,
        progress: bool = False,
    ):
        self.bridge = bridge
        self.bucket_overhead = bucket_overhead
        """Passed to :func:`width_buckets` (0: one forward per distinct width; huge: never split)."""
        self.token_ids = [ids for b in batches for ids in b.token_ids]
        self.targets = torch.cat([b.target_ids for b in batches])
        self.owner = torch.cat([torch.full((len(b),), k, dtype=torch.long) for k, b in enumerate(batches)])
        starts = torch.tensor([0] + [len(b) for b in batches]).cumsum(0).tolist()
        self.ranges = [torch.arange(starts[k], starts[k + 1]) for k in range(len(batches))]
        self.prefix = prefix_cache_for(bridge, [b.token_ids for b in batches], fast=fast, max_cache_gib=max_cache_gib,
                                       progress=progress)
        if self.prefix is not None:  # a row is padded to its cache piece's width at least
            seg_width = torch.tensor([s.mask.shape[1] for s in self.prefix.segments])
            self.widths = seg_width[self.prefix.segment_of]
        else:
            self.widths = torch.tensor([len(ids) for ids in self.token_ids], dtype=torch.long)

    def __len__(self) -> int:
        return len(self.token_ids)

    def logits(
        self,
        rows: Int[Tensor, " batch"],
        alpha: Float[Tensor, "batch layer head"] | None = None,
        t: Float[Tensor, "batch layer head d_head"] | None = None,
    ) -> Float[Tensor, "batch vocab"]:
        """Last-token logits of ``rows``, each with its own alphas and embedding (None: no injection).

        Runs one forward per :func:`width_buckets` group; differentiable in ``alpha`` and ``t``.
        """
        groups = width_buckets(self.widths[rows.cpu()], self.bucket_overhead)
        parts = []
        for g in groups:
            hooks = injection_hooks(alpha[g.to(alpha.device)], t[g.to(t.device)]) if alpha is not None else []
            parts.append(last_token_logits(self.bridge, self.token_ids, hooks, prefix=self.prefix, rows=rows[g]))
        if len(parts) == 1 and torch.equal(groups[0], torch.arange(len(rows))):
            return parts[0]
        return unsplit(parts, groups)

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
        alpha_index: Int[Tensor, " n"] | None = None,
        t_index: Int[Tensor, " n"] | None = None,
        chunk: int = 128,
        progress: bool = False,
        desc: str = "scoring",
    ) -> Bool[Tensor, " n"]:
        """First-token correctness of every row, in chunks of ``chunk`` rows of similar widths.

        ``alpha`` and ``t`` are per row, or, with ``alpha_index`` / ``t_index``, tables indexed per
        row (e.g. a 57 x 57 transfer matrix: 57 embeddings instead of 168k copies, 12 GB).
        """
        if len(rows) == 0:
            return torch.zeros(0, dtype=torch.bool)
        order = torch.argsort(self.widths[rows.cpu()], stable=True)
        out = torch.empty(len(rows), dtype=torch.bool)
        for start in tqdm(range(0, len(rows), chunk), desc=desc, disable=not progress, leave=False):
            sel = order[start : start + chunk]
            a = _pick(alpha, sel, alpha_index)
            tt = _pick(t, sel, t_index)
            pred = self.logits(rows[sel], a, tt).argmax(-1).cpu()
            out[sel] = pred == self.targets[rows[sel]]
        return out


def _pick(values: Tensor | None, sel: Tensor, index: Tensor | None) -> Tensor | None:
    """``values`` of the selected rows (through ``index`` when the values are a table)."""
    if values is None:
        return None
    rows = sel if index is None else index[sel]
    return values[rows.to(values.device)]
