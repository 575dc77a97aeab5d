"""Prompts: the function-vector template, demo sampling, tokenization with left padding.

A 0-shot prompt is ``"Q: {input}\\nA:"``; an N-shot prompt puts N demonstrations
``"Q: {input}\\nA: {output}\\n\\n"`` before it. The answer follows the prompt with a leading space,
except purely numeric answers (numbers tokenize as a bare space and then digits, so with a space
the "first answer token" would be the space alone). The first answer token is computed in context:
tokenize prompt + answer and take the first token after the prompt's tokens that carries content;
answer tokens before it that are whitespace only (a space piece before an emoji) end the prompt
(:func:`answer_start`).

Token ids always start with the tokenizer's BOS token when it has one (see :mod:`site_interp.loading`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from site_interp.loading import model_context
from site_interp.tasks.core import Example, Task, TaskError

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import PreTrainedTokenizerBase


@dataclass(frozen=True)
class PromptTemplate:
    """How examples become text. Defaults: the function-vector / SITE template."""

    query: str = "Q: {input}\nA:"
    """A query; ``{input}`` is replaced by the example's input."""
    answer_prefix: str = " "
    """Put between a query and its answer (not for purely numeric answers, see below)."""
    demo_separator: str = "\n\n"
    """After each demonstration's answer."""
    no_space_before_numbers: bool = True
    """Drop ``answer_prefix`` before purely numeric answers (digit tokenization, see module doc)."""

    def answer_text(self, output: str) -> str:
        if self.no_space_before_numbers and output.strip().replace(".", "", 1).isdigit():
            return output
        return self.answer_prefix + output

    def demo(self, example: Example) -> str:
        return self.query.format(input=example["input"]) + self.answer_text(example["output"]) + self.demo_separator

    def prompt(self, query: Example, demos: Sequence[Example] = ()) -> str:
        return "".join(self.demo(d) for d in demos) + self.query.format(input=query["input"])


DEFAULT_TEMPLATE = PromptTemplate()


def sample_demos(
    pool: Sequence[Example], n: int, rng: random.Random, *, exclude_input: str | None = None, task: str = "task"
) -> list[Example]:
    """Draw ``n`` distinct demonstrations from ``pool``, never one whose input is ``exclude_input``."""
    candidates = [i for i, e in enumerate(pool) if e["input"] != exclude_input]
    if len(candidates) < n:
        raise TaskError(
            f"{task}: {n}-shot prompts need {n} demonstrations besides the query, but the train split "
            f"has only {len(candidates)}; use fewer shots (--n-shots) or add training examples"
        )
    return [pool[i] for i in rng.sample(candidates, n)]


@dataclass
class PromptBatch:
    """Prompts of one task, tokenized, with their answers' first tokens."""

    texts: list[str]
    """The prompt strings."""
    targets: list[str]
    """The expected answers (outputs), for exact match."""
    target_ids: Int[Tensor, " batch"]
    """The first token of each answer, computed in context."""
    token_ids: list[list[int]]
    """Unpadded token ids of each prompt (BOS first)."""

    def __len__(self) -> int:
        return len(self.texts)


def _bos(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    return [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []


def encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of ``text`` with the BOS convention of this package."""
    return _bos(tokenizer) + tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_start(
    tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str, *, task: str = "task"
) -> tuple[list[int], int]:
    """Where the answer starts carrying content, as the model sees it right after ``prompt``.

    Returns ``(lead, target)``: the answer's leading tokens that decode to whitespace only (a bare
    space piece before an emoji, a flag, a symbol...; usually none) and the first token after them.
    SITE scores ``target`` at the last prompt token, so ``lead`` belongs to the prompt: a target
    that is a space would be the same for every answer and say nothing about it. (Purely numeric
    answers avoid the space altogether: :attr:`PromptTemplate.no_space_before_numbers`.)
    """
    p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
    if len(full) > len(p) and full[: len(p)] == p:
        rest = full[len(p):]
    else:  # the tokenizer merged across the boundary: the answer tokenized on its own
        rest = tokenizer(answer, add_special_tokens=False)["input_ids"]
    k = 0
    while k < len(rest) and not tokenizer.decode(rest[k : k + 1]).strip():
        k += 1
    if k == len(rest):
        raise TaskError(f"{task}: the answer {answer!r} tokenizes to whitespace only; fix the example or the template")
    return rest[:k], rest[k]


def first_answer_token(tokenizer: PreTrainedTokenizerBase, prompt: str, answer: str, *, task: str = "task") -> int:
    """The first token of ``answer`` that carries content, right after ``prompt`` (see :func:`answer_start`)."""
    return answer_start(tokenizer, prompt, answer, task=task)[1]


def has_whitespace_lead(
    tokenizer: PreTrainedTokenizerBase, examples: Sequence[Example], template: PromptTemplate = DEFAULT_TEMPLATE
) -> bool:
    """Whether some example's 0-shot answer starts with whitespace-only tokens (:func:`answer_start`)."""
    return any(answer_start(tokenizer, template.prompt(e), template.answer_text(e["output"]))[0] for e in examples)


def build_prompts(
    tokenizer: PreTrainedTokenizerBase,
    queries: Sequence[Example],
    *,
    n_shots: int = 0,
    demo_pool: Sequence[Example] = (),
    seed: int = 0,
    template: PromptTemplate = DEFAULT_TEMPLATE,
    max_length: int | None = None,
    task: str = "task",
    relabel: Callable[[list[Example], random.Random], list[Example]] | None = None,
) -> PromptBatch:
    """Tokenize prompts for ``queries`` with ``n_shots`` seeded demonstrations from ``demo_pool``.

    ``max_length`` (the model's context) turns an over-long prompt into a clear error.
    ``relabel`` may rewrite each prompt's demonstrations (e.g. shuffle their answers, for
    corrupted prompts); it gets the same seeded generator. Targets stay the queries' answers.
    """
    rng = random.Random(seed)
    texts, targets, target_ids, ids = [], [], [], []
    for q in queries:
        demos = sample_demos(demo_pool, n_shots, rng, exclude_input=q["input"], task=task) if n_shots else []
        if relabel is not None:
            demos = relabel(demos, rng)
        text = template.prompt(q, demos)
        lead, target = answer_start(tokenizer, text, template.answer_text(q["output"]), task=task)
        toks = encode(tokenizer, text) + lead
        if lead:
            text += tokenizer.decode(lead)
        if max_length is not None and len(toks) + 1 > max_length:
            raise TaskError(
                f"{task}: a {n_shots}-shot prompt has {len(toks)} tokens, over the model's context of "
                f"{max_length}; use fewer shots (--n-shots) or shorter examples"
            )
        texts.append(text)
        targets.append(q["output"])
        target_ids.append(target)
        ids.append(toks)
    return PromptBatch(texts=texts, targets=targets, target_ids=torch.tensor(target_ids, dtype=torch.long), token_ids=ids)


def left_pad(
    token_ids: Sequence[Sequence[int]], pad_id: int, device: str | torch.device = "cpu"
) -> tuple[Int[Tensor, "batch pos"], Bool[Tensor, "batch pos"]]:
    """Left-pad to a rectangle; return ids and an attention mask (True = real token).

    With left padding the last prompt token of every row sits at position -1.
    """
    width = max(len(ids) for ids in token_ids)
    ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(token_ids), width), dtype=torch.long)
    for i, t in enumerate(token_ids):
        if t:
            ids[i, width - len(t) :] = torch.tensor(list(t), dtype=torch.long)
            mask[i, width - len(t) :] = 1
    return ids.to(device), mask.to(device)


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    for tok_id in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tok_id is not None:
            return tok_id
    return 0


def zero_shot_batch(
    bridge: TransformerBridge, task: Task, split: str, limit: int | None = None,
    template: PromptTemplate = DEFAULT_TEMPLATE,
) -> PromptBatch:
    """Tokenized 0-shot prompts of one split (the first ``limit`` examples): what SITE trains,
    validates and is evaluated on."""
    examples = task.split(split)[:limit] if limit else task.split(split)
    if not examples:
        raise TaskError(f"{task.name}: the {split} split is empty")
    return build_prompts(bridge.tokenizer, examples, template=template, max_length=model_context(bridge), task=task.name)


def icl_prompt_batch(
    tokenizer: PreTrainedTokenizerBase, task: Task, n_prompts: int, n_shots: int, seed: int, *, max_length: int | None = None,
    template: PromptTemplate = DEFAULT_TEMPLATE,
) -> PromptBatch:
    """The M N-shot prompts of a task embedding: queries (with replacement when train is smaller
    than M) and demonstrations from train, seeded."""
    if not task.train:
        raise TaskError(f"{task.name}: the train split is empty")
    g = torch.Generator().manual_seed(seed)
    replace = n_prompts > len(task.train)
    order = (
        torch.randint(len(task.train), (n_prompts,), generator=g)
        if replace
        else torch.randperm(len(task.train), generator=g)[:n_prompts]
    )
    queries = [task.train[i] for i in order.tolist()]
    return build_prompts(
        tokenizer, queries, n_shots=n_shots, demo_pool=task.train, seed=seed,
        template=template, max_length=max_length, task=task.name,
    )


__all__ = [
    "DEFAULT_TEMPLATE",
    "PromptBatch",
    "PromptTemplate",
    "build_prompts",
    "encode",
    "answer_start",
    "first_answer_token",
    "has_whitespace_lead",
    "icl_prompt_batch",
    "left_pad",
    "pad_id",
    "sample_demos",
    "zero_shot_batch",
]
