"""The pipeline's artifacts: a run saved elsewhere (a sweep's driver) is the run, and is reused."""

from dataclasses import replace

import pandas as pd
import torch

from site_interp.embeddings import EmbeddingConfig
from site_interp.evaluation import EvalConfig
from site_interp.pipeline import RunConfig, load_run, run_tasks, save_alphas, save_run, task_dir
from site_interp.training import SiteConfig

from conftest import toy_task

CFG = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=2),
                site=SiteConfig(steps=4, batch_size=2, eval_every=2, n_valid=8),
                eval=EvalConfig(n_test=4, n_shots=2, exact_match=False))


def test_saved_run_loads_back_and_is_reused(tiny_llama, tmp_path):
    task = toy_task()
    (run,) = run_tasks(tiny_llama, [task], CFG, None, progress=False)
    assert load_run("site-interp/tiny-llama-seed0", task, CFG, tmp_path) is None  # nothing there yet
    directory = save_run("site-interp/tiny-llama-seed0", run, CFG, tmp_path)  # by model id, no bridge
    assert directory == task_dir(tmp_path, tiny_llama, task)
    back = load_run(tiny_llama, task, CFG, tmp_path)
    assert back is not None
    assert torch.equal(back.site.alpha, run.site.alpha) and torch.equal(back.embedding.t, run.embedding.t)
    assert back.evaluation.records == run.evaluation.records
    # run_tasks on the same directory reuses the saved alphas: identical, no training time
    (again,) = run_tasks(tiny_llama, [task], CFG, tmp_path, progress=False)
    assert torch.equal(again.site.alpha, run.site.alpha) and again.timings["training"] == 0.0
    # other evaluation settings: the saved evaluation is not this run's
    other = RunConfig(embedding=CFG.embedding, site=CFG.site, eval=EvalConfig(n_test=3, n_shots=2, exact_match=False))
    assert load_run(tiny_llama, task, other, tmp_path) is None


def test_a_damaged_results_file_is_recomputed_not_raised(tiny_llama, tmp_path, caplog):
    task = toy_task()
    (run,) = run_tasks(tiny_llama, [task], CFG, None, progress=False)
    directory = save_run(tiny_llama, run, CFG, tmp_path)
    for garbage in ("{not json", "[1, 2]", '{"model_id": "x"}'):
        (directory / "results.json").write_text(garbage)
        assert load_run(tiny_llama, task, CFG, tmp_path) is None
    assert "results.json is damaged" in caplog.text
    save_run(tiny_llama, run, CFG, tmp_path)
    (directory / "config.json").write_text("\x00\x01")
    assert load_run(tiny_llama, task, CFG, tmp_path) is None
    assert "config.json is damaged" in caplog.text


def test_a_rerun_reuses_the_evaluation_made_from_the_same_embedding_and_alphas(tiny_llama, tmp_path):
    task = toy_task()
    (first,) = run_tasks(tiny_llama, [task], CFG, tmp_path, progress=False)
    results = task_dir(tmp_path, tiny_llama, task) / "results.json"
    stamp = results.stat().st_mtime_ns
    (again,) = run_tasks(tiny_llama, [task], CFG, tmp_path, progress=False)
    assert again.timings == {"embedding": 0.0, "training": 0.0, "evaluation": 0.0}
    assert again.evaluation.records == first.evaluation.records and results.stat().st_mtime_ns == stamp
    pd.testing.assert_frame_equal(again.summary(), first.summary())
    # alphas saved over by other ones (same settings): the stored evaluation is not theirs
    save_alphas(tiny_llama, task, CFG, results.parent, replace(first.site, alpha=1 - first.site.alpha))
    (third,) = run_tasks(tiny_llama, [task], CFG, tmp_path, progress=False)
    assert third.timings["evaluation"] > 0 and results.stat().st_mtime_ns != stamp
    assert torch.equal(third.site.alpha, 1 - first.site.alpha)
    # other evaluation settings: evaluated again, not read
    other = RunConfig(embedding=CFG.embedding, site=CFG.site, eval=EvalConfig(n_test=3, n_shots=2, exact_match=False))
    (fourth,) = run_tasks(tiny_llama, [task], other, tmp_path, progress=False)
    assert fourth.timings["evaluation"] > 0 and len(fourth.evaluation.records) < len(third.evaluation.records)


def test_a_stored_evaluation_is_checked_against_what_made_it(tiny_llama, tmp_path):
    """results.json records its settings itself: a run killed after writing another run's
    config.json must not make the old records pass for the new settings. A results.json from
    before that record is re-evaluated by run_tasks, but a sweep's load_run still reuses it."""
    import json

    task = toy_task()
    (first,) = run_tasks(tiny_llama, [task], CFG, tmp_path, progress=False)
    directory = task_dir(tmp_path, tiny_llama, task)
    other = RunConfig(embedding=CFG.embedding, site=CFG.site, eval=EvalConfig(n_test=3, n_shots=2, exact_match=False))
    config = json.loads((directory / "config.json").read_text())
    config["config"] = json.loads(json.dumps(other.to_dict()))
    (directory / "config.json").write_text(json.dumps(config))  # as if killed just after this write
    assert load_run(tiny_llama, task, other, tmp_path) is None
    (second,) = run_tasks(tiny_llama, [task], other, tmp_path, progress=False)
    assert second.timings["evaluation"] > 0 and len(second.evaluation.records) < len(first.evaluation.records)

    (directory / "summary.csv").unlink()  # a reused evaluation still leaves every file
    (third,) = run_tasks(tiny_llama, [task], other, tmp_path, progress=False)
    assert third.timings["evaluation"] == 0.0 and (directory / "summary.csv").is_file()

    data = json.loads((directory / "results.json").read_text())
    del data["made_with"]  # the format before it
    (directory / "results.json").write_text(json.dumps(data))
    assert load_run(tiny_llama, task, other, tmp_path) is not None
    (fourth,) = run_tasks(tiny_llama, [task], other, tmp_path, progress=False)
    assert fourth.timings["evaluation"] > 0
    assert "made_with" in json.loads((directory / "results.json").read_text())
