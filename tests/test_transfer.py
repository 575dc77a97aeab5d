import pytest
import torch

from site_interp.evaluation import EvalConfig, Method, evaluate
from site_interp.studies.transfer import transfer_matrix

from conftest import toy_task


def test_transfer_diagonal_is_own_alpha_accuracy(tiny):
    tasks = [toy_task("a"), toy_task("b", n_train=30)]
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    torch.manual_seed(2)
    embs = {t.name: 3 * torch.randn(L, H, D) for t in tasks}
    alphas = {t.name: torch.rand(L, H) for t in tasks}
    res = transfer_matrix(tiny, tasks, embs, alphas, n_test=6, chunk=7, progress=False)
    m = res.matrix
    assert list(m.index) == ["a", "b"] and list(m.columns) == ["a", "b"]
    for src in tasks:
        for tgt in tasks:
            ev = evaluate(tiny, tgt, [Method("x", alpha=alphas[src.name], t=embs[tgt.name])],
                          EvalConfig(n_test=6, exact_match=False), progress=False)
            assert m.loc[src.name, tgt.name] == pytest.approx(100 * ev.accuracy("x"))
    zero = evaluate(tiny, tasks[1], [Method("0-shot")], EvalConfig(n_test=6, exact_match=False), progress=False)
    assert res.references.loc["0-shot", "b"] == pytest.approx(100 * zero.accuracy("0-shot"))
    norm = res.normalized()
    for name in ("a", "b"):
        if m.loc[name, name] > 0:
            assert norm.loc[name, name] == pytest.approx(1.0)
    s = res.diagonal_summary()
    assert s["diagonal_mean"] == pytest.approx((m.loc["a", "a"] + m.loc["b", "b"]) / 2)


def test_missing_alphas_is_a_clear_error(tiny_llama):
    with pytest.raises(KeyError, match="train them first"):
        transfer_matrix(tiny_llama, [toy_task("a")], {}, {}, progress=False)
