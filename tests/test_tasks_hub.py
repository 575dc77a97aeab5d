"""Hugging Face benchmark loaders, on small hand-written rows with the real field names (no network)."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from site_interp.tasks import hub as hf_tasks
from site_interp.tasks.hub import BBH_SUBTASKS, bbh_target, hf_task_specs, is_hf_spec, load_hf_task
from site_interp.tasks import TaskError


def anli_row(i: int, split: str, label: int) -> dict:
    return {
        "uid": f"{split}-{i}",
        "premise": f"The {split} cat number {i} sat on the mat.",
        "hypothesis": f"Cat {i} is {'sitting' if label == 0 else 'hungry' if label == 1 else 'flying'}.",
        "label": label,
        "reason": "",
    }


def anli_rows(split: str, n: int = 4) -> list[dict]:
    return [anli_row(i, split, i % 3) for i in range(n)]


def mmlu_row(i: int, category: str, answer_index: int, n_options: int = 10) -> dict:
    return {
        "question_id": i,
        "question": f"{category} question {i}?",
        "options": [f"{category} option {k}" for k in range(n_options)],
        "answer": "ABCDEFGHIJ"[answer_index],
        "answer_index": answer_index,
        "cot_content": "",
        "category": category,
        "src": f"ori_mmlu-{category}",
    }


MMLU_TEST = [mmlu_row(i, c, i % 4) for c in ("math", "law", "computer science") for i in range(12)]
MMLU_VALID = [mmlu_row(100 + i, c, 1) for c in ("math", "law", "computer science") for i in range(2)]

BBH_ROWS = [
    {"input": "not ( True ) and ( True ) is", "target": "False"},
    {"input": "True and not not ( not False ) is", "target": "True"},
    {"input": "Which is first?\nOptions:\n(A) cat\n(B) dog", "target": "(A)"},
    {"input": "Which is last?\nOptions:\n(A) cat\n(B) dog", "target": "(B)"},
    {"input": "Which pair?", "target": "(1, 2)"},
    {"input": "Sort: pear apple", "target": "apple pear"},
] + [{"input": f"Is {i} even?", "target": "Yes" if i % 2 == 0 else "No"} for i in range(8)]


class FakeHub:
    """Stands in for ``datasets.load_dataset``: in-memory rows keyed by (dataset, config, split)."""

    def __init__(self, overrides: dict | None = None):
        self.calls: list[tuple] = []
        self.data = {
            **{("facebook/anli", None, f"{s}_{r}"): anli_rows(f"{s}_{r}") for s in ("train", "dev", "test") for r in ("r1", "r2", "r3")},
            ("TIGER-Lab/MMLU-Pro", None, "test"): MMLU_TEST,
            ("TIGER-Lab/MMLU-Pro", None, "validation"): MMLU_VALID,
        }
        self.data.update(overrides or {})

    def __call__(self, dataset_id, config, split):
        self.calls.append((dataset_id, config, split))
        if dataset_id == "lukaemon/bbh":
            return [dict(r) for r in BBH_ROWS]
        try:
            return [dict(r) for r in self.data[(dataset_id, config, split)]]
        except KeyError:
            raise ValueError(f"Unknown split {split!r}") from None


def test_anli_round_maps_official_splits():
    hub = FakeHub()
    (task,) = load_hf_task("anli:r1", loader=hub)
    assert task.name == "anli_r1"
    assert hub.calls == [("facebook/anli", None, "train_r1"), ("facebook/anli", None, "dev_r1"), ("facebook/anli", None, "test_r1")]
    for split, theirs in (("train", "train_r1"), ("valid", "dev_r1"), ("test", "test_r1")):
        rows = anli_rows(theirs)
        examples = task.split(split)
        assert len(examples) == len(rows)
        for row, ex in zip(rows, examples):
            assert row["premise"] in ex["input"] and row["hypothesis"] in ex["input"]
            assert "A) entailment B) neutral C) contradiction" in ex["input"]
            assert ex["output"] == "ABC"[row["label"]]


def test_anli_all_rounds_and_bad_rows_dropped(caplog):
    bad = anli_rows("train_r2") + [
        {"uid": "x", "premise": "  ", "hypothesis": "h", "label": 0, "reason": ""},
        {"uid": "y", "premise": "p", "hypothesis": "h", "label": -1, "reason": ""},
    ]
    with caplog.at_level(logging.WARNING):
        tasks = load_hf_task("anli", loader=FakeHub({("facebook/anli", None, "train_r2"): bad}))
    assert [t.name for t in tasks] == ["anli_r1", "anli_r2", "anli_r3"]
    assert len(tasks[1].train) == 4
    assert "dropped 2 rows" in caplog.text


def test_mmlu_pro_category_letters_and_validation_demos():
    (task,) = load_hf_task("mmlu_pro:math", loader=FakeHub())
    assert task.name == "mmlu_pro_math"
    everything = task.train + task.valid + task.test
    assert len(everything) == 12 + 2
    assert all(e["input"].startswith("math question") for e in everything)
    by_question = {r["question"]: r for r in MMLU_TEST + MMLU_VALID}
    for e in everything:
        row = by_question[e["input"].split("\n")[0]]
        assert e["output"] == row["answer"]
        assert "\nA) math option 0\nB) math option 1\n" in e["input"] and "J) math option 9" in e["input"]
    demo_questions = {r["question"] for r in MMLU_VALID if r["category"] == "math"}
    assert demo_questions <= {e["input"].split("\n")[0] for e in task.train}


def test_mmlu_pro_answer_index_fallback_and_short_options():
    row = mmlu_row(1, "law", 2, n_options=3) | {"answer": ""}
    text, answer = hf_tasks.mmlu_pro_example(row)
    assert answer == "C" and "C) law option 2" in text and "D)" not in text
    assert hf_tasks.mmlu_pro_example(row | {"answer_index": 7}) == (text, "")
    assert hf_tasks.mmlu_pro_example(row | {"answer": "AB", "answer_index": 1}) == (text, "B")


def test_mmlu_pro_all_together_and_per_category():
    hub = FakeHub()
    (together,) = load_hf_task("mmlu_pro", loader=hub)
    assert together.name == "mmlu_pro"
    assert len(together.train) + len(together.valid) + len(together.test) == len(MMLU_TEST) + len(MMLU_VALID)
    per = load_hf_task("mmlu_pro:*", loader=hub)
    assert [t.name for t in per] == ["mmlu_pro_computer_science", "mmlu_pro_law", "mmlu_pro_math"]
    for spec in ("mmlu_pro:computer_science", "mmlu_pro:computer science"):
        (cs,) = load_hf_task(spec, loader=hub)
        assert cs.name == "mmlu_pro_computer_science"
        assert cs.test and all("computer science question" in e["input"] for e in cs.test)


def test_seeded_split_is_deterministic():
    def split(spec, seed):
        (t,) = load_hf_task(spec, seed=seed, loader=FakeHub())
        return t.train, t.valid, t.test

    for spec in ("mmlu_pro:law", "bbh:navigate"):
        assert split(spec, 0) == split(spec, 0)
        assert split(spec, 0) != split(spec, 1)


@pytest.mark.parametrize(
    "target, expected",
    [("(A)", "A"), (" (J) ", "J"), ("True", "True"), ("(1, 2)", "(1, 2)"), ("(a)", "(a)"),
     ("(AB)", "(AB)"), ("(A) cat", "(A) cat"), (") ] }", ") ] }"), ("A", "A")],
)
def test_bbh_target(target, expected):
    assert bbh_target(target) == expected


def test_bbh_subtask_and_all():
    hub = FakeHub()
    (task,) = load_hf_task("bbh:date_understanding", loader=hub)
    assert task.name == "bbh_date_understanding"
    assert hub.calls == [("lukaemon/bbh", "date_understanding", "test")]
    answers = {e["input"]: e["output"] for e in task.train + task.valid + task.test}
    assert len(answers) == len(BBH_ROWS)
    assert answers["Which is first?\nOptions:\n(A) cat\n(B) dog"] == "A"
    assert answers["Which is last?\nOptions:\n(A) cat\n(B) dog"] == "B"
    assert answers["Which pair?"] == "(1, 2)" and answers["not ( True ) and ( True ) is"] == "False"
    assert len(BBH_SUBTASKS) == 27 and len(set(BBH_SUBTASKS)) == 27
    tasks = load_hf_task("bbh", loader=hub)
    assert [t.name for t in tasks] == [f"bbh_{s}" for s in BBH_SUBTASKS]


def test_max_examples_caps_each_split():
    (anli,) = load_hf_task("anli:r3", max_examples=2, loader=FakeHub())
    assert (len(anli.train), len(anli.valid), len(anli.test)) == (2, 2, 2)
    (bbh,) = load_hf_task("bbh:snarks", max_examples=10, loader=FakeHub())
    assert len(bbh.train) + len(bbh.valid) + len(bbh.test) == 10
    with pytest.raises(TaskError, match="bbh_snarks"):
        load_hf_task("bbh:snarks", max_examples=3, loader=FakeHub())


def test_offline_error_names_dataset_and_fix():
    def offline(dataset_id, config, split):
        raise ConnectionError("Couldn't reach 'facebook/anli' on the Hub (LocalEntryNotFoundError)")

    with pytest.raises(TaskError) as info:
        load_hf_task("anli:r2", loader=offline)
    msg = str(info.value)
    for part in ("facebook/anli", "train_r2", "ConnectionError", "pip install datasets", "network", "HF_DATASETS_OFFLINE=1"):
        assert part in msg


def test_default_loader_calls_datasets(monkeypatch):
    calls = []
    fake = types.ModuleType("datasets")
    fake.load_dataset = lambda path, name=None, split=None: calls.append((path, name, split)) or BBH_ROWS
    monkeypatch.setitem(sys.modules, "datasets", fake)
    (task,) = load_hf_task("bbh:web_of_lies")
    assert calls == [("lukaemon/bbh", "web_of_lies", "test")] and task.name == "bbh_web_of_lies"
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed: import fails
    with pytest.raises(TaskError, match=r"lukaemon/bbh.*pip install datasets"):
        load_hf_task("bbh:web_of_lies")


@pytest.mark.parametrize("spec", ["squad", "anli:r4", "bbh:nope", "mmlu_pro:astrology", "anli:", "bbh:*"])
def test_unknown_spec_lists_valid_ones(spec):
    hub = FakeHub()
    with pytest.raises(TaskError, match="valid specs: anli, anli:r1") as info:
        load_hf_task(spec, loader=hub)
    assert "bbh:date_understanding" in str(info.value) and "mmlu_pro:computer_science" in str(info.value)
    assert hub.calls == []


def test_spec_helpers():
    assert is_hf_spec("bbh:navigate") and is_hf_spec("mmlu_pro") and not is_hf_spec("antonym")
    specs = hf_task_specs()
    assert len(specs) == 1 + 3 + 2 + 14 + 1 + 27 and len(set(specs)) == len(specs)


def test_tasks_build_prompts_with_tiny_tokenizer():
    from site_interp.loading import tiny_tokenizer
    from site_interp.prompts import build_prompts

    tok = tiny_tokenizer()  # the tokenizer of the tiny test bridges
    hub = FakeHub()
    tasks = load_hf_task("anli:r1", loader=hub) + load_hf_task("mmlu_pro:law", loader=hub)
    tasks += load_hf_task("bbh:navigate", loader=hub)
    for task in tasks:
        batch = build_prompts(tok, task.test, n_shots=2, demo_pool=task.train, task=task.name)
        assert len(batch) == len(task.test) == len(batch.target_ids)
        assert batch.texts[0].rstrip(" ").endswith(task.test[0]["input"] + "\nA:")


def test_resolve_tasks_accepts_hf_specs_and_explains_offline(monkeypatch):
    from site_interp.tasks import hub as hf_tasks
    from site_interp.tasks import resolve_tasks

    def offline(dataset_id, config, split):
        raise ConnectionError("no network")

    monkeypatch.setattr(hf_tasks, "datasets_loader", offline)
    with pytest.raises(TaskError, match="facebook/anli"):
        resolve_tasks(["anli:r1"])
    with pytest.raises(TaskError, match="unknown task 'anly'.*anli"):
        resolve_tasks(["anly"])
