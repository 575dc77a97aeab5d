import pytest
import torch

from site_interp.hooks import capture_hooks, injection_hooks, make_capture_hook, make_soft_injection_hook, z_name


def _z(batch=3, pos=5, heads=4, d=6):
    return torch.randn(batch, pos, heads, d)


def test_alpha_zero_is_identity_and_one_is_replacement():
    z, t = _z(), torch.randn(4, 6)
    out0 = make_soft_injection_hook(torch.zeros(4), t)(z, hook=None)
    assert torch.equal(out0, z)
    out1 = make_soft_injection_hook(torch.ones(4), t)(z, hook=None)
    assert torch.allclose(out1[:, -1], t.expand(3, 4, 6))
    assert torch.equal(out1[:, :-1], z[:, :-1])


def test_soft_mix_only_at_last_position():
    z, t = _z(), torch.randn(4, 6)
    alpha = torch.tensor([0.0, 0.25, 0.5, 1.0])
    out = make_soft_injection_hook(alpha, t)(z, hook=None)
    expected = (1 - alpha[None, :, None]) * z[:, -1] + alpha[None, :, None] * t[None]
    assert torch.allclose(out[:, -1], expected)
    assert torch.equal(out[:, :-1], z[:, :-1])


def test_hook_is_out_of_place():
    z, t = _z(), torch.randn(4, 6)
    before = z.clone()
    out = make_soft_injection_hook(torch.full((4,), 0.7), t)(z, hook=None)
    assert torch.equal(z, before)
    assert out.data_ptr() != z.data_ptr()


def test_per_row_alpha_and_ragged_positions():
    z = _z(batch=2)
    alpha = torch.stack([torch.zeros(4), torch.ones(4)])
    t = torch.randn(2, 4, 6)
    out = make_soft_injection_hook(alpha, t, positions=torch.tensor([1, 3]))(z, hook=None)
    assert torch.equal(out[0], z[0])  # row 0: alpha 0
    assert torch.allclose(out[1, 3], t[1])
    mask = torch.ones(5, dtype=torch.bool)
    mask[3] = False
    assert torch.equal(out[1, mask], z[1, mask])


def test_gradient_reaches_alpha_and_matches_finite_differences():
    z, t = _z(), torch.randn(4, 6)
    w = torch.randn_like(z)
    alpha = torch.full((4,), 0.3, requires_grad=True)
    f = lambda a: (make_soft_injection_hook(a, t)(z, hook=None) * w).sum()  # noqa: E731
    f(alpha).backward()
    eps = 1e-3
    for h in range(4):
        d = torch.zeros(4)
        d[h] = eps
        fd = (f(alpha.detach() + d) - f(alpha.detach() - d)) / (2 * eps)
        assert alpha.grad[h].item() == pytest.approx(fd.item(), rel=1e-2, abs=1e-3)


def test_capture_hook_records_last_position_without_change():
    z, store = _z(), {}
    out = make_capture_hook(store, 3)(z, hook=None)
    assert out is z
    assert torch.equal(store[3], z[:, -1])


def test_injection_hooks_cover_layers_with_tl_names():
    hooks = injection_hooks(torch.rand(3, 4), torch.randn(3, 4, 6))
    assert [name for name, _ in hooks] == [z_name(layer) for layer in range(3)]
    assert z_name(2) == "blocks.2.attn.hook_z"
    assert len(capture_hooks(3, {})) == 3


def test_hooks_change_model_output_only_at_alpha_nonzero(tiny):
    from site_interp.scoring import last_token_logits
    from site_interp.prompts import encode

    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    ids = [encode(tiny.tokenizer, "Q: ab\nA:")]
    t = torch.randn(L, H, D)
    with torch.no_grad():
        base = last_token_logits(tiny, ids)
        same = last_token_logits(tiny, ids, injection_hooks(torch.zeros(L, H), t))
        diff = last_token_logits(tiny, ids, injection_hooks(torch.ones(L, H), t))
    assert torch.allclose(base, same, atol=1e-6)
    assert (base - diff).abs().max() > 1e-3


def test_gradients_reach_logits_through_the_model(tiny):
    from site_interp.scoring import last_token_logits
    from site_interp.prompts import encode

    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    logit = torch.zeros(L, H, requires_grad=True)
    out = last_token_logits(tiny, [encode(tiny.tokenizer, "Q: ab\nA:")], injection_hooks(torch.sigmoid(logit), torch.randn(L, H, D)))
    out[0, 5].backward()
    assert logit.grad is not None and logit.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.parameters())
