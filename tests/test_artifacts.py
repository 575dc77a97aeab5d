import json
import os
import time
from pathlib import Path

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


def test_stale_temporaries_are_removed_but_not_writes_in_progress(tmp_path):
    """A run removes what killed runs left, never the temporary of a live process's write (a
    second run on other tasks in the same directory)."""
    import subprocess
    import sys

    from site_interp.artifacts import _HOST, remove_stale_temporaries, write_atomic

    seen = []
    write_atomic(tmp_path / "a.json", lambda tmp: seen.append(Path(tmp).name) or Path(tmp).write_text("{}"))
    assert seen[0].startswith(f".a.json.{os.getpid()}@{_HOST}~") and seen[0].endswith(".tmp")

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"killed": f".r.json.{int(dead.stdout)}@{_HOST}~abc.tmp",
                 "writing": f".r.json.{live.pid}@{_HOST}~def.tmp",
                 "old format": ".r.json.ghi.tmp", "safetensors'": ".tmpXYZ12",
                 "other host, recent": ".r.json.1@elsewhere~jkl.tmp", "other host, old": ".s.json.1@elsewhere~mno.tmp"}
        for name in names.values():
            (tmp_path / name).write_text("partial")
        old = time.time() - 2 * 24 * 3600
        os.utime(tmp_path / names["other host, old"], (old, old))
        assert remove_stale_temporaries(tmp_path) == 4
        left = sorted(p.name for p in tmp_path.iterdir())
        assert left == sorted(["a.json", names["writing"], names["other host, recent"]])
    finally:
        live.kill()
        live.wait()
    assert remove_stale_temporaries(tmp_path) == 1  # its writer is gone now


@pytest.mark.skipif(os.name != "posix", reason="fcntl locks are POSIX")
def test_exclusive_holds_off_a_second_process_until_released(tmp_path):
    import subprocess
    import sys

    from site_interp.artifacts import exclusive

    lock = tmp_path / "task" / "bench" / ".fv_aie.lock"
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'a')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "    print('got')\nexcept BlockingIOError:\n    print('busy')\n")

    def other_process() -> str:
        return subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout.strip()

    with exclusive(lock):
        assert other_process() == "busy"
    assert other_process() == "got"


def test_a_json_artifact_without_its_fields_is_damaged_not_a_mismatch(tmp_path, caplog):
    """Another kind of file at an artifact's path (an older version wrote LoRA's adapter sidecar
    where LoRA's result belongs) is recomputed, not refused as 'other settings'."""
    from site_interp.artifacts import load_json_if_valid, save_json_artifact

    path = tmp_path / "lora.json"
    save_artifact(tmp_path / "lora.safetensors", {"w": torch.ones(2)}, {"model_id": "m", "lora": {"rank": 8}})
    key = {"model_id": "m", "method": "lora"}
    with caplog.at_level("WARNING"):
        assert load_json_if_valid(path, key, fields=("records",)) is None
    assert "lacks records" in caplog.text and str(path) in caplog.text
    with pytest.raises(ArtifactMismatchError):  # without fields, its key is compared: refused
        load_json_if_valid(path, key)
    save_json_artifact(path, key, {"records": [1]})
    assert load_json_if_valid(path, key, fields=("records",))["records"] == [1]
