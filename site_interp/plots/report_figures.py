"""Figures of the results page (``python -m site_interp.report``), from a model's
:class:`~site_interp.studies.results_data.ModelEvidence`: the transfer matrix in dendrogram order,
the task dendrogram with task kinds coloured, and head overlap against transfer.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from site_interp.artifacts import slug
from site_interp.plots import static
from site_interp.studies.evidence import centred_transfer
from site_interp.studies.results_data import ModelEvidence

KIND_COLORS = {"abstractive": "#1f4e9c", "extractive": "#c2410c"}
"""Leaf-label colours of the dendrogram by task kind."""


def save_report_figures(e: ModelEvidence, directory: str | Path) -> dict[str, Path]:
    """Draw what ``e`` allows into ``directory``; name -> PNG path (``transfer``, ``dendrogram``,
    ``relation``)."""
    directory = Path(directory)
    name = slug(e.model_id.split("/")[-1])
    out: dict[str, Path] = {}
    short = e.model_id.split("/")[-1]
    if e.transfer is not None:
        fig = static.transfer_heatmap(e.transfer.matrix, order=e.order, annotate=False, width="two",
                                      title=f"alpha transfer, {short} (first-token accuracy, dendrogram order)")
        out["transfer"] = static.save_figure(fig, directory / f"{name}-transfer", dpi=150)[0]
    if e.linkage is not None and e.similarity is not None and len(e.linkage):
        colors = {t: KIND_COLORS[k] for t, k in e.kinds.items() if k in KIND_COLORS}
        fig = static.dendrogram_plot(e.linkage, list(e.similarity.index), orientation="left", width="two",
                                     distance_label="1 − Jaccard of head sets", label_colors=colors,
                                     title=f"tasks by shared heads, {short} (blue abstractive, orange extractive)")
        out["dendrogram"] = static.save_figure(fig, directory / f"{name}-dendrogram", dpi=150)[0]
    if e.transfer is not None and e.similarity is not None and e.overlap_vs_transfer:
        m = centred_transfer(e.transfer.matrix)
        rows = [(a, b, float(e.similarity.loc[a, b]), float(m.loc[a, b]))
                for a in m.index for b in m.columns if a != b and a in e.similarity.index and b in e.similarity.index]
        pairs = pd.DataFrame(rows, columns=["source", "target", "similarity", "transfer"])
        fig = static.similarity_vs_transfer_plot(
            pairs, y_label="transfer − column mean (points)", width="one",
            title=f"{short}: Spearman ρ = {e.overlap_vs_transfer['centred']['rho']:.2f}")
        out["relation"] = static.save_figure(fig, directory / f"{name}-overlap-vs-transfer", dpi=150)[0]
    return out


__all__ = ["KIND_COLORS", "save_report_figures"]
