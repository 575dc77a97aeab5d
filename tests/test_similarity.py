"""Known-answer tests for site_interp.studies.similarity (pure numpy/torch, no model)."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pandas as pd
import pytest
import torch

from site_interp.studies.similarity import (
    bottom_k_mask,
    cluster_tasks,
    cosine,
    expected_jaccard,
    head_ranking,
    heads_of,
    jaccard,
    jaccard_null,
    overlap_table,
    random_k_mask,
    similarity_matrix,
    similarity_to_distance,
    similarity_vs_transfer,
    spearman,
    stability_table,
    threshold_mask,
    top_k_mask,
    within_vs_across,
)


def _mask(shape, flat_idx):
    m = np.zeros(int(np.prod(shape)), dtype=bool)
    m[list(flat_idx)] = True
    return m.reshape(shape)


def _brute_expected_jaccard(n, a, b):
    """Average over every b-subset against a fixed a-subset (exact by symmetry)."""
    fixed = set(range(a))
    vals = [len(fixed & set(s)) / max(len(fixed | set(s)), 1) if fixed | set(s) else 1.0
            for s in itertools.combinations(range(n), b)]
    return float(np.mean(vals))


# ----------------------------------------------------------------------------- head sets


def test_ranking_and_top_k_with_stable_ties():
    alpha = torch.tensor([[0.1, 0.9, 0.5], [0.9, 0.2, 0.5]])
    # descending; the two 0.9s (flat 1, 3) and the two 0.5s (flat 2, 5) keep lower index first
    assert head_ranking(alpha).tolist() == [1, 3, 2, 5, 4, 0]
    assert heads_of(top_k_mask(alpha, 2)) == [(0, 1), (1, 0)]
    assert heads_of(top_k_mask(alpha, 3)) == [(0, 1), (0, 2), (1, 0)]
    assert heads_of(bottom_k_mask(alpha, 2)) == [(0, 0), (1, 1)]
    assert top_k_mask(alpha, 0).sum() == 0 and top_k_mask(alpha, 6).all()


def test_ranking_stable_on_many_ties():
    alpha = np.random.default_rng(0).integers(0, 3, size=(8, 16)) / 2.0  # 128 heads, 3 distinct values
    flat = alpha.ravel().tolist()
    expected = sorted(range(len(flat)), key=lambda i: (-flat[i], i))
    assert head_ranking(alpha).tolist() == expected
    assert np.array_equal(top_k_mask(alpha, 50), _mask(alpha.shape, expected[:50]))
    assert np.array_equal(bottom_k_mask(alpha, 50), _mask(alpha.shape, expected[-50:]))


def test_numpy_and_torch_agree():
    a = np.random.default_rng(1).random((3, 4))
    assert np.array_equal(top_k_mask(a, 5), top_k_mask(torch.tensor(a, dtype=torch.float32), 5))


@pytest.mark.parametrize("k", [1, 3, 6])
def test_top_and_bottom_disjoint_even_when_all_tied(k):
    for alpha in (np.full((3, 4), 0.5), np.random.default_rng(k).random((3, 4))):
        top, bottom = top_k_mask(alpha, k), bottom_k_mask(alpha, k)
        assert top.sum() == k and bottom.sum() == k
        assert not (top & bottom).any()


def test_random_k_mask_seeded():
    m1 = random_k_mask((4, 6), 7, seed=3)
    assert m1.shape == (4, 6) and m1.dtype == bool and m1.sum() == 7
    assert np.array_equal(m1, random_k_mask((4, 6), 7, seed=3))
    assert any(not np.array_equal(m1, random_k_mask((4, 6), 7, seed=s)) for s in range(4, 10))


def test_threshold_mask_is_strict():
    alpha = np.array([[0.2, 0.5], [0.51, 0.9]])
    assert heads_of(threshold_mask(alpha)) == [(1, 0), (1, 1)]
    assert heads_of(threshold_mask(alpha, 0.1)) == [(0, 0), (0, 1), (1, 0), (1, 1)]


@pytest.mark.parametrize("k", [-1, 7, 2.5, True])
def test_bad_k_raises(k):
    alpha = np.zeros((2, 3))
    with pytest.raises(ValueError, match="k must be"):
        top_k_mask(alpha, k)
    with pytest.raises(ValueError, match="k must be"):
        bottom_k_mask(alpha, k)
    with pytest.raises(ValueError, match="k must be"):
        random_k_mask((2, 3), k, seed=0)


# ----------------------------------------------------------------------------- pairwise measures


def test_jaccard_known_sets():
    shape = (2, 4)
    assert jaccard(_mask(shape, [0, 1, 2]), _mask(shape, [1, 2, 3])) == pytest.approx(0.5)
    assert jaccard(_mask(shape, [0, 1]), _mask(shape, [2, 3])) == 0.0
    assert jaccard(_mask(shape, []), _mask(shape, [])) == 1.0
    assert jaccard(_mask(shape, [4]), _mask(shape, [4])) == 1.0
    with pytest.raises(ValueError):
        jaccard(np.zeros((2, 4), bool), np.zeros((4, 2), bool))


def test_cosine_and_spearman():
    a = np.random.default_rng(0).random((3, 4))
    assert cosine(a, a) == pytest.approx(1.0)
    assert cosine(torch.tensor(a), 2 * a) == pytest.approx(1.0)
    assert cosine(np.array([[1.0, 0.0]]), np.array([[0.0, 1.0]])) == pytest.approx(0.0)
    assert spearman(a, np.exp(3 * a)) == pytest.approx(1.0)
    assert spearman(a, -a) == pytest.approx(-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.isnan(spearman(a, np.full_like(a, 0.3)))
        assert np.isnan(cosine(a, np.zeros_like(a)))


@pytest.mark.parametrize("metric", ["jaccard", "cosine", "spearman"])
def test_similarity_matrix_diagonal_and_symmetry(metric):
    rng = np.random.default_rng(0)
    alphas = {name: rng.random((4, 6)) for name in ["c", "a", "b"]}
    sim = similarity_matrix(alphas, metric=metric, k=8 if metric == "jaccard" else None)
    assert list(sim.index) == ["c", "a", "b"] and list(sim.columns) == ["c", "a", "b"]
    assert np.allclose(np.diag(sim.to_numpy()), 1.0)
    assert np.allclose(sim.to_numpy(), sim.to_numpy().T)


def test_similarity_matrix_jaccard_values_and_errors():
    a = np.array([[0.9, 0.8, 0.7, 0.1]])
    b = np.array([[0.1, 0.8, 0.7, 0.9]])
    assert similarity_matrix({"a": a, "b": b}, k=3).loc["a", "b"] == pytest.approx(0.5)
    assert similarity_matrix({"a": a, "b": b}).loc["a", "b"] == pytest.approx(0.5)  # threshold 0.5
    assert similarity_matrix({"a": a, "b": b}, threshold=0.75).loc["a", "b"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="jaccard, cosine, spearman"):
        similarity_matrix({"a": a}, metric="euclid")
    with pytest.raises(ValueError):
        similarity_matrix({"a": a, "b": b}, k=2, threshold=0.5)


# ----------------------------------------------------------------------------- permutation null


@pytest.mark.parametrize("n,a,b", [(8, 3, 4), (7, 0, 2), (6, 6, 2), (9, 5, 5)])
def test_expected_jaccard_matches_brute_force(n, a, b):
    assert expected_jaccard(n, a, b) == pytest.approx(_brute_expected_jaccard(n, a, b))


def test_null_mean_near_one_third_for_half_of_72_heads():
    exact = expected_jaccard(72, 36, 36)
    assert 0.32 < exact < 0.35
    null = jaccard_null(72, 36, 36, n_perm=4000, seed=0)
    assert null.shape == (4000,) and ((null >= 0) & (null <= 1)).all()
    assert null.mean() == pytest.approx(exact, abs=0.01)
    assert np.array_equal(null, jaccard_null(72, 36, 36, n_perm=4000, seed=0))


def test_null_matches_explicit_random_sets():
    n, a, b = 20, 6, 9
    explicit = [jaccard(random_k_mask((4, 5), a, seed=2 * s), random_k_mask((4, 5), b, seed=2 * s + 1))
                for s in range(2000)]
    assert np.mean(explicit) == pytest.approx(expected_jaccard(n, a, b), abs=0.01)
    assert np.mean(jaccard_null(n, a, b, n_perm=2000, seed=1)) == pytest.approx(np.mean(explicit), abs=0.015)


def test_overlap_table_identical_vs_independent():
    rng = np.random.default_rng(0)
    same = rng.random((6, 12))
    alphas = {"x": same, "x2": same.copy(), "y": rng.random((6, 12))}
    table = overlap_table(alphas, k=30, n_perm=500, seed=0)
    assert list(table.columns) == ["task_a", "task_b", "size_a", "size_b", "jaccard", "null_mean", "null_p95",
                                   "p_value", "excess"]
    assert [tuple(r) for r in table[["task_a", "task_b"]].to_numpy()] == [("x", "x2"), ("x", "y"), ("x2", "y")]
    row = table.iloc[0]
    assert row.jaccard == 1.0 and row.size_a == row.size_b == 30
    assert row.p_value == pytest.approx(1 / 501)
    assert row.excess == pytest.approx(1.0 - expected_jaccard(72, 30, 30))
    assert (table.iloc[1:].p_value > 0.05).all()
    # threshold sets: sizes follow the data
    t2 = overlap_table(alphas, n_perm=100)
    assert t2.iloc[0].size_a == int((same > 0.5).sum())


def test_overlap_p_values_roughly_uniform_under_null():
    rng = np.random.default_rng(5)
    alphas = {f"t{i}": rng.random((6, 12)) for i in range(12)}
    p = overlap_table(alphas, k=36, n_perm=300, seed=1).p_value.to_numpy()
    assert len(p) == 66
    assert 0.3 < np.mean(p) < 0.7
    assert np.mean(p < 0.05) < 0.2


# ----------------------------------------------------------------------------- stability


def test_stability_and_within_vs_across():
    rng = np.random.default_rng(0)
    base = {t: rng.random((4, 8)) for t in ["a", "b"]}
    runs = {t: [base[t] + 0.02 * rng.standard_normal((4, 8)) for _ in range(3)] for t in base}
    runs["single"] = [rng.random((4, 8))]
    st = stability_table(runs, k=10)
    assert list(st.task) == ["a", "b", "single"] and list(st.n_runs) == [3, 3, 1]
    assert (st.iloc[:2].mean_jaccard > 0.6).all()
    assert (st.iloc[:2].min_jaccard <= st.iloc[:2].mean_jaccard).all()
    assert (st.iloc[:2].mean_jaccard <= st.iloc[:2].max_jaccard).all()
    assert np.isnan(st.iloc[2].mean_jaccard)
    wa = within_vs_across({t: runs[t] for t in ["a", "b"]}, k=10)
    assert wa["n_within"] == 6 and wa["n_across"] == 9
    assert wa["within"] == pytest.approx(st.iloc[:2].mean_jaccard.mean())
    assert wa["within"] > wa["across"] + 0.3


def test_within_vs_across_identical_runs():
    a = np.random.default_rng(1).random((3, 5))
    out = within_vs_across({"a": [a, a], "b": [a, a]}, k=4)
    assert out["within"] == 1.0 and out["across"] == 1.0


# ----------------------------------------------------------------------------- clustering


def test_distance_handles_nan_asymmetry_and_diagonal():
    sim = pd.DataFrame([[0.5, 0.8, np.nan], [0.6, 1.0, -2.0], [np.nan, -2.0, 1.0]],
                       index=list("abc"), columns=list("abc"))
    d = similarity_to_distance(sim)
    assert d == pytest.approx([0.3, 2.0, 2.0])  # (0.2 + 0.4) / 2, NaN -> 2, clipped 3 -> 2


def test_cluster_groups_identical_tasks():
    rng = np.random.default_rng(0)
    a, b = rng.random((4, 8)), rng.random((4, 8))
    alphas = {"A": a, "B": b, "A2": a.copy(), "B2": b.copy()}
    for metric in ["jaccard", "cosine", "spearman"]:
        sim = similarity_matrix(alphas, metric=metric, k=10 if metric == "jaccard" else None)
        z, order = cluster_tasks(sim)
        assert z.shape == (3, 4) and sorted(order) == ["A", "A2", "B", "B2"]
        pos = {t: i for i, t in enumerate(order)}
        assert abs(pos["A"] - pos["A2"]) == 1 and abs(pos["B"] - pos["B2"]) == 1


def test_cluster_single_task():
    z, order = cluster_tasks(pd.DataFrame([[1.0]], index=["only"], columns=["only"]))
    assert z.shape == (0, 4) and order == ["only"]


# ----------------------------------------------------------------------------- similarity vs transfer


def _sym(rng, names):
    m = rng.random((len(names), len(names)))
    m = (m + m.T) / 2
    np.fill_diagonal(m, 1.0)
    return pd.DataFrame(m, index=names, columns=names)


def test_similarity_vs_transfer_recovers_linear_relation():
    names = list("abcde")
    sim = _sym(np.random.default_rng(0), names)
    transfer = 0.1 + 0.7 * sim  # diagonal (self-transfer) must be ignored
    transfer.iloc[0, 0] = -50.0
    out = similarity_vs_transfer(sim, transfer, n_boot=200, seed=0)
    assert out["n"] == 20
    assert out["pearson_r"] == pytest.approx(1.0) and out["spearman_rho"] == pytest.approx(1.0)
    assert out["p_value"] < 1e-6
    lo, hi = out["pearson_ci"]
    assert lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
    pairs = out["pairs"]
    assert list(pairs.columns) == ["source", "target", "similarity", "transfer"]
    row = pairs[(pairs.source == "b") & (pairs.target == "d")].iloc[0]
    assert row.transfer == pytest.approx(transfer.loc["b", "d"])


def test_similarity_vs_transfer_noisy_and_uses_direction():
    names = list("abcdefg")
    rng = np.random.default_rng(1)
    sim = _sym(rng, names)
    noise = pd.DataFrame(rng.standard_normal((7, 7)), index=names, columns=names)
    out = similarity_vs_transfer(sim, sim + 0.1 * noise, n_boot=300, seed=0)
    lo, hi = out["pearson_ci"]
    assert lo < out["pearson_r"] < hi and 0.5 < out["pearson_r"] < 1.0
    shuffled = similarity_vs_transfer(sim, noise, n_boot=50)
    assert abs(shuffled["pearson_r"]) < 0.5


def test_similarity_vs_transfer_too_few_pairs():
    sim = pd.DataFrame([[1.0, 0.3], [0.3, 1.0]], index=["a", "b"], columns=["a", "b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = similarity_vs_transfer(sim, sim * 0.5)
    assert out["n"] == 2
    assert np.isnan(out["pearson_r"]) and np.isnan(out["p_value"]) and np.isnan(out["spearman_rho"])
    assert all(np.isnan(v) for v in out["pearson_ci"])
