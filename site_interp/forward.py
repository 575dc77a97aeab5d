"""Running the model: last-token logits, reusable prefix caches, greedy generation.

Everything SITE injects sits at the last prompt token, and attention is causal, so the keys and
values of all earlier tokens depend neither on alpha nor on which heads are patched.
:class:`PrefixCache` computes them once; each training step, patching configuration or transfer
entry then runs the last token only (:func:`last_token_logits` with ``prefix=``).
Logits are computed only where they are scored (``logits_to_keep=1``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.hooks import Hooks
from site_interp.prompts import left_pad, pad_id

log = logging.getLogger(__name__)


BUCKET_OVERHEAD_TOKENS = 2048
"""A forward's fixed cost (weight reads, Python) in padded row-tokens: a batch is split into
forwards of similar widths only where that saves more than this many padded tokens per extra
forward. Measured on gemma-3-270m, CPU: a forward costs ~0.22 s beyond its rows, a padded
row-token ~0.13 ms, i.e. ~1700 row-tokens."""


PREFIX_PIECE_OVERHEAD_TOKENS = 128
"""The same trade-off for building a prefix cache, where a padded token costs a whole token's
forward (~5 ms on gemma-3-270m, 1 CPU thread) against the ~0.22 s of one more forward: pieces
of similar widths are almost always worth it."""


def width_buckets(widths: Int[Tensor, " n"], overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[Int[Tensor, " k"]]:
    """Split rows into groups (indices into ``widths``) that minimise padded cost.

    The cost of a group is ``overhead + rows * widest``; groups are contiguous in width order
    (optimal by exchange), found exactly by dynamic programming over the distinct widths.
    """
    if len(widths) == 0:
        return []
    order = torch.argsort(widths, stable=True)
    distinct, counts = torch.unique_consecutive(widths[order], return_counts=True)
    w, c = distinct.tolist(), counts.tolist()
    m = len(w)
    best = [0.0] + [float("inf")] * m  # best[j]: cost of the first j distinct widths
    cut = [0] * (m + 1)
    for j in range(1, m + 1):
        rows = 0
        for i in range(j - 1, -1, -1):  # group = distinct widths i .. j-1
            rows += c[i]
            cost = best[i] + overhead + rows * w[j - 1]
            if cost < best[j]:
                best[j], cut[j] = cost, i
    bounds, j = [], m
    while j > 0:
        bounds.append((cut[j], j))
        j = cut[j]
    starts = [0] + torch.tensor(c).cumsum(0).tolist()
    return [order[starts[i] : starts[j]] for i, j in reversed(bounds)]


def unsplit(parts: Sequence[Tensor], picks: Sequence[Int[Tensor, " n"]]) -> Tensor:
    """Undo a split of a batch: ``parts[i]`` holds rows ``picks[i]`` (together a permutation of
    ``range(batch)``); returns them concatenated in the original row order."""
    order = torch.cat([p.cpu() for p in picks])
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[order] = torch.arange(len(order))
    return torch.cat(list(parts))[inverse.to(parts[0].device)]


def model_device(bridge) -> torch.device:
    """The device of the input embedding (where token ids must go)."""
    return bridge.cfg.device if isinstance(bridge.cfg.device, torch.device) else torch.device(bridge.cfg.device or "cpu")


def _hf_config(bridge):
    return getattr(bridge.original_model, "config", None)


def last_token_logits(
    bridge,
    token_ids: Sequence[Sequence[int]] | None = None,
    hooks: Hooks = (),
    *,
    prefix: "PrefixCache | None" = None,
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
    device = model_device(bridge)
    ids, mask = left_pad(token_ids, pad_id(bridge.tokenizer), device)
    out = bridge.run_with_hooks(ids, fwd_hooks=list(hooks), attention_mask=mask, logits_to_keep=1)
    return out[:, -1]


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
    bridge,
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


def prefix_cache_bytes(bridge, token_ids: Sequence[Sequence[int]]) -> int:
    """Memory a prefix cache of these prompts (padded to their longest) would take."""
    cfg = bridge.cfg
    kv_heads = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
    per_token = cfg.n_layers * 2 * kv_heads * cfg.d_head * torch.finfo(cfg.dtype).bits // 8
    return len(token_ids) * (max(len(t) for t in token_ids) - 1) * per_token


def prefix_cache_fits(bridge, token_ids: Sequence[Sequence[int]]) -> bool:
    """Whether a :class:`PrefixCache` of these prompts is exact (no sliding window is exceeded)."""
    window = getattr(_hf_config(bridge), "sliding_window", None)
    return window is None or max(len(t) for t in token_ids) < window


@torch.no_grad()
def build_prefix_cache(
    bridge, token_ids: Sequence[Sequence[int]], *, batch_size: int = 32, progress: bool = False
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


@torch.no_grad()
def greedy_generate(
    bridge,
    token_ids: Sequence[Sequence[int]],
    prompt_hooks: Hooks = (),
    *,
    max_new_tokens: int = 20,
    use_cache: bool = True,
    stop_at_newline: bool = True,
    stop: Callable[[int, str], bool] | None = None,
) -> list[list[int]]:
    """Greedy continuation of left-padded prompts.

    ``prompt_hooks`` are active on the prompt pass only. With the KV cache (default) the later
    steps run one token each and are untouched by the hooks; without it every step reruns the
    whole sequence, with the hooks still editing the original last prompt position (the same
    computation, slower; the tests compare both). A row also stops at EOS, at a newline
    (``stop_at_newline``) or when ``stop(row, text_so_far)`` says so; the batch stops when every
    row has.
    """
    device = model_device(bridge)
    tok = bridge.tokenizer
    ids, mask = left_pad(token_ids, pad_id(tok), device)
    width = ids.shape[1]
    eos = tok.eos_token_id
    generated: list[list[int]] = [[] for _ in token_ids]
    active = list(range(len(token_ids)))  # original row of each row still running
    cache = None
    for step in range(max_new_tokens):
        if step == 0 or not use_cache:
            hooks = _shift_hooks(prompt_hooks, width) if step else prompt_hooks
            with bridge.hooks(fwd_hooks=list(hooks)):
                logits, cache = bridge(
                    ids, attention_mask=mask, return_type="logits_and_cache", logits_to_keep=1,
                    use_cache=use_cache,
                )
        else:
            logits, cache = bridge(
                ids[:, -1:], attention_mask=mask, past_key_values=cache, return_type="logits_and_cache"
            )
        nxt = logits[:, -1].argmax(-1)
        finished = []
        for j, (row, t) in enumerate(zip(active, nxt.tolist())):
            if row < 0:  # finished earlier; still in the batch (uncached path keeps every row)
                continue
            generated[row].append(t)
            text = tok.decode(generated[row], skip_special_tokens=True) if (stop_at_newline or stop) else ""
            if (t == eos) or (stop_at_newline and "\n" in text) or (stop is not None and stop(row, text)):
                finished.append(j)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        for j in finished:
            active[j] = -1
        if all(row < 0 for row in active):
            break
        if use_cache and finished:
            # drop finished rows: later steps cost only what is still running
            keep = torch.tensor([j for j, row in enumerate(active) if row >= 0], device=device)
            cache.batch_select_indices(keep)
            ids, mask = ids[keep], mask[keep]
            active = [active[j] for j in keep.tolist()]
    return generated


def _shift_hooks(prompt_hooks: Hooks, width: int) -> Hooks:
    """Prompt hooks rebuilt for a longer sequence: they must edit position ``width - 1``.

    Hooks are opaque functions, so instead of rebuilding them we crop: run the hook on the
    prompt part of ``z`` only and keep the generated positions as they are.
    """

    def crop(fn):
        def hook(z, *, hook=None):
            head = fn(z[:, :width], hook=hook)
            return torch.cat([head, z[:, width:]], dim=1)

        return hook

    return [(name, crop(fn)) for name, fn in prompt_hooks]


__all__ = [
    "PrefixCache",
    "SegmentedPrefixCache",
    "prefix_cache_bytes",
    "prefix_cache_for",
    "build_prefix_cache",
    "prefix_cache_fits",
    "width_buckets",
    "BUCKET_OVERHEAD_TOKENS",
    "PREFIX_PIECE_OVERHEAD_TOKENS",
    "unsplit",
    "greedy_generate",
    "last_token_logits",
    "model_device",
]
