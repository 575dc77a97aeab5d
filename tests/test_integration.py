"""Real effects on the embedded model (gemma-3-270m, CPU): minutes, marked slow."""

import pytest
import torch

from site_interp.embeddings import EmbeddingConfig, compute_task_embedding
from site_interp.evaluation import EvalConfig, Method, evaluate
from site_interp.training import SiteConfig, train_site_many
from site_interp.tasks import builtin_task

pytestmark = pytest.mark.slow


def test_site_beats_zero_shot_on_held_out_queries(gemma):
    """Two tasks trained in one multi-task batch (the pipeline's path; one weight read per step for
    both), each evaluated on held-out queries."""
    tasks = [builtin_task(name) for name in ("country_capital", "first_letter")]
    embs = [compute_task_embedding(gemma, task, EmbeddingConfig(n_prompts=16, n_shots=10, batch_size=8), progress=False)
            for task in tasks]
    results = train_site_many(gemma, tasks, embs, SiteConfig(steps=40, batch_size=4, eval_every=20, n_valid=32),
                              progress=False)
    for task, emb, res in zip(tasks, embs, results):
        ev = evaluate(gemma, task, [Method("0-shot"), Method("SITE", alpha=res.alpha, t=emb.t)],
                      EvalConfig(n_test=32, exact_match=False), progress=False)
        zero, site = ev.accuracy("0-shot"), ev.accuracy("SITE")
        print(f"{task.name}: 0-shot {zero:.2f}, SITE {site:.2f}, best step {res.best_step}")
        assert site >= zero + 0.4, (task.name, zero, site)
        # the task embedding alone (uniform alpha 1 everywhere) is not what does it: selection matters
        assert res.alpha.std() > 0.05


def test_padding_and_prefix_cache_exact_on_gemma(gemma):
    from site_interp.prefix_cache import build_prefix_cache
    from site_interp.scoring import last_token_logits
    from site_interp.prompts import encode

    prompts = ["Q: France\nA:", "Q: a much longer question here\nA:", "Q: x\nA: y\n\nQ: z\nA:"]
    ids = [encode(gemma.tokenizer, p) for p in prompts]
    with torch.no_grad():
        batched = last_token_logits(gemma, ids)
        single = torch.cat([last_token_logits(gemma, [i]) for i in ids])
        hf = torch.stack([gemma.original_model(torch.tensor([i])).logits[0, -1] for i in ids])
        fast = last_token_logits(gemma, prefix=build_prefix_cache(gemma, ids))
    assert (batched - single).abs().max() < 1e-3
    assert (single - hf).abs().max() < 1e-3
    assert (fast - batched).abs().max() < 1e-3


def test_exact_match_generation_on_gemma(gemma):
    task = builtin_task("capitalize")
    ev = evaluate(gemma, task, [Method("10-shot ICL", n_shots=10)], EvalConfig(n_test=16, batch_size=16), progress=False)
    df = ev.to_dataframe()
    assert df["exact_match"].mean() >= 0.7, df[["target", "generation"]]
