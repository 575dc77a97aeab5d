"""Tests for site_interp.share: SITE folders round-trip offline; the Hub path with its two
network functions (and repo creation) stubbed at the boundary."""

from __future__ import annotations

import json
import shutil
import pytest
import torch

from conftest import toy_task
from site_interp import EmbeddingConfig, EvalConfig, RunConfig, SiteConfig
from site_interp.hooks import injection_hooks
from site_interp.pipeline import run_tasks
from site_interp.prompts import PromptTemplate, zero_shot_batch
from site_interp.scoring import last_token_logits
from site_interp.share import (
    FORMAT,
    HubError,
    SiteArtifact,
    SiteFolderError,
    SiteModelMismatchError,
    head_map_markdown,
    load_site,
    pull_site,
    push_site,
    save_site,
)

CFG = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=2),
                site=SiteConfig(steps=4, batch_size=2, eval_every=2, n_valid=8),
                eval=EvalConfig(n_test=4, n_shots=2, exact_match=False))


@pytest.fixture(scope="module")
def run(tiny_llama, tmp_path_factory):
    (r,) = run_tasks(tiny_llama, [toy_task()], CFG, tmp_path_factory.mktemp("share_run"), progress=False)
    return r


def test_folder_round_trip_on_the_same_model(run, tiny_llama, tmp_path):
    folder = save_site(tmp_path / "site", run)
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "alphas.safetensors", "config.json",
                                                       "embedding.safetensors"]
    site = load_site(folder, tiny_llama)
    torch.testing.assert_close(site.alpha, run.site.alpha)
    torch.testing.assert_close(site.t, run.embedding.t)
    torch.testing.assert_close(site.resid, run.embedding.resid)
    assert (site.model_id, site.task, site.path) == ("site-interp/tiny-llama-seed0", "toy", folder)
    assert site.template == PromptTemplate() and site.best_step == run.site.best_step
    assert site.task_fingerprint == run.task.fingerprint()
    assert site.settings["site"]["steps"] == 4 and site.settings["embedding"]["n_prompts"] == 4
    config = json.loads((folder / "config.json").read_text())
    assert config["format"] == FORMAT and config["shape"] == list(run.embedding.t.shape)
    assert {"python", "torch", "transformers", "transformer-lens"} <= set(config["provenance"]["versions"])
    assert {r["method"] for r in config["accuracy"]} == {"0-shot", "2-shot ICL", "SITE"}
    # the loaded injection gives the same logits as the run's own alphas
    batch = zero_shot_batch(tiny_llama, run.task, "test", 4)
    mine = last_token_logits(tiny_llama, batch.token_ids, injection_hooks(run.site.alpha, run.embedding.t))
    theirs = last_token_logits(tiny_llama, batch.token_ids, site.hooks())
    torch.testing.assert_close(theirs, mine)
    assert [m.name for m in site.methods(2)] == ["0-shot", "2-shot ICL", "SITE"]


def test_model_card_has_task_accuracy_and_head_map(run, tmp_path):
    image = tmp_path / "map.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    folder = save_site(tmp_path / "site", run, image=image)
    readme = (folder / "README.md").read_text()
    assert readme.startswith("---\nlibrary_name: site_interp")
    assert "# SITE: toy on site-interp/tiny-llama-seed0" in readme
    assert "| SITE | 4 |" in readme and "## Head map" in readme
    assert head_map_markdown(run.site.alpha) in readme
    assert "![head map](head_map.png)" in readme and (folder / "head_map.png").read_bytes() == image.read_bytes()
    table = head_map_markdown(torch.tensor([[0.9, 0.1], [0.2, 0.6]]))
    assert table.splitlines() == ["| layer | h0 | h1 |", "|---|---|---|", "| 0 | **0.90** | 0.10 |", "| 1 | 0.20 | **0.60** |"]


def test_another_model_is_refused_naming_both(run, tiny_gemma, tmp_path):
    folder = save_site(tmp_path / "site", run)
    with pytest.raises(SiteModelMismatchError) as err:
        load_site(folder, tiny_gemma)
    assert "site-interp/tiny-llama-seed0" in str(err.value) and "site-interp/tiny-gemma3-seed0" in str(err.value)


def test_from_a_task_directory_and_from_parts(run, tmp_path):
    from_dir = load_site(save_site(tmp_path / "a", run.directory))
    torch.testing.assert_close(from_dir.alpha, run.site.alpha)
    assert from_dir.model_id == "site-interp/tiny-llama-seed0" and from_dir.best_step == run.site.best_step
    parts = SiteArtifact(model_id="org/model", task="x", alpha=torch.rand(2, 4), t=torch.rand(2, 4, 16))
    assert load_site(save_site(tmp_path / "b", parts)).model_id == "org/model"
    with pytest.raises(ValueError, match="t must be"):
        SiteArtifact(model_id="m", task="x", alpha=torch.rand(2, 4), t=torch.rand(3, 4, 16))


def test_run_without_directory_needs_a_model(run, tiny_llama, tmp_path):
    import dataclasses

    loose = dataclasses.replace(run, directory=None)
    with pytest.raises(ValueError, match="pass model="):
        save_site(tmp_path / "x", loose)
    assert load_site(save_site(tmp_path / "y", loose, model=tiny_llama), tiny_llama).task == "toy"


def test_existing_folders_are_protected(run, tmp_path):
    folder = save_site(tmp_path / "site", run)
    with pytest.raises(SiteFolderError, match="overwrite=True"):
        save_site(folder, run)
    save_site(folder, run, overwrite=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(SiteFolderError, match="not empty"):
        save_site(other, run, overwrite=True)


def test_broken_folders_say_what_is_wrong(run, tmp_path):
    with pytest.raises(SiteFolderError, match="config.json is missing"):
        load_site(tmp_path)
    folder = save_site(tmp_path / "site", run)
    (folder / "embedding.safetensors").unlink()
    with pytest.raises(SiteFolderError, match="embedding.safetensors is missing"):
        load_site(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "format": "other/2"}))
    with pytest.raises(SiteFolderError, match="format"):
        load_site(folder)


def test_hub_push_and_pull_with_the_network_stubbed(run, tiny_llama, tmp_path, monkeypatch):
    import huggingface_hub

    hub = tmp_path / "hub"
    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create", repo_id, kwargs.get("exist_ok")))

    def upload_folder(self, *, folder_path, repo_id, allow_patterns=None, **kwargs):
        calls.append(("upload", repo_id, sorted(allow_patterns)))
        shutil.copytree(folder_path, hub / repo_id, dirs_exist_ok=True)
        return type("CommitInfo", (), {"commit_url": f"https://hub.example/{repo_id}/commit/1"})()

    def snapshot_download(repo_id, *, allow_patterns=None, **kwargs):
        calls.append(("download", repo_id, kwargs.get("revision")))
        if not (hub / repo_id).exists():
            raise huggingface_hub.errors.LocalEntryNotFoundError("offline and not cached")
        return str(hub / repo_id)

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    folder = save_site(tmp_path / "site", run)
    assert push_site(folder, "me/site-toy") == "https://hub.example/me/site-toy/commit/1"
    site = pull_site("me/site-toy", tiny_llama, revision="main")
    torch.testing.assert_close(site.alpha, run.site.alpha)
    assert calls[0] == ("create", "me/site-toy", True)
    assert calls[1][0] == "upload" and "alphas.safetensors" in calls[1][2]
    assert calls[2] == ("download", "me/site-toy", "main")
    with pytest.raises(HubError, match="needs a network"):
        pull_site("me/missing")
    with pytest.raises(SiteFolderError):  # a folder that does not load is never pushed
        push_site(tmp_path / "empty", "me/x")
