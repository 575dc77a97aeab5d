"""Function-vector and task-vector baselines on the tiny in-memory bridges."""

import pytest
import torch

from site_interp.baselines import (
    FunctionVectorConfig,
    LayerScan,
    TaskVectorConfig,
    average_indirect_effect,
    default_n_heads,
    evaluate_steering,
    extract_task_vectors,
    fit_function_vector,
    fit_task_vector,
    function_vector_from_heads,
    post_attention_norm,
    function_vector_hooks,
    head_output_matrix,
    scan_layers,
    shuffled_label_prompts,
    task_vector_hooks,
    top_heads,
)
from site_interp.evaluation import EvalConfig, Method, evaluate
from site_interp.hooks import capture_hooks, make_capture_hook, make_soft_injection_hook, resid_name, stack_captured, z_name
from site_interp.scoring import LastTokenScorer
from site_interp.prompts import PromptTemplate, encode, left_pad
from site_interp.prompts import zero_shot_batch
from site_interp.tasks import Task, TaskError

from conftest import toy_task

FV_CFG = FunctionVectorConfig(n_prompts=6, n_shots=3, n_aie_prompts=4, n_valid=6, batch_size=16)
TV_CFG = TaskVectorConfig(n_prompts=6, n_shots=3, n_valid=6, batch_size=16)


def _grab(store, key=0):
    """A hook that records the whole activation into ``store[key]`` and changes nothing."""

    def hook(x, hook=None):
        store[key] = x
        return x

    return hook


def _ids(bridge, texts):
    return left_pad([encode(bridge.tokenizer, s) for s in texts], 0)


def _distinct_task():
    """Every output distinct (reversed two-letter inputs): a label derangement breaks every demo."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pairs = [{"input": a + b, "output": b + a} for a, b in zip(letters, reversed(letters)) if a < b]
    return Task("rev", pairs[:10], pairs[10:12], pairs[12:13])


# ---------------------------------------------------------------- hooks


def test_resid_hook_name_exists_and_edits_logits(tiny):
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcd\nA:"])
    base = tiny(ids, attention_mask=mask)
    for layer in range(tiny.cfg.n_layers):
        assert resid_name(layer) == f"blocks.{layer}.hook_resid_pre"
        assert resid_name(layer) in tiny.hook_dict
        vec = torch.randn(tiny.cfg.d_model) * 5
        out = tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=function_vector_hooks(vec, layer))
        assert not torch.allclose(out[:, -1], base[:, -1])
        real = mask[:, :-1].bool()  # padding attends to nothing real: its values are meaningless
        assert torch.equal(out[:, :-1][real], base[:, :-1][real])  # causal: earlier tokens untouched


@pytest.mark.parametrize("kind", ["fv", "tv"])
def test_interventions_change_only_last_position(tiny, kind):
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcdef\nA:"])
    layer = tiny.cfg.n_layers - 1
    vec = torch.randn(tiny.cfg.d_model)
    hooks = function_vector_hooks(vec, layer) if kind == "fv" else task_vector_hooks(vec, layer)
    plain, after, final0, final1 = {}, {}, {}, {}
    tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=[(resid_name(layer), _grab(plain)), ("ln_final.hook_in", _grab(final0))])
    # the residual after the edit: hooks on one point run in order
    tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=hooks + [(resid_name(layer), _grab(after)), ("ln_final.hook_in", _grab(final1))])
    x0, x1 = plain[0], after[0]
    assert torch.equal(x1[:, :-1], x0[:, :-1])
    expected = x0[:, -1] + vec if kind == "fv" else vec.expand(2, -1)
    torch.testing.assert_close(x1[:, -1], expected)
    real = mask[:, :-1].bool()  # (padding attends to nothing real: its values are meaningless)
    assert torch.equal(final1[0][:, :-1][real], final0[0][:, :-1][real])
    assert not torch.allclose(final1[0][:, -1], final0[0][:, -1])


def test_zero_function_vector_is_identity(tiny):
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcd\nA:"])
    base = tiny(ids, attention_mask=mask)
    for layer in range(tiny.cfg.n_layers):
        out = tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=function_vector_hooks(torch.zeros(tiny.cfg.d_model), layer))
        assert torch.equal(out, base)


def test_head_output_projection_matches_attention_output(tiny):
    """z[h] @ W_O[l, h] is exactly the change of the attention output when only head h changes."""
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcd\nA:"])
    cfg = tiny.cfg
    for layer in range(cfg.n_layers):
        w_o = head_output_matrix(tiny, layer)
        assert w_o.shape == (cfg.n_heads, cfg.d_head, cfg.d_model)
        for head in range(cfg.n_heads):
            delta = torch.randn(2, cfg.d_head)

            def bump(z, hook=None, head=head, delta=delta):
                new = z.clone()
                new[:, -1, head] = new[:, -1, head] + delta
                return new

            outs = []
            for hooks in ([], [(z_name(layer), bump)]):
                store = {}
                hooks = hooks + [(f"blocks.{layer}.attn.hook_out", _grab(store))]
                tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=hooks)
                outs.append(store[0])
            diff = outs[1] - outs[0]
            torch.testing.assert_close(diff[:, -1], delta @ w_o[head], atol=1e-5, rtol=1e-4)
            assert torch.equal(diff[:, :-1], torch.zeros_like(diff[:, :-1]))


def test_function_vector_sums_projected_heads(tiny):
    cfg = tiny.cfg
    t = torch.randn(cfg.n_layers, cfg.n_heads, cfg.d_head)
    heads = [(0, 1), (cfg.n_layers - 1, 3)]
    fv = function_vector_from_heads(tiny, t, heads)
    assert fv.shape == (cfg.d_model,)
    parts = [t[l, h] @ head_output_matrix(tiny, l)[h] for l, h in heads]
    if post_attention_norm(tiny, 0) is None:  # llama: the plain sum of projections
        torch.testing.assert_close(fv, sum(parts))
    else:  # gemma: each part scaled per channel by the norm's gain / the layer's mean-output RMS
        assert not torch.allclose(fv, sum(parts), atol=1e-3)
    with pytest.raises(ValueError, match="shape"):
        function_vector_from_heads(tiny, t[:, :2], heads)


def test_function_vector_of_a_whole_layer_is_what_attention_adds_to_the_residual(tiny):
    """Known answer from the model itself: force z = t[layer] at the last token and read
    resid_mid - resid_pre there (Gemma's post-attention norm included)."""
    cfg = tiny.cfg
    t = torch.randn(cfg.n_layers, cfg.n_heads, cfg.d_head)
    layer = 1
    fv = function_vector_from_heads(tiny, t, [(layer, h) for h in range(cfg.n_heads)])
    ids, mask = _ids(tiny, ["Q: ab\nA:", "Q: abcd\nA:"])

    def force(z, hook=None):
        new = z.clone()
        new[:, -1] = t[layer].to(z.dtype)
        return new

    pre, mid = {}, {}
    tiny.run_with_hooks(ids, attention_mask=mask, fwd_hooks=[
        (z_name(layer), force), (f"blocks.{layer}.hook_resid_pre", _grab(pre)), (f"blocks.{layer}.hook_resid_mid", _grab(mid)),
    ])
    added = (mid[0] - pre[0])[:, -1]
    torch.testing.assert_close(added, fv.expand_as(added), atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------- indirect effect


def test_shuffled_label_prompts_break_every_mapping(tiny_llama):
    task = _distinct_task()
    truth = {e["input"]: e["output"] for e in task.train}
    batch = shuffled_label_prompts(tiny_llama.tokenizer, task, 5, 4, seed=0)
    assert len(batch) == 5
    for text, target in zip(batch.texts, batch.targets):
        *demos, query = text.split("\n\n")
        pairs = [(d.split("\n")[0][3:], d.split("\n")[1][3:]) for d in demos]
        assert len(pairs) == 4
        assert all(truth[x] != y for x, y in pairs)  # every demo's label is wrong
        assert sorted(y for _, y in pairs) == sorted(truth[x] for x, _ in pairs)  # a permutation
        assert target == truth[query.split("\n")[0][3:]]
    again = shuffled_label_prompts(tiny_llama.tokenizer, task, 5, 4, seed=0)
    other = shuffled_label_prompts(tiny_llama.tokenizer, task, 5, 4, seed=1)
    assert again.texts == batch.texts and other.texts != batch.texts
    with pytest.raises(ValueError, match="at least 2 shots"):
        shuffled_label_prompts(tiny_llama.tokenizer, task, 5, 1, seed=0)
    with pytest.raises(TaskError, match="demonstrations"):
        shuffled_label_prompts(tiny_llama.tokenizer, task, 5, 10, seed=0)


def _own_activations(bridge, prompts):
    ids, mask = left_pad(prompts.token_ids, 0)
    store = {}
    bridge.run_with_hooks(ids, attention_mask=mask, fwd_hooks=capture_hooks(bridge.cfg.n_layers, store))
    return stack_captured(store, bridge.cfg.n_layers)  # [prompt, layer, head, d_head]


@pytest.mark.parametrize("fast", [True, False])
def test_aie_is_zero_when_patching_own_activations(tiny, fast):
    task = toy_task()
    cfg = FunctionVectorConfig(n_shots=3, n_aie_prompts=3, batch_size=7, fast=fast)
    prompts = shuffled_label_prompts(tiny.tokenizer, task, 3, 3, seed=0)
    own = _own_activations(tiny, prompts)
    aie = average_indirect_effect(tiny, task, own, cfg, prompts=prompts)
    assert aie.shape == (tiny.cfg.n_layers, tiny.cfg.n_heads)
    assert aie.abs().max() < 1e-6
    # control: other patch values do move the probabilities
    noisy = average_indirect_effect(tiny, task, own + 3 * torch.randn_like(own), cfg, prompts=prompts)
    assert noisy.abs().max() > 1e-4


def test_aie_matches_slow_explicit_loop(tiny):
    task = toy_task()
    cfg = FunctionVectorConfig(n_shots=3, n_aie_prompts=3, batch_size=5)
    prompts = shuffled_label_prompts(tiny.tokenizer, task, 3, 3, seed=0)
    n_layers, n_heads = tiny.cfg.n_layers, tiny.cfg.n_heads
    t = 3 * torch.randn(n_layers, n_heads, tiny.cfg.d_head)
    fast = average_indirect_effect(tiny, task, t, cfg, prompts=prompts)

    def prob(ids, target, hooks):
        logits = tiny.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)[0, -1]
        return torch.softmax(logits.float(), -1)[target]

    slow = torch.zeros(n_layers, n_heads)
    for ids, target in zip(prompts.token_ids, prompts.target_ids.tolist()):
        base = prob(ids, target, [])
        for layer in range(n_layers):
            for head in range(n_heads):
                alpha = torch.nn.functional.one_hot(torch.tensor(head), n_heads).float()
                hooks = [(z_name(layer), make_soft_injection_hook(alpha, t[layer]))]
                slow[layer, head] += (prob(ids, target, hooks) - base) / len(prompts)
    assert slow.abs().max() > 1e-4
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-4)


def test_top_heads_and_default_count():
    aie = torch.tensor([[0.1, 0.5, -0.2], [0.5, 0.0, 0.3]])
    assert top_heads(aie, 3) == [(0, 1), (1, 0), (1, 2)]
    assert default_n_heads(2, 4) == 4
    assert default_n_heads(1, 2) == 2
    assert default_n_heads(28, 16) == 9
    assert default_n_heads(32, 32) == 20


# ---------------------------------------------------------------- fitting and layer choice


@pytest.fixture(scope="module")
def fitted():
    from site_interp.loading import tiny_bridge

    bridge = tiny_bridge("gemma3", n_kv_heads=1)
    task = toy_task()
    return bridge, task, fit_function_vector(bridge, task, FV_CFG), fit_task_vector(bridge, task, TV_CFG)


def test_fit_shapes_and_tables(fitted):
    bridge, task, fv, tv = fitted
    cfg = bridge.cfg
    assert fv.aie.shape == (cfg.n_layers, cfg.n_heads)
    assert fv.vector.shape == (cfg.d_model,)
    assert len(fv.top_heads) == default_n_heads(cfg.n_layers, cfg.n_heads) and fv.aie_tasks == [task.name]
    assert fv.aie[fv.top_heads[-1]] >= max(fv.aie[l, h] for l in range(cfg.n_layers) for h in range(cfg.n_heads)
                                           if (l, h) not in fv.top_heads)
    assert fv.layers == list(range(cfg.n_layers)) and fv.valid_accuracy.shape == (cfg.n_layers,)
    assert fv.to_dataframe()["chosen"].sum() == 1
    heads = fv.heads_dataframe()
    assert len(heads) == cfg.n_layers * cfg.n_heads and heads["selected"].sum() == len(fv.top_heads)
    assert tv.vectors.shape == (cfg.n_layers, cfg.d_model) and tv.vector.shape == (cfg.d_model,)
    assert list(tv.to_dataframe()["layer"]) == tv.layers


def _best(acc, prob, layers):
    top = max(range(len(layers)), key=lambda k: (float(acc[k]), float(prob[k])))
    return layers[top]


def test_layer_choice_is_argmax_of_reported_scores(fitted):
    _, _, fv, tv = fitted
    for res in (fv, tv):
        assert res.layer == _best(res.valid_accuracy, res.valid_target_prob, res.layers)
    scan = LayerScan(layers=[3, 5, 7], accuracy=torch.tensor([0.5, 0.7, 0.7]), target_prob=torch.tensor([0.9, 0.2, 0.3]))
    assert scan.best == 7


@pytest.mark.parametrize("kind", ["fv", "tv"])
def test_layer_scan_equals_each_layer_alone(fitted, kind):
    """The batched scan (all layers in shared batches, cached prefix) = one layer at a time, full prompts."""
    bridge, task, fv, tv = fitted
    res = fv if kind == "fv" else tv
    valid = zero_shot_batch(bridge, task, "valid", FV_CFG.n_valid)
    for k, layer in enumerate(res.layers):
        vec = fv.vector if kind == "fv" else tv.vectors[layer]
        hooks = function_vector_hooks(vec, layer) if kind == "fv" else task_vector_hooks(vec, layer)
        alone = LastTokenScorer(bridge, [valid], fast=False).score(hooks_for=lambda idx, hooks=hooks: hooks, chunk=4)
        assert float(alone.correct.float().mean()) == pytest.approx(float(res.valid_accuracy[k]))
        assert float(alone.prob.mean()) == pytest.approx(float(res.valid_target_prob[k]), abs=1e-6)


def test_layer_scan_finds_a_layer_that_answers(tiny_llama):
    """A vector that forces the answer at one layer only must be picked (accuracy 1 there)."""
    task = toy_task()
    valid = zero_shot_batch(tiny_llama, task, "valid", 6)
    store = {}
    ids, mask = left_pad(zero_shot_batch(tiny_llama, task, "train", 1).token_ids, 0)
    tiny_llama.run_with_hooks(ids, attention_mask=mask, fwd_hooks=[(resid_name(0), make_capture_hook(store, 0))])
    # replace the last-layer input by a state read off a direction that favours one token
    target = int(valid.target_ids[0])
    w_u = tiny_llama.W_U[:, target].detach()
    vectors = torch.stack([store[0][0], 200 * w_u / w_u.norm()])
    scan = scan_layers(tiny_llama, valid, vectors, [0, tiny_llama.cfg.n_layers - 1], "replace")
    same = float((valid.target_ids == target).float().mean())
    assert float(scan.accuracy[1]) >= same > 0
    assert scan.best == tiny_llama.cfg.n_layers - 1
    with pytest.raises(ValueError, match="out of range"):
        scan_layers(tiny_llama, valid, vectors, [0, 99], "replace")


def test_fit_is_deterministic(tiny_llama):
    task = toy_task()
    a = fit_function_vector(tiny_llama, task, FV_CFG)
    b = fit_function_vector(tiny_llama, task, FV_CFG)
    assert torch.equal(a.aie, b.aie) and torch.equal(a.vector, b.vector) and a.layer == b.layer
    c = fit_function_vector(tiny_llama, task, FunctionVectorConfig(**{**FV_CFG.to_dict(), "seed": 1}))
    assert not torch.equal(a.aie, c.aie)
    assert torch.equal(extract_task_vectors(tiny_llama, task, TV_CFG), extract_task_vectors(tiny_llama, task, TV_CFG))


def test_shared_ranking_over_tasks(tiny_llama):
    task, other = toy_task(), toy_task("toy2", n_train=30)
    one = fit_function_vector(tiny_llama, task, FV_CFG)
    two = fit_function_vector(tiny_llama, other, FV_CFG)
    both = fit_function_vector(tiny_llama, task, FV_CFG, aie_tasks=[task, other])
    assert both.aie_tasks == ["toy", "toy2"]
    torch.testing.assert_close(both.aie, (one.aie + two.aie) / 2)
    given = fit_function_vector(tiny_llama, task, FV_CFG, aie=both.aie, embedding=torch.zeros(2, 4, 16))
    assert given.aie_tasks == ["<given>"] and given.top_heads == both.top_heads
    assert torch.equal(given.vector, torch.zeros(tiny_llama.cfg.d_model))


def test_task_vector_is_mean_of_per_prompt_states(tiny):
    from site_interp.prompts import icl_prompt_batch

    task = toy_task()
    vectors = extract_task_vectors(tiny, task, TaskVectorConfig(n_prompts=5, n_shots=3, extract_batch_size=2))
    batch = icl_prompt_batch(tiny.tokenizer, task, 5, 3, 0)
    manual = torch.zeros_like(vectors)
    for ids in batch.token_ids:
        store = {}
        hooks = [(resid_name(l), make_capture_hook(store, l)) for l in range(tiny.cfg.n_layers)]
        tiny.run_with_hooks(torch.tensor([ids]), fwd_hooks=hooks)
        manual += torch.stack([store[l][0] for l in range(tiny.cfg.n_layers)]) / 5
    torch.testing.assert_close(vectors, manual, atol=1e-5, rtol=1e-4)


def test_clear_errors(tiny_llama):
    small = toy_task(n_train=3)
    with pytest.raises(TaskError, match="demonstrations"):
        fit_task_vector(tiny_llama, small, TV_CFG)
    with pytest.raises(TaskError, match="demonstrations"):
        fit_function_vector(tiny_llama, small, FV_CFG)
    with pytest.raises(ValueError, match="n_heads"):
        fit_function_vector(tiny_llama, toy_task(), FunctionVectorConfig(**{**FV_CFG.to_dict(), "n_heads": 0}),
                            aie=torch.zeros(2, 4), embedding=torch.zeros(2, 4, 16))
    with pytest.raises(ValueError, match="shape"):
        average_indirect_effect(tiny_llama, toy_task(), torch.zeros(2, 4, 8), FV_CFG)
    with pytest.raises(ValueError, match="vectors have shape"):
        fit_task_vector(tiny_llama, toy_task(), TV_CFG, vectors=torch.zeros(3, 64))


# ---------------------------------------------------------------- evaluation


def test_evaluation_reuses_the_evaluate_loop(fitted):
    bridge, task, fv, tv = fitted
    cfg = EvalConfig(n_test=6, exact_match=False)
    ev = evaluate_steering(bridge, task, fv, cfg, name="FV")
    assert len(ev.records) == 6 and {r["method"] for r in ev.records} == {"FV"}
    assert 0.0 <= ev.accuracy("FV") <= 1.0
    ev_tv = evaluate_steering(bridge, task, tv, EvalConfig(n_test=6, exact_match=True, max_new_tokens=3), name="TV")
    assert all(r["generation"] is not None for r in ev_tv.records)
    # the same hooks through `evaluate`, beside 0-shot: a zero FV changes nothing
    zero = Method("zero FV", fwd_hooks=tuple(function_vector_hooks(torch.zeros(bridge.cfg.d_model), 1)))
    for exact in (False, True):
        both = evaluate(bridge, task, [Method("0-shot"), zero, tv.method("TV")],
                        EvalConfig(n_test=6, exact_match=exact, max_new_tokens=3), progress=False)
        df = both.to_dataframe()
        a, b = df[df.method == "0-shot"], df[df.method == "zero FV"]
        assert list(a.pred_token) == list(b.pred_token) and list(a.generation) == list(b.generation)


def test_template_is_respected(tiny_llama):
    task = _distinct_task()
    template = PromptTemplate(query="In: {input}\nOut:")
    batch = shuffled_label_prompts(tiny_llama.tokenizer, task, 2, 3, seed=0, template=template)
    assert all(text.count("In: ") == 4 and text.rstrip(" ").endswith("Out:") for text in batch.texts)
