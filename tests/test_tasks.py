import json

import pytest

from site_interp.tasks import (
    TaskError,
    builtin_task,
    guess_case_sensitive,
    load_json_task,
    load_task,
    load_task_dir,
    resolve_tasks,
    split_examples,
    validate_examples,
)


def _write_task(root, name, n=12, **override):
    d = root / name
    d.mkdir(parents=True)
    for split in ("train", "valid", "test"):
        data = override.get(split, [{"input": f"{split}{i}", "output": f"o{i}"} for i in range(n)])
        (d / f"{split}.json").write_text(data if isinstance(data, str) else json.dumps(data))
    return d


def test_load_task_dir(tmp_path):
    _write_task(tmp_path, "a")
    _write_task(tmp_path, "b")
    tasks = load_task_dir(tmp_path)
    assert sorted(tasks) == ["a", "b"]
    assert len(tasks["a"].train) == 12 and tasks["a"].test[0] == {"input": "test0", "output": "o0"}


def test_malformed_json_names_the_file(tmp_path):
    _write_task(tmp_path, "bad", train="[{oops")
    with pytest.raises(TaskError, match=r"bad/train.json: not valid JSON"):
        load_task(tmp_path / "bad")


@pytest.mark.parametrize(
    "data, message",
    [
        ([], "empty"),
        ({"input": "a"}, "JSON list"),
        ([{"input": "a"}], "keys 'input' and 'output'"),
        ([{"input": "a", "output": "  "}], "empty 'output'"),
        ([{"input": "a", "output": None}], "non-text 'output'"),
        ([{"input": "a", "output": "x\ny"}], "multi-line"),
    ],
)
def test_validation_errors(data, message):
    with pytest.raises(TaskError, match=message):
        validate_examples(data, "where.json")


def test_numbers_become_strings_and_exact_duplicates_are_dropped():
    out = validate_examples([{"input": "wolf", "output": 4}, {"input": "wolf", "output": 4}, {"input": "ox", "output": "2"}], "w")
    assert out == [{"input": "wolf", "output": "4"}, {"input": "ox", "output": "2"}]


def test_missing_split_file(tmp_path):
    d = _write_task(tmp_path, "t")
    (d / "valid.json").unlink()
    with pytest.raises(TaskError, match="missing valid.json"):
        load_task(d)


def test_split_keeps_inputs_together_and_is_seeded():
    ex = [{"input": f"i{i % 30}", "output": f"o{i}"} for i in range(60)]
    a = split_examples(ex, seed=3)
    assert a == split_examples(ex, seed=3)
    assert a != split_examples(ex, seed=4)
    inputs = [{e["input"] for e in a[s]} for s in ("train", "valid", "test")]
    assert not (inputs[0] & inputs[2]) and not (inputs[0] & inputs[1]) and not (inputs[1] & inputs[2])
    assert sum(len(v) for v in a.values()) == 60


def test_json_task(tmp_path):
    p = tmp_path / "words.json"
    p.write_text(json.dumps([{"input": f"w{i}", "output": f"W{i}"} for i in range(50)]))
    t = load_json_task(p, seed=1)
    assert t.name == "words" and len(t.train) + len(t.valid) + len(t.test) == 50


def test_case_sensitivity_guess():
    assert guess_case_sensitive([{"input": "apple", "output": "Apple"}, {"input": "dog", "output": "D"}])
    assert not guess_case_sensitive([{"input": "France", "output": "Paris"}, {"input": "apple", "output": "a"}])


def test_builtin_task_splits_and_unknown_names():
    t = builtin_task("capitalize")
    assert t.case_sensitive and len(t.train) > len(t.test) > 0
    assert t.test[0]["output"] == t.test[0]["input"].capitalize()
    with pytest.raises(TaskError, match="available: .*capitalize"):
        builtin_task("nope")
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        resolve_tasks(["nope"])


def test_fv57_loads_in_place(fv57):
    tasks = resolve_tasks(["antonym", "word_length"], fv57)
    assert [t.name for t in tasks] == ["antonym", "word_length"]
    assert tasks[1].train[0]["output"].isdigit()  # integers in the file become strings
    assert not tasks[0].case_sensitive
    assert resolve_tasks(["capitalize"], fv57)[0].case_sensitive
