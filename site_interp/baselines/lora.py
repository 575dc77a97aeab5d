"""LoRA baseline (with ``peft``): low-rank updates of the attention projections, trained on SITE's data.

Same 0-shot prompts, same first-answer-token cross-entropy, same training loop with its
validation-based choice of the best checkpoint as SITE (:func:`site_interp.trainer.train_keep_best`);
only what is trained differs:

* SITE: one scalar per head (``n_layers * n_heads``: 72 on gemma-3-270m);
* LoRA: rank-``r`` updates ``W + (alpha / r) B A`` of the query and value projections of every
  layer (``r * (d_in + d_out)`` per matrix; :func:`count_lora_params` counts them for a model).

The adapters are injected into the bridge's own ``attn.q`` / ``attn.v`` components (their wrapped
``nn.Linear``), found through the bridge's block structure, so every architecture the bridge
supports works without name lists; they are removed again after training and evaluation
(:func:`lora_adapter` is a context manager), leaving the model exactly as it was.

Budget: the default is 100 Adam steps of 4 prompts: the same 400 training examples SITE sees
(400 steps of 1), each a full forward and backward through the model (LoRA changes every
position, so there is no prefix to reuse).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch import Tensor

from site_interp.checks import check_float, check_int, check_subset
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate, zero_shot_batch
from site_interp.scoring import LastTokenScorer
from site_interp.tasks.core import Task
from site_interp.trainer import FitResult, step_schedule, train_keep_best

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@dataclass(frozen=True)
class LoraConfig:
    """LoRA settings (rank 8 on query and value, as in the SITE paper's comparison)."""

    rank: int = 8
    """Rank r of each update."""
    scale: float = 16.0
    """``lora_alpha``: the update is scaled by ``scale / rank``."""
    targets: tuple[str, ...] = ("q", "v")
    """Attention components of every block to adapt (bridge names: ``q``, ``k``, ``v``, ``o``)."""
    steps: int = 100
    """Adam steps."""
    batch_size: int = 4
    """0-shot train prompts per step (100 x 4 = SITE's 400 x 1 examples)."""
    lr: float = 1e-3
    """Adam learning rate."""
    eval_every: int = 25
    """Validate every this many steps (and after the last); the best validation loss wins."""
    n_valid: int | None = 100
    """Validation queries (the first ones of the valid split); None: all."""
    seed: int = 0
    """Seeds the adapter initialisation and the order of training examples."""

    def __post_init__(self) -> None:
        check_int(self.rank, "rank", minimum=1, option="--lora-rank")
        check_float(self.scale, "scale", above=0)
        check_subset(self.targets, "targets", ("q", "k", "v", "o"))
        check_int(self.steps, "steps", minimum=1, option="--lora-steps")
        check_int(self.batch_size, "batch_size", minimum=1, option="--lora-batch-size")
        check_float(self.lr, "lr", above=0, option="--lora-lr")
        check_int(self.eval_every, "eval_every", minimum=1)
        check_int(self.n_valid, "n_valid", minimum=1, none_ok=True)
        check_int(self.seed, "seed", minimum=0, option="--seed")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class LoraResult(FitResult):
    """A trained adapter and how training went (``best_step`` 0: the initial adapter, B = 0, i.e.
    the unchanged model)."""

    state: dict[str, Tensor]
    """The best adapter weights (``lora_A`` / ``lora_B`` per target, float32, CPU)."""
    n_params: int
    """Trainable parameters."""
    config: LoraConfig = field(default_factory=LoraConfig)
    """The settings used."""


def _target_names(bridge: TransformerBridge, targets: Sequence[str]) -> list[str]:
    """Full module names of the ``nn.Linear`` inside each block's ``attn.<target>`` component."""
    names = {id(m): n for n, m in bridge.named_modules()}
    out = []
    for layer, block in enumerate(bridge.blocks):
        for target in targets:
            comp = getattr(block.attn, target, None)
            if comp is None:
                raise ValueError(f"layer {layer}: the attention has no component {target!r}; use q, k, v or o")
            base = getattr(comp, "_original_component", comp)
            if not isinstance(base, torch.nn.Linear):
                raise ValueError(f"layer {layer}: attn.{target} wraps {type(base).__name__}, not a Linear layer")
            out.append(names[id(base)])
    return out


@contextmanager
def lora_adapter(bridge: TransformerBridge, config: LoraConfig = LoraConfig(), state: dict[str, Tensor] | None = None) -> Iterator[list[Tensor]]:
    """Inject fresh LoRA adapters (or ``state``), yield their parameters, remove them on exit."""
    try:
        from peft import LoraConfig as PeftLoraConfig
        from peft import inject_adapter_in_model
    except ImportError as err:  # pragma: no cover - peft is a core dependency
        raise ModuleNotFoundError("the LoRA baseline needs peft: pip install peft") from err
    names = _target_names(bridge, config.targets)
    torch.manual_seed(config.seed)
    peft_cfg = PeftLoraConfig(r=config.rank, lora_alpha=config.scale, lora_dropout=0.0, target_modules=names, bias="none")
    frozen = {p: p.requires_grad for p in bridge.parameters()}
    had_config = "peft_config" in vars(bridge)
    inject_adapter_in_model(peft_cfg, bridge, adapter_name="site_interp")
    try:
        params = [p for n, p in bridge.named_parameters() if "lora_" in n]
        for p in params:
            p.requires_grad_(True)
        if state is not None:
            load_lora_state(bridge, state)
        yield params
    finally:
        for name in names:
            parent_name, _, attr = name.rpartition(".")
            parent = bridge.get_submodule(parent_name)
            layer = getattr(parent, attr)
            setattr(parent, attr, layer.get_base_layer())
        for p, flag in frozen.items():
            p.requires_grad_(flag)
        if not had_config and hasattr(bridge, "peft_config"):
            del bridge.peft_config


def lora_state(bridge: TransformerBridge) -> dict[str, Tensor]:
    """The current adapter weights (float32 copies on CPU)."""
    return {n: p.detach().float().cpu().clone() for n, p in bridge.named_parameters() if "lora_" in n}


def load_lora_state(bridge: TransformerBridge, state: dict[str, Tensor]) -> None:
    params = {n: p for n, p in bridge.named_parameters() if "lora_" in n}
    if set(params) != set(state):
        raise ValueError("the LoRA state does not match this model's adapters (another model or other targets)")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state[n].to(p.device, p.dtype))


def count_lora_params(bridge: TransformerBridge, config: LoraConfig = LoraConfig()) -> int:
    """Trainable parameters of ``config``'s adapters on this model (without building them)."""
    total = 0
    for layer, block in enumerate(bridge.blocks):
        for target in config.targets:
            base = getattr(getattr(block.attn, target), "_original_component", None) or getattr(block.attn, target)
            total += config.rank * (base.in_features + base.out_features)
    return total


def train_lora(
    bridge: TransformerBridge,
    task: Task,
    config: LoraConfig = LoraConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> LoraResult:
    """Train a LoRA adapter on ``task``'s 0-shot train prompts; keep the best on valid (the
    initial adapter, i.e. the unchanged model, is validated too)."""
    t0 = time.perf_counter()
    order = step_schedule(len(task.train), config.steps, config.batch_size, config.seed)
    train = LastTokenScorer(bridge, [zero_shot_batch(bridge, task, "train", template=template)], fast=False)
    valid = LastTokenScorer(bridge, [zero_shot_batch(bridge, task, "valid", config.n_valid, template=template)],
                            fast=False)
    with lora_adapter(bridge, config) as params:
        best, histories = train_keep_best(
            params, lambda step: train.losses(torch.tensor(order[step - 1])).mean()[None], valid.mean_losses,
            lambda k: lora_state(bridge), names=[task.name], steps=config.steps, lr=config.lr,
            eval_every=config.eval_every, validate_first=True, what="the LoRA loss", desc="LoRA",
            hint=f"lower --lora-lr (now {config.lr})", progress=progress,
        )
    return LoraResult(task=task.name, state=best[0].state, n_params=sum(p.numel() for p in params),
                      best_step=best[0].step, best_valid_loss=best[0].loss, history=histories[0],
                      seconds=time.perf_counter() - t0, config=config)


__all__ = ["LoraConfig", "LoraResult", "count_lora_params", "load_lora_state", "lora_adapter", "lora_state", "train_lora"]
