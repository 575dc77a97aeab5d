import pytest
import torch

from site_interp.evaluation import EvalConfig, Method, evaluate
from site_interp.patching import PatchConfig, default_ks, head_mask, patching_study

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


def test_patching_study_known_answers(tiny):
    task = toy_task()
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    torch.manual_seed(1)
    t, alpha = 3 * torch.randn(L, H, D), torch.rand(L, H)
    n_heads = L * H
    cfg = PatchConfig(ks=(0, 2, n_heads), n_random=3, n_test=8, chunk=10)
    res = patching_study(tiny, task, t, alpha, cfg, progress=False)
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


def test_patching_exact_match_mode(tiny_llama):
    task = toy_task()
    L, H, D = tiny_llama.cfg.n_layers, tiny_llama.cfg.n_heads, tiny_llama.cfg.d_head
    res = patching_study(tiny_llama, task, torch.randn(L, H, D), torch.rand(L, H),
                         PatchConfig(ks=(1,), modes=("patch",), n_random=1, n_test=4, metric="exact_match", max_new_tokens=2),
                         progress=False)
    assert len(res.to_dataframe()) == 3 * 4
