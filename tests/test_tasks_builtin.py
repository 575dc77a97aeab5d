"""Tests for site_interp.builtin_tasks (offline, packaged-data ICL tasks)."""

from __future__ import annotations

import dataclasses
import locale
import string

import pytest

from site_interp.tasks import builtin as bt
from site_interp.tasks.builtin import (
    BUILTIN_TASKS,
    MIN_PAIRS_PER_TASK,
    BuiltinTaskSpec,
    builtin_task_names,
    generate_pairs,
)

NAMES = builtin_task_names()
WORD_TASKS = ["capitalize", "uppercase", "first_letter", "last_letter"]


def as_map(name: str) -> dict[str, str]:
    return {p["input"]: p["output"] for p in generate_pairs(name)}


def is_clean_word(word: str) -> bool:
    return word.isascii() and word.isalpha() and word.islower() and 3 <= len(word) <= 10


# ---------------------------------------------------------------- registry


def test_registry_shape() -> None:
    assert len(NAMES) >= 10
    assert list(BUILTIN_TASKS) == NAMES
    assert len(set(NAMES)) == len(NAMES)
    for name, spec in BUILTIN_TASKS.items():
        assert isinstance(spec, BuiltinTaskSpec)
        assert spec.name == name
        assert spec.description and "\n" not in spec.description
        assert spec.source and "\n" not in spec.source
        assert isinstance(spec.case_sensitive, bool)
        assert callable(spec.generate)


def test_spec_is_frozen() -> None:
    spec = BUILTIN_TASKS["capitalize"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.name = "other"  # type: ignore[misc]


def test_case_sensitive_flags() -> None:
    for name in ("capitalize", "uppercase", "lowercase"):
        assert BUILTIN_TASKS[name].case_sensitive
    for name in (
        "first_letter",
        "last_letter",
        "plural",
        "past_tense",
        "next_item",
        "country_capital",
        "number_to_word",
    ):
        assert not BUILTIN_TASKS[name].case_sensitive


def test_unknown_name_raises_key_error_listing_names() -> None:
    with pytest.raises(KeyError) as info:
        generate_pairs("no_such_task")
    message = str(info.value)
    assert "no_such_task" in message
    for name in NAMES:
        assert name in message


# ------------------------------------------------------ generic properties


@pytest.mark.parametrize("name", NAMES)
def test_pairs_are_well_formed(name: str) -> None:
    pairs = generate_pairs(name)
    assert len(pairs) >= MIN_PAIRS_PER_TASK
    inputs = []
    for pair in pairs:
        assert isinstance(pair, dict)
        assert set(pair) == {"input", "output"}
        for field in ("input", "output"):
            value = pair[field]
            assert isinstance(value, str) and value.strip() == value and value
            assert "\n" not in value and "\r" not in value
            assert value.isascii() and value.isprintable()
        inputs.append(pair["input"])
    assert len(set(inputs)) == len(inputs), "duplicate inputs"


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_returns_copies(name: str) -> None:
    first = generate_pairs(name)
    assert first == generate_pairs(name) == BUILTIN_TASKS[name].generate()
    first[0]["output"] = "MUTATED"
    first.append({"input": "x", "output": "y"})
    again = generate_pairs(name)
    assert again[0]["output"] != "MUTATED"
    assert len(again) == len(first) - 1


def test_not_every_task_is_trivially_identity() -> None:
    for name in NAMES:
        pairs = generate_pairs(name)
        assert sum(p["input"] == p["output"] for p in pairs) == 0, name


# ------------------------------------------------------------ spot checks


@pytest.mark.parametrize("name", WORD_TASKS)
def test_word_task_inputs_are_clean_common_words(name: str) -> None:
    words = [p["input"] for p in generate_pairs(name)]
    assert all(is_clean_word(w) for w in words)
    # common words only: some everyday words must be there, junk must not
    assert {"people", "house", "father", "water"} & set(words)
    assert not {"fuck", "shit", "the", "and"} & set(words)


def test_capitalize_uppercase_lowercase() -> None:
    for inp, out in as_map("capitalize").items():
        assert out == inp.capitalize() and out != inp
    for inp, out in as_map("uppercase").items():
        assert out == inp.upper()
    for inp, out in as_map("lowercase").items():
        assert inp == inp.upper() and out == inp.lower() and is_clean_word(out)


def test_first_and_last_letter() -> None:
    for inp, out in as_map("first_letter").items():
        assert out == inp[0]
    for inp, out in as_map("last_letter").items():
        assert out == inp[-1]
    assert len(set(as_map("first_letter").values())) >= 15  # varied answers


@pytest.mark.parametrize("name,index", [("choose_first_of_3", 0), ("choose_last_of_3", -1)])
def test_choose_of_3(name: str, index: int) -> None:
    answers = []
    for inp, out in as_map(name).items():
        items = inp.split(", ")
        assert len(items) == 3 and len(set(items)) == 3
        assert all(is_clean_word(w) for w in items)
        assert out == items[index]
        answers.append(out)
    assert len(set(answers)) >= 50


def test_next_and_previous_item() -> None:
    nxt = as_map("next_item")
    assert nxt["monday"] == "tuesday"
    assert nxt["sunday"] == "monday"
    assert nxt["january"] == "february"
    assert nxt["december"] == "january"
    assert nxt["a"] == "b" and nxt["y"] == "z" and "z" not in nxt
    assert nxt["1"] == "2" and nxt["9"] == "10"
    for inp, out in nxt.items():
        if inp.isdigit():
            assert int(out) == int(inp) + 1
        elif len(inp) == 1:
            assert ord(out) == ord(inp) + 1
    prev = as_map("previous_item")
    assert prev["tuesday"] == "monday" and prev["january"] == "december"
    assert prev == {out: inp for inp, out in nxt.items()}


def test_calendar_names_ignore_a_non_english_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    real = locale.setlocale
    original = real(locale.LC_TIME)
    german = "de_DE.UTF-8"  # pretend this LC_TIME is active (it may not be installed)

    calls: list[str | None] = []

    def fake(category: int, value: str | None = None) -> str:
        if category == locale.LC_TIME:
            calls.append(value)
            if value in (None, german):
                return german
        return real(category, value)

    monkeypatch.setattr(locale, "setlocale", fake)
    try:
        days, months = bt._calendar_names()
    finally:
        real(locale.LC_TIME, original)
    assert "C" in calls  # names were read under the C locale
    assert days[0] == "monday" and months[-1] == "december"


def test_plural() -> None:
    plural = as_map("plural")
    for inp, out in plural.items():
        assert is_clean_word(inp) and is_clean_word(out) and out != inp
    regular = sum(out in (inp + "s", inp + "es", inp[:-1] + "ies") for inp, out in plural.items())
    assert regular >= 0.8 * len(plural)
    for singular, expected in {
        "child": "children",
        "woman": "women",
        "city": "cities",
        "car": "cars",
        "box": "boxes",
    }.items():
        if singular in plural:
            assert plural[singular] == expected
    assert {"child", "woman", "car", "year"} & set(plural)


def test_past_tense() -> None:
    past = as_map("past_tense")
    for inp, out in past.items():
        assert is_clean_word(inp) and is_clean_word(out) and out != inp
    for verb, expected in {
        "walk": "walked",
        "take": "took",
        "go": "went",
        "see": "saw",
        "bring": "brought",
        "stop": "stopped",
        "try": "tried",
    }.items():
        if verb in past:
            assert past[verb] == expected
    assert {"walk", "take", "know", "bring"} & set(past)
    assert not {"time", "man", "can", "will"} & set(past)  # noun-dominant words, modals


def test_comparative() -> None:
    comp = as_map("comparative")
    for inp, out in comp.items():
        assert is_clean_word(inp) and out.endswith("er") and out != inp
    for adj, expected in {"big": "bigger", "happy": "happier", "small": "smaller"}.items():
        if adj in comp:
            assert comp[adj] == expected


def test_country_capital() -> None:
    capitals = as_map("country_capital")
    for country, capital in {
        "France": "Paris",
        "Japan": "Tokyo",
        "Germany": "Berlin",
        "Egypt": "Cairo",
        "Brazil": "Brasilia",
    }.items():
        if country in capitals:
            assert capitals[country] == capital
    assert {"France", "Japan", "Germany"} <= set(capitals)
    assert "Hong Kong" not in capitals and "Puerto Rico" not in capitals
    for country, capital in capitals.items():
        assert country[0].isupper() and capital[0].isupper()


def test_number_to_word() -> None:
    words = as_map("number_to_word")
    assert [int(k) for k in words] == list(range(101))
    assert words["0"] == "zero" and words["13"] == "thirteen"
    assert words["21"] == "twenty-one" and words["40"] == "forty"
    assert words["99"] == "ninety-nine" and words["100"] == "one hundred"
    letters = set(string.ascii_lowercase) | {"-", " "}
    assert all(set(w) <= letters for w in words.values())
    assert len(set(words.values())) == len(words)
    with pytest.raises(ValueError):
        bt._number_word(101)
