"""Greedy generation from left-padded prompts, with injection hooks on the prompt pass only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch
from transformer_lens.hook_points import HookPoint

from site_interp.hooks import Hooks
from site_interp.loading import model_device
from site_interp.prompts import left_pad, pad_id

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge


@torch.no_grad()
def greedy_generate(
    bridge: TransformerBridge,
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
        def hook(z, *, hook: HookPoint | None = None):
            head = fn(z[:, :width], hook=hook)
            return torch.cat([head, z[:, width:]], dim=1)

        return hook

    return [(name, crop(fn)) for name, fn in prompt_hooks]


__all__ = ["greedy_generate"]
