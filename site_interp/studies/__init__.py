"""The studies around SITE, each one module:

* :mod:`~site_interp.studies.patching` -- top-k vs bottom-k vs random-k heads by alpha, and ablation;
* :mod:`~site_interp.studies.transfer` -- one task's alphas on another task's queries;
* :mod:`~site_interp.studies.similarity` -- head overlap between tasks, its permutation null, clustering;
* :mod:`~site_interp.studies.stability` -- head sets across seeds and batch sizes;
* :mod:`~site_interp.studies.runner` -- all of the above over a set of finished runs, written to disk;
* :mod:`~site_interp.studies.comparison` (+ ``comparison_tables``) -- SITE beside every baseline.

This file only re-exports.
"""

from site_interp.studies.comparison import METHODS, ComparisonConfig, compare_methods
from site_interp.studies.comparison_tables import ComparisonTables, build_tables, load_tables
from site_interp.studies.patching import PatchConfig, PatchingResult, default_ks, head_mask, patching_sweep
from site_interp.studies.runner import StudyConfig, StudyResult, run_study
from site_interp.studies.stability import head_set_stability, variant_configs
from site_interp.studies.transfer import TransferResult, transfer_matrix

__all__ = [
    "METHODS",
    "ComparisonConfig",
    "ComparisonTables",
    "PatchConfig",
    "PatchingResult",
    "StudyConfig",
    "StudyResult",
    "build_tables",
    "compare_methods",
    "default_ks",
    "head_mask",
    "head_set_stability",
    "load_tables",
    "patching_sweep",
    "run_study",
    "transfer_matrix",
    "variant_configs",
]
