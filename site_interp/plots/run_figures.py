"""Figures of a run, drawn from what the run wrote or returned.

:func:`make_figures` rebuilds every figure of a finished run from its files alone (safetensors
alphas, CSV tables, JSON) and recomputes nothing; ``python -m site_interp.figures`` is its
command. :func:`save_alpha_heatmaps` draws the alpha map of each task run into that task's
directory; the ``run`` and ``patch`` commands call it after the pipeline, which itself draws
nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from site_interp.errors import UserError
from site_interp.plots import static

STUDY = "study"
"""Sub-directory of a run directory holding the study tables (``python -m site_interp.patch``)."""


def load_alphas(run_dir: str | Path) -> dict[str, torch.Tensor]:
    """Trained alphas of every task directory under ``run_dir`` (sorted by task name)."""
    return {path.parent.name: load_file(str(path))["alpha"] for path in sorted(Path(run_dir).glob("*/alphas.safetensors"))}


def _table(path: Path, **kwargs: Any) -> pd.DataFrame | None:
    """The CSV at ``path``, or None when the run did not write it."""
    return pd.read_csv(path, **kwargs) if path.exists() else None


def make_figures(run_dir: str | Path, out: str | Path | None = None, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Every figure that the files in ``run_dir`` allow, written under ``out`` (default
    ``run_dir/figures``) in each of ``formats``; returns the written paths.

    ``run_dir`` is ``<out>/<model>`` of a finished run. Raises :class:`UserError` when it holds
    no trained alphas.
    """
    run_dir = Path(run_dir)
    dest = Path(out) if out else run_dir / "figures"
    alphas = load_alphas(run_dir)
    if not alphas:
        raise UserError(f"{run_dir}: no */alphas.safetensors; is this <out>/<model> of a finished run?")
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        written.extend(static.save_figure(fig, dest / name, formats))

    for name, alpha in alphas.items():
        save(static.alpha_heatmap(alpha, title=name), f"alpha_{name}")
    save(static.alpha_grid(alphas), "alpha_grid")

    study = run_dir / STUDY
    summary = _table(study / "patching_summary.csv")
    if summary is not None:
        save(static.patching_curves(summary, _table(study / "patching_references.csv")), "patching_curves")

    order = None
    if (study / "clustering.json").exists():
        clustering = json.loads((study / "clustering.json").read_text())
        order = clustering["order"]
        linkage = np.asarray(clustering["linkage"], dtype=float)
        sim = _table(study / f"similarity_{clustering['metric']}.csv", index_col=0)
        if sim is not None and len(sim) > 1:
            save(static.similarity_clustermap(sim, linkage, title=f"head overlap ({clustering['metric']})"),
                 "similarity_clustermap")
            save(static.dendrogram_plot(linkage, list(sim.index)), "dendrogram")

    transfer = _table(study / "transfer.csv", index_col=0)
    if transfer is not None:
        save(static.transfer_heatmap(transfer, order=order), "transfer")
        normalized = _table(study / "transfer_normalized.csv", index_col=0)
        if normalized is not None:
            save(static.transfer_heatmap(normalized, order=order, normalized=True), "transfer_normalized")

    pairs = _table(study / "similarity_vs_transfer.csv")
    if pairs is not None and len(pairs) > 2:
        stats = json.loads((study / "similarity_vs_transfer.json").read_text())
        ci = stats.get("pearson_ci")
        save(static.similarity_vs_transfer_plot(pairs, r=stats.get("pearson_r"), ci=tuple(ci) if ci else None),
             "similarity_vs_transfer")
    return written


def save_alpha_heatmaps(runs: Iterable[Any], model_id: str, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Draw each run's alpha map into ``<run.directory>/alpha_heatmap.<format>``.

    ``runs`` are task runs (``.task.name``, ``.site.alpha``, ``.directory``), e.g. the
    :class:`~site_interp.pipeline.TaskRun` objects of the pipeline; runs without a directory
    (nothing saved) are skipped. ``model_id`` goes into each title. Returns the written files.
    """
    written: list[Path] = []
    for run in runs:
        if run.directory is None:
            continue
        fig = static.alpha_heatmap(run.site.alpha, title=f"{run.task.name}: alpha ({model_id})")
        written += static.save_figure(fig, Path(run.directory) / "alpha_heatmap", formats)
    return written


__all__ = ["STUDY", "load_alphas", "make_figures", "save_alpha_heatmaps"]
