"""LoRA baseline (with ``peft``): low-rank updates of the attention projections, trained on SITE's data.

Same 0-shot prompts, same first-answer-token cross-entropy, same validation-based choice of the
best checkpoint as SITE (:mod:`site_interp.selection`); only what is trained differs:

* SITE: one scalar per head (``n_layers * n_heads``: 72 on gemma-3-270m);
* LoRA: rank-``r`` updates ``W + (alpha / r) B A`` of the query and value projections of every
  layer (``r * (d_in + d_out)`` per matrix: 208,896 on gemma-3-270m at r = 8).

The adapters are injected into the bridge's own ``attn.q`` / ``attn.v`` components (their wrapped
``nn.Linear``), found through the bridge's block structure, so every architecture the bridge
supports works without name lists; they are removed again after training and evaluation
(:func:`lora_adapter` is a context manager), leaving the model exactly as it was.

Budget: the default is 100 Adam steps of 4 prompts: the same 400 training examples SITE sees
(400 steps of 1), each a full forward and backward through the model (LoRA changes every
position, so there is no prefix to reuse).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.pool import PromptPool
from site_interp.prompts import DEFAULT_TEMPLATE, PromptTemplate
from site_interp.selection import _order, zero_shot_batch
from site_interp.tasks import Task


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

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class LoraResult:
    """A trained adapter and how training went."""

    task: str
    """Task name."""
    state: dict[str, Tensor]
    """The best adapter weights (``lora_A`` / ``lora_B`` per target, float32, CPU)."""
    n_params: int
    """Trainable parameters."""
    best_step: int
    """Step of the kept weights (0: the initial adapter, B = 0, i.e. the unchanged model)."""
    best_valid_loss: float
    """Their validation loss."""
    history: list[dict] = field(default_factory=list)
    """One row per step: ``step``, ``train_loss``, and ``valid_loss`` where validated."""
    seconds: float = 0.0
    """Training wall time."""
    config: LoraConfig = field(default_factory=LoraConfig)
    """The settings used."""

    def to_dataframe(self) -> pd.DataFrame:
        return pd.DataFrame(self.history)


def _target_names(bridge, targets: Sequence[str]) -> list[str]:
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
def lora_adapter(bridge, config: LoraConfig = LoraConfig(), state: dict[str, Tensor] | None = None) -> Iterator[list[Tensor]]:
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


def lora_state(bridge) -> dict[str, Tensor]:
    """The current adapter weights (float32 copies on CPU)."""
    return {n: p.detach().float().cpu().clone() for n, p in bridge.named_parameters() if "lora_" in n}


def load_lora_state(bridge, state: dict[str, Tensor]) -> None:
    params = {n: p for n, p in bridge.named_parameters() if "lora_" in n}
    if set(params) != set(state):
        raise ValueError("the LoRA state does not match this model's adapters (another model or other targets)")
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(state[n].to(p.device, p.dtype))


def count_lora_params(bridge, config: LoraConfig = LoraConfig()) -> int:
    """Trainable parameters of ``config``'s adapters on this model (without building them)."""
    total = 0
    for layer, block in enumerate(bridge.blocks):
        for target in config.targets:
            base = getattr(getattr(block.attn, target), "_original_component", None) or getattr(block.attn, target)
            total += config.rank * (base.in_features + base.out_features)
    return total


@torch.no_grad()
def _valid_loss(pool: PromptPool, chunk: int = 64) -> float:
    total = 0.0
    for start in range(0, len(pool), chunk):
        rows = torch.arange(start, min(start + chunk, len(pool)))
        total += float(pool.losses(rows).sum())
    return total / len(pool)


def train_lora(
    bridge,
    task: Task,
    config: LoraConfig = LoraConfig(),
    *,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    progress: bool = True,
) -> LoraResult:
    """Train a LoRA adapter on ``task``'s 0-shot train prompts; keep the best on valid."""
    t0 = time.perf_counter()
    order = _order(len(task.train), config.steps, config.batch_size, config.seed)
    train = PromptPool(bridge, [zero_shot_batch(bridge, task, "train", template=template)], fast=False)
    valid = PromptPool(bridge, [zero_shot_batch(bridge, task, "valid", config.n_valid, template=template)], fast=False)
    with lora_adapter(bridge, config) as params:
        n_params = sum(p.numel() for p in params)
        opt = torch.optim.Adam(params, lr=config.lr)
        best = (_valid_loss(valid), 0, lora_state(bridge))
        history: list[dict] = [{"step": 0, "valid_loss": best[0]}]
        bar = tqdm(range(1, config.steps + 1), desc=f"LoRA {task.name}"[:40], disable=not progress, leave=False)
        with torch.enable_grad():
            for step in bar:
                loss = train.losses(torch.tensor(order[step - 1])).mean()
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"{task.name}: the LoRA loss became {loss.item()} at step {step}; lower --lora-lr (now {config.lr})"
                    )
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                row = {"step": step, "train_loss": float(loss.detach())}
                if step % config.eval_every == 0 or step == config.steps:
                    row["valid_loss"] = _valid_loss(valid)
                    if row["valid_loss"] < best[0]:
                        best = (row["valid_loss"], step, lora_state(bridge))
                    bar.set_postfix(valid=f"{row['valid_loss']:.3f}")
                history.append(row)
    if not math.isfinite(best[0]):
        raise FloatingPointError(f"{task.name}: the LoRA validation loss is {best[0]}")
    return LoraResult(task=task.name, state=best[2], n_params=n_params, best_step=best[1], best_valid_loss=best[0],
                      history=history, seconds=time.perf_counter() - t0, config=config)


__all__ = ["LoraConfig", "LoraResult", "count_lora_params", "load_lora_state", "lora_adapter", "lora_state", "train_lora"]
