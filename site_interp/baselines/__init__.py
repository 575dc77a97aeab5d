"""Baselines that steer a 0-shot prompt with one residual-stream vector at the last prompt token.

* :mod:`~site_interp.baselines.function_vectors` (Todd et al.): the summed mean outputs of the
  heads with the largest average indirect effect, *added* to the residual stream at one layer.
* :mod:`~site_interp.baselines.task_vectors` (Hendel et al.): the mean residual stream of N-shot
  prompts with a dummy query, *replacing* the residual stream at one layer.

Both use SITE's tasks, prompts (:class:`~site_interp.prompts.PromptTemplate`), left padding and
first-token metric, so their numbers sit beside SITE's. This module holds what they share:

* **Residual hooks** on ``get_act_name("resid_pre", L)`` = ``blocks.L.hook_resid_pre`` (the
  TransformerBridge resolves it to ``blocks.L.hook_in``): the *input of block L*, i.e. the output of
  block L-1 (L = 0: the token embeddings, after Gemma's embedding scaling). Pure factories, out of
  place, editing only the given positions (default the last token: -1 under left padding).
* :func:`score_rows`: first-token prediction and target probability of prompts under per-chunk
  hooks, in batches, with a prefix cache (all interventions sit at the last token, so earlier
  tokens' keys and values are computed once).
* :func:`scan_layers`: one vector per candidate layer, all layers scored in the same batches,
  the best layer picked by valid accuracy (ties: higher mean target probability, then lower layer).
* :class:`HookMethod`: a :class:`~site_interp.evaluation.Method` carrying arbitrary hooks, so
  :func:`~site_interp.evaluation.evaluate` scores a baseline beside 0-shot / ICL / SITE with the
  very same loop (first token, and exact match by greedy generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.evaluation import EvalConfig, Method, TaskEvaluation, evaluate
from site_interp.forward import SegmentedPrefixCache, last_token_logits, prefix_cache_for
from site_interp.hooks import HookFn, Hooks, make_resid_capture_hook, resid_name, rows_and_positions
from site_interp.prompts import DEFAULT_TEMPLATE, PromptBatch, PromptTemplate
from site_interp.tasks import Task

Mode = Literal["add", "replace"]
HooksFor = Callable[[Int[Tensor, " chunk"]], Hooks]


def make_resid_hook(
    vector: Float[Tensor, " d_model"] | Float[Tensor, "batch d_model"],
    mode: Mode,
    positions: int | Int[Tensor, " batch"] = -1,
    active: Bool[Tensor, " batch"] | None = None,
) -> HookFn:
    """Edit the residual stream ``[batch, pos, d_model]`` at ``positions`` only.

    ``mode="add"``: ``x + vector``; ``mode="replace"``: ``vector``. ``vector`` is shared or per
    row; rows where ``active`` is False are left exactly as they are. Returns a new tensor.
    """
    if mode not in ("add", "replace"):
        raise ValueError(f"mode must be 'add' or 'replace', not {mode!r}")

    def hook(x: Float[Tensor, "batch pos d_model"], *, hook=None) -> Tensor:
        rows, pos = rows_and_positions(x, positions)
        v = vector.to(device=x.device, dtype=x.dtype).expand(x.shape[0], x.shape[-1])
        old = x[rows, pos]
        new = old + v if mode == "add" else v
        if active is not None:
            new = torch.where(active.to(x.device)[:, None], new, old)
        return x.index_put((rows, pos), new)

    return hook


def resid_hooks(
    vector: Float[Tensor, " d_model"], layer: int, mode: Mode, positions: int | Int[Tensor, " batch"] = -1
) -> Hooks:
    """One residual hook at the input of block ``layer``, ready for ``run_with_hooks``."""
    return [(resid_name(layer), make_resid_hook(vector, mode, positions))]


@dataclass(frozen=True)
class HookMethod(Method):
    """A :class:`~site_interp.evaluation.Method` whose injection is any list of hooks."""

    fwd_hooks: tuple[tuple[str, HookFn], ...] = ()
    """The hooks, active on the prompt pass (they edit the last prompt token)."""

    def hooks(self) -> Hooks:
        return list(self.fwd_hooks)


def evaluate_hooks(
    bridge,
    task: Task,
    name: str,
    hooks: Hooks,
    config: EvalConfig = EvalConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> TaskEvaluation:
    """Score 0-shot test prompts under ``hooks`` with :func:`~site_interp.evaluation.evaluate`.

    Returns its per-query records (method = ``name``); ``.accuracy(name)`` is first-token accuracy.
    """
    method = HookMethod(name, fwd_hooks=tuple(hooks))
    return evaluate(bridge, task, [method], config, template=template, progress=progress)


@dataclass
class RowScores:
    """First-token outcome of scored rows."""

    pred: Int[Tensor, " n"]
    """Argmax token at the last prompt position."""
    prob: Float[Tensor, " n"]
    """Probability of the target (the answer's first token), float32."""
    correct: Bool[Tensor, " n"]
    """``pred == target``."""


def maybe_prefix(bridge, batch: PromptBatch, fast: bool = True) -> SegmentedPrefixCache | None:
    """A prefix cache of ``batch`` when ``fast`` and it is exact and fits the memory budget."""
    return prefix_cache_for(bridge, [batch.token_ids], fast=fast)


@torch.no_grad()
def score_rows(
    bridge,
    batch: PromptBatch,
    hooks_for: HooksFor | None = None,
    *,
    rows: Int[Tensor, " n"] | None = None,
    batch_size: int = 64,
    prefix: SegmentedPrefixCache | None = None,
    progress: bool = False,
    desc: str = "scoring",
) -> RowScores:
    """Score prompts ``rows`` of ``batch`` (repeats allowed) at their last token.

    ``hooks_for(idx)`` returns the hooks of one chunk, given the chunk's positions ``idx`` in
    ``rows`` (so a caller can give every row its own intervention). With ``prefix`` (a cache of
    ``batch``) only the last token runs; otherwise full left-padded prompts.
    """
    rows = torch.arange(len(batch)) if rows is None else rows.cpu().long()
    preds, probs = [], []
    for start in tqdm(range(0, len(rows), batch_size), desc=desc, disable=not progress, leave=False):
        idx = torch.arange(start, min(start + batch_size, len(rows)))
        hooks = hooks_for(idx) if hooks_for is not None else []
        chunk = rows[idx]
        logits = last_token_logits(bridge, batch.token_ids, hooks, prefix=prefix, rows=chunk)
        logp = F.log_softmax(logits.float(), dim=-1).cpu()
        preds.append(logp.argmax(-1))
        probs.append(logp.gather(1, batch.target_ids[chunk][:, None]).squeeze(1).exp())
    pred = torch.cat(preds) if preds else torch.zeros(0, dtype=torch.long)
    prob = torch.cat(probs) if probs else torch.zeros(0)
    return RowScores(pred=pred, prob=prob, correct=pred == batch.target_ids[rows])


@dataclass
class LayerScan:
    """Valid-split scores of one vector per candidate layer."""

    layers: list[int]
    """The candidate layers (hook = input of block L)."""
    accuracy: Float[Tensor, " candidate"]
    """First-token accuracy (fraction) per candidate."""
    target_prob: Float[Tensor, " candidate"]
    """Mean probability of the answer's first token per candidate."""

    @property
    def best(self) -> int:
        """The layer with the highest accuracy; ties: higher mean target probability, then lower layer."""
        i = max(range(len(self.layers)), key=lambda k: (float(self.accuracy[k]), float(self.target_prob[k])))
        return self.layers[i]


def scan_layers(
    bridge,
    batch: PromptBatch,
    vectors: Float[Tensor, "candidate d_model"],
    layers: list[int],
    mode: Mode,
    *,
    batch_size: int = 64,
    fast: bool = True,
    progress: bool = False,
) -> LayerScan:
    """Apply ``vectors[k]`` at the last token, input of block ``layers[k]``, for every prompt.

    All (layer, prompt) pairs share batches: each candidate layer has a hook that edits only its
    own rows. Exactly equal to scoring each layer alone (untouched rows are not modified).
    """
    if len(layers) != vectors.shape[0] or not layers:
        raise ValueError(f"need one vector per candidate layer: {vectors.shape[0]} vectors, {len(layers)} layers")
    bad = [layer for layer in layers if not 0 <= layer < bridge.cfg.n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range: the model has layers 0..{bridge.cfg.n_layers - 1}")
    n = len(batch)
    rows = torch.arange(n).repeat(len(layers))
    cand = torch.arange(len(layers)).repeat_interleave(n)

    def hooks_for(idx: Tensor) -> Hooks:
        c = cand[idx]
        return [
            (resid_name(layers[k]), make_resid_hook(vectors[k], mode, -1, active=c == k))
            for k in c.unique().tolist()
        ]

    prefix = maybe_prefix(bridge, batch, fast)
    scores = score_rows(bridge, batch, hooks_for, rows=rows, batch_size=batch_size, prefix=prefix,
                        progress=progress, desc="layer scan")
    acc = scores.correct.float().view(len(layers), n).mean(1)
    prob = scores.prob.view(len(layers), n).mean(1)
    return LayerScan(layers=list(layers), accuracy=acc, target_prob=prob)


# submodules use the helpers above: import them last
from site_interp.baselines.function_vectors import (
    FunctionVectorConfig,
    FunctionVectorResult,
    average_indirect_effect,
    default_n_heads,
    evaluate_function_vector,
    fit_function_vector,
    function_vector_from_heads,
    function_vector_hooks,
    function_vector_method,
    head_output_matrix,
    post_attention_norm,
    shuffled_label_prompts,
    top_heads,
)
from site_interp.baselines.task_vectors import (
    TaskVectorConfig,
    TaskVectorResult,
    evaluate_task_vector,
    extract_task_vectors,
    fit_task_vector,
    task_vector_hooks,
    task_vector_method,
)

__all__ = [
    "FunctionVectorConfig",
    "FunctionVectorResult",
    "HookMethod",
    "LayerScan",
    "RowScores",
    "TaskVectorConfig",
    "TaskVectorResult",
    "average_indirect_effect",
    "default_n_heads",
    "evaluate_function_vector",
    "evaluate_hooks",
    "evaluate_task_vector",
    "extract_task_vectors",
    "fit_function_vector",
    "fit_task_vector",
    "function_vector_from_heads",
    "function_vector_hooks",
    "function_vector_method",
    "head_output_matrix",
    "post_attention_norm",
    "make_resid_capture_hook",
    "make_resid_hook",
    "maybe_prefix",
    "resid_hooks",
    "resid_name",
    "scan_layers",
    "score_rows",
    "shuffled_label_prompts",
    "task_vector_hooks",
    "task_vector_method",
    "top_heads",
]
