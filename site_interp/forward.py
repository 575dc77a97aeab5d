"""Running the model: last-token logits, reusable prefix caches, greedy generation.

Everything SITE injects sits at the last prompt token, and attention is causal, so the keys and
values of all earlier tokens depend neither on alpha nor on which heads are patched.
:class:`PrefixCache` computes them once; each training step, patching configuration or transfer
entry then runs the last token only (:func:`last_token_logits` with ``prefix=``).
Logits are computed only where they are scored (``logits_to_keep=1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from site_interp.hooks import Hooks
from site_interp.prompts import left_pad, pad_id


def model_device(bridge) -> torch.device:
    """The device of the input embedding (where token ids must go)."""
    return bridge.cfg.device if isinstance(bridge.cfg.device, torch.device) else torch.device(bridge.cfg.device or "cpu")


def _hf_config(bridge):
    return getattr(bridge.original_model, "config", None)


def last_token_logits(
    bridge,
    token_ids: Sequence[Sequence[int]] | None = None,
    hooks: Hooks = (),
    *,
    prefix: "PrefixCache | None" = None,
    rows: Int[Tensor, " batch"] | None = None,
) -> Float[Tensor, "batch vocab"]:
    """Logits at the last prompt token, with ``hooks`` active.

    Either full prompts (``token_ids``, left-padded here), or rows of a :class:`PrefixCache`
    (only their last token runs). Gradients flow when called outside ``torch.no_grad``.
    """
    if prefix is not None:
        rows = torch.arange(prefix.n) if rows is None else rows
        cache, last, mask = prefix.select(rows)
        out = bridge.run_with_hooks(
            last, fwd_hooks=list(hooks), attention_mask=mask, past_key_values=cache, logits_to_keep=1
        )
        return out[:, -1]
    device = model_device(bridge)
    ids, mask = left_pad(token_ids, pad_id(bridge.tokenizer), device)
    out = bridge.run_with_hooks(ids, fwd_hooks=list(hooks), attention_mask=mask, logits_to_keep=1)
    return out[:, -1]


@dataclass
class PrefixCache:
    """Keys and values of every prompt's tokens except the last, for many prompts at once.

    Prompts are left-padded to one width, so any subset of rows can be stacked into a batch.
    """

    keys: list[Tensor]
    """Per layer ``[n, kv_heads, width - 1, d_head]`` (may be empty for KV-less layers)."""
    values: list[Tensor]
    """Per layer, like ``keys``."""
    mask: Int[Tensor, "n width"]
    """Attention mask over prefix + last token (1 = real token)."""
    last_ids: Int[Tensor, "n 1"]
    """The last token of each prompt."""
    hf_config: object
    """The model's config (layer types, e.g. sliding-window layers)."""

    @property
    def n(self) -> int:
        return self.last_ids.shape[0]

    def select(self, rows: Int[Tensor, " batch"]):
        """A fresh cache (and last tokens, mask) for ``rows``; the stored tensors are untouched."""
        from transformers import DynamicCache

        rows = rows.to(self.last_ids.device)
        data = [(k[rows], v[rows]) for k, v in zip(self.keys, self.values)]
        cache = DynamicCache(ddp_cache_data=data, config=self.hf_config)
        return cache, self.last_ids[rows], self.mask[rows]


def prefix_cache_fits(bridge, token_ids: Sequence[Sequence[int]]) -> bool:
    """Whether a :class:`PrefixCache` of these prompts is exact (no sliding window is exceeded)."""
    window = getattr(_hf_config(bridge), "sliding_window", None)
    return window is None or max(len(t) for t in token_ids) < window


@torch.no_grad()
def build_prefix_cache(
    bridge, token_ids: Sequence[Sequence[int]], *, batch_size: int = 32, progress: bool = False
) -> PrefixCache:
    """Run every prompt but its last token once, keeping keys and values (no hooks).

    Raises :class:`ValueError` when the padded prompts are longer than a sliding attention
    window (the cache would drop keys); :func:`prefix_cache_fits` tells beforehand.
    """
    if not prefix_cache_fits(bridge, token_ids):
        raise ValueError("prompts longer than the model's sliding attention window: run full prompts")
    device = model_device(bridge)
    ids, mask = left_pad(token_ids, pad_id(bridge.tokenizer), device)
    keys: list[list[Tensor]] = []
    values: list[list[Tensor]] = []
    starts = range(0, len(token_ids), batch_size)
    for start in tqdm(starts, desc="prefix cache", disable=not progress, leave=False):
        sl = slice(start, start + batch_size)
        _, cache = bridge(
            ids[sl, :-1], attention_mask=mask[sl, :-1], return_type="logits_and_cache", logits_to_keep=1
        )
        for i, layer in enumerate(cache.layers):
            if len(keys) <= i:
                keys.append([])
                values.append([])
            keys[i].append(layer.keys)
            values[i].append(layer.values)
    return PrefixCache(
        keys=[torch.cat(k) for k in keys],
        values=[torch.cat(v) for v in values],
        mask=mask,
        last_ids=ids[:, -1:],
        hf_config=_hf_config(bridge),
    )


@torch.no_grad()
def greedy_generate(
    bridge,
    token_ids: Sequence[Sequence[int]],
    prompt_hooks: Hooks = (),
    *,
    max_new_tokens: int = 20,
    use_cache: bool = True,
    stop_at_newline: bool = True,
    stop: Callable[[int, str], bool] | None = None,
) -> list[list[int]]:
    """Greedy continuation of left-padded prompts.

    ``prompt_hooks`` are active on the prompt pass only. With the KV cache (default) the later
    steps run one token each and are untouched by the hooks; without it every step reruns the
    whole sequence, with the hooks still editing the original last prompt position (the same
    computation, slower; the tests compare both). A row also stops at EOS, at a newline
    (``stop_at_newline``) or when ``stop(row, text_so_far)`` says so; the batch stops when every
    row has.
    """
    device = model_device(bridge)
    tok = bridge.tokenizer
    ids, mask = left_pad(token_ids, pad_id(tok), device)
    width = ids.shape[1]
    eos = tok.eos_token_id
    generated: list[list[int]] = [[] for _ in token_ids]
    active = list(range(len(token_ids)))  # original row of each row still running
    cache = None
    for step in range(max_new_tokens):
        if step == 0 or not use_cache:
            hooks = _shift_hooks(prompt_hooks, width) if step else prompt_hooks
            with bridge.hooks(fwd_hooks=list(hooks)):
                logits, cache = bridge(
                    ids, attention_mask=mask, return_type="logits_and_cache", logits_to_keep=1,
                    use_cache=use_cache,
                )
        else:
            logits, cache = bridge(
                ids[:, -1:], attention_mask=mask, past_key_values=cache, return_type="logits_and_cache"
            )
        nxt = logits[:, -1].argmax(-1)
        finished = []
        for j, (row, t) in enumerate(zip(active, nxt.tolist())):
            if row < 0:  # finished earlier; still in the batch (uncached path keeps every row)
                continue
            generated[row].append(t)
            text = tok.decode(generated[row], skip_special_tokens=True) if (stop_at_newline or stop) else ""
            if (t == eos) or (stop_at_newline and "\n" in text) or (stop is not None and stop(row, text)):
                finished.append(j)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
        for j in finished:
            active[j] = -1
        if all(row < 0 for row in active):
            break
        if use_cache and finished:
            # drop finished rows: later steps cost only what is still running
            keep = torch.tensor([j for j, row in enumerate(active) if row >= 0], device=device)
            cache.batch_select_indices(keep)
            ids, mask = ids[keep], mask[keep]
            active = [active[j] for j in keep.tolist()]
    return generated


def _shift_hooks(prompt_hooks: Hooks, width: int) -> Hooks:
    """Prompt hooks rebuilt for a longer sequence: they must edit position ``width - 1``.

    Hooks are opaque functions, so instead of rebuilding them we crop: run the hook on the
    prompt part of ``z`` only and keep the generated positions as they are.
    """

    def crop(fn):
        def hook(z, *, hook=None):
            head = fn(z[:, :width], hook=hook)
            return torch.cat([head, z[:, width:]], dim=1)

        return hook

    return [(name, crop(fn)) for name, fn in prompt_hooks]


__all__ = [
    "PrefixCache",
    "build_prefix_cache",
    "prefix_cache_fits",
    "greedy_generate",
    "last_token_logits",
    "model_device",
]
