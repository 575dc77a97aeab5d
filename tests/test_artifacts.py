import json

import pytest
import torch

from site_interp.artifacts import ArtifactMismatchError, load_if_valid, save_artifact, slug, write_json


def test_round_trip_and_provenance(tmp_path):
    key = {"model_id": "m", "task": "t", "cfg": {"a": 1}}
    p = save_artifact(tmp_path / "x.safetensors", {"t": torch.arange(6.0).reshape(2, 3)}, key, {"extra": 5}, seed=3)
    tensors, meta = load_if_valid(p, key)
    assert torch.equal(tensors["t"], torch.arange(6.0).reshape(2, 3))
    assert meta["extra"] == 5 and meta["provenance"]["seed"] == 3
    assert meta["provenance"]["versions"]["torch"]
    assert not list(tmp_path.glob(".*tmp"))  # no temp files left behind


def test_absent_is_none_and_mismatch_is_refused(tmp_path):
    p = tmp_path / "x.safetensors"
    assert load_if_valid(p, {"model_id": "m"}) is None
    save_artifact(p, {"t": torch.zeros(1)}, {"model_id": "m", "steps": 400})
    with pytest.raises(ArtifactMismatchError, match="model_id: stored 'm', requested 'other'.*--out"):
        load_if_valid(p, {"model_id": "other", "steps": 400})


def test_write_json_is_atomic_and_readable(tmp_path):
    p = write_json(tmp_path / "d" / "r.json", {"x": torch.tensor([1, 2])})
    assert json.loads(p.read_text()) == {"x": [1, 2]}


def test_slug():
    assert slug("google/gemma-3-270m") == "google--gemma-3-270m"
    assert slug("a b/c") == "a-b--c"
