"""Hook factories, named with TransformerLens' ``get_act_name`` vocabulary.

SITE edits ``blocks.{layer}.attn.hook_z`` (per query head: ``[batch, pos, head, d_head]``); the
steering baselines edit ``blocks.{layer}.hook_resid_pre`` (``[batch, pos, d_model]``).

Every factory is pure: it returns ``fn(activation, *, hook) -> Tensor`` (TransformerLens' hook
signature, :class:`HookFn`) that builds a new tensor (in-place
edits break autograd) and never parses the layer out of ``hook.name`` (the bridge reports aliased
names such as ``attn.o.hook_in``). Positions are per batch row, so left-padded batches (last
prompt token at ``-1``) and ragged positions both work; tensors are moved to the activation's
device and dtype inside the hook, so hooks work on models sharded over several GPUs.
"""

from __future__ import annotations

from typing import Hashable, MutableMapping, Protocol, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.hook_points import HookPoint
from transformer_lens.utilities import get_act_name


class HookFn(Protocol):
    """A forward hook as TransformerLens calls it: ``fn(activation, hook=hook_point) -> new activation``."""

    def __call__(self, activation: Tensor, *, hook: HookPoint | None = None) -> Tensor: ...


Hooks = list[tuple[str, HookFn]]
"""``(hook name, hook)`` pairs, as ``run_with_hooks(fwd_hooks=...)`` takes them."""


def z_name(layer: int) -> str:
    """The hook name of the per-head attention output of ``layer``."""
    return get_act_name("z", layer)


def resid_name(layer: int) -> str:
    """The hook at the input of block ``layer`` (``blocks.L.hook_resid_pre``)."""
    return get_act_name("resid_pre", layer)


def rows_and_positions(z: Tensor, positions: int | Tensor) -> tuple[Tensor, Tensor]:
    """Row indices and (non-negative) positions to edit in a ``[batch, pos, ...]`` activation."""
    batch, n_pos = z.shape[0], z.shape[1]
    rows = torch.arange(batch, device=z.device)
    if isinstance(positions, int):
        pos = torch.full((batch,), positions % n_pos, device=z.device, dtype=torch.long)
    else:
        pos = positions.to(z.device).long() % n_pos
    return rows, pos


def make_soft_injection_hook(
    alpha: Float[Tensor, " head"] | Float[Tensor, "batch head"],
    t: Float[Tensor, "head d_head"] | Float[Tensor, "batch head d_head"],
    positions: int | Int[Tensor, " batch"] = -1,
) -> HookFn:
    """SITE's injection for one layer: ``z[pos] <- (1 - alpha) * z[pos] + alpha * t``.

    ``alpha`` is one weight per head (``[head]``, or ``[batch, head]`` when each row carries its
    own task's alphas); ``t`` the task embedding of this layer (``[head, d_head]`` or per row).
    Only ``positions`` change (default: the last token). Gradients flow to ``alpha`` and ``t``.
    """

    def hook(z: Float[Tensor, "batch pos head d_head"], *, hook: HookPoint | None = None) -> Tensor:
        rows, pos = rows_and_positions(z, positions)
        a = alpha.to(device=z.device, dtype=z.dtype)
        tt = t.to(device=z.device, dtype=z.dtype)
        a = a.expand(z.shape[0], z.shape[2]).unsqueeze(-1)
        mixed = (1 - a) * z[rows, pos] + a * tt.expand(z.shape[0], *z.shape[2:])
        return z.index_put((rows, pos), mixed)

    return hook


def make_capture_hook(
    store: MutableMapping[Hashable, Tensor], key: Hashable, positions: int | Int[Tensor, " batch"] = -1
) -> HookFn:
    """Record the activation at ``positions`` (``[batch, ...]``, detached) into ``store[key]``.

    Works on any ``[batch, pos, ...]`` activation (``hook_z``, the residual stream...); returns
    the activation unchanged.
    """

    def hook(x: Float[Tensor, "batch pos *rest"], *, hook: HookPoint | None = None) -> Tensor:
        rows, pos = rows_and_positions(x, positions)
        store[key] = x[rows, pos].detach()
        return x

    return hook


def injection_hooks(
    alpha: Float[Tensor, "layer head"] | Float[Tensor, "batch layer head"],
    t: Float[Tensor, "layer head d_head"] | Float[Tensor, "batch layer head d_head"],
    positions: int | Int[Tensor, " batch"] = -1,
    layers: Sequence[int] | None = None,
) -> Hooks:
    """Soft-injection hooks for every layer (or ``layers``), ready for ``run_with_hooks``.

    With a leading batch dimension on ``alpha`` and ``t``, each row of a batch gets its own
    alphas and embedding: one forward serves many tasks or many patching configurations.
    A hard patch of a head set is the special case ``alpha`` in {0, 1}.
    """
    batched = alpha.dim() == 3
    n_layers = alpha.shape[1] if batched else alpha.shape[0]
    out: Hooks = []
    for layer in range(n_layers) if layers is None else layers:
        a = alpha[:, layer] if batched else alpha[layer]
        tl = t[:, layer] if t.dim() == 4 else t[layer]
        out.append((z_name(layer), make_soft_injection_hook(a, tl, positions)))
    return out


def capture_hooks(
    n_layers: int, store: MutableMapping[Hashable, Tensor], positions: int | Tensor = -1, act: str = "z"
) -> Hooks:
    """Capture hooks for activation ``act`` (``get_act_name`` vocabulary: ``"z"``, ``"resid_pre"``...)
    at ``positions`` in every layer; ``store[(act, layer)]`` receives each."""
    return [(get_act_name(act, layer), make_capture_hook(store, (act, layer), positions)) for layer in range(n_layers)]


def stack_captured(
    store: MutableMapping[Hashable, Tensor], n_layers: int, act: str = "z"
) -> Float[Tensor, "batch layer *rest"]:
    """The captures of :func:`capture_hooks` stacked along a layer axis (float32, CPU)."""
    return torch.stack([store[(act, layer)].to("cpu", torch.float32) for layer in range(n_layers)], dim=1)


__all__ = [
    "HookFn",
    "Hooks",
    "capture_hooks",
    "injection_hooks",
    "make_capture_hook",
    "make_soft_injection_hook",
    "resid_name",
    "rows_and_positions",
    "stack_captured",
    "z_name",
]
