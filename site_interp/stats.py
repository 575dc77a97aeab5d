"""Small statistics helpers shared by evaluation and the studies."""

from __future__ import annotations

from typing import Sequence

import numpy as np


def bootstrap_ci(
    values: Sequence[float], *, n_boot: int = 1000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean of ``values``."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def hierarchical_ci(
    groups: Sequence[Sequence[float]], *, n_boot: int = 2000, level: float = 0.95, seed: int = 0
) -> tuple[float, float]:
    """Percentile interval of the mean over groups (tasks) of each group's mean over its members
    (seeds), resampling both levels: groups with replacement, then members within each drawn group.

    This is the interval over tasks **and** seeds: it widens with the spread between tasks and
    with the noise between seeds of one task. A group with one member contributes no seed noise
    (its one value is always drawn). Empty groups are ignored.
    """
    groups = [np.asarray(g, dtype=float) for g in groups if len(g)]
    if not groups:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    sizes = np.array([g.size for g in groups])
    width = int(sizes.max())
    table = np.full((len(groups), width), np.nan)
    for i, g in enumerate(groups):
        table[i, : g.size] = g
    picks = rng.integers(0, len(groups), size=(n_boot, len(groups)))  # tasks drawn
    members = (rng.random((n_boot, len(groups), width)) * sizes[picks][..., None]).astype(int)  # seeds drawn
    drawn = np.take_along_axis(table[picks], members, axis=2)  # [boot, groups, width]
    used = np.arange(width) < sizes[picks][..., None]  # a group of s members draws s of them
    means = (np.where(used, drawn, 0.0).sum(axis=2) / sizes[picks]).mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)
