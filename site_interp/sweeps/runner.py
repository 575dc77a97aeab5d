"""Run a sweep: find what is already done, compute the rest on an executor, write, tabulate.

:func:`run_sweep` is the driver. For every cell it asks :func:`~site_interp.pipeline.load_run`
which tasks are complete under ``<out>/<cell dir>/`` (a partial or missing task is recomputed; an
artifact made with other settings stops the sweep with
:class:`~site_interp.artifacts.ArtifactMismatchError`), hands the incomplete cells to the executor,
and writes each outcome as it arrives with :func:`~site_interp.pipeline.save_run` (atomic files,
the same layout as ``python -m site_interp.run``), so a sweep killed halfway resumes where it
stopped. Then it builds the :class:`~site_interp.sweeps.tables.GridTables`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Literal, Mapping, Protocol, Sequence

import pandas as pd
from tqdm.auto import tqdm

from site_interp.artifacts import read_json, slug, write_atomic
from site_interp.errors import ConfigError, UserError
from site_interp.pipeline import TaskRun, load_run, save_run
from site_interp.sweeps.executors import CellJob, CellOutcome, OnDone, OnStart, expected_model_id
from site_interp.sweeps.grid import Cell, SweepGrid, expand_cells
from site_interp.sweeps.tables import GridTables, grid_tables
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from site_interp.studies.runner import StudyConfig

Status = Literal["queued", "running", "computed", "cached", "missing"]
STATUSES = ("queued", "running", "computed", "cached", "missing")


class Executor(Protocol):
    name: str

    def run(self, jobs: Sequence[CellJob], on_start: OnStart, on_done: OnDone) -> None: ...

    def close(self) -> None: ...


@dataclass
class CellStatus:
    """What happened to one cell in this sweep."""

    cell: Cell
    """The cell."""
    model_id: str
    """Its model's id in the artifacts."""
    status: Status = "queued"
    """``cached`` (complete before), ``computed`` (now), ``missing`` (``report_only``, incomplete),
    ``queued``/``running`` while the sweep runs."""
    n_tasks: int = 0
    """Tasks of the cell."""
    n_computed: int = 0
    """Tasks computed by this sweep (the rest were reused)."""
    seconds: float = 0.0
    """Compute wall time on the worker (model load excluded; 0 when cached)."""
    load_seconds: float = 0.0
    """Model load time the worker spent just before this cell."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    """Sum over the cell's computed tasks of each stage (embedding, training, evaluation)."""
    worker: str = ""
    """``host:pid`` that computed it."""
    restarted: bool = False
    """Computed by a Ray actor restarted after its process died."""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if not 0 <= self.n_computed <= max(self.n_tasks, len(self.cell.tasks)):
            raise ValueError(f"n_computed {self.n_computed} is not between 0 and the cell's {len(self.cell.tasks)} tasks")

    def to_dict(self) -> dict:
        return {"model": self.cell.model, "model_id": self.model_id, "cell": self.cell.directory,
                "seed": self.cell.seed, **self.cell.override_values(), "tasks": " ".join(self.cell.tasks),
                "status": self.status, "n_tasks": self.n_tasks, "n_computed": self.n_computed,
                "seconds": self.seconds, "load_seconds": self.load_seconds,
                **{f"{k}_seconds": v for k, v in self.stage_seconds.items()}, "worker": self.worker,
                "restarted": self.restarted}


@dataclass
class SweepResult:
    """The outcome of :func:`run_sweep`."""

    grid: SweepGrid
    """What was asked."""
    cells: list[CellStatus]
    """One status per cell, in grid order."""
    tables: GridTables
    """The grid's tables over the complete cells."""
    runs: dict[str, list[TaskRun]]
    """Each complete cell's runs, by :attr:`Cell.key`."""
    executor: str = "local"
    """``local`` or ``ray``."""
    seconds: float = 0.0
    """Wall time of the sweep (driver side, artifacts and tables included)."""

    @property
    def n_computed(self) -> int:
        """Cells this sweep computed (any of their tasks)."""
        return sum(c.status == "computed" for c in self.cells)

    @property
    def n_cached(self) -> int:
        return sum(c.status == "cached" for c in self.cells)

    def to_dataframe(self) -> pd.DataFrame:
        """One row per cell: status, tasks computed, seconds, worker."""
        return pd.DataFrame([c.to_dict() for c in self.cells])


class CellProgress:
    """One progress bar over cells, its postfix counting cells per status and naming the last one."""

    def __init__(self, statuses: Sequence[CellStatus], *, enabled: bool) -> None:
        self.statuses = statuses
        self.enabled = enabled
        self.bar = tqdm(total=len(statuses), desc="cells", unit="cell", disable=not enabled, dynamic_ncols=True)
        self.last = ""

    def update(self, status: CellStatus, advance: bool) -> None:
        if advance:
            self.bar.update(1)
            done = f"{status.status} {status.cell.label}"
            if status.status == "computed":
                done += f" in {status.seconds:.1f} s" + (" (after a worker restart)" if status.restarted else "")
                if self.enabled:
                    self.bar.write(f"  {done} on {status.worker}")
            self.last = done
        counts: dict[str, int] = {}
        for s in self.statuses:
            counts[s.status] = counts.get(s.status, 0) + 1
        order = ("computed", "cached", "running", "queued", "missing")
        text = ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))
        self.bar.set_postfix_str(text + (f" | {self.last}" if self.last else ""), refresh=True)

    def close(self) -> None:
        self.bar.close()


def _study_done(directory: Path, study: StudyConfig) -> bool:
    path = directory / "study.json"
    if not path.exists():
        return False
    stored = read_json(path).get("config")
    return stored == json.loads(json.dumps(study.to_dict()))


def study_dir(out: str | Path, cell: Cell, model_id: str) -> Path:
    """``<out>/<cell dir>/<model>/study/``: the study of a cell (as ``patch`` writes it)."""
    return Path(out) / cell.directory / slug(model_id) / "study"


def run_sweep(
    grid: SweepGrid, tasks_by_seed: Mapping[int, Sequence[Task]], executor: Executor, out: str | Path, *,
    study: StudyConfig | Callable[[Cell], StudyConfig] | None = None, progress: bool = True,
    report_only: bool = False,
) -> SweepResult:
    """Compute every incomplete cell of ``grid`` on ``executor``, write its artifacts under
    ``out``, and tabulate the grid.

    ``tasks_by_seed``: the resolved tasks of ``grid.tasks`` for each seed (built-in tasks are
    split with the seed). ``study``: also run the study over each cell's tasks (needs every task
    in one cell); a configuration, or a function giving each cell's. ``report_only``: compute nothing; tabulate the complete cells.
    """
    t0 = time.perf_counter()
    if set(tasks_by_seed) != set(grid.seeds):
        raise ConfigError(f"tasks_by_seed has seeds {sorted(tasks_by_seed)}, the grid {list(grid.seeds)}")
    if study is not None and grid.task_chunk is not None:
        raise ConfigError("--study runs over every task of a cell: leave out --task-chunk")
    names = [t.name for t in tasks_by_seed[grid.seeds[0]]]
    cells = expand_cells(grid, names)
    placements = getattr(executor, "placements", None) or {}
    ids = {m: expected_model_id(m, placements.get(m)) for m in grid.models}
    statuses = [CellStatus(c, ids[c.model], n_tasks=len(c.tasks)) for c in cells]
    complete: dict[str, dict[str, TaskRun]] = {}
    jobs: list[CellJob] = []
    status_of: dict[str, CellStatus] = {s.cell.key: s for s in statuses}
    for st in statuses:
        cell, cfg = st.cell, st.cell.run_config()
        by_name = {t.name: t for t in tasks_by_seed[cell.seed]}
        cell_out = Path(out) / cell.directory
        found = {}
        for name in cell.tasks:
            run = load_run(st.model_id, by_name[name], cfg, cell_out)
            if run is not None:
                found[name] = run
        complete[cell.key] = found
        missing = [by_name[n] for n in cell.tasks if n not in found]
        cell_study = study(cell) if callable(study) else study
        needs_study = cell_study is not None and not _study_done(study_dir(out, cell, st.model_id), cell_study)
        if not missing and not needs_study:
            st.status = "cached"
        elif report_only:
            st.status = "missing"
        else:
            jobs.append(CellJob(cell, st.model_id, missing, cfg, done=list(found.values()) if cell_study else [],
                                study=cell_study))
    bar = CellProgress(statuses, enabled=progress)
    for st in statuses:
        if st.status in ("cached", "missing"):
            bar.update(st, advance=True)

    def on_start(job: CellJob) -> None:
        status_of[job.cell.key].status = "running"
        bar.update(status_of[job.cell.key], advance=False)

    def on_done(job: CellJob, outcome: CellOutcome) -> None:
        st = status_of[job.cell.key]
        if outcome.model_id != job.model_id:
            raise UserError(f"model {job.cell.model!r} loads as {outcome.model_id!r} on worker {outcome.worker} but as "
                            f"{job.model_id!r} here: give every node the same path, or use a hub id")
        cell_out = Path(out) / job.cell.directory
        for run in outcome.runs:
            save_run(job.model_id, run, job.config, cell_out)
            complete[job.cell.key][run.task.name] = run
        target = study_dir(out, job.cell, job.model_id)
        for rel, data in outcome.study_files.items():
            write_atomic(target / rel, lambda tmp, data=data: Path(tmp).write_bytes(data))
        st.status, st.n_computed, st.seconds = "computed", len(outcome.runs), outcome.seconds
        st.load_seconds, st.worker, st.restarted = outcome.load_seconds, outcome.worker, outcome.restarted
        for run in outcome.runs:
            for stage, secs in run.timings.items():
                st.stage_seconds[stage] = st.stage_seconds.get(stage, 0.0) + secs
        bar.update(st, advance=True)

    try:
        if jobs:
            executor.run(jobs, on_start, on_done)
    finally:
        bar.close()
    lost = [st.cell.key for st in statuses if st.status in ("queued", "running")]
    if lost:
        raise RuntimeError(f"the executor returned without computing {lost}")
    finished = [(st.cell, st.model_id, [complete[st.cell.key][n] for n in st.cell.tasks])
                for st in statuses if st.status in ("cached", "computed")]
    tables = grid_tables(finished, grid.overrides)
    runs = {cell.key: r for cell, _, r in finished}
    return SweepResult(grid, statuses, tables, runs, executor.name, time.perf_counter() - t0)


__all__ = ["CellProgress", "CellStatus", "Executor", "SweepResult", "run_sweep", "study_dir"]
