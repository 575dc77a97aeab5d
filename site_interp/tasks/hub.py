"""Tasks from Hugging Face benchmarks: ANLI, MMLU-Pro and Big-Bench Hard.

Prompts are rendered as ``"Q: {input}\\nA: {output}"`` and scored by the first token of the
output, so every answer is made decisive in its first token: multiple-choice answers are option
letters (``"A"``, ``"B"``, ...) with the lettered options written into the input.

Spec grammar (:func:`load_hf_task`), ``family[:subset]``:

* ``anli`` (rounds r1, r2, r3 as three tasks) or ``anli:r1`` / ``anli:r2`` / ``anli:r3``;
  task names ``anli_r1`` ...; official splits ``train_rN`` -> train, ``dev_rN`` -> valid,
  ``test_rN`` -> test.
* ``mmlu_pro`` (all categories as one task ``mmlu_pro``), ``mmlu_pro:<category>`` (one task
  ``mmlu_pro_<category>``; spaces or underscores, e.g. ``mmlu_pro:computer_science``) or
  ``mmlu_pro:*`` (one task per category). MMLU-Pro has no train split: the official ``test``
  rows of each task are split with ``seed`` into train/valid/test
  (:func:`site_interp.tasks.split_examples`), and the official ``validation`` rows (5 per
  category, the benchmark's few-shot demos) are added to the train split only.
* ``bbh`` (all 27 subtasks of :data:`BBH_SUBTASKS`) or ``bbh:<subtask>``; task names
  ``bbh_<subtask>``. Each subtask has only a ``test`` split, split with ``seed``. Targets of the
  exact form ``"(A)"`` become ``"A"``; all other targets (``"True"``, ``"(1, 2)"``) are kept.

Data is fetched with ``datasets.load_dataset`` (a network connection once; afterwards it is
cached in ``~/.cache/huggingface``). Rows that give an empty input or answer are dropped with
a logged count.
"""

from __future__ import annotations

import logging
import random
import re
from typing import Any, Callable, Iterable, Mapping

from site_interp.tasks.core import Example, Task, TaskError, split_examples, validate_examples

log = logging.getLogger(__name__)

Row = Mapping[str, Any]
Loader = Callable[[str, "str | None", str], Iterable[Row]]
"""``loader(dataset_id, config, split)`` -> rows (dicts with the dataset's fields)."""

ANLI_ID = "facebook/anli"
MMLU_PRO_ID = "TIGER-Lab/MMLU-Pro"
BBH_ID = "lukaemon/bbh"
ANLI_ROUNDS = ("r1", "r2", "r3")
ANLI_LABELS = ("entailment", "neutral", "contradiction")
"""ANLI's ``label`` ints 0, 1, 2; the answers are the letters A, B, C in this order."""
MMLU_PRO_CATEGORIES = (
    "biology", "business", "chemistry", "computer science", "economics", "engineering", "health",
    "history", "law", "math", "other", "philosophy", "physics", "psychology",
)
BBH_SUBTASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting",
)
HF_FAMILIES = ("anli", "mmlu_pro", "bbh")
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
Fractions = tuple[float, float, float]
_BBH_CHOICE = re.compile(r"\(([A-Z])\)")


def hf_task_specs() -> list[str]:
    """Every valid spec (``mmlu_pro:<category>`` written with underscores)."""
    return (
        ["anli"] + [f"anli:{r}" for r in ANLI_ROUNDS]
        + ["mmlu_pro", "mmlu_pro:*"] + [f"mmlu_pro:{_slug(c)}" for c in MMLU_PRO_CATEGORIES]
        + ["bbh"] + [f"bbh:{s}" for s in BBH_SUBTASKS]
    )


def is_hf_spec(spec: str) -> bool:
    """Whether ``spec`` names one of these benchmarks (its subset may still be invalid)."""
    return spec.split(":", 1)[0] in HF_FAMILIES


def datasets_loader(dataset_id: str, config: str | None, split: str) -> Iterable[Row]:
    """The default loader: ``datasets.load_dataset(dataset_id, config, split=split)``."""
    try:
        import datasets
    except ImportError as err:
        raise TaskError(
            f"{dataset_id}: the 'datasets' package is needed to load this benchmark; "
            "run `pip install datasets` (downloads need a network once, then they are cached)"
        ) from err
    return datasets.load_dataset(dataset_id, config, split=split)


def _fetch(loader: Loader, dataset_id: str, config: str | None, split: str) -> list[Row]:
    try:
        return list(loader(dataset_id, config, split))
    except TaskError:
        raise
    except Exception as err:  # offline, hub errors, missing split: all become one clear message
        where = dataset_id + (f" (config {config!r})" if config else "") + f", split {split!r}"
        raise TaskError(
            f"could not load {where}: {type(err).__name__}: {err}. The dataset is downloaded from the "
            "Hugging Face Hub once (this needs a network connection and `pip install datasets`), then "
            "cached in ~/.cache/huggingface; after that set HF_DATASETS_OFFLINE=1 to work offline"
        ) from err


def _slug(name: str) -> str:
    return name.strip().replace(" ", "_")


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


def _finish(pairs: Iterable[tuple[str, str]], where: str, seed: int, max_examples: int | None) -> list[Example]:
    """Drop rows with an empty input/answer (logged), validate, keep a seeded subset if asked."""
    pairs = list(pairs)
    kept = [{"input": i, "output": o} for i, o in pairs if i and o and "\n" not in o]
    if len(kept) < len(pairs):
        log.warning("%s: dropped %d rows with an empty input/answer or a multi-line answer", where, len(pairs) - len(kept))
    examples = validate_examples(kept, where)
    if max_examples is not None and len(examples) > max_examples:
        keep = sorted(random.Random(seed).sample(range(len(examples)), max_examples))
        examples = [examples[i] for i in keep]
    return examples


def anli_example(row: Row) -> tuple[str, str]:
    """``(input, output)`` of one ANLI row; empty strings when the row is unusable.

    Fields: ``premise`` and ``hypothesis`` (text), ``label`` (0 entailment, 1 neutral,
    2 contradiction); ``uid`` and ``reason`` (the annotator's explanation) are not used.
    """
    premise, hypothesis, label = _text(row.get("premise")), _text(row.get("hypothesis")), row.get("label")
    if not premise or not hypothesis or label not in (0, 1, 2) or isinstance(label, bool):
        return "", ""
    options = " ".join(f"{LETTERS[i]}) {name}" for i, name in enumerate(ANLI_LABELS))
    text = f"Premise: {premise}\nHypothesis: {hypothesis}\nDoes the premise entail the hypothesis? {options}"
    return text, LETTERS[label]


def mmlu_pro_example(row: Row) -> tuple[str, str]:
    """``(input, output)`` of one MMLU-Pro row; empty strings when the row is unusable.

    Fields: ``question`` (text), ``options`` (up to 10 strings, lettered A-J in order),
    ``answer`` (the correct letter), ``answer_index`` (its 0-based index, used when ``answer``
    is not a valid letter); ``question_id``, ``cot_content``, ``category`` and ``src`` are not
    part of the example.
    """
    question, options = _text(row.get("question")), row.get("options") or []
    answer = _text(row.get("answer")).upper()
    if len(answer) != 1 or answer not in LETTERS[: len(options)]:
        index = row.get("answer_index")
        answer = LETTERS[index] if isinstance(index, int) and 0 <= index < len(options) else ""
    if not question or not options:
        return "", ""
    lines = "\n".join(f"{LETTERS[i]}) {_text(o)}" for i, o in enumerate(options))
    return f"{question}\n{lines}", answer


def bbh_target(target: str) -> str:
    """``"(A)"`` -> ``"A"`` (exactly one capital letter in parentheses); anything else unchanged."""
    target = target.strip()
    match = _BBH_CHOICE.fullmatch(target)
    return match.group(1) if match else target


def bbh_example(row: Row) -> tuple[str, str]:
    """``(input, output)`` of one BBH row. Fields: ``input`` (the question, with options for
    multiple-choice subtasks) and ``target`` (the answer, see :func:`bbh_target`)."""
    return _text(row.get("input")), bbh_target(_text(row.get("target")))


def _load_anli(rnd: str, loader: Loader, seed: int, max_examples: int | None) -> Task:
    splits = {}
    for ours, theirs in (("train", "train"), ("valid", "dev"), ("test", "test")):
        rows = _fetch(loader, ANLI_ID, None, f"{theirs}_{rnd}")
        splits[ours] = _finish(map(anli_example, rows), f"{ANLI_ID}:{theirs}_{rnd}", seed, max_examples)
    return Task(name=f"anli_{rnd}", source=f"hf:{ANLI_ID} train_{rnd}/dev_{rnd}/test_{rnd}", **splits)


def _in_category(row: Row, category: str | None) -> bool:
    return category is None or _text(row.get("category")) == category


def _split(examples: list[Example], name: str, seed: int, fractions: Fractions) -> dict[str, list[Example]]:
    try:
        return split_examples(examples, seed, fractions)
    except TaskError as err:
        raise TaskError(f"{name}: {err}; load more rows (max_examples) or use another benchmark") from err


def _load_mmlu_pro(
    subset: str | None, loader: Loader, seed: int, max_examples: int | None, fractions: Fractions
) -> list[Task]:
    test_rows = _fetch(loader, MMLU_PRO_ID, None, "test")
    demo_rows = _fetch(loader, MMLU_PRO_ID, None, "validation")
    if subset is None:
        groups: list[str | None] = [None]
    elif subset == "*":
        groups = sorted({_text(r.get("category")) for r in test_rows} - {""})
    else:
        groups = [subset.replace("_", " ")]
    tasks = []
    for category in groups:
        name = "mmlu_pro" if category is None else f"mmlu_pro_{_slug(category)}"
        where = f"{MMLU_PRO_ID}:test" + (f" category {category!r}" if category else "")
        pairs = (mmlu_pro_example(r) for r in test_rows if _in_category(r, category))
        splits = _split(_finish(pairs, where, seed, max_examples), name, seed, fractions)
        held_out = {e["input"] for s in ("valid", "test") for e in splits[s]}
        demos = [mmlu_pro_example(r) for r in demo_rows if _in_category(r, category)]
        demos = [(i, o) for i, o in demos if i and o and i not in held_out]
        splits["train"] = validate_examples(splits["train"] + [{"input": i, "output": o} for i, o in demos], name)
        tasks.append(Task(name=name, source=f"hf:{MMLU_PRO_ID} test split by seed {seed} + validation demos", **splits))
    return tasks


def _load_bbh(subtask: str, loader: Loader, seed: int, max_examples: int | None, fractions: Fractions) -> Task:
    rows = _fetch(loader, BBH_ID, subtask, "test")
    examples = _finish(map(bbh_example, rows), f"{BBH_ID}:{subtask}", seed, max_examples)
    splits = _split(examples, f"bbh_{subtask}", seed, fractions)
    return Task(name=f"bbh_{subtask}", source=f"hf:{BBH_ID}/{subtask} test split by seed {seed}", **splits)


def load_hf_task(
    spec: str,
    *,
    seed: int = 0,
    max_examples: int | None = None,
    fractions: Fractions = (0.7, 0.1, 0.2),
    loader: Loader | None = None,
) -> list[Task]:
    """The task(s) named by ``spec`` (grammar in the module docstring).

    ``seed`` drives the train/valid/test split of MMLU-Pro and BBH (``fractions``) and the subset
    kept by ``max_examples``: at most that many examples per official split (ANLI) or per task
    before splitting (MMLU-Pro, BBH). ``loader(dataset_id, config, split)`` returns rows; the
    default is :func:`datasets_loader`. Unknown specs and failed downloads raise :class:`TaskError`.
    """
    loader = loader or datasets_loader
    family, colon, subset = spec.strip().partition(":")
    subset = subset.strip()
    if colon and not subset:
        family = ""  # "anli:" names nothing
    if family == "anli" and (not subset or subset in ANLI_ROUNDS):
        return [_load_anli(r, loader, seed, max_examples) for r in ([subset] if subset else ANLI_ROUNDS)]
    if family == "mmlu_pro" and (not subset or subset == "*" or subset.replace("_", " ") in MMLU_PRO_CATEGORIES):
        return _load_mmlu_pro(subset or None, loader, seed, max_examples, fractions)
    if family == "bbh" and (not subset or subset in BBH_SUBTASKS):
        return [_load_bbh(s, loader, seed, max_examples, fractions) for s in ([subset] if subset else BBH_SUBTASKS)]
    raise TaskError(f"unknown Hugging Face task spec {spec!r}; valid specs: {', '.join(hf_task_specs())}")


__all__ = [
    "ANLI_ROUNDS", "BBH_SUBTASKS", "HF_FAMILIES", "MMLU_PRO_CATEGORIES", "anli_example", "bbh_example",
    "bbh_target", "datasets_loader", "hf_task_specs", "is_hf_spec", "load_hf_task", "mmlu_pro_example",
]
