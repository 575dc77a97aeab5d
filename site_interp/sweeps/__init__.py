"""Sweeps: a grid of models x tasks x seeds x settings, run locally or on a Ray cluster.

- :mod:`~site_interp.sweeps.grid`: :class:`SweepGrid`, its :class:`Cell` s and TOML grid files;
- :mod:`~site_interp.sweeps.placement`: which devices / GPU shares each model gets;
- :mod:`~site_interp.sweeps.executors`: :class:`LocalExecutor`, :class:`RayExecutor` (optional
  ``ray``), and :func:`compute_cell`, the work both run;
- :mod:`~site_interp.sweeps.runner`: :func:`run_sweep`, the driver (resume, artifacts, progress);
- :mod:`~site_interp.sweeps.tables`: the grid's tables (means and bootstrap intervals over seeds
  and tasks, head-set stability, heads by relative depth).

The command is ``python -m site_interp.sweep``; its figures are drawn by
:mod:`site_interp.plots.sweep_figures`. Importing this package imports neither Ray nor a
plotting library.
"""

from site_interp.sweeps.executors import CellJob, CellOutcome, LocalExecutor, RayExecutor, compute_cell, expected_model_id
from site_interp.sweeps.grid import SETTINGS, Cell, SweepGrid, expand_cells, read_grid_file
from site_interp.sweeps.placement import Placement, plan_placement
from site_interp.sweeps.runner import CellStatus, SweepResult, run_sweep
from site_interp.sweeps.tables import GridTables, grid_tables

__all__ = [
    "SETTINGS",
    "Cell",
    "CellJob",
    "CellOutcome",
    "CellStatus",
    "GridTables",
    "LocalExecutor",
    "Placement",
    "RayExecutor",
    "SweepGrid",
    "SweepResult",
    "compute_cell",
    "expand_cells",
    "expected_model_id",
    "grid_tables",
    "plan_placement",
    "read_grid_file",
    "run_sweep",
]
