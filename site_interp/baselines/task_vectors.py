"""Task vectors (Hendel et al.): the residual stream of ICL prompts, patched into 0-shot prompts.

1. **Extraction** (:func:`extract_task_vectors`): N-shot prompts whose query is a dummy (a train
   input, answer not given; SITE's embedding prompts, :func:`~site_interp.embeddings.icl_prompt_batch`,
   are exactly these). At the last token, record the residual stream at the input of every block
   (``blocks.L.hook_resid_pre``); average over prompts: one ``[d_model]`` vector per layer.
2. **Patching**: at the last token of the 0-shot prompt, the residual stream at the input of block
   L is *replaced* by layer L's vector (earlier layers' work at that position is overwritten;
   blocks L.. then read the ICL state). L is picked on the valid split.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.baselines import (
    HookMethod,
    evaluate_hooks,
    make_resid_capture_hook,
    resid_hooks,
    resid_name,
    scan_layers,
)
from site_interp.embeddings import icl_prompt_batch
from site_interp.evaluation import EvalConfig, TaskEvaluation
from site_interp.forward import model_device
from site_interp.hooks import Hooks
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, left_pad, model_context, pad_id
from site_interp.selection import zero_shot_batch
from site_interp.tasks import Task


@dataclass(frozen=True)
class TaskVectorConfig:
    """How task vectors are extracted and their layer chosen."""

    n_prompts: int = 50
    """ICL prompts with a dummy query averaged per vector (SITE's M)."""
    n_shots: int = 10
    """Demonstrations per prompt (from train, never the dummy query itself)."""
    layers: tuple[int, ...] | None = None
    """Candidate patching layers (input of block L); None: every layer."""
    n_valid: int | None = 100
    """Valid queries for the layer choice (the first ones); None: all."""
    extract_batch_size: int = 8
    """ICL prompts per forward during extraction."""
    batch_size: int = 64
    """Rows per forward when scoring the layers."""
    seed: int = 0
    """Seeds the dummy queries and demonstrations (same prompts as SITE's embedding with this seed)."""
    fast: bool = True
    """Reuse 0-shot prompt prefixes in the layer scan (last token only per row)."""

    def to_dict(self) -> dict:
        return asdict(self)


@torch.no_grad()
def extract_task_vectors(
    bridge,
    task: Task,
    config: TaskVectorConfig = TaskVectorConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> Float[Tensor, "layer d_model"]:
    """Mean residual stream (input of each block) at the last token of dummy-query ICL prompts."""
    batch = icl_prompt_batch(
        bridge.tokenizer, task, config.n_prompts, config.n_shots, config.seed,
        max_length=model_context(bridge), template=template,
    )
    n_layers = bridge.cfg.n_layers
    device = model_device(bridge)
    total = torch.zeros(n_layers, bridge.cfg.d_model)
    starts = range(0, len(batch), config.extract_batch_size)
    for start in tqdm(starts, desc=f"task vector {task.name}", disable=not progress, leave=False):
        ids, mask = left_pad(batch.token_ids[start : start + config.extract_batch_size], pad_id(bridge.tokenizer), device)
        store: dict[int, Tensor] = {}
        hooks = [(resid_name(layer), make_resid_capture_hook(store, layer)) for layer in range(n_layers)]
        bridge.run_with_hooks(ids, fwd_hooks=hooks, attention_mask=mask, logits_to_keep=1)
        total += torch.stack([store[layer].to("cpu", torch.float32).sum(0) for layer in range(n_layers)])
    return total / len(batch)


def task_vector_hooks(vector: Float[Tensor, " d_model"], layer: int, positions: int | Tensor = -1) -> Hooks:
    """Replace the residual stream at the input of block ``layer`` by ``vector``, at ``positions``."""
    return resid_hooks(vector, layer, "replace", positions)


@dataclass
class TaskVectorResult:
    """A task's task vectors (every layer) and the chosen layer."""

    task: str
    """Task name."""
    vectors: Float[Tensor, "layer d_model"]
    """Mean residual stream at the input of every block (float32, CPU)."""
    layer: int
    """Chosen patching layer (input of this block)."""
    layers: list[int]
    """Candidate layers scanned on the valid split."""
    valid_accuracy: Float[Tensor, " candidate"]
    """Valid first-token accuracy (fraction) per candidate layer."""
    valid_target_prob: Float[Tensor, " candidate"]
    """Mean valid probability of the first answer token per candidate (breaks accuracy ties)."""
    config: TaskVectorConfig = field(default_factory=TaskVectorConfig)
    """The settings used."""
    seconds: float = 0.0
    """Wall time (extraction and layer scan)."""

    @property
    def vector(self) -> Float[Tensor, " d_model"]:
        """The task vector of the chosen layer."""
        return self.vectors[self.layer]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate layer: valid accuracy, target probability, vector norm, chosen."""
        return pd.DataFrame({
            "task": self.task, "layer": self.layers, "valid_accuracy": self.valid_accuracy.tolist(),
            "valid_target_prob": self.valid_target_prob.tolist(),
            "vector_norm": [float(self.vectors[x].norm()) for x in self.layers],
            "chosen": [x == self.layer for x in self.layers],
        })


def fit_task_vector(
    bridge,
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
    layers = list(config.layers) if config.layers is not None else list(range(n_layers))
    valid = zero_shot_batch(bridge, task, "valid", config.n_valid, template=template)
    scan = scan_layers(bridge, valid, vectors[layers], layers, "replace",
                       batch_size=config.batch_size, fast=config.fast, progress=progress)
    return TaskVectorResult(
        task=task.name, vectors=vectors.float().cpu(), layer=scan.best, layers=layers,
        valid_accuracy=scan.accuracy, valid_target_prob=scan.target_prob, config=config,
        seconds=time.perf_counter() - t0,
    )


def task_vector_method(result: TaskVectorResult, name: str = "TV") -> HookMethod:
    """0-shot + the task vector patched at its chosen layer, for :func:`~site_interp.evaluation.evaluate`."""
    return HookMethod(name, fwd_hooks=tuple(task_vector_hooks(result.vector, result.layer)))


def evaluate_task_vector(
    bridge,
    task: Task,
    result: TaskVectorResult,
    config: EvalConfig = EvalConfig(),
    *,
    name: str = "TV",
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> TaskEvaluation:
    """Test-split evaluation of 0-shot + TV (records per query; ``.accuracy(name)``)."""
    hooks = task_vector_hooks(result.vector, result.layer)
    return evaluate_hooks(bridge, task, name, hooks, config, template=template, progress=progress)


__all__ = [
    "TaskVectorConfig",
    "TaskVectorResult",
    "evaluate_task_vector",
    "extract_task_vectors",
    "fit_task_vector",
    "task_vector_hooks",
    "task_vector_method",
]
