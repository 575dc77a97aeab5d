"""LoRA baseline on the tiny bridges: injection, removal, parameter count, training."""

import pytest
import torch

from site_interp.baselines.lora import LoraConfig, count_lora_params, lora_adapter, lora_state, train_lora
from site_interp.prompts import encode, left_pad

from conftest import toy_task


def _ids(bridge, texts):
    return left_pad([encode(bridge.tokenizer, t) for t in texts], 0)


def test_adapter_starts_as_identity_changes_every_position_and_is_removed(tiny):
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcd\nA:"])
    with torch.no_grad():
        base = tiny(ids, attention_mask=mask)
    cfg = LoraConfig(rank=2)
    with lora_adapter(tiny, cfg) as params:
        assert sum(p.numel() for p in params) == count_lora_params(tiny, cfg)
        assert all(p.requires_grad for p in params)
        with torch.no_grad():
            torch.testing.assert_close(tiny(ids, attention_mask=mask), base)  # B = 0 at init
            for p in params:
                p.add_(0.3 * torch.randn_like(p))
            changed = tiny(ids, attention_mask=mask)
        earlier = (changed - base)[:, :-1].abs().amax(-1)[mask[:, :-1]]
        assert earlier.max() > 0  # LoRA changes earlier positions too (unlike SITE): no prefix reuse
    with torch.no_grad():
        assert torch.equal(tiny(ids, attention_mask=mask), base)  # adapters gone, weights untouched
    assert not any("lora_" in n for n, _ in tiny.named_parameters())
    assert not any(p.requires_grad for p in tiny.parameters())


def test_parameter_count_formula(tiny_llama):
    cfg = tiny_llama.cfg
    n = count_lora_params(tiny_llama, LoraConfig(rank=8, targets=("q", "v")))
    q_out = cfg.n_heads * cfg.d_head
    v_out = cfg.n_key_value_heads * cfg.d_head if getattr(cfg, "n_key_value_heads", None) else q_out
    assert n == cfg.n_layers * 8 * ((cfg.d_model + q_out) + (cfg.d_model + v_out))


def test_training_lowers_valid_loss_and_is_seeded(tiny_llama):
    task = toy_task("lora_toy", n_train=40, n_valid=8)
    cfg = LoraConfig(rank=4, steps=30, batch_size=4, lr=1e-2, eval_every=10, n_valid=8)
    a = train_lora(tiny_llama, task, cfg, progress=False)
    assert a.best_valid_loss <= a.history[0]["valid_loss"]
    assert a.best_step > 0  # training helped on this learnable toy task
    assert a.n_params == count_lora_params(tiny_llama, LoraConfig(rank=4))
    b = train_lora(tiny_llama, task, cfg, progress=False)
    assert a.best_step == b.best_step
    for k in a.state:
        torch.testing.assert_close(a.state[k], b.state[k])


def test_saved_state_reproduces_the_adapted_model(tiny_llama):
    """The kept state, loaded again, is the trained model: it changes the outputs and gives back
    the validation loss recorded for its step."""
    from site_interp.prompts import zero_shot_batch
    from site_interp.scoring import LastTokenScorer

    task = toy_task("lora_toy", n_train=40, n_valid=8)
    cfg = LoraConfig(rank=4, steps=30, batch_size=4, lr=1e-2, eval_every=10, n_valid=8)
    res = train_lora(tiny_llama, task, cfg, progress=False)
    assert res.best_step > 0  # training helped: the kept state is not the initial identity adapter
    ids, mask = _ids(tiny_llama, ["Q: abc\nA:"])
    valid = LastTokenScorer(tiny_llama, [zero_shot_batch(tiny_llama, task, "valid", cfg.n_valid)], fast=False)
    with lora_adapter(tiny_llama, res.config, state=res.state):
        with torch.no_grad():
            one = tiny_llama(ids, attention_mask=mask)
        assert all(torch.equal(v, res.state[k]) for k, v in lora_state(tiny_llama).items())
        assert float(valid.mean_losses()[0]) == pytest.approx(res.best_valid_loss, rel=1e-5)
    with torch.no_grad():
        base = tiny_llama(ids, attention_mask=mask)
    assert not torch.allclose(one, base)
    assert float(valid.mean_losses()[0]) > res.best_valid_loss  # without the adapter: worse again


def test_unknown_target_is_a_clear_error(tiny_llama):
    with pytest.raises(ValueError, match=r"targets must name some of q, k, v, o; got unknown \['x'\]"):
        LoraConfig(targets=("x",))
