"""Task vectors (Hendel et al.): the residual stream of ICL prompts, patched into 0-shot prompts.

1. **Extraction** (:func:`extract_task_vectors`): N-shot prompts whose query is a dummy (a train
   input, answer not given; SITE's embedding prompts, :func:`~site_interp.prompts.icl_prompt_batch`,
   are exactly these). At the last token, the residual stream at the input of every block
   (``blocks.L.hook_resid_pre``), averaged over prompts: one ``[d_model]`` vector per layer. SITE's
   embedding pass records exactly this (:attr:`~site_interp.embeddings.TaskEmbedding.resid`), so
   the vectors come from :func:`~site_interp.embeddings.compute_task_embedding`, or from a
   finished run's embedding at no cost.
2. **Patching**: at the last token of the 0-shot prompt, the residual stream at the input of block
   L is *replaced* by layer L's vector (earlier layers' work at that position is overwritten;
   blocks L.. then read the ICL state). L is picked on the valid split.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from site_interp.baselines.steering import Mode, SteeringConfig, SteeringResult, resid_hooks, scan_layers
from site_interp.embeddings import EmbeddingConfig, compute_task_embedding
from site_interp.hooks import Hooks
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, zero_shot_batch
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class TaskVectorConfig(SteeringConfig):
    """How task vectors are extracted (N-shot prompts with a dummy query, the same as SITE's
    embedding prompts with this seed) and their layer chosen (the shared fields:
    :class:`~site_interp.baselines.steering.SteeringConfig`)."""

    extract_batch_size: int = 8
    """ICL prompts per forward during extraction."""

    def embedding_config(self) -> EmbeddingConfig:
        return replace(super().embedding_config(), batch_size=self.extract_batch_size)


def extract_task_vectors(
    bridge: TransformerBridge,
    task: Task,
    config: TaskVectorConfig = TaskVectorConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> Float[Tensor, "layer d_model"]:
    """Mean residual stream (input of each block) at the last token of dummy-query ICL prompts:
    the ``resid`` of SITE's embedding pass with these settings."""
    emb = compute_task_embedding(bridge, task, config.embedding_config(), template=template, progress=progress)
    assert emb.resid is not None
    return emb.resid


def task_vector_hooks(vector: Float[Tensor, " d_model"], layer: int, positions: int | Tensor = -1) -> Hooks:
    """Replace the residual stream at the input of block ``layer`` by ``vector``, at ``positions``."""
    return resid_hooks(vector, layer, "replace", positions)


@dataclass(kw_only=True)
class TaskVectorResult(SteeringResult):
    """A task's task vectors (every layer) and the chosen one (``vector`` at ``layer``)."""

    vectors: Float[Tensor, "layer d_model"]
    """Mean residual stream at the input of every block (float32, CPU)."""
    mode: Mode = "replace"
    """Task vectors replace the residual stream."""
    config: TaskVectorConfig = field(default_factory=TaskVectorConfig)
    """The settings used."""

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate layer: valid accuracy, target probability, vector norm, chosen."""
        df = super().to_dataframe()
        df.insert(len(df.columns) - 1, "vector_norm", [float(self.vectors[x].norm()) for x in self.layers])
        return df


def fit_task_vector(
    bridge: TransformerBridge,
    task: Task,
    config: TaskVectorConfig = TaskVectorConfig(),
    *,
    vectors: Float[Tensor, "layer d_model"] | None = None,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> TaskVectorResult:
    """Extract ``task``'s task vectors (unless ``vectors`` is given) and choose the layer on valid."""
    t0 = time.perf_counter()
    n_layers, d_model = bridge.cfg.n_layers, bridge.cfg.d_model
    if vectors is None:
        vectors = extract_task_vectors(bridge, task, config, template=template, progress=progress)
    elif tuple(vectors.shape) != (n_layers, d_model):
        raise ValueError(f"vectors have shape {tuple(vectors.shape)}; this model needs [{n_layers}, {d_model}]")
    layers = config.candidate_layers(n_layers)
    valid = zero_shot_batch(bridge, task, "valid", config.n_valid, template=template)
    scan = scan_layers(bridge, valid, vectors[layers], layers, "replace",
                       batch_size=config.batch_size, fast=config.fast, progress=progress)
    vectors = vectors.float().cpu()
    return TaskVectorResult(
        task=task.name, vectors=vectors, vector=vectors[scan.best], layer=scan.best, layers=layers,
        valid_accuracy=scan.accuracy, valid_target_prob=scan.target_prob, config=config,
        seconds=time.perf_counter() - t0,
    )


__all__ = [
    "TaskVectorConfig",
    "TaskVectorResult",
    "extract_task_vectors",
    "fit_task_vector",
    "task_vector_hooks",
]
