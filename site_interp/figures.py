"""``python -m site_interp.figures RUN_DIR``: regenerate every figure of a finished run.

Reads only what a run wrote (safetensors alphas, CSV tables, JSON), recomputes nothing, and
writes the figures into ``RUN_DIR/figures`` (or ``--out``) in the requested formats.
``RUN_DIR`` is ``<out>/<model>`` of ``python -m site_interp.run`` / ``python -m site_interp.patch``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from site_interp import plotting

STUDY = "study"


def load_alphas(run_dir: str | Path) -> dict[str, torch.Tensor]:
    """Trained alphas of every task directory under ``run_dir`` (sorted by task name)."""
    out = {}
    for path in sorted(Path(run_dir).glob("*/alphas.safetensors")):
        out[path.parent.name] = load_file(str(path))["alpha"]
    return out


def _read_csv(path: Path, **kwargs) -> pd.DataFrame | None:
    return pd.read_csv(path, **kwargs) if path.exists() else None


def make_figures(run_dir: str | Path, out: str | Path | None = None, formats: Sequence[str] = ("png",)) -> list[Path]:
    """Every figure that the files in ``run_dir`` allow; returns the written paths."""
    run_dir = Path(run_dir)
    out = Path(out) if out else run_dir / "figures"
    written: list[Path] = []
    alphas = load_alphas(run_dir)
    if not alphas:
        raise FileNotFoundError(f"{run_dir}: no */alphas.safetensors; is this <out>/<model> of a finished run?")
    for name, alpha in alphas.items():
        written += plotting.save_figure(plotting.alpha_heatmap(alpha, title=name), out / f"alpha_{name}", formats)
    written += plotting.save_figure(plotting.alpha_grid(alphas), out / "alpha_grid", formats)
    study = run_dir / STUDY
    summary = _read_csv(study / "patching_summary.csv")
    if summary is not None:
        refs = _read_csv(study / "patching_references.csv")
        written += plotting.save_figure(plotting.patching_curves(summary, refs), out / "patching_curves", formats)
    transfer = _read_csv(study / "transfer.csv", index_col=0)
    order = None
    if (study / "clustering.json").exists():
        clustering = json.loads((study / "clustering.json").read_text())
        order = clustering["order"]
        linkage = np.asarray(clustering["linkage"], dtype=float)
        sim = _read_csv(study / f"similarity_{clustering['metric']}.csv", index_col=0)
        if sim is not None and len(sim) > 1:
            grid = plotting.similarity_clustermap(sim, linkage, title=f"head overlap ({clustering['metric']})")
            written += plotting.save_figure(grid, out / "similarity_clustermap", formats)
            written += plotting.save_figure(plotting.dendrogram_plot(linkage, list(sim.index)), out / "dendrogram", formats)
    if transfer is not None:
        written += plotting.save_figure(plotting.transfer_heatmap(transfer, order=order), out / "transfer", formats)
        norm = _read_csv(study / "transfer_normalized.csv", index_col=0)
        if norm is not None:
            written += plotting.save_figure(plotting.transfer_heatmap(norm, order=order, normalized=True),
                                            out / "transfer_normalized", formats)
    pairs = _read_csv(study / "similarity_vs_transfer.csv")
    if pairs is not None and len(pairs) > 2:
        stats = json.loads((study / "similarity_vs_transfer.json").read_text())
        ci = stats.get("pearson_ci")
        written += plotting.save_figure(
            plotting.similarity_vs_transfer_plot(pairs, r=stats.get("pearson_r"), ci=tuple(ci) if ci else None),
            out / "similarity_vs_transfer", formats,
        )
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m site_interp.figures", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="<out>/<model> directory of a finished run")
    p.add_argument("--out", default=None, help="where to write the figures (default RUN_DIR/figures)")
    p.add_argument("--formats", nargs="+", default=["png"], choices=list(plotting.FORMATS),
                   help="file formats (png pdf svg); default png")
    args = p.parse_args(argv)
    try:
        paths = make_figures(args.run_dir, args.out, args.formats)
    except FileNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
