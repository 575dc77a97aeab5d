"""Command-line task specs -> tasks, from any source.

A spec is a task name under ``--data-dir``, a task directory, a JSON file, a built-in task
name, a Hugging Face benchmark (``anli:r1``, ``mmlu_pro:math``, ``bbh:date_understanding``; needs
a network once) or ``all`` (every task under ``--data-dir``, or every built-in task without one).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from site_interp.tasks.builtin import BUILTIN_TASKS, builtin_task, builtin_task_names
from site_interp.tasks.core import Task, TaskError, list_task_dir, load_json_task, load_task
from site_interp.tasks.hub import is_hf_spec, load_hf_task


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or "\\" in spec or spec.startswith((".", "~")) or spec.endswith(".json")


def resolve_tasks(specs: Sequence[str], data_dir: str | Path | None = None, *, seed: int = 0) -> list[Task]:
    """Turn command-line task specs into tasks (see the module docstring for what a spec is).

    A bare name is looked up under ``data_dir``, then among the built-in tasks and the Hugging
    Face benchmarks, and only then as a file or directory of the working directory (a folder that
    happens to be called ``plural`` does not shadow the built-in task; write ``./plural`` for it).
    Two tasks with the same name are refused: their artifacts would share a directory.
    """
    if not specs:
        raise TaskError("no tasks given (--tasks)")
    if list(specs) == ["all"]:
        specs = list_task_dir(data_dir) if data_dir else builtin_task_names()
    available_dir = set(list_task_dir(data_dir)) if data_dir else set()
    tasks: list[Task] = []
    for spec in specs:
        path = Path(spec).expanduser()
        if spec in available_dir:
            tasks.append(load_task(Path(data_dir) / spec))
        elif not _looks_like_path(spec) and spec in BUILTIN_TASKS:
            tasks.append(builtin_task(spec, seed=seed))
        elif not _looks_like_path(spec) and is_hf_spec(spec):
            tasks.extend(load_hf_task(spec, seed=seed))
        elif path.is_dir():
            tasks.append(load_task(path))
        elif path.suffix == ".json" and path.is_file():
            tasks.append(load_json_task(path, seed=seed))
        else:
            where = f" or in {data_dir}" if data_dir else ""
            raise TaskError(
                f"unknown task {spec!r}: not a built-in task{where}, a task directory, a JSON file or a "
                f"Hugging Face benchmark (anli, mmlu_pro, bbh; e.g. anli:r1). "
                f"Built-in tasks: {', '.join(builtin_task_names())}"
            )
    seen: dict[str, Task] = {}
    for task in tasks:
        if task.name in seen:
            raise TaskError(
                f"two tasks are named {task.name!r} ({seen[task.name].source} and {task.source}): their "
                "artifacts would share one directory; rename one of the files or directories"
            )
        seen[task.name] = task
    return tasks


__all__ = ["resolve_tasks"]
