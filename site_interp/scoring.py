"""Scoring prompts at their last token: logits, first-token correctness, answer log-probabilities.

Training, validation, patching, transfer and the baselines' layer scans all ask the same
question many times: "with this intervention at the last prompt token, what does the model
predict for this query, and how likely is its answer?". :class:`LastTokenScorer` holds 0-shot
prompts of one or many tasks once (with a prefix cache, so each question costs one token) and
answers it for any list of rows, each row with its own alphas and task embedding (SITE's
injection) and/or its own hooks, in large batches: one forward serves many tasks, many patching
configurations or many transfer entries.

Each batch of rows runs as forwards of similar prompt widths (:func:`~site_interp.batching.width_buckets`):
the logits are those of one forward (padding is masked), only cheaper.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.batching import BUCKET_OVERHEAD_TOKENS, unsplit, width_buckets
from site_interp.hooks import Hooks, injection_hooks
from site_interp.loading import model_device
from site_interp.prefix_cache import SegmentedPrefixCache, prefix_cache_for
from site_interp.prompts import PromptBatch, left_pad, pad_id

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

HooksFor = Callable[[Int[Tensor, " rows"]], Hooks]
"""Given the positions (in the scored ``rows``) of the rows of one forward, that forward's hooks."""


def last_token_logits(
    bridge: TransformerBridge,
    token_ids: Sequence[Sequence[int]] | None = None,
    hooks: Hooks = (),
    *,
    prefix: SegmentedPrefixCache | None = None,
    rows: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, "batch vocab"]:
    """Logits at the last prompt token, with ``hooks`` active.

    ``rows`` (optional) picks prompts. With a ``prefix`` cache of those prompts only their last
    token runs; otherwise the full prompts (``token_ids``) are left-padded and run. Gradients flow
    when called outside ``torch.no_grad``.
    """
    if prefix is not None:
        rows = torch.arange(prefix.n) if rows is None else rows
        cache, last, mask = prefix.select(rows)
        out = bridge.run_with_hooks(
            last, fwd_hooks=list(hooks), attention_mask=mask, past_key_values=cache, logits_to_keep=1
        )
        return out[:, -1]
    if rows is not None:
        token_ids = [token_ids[i] for i in rows.tolist()]
    ids, mask = left_pad(token_ids, pad_id(bridge.tokenizer), model_device(bridge))
    out = bridge.run_with_hooks(ids, fwd_hooks=list(hooks), attention_mask=mask, logits_to_keep=1)
    return out[:, -1]


@dataclass
class RowScores:
    """First-token outcome of scored rows."""

    pred: Int[Tensor, " n"]
    """Argmax token at the last prompt position."""
    target_logprob: Float[Tensor, " n"]
    """Log-probability of the answer's first token (float32)."""
    correct: Bool[Tensor, " n"]
    """``pred == target``."""

    @property
    def prob(self) -> Float[Tensor, " n"]:
        """Probability of the answer's first token."""
        return self.target_logprob.exp()

    @property
    def loss(self) -> Float[Tensor, " n"]:
        """Cross-entropy of the answer's first token (SITE's training loss)."""
        return -self.target_logprob


class LastTokenScorer:
    """0-shot prompts of several batches (usually one per task) under one row index.

    ``owner[row]`` is the index of the batch (task) a row came from; ``ranges[k]`` its rows.
    """

    def __init__(
        self,
        bridge: TransformerBridge,
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
        self.n_batches = len(batches)
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
        hooks_for: HooksFor | None = None,
    ) -> Float[Tensor, "batch vocab"]:
        """Last-token logits of ``rows``, each with its own alphas and embedding (None: no
        injection) and the hooks ``hooks_for`` gives its forward.

        Runs one forward per :func:`width_buckets` group; differentiable in ``alpha`` and ``t``.
        """
        groups = width_buckets(self.widths[rows.cpu()], self.bucket_overhead)
        parts = []
        for g in groups:
            hooks = injection_hooks(alpha[g.to(alpha.device)], t[g.to(t.device)]) if alpha is not None else []
            if hooks_for is not None:
                hooks = hooks + hooks_for(g)
            parts.append(last_token_logits(self.bridge, self.token_ids, hooks, prefix=self.prefix, rows=rows[g]))
        if len(parts) == 1 and torch.equal(groups[0], torch.arange(len(rows))):
            return parts[0]
        return unsplit(parts, groups)

    def losses(self, rows: Tensor, alpha: Tensor | None = None, t: Tensor | None = None) -> Float[Tensor, " batch"]:
        """Cross-entropy of each row's first answer token (differentiable in ``alpha`` and ``t``)."""
        logits = self.logits(rows, alpha, t).float()
        return F.cross_entropy(logits, self.targets[rows].to(logits.device), reduction="none").cpu()

    @torch.no_grad()
    def score(
        self,
        rows: Int[Tensor, " n"] | None = None,
        alpha: Float[Tensor, "n layer head"] | None = None,
        t: Float[Tensor, "n layer head d_head"] | None = None,
        *,
        alpha_index: Int[Tensor, " n"] | None = None,
        t_index: Int[Tensor, " n"] | None = None,
        hooks_for: HooksFor | None = None,
        chunk: int = 128,
        progress: bool = False,
        desc: str = "scoring",
    ) -> RowScores:
        """Prediction and answer log-probability of every row (default: all; repeats allowed), in
        chunks of ``chunk`` rows of similar widths.

        ``alpha`` and ``t`` are per row, or, with ``alpha_index`` / ``t_index``, tables indexed per
        row (e.g. a 57 x 57 transfer matrix: 57 embeddings instead of 168k copies, 12 GB).
        ``hooks_for(idx)`` gives the hooks of a forward from its rows' positions ``idx`` in ``rows``.
        """
        rows = torch.arange(len(self)) if rows is None else rows.cpu().long()
        pred = torch.zeros(len(rows), dtype=torch.long)
        logprob = torch.zeros(len(rows))
        order = torch.argsort(self.widths[rows], stable=True)
        for start in tqdm(range(0, len(rows), chunk), desc=desc, disable=not progress, leave=False):
            sel = order[start : start + chunk]
            local = None if hooks_for is None else (lambda g, sel=sel: hooks_for(sel[g]))
            logits = self.logits(rows[sel], _pick(alpha, sel, alpha_index), _pick(t, sel, t_index), local)
            logp = F.log_softmax(logits.float(), dim=-1).cpu()
            pred[sel] = logp.argmax(-1)
            logprob[sel] = logp.gather(1, self.targets[rows[sel]][:, None]).squeeze(1)
        return RowScores(pred=pred, target_logprob=logprob, correct=pred == self.targets[rows])

    def correct(self, rows: Int[Tensor, " n"], alpha: Tensor | None = None, t: Tensor | None = None,
                **kwargs) -> Bool[Tensor, " n"]:
        """First-token correctness of ``rows`` (:meth:`score`'s ``correct``; same arguments)."""
        return self.score(rows, alpha, t, **kwargs).correct

    def mean_losses(
        self,
        alpha: Float[Tensor, "n_batches layer head"] | None = None,
        t: Float[Tensor, "n_batches layer head d_head"] | None = None,
        *,
        chunk: int = 64,
    ) -> Float[Tensor, " n_batches"]:
        """Mean first-token loss of every batch (task) over all its rows, each batch with its own
        alphas and embedding (validation of SITE, or of anything hooked into the model, e.g. LoRA)."""
        kwargs = {} if alpha is None else {"alpha_index": self.owner, "t_index": self.owner}
        losses = self.score(None, alpha, t, chunk=chunk, **kwargs).loss
        sums = torch.zeros(self.n_batches).index_add(0, self.owner, losses)
        counts = torch.zeros(self.n_batches).index_add(0, self.owner, torch.ones_like(losses))
        return sums / counts


def _pick(values: Tensor | None, sel: Tensor, index: Tensor | None) -> Tensor | None:
    """``values`` of the selected rows (through ``index`` when the values are a table)."""
    if values is None:
        return None
    rows = sel if index is None else index[sel]
    return values[rows.to(values.device)]


__all__ = ["HooksFor", "LastTokenScorer", "RowScores", "last_token_logits"]
