"""Head-overlap similarity between tasks, a permutation yardstick for it, stability and clustering.

SITE learns one scalar ``alpha[layer, head]`` in [0, 1] per task.  Two tasks "share heads" when
their important heads (top-k, or alpha above a threshold) overlap.  Raw overlaps are misleading:
with unregularised alphas about half of all heads exceed 0.5, so two *random* head sets already
have a Jaccard index of about 1/3.  :func:`overlap_table` therefore reports every observed overlap
next to its chance level (exact expectation and a permutation null).

Alphas may be torch tensors or numpy arrays of shape ``[layer, head]``; results are plain Python
numbers, numpy arrays or pandas DataFrames.  Flat head indices are ``layer * n_heads + head``.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd
from jaxtyping import Bool, Float
from scipy import stats
from scipy.cluster.hierarchy import leaves_list, linkage
from scipy.spatial.distance import squareform
from torch import Tensor

from site_interp.errors import ConfigError

Alpha = Float[Tensor, "layer head"] | Float[np.ndarray, "layer head"]
Mask = Bool[np.ndarray, "layer head"]

SimilarityMetric = Literal["jaccard", "cosine", "spearman"]
"""Jaccard of head sets (top-k or alpha above a threshold), or cosine / Spearman of the raw alphas."""
METRICS: tuple[SimilarityMetric, ...] = ("jaccard", "cosine", "spearman")
MAX_DISTANCE = 2.0

__all__ = [
    "METRICS",
    "SimilarityMetric",
    "bottom_k_mask",
    "cluster_tasks",
    "cosine",
    "expected_jaccard",
    "head_ranking",
    "heads_of",
    "jaccard",
    "jaccard_null",
    "overlap_table",
    "random_k_mask",
    "similarity_matrix",
    "similarity_to_distance",
    "similarity_vs_transfer",
    "spearman",
    "stability_table",
    "threshold_mask",
    "top_k_mask",
    "within_vs_across",
]


# --------------------------------------------------------------------------- head sets


def _np(alpha: Alpha) -> np.ndarray:
    """Alpha as a float64 numpy array of shape [layer, head]."""
    a = alpha.detach().cpu().double().numpy() if isinstance(alpha, Tensor) else np.asarray(alpha, dtype=float)
    if a.ndim != 2:
        raise ValueError(f"alpha must have shape [layer, head], got shape {tuple(a.shape)}")
    return a


def _check_k(k: int, n: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise ConfigError(f"k must be an integer in 0..{n} (the number of heads), got {k!r}")
    if not 0 <= k <= n:
        raise ConfigError(f"k must be in 0..{n} (the number of heads), got {k}")
    return int(k)


def _mask_from_flat(shape: tuple[int, int], idx: np.ndarray) -> Mask:
    mask = np.zeros(int(np.prod(shape)), dtype=bool)
    mask[idx] = True
    return mask.reshape(shape)


def head_ranking(alpha: Alpha) -> np.ndarray:
    """Flat head indices (``layer * n_heads + head``) by descending alpha; ties keep the lower index first."""
    flat = _np(alpha).ravel()
    return np.argsort(-flat, kind="stable")


def top_k_mask(alpha: Alpha, k: int) -> Mask:
    """Boolean ``[layer, head]`` mask of the ``k`` heads with the highest alpha (the first k of :func:`head_ranking`)."""
    a = _np(alpha)
    k = _check_k(k, a.size)
    return _mask_from_flat(a.shape, head_ranking(a)[:k])


def bottom_k_mask(alpha: Alpha, k: int) -> Mask:
    """Mask of the ``k`` heads with the lowest alpha: the *last* k of :func:`head_ranking`.

    Using the same ranking as :func:`top_k_mask` guarantees that top-k and bottom-k are disjoint
    whenever ``2k <= n`` even when alphas tie (among tied heads the higher index counts as lower).
    """
    a = _np(alpha)
    k = _check_k(k, a.size)
    ranking = head_ranking(a)
    return _mask_from_flat(a.shape, ranking[ranking.size - k :])


def random_k_mask(shape: tuple[int, int], k: int, seed: int | None = 0) -> Mask:
    """Mask of ``k`` heads drawn uniformly without replacement (``numpy.random.default_rng(seed)``)."""
    shape = (int(shape[0]), int(shape[1]))
    n = shape[0] * shape[1]
    k = _check_k(k, n)
    idx = np.random.default_rng(seed).choice(n, size=k, replace=False)
    return _mask_from_flat(shape, idx)


def threshold_mask(alpha: Alpha, threshold: float = 0.5) -> Mask:
    """Mask of the heads whose alpha strictly exceeds ``threshold``."""
    return _np(alpha) > threshold


def heads_of(mask: Mask) -> list[tuple[int, int]]:
    """The ``(layer, head)`` pairs selected by ``mask``, in row-major order."""
    m = np.asarray(mask, dtype=bool)
    if m.ndim != 2:
        raise ValueError(f"mask must have shape [layer, head], got shape {m.shape}")
    return [(int(layer), int(head)) for layer, head in np.argwhere(m)]


def _head_set(alpha: Alpha, k: int | None, threshold: float | None) -> Mask:
    """Top-k if ``k`` is given, otherwise alpha > threshold (0.5 by default)."""
    if k is not None and threshold is not None:
        raise ValueError("give either k (top-k heads) or threshold (alpha > threshold), not both")
    if k is not None:
        return top_k_mask(alpha, k)
    return threshold_mask(alpha, 0.5 if threshold is None else threshold)


# --------------------------------------------------------------------------- pairwise measures


def _jaccard_counts(inter: np.ndarray | int, union: np.ndarray | int) -> np.ndarray:
    """``inter / union`` with 1.0 where the union is empty (both sets empty)."""
    inter = np.asarray(inter, dtype=float)
    union = np.asarray(union, dtype=float)
    return np.where(union > 0, inter / np.maximum(union, 1.0), 1.0)


def jaccard(mask_a: Mask, mask_b: Mask) -> float:
    """Jaccard index ``|A ∩ B| / |A ∪ B|`` of two head masks; 1.0 when both are empty."""
    a = np.asarray(mask_a, dtype=bool)
    b = np.asarray(mask_b, dtype=bool)
    if a.shape != b.shape:
        raise ValueError(f"masks have different shapes: {a.shape} vs {b.shape}")
    return float(_jaccard_counts(int((a & b).sum()), int((a | b).sum())))


def _flat_pair(alpha_a: Alpha, alpha_b: Alpha) -> tuple[np.ndarray, np.ndarray]:
    a, b = _np(alpha_a), _np(alpha_b)
    if a.shape != b.shape:
        raise ValueError(f"alphas have different shapes: {a.shape} vs {b.shape}")
    return a.ravel(), b.ravel()


def cosine(alpha_a: Alpha, alpha_b: Alpha) -> float:
    """Cosine similarity of the flattened alphas; nan if either is all zeros."""
    a, b = _flat_pair(alpha_a, alpha_b)
    norm = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norm) if norm > 0 else float("nan")


def spearman(alpha_a: Alpha, alpha_b: Alpha) -> float:
    """Spearman rank correlation of the flattened alphas; nan (silently) if either is constant."""
    a, b = _flat_pair(alpha_a, alpha_b)
    if a.size < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(a, b).statistic)


def similarity_matrix(
    alphas: Mapping[str, Alpha],
    metric: SimilarityMetric = "jaccard",
    k: int | None = None,
    threshold: float | None = None,
) -> pd.DataFrame:
    """Tasks × tasks similarity (index and columns = task names in input order).

    ``metric`` is ``"jaccard"`` (of top-k head sets if ``k`` is given, else of alpha > ``threshold``,
    default 0.5), ``"cosine"`` or ``"spearman"`` (of the raw alphas; ``k``/``threshold`` are ignored).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; options: {', '.join(METRICS)}")
    names = list(alphas)
    arrays = [_np(alphas[name]) for name in names]
    if len({a.shape for a in arrays}) > 1:
        raise ValueError(f"alphas have different shapes: {sorted({a.shape for a in arrays})}")
    masks = [_head_set(a, k, threshold) for a in arrays] if metric == "jaccard" else []
    measure = cosine if metric == "cosine" else spearman
    out = np.full((len(names), len(names)), np.nan)
    for i, j in itertools.combinations_with_replacement(range(len(names)), 2):
        value = jaccard(masks[i], masks[j]) if metric == "jaccard" else measure(arrays[i], arrays[j])
        out[i, j] = out[j, i] = value
    return pd.DataFrame(out, index=pd.Index(names), columns=pd.Index(names))


# --------------------------------------------------------------------------- permutation null


def _check_sizes(n_heads: int, size_a: int, size_b: int) -> None:
    if n_heads < 0 or not (0 <= size_a <= n_heads and 0 <= size_b <= n_heads):
        raise ValueError(f"set sizes must be in 0..n_heads={n_heads}, got {size_a} and {size_b}")


def jaccard_null(n_heads: int, size_a: int, size_b: int, n_perm: int = 1000, seed: int | None = 0) -> np.ndarray:
    """Jaccard indices of ``n_perm`` pairs of independent uniformly random head sets of sizes a and b.

    The intersection of two such sets is hypergeometric (a good heads among n, b drawn), so it is
    sampled directly; this is the same distribution as drawing both sets explicitly.
    """
    _check_sizes(n_heads, size_a, size_b)
    x = np.random.default_rng(seed).hypergeometric(size_a, n_heads - size_a, size_b, size=n_perm)
    return _jaccard_counts(x, size_a + size_b - x)


def expected_jaccard(n_heads: int, size_a: int, size_b: int) -> float:
    """Exact expected Jaccard of two random head sets: ``E[X / (a + b - X)]``, X ~ Hypergeom(n, a, b)."""
    _check_sizes(n_heads, size_a, size_b)
    x = np.arange(max(0, size_a + size_b - n_heads), min(size_a, size_b) + 1)
    pmf = stats.hypergeom.pmf(x, n_heads, size_a, size_b)
    return float(np.sum(pmf * _jaccard_counts(x, size_a + size_b - x)))


def overlap_table(
    alphas: Mapping[str, Alpha],
    k: int | None = None,
    threshold: float | None = None,
    n_perm: int = 1000,
    seed: int | None = 0,
) -> pd.DataFrame:
    """Observed head overlap of every unordered task pair against the random-set null.

    Columns: ``task_a, task_b, size_a, size_b, jaccard, null_mean`` (exact expectation),
    ``null_p95`` (95th percentile of :func:`jaccard_null`), ``p_value`` (``(#null >= observed + 1) /
    (n_perm + 1)``) and ``excess`` (``jaccard - null_mean``).  Head sets as in :func:`similarity_matrix`.
    """
    columns = ["task_a", "task_b", "size_a", "size_b", "jaccard", "null_mean", "null_p95", "p_value", "excess"]
    masks = {name: _head_set(a, k, threshold) for name, a in alphas.items()}
    rows, nulls = [], {}
    for name_a, name_b in itertools.combinations(masks, 2):
        ma, mb = masks[name_a], masks[name_b]
        obs = jaccard(ma, mb)
        sizes = (int(ma.sum()), int(mb.sum()))
        if sizes not in nulls:
            null = jaccard_null(ma.size, *sizes, n_perm=n_perm, seed=seed)
            nulls[sizes] = (null, expected_jaccard(ma.size, *sizes))
        null, mean = nulls[sizes]
        p = (int(np.sum(null >= obs - 1e-12)) + 1) / (n_perm + 1)
        p95 = float(np.quantile(null, 0.95)) if null.size else float("nan")
        rows.append([name_a, name_b, *sizes, obs, mean, p95, p, obs - mean])
    return pd.DataFrame(rows, columns=columns)


# --------------------------------------------------------------------------- stability


def _pairwise_jaccards(masks: Sequence[Mask]) -> list[float]:
    return [jaccard(a, b) for a, b in itertools.combinations(masks, 2)]


def stability_table(
    runs: Mapping[str, Sequence[Alpha]], k: int | None = None, threshold: float | None = None
) -> pd.DataFrame:
    """Within-task agreement of repeated runs (seeds, batch sizes): one row per task.

    Columns: ``task, n_runs, mean_jaccard, min_jaccard, max_jaccard`` over all pairs of the task's
    runs (nan with fewer than two runs).  Head sets as in :func:`similarity_matrix`.
    """
    rows = []
    for name, alphas in runs.items():
        values = _pairwise_jaccards([_head_set(a, k, threshold) for a in alphas])
        if values:
            rows.append([name, len(alphas), float(np.mean(values)), min(values), max(values)])
        else:
            rows.append([name, len(alphas), np.nan, np.nan, np.nan])
    return pd.DataFrame(rows, columns=["task", "n_runs", "mean_jaccard", "min_jaccard", "max_jaccard"])


def within_vs_across(
    runs: Mapping[str, Sequence[Alpha]], k: int | None = None, threshold: float | None = None
) -> dict[str, float | int]:
    """Mean Jaccard between runs of the same task vs. between runs of different tasks.

    Returns ``{"within", "across", "n_within", "n_across"}``; means are pooled over all pairs
    (within: every pair of runs of one task; across: every pair of runs of two different tasks).
    """
    masks = {name: [_head_set(a, k, threshold) for a in alphas] for name, alphas in runs.items()}
    within = [v for ms in masks.values() for v in _pairwise_jaccards(ms)]
    across = [
        jaccard(a, b) for ta, tb in itertools.combinations(masks, 2) for a in masks[ta] for b in masks[tb]
    ]
    return {
        "within": float(np.mean(within)) if within else float("nan"),
        "across": float(np.mean(across)) if across else float("nan"),
        "n_within": len(within),
        "n_across": len(across),
    }


# --------------------------------------------------------------------------- clustering


def _square(sim: pd.DataFrame) -> np.ndarray:
    if sim.shape[0] != sim.shape[1] or list(sim.index) != list(sim.columns):
        raise ValueError("similarity must be a square DataFrame with identical index and columns")
    return sim.to_numpy(dtype=float)


def similarity_to_distance(sim: pd.DataFrame) -> np.ndarray:
    """Condensed distance vector (scipy order) from a similarity matrix.

    ``d = 1 - sim`` clipped to [0, 2], NaN mapped to the maximum distance 2, symmetrised
    (mean of d and d.T) and with a zero diagonal.
    """
    d = 1.0 - _square(sim)
    d = np.clip(np.where(np.isnan(d), MAX_DISTANCE, d), 0.0, MAX_DISTANCE)
    d = (d + d.T) / 2.0
    np.fill_diagonal(d, 0.0)
    return squareform(d, checks=False)


def cluster_tasks(sim: pd.DataFrame, method: str = "average") -> tuple[np.ndarray, list[str]]:
    """Hierarchical clustering of tasks: (scipy linkage matrix, task names in dendrogram leaf order).

    Uses ``scipy.cluster.hierarchy.linkage(..., optimal_ordering=True)`` on
    :func:`similarity_to_distance`.  One task gives an empty ``(0, 4)`` linkage and that name.
    """
    names = [str(n) for n in sim.index]
    condensed = similarity_to_distance(sim)
    if len(names) == 0:
        raise ValueError("cluster_tasks needs at least one task")
    if len(names) == 1:
        return np.empty((0, 4)), names
    z = linkage(condensed, method=method, optimal_ordering=True)
    return z, [names[i] for i in leaves_list(z)]


# --------------------------------------------------------------------------- similarity vs transfer


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def similarity_vs_transfer(
    sim: pd.DataFrame, transfer: pd.DataFrame, n_boot: int = 1000, seed: int | None = 0
) -> dict[str, object]:
    """Correlate head similarity with cross-task transfer over off-diagonal ordered pairs.

    ``transfer.loc[A, B]`` is the accuracy on task B with task A's alphas; pairs use the tasks of
    ``sim`` present in both axes of ``transfer`` and drop NaNs.  Returns ``n``, ``pearson_r``,
    ``pearson_ci`` (95% percentile bootstrap over pairs), ``spearman_rho``, ``p_value`` (of
    ``scipy.stats.pearsonr``) and ``pairs`` (columns ``source, target, similarity, transfer``).
    With fewer than 3 pairs (or constant inputs) the statistics are nan.
    """
    _square(sim)
    tasks = [t for t in sim.index if t in transfer.index and t in transfer.columns]
    rows = [
        (a, b, float(sim.loc[a, b]), float(transfer.loc[a, b]))
        for a in tasks
        for b in tasks
        if a != b
    ]
    pairs = pd.DataFrame(rows, columns=["source", "target", "similarity", "transfer"])
    pairs = pairs.dropna(subset=["similarity", "transfer"]).reset_index(drop=True)
    x, y = pairs["similarity"].to_numpy(), pairs["transfer"].to_numpy()
    nan = float("nan")
    out: dict[str, object] = {
        "n": len(pairs), "pearson_r": nan, "pearson_ci": (nan, nan), "spearman_rho": nan, "p_value": nan, "pairs": pairs
    }
    r = _pearson(x, y)
    if len(pairs) < 3 or np.isnan(r):
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["p_value"] = float(stats.pearsonr(x, y).pvalue)
        out["spearman_rho"] = float(stats.spearmanr(x, y).statistic)
    out["pearson_r"] = r
    rng = np.random.default_rng(seed)
    boots = np.array([_pearson(x[i], y[i]) for i in rng.integers(0, x.size, size=(n_boot, x.size))])
    boots = boots[~np.isnan(boots)]
    if boots.size:
        lo, hi = np.quantile(boots, [0.025, 0.975])
        out["pearson_ci"] = (float(lo), float(hi))
    return out
