"""Tasks: ``{"input", "output"}`` pairs split into train / valid / test, from several sources.

* :mod:`~site_interp.tasks.core` -- the :class:`Task` type, validation, and task files
  (function-vector directories, single JSON lists);
* :mod:`~site_interp.tasks.builtin` -- 14 tasks generated offline from installed packages;
* :mod:`~site_interp.tasks.hub` -- ANLI / MMLU-Pro / BBH through ``datasets`` (a network once);
* :mod:`~site_interp.tasks.specs` -- command-line task specs to tasks, from any of the above.

This file only re-exports; each submodule imports what it needs from ``core`` directly.
"""

from site_interp.tasks.builtin import builtin_task, builtin_task_names
from site_interp.tasks.core import (
    SPLITS,
    Example,
    Task,
    TaskError,
    guess_case_sensitive,
    list_task_dir,
    load_json_task,
    load_task,
    load_task_dir,
    split_examples,
    validate_examples,
)
from site_interp.tasks.specs import resolve_tasks

__all__ = [
    "SPLITS",
    "Example",
    "Task",
    "TaskError",
    "builtin_task",
    "builtin_task_names",
    "guess_case_sensitive",
    "list_task_dir",
    "load_json_task",
    "load_task",
    "load_task_dir",
    "resolve_tasks",
    "split_examples",
    "validate_examples",
]
