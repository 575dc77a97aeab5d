"""python -m site_interp.sweep: the grid, device placement, tables, the local and Ray executors
(a real local Ray cluster: same alphas and tables as local, a killed worker retried, resuming),
and the GPU check's refusal without a GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from site_interp import cli, sweep
from site_interp.errors import ConfigError, UserError
from site_interp.loading import load_model
from site_interp.sweeps.executors import CRASH_ENV, expected_model_id
from site_interp.sweeps.grid import SETTINGS, SweepGrid, expand_cells, read_grid_file
from site_interp.sweeps.placement import parse_per_model, plan_placement
from site_interp.sweeps.tables import by_model, by_task

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["tiny-llama", "tiny-gemma3"]
TASKS = ["capitalize", "first_letter"]
TINY = ["--n-prompts", "4", "--n-shots", "2", "--steps", "4", "--eval-every", "2", "--n-test", "4",
        "--max-new-tokens", "2", "--cpus-per-model", "1", "--quiet"]
GRID = ["--models", *MODELS, "--tasks", *TASKS, "--seeds", "0", "1", *TINY]
TABLES = ["grid_per_seed.csv", "grid_by_task.csv", "grid_by_model.csv", "stability.csv", "heads.csv"]


def alphas_under(out: Path) -> dict[str, torch.Tensor]:
    """Every alphas.safetensors under ``out``, by path relative to it."""
    return {str(p.parent.relative_to(out)): load_file(str(p))["alpha"] for p in sorted(out.rglob("alphas.safetensors"))}


def cells_of(out: Path) -> pd.DataFrame:
    return pd.read_csv(out / "sweep" / "cells.csv")


# ----------------------------------------------------------------------------- grid


def test_settings_defaults_are_runs():
    args = sweep.build_parser().parse_args([])
    run_defaults = cli.config_from_args(_run_args([]))
    grid = SweepGrid(models=("tiny-llama",), tasks=("capitalize",))
    (cell,) = expand_cells(grid, ["capitalize"])
    assert cell.run_config() == run_defaults
    assert all(getattr(args, name) is None for name in SETTINGS)  # unset: the file's or run's default


def _run_args(argv):
    import argparse

    p = argparse.ArgumentParser()
    cli.add_pipeline_args(p)
    return p.parse_args(argv)


def test_cell_config_equals_runs_for_the_same_options():
    grid = SweepGrid(models=("tiny-llama",), tasks=("t",), seeds=(3,),
                     settings={"n_shots": (5, 7), "sparsity": (0.0, 0.02), "n_test": (0,)}, exact_match=False)
    cells = expand_cells(grid, ["t"])
    assert [c.directory for c in cells] == ["seed3_n-shots5_sparsity0", "seed3_n-shots5_sparsity0.02",
                                            "seed3_n-shots7_sparsity0", "seed3_n-shots7_sparsity0.02"]
    last = cells[-1]
    expected = cli.config_from_args(_run_args(["--n-shots", "7", "--sparsity", "0.02", "--n-test", "0", "--seed", "3",
                                               "--no-exact-match"]))
    assert last.run_config() == expected and last.override_values() == {"n_shots": 7, "sparsity": 0.02}


def test_expand_cells_is_model_major_and_chunks_tasks():
    grid = SweepGrid(models=("a/x", "b/y"), tasks=("t1", "t2", "t3"), seeds=(0, 1), task_chunk=2)
    cells = expand_cells(grid, ["t1", "t2", "t3"])
    assert len(cells) == 2 * 2 * 2
    assert [c.model for c in cells] == ["a/x"] * 4 + ["b/y"] * 4
    assert [c.tasks for c in cells[:2]] == [("t1", "t2"), ("t3",)]
    assert len({c.key for c in cells}) == len(cells)


@pytest.mark.parametrize("kwargs, needle", [
    ({"seeds": (0, 0)}, "--seeds"),
    ({"settings": {"n_shots": (0,)}}, "--n-shots"),
    ({"settings": {"steps": (2.5,)}}, "--steps"),
    ({"settings": {"lr": (0.1, 0.1)}}, "--lr"),
    ({"settings": {"warmup": (1,)}}, "warmup"),
    ({"task_chunk": 0}, "--task-chunk"),
])
def test_grid_rejects_bad_values_naming_the_option(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("-", r"\-")):
        SweepGrid(models=("tiny-llama",), tasks=("capitalize",), **kwargs)


def test_grid_file_and_command_line(tmp_path, capsys):
    f = tmp_path / "grid.toml"
    f.write_text('models = ["tiny-llama", "tiny-gemma3"]\ntasks = "capitalize"\nseeds = [0, 2]\n'
                 '[settings]\nn-shots = [3, 4]\nsteps = 6\n')
    data = read_grid_file(f)
    assert data["models"] == ["tiny-llama", "tiny-gemma3"] and data["tasks"] == ["capitalize"]
    assert data["settings"] == {"n_shots": [3, 4], "steps": [6]}
    args = sweep.build_parser().parse_args(["--grid", str(f), "--seeds", "5", "--steps", "8", "9"])
    grid = sweep.grid_from_args(args)
    assert grid.seeds == (5,) and grid.settings["n_shots"] == (3, 4) and grid.settings["steps"] == (8, 9)
    assert grid.overrides == ("n_shots", "steps") and grid.models == ("tiny-llama", "tiny-gemma3")
    (tmp_path / "bad.toml").write_text("[settings]\nwarmup = 3\n")
    assert sweep.main(["--grid", str(tmp_path / "bad.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warmup" in err and "bad.toml" in err


def test_user_mistakes_are_one_line_and_exit_2(capsys):
    assert sweep.main(["--models", "tiny-llama", "--tasks", "capitalize", "--n-shots", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--n-shots" in err and err.count("\n") == 1
    assert sweep.main(["--models", "no-such-model", "--tasks", "capitalize", "--quiet"]) == 2
    assert "no-such-model" in capsys.readouterr().err


def test_ray_executor_without_ray_says_how_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if it were not installed
    assert sweep.main(["--models", "tiny-llama", "--tasks", "capitalize", "--executor", "ray", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[ray]"' in err and err.count("\n") == 1


def test_expected_model_id_matches_the_loaded_model():
    for name in MODELS:
        assert expected_model_id(name) == load_model(name).site_info.model_id
    assert expected_model_id("gemma-3-270m") == "google/gemma-3-270m"
    assert expected_model_id("org/some-model") == "org/some-model"
    bf16 = plan_placement(["gemma-3-270m"], available_gpus=0, dtype="bfloat16")["gemma-3-270m"]
    assert expected_model_id("gemma-3-270m", bf16) == "google/gemma-3-270m@bfloat16"  # the worker's id
    with pytest.raises(UserError, match="nonsense"):
        expected_model_id("nonsense")


# ----------------------------------------------------------------------------- placement


def test_placement_on_cpu():
    p = plan_placement(MODELS, executor="ray", available_gpus=0, cpus_per_model=2)
    assert {m: (x.device, x.num_gpus, x.num_cpus, x.threads) for m, x in p.items()} == \
        {m: ("cpu", 0.0, 2.0, 2) for m in MODELS}
    assert plan_placement(MODELS, available_gpus=0)["tiny-llama"].device == "cpu"


def test_placement_local_spreads_models_over_gpus():
    models = ["a", "b", "c"]
    p = plan_placement(models, executor="local", device="cuda", available_gpus=2)
    assert [p[m].device for m in models] == ["cuda:0", "cuda:1", "cuda:0"]
    p = plan_placement(models, device="cuda:1", available_gpus=2)
    assert {x.device for x in p.values()} == {"cuda:1"}
    p = plan_placement(models, device_map="auto", load_in_4bit=True, available_gpus=4)  # no --device: cuda
    assert all(x.device == "cuda" and x.device_map == "auto" and x.num_gpus == 4 and x.load_in_4bit for x in p.values())
    assert p["a"].load_kwargs() == {"device": "cuda", "device_map": "auto", "dtype": None, "load_in_4bit": True}


def test_placement_ray_shares_gpus():
    default, per = parse_per_model(["0.25", "big=2"], "--gpus-per-model", ["small", "big"])
    p = plan_placement(["small", "big"], executor="ray", device="cuda", available_gpus=8,
                       gpus_per_model={"small": default, "big": per["big"]})
    assert (p["small"].num_gpus, p["small"].device_map) == (0.25, None)
    assert (p["big"].num_gpus, p["big"].device_map, p["big"].device) == (2.0, "auto", "cuda")
    assert plan_placement(["m"], executor="ray", device="cuda", available_gpus=1)["m"].num_gpus == 1.0


@pytest.mark.parametrize("kwargs, needle", [
    ({"device": "cuda", "available_gpus": 0}, "no GPU"),
    ({"device": "cuda:3", "available_gpus": 2}, "cuda:3"),
    ({"executor": "ray", "device": "cuda:0", "available_gpus": 2}, "Ray assigns"),
    ({"executor": "ray", "device": "cuda", "available_gpus": 2, "gpus_per_model": 3}, "at most 2"),
    ({"executor": "ray", "device": "cuda", "available_gpus": 4, "gpus_per_model": 1.5}, "whole number"),
    ({"device": "cpu", "gpus_per_model": 1}, "--device cuda"),
    ({"device": "cpu", "device_map": "auto"}, "--device-map"),
    ({"executor": "local", "device": "cuda", "available_gpus": 2, "gpus_per_model": 1}, "--executor ray"),
])
def test_placement_refuses_what_cannot_be_met(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        plan_placement(["m"], **kwargs)
    with pytest.raises(ConfigError, match="not in --models"):
        parse_per_model(["other=1"], "--gpus-per-model", ["m"])


# ----------------------------------------------------------------------------- tables and figure


def test_tables_average_over_seeds_then_tasks():
    rows = []
    acc = {("a", 0): 10.0, ("a", 1): 30.0, ("b", 0): 50.0, ("b", 1): 90.0}
    for (task, seed), v in acc.items():
        rows.append({"model": "m", "task": task, "seed": seed, "method": "SITE", "first_token": v, "n_selected": 1})
    per_seed = pd.DataFrame(rows)
    t = by_task(per_seed, [])
    assert t.set_index("task")["first_token"].to_dict() == {"a": 20.0, "b": 70.0}
    assert (t["first_token_lo"] <= t["first_token"]).all() and (t["first_token"] <= t["first_token_hi"]).all()
    m = by_model(per_seed, []).iloc[0]
    assert m["first_token"] == 45.0 and (m["n_tasks"], m["n_seeds"]) == (2, 2)
    assert 20.0 <= m["first_token_lo_tasks"] < 45.0 < m["first_token_hi_tasks"] <= 70.0
    assert 30.0 <= m["first_token_lo_seeds"] < 45.0 < m["first_token_hi_seeds"] <= 60.0  # seed means 30 and 60


def test_head_depth_shares_and_figure(tmp_path):
    from site_interp.plots.sweep_figures import depth_histogram, save_sweep_figures

    heads = pd.DataFrame([
        {"model": "deep", "n_layers": 5, "layer": layer, "head": 0, "rel_depth": layer / 4, "alpha": a}
        for layer, a in enumerate([0.9, 0.1, 0.1, 0.8, 0.95])
    ] + [{"model": "flat", "n_layers": 2, "layer": layer, "head": 0, "rel_depth": float(layer), "alpha": 0.2}
         for layer in range(2)])
    h = depth_histogram(heads, bins=4)
    deep = h[h["model"] == "deep"]
    assert np.isclose(deep["share"].sum(), 1.0) and deep["n_selected"].iloc[0] == 3
    assert deep["share"].round(3).tolist() == [0.333, 0.0, 0.0, 0.667]
    assert (h[h["model"] == "flat"]["share"] == 0).all()
    files = save_sweep_figures(heads, tmp_path, ["png"])
    assert [f.name for f in files] == ["head_depth.png"] and files[0].stat().st_size > 1000


# ----------------------------------------------------------------------------- sweeps on the tiny models


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("local")
    assert sweep.main([*GRID, "--out", str(out)]) == 0
    return out


def test_local_sweep_writes_the_layout_and_tables(local_sweep):
    cells = cells_of(local_sweep)
    assert len(cells) == 4 and (cells["status"] == "computed").all() and (cells["n_computed"] == 2).all()
    ids = {m: expected_model_id(m).replace("/", "--") for m in MODELS}
    for seed in (0, 1):
        for m in MODELS:
            for task in TASKS:
                d = local_sweep / f"seed{seed}" / ids[m] / task
                assert {"alphas.safetensors", "embedding.safetensors", "results.json", "summary.csv"} <= \
                    {p.name for p in d.iterdir()}
    per_seed = pd.read_csv(local_sweep / "sweep" / "grid_per_seed.csv")
    assert len(per_seed) == 2 * 2 * 2 * 3  # models x tasks x seeds x methods
    assert set(per_seed["method"]) == {"0-shot", "2-shot ICL", "SITE"}
    # the table is each run's own summary
    summary = pd.read_csv(local_sweep / "seed1" / ids["tiny-gemma3"] / "first_letter" / "summary.csv")
    row = per_seed[(per_seed["model"] == "tiny-gemma3") & (per_seed["seed"] == 1) & (per_seed["task"] == "first_letter")]
    assert np.allclose(row.set_index("method")["first_token"].sort_index(),
                       summary.set_index("method")["first_token"].sort_index())
    heads = pd.read_csv(local_sweep / "sweep" / "heads.csv")
    assert heads["rel_depth"].between(0, 1).all() and len(heads) == 2 * 2 * 2 * 2 * 4  # cells x tasks x layers x heads
    assert (local_sweep / "sweep" / "head_depth.png").exists() and (local_sweep / "sweep" / "grid.md").exists()
    # a rerun computes nothing and writes the same tables
    before = {f: (local_sweep / "sweep" / f).read_text() for f in TABLES}
    assert sweep.main([*GRID, "--out", str(local_sweep)]) == 0
    assert (cells_of(local_sweep)["status"] == "cached").all()
    assert {f: (local_sweep / "sweep" / f).read_text() for f in TABLES} == before


def test_study_per_cell_is_written_and_reused(tmp_path):
    argv = ["--models", "tiny-llama", "--tasks", *TASKS, "--seeds", "0", *TINY, "--no-exact-match", "--study",
            "--out", str(tmp_path)]
    assert sweep.main(argv) == 0
    study = tmp_path / "seed0" / expected_model_id("tiny-llama").replace("/", "--") / "study"
    assert {"study.json", "patching_summary.csv", "transfer.csv", "overlap.csv"} <= {p.name for p in study.iterdir()}
    assert set(pd.read_csv(study / "patching_summary.csv")["task"]) == set(TASKS)
    stamp = (study / "study.json").stat().st_mtime_ns
    assert sweep.main(argv) == 0
    assert (cells_of(tmp_path)["status"] == "cached").all() and (study / "study.json").stat().st_mtime_ns == stamp


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install -e '.[ray]'; CI installs it): "
                                            "the Ray executor tests need a real local cluster")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_gives_the_same_alphas_and_tables_as_local(ray_cluster, local_sweep, tmp_path):
    assert sweep.main([*GRID, "--executor", "ray", "--out", str(tmp_path)]) == 0
    cells = cells_of(tmp_path)
    assert len(cells) == 4 and (cells["status"] == "computed").all()
    assert cells["worker"].nunique() == 2  # one actor per model, in other processes than this one
    assert not cells["worker"].str.endswith(f":{os.getpid()}").any()
    local, remote = alphas_under(local_sweep), alphas_under(tmp_path)
    assert sorted(local) == sorted(remote) and len(local) == 8
    for key in local:
        assert torch.equal(local[key], remote[key]), key
    for f in TABLES:
        assert (tmp_path / "sweep" / f).read_text() == (local_sweep / "sweep" / f).read_text(), f


def test_a_killed_worker_is_retried_and_nothing_is_lost(ray_cluster, local_sweep, tmp_path, monkeypatch):
    marker = tmp_path / "crashed"
    monkeypatch.setenv(CRASH_ENV, str(marker))
    out = tmp_path / "out"
    argv = ["--models", "tiny-llama", "--tasks", *TASKS, "--seeds", "0", "1", *TINY, "--executor", "ray"]
    assert sweep.main([*argv, "--out", str(out)]) == 0
    assert marker.exists()  # a worker did die after computing a cell
    cells = cells_of(out)
    assert len(cells) == 2 and (cells["status"] == "computed").all() and (cells["n_computed"] == 2).all()
    assert cells["restarted"].any()  # that cell came from the restarted actor
    remote, local = alphas_under(out), alphas_under(local_sweep)
    assert len(remote) == 4 and all(torch.equal(a, local[k]) for k, a in remote.items())
    assert not list(out.rglob("*.tmp"))  # no partial files
    for d in {p.parent for p in out.rglob("results.json")}:
        assert len(json.loads((d / "results.json").read_text())["records"]) == 3 * 4  # methods x queries, once


def test_resume_recomputes_only_what_is_missing(local_sweep, tmp_path):
    out = tmp_path / "half"
    shutil.copytree(local_sweep, out)
    ids = {m: expected_model_id(m).replace("/", "--") for m in MODELS}
    shutil.rmtree(out / "seed1" / ids["tiny-gemma3"])  # a cell never started
    (out / "seed0" / ids["tiny-llama"] / "first_letter" / "results.json").unlink()  # a task cut short
    untouched = {p: p.stat().st_mtime_ns for p in (out / "seed1" / ids["tiny-llama"]).rglob("*") if p.is_file()}
    assert sweep.main([*GRID, "--out", str(out), "--report-only"]) == 0  # computes nothing, says what is missing
    report = cells_of(out)
    assert sorted(report["status"]) == ["cached", "cached", "missing", "missing"] and (report["n_computed"] == 0).all()
    assert len(pd.read_csv(out / "sweep" / "grid_per_seed.csv")) == 2 * 2 * 3  # the two complete cells
    assert sweep.main([*GRID, "--out", str(out)]) == 0
    cells = cells_of(out).set_index(["model", "cell"])
    assert cells.loc[("tiny-gemma3", "seed1"), "n_computed"] == 2
    assert cells.loc[("tiny-llama", "seed0"), "n_computed"] == 1
    assert cells.loc[("tiny-llama", "seed0"), "status"] == "computed"
    assert (cells.drop([("tiny-gemma3", "seed1"), ("tiny-llama", "seed0")])["status"] == "cached").all()
    assert {p: p.stat().st_mtime_ns for p in untouched} == untouched
    back, local = alphas_under(out), alphas_under(local_sweep)
    assert sorted(back) == sorted(local) and all(torch.allclose(back[k], local[k], atol=1e-6) for k in local)
    for f in TABLES[:3]:
        assert (out / "sweep" / f).read_text() == (local_sweep / "sweep" / f).read_text(), f


# ----------------------------------------------------------------------------- GPU check


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run benchmarks/gpu_check.py itself")
def test_gpu_check_says_it_needs_a_gpu(capsys):
    assert _gpu_check().main([]) == 2
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and err.count("\n") == 1


def test_gpu_check_compares_two_runs_on_cpu(capsys):
    # the comparison logic on the CPU: bf16 against fp32 on a tiny model, within bf16 tolerance
    code = _gpu_check().main(["--device", "cpu", "--models", "tiny-llama", "--tasks", "capitalize",
                              "--n-prompts", "4", "--steps", "4", "--n-test", "4"])
    out = capsys.readouterr().out
    assert "embedding" in out and "training" in out and "max |alpha diff|" in out
    assert code in (0, 1) and ("PASS" in out) == (code == 0)
