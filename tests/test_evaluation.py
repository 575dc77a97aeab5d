import pytest
import torch

from site_interp.evaluation import EvalConfig, Method, evaluate, exact_match, standard_methods


@pytest.mark.parametrize(
    "gen, target, cs, ok",
    [
        (" Paris\n\nQ:", "Paris", False, True),
        (" paris, France", "Paris", False, True),
        (" Parisian", "Paris", False, False),
        (" apple", "Apple", True, False),
        (" Apple", "Apple", True, True),
        ("", "x", False, False),
        (" 12", "1", False, False),
        (" New Delhi is", "New Delhi", False, True),
    ],
)
def test_exact_match(gen, target, cs, ok):
    assert exact_match(gen, target, cs) is ok


def test_evaluate_records_and_alpha_zero_equals_zero_shot(tiny, toy):
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    t = torch.randn(L, H, D)
    methods = standard_methods(t, torch.zeros(L, H), n_shots=2) + [Method("hard", alpha=torch.ones(L, H), t=t)]
    for em in (True, False):
        ev = evaluate(tiny, toy, methods, EvalConfig(n_test=6, n_shots=2, batch_size=4, exact_match=em, max_new_tokens=3), progress=False)
        df = ev.to_dataframe()
        assert len(df) == 6 * 4 and set(df["method"]) == {"0-shot", "2-shot ICL", "SITE", "hard"}
        zero = df[df.method == "0-shot"]["pred_token"].tolist()
        assert df[df.method == "SITE"]["pred_token"].tolist() == zero
        s = ev.summary()
        assert set(s["method"]) == set(df["method"]) and (s["n"] == 6).all()
        assert ("exact_match" in s) == em


@pytest.mark.parametrize("target", ["Paris", "New Delhi", "1", "13"])
@pytest.mark.parametrize(
    "gen", [" Paris", " Paris\n", " Parisian", " Paris, France", " New Delhi is", " 13", " 1", " 130", " paris x", "\nx"]
)
def test_early_stop_never_changes_the_outcome(gen, target):
    """Once decided, any continuation gives the same exact-match verdict."""
    from site_interp.evaluation import exact_match_decided

    for cut in range(len(gen) + 1):
        prefix = gen[:cut]
        if exact_match_decided(prefix, target):
            for cs in (True, False):
                assert exact_match(prefix, target, cs) == exact_match(gen, target, cs), (prefix, gen)


def test_token_budget_batching_gives_the_same_records(tiny, toy, monkeypatch):
    """Long prompts run in smaller batches (MAX_BATCH_TOKENS); the predictions must not change."""
    import site_interp.evaluation as evaluation

    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    methods = standard_methods(torch.randn(L, H, D), torch.rand(L, H), n_shots=2)
    cfg = EvalConfig(n_test=6, n_shots=2, batch_size=6, exact_match=False)
    whole = evaluate(tiny, toy, methods, cfg, progress=False).to_dataframe()
    monkeypatch.setattr(evaluation, "MAX_BATCH_TOKENS", 1)  # one row per forward
    split = evaluate(tiny, toy, methods, cfg, progress=False).to_dataframe()
    assert whole["pred_token"].tolist() == split["pred_token"].tolist()
    assert len(whole) == 6 * 3
