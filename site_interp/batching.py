"""Splitting a batch of prompts into forwards of similar widths, and putting the rows back.

Rows of a forward are padded to its widest prompt, so one long prompt in a batch makes every row
pay its width (FV-57: squad_val's 348-token prefixes against a median of 12).
:func:`width_buckets` finds the split into groups of similar widths that minimises padded
tokens plus a fixed cost per forward (exact dynamic programming); :func:`unsplit` undoes any
split of a batch. Scoring and prefix caches both use them.
"""

from __future__ import annotations

from typing import Sequence

import torch
from jaxtyping import Int
from torch import Tensor

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
    if not torch.equal(torch.sort(order).values, torch.arange(len(order))):
        raise ValueError(f"unsplit: the picks must together be a permutation of range({len(order)})")
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[order] = torch.arange(len(order))
    return torch.cat(list(parts))[inverse.to(parts[0].device)]


__all__ = ["BUCKET_OVERHEAD_TOKENS", "PREFIX_PIECE_OVERHEAD_TOKENS", "unsplit", "width_buckets"]
