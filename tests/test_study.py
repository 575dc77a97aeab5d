import json

from site_interp.figures import main as figures_main
from site_interp.patch import main as patch_main

ARGS = ["--model", "tiny-llama", "--tasks", "capitalize", "next_item", "first_letter", "--n-prompts", "4",
        "--n-shots", "2", "--steps", "4", "--eval-every", "2", "--n-test", "6", "--max-new-tokens", "2",
        "--ks", "1", "4", "--n-random", "2", "--n-perm", "50", "--quiet",
        "--stability-seeds", "1", "--stability-batch-sizes", "2"]


def test_patch_cli_writes_study_and_figures(tmp_path, capsys):
    assert patch_main([*ARGS, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Patching the task embedding" in out and "Transfer: own alphas" in out and "Clustering order" in out
    root = tmp_path / "site-interp--tiny-llama-seed0"
    study = root / "study"
    for name in ("patching_summary.csv", "patching_records.csv", "transfer.csv", "transfer_normalized.csv",
                 "similarity_jaccard.csv", "overlap.csv", "clustering.json", "study.json"):
        assert (study / name).exists(), name
    stability = json.loads((study / "stability.json").read_text())
    assert set(stability["variants"]) == {"seed1", "batch2"} and 0 <= stability["within"] <= 1
    assert "Head-set stability (3 runs per task)" in out
    clustering = json.loads((study / "clustering.json").read_text())
    assert sorted(clustering["order"]) == ["capitalize", "first_letter", "next_item"]
    figs = sorted(p.name for p in (root / "figures").glob("*.png"))
    for name in ("alpha_grid.png", "patching_curves.png", "transfer.png", "similarity_clustermap.png", "dendrogram.png"):
        assert name in figs, figs
    # regenerate every figure from the files alone, in another format
    assert figures_main([str(root), "--out", str(tmp_path / "again"), "--formats", "svg"]) == 0
    again = sorted(p.name for p in (tmp_path / "again").glob("*.svg"))
    assert [n.replace(".svg", ".png") for n in again] == figs


def test_figures_cli_on_a_non_run_directory(tmp_path, capsys):
    assert figures_main([str(tmp_path)]) == 2
    assert "no */alphas.safetensors" in capsys.readouterr().err
