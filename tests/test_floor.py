"""The floor model (benchmarks/floor*.py) against what really runs, on the tiny bridges.

FLOPs: the analytical count of a forward (and of a SITE training step's backward to the
activations) must equal what torch's FlopCounterMode counts on a real bridge forward, within 2%
(in practice exactly: both count the same matmuls). Census: the forwards the census plans for a
run must be exactly those a run makes (recorded by a forward pre-hook). Nothing is timed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from floor import run_stages  # noqa: E402
from floor_census import STAGES, census, prefix_forwards, scored_forwards  # noqa: E402
from floor_measure import ForwardRecorder, Rates, StageClock  # noqa: E402
from floor_model import Dims, Forward, forward_flops, merge, totals  # noqa: E402

TOL = 0.02


def counted(fn) -> int:
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()


def test_dims_come_from_the_config(tiny_llama, tiny_gemma):
    llama, gemma = Dims.of(tiny_llama), Dims.of(tiny_gemma)
    assert (llama.n_heads, llama.n_kv_heads, llama.d_head, llama.mlp_mats) == (4, 2, 16, 3)
    assert (gemma.n_heads, gemma.n_kv_heads, gemma.d_head, gemma.mlp_mats) == (4, 1, 24, 3)


@pytest.mark.parametrize("length", [1, 9, 40])
@pytest.mark.parametrize("keep", [1, 0])
def test_forward_flops_match_the_flop_counter(tiny, length, keep):
    """Full prompts, logits of the last token only (keep=1) or of every position (the
    unembedding then runs on rows x length positions)."""
    rows = 3
    ids = torch.randint(4, 90, (rows, length))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        real = counted(lambda: tiny(ids, attention_mask=mask, logits_to_keep=keep))
    model = forward_flops(Dims.of(tiny), Forward(rows, length, length, rows if keep else rows * length))
    assert model == pytest.approx(real, rel=TOL)


def test_the_unembedding_is_counted_where_logits_are_computed(tiny_gemma):
    """A model that forgot the unembedding, or counted it for every position, would fail."""
    dims = Dims.of(tiny_gemma)
    ids = torch.randint(4, 90, (2, 30))
    with torch.no_grad():
        last = counted(lambda: tiny_gemma(ids, logits_to_keep=1))
        every = counted(lambda: tiny_gemma(ids, logits_to_keep=0))
    unembed_row = 2 * dims.d_model * dims.d_vocab
    assert every - last == pytest.approx(unembed_row * 2 * 29, rel=TOL)
    # on a tiny model the unembedding is within 2% of the total: here the difference must be exact
    assert last - forward_flops(dims, Forward(2, 30, 30, 0)) == 2 * unembed_row


def _prompts(n: int, lo: int = 6, hi: int = 30) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return [[1] + torch.randint(4, 90, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def _scorer(bridge, prompts):
    from site_interp.prompts import PromptBatch
    from site_interp.scoring import LastTokenScorer

    batch = PromptBatch(texts=[""] * len(prompts), targets=[""] * len(prompts),
                        target_ids=torch.randint(4, 90, (len(prompts),)), token_ids=prompts)
    return LastTokenScorer(bridge, [batch], fast=True)


def test_last_token_forwards_over_a_prefix_cache(tiny):
    """Keys at the cached width: the census's forwards of a scorer match the counted FLOPs."""
    prompts = _prompts(12)
    scorer = _scorer(tiny, prompts)
    rows = torch.tensor([0, 3, 5, 11, 2])
    lens = torch.tensor([len(p) for p in prompts])
    plan = scored_forwards(scorer.widths, lens, rows, cached=True)
    with torch.no_grad():
        real = counted(lambda: scorer.logits(rows))
    assert sum(forward_flops(Dims.of(tiny), f) for f in plan) == pytest.approx(real, rel=TOL)


def test_training_step_backward_to_the_activations(tiny):
    """A real SITE step (last token over the prefix cache, loss backward to per-row alphas, the
    weights frozen): forward + backward FLOPs as the model says; the backward alone too."""
    prompts = _prompts(10)
    scorer = _scorer(tiny, prompts)
    dims = Dims.of(tiny)
    rows = torch.tensor([1, 4, 7])
    lens = torch.tensor([len(p) for p in prompts])
    t = torch.randn(len(rows), dims.n_layers, dims.n_heads, dims.d_head)
    alpha = torch.full((len(rows), dims.n_layers, dims.n_heads), 0.3, requires_grad=True)

    def step():
        scorer.losses(rows, alpha, t).sum().backward()

    with torch.no_grad():
        forward_only = counted(lambda: scorer.losses(rows, alpha, t))
    both = counted(step)
    assert alpha.grad is not None and alpha.grad.abs().sum() > 0
    plan = scored_forwards(scorer.widths, lens, rows, cached=True, backward=True)
    fwd = [Forward(**{**vars(f), "backward": False}) for f in plan]
    assert sum(forward_flops(dims, f) for f in fwd) == pytest.approx(forward_only, rel=TOL)
    assert sum(forward_flops(dims, f) for f in plan) == pytest.approx(both, rel=TOL)
    # the backward is about the forward again: not zero, not the weight gradients too (3x)
    assert 0.5 < (both - forward_only) / forward_only < 1.5


def test_prefix_pieces_are_those_the_library_builds(tiny_llama):
    from site_interp.prefix_cache import prefix_cache_for

    segments = [_prompts(40, 5, 80), _prompts(7, 20, 25)]
    cache = prefix_cache_for(tiny_llama, segments)
    plan, widths = prefix_forwards(tiny_llama, segments)
    assert len(cache.segments) > 2  # the long-tailed segment was split into pieces
    built = sorted(s.mask.shape[1] for s in cache.segments)
    assert sorted({f.q_len + 1 for f in plan}) == sorted(set(built))
    assert sum(f.rows for f in plan) == 47
    assert torch.equal(widths, torch.tensor([s.mask.shape[1] for s in cache.segments])[cache.segment_of])


def _tasks():
    from site_interp.tasks import Task
    from site_interp.tasks.builtin import builtin_task

    out = []
    for name in ("capitalize", "country_capital"):
        t = builtin_task(name)
        out.append(Task(name, t.train[:30], t.valid[:10], t.test[:6]))
    return out


def test_census_equals_the_forwards_a_run_makes(tiny):
    from site_interp import EmbeddingConfig, EvalConfig, SiteConfig
    from site_interp.pipeline import RunConfig

    tasks = _tasks()
    cfg = RunConfig(embedding=EmbeddingConfig(n_prompts=5, n_shots=2, batch_size=2),
                    site=SiteConfig(steps=6, batch_size=2, eval_every=4, n_valid=8),
                    eval=EvalConfig(n_test=6, n_shots=2, batch_size=4, max_new_tokens=3))
    clock = StageClock()
    recorder = ForwardRecorder(tiny, clock)
    try:
        run_stages(tiny, tasks, cfg, clock, transfer_n_test=5)
    finally:
        recorder.close()
    plan = census(tiny, tasks, cfg, eval_shots=(0, 2, 0), transfer_n_test=5)
    assert not recorder.forwards.get(None)  # every forward ran inside a stage

    def shapes(fs):
        return sorted((f.rows, f.q_len, f.k_len, f.logits_rows, f.backward, f.real_tokens) for f in merge(fs))

    for stage in STAGES:
        if stage != "generation (exact match)":
            assert shapes(recorder.forwards[stage]) == shapes(plan["stages"][stage]), stage
    assert any(f.backward for f in recorder.forwards["training steps"])
    assert not any(f.backward for s in STAGES if s != "training steps" for f in recorder.forwards[s])
    # generation: the prompt passes exactly, the later steps at most the census's upper bound
    dims = Dims.of(tiny)
    ran, bound = recorder.forwards["generation (exact match)"], plan["stages"]["generation (exact match)"]
    prompt_passes = [f for f in ran if f.q_len > 1 or f.k_len == 1]
    assert shapes(prompt_passes) == shapes([f for f in bound if f.q_len > 1 or f.k_len == 1])
    assert totals(dims, ran)["flops"] <= totals(dims, bound)["flops"]


def test_rates_are_positive_and_the_floor_adds_up(tiny_llama):
    dims = Dims.of(tiny_llama)
    rates = Rates(torch.float32, min_time=0.003, reps=1)
    f = Forward(2, 8, 8, 2)
    one = rates.seconds(dims, [f])
    assert one > 0
    assert rates.seconds(dims, [Forward(2, 8, 8, 2, count=3)]) == pytest.approx(3 * one)
    assert all(r["gflop_per_s"] > 0 for r in rates.to_dict())


def test_a_runs_training_groups_are_read_back_from_its_alphas(tmp_path, tiny_llama):
    """floor.py --from-run sets each group's recorded time against that group's census: the group
    comes from the sidecars' ``trained_with``, or, for alphas saved before it, from equal seconds."""
    import json

    from floor import run_groups

    from site_interp.embeddings import EmbeddingConfig
    from site_interp.evaluation import EvalConfig
    from site_interp.pipeline import RunConfig, run_tasks
    from site_interp.tasks.builtin import builtin_task
    from site_interp.training import SiteConfig

    tasks = [builtin_task(n) for n in ("capitalize", "first_letter", "past_tense")]
    cfg = RunConfig(EmbeddingConfig(n_prompts=2, n_shots=1), SiteConfig(steps=2, eval_every=2), EvalConfig(n_test=2))
    run_tasks(tiny_llama, tasks[:2], cfg, tmp_path, progress=False, evaluate_methods=False)  # two runs: two groups
    run_tasks(tiny_llama, tasks, cfg, tmp_path, progress=False, evaluate_methods=False)
    sides = {p.parent.name: p for p in tmp_path.rglob("alphas.json")}
    meta = {n: json.loads(p.read_text()) for n, p in sides.items()}
    assert {n: tuple(m["trained_with"]) for n, m in meta.items()} == {
        "capitalize": ("capitalize", "first_letter"), "first_letter": ("capitalize", "first_letter"),
        "past_tense": ("past_tense",)}
    recorded = {n: tuple(m["trained_with"]) for n, m in meta.items()}
    seconds = {n: m["seconds"] for n, m in meta.items()}
    expected = sorted([["capitalize", "first_letter"], ["past_tense"]])
    assert sorted(run_groups(recorded, seconds)) == expected
    assert sorted(run_groups({n: None for n in meta}, seconds)) == expected  # before the record: equal seconds
    assert run_groups({"capitalize": recorded["capitalize"]}, seconds) == []  # a group missing a task is left out


def test_fv57_reads_a_runs_seconds_only_at_its_settings(tmp_path, tiny_llama):
    """floor.py --fv57 --from-run: the census of a task directory, the measured embedding seconds
    per task and the training seconds per group the run trained, each equal to what the sidecars
    record; a run made at other settings is not measured against this census."""
    import argparse
    import dataclasses
    import json

    from floor import fv57

    from site_interp.embeddings import EmbeddingConfig
    from site_interp.evaluation import EvalConfig
    from site_interp.pipeline import RunConfig, run_tasks
    from site_interp.tasks.builtin import builtin_task
    from site_interp.training import SiteConfig

    data = tmp_path / "tasks"
    names = ("capitalize", "first_letter", "past_tense")
    for name in names:
        t = builtin_task(name)
        for split, rows in (("train", t.train[:20]), ("valid", t.valid[:6]), ("test", t.test[:4])):
            (data / name).mkdir(parents=True, exist_ok=True)
            (data / name / f"{split}.json").write_text(json.dumps(rows))
    from site_interp.tasks import load_task_dir

    tasks = list(load_task_dir(data).values())
    cfg = RunConfig(EmbeddingConfig(n_prompts=2, n_shots=1), SiteConfig(steps=2, eval_every=2, n_valid=4),
                    EvalConfig(n_test=2))
    run = tmp_path / "run"
    run_tasks(tiny_llama, tasks[:2], cfg, run, progress=False, evaluate_methods=False)  # two groups
    run_tasks(tiny_llama, tasks, cfg, run, progress=False, evaluate_methods=False)
    side = {(p.parent.name, p.stem): json.loads(p.read_text()) for k in ("embedding", "alphas") for p in run.rglob(f"{k}.json")}
    dims, rates = Dims.of(tiny_llama), Rates(torch.float32, min_time=0.003, reps=1)
    args = argparse.Namespace(data_dir=str(data), from_run=str(run))

    stages = fv57(args, tiny_llama, dims, rates, cfg=cfg)["stages"]
    assert [r["stage"] for r in stages[:len(STAGES)]] == list(STAGES)  # the census, then what was measured
    assert all(r["measured_s"] is None for r in stages[:len(STAGES)])
    rows = {r["stage"]: r for r in stages[len(STAGES):]}
    emb = rows["task embeddings"]
    assert emb["measured_s"] == pytest.approx(sum(side[(n, "embedding")]["seconds"] for n in names))
    assert emb["note"] == ", measured: 3 of 3 tasks" and emb["ratio"] == pytest.approx(emb["measured_s"] / emb["floor_s"])
    train = rows["training (caches + steps + validation)"]
    assert train["measured_s"] == pytest.approx(sum(side[(n, "alphas")]["seconds"] for n in names))
    assert "the 2 groups the run trained, 3 tasks" in train["note"]
    groups = {k: r for k, r in rows.items() if k.startswith("  training group")}
    assert len(groups) == 2 and sum(r["measured_s"] for r in groups.values()) == pytest.approx(train["measured_s"])
    assert all(r["ratio"] == pytest.approx(r["measured_s"] / r["floor_s"]) for r in groups.values())
    assert not any(k.startswith("test evaluation +") or k.startswith("transfer rows") for k in rows)  # not run

    from site_interp.studies.report_runs import ScaleConfig, transfer_columns, transfer_seconds

    transfer_columns(tiny_llama, tasks, cfg, run, ScaleConfig(), progress=False)  # P4: the whole matrix
    columns = transfer_seconds(tiny_llama, tasks, cfg, run, ScaleConfig())
    rows = {r["stage"]: r for r in fv57(args, tiny_llama, dims, rates, cfg=cfg)["stages"][len(STAGES):]}
    whole = rows["transfer rows (3 x 3, measured whole)"]
    assert whole["measured_s"] == pytest.approx(sum(columns.values()))
    next(run.rglob("transfer/past_tense.json")).unlink()  # a transfer run stopped after two columns
    rows = {r["stage"]: r for r in fv57(args, tiny_llama, dims, rates, cfg=cfg)["stages"][len(STAGES):]}
    part = rows["transfer rows, measured: 2 of 3 columns"]
    assert part["measured_s"] == pytest.approx(columns["capitalize"] + columns["first_letter"])
    assert 0 < part["gflop"] < whole["gflop"] and 0 < part["floor_s"] < whole["floor_s"]

    other = dataclasses.replace(cfg, site=dataclasses.replace(cfg.site, steps=4))  # same embeddings, other training
    rows = {r["stage"]: r for r in fv57(args, tiny_llama, dims, rates, cfg=other)["stages"][len(STAGES):]}
    assert rows["task embeddings"]["measured_s"] == pytest.approx(emb["measured_s"])
    assert not any(k.startswith(("training", "  training", "transfer rows")) for k in rows)
