"""The unembedding sees a contiguous input (one matrix product, not one weight read per row)
and the logits stay those of the plain forward."""

import torch

from site_interp.loading import contiguous_unembedding
from site_interp.scoring import last_token_logits


def _inputs_seen(bridge, ids):
    head = bridge.original_model.get_output_embeddings()
    seen = []
    handle = head.register_forward_pre_hook(lambda m, inputs: seen.append(inputs[0].is_contiguous()))
    with torch.no_grad():
        logits = last_token_logits(bridge, ids)
    handle.remove()
    return seen, logits


def test_unembedding_input_is_contiguous_and_logits_unchanged(tiny):
    ids = [[5, 9, 11, 4, 7], [6, 3, 8], [12, 13, 14, 15, 16, 17]]
    seen, logits = _inputs_seen(tiny, ids)
    assert seen and all(seen)
    assert contiguous_unembedding(tiny) is False  # added once, at load
    head = tiny.original_model.get_output_embeddings()
    head._site_contiguous.remove()  # the plain path: a strided view of the last position
    try:
        plain_seen, plain = _inputs_seen(tiny, ids)
    finally:
        del head._site_contiguous
        assert contiguous_unembedding(tiny) is True
    assert not any(plain_seen)
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)


def test_prefix_caches_skip_the_unembedding_and_keep_the_same_keys(tiny):
    from site_interp.prefix_cache import build_prefix_cache
    from site_interp.prompts import left_pad, pad_id

    ids = [[5, 9, 11, 4, 7], [6, 3, 8], [12, 13, 14, 15, 16, 17]]
    head = tiny.original_model.get_output_embeddings()
    positions = []
    handle = head.register_forward_hook(lambda m, inputs, out: positions.append(out.shape[1]))
    try:
        cache = build_prefix_cache(tiny, ids)
    finally:
        handle.remove()
    assert positions == [0]  # the vocabulary product was skipped
    padded, mask = left_pad(ids, pad_id(tiny.tokenizer), "cpu")
    with torch.no_grad():
        _, plain = tiny(padded[:, :-1], attention_mask=mask[:, :-1], return_type="logits_and_cache", logits_to_keep=1)
    for layer, ref in zip(range(len(cache.keys)), plain.layers):
        torch.testing.assert_close(cache.keys[layer], ref.keys, rtol=0, atol=0)
        torch.testing.assert_close(cache.values[layer], ref.values, rtol=0, atol=0)
