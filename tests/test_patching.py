import pytest
import torch

from site_interp.evaluation import EvalConfig, Method, evaluate
from site_interp.studies.patching import PatchConfig, default_ks, head_mask, patching_sweep

from conftest import toy_task


def test_default_ks():
    assert default_ks(72, 30) == [1, 2, 4, 8, 16, 30, 32, 64, 72]
    assert default_ks(8) == [1, 2, 4, 8]


def test_head_masks():
    alpha = torch.tensor([[0.9, 0.1], [0.5, 0.7]])
    assert head_mask(alpha, "top", 2).tolist() == [[True, False], [False, True]]
    assert head_mask(alpha, "bottom", 1).tolist() == [[False, True], [False, False]]
    r = head_mask(alpha, "random", 3, seed=4)
    assert r.sum() == 3 and torch.equal(r, head_mask(alpha, "random", 3, seed=4))
    with pytest.raises(ValueError):
        head_mask(alpha, "top", 5)
    with pytest.raises(ValueError, match="unknown selection"):
        head_mask(alpha, "middle", 1)


def _acc(ev, m):
    return 100 * ev.accuracy(m)


def test_patching_sweep_known_answers(tiny):
    task = toy_task()
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    torch.manual_seed(1)
    t, alpha = 3 * torch.randn(L, H, D), torch.rand(L, H)
    n_heads = L * H
    cfg = PatchConfig(ks=(0, 2, n_heads), n_random=3, n_test=8, chunk=10)
    res = patching_sweep(tiny, task, t, alpha, cfg, progress=False)
    df = res.to_dataframe()
    n_configs = 3 * (2 + 3) + 3  # ks x (top, bottom, 3 random) + ablate per k
    assert len(df) == n_configs * 8
    ev = evaluate(tiny, task, [Method("0-shot"), Method("SITE", alpha=alpha, t=t), Method("all", alpha=torch.ones(L, H), t=t)],
                  EvalConfig(n_test=8, exact_match=False), progress=False)
    assert res.references["0-shot"] == pytest.approx(_acc(ev, "0-shot"))
    assert res.references["SITE"] == pytest.approx(_acc(ev, "SITE"))
    s = res.summary().set_index(["selection", "k"])
    assert s.loc[("top", 0), "accuracy"] == pytest.approx(_acc(ev, "0-shot"))  # patching nothing = 0-shot
    assert s.loc[("top", n_heads), "accuracy"] == pytest.approx(_acc(ev, "all"))  # every head = alpha 1
    assert s.loc[("bottom", n_heads), "accuracy"] == s.loc[("top", n_heads), "accuracy"]
    assert s.loc[("ablate_top", 0), "accuracy"] == pytest.approx(_acc(ev, "SITE"))  # ablating nothing = SITE
    assert s.loc[("random", 2), "n_seeds"] == 3
    assert (s["lo"] <= s["accuracy"] + 1e-9).all() and (s["accuracy"] <= s["hi"] + 1e-9).all()


def test_patching_exact_match_mode_scores_each_configuration_by_its_own_generation(tiny_llama):
    """Exact-match mode: every (configuration, query) row is the exact match of a greedy
    generation under that configuration's hooks, computed here independently. The targets are
    what the all-heads patch generates for half the queries, so the rows are not all False."""
    from site_interp.evaluation import exact_match
    from site_interp.generation import greedy_generate
    from site_interp.hooks import injection_hooks
    from site_interp.prompts import build_prompts

    task = toy_task()
    L, H, D = tiny_llama.cfg.n_layers, tiny_llama.cfg.n_heads, tiny_llama.cfg.d_head
    torch.manual_seed(3)
    t, alpha = 3 * torch.randn(L, H, D), torch.rand(L, H)
    queries = task.train[:6]
    ids = build_prompts(tiny_llama.tokenizer, queries).token_ids
    decode = lambda g: tiny_llama.tokenizer.decode(g, skip_special_tokens=True)  # noqa: E731
    patched_all = [decode(g) for g in greedy_generate(tiny_llama, ids, injection_hooks(torch.ones(L, H), t),
                                                      max_new_tokens=3)]
    lines = [(g.strip().splitlines() or [""])[0] for g in patched_all]
    task.test = [{"input": q["input"], "output": (lines[i] if i < 3 and lines[i] else "zz~")}
                 for i, q in enumerate(queries)]
    cfg = PatchConfig(ks=(1, L * H), modes=("patch",), n_random=1, n_test=6, metric="exact_match", max_new_tokens=3)
    df = patching_sweep(tiny_llama, task, t, alpha, cfg, progress=False).to_dataframe()
    assert len(df) == 2 * 3 * 6
    for selection, k in [("top", 1), ("bottom", 1), ("top", L * H)]:
        mask = head_mask(alpha, selection, k).float()
        gens = greedy_generate(tiny_llama, ids, injection_hooks(mask, t), max_new_tokens=3)
        want = [exact_match(decode(g), e["output"]) for g, e in zip(gens, task.test)]
        got = df[(df.selection == selection) & (df.k == k)].sort_values("query_index")["correct"].tolist()
        assert got == want, (selection, k)
    all_heads = df[(df.selection == "top") & (df.k == L * H)].sort_values("query_index")["correct"].tolist()
    assert all_heads[:3] == [bool(x) for x in lines[:3]] and any(all_heads)
