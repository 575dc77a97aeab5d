"""The floor model's census: every forward each stage of a run performs, from the run's settings.

Built with the library's own pieces (prompt builders, :func:`~site_interp.batching.width_buckets`,
``prefix_cache_for`` itself for the cache pieces, the training groups and step schedules, the
evaluation's batch bounds), so the shapes are those that run; the few loops the library writes
inline (the embedding's sort-and-chunk, a cache piece's chunks, the scorer's chunks, a training
group's schedules) are repeated here and checked against forwards recorded from real runs
(``tests/test_floor.py``). No model forward is run.

Generation lengths depend on what the model writes: :func:`exact_match_forwards` gives the
prompt passes exactly and the later steps as an upper bound (every row runs all
``max_new_tokens``); a run records the real ones (``floor_measure.ForwardRecorder``).
"""

from __future__ import annotations

import inspect
from typing import Sequence

import torch

from site_interp import prefix_cache
from site_interp.batching import BUCKET_OVERHEAD_TOKENS, width_buckets
from site_interp.embeddings import EmbeddingConfig
from site_interp.evaluation import MAX_BATCH_TOKENS, EvalConfig
from site_interp.loading import model_context
from site_interp.prompts import build_prompts, icl_prompt_batch, zero_shot_batch
from site_interp.studies.transfer import REFERENCES
from site_interp.tasks.core import Task
from site_interp.training import SiteConfig, training_groups, training_rows

from floor_model import Forward

STAGES = ("task embeddings", "prefix caches", "training steps", "validation", "test evaluation",
          "generation (exact match)", "transfer rows")

PREFIX_BATCH = inspect.signature(prefix_cache.build_prefix_cache).parameters["batch_size"].default
"""``build_prefix_cache``'s ``batch_size`` (rows per forward of a cache piece), as ``prefix_cache_for`` calls it."""
SCORE_CHUNK, VALID_CHUNK, TRANSFER_CHUNK = 128, 64, 128
"""``LastTokenScorer.score``'s default chunk, ``mean_losses``' chunk, ``transfer_matrix``'s chunk."""


def embedding_forwards(bridge, task: Task, cfg: EmbeddingConfig) -> list[Forward]:
    """``compute_task_embedding``: M N-shot prompts, sorted by length, ``batch_size`` per forward."""
    batch = icl_prompt_batch(bridge.tokenizer, task, cfg.n_prompts, cfg.n_shots, cfg.seed,
                             max_length=model_context(bridge))
    lens = sorted(len(ids) for ids in batch.token_ids)
    out = []
    for i in range(0, len(lens), cfg.batch_size):
        chunk = lens[i : i + cfg.batch_size]
        out.append(Forward(len(chunk), chunk[-1], chunk[-1], len(chunk), real_tokens=sum(chunk)))
    return out


def prefix_forwards(bridge, segments: Sequence[Sequence[Sequence[int]]], *, fast: bool = True,
                    max_cache_gib: float = 8.0) -> tuple[list[Forward], torch.Tensor]:
    """``prefix_cache_for``: the forwards that build the cache (every prompt but its last token,
    each segment in ``width_buckets`` pieces, ``build_prefix_cache``'s batch of rows per forward),
    and each row's width as the scorer then pads it (its piece's width; the prompt's own length
    when no cache is made). ``prefix_cache_for`` itself decides, with the builder of its pieces
    replaced for the call by one that only records their shapes."""
    flat = [ids for s in segments for ids in s]
    lens = torch.tensor([len(ids) for ids in flat], dtype=torch.long)
    out: list[Forward] = []

    def record(bridge, token_ids, **kwargs):
        width = max(len(ids) for ids in token_ids)
        for i in range(0, len(token_ids), PREFIX_BATCH):
            chunk = token_ids[i : i + PREFIX_BATCH]
            out.append(Forward(len(chunk), width - 1, width - 1, 0,  # no unembedding (prefix_cache._no_unembedding)
                               real_tokens=sum(len(ids) - 1 for ids in chunk)))
        return prefix_cache.PrefixCache([], [], torch.ones(len(token_ids), width, dtype=torch.long),
                                        torch.zeros(len(token_ids), 1, dtype=torch.long), None)

    build, prefix_cache.build_prefix_cache = prefix_cache.build_prefix_cache, record
    try:
        cache = prefix_cache.prefix_cache_for(bridge, segments, fast=fast, max_cache_gib=max_cache_gib)
    finally:
        prefix_cache.build_prefix_cache = build
    if cache is None:
        return [], lens
    return out, torch.tensor([s.mask.shape[1] for s in cache.segments])[cache.segment_of]


def scored_forwards(widths: torch.Tensor, lens: torch.Tensor, rows: torch.Tensor, cached: bool, *,
                    backward: bool = False, overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[Forward]:
    """``LastTokenScorer.logits`` on ``rows``: one forward per ``width_buckets`` group, the last
    token over the prefix cache (keys: the group's widest piece), or the full prompts without one."""
    out = []
    for g in width_buckets(widths[rows], overhead):
        r = rows[g]
        width = int(widths[r].max())
        if cached:
            out.append(Forward(len(g), 1, width, len(g), backward, real_tokens=len(g)))
        else:
            out.append(Forward(len(g), width, width, len(g), backward, real_tokens=int(lens[r].sum())))
    return out


def score_forwards(widths: torch.Tensor, lens: torch.Tensor, rows: torch.Tensor, cached: bool, chunk: int) -> list[Forward]:
    """``LastTokenScorer.score``: rows ordered by width, ``chunk`` at a time, each through :func:`scored_forwards`."""
    order = torch.argsort(widths[rows], stable=True)
    out = []
    for start in range(0, len(rows), chunk):
        out += scored_forwards(widths, lens, rows[order[start : start + chunk]], cached)
    return out


def training_census(bridge, tasks: Sequence[Task], cfg: SiteConfig, max_cache_gib: float = 8.0) -> list[dict]:
    """``train_site_many``: per training group, the forwards of its prefix caches (train + valid),
    of its steps (forward + backward to the activations) and of its validations."""
    groups = []
    n_validations = sum(1 for s in range(1, cfg.steps + 1) if s % cfg.eval_every == 0 or s == cfg.steps)
    for group in training_groups(bridge, tasks, cfg, max_cache_gib):
        members = [tasks[k] for k in group]
        schedules, batches = zip(*(training_rows(bridge, task, cfg) for task in members))
        train_ids = [b.token_ids for b in batches]
        valid_ids = [zero_shot_batch(bridge, task, "valid", cfg.n_valid).token_ids for task in members]
        build_t, w_t = prefix_forwards(bridge, train_ids, fast=cfg.fast, max_cache_gib=max_cache_gib)
        build_v, w_v = prefix_forwards(bridge, valid_ids, fast=cfg.fast, max_cache_gib=max_cache_gib)
        lens_t = torch.tensor([len(x) for s in train_ids for x in s])
        lens_v = torch.tensor([len(x) for s in valid_ids for x in s])
        starts = torch.tensor([0] + [len(s) for s in train_ids]).cumsum(0).tolist()
        steps = []
        for step in range(cfg.steps):
            rows = torch.cat([torch.arange(starts[k], starts[k + 1])[schedules[k][step]] for k in range(len(members))])
            steps += scored_forwards(w_t, lens_t, rows, bool(build_t), backward=True)
        valid = score_forwards(w_v, lens_v, torch.arange(len(lens_v)), bool(build_v), VALID_CHUNK)
        groups.append({"tasks": [t.name for t in members], "prefix caches": build_t + build_v,
                       "training steps": steps, "validation": [Forward(**{**vars(f), "count": f.count * n_validations})
                                                               for f in valid]})
    return groups


def _eval_batches(bridge, task: Task, cfg: EvalConfig, shots: Sequence[int]) -> dict[int, list[list[int]]]:
    queries = task.test[: cfg.n_test] if cfg.n_test else task.test
    return {n: build_prompts(bridge.tokenizer, queries, n_shots=n, demo_pool=task.train, seed=cfg.seed,
                             max_length=model_context(bridge), task=task.name).token_ids for n in dict.fromkeys(shots)}


def first_token_forwards(bridge, task: Task, cfg: EvalConfig, shots: Sequence[int]) -> list[Forward]:
    """``evaluate`` with ``exact_match=False`` for methods with these shot counts (0-shot and
    SITE: 0; ICL: N): the 0-shot prefix cache, then ``batch_size`` rows per forward (full ICL
    prompts in batches of at most ``MAX_BATCH_TOKENS`` row-tokens)."""
    batches = _eval_batches(bridge, task, cfg, shots)
    out, widths = prefix_forwards(bridge, [batches[0]]) if 0 in batches else ([], None)
    cached = bool(out)
    for n in shots:
        ids = batches[n]
        step = cfg.batch_size if n == 0 else max(1, min(cfg.batch_size, MAX_BATCH_TOKENS // max(map(len, ids))))
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            if n == 0 and cached:  # over the prefix cache: padded to the widest piece among the rows
                width = int(widths[start : start + len(chunk)].max())
                out.append(Forward(len(chunk), 1, width, len(chunk), real_tokens=len(chunk)))
            else:
                width = max(map(len, chunk))
                out.append(Forward(len(chunk), width, width, len(chunk), real_tokens=sum(map(len, chunk))))
    return out


def exact_match_forwards(bridge, task: Task, cfg: EvalConfig, shots: Sequence[int]) -> tuple[list[Forward], list[Forward]]:
    """``evaluate`` with ``exact_match=True``: (the prompt passes, exact; the generation steps, an
    upper bound: every row runs all ``max_new_tokens`` with the KV cache, none stops early)."""
    batches = _eval_batches(bridge, task, cfg, shots)
    prompt, gen = [], []
    for n in shots:
        ids = batches[n]
        step = max(1, min(cfg.batch_size, MAX_BATCH_TOKENS // max(map(len, ids))))
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            width = max(map(len, chunk))
            prompt.append(Forward(len(chunk), width, width, len(chunk), real_tokens=sum(map(len, chunk))))
            gen += [Forward(len(chunk), 1, width + s, len(chunk), real_tokens=len(chunk))
                    for s in range(1, cfg.max_new_tokens)]
    return prompt, gen


def transfer_forwards(bridge, tasks: Sequence[Task], n_test: int | None, n_sources: int | None = None
                      ) -> list[Forward]:
    """``transfer_matrix``: the test prompts' prefix caches, then every query under every source
    (T tasks + the references), ``TRANSFER_CHUNK`` rows of similar widths at a time. ``tasks`` are
    the targets; ``n_sources`` (default: as many as targets) the source tasks of each column."""
    ids = [build_prompts(bridge.tokenizer, task.test[:n_test] if n_test else task.test,
                         max_length=model_context(bridge), task=task.name).token_ids for task in tasks]
    build, widths = prefix_forwards(bridge, ids)
    lens = torch.tensor([len(x) for s in ids for x in s])
    rows = torch.arange(len(lens)).repeat_interleave((n_sources or len(tasks)) + len(REFERENCES))
    return build + score_forwards(widths, lens, rows, bool(build), TRANSFER_CHUNK)


def census(bridge, tasks: Sequence[Task], run_cfg, *, eval_shots: Sequence[int] = (0, 10, 0),
           transfer_n_test: int | None = 50) -> dict:
    """Every stage's forwards for ``tasks`` under ``run_cfg`` (a ``pipeline.RunConfig``).

    Returns ``{"stages": {stage: forwards}, "embedding_by_task": {...}, "training_groups": [...],
    "upper_bound": [stages whose forwards are an upper bound]}``.
    """
    by_task = {t.name: embedding_forwards(bridge, t, run_cfg.embedding) for t in tasks}
    groups = training_census(bridge, tasks, run_cfg.site)
    stages: dict[str, list[Forward]] = {s: [] for s in STAGES}
    stages["task embeddings"] = [f for fs in by_task.values() for f in fs]
    for g in groups:
        for s in ("prefix caches", "training steps", "validation"):
            stages[s] += g[s]
    for t in tasks:
        stages["test evaluation"] += first_token_forwards(bridge, t, run_cfg.eval, eval_shots)
        prompt, gen = exact_match_forwards(bridge, t, run_cfg.eval, eval_shots)
        stages["generation (exact match)"] += prompt + gen
    stages["transfer rows"] = transfer_forwards(bridge, tasks, transfer_n_test)
    return {"stages": stages, "embedding_by_task": by_task, "training_groups": groups,
            "upper_bound": ["generation (exact match)"]}


__all__ = ["STAGES", "census", "embedding_forwards", "exact_match_forwards", "first_token_forwards",
           "prefix_forwards", "score_forwards", "scored_forwards", "training_census", "transfer_forwards"]
