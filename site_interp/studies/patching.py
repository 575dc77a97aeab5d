"""Intra-task patching: which heads carry the task?

Heads are ranked by their trained alpha. At the last token of 0-shot test prompts the task
embedding is hard-patched (alpha = 1) into

* the top-k heads, the bottom-k heads, and k random heads (several seeds) — mode ``patch``;
* or, in mode ``ablate``, full SITE runs with the top-k heads' alphas set to 0.

Every configuration of every query is one row of a :class:`~site_interp.scoring.LastTokenScorer`,
so a whole sweep is a few batched last-token forwards. Accuracies come with 95% bootstrap intervals
over queries; random-k also reports the spread over seeds.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from tqdm.auto import tqdm

from site_interp.checks import check_choice, check_int, check_subset
from site_interp.evaluation import Metric, exact_match, exact_match_decided
from site_interp.generation import greedy_generate
from site_interp.hooks import injection_hooks
from site_interp.loading import model_context
from site_interp.prompts import build_prompts
from site_interp.scoring import LastTokenScorer
from site_interp.stats import bootstrap_ci
from site_interp.studies.similarity import bottom_k_mask, random_k_mask, top_k_mask
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

Selection = Literal["top", "bottom", "random"]
"""Which heads: the k with the highest alpha, the k with the lowest, or k drawn at random."""
Mode = Literal["patch", "ablate"]
"""``patch``: the task embedding hard-patched into k heads; ``ablate``: SITE with k heads' alphas zeroed."""
SELECTIONS: tuple[Selection, ...] = ("top", "bottom", "random")
MODES: tuple[Mode, ...] = ("patch", "ablate")


@dataclass(frozen=True)
class PatchConfig:
    """A patching sweep."""

    ks: tuple[int, ...] | None = None
    """Numbers of heads; default 1, 2, 4, ... up to all heads, plus the number with alpha > 0.5."""
    modes: tuple[Mode, ...] = MODES
    """``patch`` (hard-patch t into k heads) and/or ``ablate`` (SITE with top-k alphas zeroed)."""
    n_random: int = 5
    """Seeds of random-k head sets."""
    n_test: int | None = 50
    """Test queries (the first ones of the split); None = all."""
    metric: Metric = "first_token"
    """``first_token`` or ``exact_match`` (greedy generation; slower)."""
    max_new_tokens: int = 20
    """Generation budget for exact match."""
    seed: int = 0
    """Seed of the random head sets and the bootstrap."""
    chunk: int = 128
    """Rows (configuration x query) per forward pass."""

    def __post_init__(self) -> None:
        for k in self.ks or ():
            check_int(k, "ks", minimum=0, option="--ks")
        check_subset(self.modes, "modes", MODES, option="--modes")
        check_int(self.n_random, "n_random", minimum=1, option="--n-random")
        check_int(self.n_test, "n_test", minimum=1, none_ok=True, option="--n-test")
        check_choice(self.metric, "metric", ("first_token", "exact_match"), option="--metric")
        check_int(self.max_new_tokens, "max_new_tokens", minimum=1, option="--max-new-tokens")
        check_int(self.seed, "seed", minimum=0, option="--seed")
        check_int(self.chunk, "chunk", minimum=1)

    def to_dict(self) -> dict:
        return asdict(self)


def default_ks(n_heads_total: int, n_selected: int | None = None) -> list[int]:
    """1, 2, 4, ... up to ``n_heads_total`` (always included), plus ``n_selected`` if given."""
    ks = {n_heads_total}
    k = 1
    while k < n_heads_total:
        ks.add(k)
        k *= 2
    if n_selected:
        ks.add(int(n_selected))
    return sorted(ks)


def head_mask(alpha: Float[Tensor, "layer head"], selection: Selection, k: int, seed: int = 0) -> Tensor:
    """Boolean ``[layer, head]`` mask of the top-k, bottom-k or k random heads (see :mod:`site_interp.studies.similarity`)."""
    if selection == "top":
        mask = top_k_mask(alpha, k)
    elif selection == "bottom":
        mask = bottom_k_mask(alpha, k)
    elif selection == "random":
        mask = random_k_mask(tuple(alpha.shape), k, seed)
    else:
        raise ValueError(f"unknown selection {selection!r}; use one of {SELECTIONS}")
    return torch.as_tensor(mask)


@dataclass
class PatchingResult:
    """Per-query outcomes of a patching sweep on one task."""

    task: str
    """Task name."""
    records: list[dict] = field(default_factory=list)
    """One row per (mode, selection, k, seed, query): ``correct`` and the configuration."""
    references: dict[str, float] = field(default_factory=dict)
    """Reference accuracies in percent (``0-shot``, ``SITE``, and ``N-shot ICL`` when known)."""
    n_selected: int = 0
    """Heads with alpha > 0.5."""
    seconds: float = 0.0
    """Wall time."""

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.records)

    def summary(self, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
        """Accuracy (%) per (selection, k) with a 95% bootstrap interval over queries.

        For random-k the per-query correctness is first averaged over seeds; ``seed_sd``,
        ``seed_min`` and ``seed_max`` give the spread of the per-seed accuracies.
        """
        df = self.to_dataframe()
        rows = []
        for (mode, selection, k), g in df.groupby(["mode", "selection", "k"], sort=False):
            per_query = g.groupby("query_index")["correct"].mean().to_numpy(dtype=float)
            lo, hi = bootstrap_ci(per_query, n_boot=n_boot, seed=seed)
            per_seed = g.groupby("seed")["correct"].mean().to_numpy(dtype=float) * 100
            name = selection if mode == "patch" else f"ablate_{selection}"
            rows.append({
                "task": self.task, "selection": name, "k": int(k), "accuracy": 100 * per_query.mean(),
                "lo": 100 * lo, "hi": 100 * hi, "n_queries": len(per_query), "n_seeds": len(per_seed),
                "seed_sd": float(per_seed.std()) if len(per_seed) > 1 else 0.0,
                "seed_min": float(per_seed.min()), "seed_max": float(per_seed.max()),
            })
        return pd.DataFrame(rows)

    def references_frame(self) -> pd.DataFrame:
        return pd.DataFrame([{"task": self.task, "method": m, "accuracy": a} for m, a in self.references.items()])


def _configurations(alpha: Tensor, cfg: PatchConfig, ks: Sequence[int]) -> list[tuple[str, str, int, int, Tensor]]:
    """(mode, selection, k, seed, alpha used) for the whole sweep."""
    configs = []
    if "patch" in cfg.modes:
        for k in ks:
            configs.append(("patch", "top", k, 0, head_mask(alpha, "top", k).float()))
            configs.append(("patch", "bottom", k, 0, head_mask(alpha, "bottom", k).float()))
            for s in range(cfg.n_random):
                configs.append(("patch", "random", k, s, head_mask(alpha, "random", k, cfg.seed * 1000 + s).float()))
    if "ablate" in cfg.modes:
        for k in ks:
            configs.append(("ablate", "top", k, 0, alpha * (~head_mask(alpha, "top", k)).float()))
    unknown = set(cfg.modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown mode(s) {sorted(unknown)}; use {MODES}")
    return configs


def patching_sweep(
    bridge: TransformerBridge,
    task: Task,
    t: Float[Tensor, "layer head d_head"],
    alpha: Float[Tensor, "layer head"],
    config: PatchConfig = PatchConfig(),
    *,
    references: dict[str, float] | None = None,
    progress: bool = True,
) -> PatchingResult:
    """Run the sweep of ``config`` on ``task``'s test queries (see the module docstring)."""
    t0 = time.perf_counter()
    alpha = alpha.detach().float().cpu()
    t = t.detach().float().cpu()
    n_sel = int((alpha > 0.5).sum())
    ks = list(config.ks) if config.ks else default_ks(alpha.numel(), n_sel)
    configs = _configurations(alpha, config, ks)
    # references: 0-shot and full SITE, on the same rows
    configs += [("reference", "0-shot", 0, 0, torch.zeros_like(alpha)), ("reference", "SITE", 0, 0, alpha)]
    queries = task.test[: config.n_test] if config.n_test else task.test
    batch = build_prompts(bridge.tokenizer, queries, max_length=model_context(bridge), task=task.name)
    n_q = len(batch)
    alphas = torch.stack([c[4] for c in configs])  # [C, L, H]
    config_of_row = torch.arange(len(configs)).repeat_interleave(n_q)
    query_of_row = torch.arange(n_q).repeat(len(configs))
    if config.metric == "first_token":
        scorer = LastTokenScorer(bridge, [batch])
        correct = scorer.correct(query_of_row, alphas, t[None], alpha_index=config_of_row,
                                 t_index=torch.zeros_like(config_of_row), chunk=config.chunk, progress=progress,
                                 desc=f"patching {task.name}").tolist()
    elif config.metric == "exact_match":
        correct = _exact_match_rows(bridge, batch, task, alphas, t, config_of_row, query_of_row, config, progress)
    else:
        raise ValueError(f"unknown metric {config.metric!r}; use 'first_token' or 'exact_match'")
    result = PatchingResult(task=task.name, n_selected=n_sel)
    ref_hits: dict[str, list[bool]] = {}
    for r, ok in enumerate(correct):
        mode, selection, k, seed, _ = configs[int(config_of_row[r])]
        if mode == "reference":
            ref_hits.setdefault(selection, []).append(bool(ok))
            continue
        result.records.append({"task": task.name, "mode": mode, "selection": selection, "k": k, "seed": seed,
                               "query_index": int(query_of_row[r]), "correct": bool(ok)})
    result.references = {m: 100 * float(np.mean(v)) for m, v in ref_hits.items()}
    result.references.update(references or {})
    result.seconds = time.perf_counter() - t0
    return result


@torch.no_grad()
def _exact_match_rows(bridge: TransformerBridge, batch, task: Task, alphas, t, config_of_row, query_of_row,
                      cfg: PatchConfig, progress: bool) -> list[bool]:
    out: list[bool] = []
    for start in tqdm(range(0, len(config_of_row), cfg.chunk), desc=f"patching {task.name}", disable=not progress, leave=False):
        sl = slice(start, start + cfg.chunk)
        q = query_of_row[sl].tolist()
        hooks = injection_hooks(alphas[config_of_row[sl]], t.expand(len(q), *t.shape))
        gens = greedy_generate(bridge, [batch.token_ids[i] for i in q], hooks, max_new_tokens=cfg.max_new_tokens,
                               stop=lambda row, text: exact_match_decided(text, batch.targets[q[row]]))
        out.extend(exact_match(bridge.tokenizer.decode(g, skip_special_tokens=True), batch.targets[i], task.case_sensitive)
                   for g, i in zip(gens, q))
    return out


__all__ = ["MODES", "SELECTIONS", "Mode", "PatchConfig", "PatchingResult", "Selection", "default_ks", "head_mask",
           "patching_sweep"]
