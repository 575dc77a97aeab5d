"""Task data: lists of ``{"input", "output"}`` pairs split into train / valid / test.

Sources:

* a directory in the function-vector layout, ``<dir>/<task>/{train,valid,test}.json``
  (e.g. ``../shared/data/fv57``), read in place;
* a single JSON list, split with a seed (:func:`load_json_task`);
* the built-in tasks (:mod:`site_interp.tasks.builtin`) and Hugging Face benchmarks
  (:mod:`site_interp.tasks.hub`), which build on this module; :mod:`site_interp.tasks.specs`
  turns command-line task names into tasks from any of these sources.

Every example is validated on load; problems raise :class:`TaskError` naming the file and the fix.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from site_interp.errors import UserError

log = logging.getLogger(__name__)

Example = dict[str, str]
SPLITS = ("train", "valid", "test")


class TaskError(UserError, ValueError):
    """A task file or task name that cannot be used; the message says which and how to fix it."""


@dataclass
class Task:
    """One task with its three splits."""

    name: str
    """Task name (directory name, file stem or built-in name)."""
    train: list[Example]
    """Demonstrations for ICL prompts and the 0-shot prompts SITE trains on."""
    valid: list[Example]
    """Held out for picking the best alphas (validation loss)."""
    test: list[Example]
    """Held out for every reported accuracy."""
    source: str = ""
    """Where the task came from (path, or ``builtin:<name>``)."""
    case_sensitive: bool = False
    """Whether exact match compares letter case (capitalisation tasks); otherwise lower-cased."""

    def split(self, name: str) -> list[Example]:
        if name not in SPLITS:
            raise KeyError(f"unknown split {name!r}; use one of {SPLITS}")
        return getattr(self, name)

    def fingerprint(self) -> str:
        """A short hash of the task's content: artifacts made from other data are refused."""
        blob = json.dumps([self.name, self.train, self.valid, self.test], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return (
            f"Task({self.name!r}, train={len(self.train)}, valid={len(self.valid)}, "
            f"test={len(self.test)}, source={self.source!r})"
        )


def validate_examples(data: object, where: str) -> list[Example]:
    """Check and normalise a list of examples; ``where`` names the file/task in errors.

    Numbers are accepted as strings (e.g. word lengths); surrounding whitespace is stripped;
    exact duplicate pairs are dropped with a warning. Empty inputs or outputs, missing keys,
    non-list data and empty lists are errors.
    """
    if not isinstance(data, list):
        raise TaskError(f"{where}: expected a JSON list of {{'input': ..., 'output': ...}} objects, got {type(data).__name__}")
    if not data:
        raise TaskError(f"{where}: the list of examples is empty; add examples or remove the file")
    out: list[Example] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(data):
        if not isinstance(item, dict) or "input" not in item or "output" not in item:
            raise TaskError(
                f"{where}: example {i} must be an object with keys 'input' and 'output', got {item!r:.80}"
            )
        pair = []
        for key in ("input", "output"):
            value = item[key]
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise TaskError(f"{where}: example {i} has a non-text {key!r}: {value!r:.80}")
            if isinstance(value, float) and not math.isfinite(value):
                raise TaskError(f"{where}: example {i} has {key!r} {value} (a JSON NaN or Infinity, not text); "
                                "write the value as a string")
            text = str(value).strip()
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise TaskError(f"{where}: example {i} has a {key!r} that is not valid Unicode text (a lone "
                                f"surrogate such as \\ud83d); fix the example") from None
            if not text:
                raise TaskError(f"{where}: example {i} has an empty {key!r}; every example needs both")
            pair.append(text)
        if "\n" in pair[1]:
            raise TaskError(f"{where}: example {i} has a multi-line answer; answers must be one line")
        key = (pair[0], pair[1])
        if key in seen:
            continue
        seen.add(key)
        out.append({"input": pair[0], "output": pair[1]})
    if len(out) < len(data):
        log.warning("%s: dropped %d exact duplicate examples", where, len(data) - len(out))
    return out


def check_splits(task: Task, where: str) -> None:
    """Refuse a task whose test split is its train split (every held-out number would be
    measured on training data); warn when many test inputs also occur in train."""
    train = {e["input"] for e in task.train}
    seen = sum(e["input"] in train for e in task.test)
    if task.test and task.test == task.train:
        raise TaskError(f"{where}: the test split is identical to the train split; held-out accuracy would be "
                        "measured on training data. Give different examples to test.json")
    if task.test and seen > 0.5 * len(task.test):
        log.warning("%s: %d of %d test inputs also occur in train", where, seen, len(task.test))


def guess_case_sensitive(examples: Iterable[Example]) -> bool:
    """True when letter case is the point of the task (e.g. ``apple -> Apple``, ``LUCKY -> l``).

    Decided from the data: in most examples the answer, lower-cased, occurs in the lower-cased
    input, but not with its own case.
    """
    examples = list(examples)
    hits = sum(
        1
        for e in examples
        if e["output"].lower() in e["input"].lower() and e["output"] not in e["input"]
    )
    return hits > 0.5 * len(examples)


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise TaskError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start}); save the file as UTF-8") from err
    except json.JSONDecodeError as err:
        raise TaskError(f"{path}: not valid JSON ({err}); fix or regenerate the file") from err
    except OSError as err:
        raise TaskError(f"{path}: cannot be read ({err.strerror})") from err


def load_task(folder: str | Path) -> Task:
    """Load one task directory holding ``train.json``, ``valid.json`` and ``test.json``."""
    folder = Path(folder)
    missing = [s for s in SPLITS if not (folder / f"{s}.json").exists()]
    if missing:
        raise TaskError(
            f"{folder}: missing {', '.join(f'{s}.json' for s in missing)}; a task directory needs "
            "train.json, valid.json and test.json (or use load_json_task for one file)"
        )
    splits = {s: validate_examples(_read_json(folder / f"{s}.json"), str(folder / f"{s}.json")) for s in SPLITS}
    task = Task(
        name=folder.name,
        source=str(folder),
        case_sensitive=guess_case_sensitive(splits["train"]),
        **splits,
    )
    check_splits(task, str(folder))
    return task


def list_task_dir(root: str | Path) -> list[str]:
    """Names of the task directories under ``root`` (at least one, or a :class:`TaskError`)."""
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"{root}: no such task directory (--data-dir)")
    names = sorted(p.name for p in root.iterdir() if p.is_dir() and (p / "train.json").exists())
    if not names:
        raise TaskError(f"{root}: holds no task directories (<task>/train.json, valid.json, test.json); "
                        "check --data-dir")
    return names


def load_task_dir(root: str | Path, names: Sequence[str] | None = None) -> dict[str, Task]:
    """Load tasks from a function-vector style directory (all of them, or ``names``)."""
    available = list_task_dir(root)
    names = list(names) if names else available
    unknown = [n for n in names if n not in available]
    if unknown:
        raise TaskError(f"{root}: no task(s) {unknown}; available: {', '.join(available)}")
    return {n: load_task(Path(root) / n) for n in names}


def split_examples(
    examples: Sequence[Example], seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
    *, where: str = "the examples",
) -> dict[str, list[Example]]:
    """Shuffle with ``seed`` and split into train/valid/test by ``fractions``.

    Examples sharing an input stay in the same split, so no test query is seen in training.
    """
    if abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
        raise ValueError(f"fractions must be positive and sum to 1, got {fractions}")
    by_input: dict[str, list[Example]] = {}
    for e in examples:
        by_input.setdefault(e["input"], []).append(e)
    keys = sorted(by_input)
    random.Random(seed).shuffle(keys)
    n = len(keys)
    n_train = max(1, round(fractions[0] * n))
    n_valid = max(1, round(fractions[1] * n))
    if n_train + n_valid >= n:
        raise TaskError(f"{where}: only {n} distinct inputs, too few to split into train/valid/test "
                        "(at least 3 are needed; a task needs many more to be learnable); add examples")
    parts = {"train": keys[:n_train], "valid": keys[n_train : n_train + n_valid], "test": keys[n_train + n_valid :]}
    return {s: [e for k in ks for e in by_input[k]] for s, ks in parts.items()}


def load_json_task(
    path: str | Path, *, name: str | None = None, seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)
) -> Task:
    """Load one JSON list of examples and split it with ``seed``."""
    path = Path(path)
    if not path.exists():
        raise TaskError(f"{path}: no such file")
    examples = validate_examples(_read_json(path), str(path))
    splits = split_examples(examples, seed=seed, fractions=fractions, where=str(path))
    return Task(
        name=name or path.stem,
        source=str(path),
        case_sensitive=guess_case_sensitive(examples),
        **splits,
    )


__all__ = [
    "Example",
    "Task",
    "TaskError",
    "check_splits",
    "guess_case_sensitive",
    "list_task_dir",
    "load_json_task",
    "load_task",
    "load_task_dir",
    "split_examples",
    "validate_examples",
]
