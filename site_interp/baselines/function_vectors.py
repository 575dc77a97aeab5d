"""Function vectors (Todd et al.): a few causally important heads' mean outputs, summed and added.

1. **Mean head outputs** ``t[layer, head, d_head]``: SITE's task embedding
   (:func:`~site_interp.embeddings.compute_task_embedding`, the same N-shot prompts).
2. **Average indirect effect** (:func:`average_indirect_effect`): on N-shot prompts whose demo
   labels are permuted among the demos (a derangement: no demo keeps its own label; the query's
   target stays its true answer), patch one head's ``z`` at the last token with ``t[l, h]`` and
   measure ``P(answer's first token)`` patched minus unpatched; average over prompts. Every
   (head, prompt) pair is one row of a batch, with a one-hot per-row alpha
   (:func:`~site_interp.hooks.injection_hooks`), scored by a
   :class:`~site_interp.scoring.LastTokenScorer` (only the last token runs: prefix cache).
3. **The vector**: ``sum over the top-n heads of t[l, h] @ W_O[l, h]`` (``W_O[l, h]``: the
   ``[d_head, d_model]`` slice of the attention output projection; output biases are not part of
   one head's contribution): what those heads add to the residual stream. Where the attention
   output passes through a post-attention norm first (Gemma 2/3), each layer's part goes through
   that norm linearised at the layer's mean output (:func:`function_vector_from_heads`); the raw
   projection would be off in scale by the norm's gain over the output's RMS (docs/results.md
   has how function vectors fare on the embedded models).
4. **Injection**: ``x <- x + fv`` at the last prompt token, at the input of block L
   (``blocks.L.hook_resid_pre``, = output of block L-1). L is picked on the valid split.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from site_interp.baselines.steering import Mode, SteeringConfig, SteeringResult, resid_hooks, scan_layers
from site_interp.checks import check_int
from site_interp.embeddings import TaskEmbedding, compute_task_embedding
from site_interp.errors import ConfigError
from site_interp.hooks import Hooks, injection_hooks
from site_interp.loading import model_context
from site_interp.prompts import DEFAULT_TEMPLATE, PromptBatch, PromptTemplate, build_prompts, zero_shot_batch
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Example, Task, TaskError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class FunctionVectorConfig(SteeringConfig):
    """How a function vector is built and its layer chosen (the shared fields: the ICL prompts of
    the mean head outputs and the layer scan, see :class:`~site_interp.baselines.steering.SteeringConfig`)."""

    n_aie_prompts: int = 25
    """Shuffled-label prompts the indirect effect is averaged over (per task); they use ``n_shots``."""
    n_heads: int | None = None
    """Heads summed into the vector; None: :func:`default_n_heads`."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.n_shots, "n_shots", minimum=2, option="--n-shots (shuffled demo labels need two)")
        check_int(self.n_aie_prompts, "n_aie_prompts", minimum=1, option="--fv-aie-prompts")
        check_int(self.n_heads, "n_heads", minimum=1, none_ok=True, option="--fv-heads")


def default_n_heads(n_layers: int, n_heads: int) -> int:
    """``max(4, round(0.02 * total heads))``, at most all heads.

    The paper used 10 heads on 6-7B models; 2% gives 9 on GPT-J's 448 heads, 20 on a
    1024-head 7B Llama, 4 on gemma-3-270m's 72 (the minimum).
    """
    total = n_layers * n_heads
    return min(total, max(4, round(0.02 * total)))


def _derangement(n: int, rng: random.Random) -> list[int]:
    """A random cyclic permutation (Sattolo): ``perm[i] != i`` for every i when n >= 2."""
    perm = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def shuffled_label_prompts(
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    n_prompts: int,
    n_shots: int,
    seed: int,
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    max_length: int | None = None,
) -> PromptBatch:
    """N-shot prompts (queries and demos from train) with the demos' outputs deranged.

    The target of each prompt is its query's true answer (first token, in context).
    """
    if n_shots < 2:
        raise ConfigError(f"{task.name}: shuffling demo labels needs at least 2 shots, got {n_shots}")
    if not task.train:
        raise TaskError(f"{task.name}: the train split is empty")
    rng = random.Random(seed)
    n_train = len(task.train)
    order = rng.sample(range(n_train), n_prompts) if n_prompts <= n_train else rng.choices(range(n_train), k=n_prompts)

    def derange(demos: list[Example], r: random.Random) -> list[Example]:
        perm = _derangement(len(demos), r)
        return [{"input": d["input"], "output": demos[perm[i]]["output"]} for i, d in enumerate(demos)]

    return build_prompts(
        tokenizer, [task.train[i] for i in order], n_shots=n_shots, demo_pool=task.train, seed=seed + 1,
        template=template, max_length=max_length, task=task.name, relabel=derange,
    )


def _check_t(bridge: TransformerBridge, t: Tensor, what: str) -> None:
    shape = (bridge.cfg.n_layers, bridge.cfg.n_heads, bridge.cfg.d_head)
    if tuple(t.shape[-3:]) != shape or t.dim() not in (3, 4):
        raise ValueError(f"{what} has shape {tuple(t.shape)}; this model needs [..., {shape[0]}, {shape[1]}, {shape[2]}]")


@torch.no_grad()
def average_indirect_effect(
    bridge: TransformerBridge,
    task: Task,
    t: Float[Tensor, "layer head d_head"] | Float[Tensor, "prompt layer head d_head"],
    config: FunctionVectorConfig = FunctionVectorConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    prompts: PromptBatch | None = None,
    progress: bool = False,
) -> Float[Tensor, "layer head"]:
    """AIE of every head on ``task``: mean over shuffled-label prompts of
    ``P(target | z[l, h] <- t[l, h] at the last token) - P(target | unpatched)``.

    ``t`` is the head outputs patched in (the mean outputs), or one per prompt. ``prompts``
    overrides :func:`shuffled_label_prompts` (``config.n_aie_prompts``, ``n_shots``, ``seed``).
    """
    _check_t(bridge, t, "the patch value t")
    if prompts is None:
        prompts = shuffled_label_prompts(
            bridge.tokenizer, task, config.n_aie_prompts, config.n_shots, config.seed,
            template=template, max_length=model_context(bridge),
        )
    n_prompts, n_layers, n_heads = len(prompts), bridge.cfg.n_layers, bridge.cfg.n_heads
    if t.dim() == 4 and t.shape[0] != n_prompts:
        raise ValueError(f"per-prompt t has {t.shape[0]} prompts, the prompts are {n_prompts}")
    total = n_layers * n_heads
    scorer = LastTokenScorer(bridge, [prompts], fast=config.fast)
    base = scorer.score(chunk=config.batch_size).prob
    # head-major rows: a chunk spans few heads (hence few layers to hook)
    rows = torch.arange(n_prompts).repeat(total)
    head_of = torch.arange(total).repeat_interleave(n_prompts)

    def hooks_for(idx: Tensor) -> Hooks:
        heads = head_of[idx]
        alpha = torch.zeros(len(idx), total)
        alpha[torch.arange(len(idx)), heads] = 1.0
        tt = t[rows[idx]] if t.dim() == 4 else t
        layers = sorted(set((heads // n_heads).tolist()))
        return injection_hooks(alpha.view(len(idx), n_layers, n_heads), tt, layers=layers)

    patched = scorer.score(rows, hooks_for=hooks_for, chunk=config.batch_size, progress=progress,
                           desc=f"AIE {task.name}").prob
    return (patched - base[rows]).view(total, n_prompts).mean(1).view(n_layers, n_heads)


def top_heads(aie: Float[Tensor, "layer head"], n: int) -> list[tuple[int, int]]:
    """The ``n`` heads with the largest AIE, largest first (ties: lower layer, then head, first)."""
    order = torch.sort(aie.flatten(), descending=True, stable=True).indices[:n]
    return [divmod(int(i), aie.shape[1]) for i in order]


def head_output_matrix(bridge: TransformerBridge, layer: int) -> Float[Tensor, "head d_head d_model"]:
    """``W_O`` of one layer split per head (float32, CPU): head h's output is ``z[h] @ W_O[h]``."""
    attn = bridge.blocks[layer].attn
    cfg = bridge.cfg
    try:
        w = attn.W_O
    except (AttributeError, RuntimeError, TypeError):  # no stacked view: o's weight is [d_model, head * d_head]
        w = attn.o._original_component.weight.T
    w = w.detach().to("cpu", torch.float32)
    expected = cfg.n_heads * cfg.d_head * cfg.d_model
    if w.numel() != expected:
        raise ValueError(f"layer {layer}: the attention output weight has {w.numel()} entries, expected {expected}")
    return w.reshape(cfg.n_heads, cfg.d_head, cfg.d_model)


def post_attention_norm(bridge: TransformerBridge, layer: int):
    """Block ``layer``'s norm between the attention output and the residual stream, or None.

    Read from the bridge's block structure (Gemma 2/3 have ``ln1_post``; Llama, Mistral and
    Qwen add the attention output to the residual stream directly), never from the model name.
    """
    return getattr(bridge.blocks[layer], "ln1_post", None)


def _rms(x: Tensor) -> Tensor:
    return x.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-12)


@torch.no_grad()
def function_vector_from_heads(
    bridge: TransformerBridge, t: Float[Tensor, "layer head d_head"], heads: Sequence[tuple[int, int]]
) -> Float[Tensor, " d_model"]:
    """What the ``heads`` add to the residual stream with their mean outputs ``t`` (float32, CPU).

    Per layer, ``v = sum over its selected heads of t[l, h] @ W_O[l, h]``. Without a
    post-attention norm that is the residual contribution and the vector is ``sum_l v``. With one
    (Gemma: ``resid += norm(attn_out)``, an RMSNorm, not additive over heads) each layer's ``v``
    goes through the norm linearised at the layer's mean attention output ``m = sum over all
    heads of t[l, h] @ W_O[l, h]``: ``norm(v) * rms(v) / rms(m)`` = ``g * v / rms(m)`` (the
    diagonal part of the norm's Jacobian at ``m``), so the selected heads' share is scaled as the
    model scales it. When every head of a layer is selected this is exactly ``norm(m)``.
    """
    _check_t(bridge, t, "the mean head outputs t")
    fv = torch.zeros(bridge.cfg.d_model)
    for layer in sorted({layer for layer, _ in heads}):
        w_o = head_output_matrix(bridge, layer)
        selected = sorted({h for l_, h in heads if l_ == layer})
        v = torch.einsum("hd,hdm->m", t[layer, selected].float().cpu(), w_o[selected])
        norm = post_attention_norm(bridge, layer)
        if norm is not None:
            m = torch.einsum("hd,hdm->m", t[layer].float().cpu(), w_o)
            param = next(norm.parameters())
            normed = norm(v.to(param.device, param.dtype)[None, None]).float().cpu()[0, 0]
            v = normed * _rms(v) / _rms(m)
        fv = fv + v
    return fv


def function_vector_hooks(vector: Float[Tensor, " d_model"], layer: int, positions: int | Tensor = -1) -> Hooks:
    """Add ``vector`` to the residual stream at the input of block ``layer``, at ``positions``."""
    return resid_hooks(vector, layer, "add", positions)


@dataclass(kw_only=True)
class FunctionVectorResult(SteeringResult):
    """A task's function vector (``vector``, added at ``layer``) and how it was made."""

    aie: Float[Tensor, "layer head"]
    """Average indirect effect of each head (probability increase of the first answer token)."""
    aie_tasks: list[str]
    """The tasks ``aie`` is averaged over (``[task]`` unless a shared ranking was used;
    ``["<given>"]`` when the caller passed ``aie``)."""
    top_heads: list[tuple[int, int]]
    """(layer, head) of the heads summed, highest AIE first."""
    mode: Mode = "add"
    """Function vectors are added to the residual stream."""
    config: FunctionVectorConfig = field(default_factory=FunctionVectorConfig)
    """The settings used."""

    def heads_dataframe(self) -> pd.DataFrame:
        """One row per head: layer, head, AIE, rank (1 = highest), selected."""
        n_layers, n_heads = self.aie.shape
        order = torch.sort(self.aie.flatten(), descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank[order] = torch.arange(1, len(order) + 1)
        chosen = set(self.top_heads)
        return pd.DataFrame([
            {"task": self.task, "layer": layer, "head": head, "aie": float(self.aie[layer, head]),
             "rank": int(rank[layer * n_heads + head]), "selected": (layer, head) in chosen}
            for layer in range(n_layers) for head in range(n_heads)
        ])


def fit_function_vector(
    bridge: TransformerBridge,
    task: Task,
    config: FunctionVectorConfig = FunctionVectorConfig(),
    *,
    embedding: TaskEmbedding | Float[Tensor, "layer head d_head"] | None = None,
    aie: Float[Tensor, "layer head"] | None = None,
    aie_tasks: Sequence[Task] | None = None,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> FunctionVectorResult:
    """Build ``task``'s function vector and choose its layer on the valid split.

    Head ranking: ``aie`` if given (e.g. computed once and shared); else the mean over
    ``aie_tasks`` of each task's AIE with its own mean outputs (the paper ranks heads once over
    many tasks); else ``task``'s own AIE. The vector always uses ``task``'s mean outputs
    (``embedding``, e.g. SITE's, or computed with ``config.embedding_config()``).
    """
    t0 = time.perf_counter()
    if embedding is None:
        embedding = compute_task_embedding(bridge, task, config.embedding_config(), template=template, progress=progress)
    t = embedding.t if isinstance(embedding, TaskEmbedding) else embedding
    _check_t(bridge, t, "the mean head outputs t")
    n_layers, n_heads = bridge.cfg.n_layers, bridge.cfg.n_heads
    if aie is not None:
        if tuple(aie.shape) != (n_layers, n_heads):
            raise ValueError(f"aie has shape {tuple(aie.shape)}; this model needs [{n_layers}, {n_heads}]")
        names = ["<given>"]
    else:
        others = list(aie_tasks) if aie_tasks else [task]
        effects = []
        for other in others:
            t_other = t if other is task else compute_task_embedding(
                bridge, other, config.embedding_config(), template=template, progress=progress).t
            effects.append(average_indirect_effect(bridge, other, t_other, config, template=template, progress=progress))
        aie, names = torch.stack(effects).mean(0), [o.name for o in others]
    n = config.n_heads if config.n_heads is not None else default_n_heads(n_layers, n_heads)
    if not 1 <= n <= n_layers * n_heads:
        raise ConfigError(f"n_heads (--fv-heads) must be between 1 and {n_layers * n_heads}, got {n}")
    heads = top_heads(aie, n)
    vector = function_vector_from_heads(bridge, t, heads)
    layers = config.candidate_layers(n_layers)
    valid = zero_shot_batch(bridge, task, "valid", config.n_valid, template=template)
    scan = scan_layers(bridge, valid, vector.expand(len(layers), -1), layers, "add",
                       batch_size=config.batch_size, fast=config.fast, progress=progress)
    return FunctionVectorResult(
        task=task.name, aie=aie.float().cpu(), aie_tasks=names, top_heads=heads, vector=vector, layer=scan.best,
        layers=layers, valid_accuracy=scan.accuracy, valid_target_prob=scan.target_prob, config=config,
        seconds=time.perf_counter() - t0,
    )


__all__ = [
    "FunctionVectorConfig",
    "FunctionVectorResult",
    "average_indirect_effect",
    "default_n_heads",
    "fit_function_vector",
    "function_vector_from_heads",
    "function_vector_hooks",
    "head_output_matrix",
    "post_attention_norm",
    "shuffled_label_prompts",
    "top_heads",
]
