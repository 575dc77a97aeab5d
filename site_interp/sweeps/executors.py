"""Who computes a sweep's cells: this process (``local``) or the actors of a Ray cluster (``ray``).

Both executors run the same function on a loaded model, :func:`compute_cell` (the pipeline on the
cell's missing tasks, all trained as one multi-task batch, plus the optional study), and hand each
:class:`CellOutcome` to the driver's ``on_done``, which writes the artifacts. Workers write
nothing: a Ray cluster needs no shared file system.

* :class:`LocalExecutor` loads one model at a time and runs its cells in grid order.
* :class:`RayExecutor` starts, per model, ``replicas`` actors that each load the model once and
  then take that model's cells one after another; every actor reserves its model's
  ``num_cpus``/``num_gpus`` (:mod:`site_interp.sweeps.placement`). An actor whose process dies
  (killed, out of memory, a lost node) is restarted and its cell retried (``max_restarts``,
  ``max_task_retries``); as results only count once they reach the driver, nothing is lost or
  written twice.

Ray is optional (``pip install -e ".[ray]"``) and imported only by :class:`RayExecutor`.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from site_interp.errors import UserError
from site_interp.loading import ModelError, load_model, resolve_model_id
from site_interp.pipeline import RunConfig, TaskRun, model_id, run_tasks
from site_interp.sweeps.grid import Cell
from site_interp.sweeps.placement import Placement
from site_interp.tasks.core import Task

if TYPE_CHECKING:
    from transformer_lens.model_bridge import TransformerBridge

    from site_interp.studies.runner import StudyConfig

log = logging.getLogger(__name__)

CRASH_ENV = "SITE_INTERP_SWEEP_CRASH_ONCE"
"""Test hook: a file path. While that file does not exist, the first Ray actor to finish a cell
creates it and kills its own process (``os._exit(1)``) before returning the result, so the
cell must be retried on a restarted actor. Read by the driver and handed to the actors."""

RAY_INSTALL = 'pip install -e ".[ray]"  (or: pip install "ray>=2.9")'


def expected_model_id(name: str, placement: Placement | None = None) -> str:
    """The model id that :func:`~site_interp.loading.load_model` gives ``name`` with
    ``placement``'s options (its precision tag included), without loading it
    (:func:`~site_interp.loading.resolve_model_id`): the driver checks artifacts before any
    worker has the model. Unknown models are a one-line error naming ``--models``."""
    kwargs = _load_kwargs(placement) if placement is not None else {}
    try:
        return resolve_model_id(name, **kwargs)
    except ModelError as err:
        raise ModelError(f"--models: {err}") from None


@dataclass
class CellJob:
    """What a worker needs to compute one cell."""

    cell: Cell
    """The cell."""
    model_id: str
    """The id its artifacts carry (:func:`expected_model_id`)."""
    tasks: list[Task]
    """The cell's tasks still to compute."""
    config: RunConfig
    """The cell's pipeline configuration."""
    done: list[TaskRun] = field(default_factory=list)
    """The cell's finished runs (only sent when the study needs every task)."""
    study: StudyConfig | None = None
    """Run the study (patching, transfer, similarity, clustering) over the cell's tasks."""

    def __post_init__(self) -> None:
        names = [t.name for t in [*self.tasks, *self.done]]
        stray = [n for n in names if n not in self.cell.tasks]
        if stray or len(set(names)) != len(names):
            raise ValueError(f"a job of cell {self.cell.key} must hold each of its tasks at most once, got {names}")


@dataclass
class CellOutcome:
    """What a worker sends back for one cell."""

    model_id: str
    """The id of the model the worker loaded (checked against the job's)."""
    runs: list[TaskRun]
    """One run per task of the job, with tensors and per-query records."""
    study_files: dict[str, bytes] = field(default_factory=dict)
    """The study's files, by path relative to the study directory (empty without a study)."""
    seconds: float = 0.0
    """Wall time of the cell on the worker (model load excluded)."""
    load_seconds: float = 0.0
    """Time the worker spent loading the model before this cell (0 when it was loaded already)."""
    worker: str = ""
    """``host:pid`` of the process that computed it."""
    restarted: bool = False
    """True when a Ray actor computed it after a restart (its first process died)."""


def compute_cell(bridge: TransformerBridge, job: CellJob, *, progress: bool = False) -> CellOutcome:
    """The pipeline on the job's tasks (one :func:`~site_interp.pipeline.run_tasks` call, nothing
    written), then the study when asked; the study's files come back as bytes."""
    t0 = time.perf_counter()
    runs = run_tasks(bridge, list(job.tasks), job.config, None, progress=progress)
    files: dict[str, bytes] = {}
    if job.study is not None:
        from site_interp.studies.runner import run_study

        by_name = {r.task.name: r for r in [*job.done, *runs]}
        ordered = [by_name[name] for name in job.cell.tasks]
        with tempfile.TemporaryDirectory(prefix="site-sweep-study-") as tmp:
            run_study(bridge, ordered, job.study, tmp, progress=progress)
            files = {str(p.relative_to(tmp)): p.read_bytes() for p in sorted(Path(tmp).rglob("*")) if p.is_file()}
    return CellOutcome(model_id=model_id(bridge), runs=runs, study_files=files, seconds=time.perf_counter() - t0,
                       worker=f"{socket.gethostname()}:{os.getpid()}")


def _load_kwargs(placement: Placement) -> dict:
    """:func:`~site_interp.loading.load_model`'s options of ``placement`` (dtype as a torch dtype)."""
    kwargs = placement.load_kwargs()
    kwargs["dtype"] = getattr(torch, kwargs["dtype"]) if kwargs["dtype"] else None
    return kwargs


def _load(model: str, placement: Placement) -> TransformerBridge:
    return load_model(model, **_load_kwargs(placement))


def _free(bridge: Any) -> None:
    del bridge
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


OnStart = Callable[[CellJob], None]
OnDone = Callable[[CellJob, CellOutcome], None]


class LocalExecutor:
    """Cells in this process, one model at a time (each model loaded once, then released)."""

    name = "local"

    def __init__(self, placements: dict[str, Placement], *, set_threads: bool = False, progress: bool = False) -> None:
        """``set_threads``: run each model with its placement's torch threads (``--cpus-per-model``);
        otherwise torch's default (all cores)."""
        self.placements = placements
        self.set_threads = set_threads
        self.progress = progress

    def run(self, jobs: Sequence[CellJob], on_start: OnStart, on_done: OnDone) -> None:
        models = list(dict.fromkeys(job.cell.model for job in jobs))
        before = torch.get_num_threads()
        try:
            for model in models:
                if self.set_threads:
                    torch.set_num_threads(self.placements[model].threads)
                t0 = time.perf_counter()
                bridge = _load(model, self.placements[model])
                load_s = time.perf_counter() - t0
                for job in (j for j in jobs if j.cell.model == model):
                    on_start(job)
                    outcome = compute_cell(bridge, job, progress=self.progress)
                    outcome.load_seconds, load_s = load_s, 0.0
                    on_done(job, outcome)
                _free(bridge)
        finally:
            torch.set_num_threads(before)

    def close(self) -> None:
        pass


class ModelWorker:
    """The body of a Ray actor: one model, loaded on the first cell and kept for the next ones."""

    def __init__(self, model: str, placement: Placement, crash_marker: str | None = None) -> None:
        self.model = model
        self.placement = placement
        self.crash_marker = crash_marker
        self.bridge: Any = None
        torch.set_num_threads(placement.threads)

    def compute(self, job: CellJob) -> CellOutcome:
        import ray

        load_s = 0.0
        if self.bridge is None:
            t0 = time.perf_counter()
            self.bridge = _load(self.model, self.placement)
            load_s = time.perf_counter() - t0
        outcome = compute_cell(self.bridge, job)
        outcome.load_seconds = load_s
        outcome.restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        if self.crash_marker and not Path(self.crash_marker).exists():
            Path(self.crash_marker).write_text(f"{outcome.worker} died after computing {job.cell.key}\n")
            os._exit(1)  # the test hook: a worker lost mid-cell, its result never sent
        return outcome


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`~site_interp.errors.UserError` that says how to install it."""
    try:
        import ray
    except ModuleNotFoundError as err:
        raise UserError(f"--executor ray needs Ray, which is not installed: {RAY_INSTALL}") from err
    return ray


class RayExecutor:
    """Cells on a Ray cluster: per model ``replicas`` actors, each keeping its model loaded."""

    name = "ray"

    def __init__(self, address: str | None = None, *, replicas: int = 1, max_restarts: int = 3,
                 crash_marker: str | None = None, num_cpus: int | None = None) -> None:
        """Join the cluster at ``address`` (``auto``, ``host:port``, ``ray://host:port``), or start
        a local one when None (with ``num_cpus`` CPUs; None: all). A session already
        initialised in this process (``ray.init`` by the caller) is used as it is."""
        if replicas < 1:
            raise UserError(f"--replicas must be >= 1, got {replicas}")
        self.ray = require_ray()
        self.replicas = replicas
        self.max_restarts = max_restarts
        self.crash_marker = crash_marker if crash_marker is not None else os.environ.get(CRASH_ENV)
        self.started = False
        if not self.ray.is_initialized():
            try:
                self.ray.init(address=address, num_cpus=num_cpus if address is None else None,
                              include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            except ConnectionError as err:
                raise UserError(f"cannot join the Ray cluster at --address {address}: {err}. Start one with "
                                "`ray start --head`, or leave out --address to start a local cluster") from err
            self.started = True
        self.placements: dict[str, Placement] = {}
        self._remote: Any = None

    @property
    def available_gpus(self) -> int:
        """GPUs in the whole cluster."""
        return int(self.ray.cluster_resources().get("GPU", 0))

    @property
    def available_cpus(self) -> float:
        return float(self.ray.cluster_resources().get("CPU", 0))

    def _actor(self, model: str) -> Any:
        p = self.placements[model]
        if p.num_cpus > self.available_cpus:
            raise UserError(f"--cpus-per-model gives {model} {p.num_cpus:g} CPUs but the Ray cluster has "
                            f"{self.available_cpus:g}: ask for fewer")
        if self._remote is None:
            self._remote = self.ray.remote(ModelWorker)
        remote = self._remote.options(
            num_cpus=p.num_cpus, num_gpus=p.num_gpus, max_restarts=self.max_restarts,
            max_task_retries=self.max_restarts,
        )
        return remote.remote(model, p, self.crash_marker)

    def run(self, jobs: Sequence[CellJob], on_start: OnStart, on_done: OnDone) -> None:
        ray = self.ray
        queues: dict[str, deque[CellJob]] = {}
        for job in jobs:
            queues.setdefault(job.cell.model, deque()).append(job)
        actors = {m: [self._actor(m) for _ in range(min(self.replicas, len(q)))] for m, q in queues.items()}
        inflight: dict[Any, tuple[Any, CellJob]] = {}

        def submit(actor: Any, model: str) -> bool:
            if not queues[model]:
                return False
            job = queues[model].popleft()
            on_start(job)
            inflight[actor.compute.remote(job)] = (actor, job)
            return True

        try:
            for model, pool in actors.items():
                for actor in pool:
                    submit(actor, model)
            while inflight:
                (ref,), _ = ray.wait(list(inflight), num_returns=1)
                actor, job = inflight.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    cause = getattr(err, "cause", None)
                    if isinstance(cause, UserError):
                        raise cause from None
                    raise
                on_done(job, outcome)
                if not submit(actor, job.cell.model):
                    ray.kill(actor)  # its model has no cells left: free its CPUs / GPUs
        finally:
            for pool in actors.values():
                for actor in pool:
                    try:
                        ray.kill(actor)
                    except Exception:  # already gone
                        pass

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()


__all__ = [
    "CRASH_ENV",
    "RAY_INSTALL",
    "CellJob",
    "CellOutcome",
    "LocalExecutor",
    "ModelWorker",
    "RayExecutor",
    "compute_cell",
    "expected_model_id",
    "require_ray",
]
