"""Built-in in-context-learning tasks generated offline from packaged data.

Every task is a deterministic list of ``{"input": ..., "output": ...}`` string
pairs, meant to be shown to a language model as ``"Q: {input}\\nA: {output}"``
demonstrations.  Nothing is downloaded at run time and no dataset file is
copied into this repository: the pairs are *computed* from data that ships
inside installed packages or the Python standard library:

* ``pyspellchecker`` (MIT) -- its English word-frequency table ranks words by
  how common they are (the one frequency source shared by all word tasks);
* ``lemminflect`` (MIT) -- its lexicon tells which words are base forms of
  which part of speech and gives plural / past-tense / comparative forms;
* ``countryinfo`` (MIT) -- country names, capitals and populations;
* the standard library (``calendar``, ``string``) and our own arithmetic.

Third-party packages are imported lazily, so importing this module is cheap
and a task only needs the packages it reads.  Generation is cached with
:func:`functools.lru_cache`; callers always receive fresh copies.
"""

from __future__ import annotations

import calendar
import itertools
import locale
import random
import string
import unicodedata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache

from site_interp.tasks.core import Task, TaskError, split_examples, validate_examples

__all__ = [
    "BUILTIN_TASKS",
    "MIN_PAIRS_PER_TASK",
    "BuiltinTaskSpec",
    "builtin_task",
    "builtin_task_names",
    "generate_pairs",
]

#: Every built-in task yields at least this many pairs.
MIN_PAIRS_PER_TASK = 100

Pair = tuple[str, str]
Pairs = tuple[Pair, ...]


@dataclass(frozen=True)
class BuiltinTaskSpec:
    """Description of one built-in task and the function that generates it."""

    name: str
    description: str
    source: str
    case_sensitive: bool
    generate: Callable[[], list[dict[str, str]]]


def _dedupe(pairs: Iterable[Pair]) -> Pairs:
    """Keep the first pair per input (dropping empty ones), in order."""
    seen: set[str] = set()
    out = []
    for inp, outp in pairs:
        if inp and outp and inp not in seen:
            seen.add(inp)
            out.append((inp, outp))
    return tuple(out)


# --------------------------------------------------------------------------
# Common English words (pyspellchecker frequencies + lemminflect lexicon)
# --------------------------------------------------------------------------

_MIN_LEN, _MAX_LEN = 3, 10
_RANK_LIMIT = 20_000  # only look at the 20k most frequent clean words
_MIN_FORM_COUNT = 200  # pyspellchecker gives unseen words a floor count of 50
_MIN_FORM_RATIO = 0.01  # an inflected form must not be vanishingly rare
_WORD_TASK_SIZE = 400  # words used by the spelling / letter tasks
_INFLECTION_TASK_SIZE = 300
_TRIPLES, _TRIPLE_POOL = 300, 300

# Our own short list of profanity / sexual / slur words and archaic or
# name-like junk to keep out of prompts (hand-written, not copied).
# fmt: off
_BLOCKLIST = frozenset(
    {
        "ass", "asses", "bastard", "bitch", "bitchy", "bloody", "boob", "boobs", "butt",
        "butts", "cock", "crap", "damn", "damned", "dick", "fag", "fuck", "gay", "hell",
        "horny", "kinky", "lewd", "naked", "nude", "penis", "piss", "porn", "pussy",
        "randy", "rape", "retard", "sex", "sexier", "sexual", "sexy", "shit", "slut",
        "suck", "sucked", "thee", "thou", "thy", "whore", "whores",
    }
)
# fmt: on
_MODALS = frozenset(
    {"can", "could", "may", "might", "must", "shall", "should", "will", "would", "ought"}
)


def _is_clean_word(word: str) -> bool:
    """Lowercase ASCII letters only, 3-10 long, not blocklisted, not a modal."""
    return (
        _MIN_LEN <= len(word) <= _MAX_LEN
        and word.isascii()
        and word.isalpha()
        and word.islower()
        and word not in _BLOCKLIST
        and word not in _MODALS
    )


@lru_cache(maxsize=1)
def _word_counts() -> dict[str, int]:
    """English word -> corpus count, from pyspellchecker's bundled table."""
    from spellchecker import SpellChecker

    return dict(SpellChecker(language="en", distance=1).word_frequency.dictionary)


def _count(word: str) -> int:
    return _word_counts().get(word, 0)


@lru_cache(maxsize=1)
def _ranked_words() -> tuple[str, ...]:
    """Clean words among the most frequent forms, most frequent first."""
    counts = _word_counts()
    clean = [w for w in counts if _is_clean_word(w)]
    return tuple(sorted(clean, key=lambda w: (-counts[w], w))[:_RANK_LIMIT])


@lru_cache(maxsize=1 << 16)
def _lemmas(word: str) -> dict[str, tuple[str, ...]]:
    """lemminflect's {part of speech: lemmas} of ``word`` (shared; do not mutate)."""
    from lemminflect import getAllLemmas

    return dict(getAllLemmas(word))


@lru_cache(maxsize=1 << 16)
def _inflections(word: str, upos: str) -> dict[str, tuple[str, ...]]:
    """lemminflect's {Penn tag: forms} of ``word`` as ``upos`` (shared; do not mutate)."""
    from lemminflect import getAllInflections

    return dict(getAllInflections(word, upos=upos))


def _lexicon() -> Iterator[tuple[str, frozenset[str]]]:
    """(word, parts of speech) for common clean base-form words, most frequent first.

    A word is kept when the lemminflect lexicon knows it and, for every part
    of speech, its only lemma is the word itself: this drops proper nouns
    (the lexicon is lowercase-sensitive), abbreviations, most function words
    ("the", "and") and inflected forms ("going", "found").  Lazy, so tasks
    only look words up until they have enough.
    """
    for word in _ranked_words():
        lemmas = _lemmas(word)
        if lemmas and all(v == (word,) for v in lemmas.values()):
            yield word, frozenset(lemmas)


def _common_words(n: int = _WORD_TASK_SIZE) -> list[str]:
    return [w for w, _ in itertools.islice(_lexicon(), n)]


def _forms_count(word: str, upos: str, tags: tuple[str, ...]) -> int:
    """Summed corpus count of ``word``'s ``tags`` forms (excluding ``word``)."""
    infl = _inflections(word, upos)
    return sum(_count(f) for f in {f for t in tags for f in infl.get(t, ())} - {word})


def _inflect(word: str, upos: str, tag: str, allowed: frozenset[str] | None = None) -> str | None:
    """The single, reasonably common ``tag`` form of ``word``, or None.

    The form must lemmatise back to ``word`` for ``upos``; any other reading of
    it must be the form itself (the noun "thought"), and, when ``allowed`` is
    given, it may only be read as those parts of speech.
    """
    forms = _inflections(word, upos).get(tag, ())
    if len(forms) != 1 or forms[0] == word or not _is_clean_word(forms[0]):
        return None
    form: str = forms[0]
    if _count(form) < max(_MIN_FORM_COUNT, _MIN_FORM_RATIO * _count(word)):
        return None
    back = _lemmas(form)
    if word not in back.get(upos, ()) or (allowed is not None and set(back) - allowed):
        return None
    if any(not set(v) <= {word, form} for v in back.values()):
        return None
    return form


def _plural() -> Iterable[Pair]:
    for word, pos in _lexicon():
        if "NOUN" not in pos or pos & {"ADJ", "ADV"} or word.endswith("ing"):
            continue
        # Nouns that are also verbs must be used mostly as nouns ("book", not "walk").
        if "VERB" in pos and _forms_count(word, "NOUN", ("NNS",)) < 2 * _forms_count(
            word, "VERB", ("VBD", "VBG")
        ):
            continue
        form = _inflect(word, "NOUN", "NNS")
        if form:
            yield word, form


def _past_tense() -> Iterable[Pair]:
    for word, pos in _lexicon():
        if "VERB" not in pos or pos & {"ADJ", "ADV"}:
            continue
        # Verbs that are also nouns must be used mostly as verbs ("walk", not "time").
        if "NOUN" in pos and _forms_count(word, "VERB", ("VBD", "VBG")) < _forms_count(
            word, "NOUN", ("NNS",)
        ):
            continue
        form = _inflect(word, "VERB", "VBD")
        if form:
            yield word, form


def _comparative() -> Iterable[Pair]:
    for word, pos in _lexicon():
        form = _inflect(word, "ADJ", "JJR", frozenset({"ADJ", "ADV"})) if "ADJ" in pos else None
        if form and form.endswith("er"):  # single-word comparatives only
            yield word, form


def _first_n(fn: Callable[[], Iterable[Pair]], n: int) -> Callable[[], Iterable[Pair]]:
    return lambda: itertools.islice(fn(), n)  # inputs are distinct lexicon words


def _triples(seed: int) -> list[tuple[str, ...]]:
    """Deterministic distinct lists of three distinct common words."""
    rng = random.Random(seed)
    pool = _common_words(_TRIPLE_POOL)
    out: dict[tuple[str, ...], None] = {}
    while len(out) < _TRIPLES:
        out[tuple(rng.sample(pool, 3))] = None
    return list(out)


# --------------------------------------------------------------------------
# Sequences (stdlib calendar / string), numbers, countries
# --------------------------------------------------------------------------

_NUMBER_SEQUENCE_MAX = 80


def _calendar_names() -> tuple[list[str], list[str]]:
    """English day names (Monday first) and month names, lowercased.

    ``calendar`` follows the LC_TIME locale, so read them in the "C" locale
    when a program has switched to a non-English one.
    """

    def read() -> tuple[list[str], list[str]]:
        days = [calendar.day_name[i].lower() for i in range(7)]
        months = [calendar.month_name[i].lower() for i in range(1, 13)]
        return days, months

    current = locale.setlocale(locale.LC_TIME)
    if current in ("C", "POSIX") or current.startswith(("C.", "en_")):
        return read()
    try:
        locale.setlocale(locale.LC_TIME, "C")
        return read()
    finally:
        locale.setlocale(locale.LC_TIME, current)


def _next_item() -> Iterable[Pair]:
    days, months = _calendar_names()
    for cycle in (days, months):  # cyclic: sunday -> monday, december -> january
        yield from ((x, cycle[(i + 1) % len(cycle)]) for i, x in enumerate(cycle))
    letters = string.ascii_lowercase
    yield from itertools.pairwise(letters)
    yield from ((str(n), str(n + 1)) for n in range(1, _NUMBER_SEQUENCE_MAX + 1))


# fmt: off
_ONES = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
    "eighteen", "nineteen",
)
# fmt: on
_TENS = ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def _number_word(n: int) -> str:
    """English words for 0 <= n <= 100, e.g. 42 -> "forty-two"."""
    if not 0 <= n <= 100:
        raise ValueError(f"only 0..100 are supported, got {n}")
    if n == 100:
        return "one hundred"
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens - 2] + ("-" + _ONES[ones] if ones else "")


_MIN_POPULATION = 1_000_000
# Our own exclusions among entries above the population cut: not a UN member
# state, or a defunct/duplicate entry, or a capital that is disputed, split or
# out of date in the package data (the answer would be ambiguous).
# fmt: off
_COUNTRY_EXCLUDE = frozenset(
    {
        "Burma", "Hong Kong", "Palestine", "Puerto Rico", "Scotland", "Taiwan",
        "Serbia and Montenegro", "Bolivia", "Benin", "Israel", "Ivory Coast",
        "Kazakhstan", "South Africa", "Sri Lanka", "Swaziland", "Tanzania",
    }
)
# fmt: on


def _ascii(text: str) -> str:
    """Strip accents ("Bogotá" -> "Bogota"); '' if other non-ASCII is left."""
    stripped = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return stripped.strip() if len(stripped) >= len(text) else ""


def _country_capital() -> Iterable[Pair]:
    from countryinfo import CountryInfo

    try:
        table = CountryInfo.all()  # countryinfo >= 1.0: a classmethod
    except TypeError:
        table = CountryInfo().all()  # countryinfo 0.1.x (Python < 3.11): an instance method
    rows = []
    for info in table.values():
        name, capital = info.get("name"), info.get("capital")
        if not isinstance(name, str) or not isinstance(capital, str):
            continue
        iso = info.get("ISO") or {}
        if name in _COUNTRY_EXCLUDE or not (iso.get("alpha2") and iso.get("alpha3")):
            continue
        name, capital = _ascii(name), _ascii(capital)
        if (info.get("population") or 0) < _MIN_POPULATION or not name or not capital:
            continue
        if capital == name or any(ch in "/;,()" for ch in name + capital):
            continue
        rows.append((-int(info["population"]), name, capital))
    return [(name, capital) for _, name, capital in sorted(rows)]  # best known first


# --------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------

BUILTIN_TASKS: dict[str, BuiltinTaskSpec] = {}


def _register(
    name: str,
    description: str,
    source: str,
    case_sensitive: bool,
    pairs: Callable[[], Iterable[Pair]],
) -> None:
    """Add a task whose (cached) pairs come from ``pairs()``, deduplicated by input."""
    cached = lru_cache(maxsize=None)(lambda: _dedupe(pairs()))

    def generate() -> list[dict[str, str]]:
        return [{"input": i, "output": o} for i, o in cached()]

    generate.__name__ = generate.__qualname__ = f"generate_{name}"
    generate.__doc__ = f"Fresh list of the {name!r} task's pairs (cached, deterministic)."
    BUILTIN_TASKS[name] = BuiltinTaskSpec(name, description, source, case_sensitive, generate)


def _word_map(fn: Callable[[str], Pair]) -> Callable[[], Iterable[Pair]]:
    return lambda: (fn(w) for w in _common_words())


_WORDS = (
    "pyspellchecker English word-frequency table (most common words), "
    "kept if a base form in the lemminflect lexicon"
)
_LISTS = _WORDS + "; lists drawn with a fixed-seed random.Random"
_SEQ = "stdlib calendar (day/month names), string.ascii_lowercase, integers 1-81"
_INFL = "lemminflect {} forms of common {} ranked by pyspellchecker word frequency"

# fmt: off
_register("capitalize", "Capitalize a word.", _WORDS, True,
          _word_map(lambda w: (w, w.capitalize())))
_register("uppercase", "Write a word in upper case.", _WORDS, True,
          _word_map(lambda w: (w, w.upper())))
_register("lowercase", "Write an upper-case word in lower case.", _WORDS, True,
          _word_map(lambda w: (w.upper(), w)))
_register("first_letter", "Give the first letter of a word.", _WORDS, False,
          _word_map(lambda w: (w, w[0])))
_register("last_letter", "Give the last letter of a word.", _WORDS, False,
          _word_map(lambda w: (w, w[-1])))
_register("choose_first_of_3", "Pick the first word of a comma-separated list of three.",
          _LISTS, False, lambda: ((", ".join(t), t[0]) for t in _triples(1001)))
_register("choose_last_of_3", "Pick the last word of a comma-separated list of three.",
          _LISTS, False, lambda: ((", ".join(t), t[-1]) for t in _triples(2002)))
_register("next_item", "Give the next day, month, letter or number.", _SEQ, False, _next_item)
_register("previous_item", "Give the previous day, month, letter or number.", _SEQ, False,
          lambda: ((b, a) for a, b in _next_item()))
_register("plural", "Give the plural of a noun.", _INFL.format("NNS (plural)", "nouns"),
          False, _first_n(_plural, _INFLECTION_TASK_SIZE))
_register("past_tense", "Give the simple past tense of a verb.",
          _INFL.format("VBD (past tense)", "verbs"), False,
          _first_n(_past_tense, _INFLECTION_TASK_SIZE))
_register("comparative", "Give the comparative (-er) form of an adjective.",
          _INFL.format("JJR (comparative)", "adjectives"), False,
          _first_n(_comparative, _INFLECTION_TASK_SIZE))
_register("country_capital", "Give the capital city of a country.",
          "countryinfo data: countries with ISO codes and population >= 1M "
          "(minus a few non-UN / ambiguous-capital entries), accents stripped",
          False, _country_capital)
_register("number_to_word", "Write a number from 0 to 100 in English words.",
          "integers 0-100 spelled by this module", False,
          lambda: ((str(n), _number_word(n)) for n in range(101)))
# fmt: on


def builtin_task_names() -> list[str]:
    """Names of all built-in tasks, in registry order."""
    return list(BUILTIN_TASKS)


def generate_pairs(name: str) -> list[dict[str, str]]:
    """Pairs of the built-in task ``name`` (a fresh list the caller may modify).

    Raises:
        KeyError: if ``name`` is not a built-in task; the message lists them.
    """
    try:
        spec = BUILTIN_TASKS[name]
    except KeyError:
        raise KeyError(
            f"unknown built-in task {name!r}; available: {', '.join(builtin_task_names())}"
        ) from None
    return spec.generate()


def builtin_task(name: str, *, seed: int = 0, fractions: tuple[float, float, float] = (0.7, 0.1, 0.2)) -> Task:
    """The built-in task ``name`` as a :class:`~site_interp.tasks.core.Task`, split with ``seed``."""
    try:
        spec = BUILTIN_TASKS[name]
    except KeyError:
        raise TaskError(f"unknown built-in task {name!r}; available: {', '.join(builtin_task_names())}") from None
    examples = validate_examples(spec.generate(), f"builtin:{name}")
    return Task(
        name=name,
        source=f"builtin:{name} ({spec.source})",
        case_sensitive=spec.case_sensitive,
        **split_examples(examples, seed=seed, fractions=fractions),
    )
