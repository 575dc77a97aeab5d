import pytest
import torch

from site_interp.batching import unsplit
from site_interp.generation import greedy_generate
from site_interp.prefix_cache import build_prefix_cache, prefix_cache_fits
from site_interp.scoring import last_token_logits
from site_interp.hooks import injection_hooks
from site_interp.prompts import encode

PROMPTS = ["Q: hello there\nA:", "Q: x\nA:", "Q: a somewhat longer prompt\nA:", "Q: ab\nA: c\n\nQ: de\nA:"]


def _ids(bridge):
    return [encode(bridge.tokenizer, p) for p in PROMPTS]


@torch.no_grad()
def test_padded_batch_equals_one_by_one(tiny):
    ids = _ids(tiny)
    batched = last_token_logits(tiny, ids)
    single = torch.cat([last_token_logits(tiny, [i]) for i in ids])
    assert torch.allclose(batched, single, atol=1e-5)


@torch.no_grad()
def test_prefix_cache_equals_full_prompts(tiny):
    """Also guards the transformers pin: with 5.24 the bridge's KV cache stays empty."""
    ids = _ids(tiny)
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    hooks = injection_hooks(torch.rand(L, H), torch.randn(L, H, D))
    prefix = build_prefix_cache(tiny, ids, batch_size=3)
    for h in ([], hooks):
        full = last_token_logits(tiny, ids, h)
        fast = last_token_logits(tiny, hooks=h, prefix=prefix)
        assert torch.allclose(full, fast, atol=1e-5)
    rows = torch.tensor([3, 0])
    assert torch.allclose(last_token_logits(tiny, hooks=hooks, prefix=prefix, rows=rows),
                          last_token_logits(tiny, [ids[3], ids[0]], hooks), atol=1e-5)


@torch.no_grad()
def test_cached_and_uncached_generation_agree(tiny):
    ids = _ids(tiny)
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    hooks = injection_hooks(torch.rand(L, H), 3 * torch.randn(L, H, D))
    cached = greedy_generate(tiny, ids, hooks, max_new_tokens=8, stop_at_newline=False)
    uncached = greedy_generate(tiny, ids, hooks, max_new_tokens=8, use_cache=False, stop_at_newline=False)
    assert cached == uncached
    plain = greedy_generate(tiny, ids, [], max_new_tokens=8, stop_at_newline=False)
    assert plain != cached  # the injection does change what is generated


@torch.no_grad()
def test_generation_injects_only_on_the_prompt_pass(tiny_llama):
    """Hooks that fire on later (cached) steps would see z with one position; count the calls."""
    ids = _ids(tiny_llama)
    seen = []

    def spy(z, *, hook=None):
        seen.append(z.shape[1])
        return z

    greedy_generate(tiny_llama, ids, [("blocks.0.attn.hook_z", spy)], max_new_tokens=5, stop_at_newline=False)
    assert len(seen) == 1 and seen[0] == max(len(i) for i in ids)


def test_sliding_window_guard():
    from site_interp.loading import tiny_bridge

    b = tiny_bridge("gemma3")
    b.original_model.config.sliding_window = 4
    ids = _ids(b)
    assert not prefix_cache_fits(b, ids)
    with pytest.raises(ValueError, match="sliding"):
        build_prefix_cache(b, ids)


@torch.no_grad()
def test_segmented_prefix_cache_equals_full_prompts(tiny):
    from site_interp.prefix_cache import SegmentedPrefixCache

    ids = _ids(tiny)
    segments = [ids[:1], ids[1:]]  # different widths: rows are padded at select time
    cache = SegmentedPrefixCache([build_prefix_cache(tiny, s) for s in segments])
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    hooks = injection_hooks(torch.rand(L, H), torch.randn(L, H, D))
    rows = torch.tensor([2, 0, 3, 1])
    expected = last_token_logits(tiny, [ids[i] for i in rows.tolist()], hooks)
    assert torch.allclose(last_token_logits(tiny, hooks=hooks, prefix=cache, rows=rows), expected, atol=1e-5)


def test_pool_falls_back_to_full_prompts_over_the_memory_budget(tiny_llama):
    from site_interp.scoring import LastTokenScorer
    from site_interp.prompts import build_prompts

    batch = build_prompts(tiny_llama.tokenizer, [{"input": "ab", "output": "c"}, {"input": "abcd", "output": "e"}])
    assert LastTokenScorer(tiny_llama, [batch]).prefix is not None
    small = LastTokenScorer(tiny_llama, [batch], max_cache_gib=1e-9)
    assert small.prefix is None
    rows = torch.arange(2)
    assert torch.equal(small.correct(rows), LastTokenScorer(tiny_llama, [batch]).correct(rows))


def _brute_force_cost(widths: list[int], overhead: int) -> float:
    """Cheapest split of sorted widths into contiguous groups, by trying every cut set."""
    import itertools

    w = sorted(widths)
    best = float("inf")
    for k in range(len(w)):
        for cuts in itertools.combinations(range(1, len(w)), k):
            bounds = [0, *cuts, len(w)]
            cost = sum(overhead + (b - a) * w[b - 1] for a, b in zip(bounds, bounds[1:]))
            best = min(best, cost)
    return best


@pytest.mark.parametrize("overhead", [0, 5, 40, 1000])
def test_width_buckets_is_optimal_and_covers_every_row(overhead):
    from site_interp.batching import width_buckets

    g = torch.Generator().manual_seed(overhead)
    widths = torch.randint(3, 60, (9,), generator=g)
    groups = width_buckets(widths, overhead)
    assert sorted(torch.cat(groups).tolist()) == list(range(9))
    cost = sum(overhead + len(gr) * int(widths[gr].max()) for gr in groups)
    assert cost == _brute_force_cost(widths.tolist(), overhead)
    if overhead >= 1000:
        assert len(groups) == 1  # never worth a second forward
    if overhead == 0:
        assert len(groups) == len(widths.unique())  # one forward per distinct width


def test_pool_width_buckets_give_the_same_logits_and_gradients(tiny):
    """A batch mixing short and long prompts, run as one forward and as width groups."""
    from site_interp.scoring import LastTokenScorer
    from site_interp.batching import width_buckets
    from site_interp.prompts import build_prompts

    short = [{"input": w, "output": "x"} for w in ["a", "bc", "d"]]
    long = [{"input": "a much longer input " * 6, "output": "y"}]
    pool = LastTokenScorer(tiny, [build_prompts(tiny.tokenizer, short), build_prompts(tiny.tokenizer, long)])
    assert pool.widths[-1] > 3 * pool.widths[0]
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    rows = torch.tensor([3, 0, 2, 1])
    t = torch.randn(4, L, H, D)

    def run(overhead):
        pool.bucket_overhead = overhead
        assert len(width_buckets(pool.widths[rows], overhead)) == (1 if overhead else 2)
        logit = torch.zeros(4, L, H, requires_grad=True)
        logits = pool.logits(rows, torch.sigmoid(logit), t)
        pool.losses(rows, torch.sigmoid(logit), t).sum().backward()
        return logits.detach(), logit.grad

    one_logits, one_grad = run(10**9)
    split_logits, split_grad = run(0)
    assert torch.allclose(one_logits, split_logits, atol=1e-5)
    assert torch.allclose(one_grad, split_grad, atol=1e-6)
    assert torch.equal(pool.correct(rows, torch.full((4, L, H), 0.5), t, chunk=3),
                       torch.cat([pool.correct(rows[i : i + 1], torch.full((1, L, H), 0.5), t[i : i + 1])
                                  for i in range(4)]))
    # tables indexed per row (the transfer matrix's form) = per-row tensors
    table_a, table_t = torch.rand(2, L, H), torch.randn(3, L, H, D)
    ai, ti = torch.tensor([1, 0, 1, 1]), torch.tensor([2, 2, 0, 1])
    assert torch.equal(pool.correct(rows, table_a, table_t, alpha_index=ai, t_index=ti, chunk=3),
                       pool.correct(rows, table_a[ai], table_t[ti], chunk=3))


def test_unsplit_restores_the_row_order_of_a_split_batch():
    x = torch.randn(11, 3)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(1))
    picks = [perm[:4], perm[4:5], perm[5:]]
    assert torch.equal(unsplit([x[p] for p in picks], picks), x)
    with pytest.raises(ValueError, match="permutation"):  # rows missing from the picks
        unsplit([x[:4]], [torch.tensor([0, 1, 2, 5])])
    with pytest.raises(ValueError, match="permutation"):  # a row picked twice
        unsplit([x[:2], x[:2]], [torch.tensor([0, 1]), torch.tensor([1, 2])])


@torch.no_grad()
def test_prefix_cache_pieces_of_similar_widths_equal_full_prompts(tiny):
    """Each segment is cached as width pieces (rows permuted inside); any rows, any order."""
    from site_interp.prefix_cache import prefix_cache_for

    ids = _ids(tiny)
    segments = [ids + [ids[1], ids[2] * 3], ids[::-1]]  # widths 3x apart inside the first segment
    flat = [x for s in segments for x in s]
    one = prefix_cache_for(tiny, segments, piece_overhead=10**9)
    split = prefix_cache_for(tiny, segments, piece_overhead=0)
    assert len(one.segments) == 2 and len(split.segments) > 2
    stored = lambda c: sum(s.mask.numel() for s in c.segments)  # noqa: E731
    assert stored(split) < stored(one)
    L, H, D = tiny.cfg.n_layers, tiny.cfg.n_heads, tiny.cfg.d_head
    hooks = injection_hooks(torch.rand(L, H), torch.randn(L, H, D))
    rows = torch.tensor([5, 0, 9, 3, 7, 1, 8])
    expected = last_token_logits(tiny, [flat[i] for i in rows.tolist()], hooks)
    for cache in (one, split):
        assert torch.allclose(last_token_logits(tiny, hooks=hooks, prefix=cache, rows=rows), expected, atol=1e-5)


def test_segmented_prefix_cache_refuses_rows_that_are_not_a_permutation(tiny):
    from site_interp.prefix_cache import SegmentedPrefixCache

    ids = _ids(tiny)
    pieces = [build_prefix_cache(tiny, ids[:2]), build_prefix_cache(tiny, ids[2:])]
    SegmentedPrefixCache(pieces, [torch.tensor([3, 0]), torch.tensor([1, 2])])  # fine
    with pytest.raises(ValueError, match="cover every row once"):
        SegmentedPrefixCache(pieces, [torch.tensor([0, 0]), torch.tensor([1, 2])])
