"""What the two residual-stream steering baselines share: one vector at one layer, chosen on valid.

Function vectors (added) and task vectors (replacing the residual stream) differ only in how
their vector is made; everything else is here:

* **Residual hooks** on ``get_act_name("resid_pre", L)`` = ``blocks.L.hook_resid_pre`` (the
  TransformerBridge resolves it to ``blocks.L.hook_in``): the *input of block L*, i.e. the output of
  block L-1 (L = 0: the token embeddings, after Gemma's embedding scaling). Pure factories, out of
  place, editing only the given positions (default the last token: -1 under left padding).
* :func:`scan_layers`: one vector per candidate layer, all layers scored in the same batches
  (:class:`~site_interp.scoring.LastTokenScorer`), the best layer picked by valid accuracy (ties:
  higher mean target probability, then lower layer).
* :class:`SteeringResult`: the chosen vector and layer, its valid scan, and the evaluable
  :class:`~site_interp.evaluation.Method` (``.method()``) that :func:`~site_interp.evaluation.evaluate`
  scores beside 0-shot / ICL / SITE with the very same loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from site_interp.checks import check_int
from site_interp.embeddings import EmbeddingConfig
from site_interp.evaluation import EvalConfig, Method, TaskEvaluation, evaluate
from site_interp.hooks import HookFn, Hooks, resid_name, rows_and_positions
from site_interp.prompts import DEFAULT_TEMPLATE, PromptBatch, PromptTemplate
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

Mode = Literal["add", "replace"]
"""``add``: ``x + vector`` (function vectors); ``replace``: ``vector`` (task vectors)."""


@dataclass(frozen=True)
class SteeringConfig:
    """What both steering baselines are configured by: the ICL prompts their vector comes from,
    and the layer scan on the valid split."""

    n_prompts: int = 50
    """ICL prompts averaged for the vector (SITE's M)."""
    n_shots: int = 10
    """Demonstrations per prompt (from train, never the query itself)."""
    layers: tuple[int, ...] | None = None
    """Candidate layers (the vector acts at the input of block L); None: every layer."""
    n_valid: int | None = 100
    """Valid queries for the layer choice (the first ones); None: all."""
    batch_size: int = 64
    """Rows per forward when scoring (each runs its last token only when cached)."""
    seed: int = 0
    """Seeds the ICL prompts (the same prompts as SITE's embedding with this seed)."""
    fast: bool = True
    """Reuse prompt prefixes (last token only per row); False runs full prompts."""

    def __post_init__(self) -> None:
        check_int(self.n_prompts, "n_prompts", minimum=1, option="--n-prompts")
        check_int(self.n_shots, "n_shots", minimum=1, option="--n-shots")
        for layer in self.layers or ():
            check_int(layer, "layers", minimum=0)
        check_int(self.n_valid, "n_valid", minimum=1, none_ok=True, option="--scan-valid")
        check_int(self.batch_size, "batch_size", minimum=1)
        check_int(self.seed, "seed", minimum=0, option="--seed")

    def to_dict(self) -> dict:
        return asdict(self)

    def embedding_config(self) -> EmbeddingConfig:
        """SITE's embedding settings with these prompts: its pass records what the vector is made of."""
        return EmbeddingConfig(n_prompts=self.n_prompts, n_shots=self.n_shots, seed=self.seed)

    def candidate_layers(self, n_layers: int) -> list[int]:
        """``layers``, or every layer of a model with ``n_layers``."""
        return list(self.layers) if self.layers is not None else list(range(n_layers))


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

    def hook(x: Float[Tensor, "batch pos d_model"], *, hook: HookPoint | None = None) -> Tensor:
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
    bridge: TransformerBridge,
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

    scorer = LastTokenScorer(bridge, [batch], fast=fast)
    scores = scorer.score(rows, hooks_for=hooks_for, chunk=batch_size, progress=progress, desc="layer scan")
    acc = scores.correct.float().view(len(layers), n).mean(1)
    prob = scores.prob.view(len(layers), n).mean(1)
    return LayerScan(layers=list(layers), accuracy=acc, target_prob=prob)


@dataclass(kw_only=True)
class SteeringResult:
    """One task's steering vector, the layer it acts at, and the valid scan that chose the layer."""

    task: str
    """Task name."""
    vector: Float[Tensor, " d_model"]
    """The vector applied at the last prompt token (float32, CPU)."""
    layer: int
    """Chosen layer: the vector acts at the input of this block."""
    mode: Mode
    """How it acts: added to the residual stream, or replacing it."""
    layers: list[int]
    """Candidate layers scanned on the valid split."""
    valid_accuracy: Float[Tensor, " candidate"]
    """Valid first-token accuracy (fraction) per candidate layer."""
    valid_target_prob: Float[Tensor, " candidate"]
    """Mean valid probability of the first answer token per candidate (breaks accuracy ties)."""
    seconds: float = 0.0
    """Wall time (making the vector and the layer scan)."""

    def hooks(self, positions: int | Tensor = -1) -> Hooks:
        """The vector at its chosen layer, at ``positions`` (default the last prompt token)."""
        return resid_hooks(self.vector, self.layer, self.mode, positions)

    def method(self, name: str) -> Method:
        """0-shot + this vector, for :func:`~site_interp.evaluation.evaluate`."""
        return Method(name, fwd_hooks=tuple(self.hooks()))

    def to_dataframe(self) -> pd.DataFrame:
        """One row per candidate layer: valid accuracy, target probability, chosen."""
        return pd.DataFrame({
            "task": self.task, "layer": self.layers, "valid_accuracy": self.valid_accuracy.tolist(),
            "valid_target_prob": self.valid_target_prob.tolist(), "chosen": [x == self.layer for x in self.layers],
        })


def evaluate_steering(
    bridge: TransformerBridge,
    task: Task,
    result: SteeringResult,
    config: EvalConfig = EvalConfig(),
    *,
    name: str = "steering",
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = False,
) -> TaskEvaluation:
    """Test-split evaluation of 0-shot + the result's vector (records per query; ``.accuracy(name)``)."""
    return evaluate(bridge, task, [result.method(name)], config, template=template, progress=progress)


__all__ = ["LayerScan", "Mode", "SteeringConfig", "SteeringResult", "evaluate_steering", "make_resid_hook", "resid_hooks", "scan_layers"]
