"""Cross-task alpha transfer: are the heads that carry task A also the ones task B needs?

Entry ``(A -> B)`` is the first-token accuracy on task B's test queries when B's own task
embedding is injected with task A's alphas. The diagonal is plain SITE. Each column also gets
two references: 0-shot (no injection) and a uniform alpha of 0.5 (SITE's starting point).
All ``T x (T + 2)`` entries are rows of one :class:`~site_interp.scoring.LastTokenScorer` over every
task's test prompts, so the matrix costs a handful of batched last-token forwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from site_interp.loading import model_context
from site_interp.prompts import build_prompts
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

REFERENCES = ("0-shot", "uniform 0.5")


@dataclass
class TransferResult:
    """Per-query outcomes and the matrix view."""

    tasks: list[str]
    """Target task names (the columns), in input order."""
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per (source, target, query_index): ``correct``. Sources include the references."""
    seconds: float = 0.0
    """Wall time."""
    sources: list[str] | None = None
    """Tasks whose alphas were transferred (the rows); None: the same as ``tasks``."""

    @property
    def source_tasks(self) -> list[str]:
        return list(self.tasks if self.sources is None else self.sources)

    def to_dataframe(self) -> pd.DataFrame:
        return self.records

    def _accuracy(self) -> pd.DataFrame:
        return 100 * self.records.groupby(["source", "target"], sort=False)["correct"].mean().unstack("target")

    @property
    def matrix(self) -> pd.DataFrame:
        """Accuracy (%): rows = alphas from, columns = evaluated on."""
        return self._accuracy().loc[self.source_tasks, self.tasks]

    @property
    def references(self) -> pd.DataFrame:
        """0-shot and uniform-0.5 accuracy (%) per target task."""
        return self._accuracy().loc[list(REFERENCES), self.tasks]

    def normalized(self) -> pd.DataFrame:
        """Each column divided by its diagonal entry (the target's own-alphas accuracy)."""
        m = self.matrix
        own = pd.Series([m.loc[t, t] if t in m.index else float("nan") for t in self.tasks], index=self.tasks)
        return m.div(own.where(own > 0), axis=1)

    def diagonal_summary(self) -> dict[str, float]:
        """Mean own-alphas (diagonal) vs other-alphas (off-diagonal) accuracy, and references."""
        if self.source_tasks != self.tasks:
            raise ValueError("diagonal_summary needs the square matrix (sources == tasks)")
        m = self.matrix.to_numpy()
        n = len(self.tasks)
        off = m[~torch.eye(n, dtype=torch.bool).numpy()]
        refs = self.references
        return {
            "diagonal_mean": float(m.diagonal().mean()),
            "off_diagonal_mean": float(off.mean()) if off.size else float("nan"),
            "zero_shot_mean": float(refs.loc["0-shot"].mean()),
            "uniform_0.5_mean": float(refs.loc["uniform 0.5"].mean()),
        }


def transfer_matrix(
    bridge: TransformerBridge,
    tasks: Sequence[Task],
    embeddings: Mapping[str, Float[Tensor, "layer head d_head"]],
    alphas: Mapping[str, Float[Tensor, "layer head"]],
    *,
    n_test: int | None = 50,
    chunk: int = 128,
    progress: bool = True,
    sources: Sequence[str] | None = None,
) -> TransferResult:
    """Compute every ``A -> B`` entry (plus references) on the first ``n_test`` test queries.

    ``tasks`` are the targets B; ``sources`` (default: the targets' names) name the alphas A, so
    a large matrix can be computed a few columns at a time and put together with
    :func:`concat_transfer`.
    """
    t0 = time.perf_counter()
    names = [task.name for task in tasks]
    source_list = list(names if sources is None else sources)
    missing = [n for n in names if n not in embeddings] + [n for n in source_list if n not in alphas]
    if missing:
        raise KeyError(f"no task embedding or alphas for {missing}; train them first (python -m site_interp.run)")
    batches = [
        build_prompts(bridge.tokenizer, (task.test[:n_test] if n_test else task.test), max_length=model_context(bridge),
                      task=task.name)
        for task in tasks
    ]
    scorer = LastTokenScorer(bridge, batches, progress=progress)
    ts = torch.stack([embeddings[n].float().cpu() for n in names])  # [T, L, H, D]
    a = torch.stack([alphas[n].float().cpu() for n in source_list])  # [S, L, H]
    sources = torch.cat([a, torch.zeros_like(a[:1]), torch.full_like(a[:1], 0.5)])  # + references
    source_names = source_list + list(REFERENCES)
    n_src = len(source_names)
    # rows: every query of every target under every source; target-major, so that a batch holds
    # prompts of one task (similar lengths: little padding)
    rows = torch.arange(len(scorer)).repeat_interleave(n_src)
    src = torch.arange(n_src).repeat(len(scorer))
    target = scorer.owner[rows]
    correct = scorer.correct(rows, sources, ts, alpha_index=src, t_index=target, chunk=chunk, progress=progress,
                           desc="transfer")
    starts = torch.stack([r[0] for r in scorer.ranges])
    records = pd.DataFrame({
        "source": [source_names[i] for i in src.tolist()],
        "target": [names[i] for i in target.tolist()],
        "query_index": (rows - starts[target]).tolist(),
        "correct": correct.tolist(),
    })
    return TransferResult(tasks=names, records=records, seconds=time.perf_counter() - t0,
                          sources=None if sources is None else source_list)


def concat_transfer(parts: Sequence[TransferResult]) -> TransferResult:
    """Columns computed separately (same sources, disjoint targets) as one result."""
    if not parts:
        raise ValueError("concat_transfer needs at least one part")
    sources = {tuple(p.source_tasks) for p in parts}
    if len(sources) > 1:
        raise ValueError("the parts were computed with different source tasks")
    tasks = [t for p in parts for t in p.tasks]
    if len(set(tasks)) != len(tasks):
        raise ValueError("the parts share target tasks")
    src = list(sources.pop())
    return TransferResult(tasks=tasks, records=pd.concat([p.records for p in parts], ignore_index=True),
                          seconds=sum(p.seconds for p in parts), sources=None if src == tasks else src)


__all__ = ["REFERENCES", "TransferResult", "concat_transfer", "transfer_matrix"]
