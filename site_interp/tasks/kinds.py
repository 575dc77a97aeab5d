"""Task kinds: **extractive** (the answer is copied from the query) or **abstractive** (it is not).

The function-vector paper groups its tasks this way, and the methods differ between the two
kinds, so results are split by kind. The kind is read from the data, not from the task's name:
a task is extractive when, in most of its training examples, the answer (at least two characters
long) occurs verbatim in the query. The length floor keeps one-letter answers from counting:
``commonsense_qa`` answers with an option letter (``c``) that trivially occurs in its query,
yet it is abstractive in the function-vector paper's grouping. On the 57 FV tasks this rule
gives exactly that paper's grouping (``tests/test_report.py`` checks it on the data when present).
"""

from __future__ import annotations

from typing import Literal

from site_interp.tasks.core import Example, Task

TaskKind = Literal["abstractive", "extractive"]
KINDS: tuple[TaskKind, ...] = ("abstractive", "extractive")
MIN_COPIED_CHARS = 2
"""Answers shorter than this never count as copied from the query."""


def is_copied(example: Example) -> bool:
    """Whether the example's answer occurs verbatim (case-sensitive) in its query."""
    answer = str(example["output"]).strip()
    return len(answer) >= MIN_COPIED_CHARS and answer in str(example["input"])


def copied_share(examples: list[Example]) -> float:
    """Share of ``examples`` whose answer occurs verbatim in the query (0 for no examples)."""
    return sum(map(is_copied, examples)) / len(examples) if examples else 0.0


def task_kind(task: Task, threshold: float = 0.5) -> TaskKind:
    """``extractive`` if more than ``threshold`` of the training examples copy their answer from
    the query, else ``abstractive`` (the FV-57 tasks sit at 0-11% and 100%: the split is clear)."""
    return "extractive" if copied_share(task.train) > threshold else "abstractive"


__all__ = ["KINDS", "MIN_COPIED_CHARS", "TaskKind", "copied_share", "is_copied", "task_kind"]
