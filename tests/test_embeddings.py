import torch

from site_interp.embeddings import EmbeddingConfig, compute_task_embedding
from site_interp.prompts import icl_prompt_batch
from site_interp.hooks import z_name


def test_embedding_is_the_mean_of_last_token_z(tiny, toy):
    cfg = EmbeddingConfig(n_prompts=5, n_shots=3, batch_size=2, seed=1)
    emb = compute_task_embedding(tiny, toy, cfg, progress=False)
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    assert emb.t.shape == (L, H, D)
    # by hand: one prompt at a time, run_with_cache, take z at the last position, average
    batch = icl_prompt_batch(tiny.tokenizer, toy, 5, 3, 1)
    acc = torch.zeros(L, H, D)
    for ids in batch.token_ids:
        _, cache = tiny.run_with_cache(torch.tensor([ids]))
        acc += torch.stack([cache[z_name(layer)][0, -1] for layer in range(L)])
    assert torch.allclose(emb.t, acc / 5, atol=1e-5)


def test_embedding_prompts_are_seeded_and_exclude_query(tiny_llama, toy):
    a = icl_prompt_batch(tiny_llama.tokenizer, toy, 6, 4, 0)
    assert a.texts == icl_prompt_batch(tiny_llama.tokenizer, toy, 6, 4, 0).texts
    assert a.texts != icl_prompt_batch(tiny_llama.tokenizer, toy, 6, 4, 1).texts
    for text in a.texts:
        blocks = text.split("\n\n")
        query = blocks[-1].split("\n")[0]
        assert all(not b.startswith(query + "\n") for b in blocks[:-1])


def test_embedding_pass_also_yields_the_task_vectors(tiny, toy):
    from site_interp.baselines import TaskVectorConfig, extract_task_vectors

    cfg = EmbeddingConfig(n_prompts=5, n_shots=3, batch_size=2, seed=1)
    emb = compute_task_embedding(tiny, toy, cfg, progress=False)
    tv = extract_task_vectors(tiny, toy, TaskVectorConfig(n_prompts=5, n_shots=3, extract_batch_size=5, seed=1))
    assert emb.resid is not None and emb.resid.shape == (tiny.cfg.n_layers, tiny.cfg.d_model)
    assert torch.allclose(emb.resid, tv, atol=1e-5)
    other = extract_task_vectors(tiny, toy, TaskVectorConfig(n_prompts=5, n_shots=3, seed=2))
    assert not torch.allclose(emb.resid, other, atol=1e-3)  # the check can fail: other prompts differ


def test_pipeline_artifact_keeps_the_residual(tiny_llama, toy, tmp_path):
    from site_interp.pipeline import RunConfig, get_embedding

    cfg = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=2))
    made, computed = get_embedding(tiny_llama, toy, cfg, tmp_path, progress=False)
    loaded, recomputed = get_embedding(tiny_llama, toy, cfg, tmp_path, progress=False)
    assert computed and not recomputed
    assert torch.equal(made.resid, loaded.resid) and torch.equal(made.t, loaded.t)
