import json

import pytest

from site_interp.run import main

ARGS = ["--model", "tiny-llama", "--tasks", "capitalize", "next_item", "--n-prompts", "4", "--n-shots", "2",
        "--steps", "6", "--eval-every", "3", "--n-test", "5", "--max-new-tokens", "3", "--quiet"]


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "--n-prompts" in capsys.readouterr().out


def test_run_writes_artifacts_and_reuses_them(tmp_path, capsys):
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Held-out accuracy" in out and "capitalize" in out and "SITE 1st-tok" in out
    d = tmp_path / "site-interp--tiny-llama-seed0" / "capitalize"
    for name in ("config.json", "embedding.safetensors", "embedding.json", "alphas.safetensors", "alphas.json",
                 "results.json", "results.csv", "summary.csv", "alpha_heatmap.png"):
        assert (d / name).exists(), name
    meta = json.loads((d / "alphas.json").read_text())
    assert meta["key"]["model_id"] == "site-interp/tiny-llama-seed0" and meta["provenance"]["seed"] == 0
    before = (d / "alphas.safetensors").stat().st_mtime_ns
    assert main([*ARGS, "--out", str(tmp_path)]) == 0
    assert (d / "alphas.safetensors").stat().st_mtime_ns == before  # reused, not retrained
    # other settings in the same output directory are refused, not silently reused
    assert main([*ARGS[:-1], "--steps", "7", "--out", str(tmp_path)]) == 2
    assert "different model, task or configuration" in capsys.readouterr().err


def test_bad_inputs_exit_2_with_message(tmp_path, capsys):
    assert main(["--model", "nope", "--tasks", "capitalize", "--out", str(tmp_path)]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert main(["--model", "tiny-llama", "--tasks", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_user_errors_exit_2_but_bugs_keep_their_traceback(tmp_path, monkeypatch, capsys):
    """Only a UserError (the user's own mistake) becomes one line and exit 2; anything else is a
    bug and must surface with its traceback, even when it is a ValueError."""
    import site_interp.run as command
    from site_interp.errors import UserError

    def user_mistake(*args, **kwargs):
        raise UserError("tasks.json: fix this")

    def bug(*args, **kwargs):
        raise ValueError("an internal bug")

    monkeypatch.setattr(command, "run_tasks", user_mistake)
    assert main([*ARGS, "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "error: tasks.json: fix this"
    monkeypatch.setattr(command, "run_tasks", bug)
    with pytest.raises(ValueError, match="an internal bug"):
        main([*ARGS, "--out", str(tmp_path)])
