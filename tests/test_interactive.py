"""Tests for site_interp.plots.interactive (plotly figures; nothing is shown or rendered)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import torch

from site_interp.plots import interactive as I
from site_interp.plots import style

TASKS = ["antonym", "capitalize", "country_capital", "first_letter", "uppercase"]


@pytest.fixture
def alphas() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {t: torch.rand(6, 8, generator=g) for t in TASKS}


@pytest.fixture
def matrix() -> pd.DataFrame:
    rng = np.random.default_rng(2)
    return pd.DataFrame(rng.uniform(0, 100, (5, 5)), index=TASKS, columns=TASKS)


@pytest.fixture
def summary() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for task in TASKS[:2]:
        for sel in ["random", "top", "bottom", "ablate_top", "custom"]:
            for k in [1, 2, 4, 8]:
                acc = float(rng.uniform(5, 95))
                rows.append({"task": task, "selection": sel, "k": k, "accuracy": acc, "lo": acc - 3, "hi": acc + 3})
    return pd.DataFrame(rows)


def _has_fields(template: str, *fields: str) -> bool:
    return all(f in template for f in fields)


def test_alpha_heatmap_hover(alphas):
    a = alphas["antonym"]
    fig = I.interactive_alpha_heatmap(a, task="antonym")
    assert isinstance(fig, go.Figure) and len(fig.data) == 1
    (trace,) = fig.data
    assert trace.type == "heatmap" and (trace.zmin, trace.zmax) == (0.0, 1.0)
    np.testing.assert_allclose(np.asarray(trace.z), a.numpy(), rtol=1e-6)
    assert _has_fields(trace.hovertemplate, "layer", "head", "alpha", "task", ":.3f")
    custom = np.asarray(trace.customdata, dtype=object)
    assert custom.shape == (6, 8, 3)
    assert tuple(custom[2, 5]) == (2, 5, "antonym")  # layer, head, task of that cell
    assert fig.layout.title.text == "antonym"
    fig.to_json()  # serialisable for a notebook


def test_alpha_grid_subplots_and_shared_scale(alphas):
    fig = I.interactive_alpha_grid(alphas, ncols=3)
    assert len(fig.data) == len(TASKS)
    assert len(list(fig.select_xaxes())) == 6  # a 2 x 3 grid
    assert [a.text for a in fig.layout.annotations] == TASKS  # subplot titles
    assert all(t.coloraxis == "coloraxis" for t in fig.data)
    assert (fig.layout.coloraxis.cmin, fig.layout.coloraxis.cmax) == (0.0, 1.0)
    for name, trace in zip(TASKS, fig.data):
        assert _has_fields(trace.hovertemplate, "layer", "head", "alpha", "task")
        assert np.asarray(trace.customdata, dtype=object)[0, 0, 2] == name
    hidden = [ax for ax in fig.select_xaxes() if ax.visible is False]
    assert len(hidden) == 1


def test_transfer_order_and_hover(matrix):
    order = TASKS[::-1]
    fig = I.interactive_transfer(matrix, order=order)
    (trace,) = fig.data
    assert list(trace.x) == order and list(trace.y) == order
    assert trace.z[0][0] == pytest.approx(matrix.loc[order[0], order[0]])
    assert trace.z[0][1] == pytest.approx(matrix.loc[order[0], order[1]])  # row = alphas from
    assert _has_fields(trace.hovertemplate, "alphas from", "evaluated on", "accuracy")
    assert list(np.asarray(trace.customdata, dtype=object)[0, 1]) == [order[0], order[1]]
    assert trace.texttemplate
    assert fig.layout.xaxis.title.text == "evaluated on" and fig.layout.yaxis.title.text == "alphas from"
    norm = I.interactive_transfer(matrix / 50, normalized=True).data[0]
    assert norm.zmid == 1.0 and "accuracy" in norm.hovertemplate


def test_similarity_order_and_hover(matrix):
    sim = matrix / 100
    order = ["uppercase", "antonym"]  # partial order: the rest follow in their own order
    (trace,) = I.interactive_similarity(sim, order=order).data
    expected = ["uppercase", "antonym", "capitalize", "country_capital", "first_letter"]
    assert list(trace.x) == expected and list(trace.y) == expected
    assert _has_fields(trace.hovertemplate, "task a", "task b", "similarity")


def test_patching_traces_and_hover(summary):
    refs = pd.DataFrame({"task": ["antonym", "antonym", "capitalize"], "method": ["0-shot", "SITE", "SITE"],
                         "accuracy": [10.0, 80.0, 70.0]})
    fig = I.interactive_patching(summary, "antonym", references=refs)
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    bands = [t for t in fig.data if t.fill == "toself"]
    ref_lines = [t for t in fig.data if t.mode == "lines"]
    assert [t.name for t in lines] == ["top", "bottom", "random", "ablate_top", "custom"]
    assert len(bands) == 5 and len(ref_lines) == 2 and len(fig.data) == 12
    assert lines[2].line.dash == "dash" and lines[3].line.dash == "dot"
    for t in lines:
        assert _has_fields(t.hovertemplate, "k", "accuracy", "interval")
    row = summary[(summary.task == "antonym") & (summary.selection == "top")].sort_values("k")
    np.testing.assert_allclose(np.asarray(lines[0].customdata, dtype=object)[:, 1].astype(float), row.lo)
    assert fig.layout.xaxis.type == "log" and list(fig.layout.xaxis.tickvals) == [1, 2, 4, 8]
    with pytest.raises(ValueError, match="no rows"):
        I.interactive_patching(summary, "missing")


def test_patching_without_intervals(summary):
    fig = I.interactive_patching(summary.drop(columns=["lo", "hi"]), "capitalize")
    assert len(fig.data) == 5 and all(t.fill is None for t in fig.data)


def test_patching_styles_come_from_style_module(summary):
    refs = pd.DataFrame({"task": ["antonym", "capitalize", "capitalize"], "method": ["0-shot", "SITE", "0-shot"],
                         "accuracy": [10.0, 70.0, 12.0]})
    fig = I.interactive_patching(summary, "capitalize", references=refs)
    lines = {t.name: t for t in fig.data if t.mode == "lines+markers"}
    assert (lines["custom"].line.color, lines["custom"].line.dash) == (style.EXTRA_COLORS[0], "dashdot")
    assert I.SELECTION_COLORS == {n: (s.color, style.PLOTLY_DASHES[s.dash]) for n, s in style.SELECTIONS.items()}
    ref_colors = {t.name: t.line.color for t in fig.data if t.mode == "lines"}
    assert ref_colors == {"0-shot": style.REFERENCE_COLORS[0], "SITE": style.REFERENCE_COLORS[1]}  # by method, all tasks
    band = next(t for t in fig.data if t.fill == "toself")
    assert band.fillcolor.endswith(f",{style.BAND_ALPHA})")
