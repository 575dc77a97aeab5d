"""Prefix caches: the keys and values of every prompt token but the last, computed once.

Everything SITE injects sits at the last prompt token, and attention is causal, so the keys and
values of all earlier tokens depend neither on alpha nor on which heads are patched.
:class:`PrefixCache` holds them for many prompts; each training step, patching configuration or
transfer entry then runs the last token only (:func:`site_interp.scoring.last_token_logits`
with ``prefix=``). :func:`prefix_cache_for` decides whether a cache is exact and affordable and
stores it in pieces of similar prompt widths.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.batching import PREFIX_PIECE_OVERHEAD_TOKENS, unsplit, width_buckets
from site_interp.loading import model_device, output_head
from site_interp.prompts import left_pad, pad_id

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

log = logging.getLogger(__name__)


def _hf_config(bridge: TransformerBridge):
    return getattr(bridge.original_model, "config", None)


@dataclass
class PrefixCache:
    """Keys and values of every prompt's tokens except the last, for many prompts at once.

    Prompts are left-padded to one width, so any subset of rows can be stacked into a batch.
    """

    keys: list[Tensor]
    """Per layer ``[n, kv_heads, width - 1, d_head]`` (may be empty for KV-less layers)."""
    values: list[Tensor]
    """Per layer, like ``keys``."""
    mask: Int[Tensor, "n width"]
    """Attention mask over prefix + last token (1 = real token)."""
    last_ids: Int[Tensor, "n 1"]
    """The last token of each prompt."""
    hf_config: object
    """The model's config (layer types, e.g. sliding-window layers)."""

    @property
    def n(self) -> int:
        return self.last_ids.shape[0]

    def gather(self, rows: Int[Tensor, " batch"], width: int | None = None):
        """Keys, values, mask and last tokens of ``rows``, left-padded to ``width`` if wider."""
        rows = rows.to(self.last_ids.device)
        pad = 0 if width is None else width - self.mask.shape[1]
        keys = [F.pad(k[rows], (0, 0, pad, 0)) for k in self.keys]
        values = [F.pad(v[rows], (0, 0, pad, 0)) for v in self.values]
        return keys, values, F.pad(self.mask[rows], (pad, 0)), self.last_ids[rows]

    def select(self, rows: Int[Tensor, " batch"]):
        """A fresh cache (and last tokens, mask) for ``rows``; the stored tensors are untouched."""
        keys, values, mask, last = self.gather(rows)
        return _dynamic_cache(keys, values, self.hf_config), last, mask


@contextmanager
def _no_unembedding(bridge: TransformerBridge):
    """Within the block the unembedding sees zero positions (logits of shape ``[batch, 0, vocab]``):
    a forward run for its keys and values skips the vocabulary product (for gemma-3-270m about
    0.34 GFLOP per prompt, some 12% of a 12-token prefix)."""
    head = output_head(bridge)
    if head is None:
        yield
        return
    handle = head.register_forward_pre_hook(lambda module, inputs: (inputs[0][:, :0], *inputs[1:]))
    try:
        yield
    finally:
        handle.remove()


def _dynamic_cache(keys: list[Tensor], values: list[Tensor], hf_config):
    from transformers import DynamicCache

    return DynamicCache(ddp_cache_data=list(zip(keys, values)), config=hf_config)


class SegmentedPrefixCache:
    """Several :class:`PrefixCache` segments (e.g. one per task) behind one row index.

    Each segment is padded only to its own longest prompt; :meth:`select` pads the chosen rows to
    the longest among them. Short tasks thus never pay for a long task's prompts.
    """

    def __init__(self, segments: Sequence[PrefixCache], rows: Sequence[Int[Tensor, " n"]] | None = None):
        """``rows[i]``: the row indices of segment ``i``'s prompts (default: consecutive, in order).
        Together they must cover ``range(total prompts)`` exactly once."""
        self.segments = list(segments)
        sizes = [s.n for s in self.segments]
        if rows is None:
            starts = torch.tensor([0] + sizes).cumsum(0).tolist()
            rows = [torch.arange(starts[i], starts[i + 1]) for i in range(len(sizes))]
        rows = [torch.as_tensor(r, dtype=torch.long).cpu() for r in rows]
        n = sum(sizes)
        if [len(r) for r in rows] != sizes or not torch.equal(torch.sort(torch.cat(rows)).values, torch.arange(n)):
            raise ValueError("SegmentedPrefixCache: rows must give each segment's prompts and cover every row once")
        self.segment_of = torch.empty(n, dtype=torch.long)
        self.local = torch.empty(n, dtype=torch.long)
        for i, r in enumerate(rows):
            self.segment_of[r] = i
            self.local[r] = torch.arange(len(r))

    @property
    def n(self) -> int:
        return len(self.segment_of)

    def select(self, rows: Int[Tensor, " batch"]):
        rows = rows.cpu()
        seg = self.segment_of[rows]
        used = seg.unique().tolist()
        width = max(self.segments[i].mask.shape[1] for i in used)
        parts, order = [], []
        for i in used:
            pick = (seg == i).nonzero().flatten()
            parts.append(self.segments[i].gather(self.local[rows[pick]], width))
            order.append(pick)
        n_layers = len(parts[0][0])
        keys = [unsplit([p[0][layer] for p in parts], order) for layer in range(n_layers)]
        values = [unsplit([p[1][layer] for p in parts], order) for layer in range(n_layers)]
        mask = unsplit([p[2] for p in parts], order)
        last = unsplit([p[3] for p in parts], order)
        return _dynamic_cache(keys, values, self.segments[0].hf_config), last, mask


def prefix_cache_for(
    bridge: TransformerBridge,
    segments: Sequence[Sequence[Sequence[int]]],
    *,
    fast: bool = True,
    max_cache_gib: float = 8.0,
    piece_overhead: int = PREFIX_PIECE_OVERHEAD_TOKENS,
    progress: bool = False,
) -> SegmentedPrefixCache | None:
    """A prefix cache of prompts grouped in ``segments`` (e.g. one per task; rows numbered
    through the segments in order), or ``None`` when it would not be exact (sliding window),
    would exceed ``max_cache_gib``, or ``fast`` is off.

    Each segment is stored as :func:`width_buckets` pieces of similar prompt widths (cost of a
    piece: ``piece_overhead`` + rows x width), so a task whose prompts range from 10 to 200 tokens
    neither computes nor stores 200 tokens per row (FV-57's training and validation prompts, all
    tasks but squad_val: 619k padded prefix tokens as one piece per task, 333k in pieces).
    """
    flat = [ids for s in segments for ids in s]
    if not fast or not flat or not prefix_cache_fits(bridge, flat):
        return None
    pieces, rows, start = [], [], 0
    for seg in segments:
        widths = torch.tensor([len(ids) for ids in seg], dtype=torch.long)
        for group in width_buckets(widths, piece_overhead):
            pieces.append([seg[i] for i in group.tolist()])
            rows.append(group + start)
        start += len(seg)
    need = sum(prefix_cache_bytes(bridge, p) for p in pieces)
    if need > max_cache_gib * 2**30:
        log.info("prefix cache would take %.1f GiB (> %.1f): running full prompts", need / 2**30, max_cache_gib)
        return None
    bar = tqdm(pieces, desc=f"prefix caches ({len(flat)} prompts)", disable=not progress, leave=False)
    return SegmentedPrefixCache([build_prefix_cache(bridge, p) for p in bar], rows)


def prefix_cache_bytes(bridge: TransformerBridge, token_ids: Sequence[Sequence[int]]) -> int:
    """Memory a prefix cache of these prompts (padded to their longest) would take."""
    cfg = bridge.cfg
    kv_heads = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    per_token = cfg.n_layers * 2 * kv_heads * cfg.d_head * torch.finfo(cfg.dtype).bits // 8
    return len(token_ids) * (max(len(ids) for ids in token_ids) - 1) * per_token


def prefix_cache_fits(bridge: TransformerBridge, token_ids: Sequence[Sequence[int]]) -> bool:
    """Whether a :class:`PrefixCache` of these prompts is exact (no sliding window is exceeded)."""
    window = getattr(_hf_config(bridge), "sliding_window", None)
    return window is None or max(len(ids) for ids in token_ids) < window


@torch.no_grad()
def build_prefix_cache(
    bridge: TransformerBridge, token_ids: Sequence[Sequence[int]], *, batch_size: int = 32, progress: bool = False
) -> PrefixCache:
    """Run every prompt but its last token once, keeping keys and values (no hooks).

    Raises :class:`ValueError` when the padded prompts are longer than a sliding attention
    window (the cache would drop keys); :func:`prefix_cache_fits` tells beforehand.
    """
    if not prefix_cache_fits(bridge, token_ids):
        raise ValueError("prompts longer than the model's sliding attention window: run full prompts")
    device = model_device(bridge)
    ids, mask = left_pad(token_ids, pad_id(bridge.tokenizer), device)
    keys: list[list[Tensor]] = []
    values: list[list[Tensor]] = []
    starts = range(0, len(token_ids), batch_size)
    for start in tqdm(starts, desc="prefix cache", disable=not progress, leave=False):
        sl = slice(start, start + batch_size)
        with _no_unembedding(bridge):  # only the keys and values are kept
            _, cache = bridge(
                ids[sl, :-1], attention_mask=mask[sl, :-1], return_type="logits_and_cache", logits_to_keep=1
            )
        for i, layer in enumerate(cache.layers):
            if len(keys) <= i:
                keys.append([])
                values.append([])
            keys[i].append(layer.keys)
            values[i].append(layer.values)
    return PrefixCache(
        keys=[torch.cat(k) for k in keys],
        values=[torch.cat(v) for v in values],
        mask=mask,
        last_ids=ids[:, -1:],
        hf_config=_hf_config(bridge),
    )


__all__ = [
    "PrefixCache",
    "SegmentedPrefixCache",
    "build_prefix_cache",
    "prefix_cache_bytes",
    "prefix_cache_fits",
    "prefix_cache_for",
]
