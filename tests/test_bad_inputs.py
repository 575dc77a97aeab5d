"""Bad inputs, table-driven: each gets one clear line naming the option or file (exit 2), never
a traceback or a silent wrong result, and leaves no partial file behind."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors import safe_open

from site_interp.patch import main as patch_main
from site_interp.run import main as run_main

TINY = ["--model", "tiny-llama", "--n-prompts", "4", "--n-shots", "2", "--steps", "4", "--eval-every", "2",
        "--n-test", "4", "--max-new-tokens", "2", "--quiet"]
TASK = ["--tasks", "capitalize"]
PAIRS = [{"input": f"w{i}", "output": f"W{i}"} for i in range(30)]


def write(path: Path, data, encoding: str = "utf-8", raw: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if raw else json.dumps(data, ensure_ascii=False)
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return path


def task_dir(root: Path, splits: dict) -> Path:
    for name, data in splits.items():
        write(root / f"{name}.json", data)
    return root


# (id, setup(tmp) -> extra argv, expected text in the one-line error)
CASES = [
    ("n-prompts 0", lambda d: [*TASK, "--n-prompts", "0"], "n_prompts (--n-prompts) must be an integer >= 1, got 0"),
    ("n-prompts -1", lambda d: [*TASK, "--n-prompts", "-1"], "n_prompts (--n-prompts) must be an integer >= 1, got -1"),
    ("n-test -1", lambda d: [*TASK, "--n-test", "-1"], "n_test (--n-test) must be an integer >= 1 or None, got -1"),
    ("eval-every 0", lambda d: [*TASK, "--eval-every", "0"], "eval_every (--eval-every) must be an integer >= 1"),
    ("max-new-tokens 0", lambda d: [*TASK, "--max-new-tokens", "0"], "max_new_tokens (--max-new-tokens) must be"),
    ("steps 0", lambda d: [*TASK, "--steps", "0"], "steps (--steps) must be an integer >= 1, got 0"),
    ("batch-size 0", lambda d: [*TASK, "--batch-size", "0"], "batch_size (--batch-size) must be an integer >= 1"),
    ("n-shots -2", lambda d: [*TASK, "--n-shots", "-2"], "n_shots (--n-shots) must be an integer >= 1, got -2"),
    ("lr inf", lambda d: [*TASK, "--lr", "inf"], "lr (--lr) must be a finite number > 0 and <= 10, got inf"),
    ("lr 1e9", lambda d: [*TASK, "--lr", "1e9"], "lr (--lr) must be a finite number > 0 and <= 10"),
    ("lr 0", lambda d: [*TASK, "--lr", "0"], "lr (--lr) must be a finite number > 0"),
    ("sparsity -1", lambda d: [*TASK, "--sparsity", "-1"], "sparsity (--sparsity) must be a finite number >= 0"),
    ("seed -1", lambda d: [*TASK, "--seed", "-1"], "seed (--seed) must be an integer >= 0"),
    ("too many new tokens", lambda d: [*TASK, "--max-new-tokens", "100000"], "past the model's context of 512"),
    ("too many shots", lambda d: [*TASK, "--n-shots", "5000"], "use fewer shots (--n-shots)"),
    ("out is a file", lambda d: [*TASK, "--out", str(write(d / "file.txt", "x", raw=True))], "is a file; give a directory"),
    ("unknown model", lambda d: [*TASK, "--model", "nope"], "unknown model 'nope'"),
    ("missing model path", lambda d: [*TASK, "--model", str(d / "models" / "my-llama")], "no model directory"),
    ("model is a file", lambda d: [*TASK, "--model", str(write(d / "sub" / "file.bin", "x", raw=True))],
     "is a file; --model takes a model directory"),
    ("model dir with config only", lambda d: [*TASK, "--model", str(write(d / "m" / "config.json", {}).parent)],
     "could not load a model from it"),
    ("unknown task", lambda d: ["--tasks", "nope"], "unknown task 'nope'"),
    ("all of an empty data dir", lambda d: ["--tasks", "all", "--data-dir", str((d / "empty").resolve())],
     "holds no task directories"),
    ("missing data dir", lambda d: ["--tasks", "all", "--data-dir", str(d / "nowhere")], "no such task directory"),
    ("latin-1 file", lambda d: ["--tasks", str(write(d / "latin.json", [{"input": "café", "output": "x"}] * 3,
                                                     encoding="latin-1"))], "latin.json: not UTF-8 text"),
    ("all duplicates", lambda d: ["--tasks", str(write(d / "dup.json", [{"input": "a", "output": "b"}] * 9))],
     "dup.json: only 1 distinct inputs"),
    ("NaN output", lambda d: ["--tasks", str(write(d / "nan.json", '[{"input": "a", "output": NaN}]', raw=True))],
     "a JSON NaN or Infinity, not text"),
    ("lone surrogate", lambda d: ["--tasks", str(write(d / "sur.json", '[{"input": "\\ud83d", "output": "x"}]',
                                                       raw=True))], "not valid Unicode text"),
    ("same task name twice", lambda d: ["--tasks", str(write(d / "a" / "t.json", PAIRS)), str(write(d / "b" / "t.json", PAIRS))],
     "two tasks are named 't'"),
    ("test split is train", lambda d: ["--tasks", str(task_dir(d / "same", {"train": PAIRS, "valid": PAIRS, "test": PAIRS}))],
     "the test split is identical to the train split"),
    ("empty answer", lambda d: ["--tasks", str(write(d / "empty.json", [{"input": "a", "output": " "}]))],
     "has an empty 'output'"),
]

PATCH_CASES = [
    ("n-perm 0", ["--n-perm", "0"], "n_perm (--n-perm) must be an integer >= 19, got 0"),
    ("n-random 0", ["--n-random", "0"], "n_random (--n-random) must be an integer >= 1, got 0"),
    ("ks -1", ["--ks", "-1"], "ks (--ks) must be an integer >= 0, got -1"),
    ("top-k 0", ["--top-k", "0"], "top_k (--top-k) must be an integer >= 1 or None, got 0"),
]


def assert_no_partial_files(root: Path, temporaries: bool = False) -> None:
    """Every file under ``root`` is complete: nothing empty, JSON parses, tensors open; and no
    temporary of an atomic write is left (``temporaries``: a killed process may leave hidden
    ``.*.tmp`` files, which nothing reads and the next run removes)."""
    for path in root.rglob("*"):
        if path.is_dir() or path.suffix == ".lock":  # lock files (artifacts.exclusive) are empty
            continue
        if path.name.endswith(".tmp") or path.name.startswith(".tmp"):  # ours, or safetensors' writer's
            assert temporaries and path.name.startswith("."), path
            continue
        assert path.stat().st_size > 0, path
        if path.suffix == ".json":
            json.loads(path.read_text())
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                list(f.keys())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_run_command_bad_input(case, tmp_path, capsys, monkeypatch):
    name, setup, expected = case
    (tmp_path / "empty").mkdir()
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    extra = setup(tmp_path)
    argv = [*TINY, "--out", str(out), *extra]
    assert run_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert expected in err[0]
    assert "Traceback" not in err[0]
    if out.exists():
        assert_no_partial_files(out)


@pytest.mark.parametrize("case", PATCH_CASES, ids=[c[0] for c in PATCH_CASES])
def test_patch_command_bad_input(case, tmp_path, capsys):
    name, extra, expected = case
    assert patch_main([*TINY, *TASK, "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_out(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    assert run_main([*TINY, *TASK, "--out", str(locked / "runs")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_a_folder_named_like_a_builtin_task_does_not_shadow_it(tmp_path, monkeypatch):
    from site_interp.tasks import resolve_tasks

    (tmp_path / "plural").mkdir()
    monkeypatch.chdir(tmp_path)
    (task,) = resolve_tasks(["plural"])
    assert task.source.startswith("builtin:plural")


def test_task_names_never_leave_the_output_directory(tmp_path):
    from site_interp.artifacts import slug

    for name in ("..", ".", "../x", ".hidden"):
        assert not slug(name).startswith(".") and "/" not in slug(name)


REPORT = ["--models", "tiny-llama", "--tasks", "capitalize", "--data-dir", "", "--report-only", "--quiet"]
REPORT_CASES = [
    ("seeds -1", lambda d: ["--seeds", "-1"], "seeds (--seeds) must be an integer >= 0, got -1"),
    ("n-perm 0", lambda d: ["--n-perm", "0"], "n_perm (--n-perm) must be an integer >= 1, got 0"),
    ("n-test 0", lambda d: ["--n-test", "0"], "n_test (--n-test) must be an integer >= 1"),
    ("unknown model", lambda d: ["--models", "nope"], "unknown model 'nope'"),
    ("page is a directory", lambda d: ["--page", str(d)], "is a directory; give the path of the markdown file"),
    ("page inside a file", lambda d: ["--page", str(write(d / "f.txt", "x", raw=True) / "r.md")],
     "--page's directory"),
    ("missing data dir", lambda d: ["--tasks", "all", "--data-dir", str(d / "nowhere")], "no such task directory"),
    ("readme without markers", lambda d: ["--readme", str(write(d / "README.md", "# no block", raw=True))],
     "add the two markers"),
]


@pytest.mark.parametrize("case", REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_report_command_bad_input(case, tmp_path, capsys):
    from site_interp.report import main as report_main

    name, setup, expected = case
    out = tmp_path / "out"
    argv = [*REPORT, "--out", str(out), "--page", str(tmp_path / "page" / "r.md"), *setup(tmp_path)]
    assert report_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not (tmp_path / "page" / "r.md").exists()


BENCH = [*TINY, "--tasks", "capitalize", "next_item", "--methods", "fv", "--fv-aie-prompts", "2"]
BENCH_CASES = [
    ("rank task twice", ["--fv-rank-tasks", "capitalize", "next_item", "capitalize"],
     "names capitalize more than once; name each ranking task once"),
    ("unknown rank task", ["--fv-rank-tasks", "capitalize", "no_such_task"], "unknown task 'no_such_task'"),
    ("seeds -1", ["--seeds", "-1"], "seeds (--seeds) must be an integer >= 0, got -1"),
]


@pytest.mark.parametrize("case", BENCH_CASES, ids=[c[0] for c in BENCH_CASES])
def test_bench_command_bad_input(case, tmp_path, capsys):
    from site_interp.bench import main as bench_main

    name, extra, expected = case
    assert bench_main([*BENCH, "--out", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert not list((tmp_path / "out").rglob("*.json"))  # refused before any work
