"""The benchmark harness: CLI on the tiny model (resume, refusal, subsets, seeds) and the tables' math."""

import json

import pandas as pd
import pytest

from site_interp.bench import main
from site_interp.studies.comparison import METHODS
from site_interp.studies.comparison_tables import build_tables, load_tables

ARGS = ["--model", "tiny-llama", "--tasks", "capitalize", "next_item", "--n-prompts", "4", "--n-shots", "2",
        "--steps", "6", "--eval-every", "3", "--n-test", "5", "--no-exact-match", "--quiet",
        "--fv-aie-prompts", "3", "--lora-steps", "3", "--lora-batch-size", "2"]
ROOT = "site-interp--tiny-llama-seed0"


def test_bench_runs_every_method_resumes_and_refuses_other_settings(tmp_path, capsys):
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "SITE − 2-shot ICL" in out and "| LoRA |" in out
    root = tmp_path / ROOT
    for name in ("bench.md", "bench.json", "bench_per_task.csv", "bench_summary.csv"):
        assert (root / name).exists(), name
    per_task = pd.read_csv(root / "bench_per_task.csv")
    assert len(per_task) == 2 * len(METHODS)
    assert set(per_task["method"]) == set(METHODS)
    assert per_task["n"].eq(5).all() and per_task["accuracy"].between(0, 100).all()
    summary = pd.read_csv(root / "bench_summary.csv").set_index("method")
    assert summary.loc["site", "params"] == 2 * 4  # tiny-llama: 2 layers x 4 heads
    assert summary.loc["lora", "params"] > summary.loc["site", "params"]
    assert summary.loc[["0-shot", "icl", "uniform-0.5", "fv", "tv"], "params"].eq(0).all()
    record = json.loads((root / "capitalize" / "bench" / "tv.json").read_text())
    assert record["key"]["method"] == "tv" and "layer" in record["info"] and len(record["records"]) == 5

    stamps = {p: p.stat().st_mtime_ns for p in root.glob("*/bench/*.json")}
    assert main([*ARGS, "--out", str(tmp_path)]) == 0  # resumes: nothing recomputed
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())
    again = pd.read_csv(root / "bench_per_task.csv")
    pd.testing.assert_frame_equal(again[["task", "method", "accuracy"]], per_task[["task", "method", "accuracy"]])

    capsys.readouterr()
    assert main([*ARGS[:-1], "4", "--out", str(tmp_path)]) == 2  # another LoRA batch size: refused
    assert "different model, task or configuration" in capsys.readouterr().err



def test_lora_result_and_adapter_live_apart_and_a_killed_run_reuses_the_adapter(tmp_path, monkeypatch):
    """LoRA's result (bench/lora.json) and its adapter (bench/lora_adapter.*) used to share
    lora.json, so a kill between the two writes left an adapter sidecar where the result belongs and
    the rerun refused it. Now the adapter stays valid beside the result, and a rerun without the
    result (or with such a left-over sidecar) evaluates the saved adapter instead of refitting."""
    import site_interp.studies.comparison as comparison
    from site_interp.artifacts import load_if_valid, read_json

    args = [*ARGS, "--methods", "lora", "--tasks", "capitalize", "--out", str(tmp_path)]
    assert main(args) == 0
    bench = tmp_path / ROOT / "capitalize" / "bench"
    result = read_json(bench / "lora.json")
    assert result["key"]["method"] == "lora" and len(result["records"]) == 5
    sidecar = read_json(bench / "lora_adapter.json")
    assert load_if_valid(bench / "lora_adapter.safetensors", sidecar["key"]) is not None
    assert result["fit_s"] == pytest.approx(sidecar["training_s"])

    def no_refit(*a, **k):
        raise AssertionError("LoRA was refitted although its adapter was saved")

    monkeypatch.setattr(comparison, "train_lora", no_refit)
    (bench / "lora.json").write_text(json.dumps(sidecar))  # the old collision: the adapter's sidecar in its place
    assert main(args) == 0
    again = read_json(bench / "lora.json")
    assert again["records"] == result["records"] and again["fit_s"] == result["fit_s"]
    assert again["info"] == result["info"] and again["params"] == result["params"]

def test_method_subset_skips_the_embedding_and_seeds_are_averaged(tmp_path):
    assert main([*ARGS, "--methods", "0-shot", "icl", "--seeds", "0", "1", "--out", str(tmp_path)]) == 0
    assert not list(tmp_path.rglob("embedding.safetensors"))  # neither method needs it
    assert (tmp_path / "seed1" / ROOT / "capitalize" / "bench" / "icl.json").exists()
    tables = load_tables(tmp_path / ROOT / "bench.json")
    assert set(tables.per_task["method"]) == {"0-shot", "icl"}
    assert tables.per_task["seeds"].eq(2).all() and tables.per_task["n"].eq(10).all()
    # tables of what is cached, computing nothing: the other methods are simply absent
    assert main([*ARGS, "--seeds", "0", "--report-only", "--out", str(tmp_path)]) == 0
    assert not list(tmp_path.rglob("embedding.safetensors")) and not list(tmp_path.rglob("lora_adapter.safetensors"))
    partial = load_tables(tmp_path / ROOT / "bench.json")
    assert set(partial.summary["method"]) == {"0-shot", "icl"} and partial.summary["tasks"].eq(2).all()


def _result(task, method, hits, params=0):
    records = [{"first_token": bool(h), "exact_match": None} for h in hits]
    return {"seed": 0, "task": task, "method": method, "records": records, "params": params, "fit_s": 1.0,
            "eval_s": 2.0, "stages": {"embedding_s": 3.0, "site_training_s": 0.0, "fv_ranking_s": 0.0}}


def test_tables_known_answer():
    results = [
        _result("a", "site", [1, 1, 1, 1], params=72), _result("a", "icl", [1, 0, 0, 0]),
        _result("b", "site", [1, 1, 0, 0], params=72), _result("b", "icl", [1, 1, 0, 0]),
        _result("c", "site", [0, 0, 0, 0], params=72),  # icl did not run on c: not paired
    ]
    t = build_tables(results, "m", n_shots=10)
    acc = t.per_task.set_index(["task", "method"])["accuracy"]
    assert acc[("a", "site")] == 100 and acc[("a", "icl")] == 25 and acc[("b", "site")] == 50
    s = t.summary.set_index("method")
    assert s.loc["site", "mean"] == pytest.approx(50.0) and s.loc["site", "tasks"] == 3
    assert s.loc["icl", "mean"] == pytest.approx(37.5)
    assert s.loc["site", "lo"] <= 50 <= s.loc["site", "hi"] and s.loc["site", "params"] == 72
    pair = t.pairs.set_index(["a", "b"]).loc[("site", "icl")]
    assert pair["mean"] == pytest.approx(37.5) and pair["tasks"] == 2  # (75 + 0) / 2
    assert (pair["wins"], pair["ties"], pair["losses"]) == (1, 1, 0)
    assert "| SITE | 50.0 |" in t.markdown() and "| 10-shot ICL | 37.5 |" in t.markdown()
    assert list(t.wide().columns) == ["10-shot ICL", "SITE"]


def test_unknown_method_is_rejected(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([*ARGS, "--methods", "magic", "--out", str(tmp_path)])
    assert "invalid choice" in capsys.readouterr().err


def test_a_chunk_ranks_fv_heads_on_tasks_outside_it_as_the_whole_run(tmp_path, capsys):
    """A benchmark run in parts must rank the FV heads as the whole would: the chunk's result keys
    then equal the whole run's, so the whole run's fv.json files are reused, not refused."""
    fv = [*ARGS, "--methods", "fv", "--fv-rank-tasks", "capitalize", "next_item"]
    whole = tmp_path / "whole"
    assert main([*fv, "--out", str(whole)]) == 0
    stamps = {p: p.stat().st_mtime_ns for p in (whole / ROOT).glob("*/bench/*.json")}
    chunk = [*fv[:fv.index("--tasks") + 1], "next_item", *fv[fv.index("--tasks") + 3:]]
    assert main([*chunk, "--out", str(whole)]) == 0
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())  # reused: same ranking key

    part = tmp_path / "part"  # a fresh chunk computes the ranking task's AIE, never its FV result
    assert main([*chunk, "--out", str(part)]) == 0
    assert (part / ROOT / "capitalize" / "bench" / "fv_aie.json").exists()
    assert not (part / ROOT / "capitalize" / "bench" / "fv.json").exists()
    assert (part / ROOT / "capitalize" / "embedding.safetensors").exists()  # the AIE needs its embedding ...
    assert not (part / ROOT / "capitalize" / "alphas.safetensors").exists()  # ... not SITE alphas
    key = json.loads((part / ROOT / "next_item" / "bench" / "fv.json").read_text())["key"]
    assert key == json.loads((whole / ROOT / "next_item" / "bench" / "fv.json").read_text())["key"]
    assert key["fv"]["rank_tasks"] == ["capitalize", "next_item"]

    capsys.readouterr()
    assert main([*chunk[:-3], "--fv-rank-tasks", "no_such_task", "--out", str(part)]) == 2
    assert "no_such_task" in capsys.readouterr().err
