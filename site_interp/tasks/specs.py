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


def resolve_tasks(specs: Sequence[str], data_dir: str | Path | None = None, *, seed: int = 0) -> list[Task]:
    """Turn command-line task specs into tasks (see the module docstring for what a spec is)."""
    if list(specs) == ["all"]:
        specs = list_task_dir(data_dir) if data_dir else builtin_task_names()
    available_dir = set(list_task_dir(data_dir)) if data_dir else set()
    tasks = []
    for spec in specs:
        path = Path(spec)
        if spec in available_dir:
            tasks.append(load_task(Path(data_dir) / spec))
        elif path.is_dir():
            tasks.append(load_task(path))
        elif path.suffix == ".json" and path.exists():
            tasks.append(load_json_task(path, seed=seed))
        elif spec in BUILTIN_TASKS:
            tasks.append(builtin_task(spec, seed=seed))
        elif is_hf_spec(spec):
            tasks.extend(load_hf_task(spec, seed=seed))
        else:
            where = f" or in {data_dir}" if data_dir else ""
            raise TaskError(
                f"unknown task {spec!r}: not a built-in task{where}, a task directory, a JSON file or a "
                f"Hugging Face benchmark (anli, mmlu_pro, bbh; e.g. anli:r1). "
                f"Built-in tasks: {', '.join(builtin_task_names())}"
            )
    return tasks


__all__ = ["resolve_tasks"]
