"""Faults: damaged artifacts are named and recomputed, Ctrl-C resumes training from its last
checkpoint, and a run killed at random points (SIGKILL) never leaves a corrupt file and resumes
to the very same alphas."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

import site_interp.trainer as trainer
from site_interp.embeddings import EmbeddingConfig
from site_interp.evaluation import EvalConfig
from site_interp.pipeline import RunConfig, run_tasks
from site_interp.run import main as run_main
from site_interp.training import SiteConfig

from conftest import toy_task
from test_bad_inputs import assert_no_partial_files

CFG = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=2),
                site=SiteConfig(steps=12, batch_size=2, eval_every=2, n_valid=8),
                eval=EvalConfig(n_test=4, n_shots=2, exact_match=False))
SMALL = RunConfig(embedding=CFG.embedding, site=SiteConfig(steps=2, batch_size=2, eval_every=1, n_valid=4),
                  eval=EvalConfig(n_test=2, n_shots=2, exact_match=False))
ARGS = ["--model", "tiny-llama", "--tasks", "capitalize", "--n-prompts", "4", "--n-shots", "2", "--steps", "8",
        "--eval-every", "2", "--n-test", "4", "--max-new-tokens", "2", "--quiet"]


def _alpha_dir(out: Path) -> Path:
    return next(out.glob("*/toy"))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_sidecar(change):
    def damage(path: Path) -> None:
        sidecar = path.with_suffix(".json")
        meta = json.loads(sidecar.read_text())
        change(meta)
        sidecar.write_text(json.dumps(meta))
    return damage


def _edit_tensor(name: str, change):
    def damage(path: Path) -> None:
        with open(path, "rb") as f:  # keep the key stored in the file's metadata
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        tensors = load_file(str(path))
        tensors[name] = change(tensors[name]).contiguous()
        save_file(tensors, str(path), metadata=header["__metadata__"])
    return damage


DAMAGES = [
    ("alphas.safetensors", "truncated", _truncate),
    ("alphas.safetensors", "empty sidecar", lambda p: p.with_suffix(".json").write_text("")),
    ("alphas.safetensors", "garbage sidecar", lambda p: p.with_suffix(".json").write_text("{not json")),
    ("alphas.safetensors", "sidecar without key", _edit_sidecar(lambda m: m.pop("key"))),
    ("alphas.safetensors", "sidecar without best_step", _edit_sidecar(lambda m: m.pop("best_step"))),
    ("alphas.safetensors", "sidecar missing", lambda p: p.with_suffix(".json").unlink()),
    ("alphas.safetensors", "NaN alphas", _edit_tensor("alpha", lambda a: torch.full_like(a, float("nan")))),
    ("alphas.safetensors", "alpha of 7", _edit_tensor("alpha", lambda a: a * 0 + 7.0)),
    ("alphas.safetensors", "wrong shape", _edit_tensor("alpha", lambda a: a[:1])),
    ("embedding.safetensors", "truncated", _truncate),
    ("embedding.safetensors", "wrong shape", _edit_tensor("t", lambda t: t[..., :3])),
    ("embedding.safetensors", "NaN", _edit_tensor("t", lambda t: t * float("nan"))),
]


@pytest.mark.parametrize("case", DAMAGES, ids=[f"{c[0]}: {c[1]}" for c in DAMAGES])
def test_damaged_artifact_is_named_and_recomputed(case, tiny_llama, tmp_path, caplog):
    name, _, damage = case
    task = toy_task()
    (first,) = run_tasks(tiny_llama, [task], SMALL, tmp_path, progress=False)
    path = _alpha_dir(tmp_path) / name
    damage(path)
    with caplog.at_level(logging.WARNING):
        (again,) = run_tasks(tiny_llama, [task], SMALL, tmp_path, progress=False)
    assert any(str(path) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert torch.equal(again.site.alpha, first.site.alpha)  # recomputed: seeded, so the same
    (third,) = run_tasks(tiny_llama, [task], SMALL, tmp_path, progress=False)  # and now valid: reused
    assert third.timings["training"] == 0.0 and third.timings["embedding"] == 0.0
    assert_no_partial_files(tmp_path)


def test_ctrl_c_resumes_training_from_its_checkpoint(tmp_path, monkeypatch, capsys):
    reference = tmp_path / "reference"
    assert run_main([*ARGS, "--out", str(reference)]) == 0
    save = trainer.Checkpoint.save

    def save_then_interrupt(self, step, *args, **kwargs):
        save(self, step, *args, **kwargs)
        if step == 4:
            raise KeyboardInterrupt

    monkeypatch.setattr(trainer.Checkpoint, "save", save_then_interrupt)
    out = tmp_path / "interrupted"
    assert run_main([*ARGS, "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "run the same command again to resume" in err and "Traceback" not in err
    assert list(out.glob("*/.checkpoints/site-*.safetensors"))
    assert_no_partial_files(out)
    monkeypatch.setattr(trainer.Checkpoint, "save", save)
    resumed_from = []
    load = trainer.Checkpoint.load
    monkeypatch.setattr(trainer.Checkpoint, "load",
                        lambda self, *a: resumed_from.append(r := load(self, *a)) or r)
    assert run_main([*ARGS, "--out", str(out)]) == 0
    assert resumed_from and resumed_from[0] is not None and resumed_from[0][0] == 4  # resumed at step 4
    a = next(reference.glob("*/capitalize/alphas.safetensors")).read_bytes()
    b = next(out.glob("*/capitalize/alphas.safetensors"))
    assert load_file(str(b))["alpha"].numpy().tobytes() == load_file(
        str(next(reference.glob("*/capitalize/alphas.safetensors"))))["alpha"].numpy().tobytes()
    assert a and not list(out.glob("*/.checkpoints/site-*"))  # removed once the alphas are saved


KILL_CFG = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=2),
                     site=SiteConfig(steps=8, batch_size=2, eval_every=2, n_valid=4),
                     eval=EvalConfig(n_test=2, n_shots=2, exact_match=False))


_FORKED: dict = {}  # the bridge, built once in the parent: forked children inherit it


def _child(out: str) -> None:
    # tqdm guards its bars with a lock that forked processes share (a multiprocessing semaphore):
    # a child SIGKILLed inside a tqdm call, even a disabled bar's constructor, leaves it held for
    # good and every later child blocks on it (CI once spun 90 minutes killing blocked children).
    # A lock of its own per child keeps each kill from reaching the next run.
    tqdm.set_lock(threading.RLock())
    torch.set_num_threads(1)
    tasks = [toy_task("toy"), toy_task("toy2", n_train=30)]
    run_tasks(_FORKED["bridge"], tasks, KILL_CFG, out, progress=False)
    os._exit(0)


def _finish(child, seconds: float, what: str) -> None:
    """Wait for a child that is meant to run to its end; a hang fails the test, it never stalls it."""
    child.join(timeout=seconds)
    if child.exitcode is None:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
        pytest.fail(f"{what} did not finish within {seconds:.0f} s (a hang, or a machine far slower than the first run)")
    assert child.exitcode == 0, f"{what} exited with {child.exitcode}"


KILLS_PER_ROUND = 4  # then the round's run goes to its end: the loop ends however slow the machine is


def test_sigkill_at_random_points_never_corrupts_and_resumes_identically(tmp_path):
    """At least 50 SIGKILLs at random moments of runs on the tiny model (forked, so each try
    costs no start-up): after every kill each file is complete, and the run that finally
    finishes has byte-identical alphas to an uninterrupted run. Each round kills at most
    KILLS_PER_ROUND times and then lets the resumed run finish, so a machine slower than during
    the first run (a busy CI host) cannot turn the loop into an endless chain of kills."""
    from site_interp.loading import tiny_bridge

    _FORKED["bridge"] = tiny_bridge("llama")
    tasks = [toy_task("toy"), toy_task("toy2", n_train=30)]
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(int(os.environ.get("SITE_INTERP_KILL_SEED", "0")))
    kills, rounds = 0, 0
    t0 = time.perf_counter()
    child = ctx.Process(target=_child, args=(str(tmp_path / "reference"),))  # uninterrupted, same threads
    child.start()
    _finish(child, 300, "the uninterrupted run")
    full = time.perf_counter() - t0  # one whole run, for the kill times
    print(f"one uninterrupted run: {full:.2f} s")
    ref_dir = next((tmp_path / "reference").iterdir())
    reference = {task.name: load_file(str(ref_dir / task.name / "alphas.safetensors"))["alpha"] for task in tasks}
    while kills < 50:
        rounds += 1
        out = tmp_path / f"round{rounds}"
        for _ in range(KILLS_PER_ROUND):
            child = ctx.Process(target=_child, args=(str(out),))
            child.start()
            child.join(timeout=rng.uniform(0.0, 1.1 * full))
            if child.exitcode is not None:  # finished before its kill time
                assert child.exitcode == 0
                break
            os.kill(child.pid, signal.SIGKILL)
            child.join()
            kills += 1
            assert_no_partial_files(out, temporaries=True)
        else:
            child = ctx.Process(target=_child, args=(str(out),))
            child.start()
            _finish(child, max(300.0, 100 * full), f"the run resumed after round {rounds}'s kills")
        model_dir = next(out.iterdir())
        for task in tasks:
            got = load_file(str(model_dir / task.name / "alphas.safetensors"))["alpha"]
            assert got.numpy().tobytes() == reference[task.name].numpy().tobytes(), (rounds, kills)
        assert not list(model_dir.glob(".checkpoints/site-*"))
        assert_no_partial_files(out)  # the finished run removed what the killed ones left
