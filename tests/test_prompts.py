import random

import pytest
import torch

from site_interp.prompts import (
    DEFAULT_TEMPLATE,
    PromptTemplate,
    build_prompts,
    encode,
    first_answer_token,
    left_pad,
    sample_demos,
)
from site_interp.tasks import TaskError


def test_template_matches_function_vector_format():
    demos = [{"input": "a", "output": "b"}, {"input": "c", "output": "12"}]
    text = DEFAULT_TEMPLATE.prompt({"input": "x", "output": "y"}, demos)
    assert text == "Q: a\nA: b\n\nQ: c\nA:12\n\nQ: x\nA:"


def test_no_space_only_before_numbers():
    t = DEFAULT_TEMPLATE
    assert t.answer_text("42") == "42"
    assert t.answer_text("3.5") == "3.5"
    assert t.answer_text("forty") == " forty"
    assert PromptTemplate(no_space_before_numbers=False).answer_text("42") == " 42"


def test_demos_never_include_the_query_and_are_seeded():
    pool = [{"input": str(i), "output": "o"} for i in range(20)]
    for seed in range(30):
        demos = sample_demos(pool, 10, random.Random(seed), exclude_input="7")
        assert all(d["input"] != "7" for d in demos)
        assert len({d["input"] for d in demos}) == 10
    assert sample_demos(pool, 5, random.Random(1)) == sample_demos(pool, 5, random.Random(1))


def test_too_few_demos_is_a_clear_error():
    pool = [{"input": "a", "output": "b"}, {"input": "c", "output": "d"}]
    with pytest.raises(TaskError, match="mytask.*fewer shots"):
        sample_demos(pool, 2, random.Random(0), exclude_input="a", task="mytask")


def test_first_answer_token_in_context(tiny_llama):
    tok = tiny_llama.tokenizer
    assert first_answer_token(tok, "Q: a\nA:", " bc") == tok(" ", add_special_tokens=False)["input_ids"][0]
    assert first_answer_token(tok, "Q: a\nA:", "7") == tok("7", add_special_tokens=False)["input_ids"][0]


def test_empty_answer_is_a_clear_error(tiny_llama):
    with pytest.raises(TaskError, match="tokenizes to nothing"):
        first_answer_token(tiny_llama.tokenizer, "Q: a\nA:", "", task="t")


def test_bos_convention_matches_bridge(tiny):
    text = "Q: hello\nA:"
    assert encode(tiny.tokenizer, text) == tiny.to_tokens(text)[0].tolist()


def test_prompt_over_context_is_a_clear_error(tiny_llama):
    q = [{"input": "x" * 50, "output": "y"}]
    with pytest.raises(TaskError, match="over the model's context"):
        build_prompts(tiny_llama.tokenizer, q, max_length=20, task="long")


def test_build_prompts_targets_and_determinism(tiny_llama):
    pool = [{"input": f"w{i}", "output": f"v{i}"} for i in range(30)]
    a = build_prompts(tiny_llama.tokenizer, pool[:5], n_shots=3, demo_pool=pool, seed=4)
    b = build_prompts(tiny_llama.tokenizer, pool[:5], n_shots=3, demo_pool=pool, seed=4)
    assert a.texts == b.texts and torch.equal(a.target_ids, b.target_ids)
    assert all(t.count("Q:") == 4 for t in a.texts)
    space = tiny_llama.tokenizer(" ", add_special_tokens=False)["input_ids"][0]
    assert (a.target_ids == space).all()  # " v0": the first answer token is the space (char tokenizer)


def test_left_pad_puts_last_token_last():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
