"""The grid of a sweep: models x task sets x seeds x setting overrides, and its cells.

A :class:`SweepGrid` holds every setting of ``python -m site_interp.run`` with one or more values
per setting; :func:`expand_cells` turns it into :class:`Cell` s, one pipeline run each (a model,
a set of tasks, a seed, and one value of every setting). A setting given several values is an
*override*: it becomes part of the cell's directory name (``seed1_n-shots5_sparsity0.02``), so
the cells of a sweep never share an artifact; a setting with one value does not.

:func:`read_grid_file` reads the same grid from a small TOML file (see ``docs/scale.md``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from site_interp.embeddings import EmbeddingConfig
from site_interp.errors import ConfigError, UserError
from site_interp.evaluation import EvalConfig
from site_interp.pipeline import RunConfig
from site_interp.training import SiteConfig

Value = int | float


@dataclass(frozen=True)
class SettingSpec:
    """One setting a sweep can vary."""

    name: str
    """Field name (``n_shots``); also the key in a TOML grid file."""
    option: str
    """The command-line option (``--n-shots``)."""
    kind: type
    """``int`` or ``float``."""
    default: Value
    """The value ``python -m site_interp.run`` uses when the option is not given."""
    help: str
    """One line for ``--help``."""

    @property
    def slug(self) -> str:
        """The name in a cell directory (``n-shots``)."""
        return self.option.removeprefix("--")


SETTINGS: dict[str, SettingSpec] = {
    s.name: s
    for s in [
        SettingSpec("n_prompts", "--n-prompts", int, 50, "M: ICL prompts averaged into the task embedding"),
        SettingSpec("n_shots", "--n-shots", int, 10, "N: demonstrations per ICL prompt and in the ICL baseline"),
        SettingSpec("steps", "--steps", int, 400, "Adam steps for the alphas"),
        SettingSpec("lr", "--lr", float, 0.2, "Adam learning rate"),
        SettingSpec("batch_size", "--batch-size", int, 1, "0-shot prompts per training step"),
        SettingSpec("eval_every", "--eval-every", int, 50, "validate every this many steps"),
        SettingSpec("sparsity", "--sparsity", float, 0.0, "coefficient of sum(alpha) in the loss"),
        SettingSpec("n_test", "--n-test", int, 50, "test queries per task (0 = all)"),
        SettingSpec("max_new_tokens", "--max-new-tokens", int, 20, "generation budget for exact match"),
    ]
}
"""The settings a sweep can vary, in the order they appear in a cell's directory name.
Their defaults are ``run``'s (``tests/test_sweep.py`` checks that they stay equal)."""


def _fmt(value: Value) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def _check_value(spec: SettingSpec, value: Any, source: str) -> Value:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and spec.kind is int and isinstance(value, float):
        ok = value.is_integer()
        value = int(value) if ok else value
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{spec.name} ({source}) takes {spec.kind.__name__} values, got {value!r}")
    return spec.kind(value)


@dataclass(frozen=True)
class Cell:
    """One pipeline run of the grid: a model, a task set, a seed and one value per setting."""

    model: str
    """The model as the user named it (``gemma-3-270m``, a directory, a hub id)."""
    tasks: tuple[str, ...]
    """The names of the cell's tasks (all of the grid's, or one chunk of them)."""
    seed: int
    """Seed of prompts, demonstrations and training order."""
    settings: tuple[tuple[str, Value], ...]
    """Every setting of :data:`SETTINGS` with this cell's value, in that order."""
    overrides: tuple[str, ...] = ()
    """The settings the grid varies (they name the cell's directory)."""
    full_prompts: bool = False
    """Train on full prompts (the paper's procedure) instead of the prefix cache."""
    exact_match: bool = True
    """Also score exact match (generation)."""

    def __post_init__(self) -> None:
        names = [n for n, _ in self.settings]
        if names != list(SETTINGS):
            raise ConfigError(f"a cell needs every setting of {list(SETTINGS)} in that order, got {names}")
        unknown = [o for o in self.overrides if o not in SETTINGS]
        if unknown:
            raise ConfigError(f"unknown overrides {unknown}; settings a sweep varies: {', '.join(SETTINGS)}")
        if not self.tasks:
            raise ConfigError(f"cell {self.directory} of {self.model} has no tasks")
        self.run_config()  # range checks of every value, with the option's name

    def value(self, name: str) -> Value:
        """The cell's value of setting ``name``."""
        return dict(self.settings)[name]

    @property
    def directory(self) -> str:
        """The cell's directory under ``--out``: ``seed<k>`` plus ``_<option><value>`` per override."""
        parts = [f"seed{self.seed}"] + [f"{SETTINGS[o].slug}{_fmt(self.value(o))}" for o in self.overrides]
        return "_".join(parts)

    @property
    def key(self) -> str:
        """Unique within a grid: model, directory and tasks."""
        return f"{self.model}|{self.directory}|{','.join(self.tasks)}"

    @property
    def label(self) -> str:
        """Short text for the progress bar."""
        tasks = self.tasks[0] if len(self.tasks) == 1 else f"{len(self.tasks)} tasks"
        return f"{self.model} {self.directory} ({tasks})"

    def override_values(self) -> dict[str, Value]:
        """``{setting: value}`` of the overrides only (the grid table's extra columns)."""
        return {o: self.value(o) for o in self.overrides}

    def run_config(self) -> RunConfig:
        """The pipeline configuration of this cell, exactly as ``run`` builds it from its options."""
        v = dict(self.settings)
        return RunConfig(
            embedding=EmbeddingConfig(n_prompts=v["n_prompts"], n_shots=v["n_shots"], seed=self.seed),
            site=SiteConfig(steps=v["steps"], lr=v["lr"], batch_size=v["batch_size"], eval_every=v["eval_every"],
                            sparsity=v["sparsity"], seed=self.seed, fast=not self.full_prompts),
            eval=EvalConfig(n_test=v["n_test"] or None, n_shots=v["n_shots"], seed=self.seed,
                            exact_match=self.exact_match, max_new_tokens=v["max_new_tokens"]),
        )


@dataclass(frozen=True)
class SweepGrid:
    """Models x tasks x seeds x setting values: everything a sweep computes."""

    models: tuple[str, ...]
    """Models, each as ``--model`` takes it."""
    tasks: tuple[str, ...]
    """Task specs, as ``--tasks`` takes them (built-in names, names under ``data_dir``, files, ``all``)."""
    seeds: tuple[int, ...] = (0,)
    """Seeds; every cell is run once per seed."""
    settings: Mapping[str, tuple[Value, ...]] = field(default_factory=dict)
    """Values per setting of :data:`SETTINGS`; a missing setting takes ``run``'s default, a
    setting with several values is swept."""
    data_dir: str | None = None
    """``--data-dir`` of the task specs."""
    full_prompts: bool = False
    """``--full-prompts`` for every cell."""
    exact_match: bool = True
    """False: ``--no-exact-match`` for every cell."""
    task_chunk: int | None = None
    """Tasks per cell (None: every task of the grid in one cell, trained as one multi-task batch)."""

    def __post_init__(self) -> None:
        if not self.models:
            raise ConfigError("models (--models) must name at least one model")
        if not self.tasks:
            raise ConfigError("tasks (--tasks) must name at least one task")
        for what, values, option in (("models", self.models, "--models"), ("seeds", self.seeds, "--seeds")):
            dupes = sorted({str(v) for v in values if list(values).count(v) > 1})
            if dupes:
                raise ConfigError(f"{what} ({option}) lists {', '.join(dupes)} more than once")
        if not self.seeds or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds (--seeds) must be integers >= 0, got {list(self.seeds)}")
        unknown = sorted(set(self.settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown settings {unknown}; a sweep can vary {', '.join(SETTINGS)}")
        clean: dict[str, tuple[Value, ...]] = {}
        for name, spec in SETTINGS.items():
            values = self.settings.get(name, (spec.default,))
            values = tuple(values) if isinstance(values, (list, tuple)) else (values,)
            if not values:
                raise ConfigError(f"{name} ({spec.option}) needs at least one value")
            values = tuple(_check_value(spec, v, spec.option) for v in values)
            if len(set(values)) != len(values):
                raise ConfigError(f"{name} ({spec.option}) lists a value more than once: {list(values)}")
            clean[name] = values
        object.__setattr__(self, "settings", clean)
        if self.task_chunk is not None and (not isinstance(self.task_chunk, int) or self.task_chunk < 1):
            raise ConfigError(f"task_chunk (--task-chunk) must be an integer >= 1, got {self.task_chunk!r}")
        for combo in self._combos():  # every combination must make a valid configuration
            Cell(self.models[0], ("x",), self.seeds[0], combo, self.overrides, self.full_prompts, self.exact_match)

    @property
    def overrides(self) -> tuple[str, ...]:
        """The settings with more than one value."""
        return tuple(n for n, v in self.settings.items() if len(v) > 1)

    def _combos(self) -> list[tuple[tuple[str, Value], ...]]:
        names = list(self.settings)
        return [tuple(zip(names, vals)) for vals in itertools.product(*(self.settings[n] for n in names))]

    def to_dict(self) -> dict:
        return {"models": list(self.models), "tasks": list(self.tasks), "seeds": list(self.seeds),
                "settings": {k: list(v) for k, v in self.settings.items()}, "data_dir": self.data_dir,
                "full_prompts": self.full_prompts, "exact_match": self.exact_match, "task_chunk": self.task_chunk}


def expand_cells(grid: SweepGrid, task_names: Sequence[str]) -> list[Cell]:
    """The grid's cells, model by model (so a local run loads each model once), then seed,
    overrides and task chunk. ``task_names`` are the resolved tasks of ``grid.tasks``."""
    names = tuple(dict.fromkeys(task_names))
    if len(names) != len(task_names):
        raise ConfigError(f"tasks (--tasks) name a task more than once: {list(task_names)}")
    size = grid.task_chunk or len(names) or 1
    chunks = [names[i:i + size] for i in range(0, len(names), size)]
    return [
        Cell(model, chunk, seed, combo, grid.overrides, grid.full_prompts, grid.exact_match)
        for model in grid.models for seed in grid.seeds for combo in grid._combos() for chunk in chunks
    ]


# ----------------------------------------------------------------------------- TOML grid files

GRID_KEYS = ("models", "tasks", "seeds", "data_dir", "settings", "full_prompts", "exact_match", "task_chunk")
"""Top-level keys of a grid file; ``settings`` is a table of :data:`SETTINGS` names (or options)."""


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def read_grid_file(path: str | Path) -> dict[str, Any]:
    """The grid options of a TOML file, with lists for the multi-valued ones.

    ``models``, ``tasks``, ``seeds``: lists (or one value); ``[settings]``: ``n_shots = [5, 10]``
    or ``steps = 20`` (names with ``_`` or ``-``); ``data_dir``, ``full_prompts``,
    ``exact_match``, ``task_chunk``: one value. Command-line options given explicitly win.
    """
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError as err:
            raise UserError(f"reading {path} needs a TOML parser on Python 3.10: pip install tomli") from err
    path = Path(path)
    if not path.is_file():
        raise UserError(f"grid file {path} (--grid) does not exist: give the path of a TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"grid file {path} (--grid) is not valid TOML: {err}") from err
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise UserError(f"grid file {path} has unknown keys {unknown}; known: {', '.join(GRID_KEYS)}")
    out: dict[str, Any] = {k: data[k] for k in ("data_dir", "full_prompts", "exact_match", "task_chunk") if k in data}
    for k in ("models", "tasks", "seeds"):
        if k in data:
            out[k] = [str(v) for v in _as_list(data[k])] if k != "seeds" else _as_list(data[k])
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise UserError(f"grid file {path}: 'settings' must be a table ([settings]), got {settings!r}")
    out["settings"] = {}
    for key, value in settings.items():
        name = key.replace("-", "_")
        if name not in SETTINGS:
            raise UserError(f"grid file {path}: unknown setting {key!r} under [settings]; "
                            f"known: {', '.join(SETTINGS)}")
        out["settings"][name] = _as_list(value)
    return out


__all__ = ["GRID_KEYS", "SETTINGS", "Cell", "SettingSpec", "SweepGrid", "expand_cells", "read_grid_file"]
