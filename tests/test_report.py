"""The results page: task kinds, the statistics behind it, resumable full-scale studies, and
``python -m site_interp.report`` end to end on a tiny model (numbers on the page = artifacts)."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from site_interp.report import main as report_main
from site_interp.stats import bootstrap_ci, hierarchical_ci
from site_interp.studies import evidence as ev
from site_interp.tasks.core import Task
from site_interp.tasks.kinds import copied_share, task_kind

FV57 = Path(__file__).resolve().parents[2] / "shared" / "data" / "fv57"

# the function-vector paper's extractive tasks (its other 29 tasks are abstractive)
FV_EXTRACTIVE = {f"{stem}_{n}" for stem in ("adjective_v_verb", "alphabetically_first", "alphabetically_last",
                                            "animal_v_object", "choose_first_of", "choose_last_of", "choose_middle_of",
                                            "color_v_animal", "concept_v_object", "fruit_v_animal", "object_v_concept",
                                            "verb_v_adjective") for n in (3, 5)} | {
    "conll2003_location", "conll2003_organization", "conll2003_person", "squad_val"}


def _task(name: str, pairs: list[tuple[str, str]]) -> Task:
    ex = [{"input": i, "output": o} for i, o in pairs]
    return Task(name, ex, ex[:2], ex[:2])


def test_task_kind_reads_the_data_not_the_name():
    words = ["apple", "pear", "plum", "fig", "kiwi"]
    pick = _task("antonym", [(f"{a}, {b}, {c}", a) for a, b, c in zip(words, words[1:], words[2:])])
    letters = _task("choose_first_of_3", [(f"Q?\na: {w}\nb: x\nc: y", "a") for w in words])
    assert task_kind(pick) == "extractive"  # named like an abstractive task, copies its answers
    assert task_kind(letters) == "abstractive"  # one-letter option answers never count as copied
    assert copied_share(pick.train) == 1.0 and copied_share(letters.train) == 0.0


@pytest.mark.skipif(not FV57.is_dir(), reason="needs ../shared/data/fv57")
def test_task_kinds_match_the_function_vector_papers_grouping():
    from site_interp.tasks.core import load_task_dir

    tasks = load_task_dir(FV57)
    assert len(tasks) == 57
    assert {n for n, t in tasks.items() if task_kind(t) == "extractive"} == FV_EXTRACTIVE


def test_hierarchical_ci_widens_with_seed_noise_and_reduces_to_the_task_bootstrap():
    rng = np.random.default_rng(1)
    task_means = rng.uniform(40, 60, size=40)
    quiet = [[m, m, m] for m in task_means]
    noisy = [[m - 15, m, m + 15] for m in task_means]
    lo_q, hi_q = hierarchical_ci(quiet)
    lo_n, hi_n = hierarchical_ci(noisy)
    assert lo_q <= task_means.mean() <= hi_q
    assert hi_n - lo_n > 1.5 * (hi_q - lo_q)  # seed noise (sd 12 per seed) against a task spread of sd 6
    lo_b, hi_b = bootstrap_ci(task_means, n_boot=2000)
    assert abs(lo_q - lo_b) < 1.5 and abs(hi_q - hi_b) < 1.5  # no seed noise: the task bootstrap
    assert hierarchical_ci([[5.0], [5.0, 5.0]]) == (5.0, 5.0)
    # unequal seed counts: a task with one seed contributes its value, not a smaller-variance mean
    assert hierarchical_ci([[0.0, 10.0]] * 30)[1] - hierarchical_ci([[0.0, 10.0]] * 30)[0] > 1.0


def _scores(rows):
    return pd.DataFrame([{"task": t, "method": m, "seed": s, "metric": "first_token", "accuracy": a, "n": 50,
                          "params": 0.0, "fit_s": 0.0, "eval_s": 0.0} for t, m, s, a in rows])


def test_paired_difference_pairs_seeds_and_knows_when_noise_wins():
    rows = []
    for i in range(20):
        for s, shift in enumerate((-20, 0, 20)):  # large seed noise, shared by both methods
            rows += [(f"t{i}", "site", s, 50 + shift + 3), (f"t{i}", "icl", s, 50 + shift)]
    d = ev.paired_difference(_scores(rows), "site", "icl", "first_token")
    assert d.mean == pytest.approx(3.0) and d.lo == pytest.approx(3.0) and d.survives
    assert (d.wins, d.losses, d.seeds_a, d.seeds_b) == (20, 0, 3, 3)
    rows = [(f"t{i}", m, s, 50 + (8 if (s + i) % 2 else -8)) for i in range(20) for m in ("site", "icl")
            for s in range(3)]
    rows = [(t, m, s, a + (1 if m == "site" and s == 0 else 0)) for t, m, s, a in rows]
    d = ev.paired_difference(_scores(rows), "site", "icl", "first_token")
    assert 0 < d.mean < 1 and d.survives  # +1 on one seed only, paired: small but consistent
    unpaired = [(t, m, s if m == "site" else 0, a) for t, m, s, a in rows if m == "site" or s == 0]
    d1 = ev.paired_difference(_scores(unpaired), "site", "icl", "first_token")
    assert d1.seeds_b == 1 and d1.tasks == 20
    assert (d.fewest_seeds_a, d1.fewest_seeds_b) == (3, 1)  # every task has all its seeds
    uneven = [r for r in rows if not (r[0] in ("t0", "t1") and r[2] > 0)]  # a store still running seeds 1-2
    d2 = ev.paired_difference(_scores(uneven), "site", "icl", "first_token")
    assert (d2.seeds_a, d2.fewest_seeds_a, d2.seeds_b, d2.fewest_seeds_b) == (3, 1, 3, 1)
    assert ev.seed_range(d2.seeds_a, d2.fewest_seeds_a) == "1–3" and ev.seed_range(3, 3) == "3"


def test_method_summary_splits_kinds_and_reports_seed_spread():
    rows = [(f"a{i}", "site", s, 60 + 10 * s) for i in range(3) for s in range(2)]
    rows += [(f"e{i}", "site", s, 20 + 10 * s) for i in range(3) for s in range(2)]
    kinds = {**{f"a{i}": "abstractive" for i in range(3)}, **{f"e{i}": "extractive" for i in range(3)}}
    s = ev.method_summary(_scores(rows), kinds, ["site"]).iloc[0]
    assert (s["abstractive"], s["extractive"], s["mean"], s["seed_spread"], s["seeds"]) == (65, 25, 45, 10, 2)
    assert s["fewest_seeds"] == 2
    s = ev.method_summary(_scores([r for r in rows if r[:3] != ("a0", "site", 1)]), kinds, ["site"]).iloc[0]
    assert (s["seeds"], s["fewest_seeds"]) == (2, 1)  # a task with one seed so far


def _sym(rng, n):
    x = rng.random((n, n))
    return pd.DataFrame((x + x.T) / 2, index=[f"t{i}" for i in range(n)], columns=[f"t{i}" for i in range(n)])


def test_mantel_finds_a_planted_relation_and_not_noise():
    rng = np.random.default_rng(0)
    sim = _sym(rng, 15)
    related = sim * 40 + rng.normal(0, 3, sim.shape)
    noise = pd.DataFrame(rng.random(sim.shape), index=sim.index, columns=sim.columns)
    r = ev.mantel(sim, related, n_perm=300)
    assert r["rho"] > 0.8 and r["p_value"] < 0.01 and r["pairs"] == 15 * 14
    assert ev.mantel(sim, noise, n_perm=300)["p_value"] > 0.05
    const = pd.DataFrame(np.ones(sim.shape), index=sim.index, columns=sim.columns)
    assert np.isnan(ev.mantel(const, related, n_perm=10)["p_value"])


def test_centred_transfer_removes_target_difficulty():
    m = pd.DataFrame([[90, 10, 50], [80, 30, 50], [70, 20, 90]], index=list("abc"), columns=list("abc"), dtype=float)
    c = ev.centred_transfer(m)
    assert c.loc["b", "a"] == pytest.approx(80 - 75) and c.loc["a", "b"] == pytest.approx(10 - 15)
    assert c.loc["a", "c"] == pytest.approx(0.0)


def test_kind_separation_detects_grouped_similarity():
    names = [f"t{i}" for i in range(12)]
    kinds = {n: "abstractive" if i < 6 else "extractive" for i, n in enumerate(names)}
    s = np.full((12, 12), 0.1)
    s[:6, :6] = s[6:, 6:] = 0.6
    r = ev.kind_separation(pd.DataFrame(s, index=names, columns=names), kinds, n_perm=500)
    assert r["within"] == pytest.approx(0.6) and r["across"] == pytest.approx(0.1) and r["p_value"] < 0.01
    assert ev.kind_separation(pd.DataFrame(s, index=names, columns=names), {n: "abstractive" for n in names}) == {}


def test_verdicts():
    assert ev.verdict(1.0, 5.0) == "holds" and ev.verdict(-5.0, -1.0) == "does not hold"
    assert ev.verdict(-1.0, 1.0) == "unresolved" and ev.verdict(float("nan"), 1.0) == "not measured"


def test_transfer_columns_equal_the_whole_matrix_and_resume(tmp_path, tiny_llama, caplog):
    from site_interp.artifacts import ArtifactMismatchError
    from site_interp.embeddings import EmbeddingConfig
    from site_interp.evaluation import EvalConfig
    from site_interp.pipeline import RunConfig, model_id, run_tasks
    from site_interp.studies.report_runs import ScaleConfig, load_seed_runs, transfer_columns, transfer_seconds
    from site_interp.studies.transfer import REFERENCES, transfer_matrix
    from site_interp.tasks.builtin import builtin_task
    from site_interp.training import SiteConfig

    tasks = [builtin_task(n) for n in ("capitalize", "first_letter", "past_tense")]
    cfg = RunConfig(EmbeddingConfig(n_prompts=3, n_shots=2), SiteConfig(steps=4, eval_every=2),
                    EvalConfig(n_test=5, exact_match=False))
    run_tasks(tiny_llama, tasks, cfg, tmp_path, progress=False, evaluate_methods=False)
    assert transfer_columns(tiny_llama.site_info.model_id if hasattr(tiny_llama, "site_info") else model_id(tiny_llama),
                            tasks, cfg, tmp_path, ScaleConfig(n_test=5), compute=False) is None
    emb, alphas = load_seed_runs(tiny_llama, tasks, cfg, tmp_path)
    whole = transfer_matrix(tiny_llama, tasks, emb, alphas, n_test=5, progress=False)
    scale = ScaleConfig(n_test=5, columns_per_part=1)
    parts = transfer_columns(tiny_llama, tasks, cfg, tmp_path, scale, progress=False)
    pd.testing.assert_frame_equal(parts.matrix, whole.matrix)
    pd.testing.assert_frame_equal(parts.references, whole.references)
    files = sorted((tmp_path / next(tmp_path.iterdir()).name / "transfer").glob("*.json"))
    assert len(files) == 3
    stamps = {f.name: f.stat().st_mtime_ns for f in files}
    files[1].write_text("{not json")
    again = transfer_columns(tiny_llama, tasks, cfg, tmp_path, scale, progress=False)
    pd.testing.assert_frame_equal(again.matrix, whole.matrix)
    assert "damaged" in caplog.text
    changed = {f.name for f in files if f.stat().st_mtime_ns != stamps[f.name]}
    assert changed == {files[1].name}  # only the damaged column was recomputed
    seconds = transfer_seconds(tiny_llama, tasks, cfg, tmp_path, scale)  # P4's measured whole, in floor.py
    assert set(seconds) == {t.name for t in tasks}
    assert sum(seconds.values()) == pytest.approx(transfer_columns(tiny_llama, tasks, cfg, tmp_path, scale,
                                                                   compute=False).seconds)
    with pytest.raises(ArtifactMismatchError, match="n_test: stored 5, requested 4"):  # other settings
        transfer_seconds(tiny_llama, tasks, cfg, tmp_path, ScaleConfig(n_test=4))
    with pytest.raises(ArtifactMismatchError, match="sources"):  # another task set
        transfer_seconds(tiny_llama, tasks[:2], cfg, tmp_path, scale)
    # a report over a chunk of the tasks reads the store's larger matrix, sliced, and rewrites nothing
    stamps = {f.name: f.stat().st_mtime_ns for f in files}
    chunk = transfer_columns(tiny_llama, tasks[:2], cfg, tmp_path, scale, progress=False)
    fresh = transfer_matrix(tiny_llama, tasks[:2], emb, alphas, n_test=5, progress=False)
    pd.testing.assert_frame_equal(chunk.matrix, fresh.matrix)
    pd.testing.assert_frame_equal(chunk.references, fresh.references)
    assert {f.name: f.stat().st_mtime_ns for f in files} == stamps
    share = (2 + len(REFERENCES)) / (3 + len(REFERENCES))  # its rows of the stored columns' rows
    assert chunk.seconds == pytest.approx(sum(seconds[t.name] for t in tasks[:2]) * share)
    with pytest.raises(ArtifactMismatchError, match="n_test: stored 5, requested 4"):  # a chunk at other settings
        transfer_columns(tiny_llama, tasks[:2], cfg, tmp_path, ScaleConfig(n_test=4), compute=False)


TINY = ["--models", "tiny-llama", "--tasks", "capitalize", "first_letter", "past_tense", "--data-dir", "",
        "--seeds", "0", "1", "--n-prompts", "3", "--n-shots", "2", "--steps", "4", "--eval-every", "2", "--n-test", "5",
        "--lora-steps", "2", "--fv-aie-prompts", "2", "--scan-valid", "3", "--n-perm", "50", "--quiet"]


def test_report_end_to_end_numbers_come_from_the_artifacts_and_a_rerun_computes_nothing(tmp_path, capsys):
    page = tmp_path / "docs" / "results.md"
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- results:begin -->\nold numbers\n<!-- results:end -->\n\nrest\n")
    argv = [*TINY, "--out", str(tmp_path / "runs"), "--page", str(page), "--readme", str(readme)]
    assert report_main(argv) == 0
    text = page.read_text()
    for heading in ("## The paper's claims", "### Methods on 3 tasks", "### 3 × 3 alpha transfer",
                    "### Does head overlap predict transfer?", "## Compute"):
        assert heading in text
    assert "transfer done" in text and "patching 3/3" in text
    per_task = text.split("<details>")[1].split("</details>")[0]
    assert all(f"| {t} |" in per_task for t in ("capitalize", "first_letter", "past_tense"))
    # the SITE first-token mean on the page is the mean over tasks of the seed means in the artifacts
    runs = tmp_path / "runs"
    acc: dict[str, list[float]] = {}
    for f in runs.rglob("bench/site.json"):
        data = json.loads(f.read_text())
        acc.setdefault(data["key"]["task"], []).append(100 * np.mean([r["first_token"] for r in data["records"]]))
    assert sorted(len(v) for v in acc.values()) == [2, 2, 2]
    expected = np.mean([np.mean(v) for v in acc.values()])
    row = next(line for line in text.splitlines() if line.startswith("| SITE | 2 | 3 |"))
    assert row.split("|")[4].strip() == f"{expected:.1f}"
    head = readme.read_text()
    assert "old numbers" not in head and head.endswith("<!-- results:end -->\n\nrest\n")
    assert "[docs/results.md](docs/results.md)" in head and "SITE " in head
    for png in re.findall(r"\]\((img/results/[^)]+\.png)\)", text):
        assert (page.parent / png).stat().st_size > 1000
    artifacts = {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()}
    assert report_main(argv) == 0  # everything is reused
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()} == artifacts
    body = lambda t: t.split("\n", 3)[3]  # noqa: E731  (everything after the generated-by line)
    assert body(page.read_text()) == body(text)
    capsys.readouterr()
    # other settings are refused, naming the difference, and nothing is overwritten
    assert report_main([*argv, "--report-only", "--n-test", "4"]) == 2
    assert "n_test" in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("*") if p.is_file()} == artifacts


def _evidence(rows, alphas=None, patching=None):
    from site_interp.studies.results_data import ModelEvidence

    scores = _scores(rows)
    scores = pd.concat([scores, scores.assign(metric="exact_match", accuracy=scores["accuracy"] - 5)])
    tasks = sorted(set(scores["task"]))
    kinds = {t: "abstractive" for t in tasks}
    methods = list(dict.fromkeys(scores["method"]))
    diffs = [d for a, b in (("site", "icl"), ("site", "lora"), ("site", "uniform-0.5"), ("site", "uniform-1"))
             for m in ev.METRICS if (d := ev.paired_difference(scores, a, b, m)) is not None]
    patching = patching if patching is not None else pd.DataFrame(columns=["task", "k", "top", "bottom", "random", "site", "zero_shot"])
    return ModelEvidence(model_id="org/toy-model", tasks=tasks, kinds=kinds, scores=scores,
                         summary=ev.method_summary(scores, kinds, methods), differences=diffs,
                         gaps=ev.metric_gaps(scores, [], "site"), gaps_method="site", binary=ev.binary_share(alphas or {}),
                         patching=patching, patching_claim=ev.patching_claim(patching), transfer=None, similarity=None,
                         overlap=None, order=tasks, linkage=None, overlap_vs_transfer={}, kind_separation={},
                         seconds={}, trained={0: len(tasks)})


def test_claim_verdicts_follow_the_intervals():
    from site_interp.studies.results_page import claims_rows

    rng = np.random.default_rng(3)
    rows = []
    for i in range(30):
        base = rng.uniform(20, 60)
        for s in range(3):
            rows += [(f"t{i}", "icl", s, base + rng.normal(0, 2)), (f"t{i}", "site", s, base + 12 + rng.normal(0, 2)),
                     (f"t{i}", "uniform-0.5", s, base + 12 + rng.normal(0, 20)),
                     (f"t{i}", "uniform-1", s, base - 10 + rng.normal(0, 2))]
        rows.append((f"t{i}", "lora", 0, base + 30))
    near = {f"t{i}": [np.r_[np.zeros(50), np.ones(40), np.full(10, 0.5)]] for i in range(30)}  # 90% near-binary
    patching = pd.DataFrame([{"task": f"t{i}", "k": 5, "top": 40.0 + i % 3, "bottom": 2.0, "random": 10.0,
                              "site": 50.0, "zero_shot": 0.0} for i in range(30)])
    claims = {c: (text, v) for c, text, v in claims_rows(_evidence(rows, near, patching))}
    text, verdict = claims["SITE beats 10-shot ICL"]
    assert verdict == "holds" and 11.0 < float(text.split()[0]) < 13.0 and "3 seeds" in text
    assert claims["SITE ahead of LoRA"][1] == "does not hold"
    assert claims["SITE beats uniform alphas"][1] == "unresolved"  # beats uniform 1 clearly, uniform 0.5 within noise
    assert claims["alphas near-binary (< 0.1 or > 0.9)"][1] == "holds"
    assert claims["top-k heads recover SITE, bottom-k do not"][1] == "holds"
    weak = patching.assign(top=10.0)  # top beats bottom but recovers only 20% of SITE
    claims = {c: v for c, _, v in claims_rows(_evidence(rows, {"t0": [np.full(72, 0.5)]}, weak))}
    assert claims["top-k heads recover SITE, bottom-k do not"] == "does not hold"
    assert claims["alphas near-binary (< 0.1 or > 0.9)"] == "does not hold"


def test_a_partial_run_lists_every_task(tmp_path):
    page = tmp_path / "results.md"
    argv = [*TINY, "--seeds", "0", "--parts", "core", "--out", str(tmp_path / "runs"), "--page", str(page)]
    assert report_main(argv) == 0
    (alphas,) = list((tmp_path / "runs").rglob("past_tense/alphas.safetensors"))
    alphas.unlink()  # as if that task's training had not finished yet
    assert report_main([*argv, "--report-only"]) == 0
    text = page.read_text()
    assert "trained alphas per seed s0: 2" in text and "transfer not yet" in text
    per_task = text.split("<details>")[1].split("</details>")[0]
    assert all(f"| {t} |" in per_task for t in ("capitalize", "first_letter", "past_tense"))


def test_a_results_store_without_embeddings_resumes_without_recomputing(tmp_path):
    """The committed store (results/fv57) keeps every result and alphas but sets aside embeddings
    and LoRA weights (.gitignore): a fresh clone must reuse all of it, and a missing study row
    must be recomputed from a re-made embedding of that task alone, to the same numbers."""
    out = tmp_path / "store"
    argv = [*TINY, "--seeds", "0", "--out", str(out), "--page", str(tmp_path / "results.md")]
    assert report_main(argv) == 0
    text = (tmp_path / "results.md").read_text()
    for p in [*out.rglob("embedding.safetensors"), *out.rglob("lora_adapter.*")]:  # as .gitignore
        p.unlink()
    assert not list(out.rglob("embedding.safetensors")) and list(out.rglob("embedding.json"))
    kept = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert report_main(argv) == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == kept  # nothing recomputed
    model_dir = next(d for d in out.iterdir() if d.is_dir())
    (model_dir / "first_letter" / "patching.json").unlink()
    (model_dir / "transfer" / "first_letter.json").unlink()
    assert report_main(argv) == 0
    assert [p.parent.name for p in out.rglob("embedding.safetensors")] == ["first_letter"]
    assert (model_dir / "first_letter" / "patching.json").is_file()
    numbers = lambda t: t.split("\n", 3)[3].split("## Compute")[0]  # noqa: E731  (the recomputed row's seconds differ)
    assert numbers((tmp_path / "results.md").read_text()) == numbers(text)


@pytest.mark.skipif(not FV57.is_dir(), reason="needs ../shared/data/fv57")
def test_a_chunk_of_fv57_ranks_fv_heads_on_the_whole_benchmarks_tasks(tmp_path, caplog):
    from site_interp.studies.results_data import FV_RANK_TASKS, ReportConfig, fv_rank_pool
    from site_interp.tasks.specs import resolve_tasks

    chunk = resolve_tasks(["word_length", "antonym"], FV57)
    pool = fv_rank_pool(chunk, FV57)
    assert [t.name for t in pool] == [n for n in FV_RANK_TASKS if n != "antonym"]
    cfg = ReportConfig()
    assert cfg.comparison(("fv",), (0,), chunk, pool).fv_rank_tasks == FV_RANK_TASKS
    assert cfg.comparison(("fv",), (0,), chunk).fv_rank_tasks is None  # without the pool: the chunk's own tasks
    assert fv_rank_pool(resolve_tasks(list(FV_RANK_TASKS), FV57), FV57) == []  # the chunk holds them all
    assert fv_rank_pool(chunk, tmp_path) == []  # a data directory without them
    assert fv_rank_pool(resolve_tasks(["capitalize"]), FV57) == []  # not a chunk of FV-57 (a built-in task)
    partial = tmp_path / "partial"  # a copy of two FV-57 tasks, one of them a ranking task
    for name in ("word_length", "capitalize"):
        shutil.copytree(FV57 / name, partial / name)
    with caplog.at_level(logging.WARNING):
        assert fv_rank_pool(resolve_tasks(["word_length"], partial), partial) == []
    assert "lacks the FV ranking task(s) antonym, country-capital" in caplog.text
