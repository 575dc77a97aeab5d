"""Validating configuration fields, once, where a config is built (its ``__post_init__``).

Every config dataclass checks its fields with these helpers, so the Python API and every command
give the same message for the same mistake, naming the field, the command-line option that sets
it, what it must be and what it was::

    n_prompts (--n-prompts) must be an integer >= 1, got 0
"""

from __future__ import annotations

import math
from typing import Any, Iterable

from site_interp.errors import ConfigError


def _name(field: str, option: str | None) -> str:
    return f"{field} ({option})" if option else field


def check_int(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None,
              option: str | None = None, none_ok: bool = False) -> None:
    """``value`` is an integer in ``[minimum, maximum]`` (or None when ``none_ok``)."""
    if value is None and none_ok:
        return
    bounds = []
    if minimum is not None:
        bounds.append(f">= {minimum}")
    if maximum is not None:
        bounds.append(f"<= {maximum}")
    must = "an integer" + (" " + " and ".join(bounds) if bounds else "") + (" or None" if none_ok else "")
    ok = isinstance(value, int) and not isinstance(value, bool)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    if not ok:
        raise ConfigError(f"{_name(field, option)} must be {must}, got {value!r}")


def check_float(value: Any, field: str, *, minimum: float | None = None, maximum: float | None = None,
                above: float | None = None, option: str | None = None) -> None:
    """``value`` is a finite number ``>= minimum``, ``> above`` and ``<= maximum``."""
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if minimum is not None:
        bounds.append(f">= {minimum:g}")
    if maximum is not None:
        bounds.append(f"<= {maximum:g}")
    must = "a finite number" + (" " + " and ".join(bounds) if bounds else "")
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (minimum is None or value >= minimum) and (maximum is None or value <= maximum)
    ok = ok and (above is None or value > above)
    if not ok:
        raise ConfigError(f"{_name(field, option)} must be {must}, got {value!r}")


def check_choice(value: Any, field: str, choices: Iterable[Any], *, option: str | None = None) -> None:
    """``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(f"{_name(field, option)} must be one of {', '.join(map(str, choices))}; got {value!r}")


def check_subset(values: Iterable[Any], field: str, choices: Iterable[Any], *, option: str | None = None,
                 nonempty: bool = True) -> None:
    """Every item of ``values`` is one of ``choices`` (and there is at least one when ``nonempty``)."""
    values, choices = tuple(values), tuple(choices)
    bad = [v for v in values if v not in choices]
    if bad or (nonempty and not values):
        what = f"unknown {bad}" if bad else "nothing"
        raise ConfigError(f"{_name(field, option)} must name some of {', '.join(map(str, choices))}; got {what}")


__all__ = ["check_choice", "check_float", "check_int", "check_subset"]
