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
    """Task names, in input order."""
    records: pd.DataFrame = field(default_factory=pd.DataFrame)
    """One row per (source, target, query_index): ``correct``. Sources include the references."""
    seconds: float = 0.0
    """Wall time."""

    def to_dataframe(self) -> pd.DataFrame:
        return self.records

    def _accuracy(self) -> pd.DataFrame:
        return 100 * self.records.groupby(["source", "target"], sort=False)["correct"].mean().unstack("target")

    @property
    def matrix(self) -> pd.DataFrame:
        """Accuracy (%): rows = alphas from, columns = evaluated on."""
        return self._accuracy().loc[self.tasks, self.tasks]

    @property
    def references(self) -> pd.DataFrame:
        """0-shot and uniform-0.5 accuracy (%) per target task."""
        return self._accuracy().loc[list(REFERENCES), self.tasks]

    def normalized(self) -> pd.DataFrame:
        """Each column divided by its diagonal entry (the target's own-alphas accuracy)."""
        m = self.matrix
        own = pd.Series([m.loc[t, t] for t in self.tasks], index=self.tasks)
        return m.div(own.where(own > 0), axis=1)

    def diagonal_summary(self) -> dict[str, float]:
        """Mean own-alphas (diagonal) vs other-alphas (off-diagonal) accuracy, and references."""
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
) -> TransferResult:
    """Compute every ``A -> B`` entry (plus references) on the first ``n_test`` test queries."""
    t0 = time.perf_counter()
    names = [task.name for task in tasks]
    missing = [n for n in names if n not in embeddings or n not in alphas]
    if missing:
        raise KeyError(f"no task embedding or alphas for {missing}; train them first (python -m site_interp.run)")
    batches = [
        build_prompts(bridge.tokenizer, (task.test[:n_test] if n_test else task.test), max_length=model_context(bridge),
                      task=task.name)
        for task in tasks
    ]
    scorer = LastTokenScorer(bridge, batches, progress=progress)
    ts = torch.stack([embeddings[n].float().cpu() for n in names])  # [T, L, H, D]
    a = torch.stack([alphas[n].float().cpu() for n in names])  # [T, L, H]
    sources = torch.cat([a, torch.zeros_like(a[:1]), torch.full_like(a[:1], 0.5)])  # + references
    source_names = names + list(REFERENCES)
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
    return TransferResult(tasks=names, records=records, seconds=time.perf_counter() - t0)


__all__ = ["REFERENCES", "TransferResult", "transfer_matrix"]
