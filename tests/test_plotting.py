"""Tests for site_interp.plots.static and run_figures (paper-ready figures; Agg backend, no model)."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from scipy.cluster.hierarchy import leaves_list, linkage  # noqa: E402

from site_interp.plots import run_figures, style  # noqa: E402
from site_interp.errors import UserError  # noqa: E402
from site_interp.plots import interactive as I  # noqa: E402
from site_interp.plots import static as P  # noqa: E402

TASKS = ["antonym", "capitalize", "country_capital", "first_letter", "uppercase"]
SELECTIONS = ["top", "bottom", "random", "ablate_top"]
KS = [1, 2, 4, 8, 16]
DPI = 50  # small PNGs keep the tests fast


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture
def alphas() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {t: torch.rand(6, 8, generator=g) for t in TASKS}


@pytest.fixture
def summary() -> pd.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for task in TASKS[:4]:
        for sel in SELECTIONS + ["custom"]:
            for k in KS:
                acc = float(rng.uniform(5, 95))
                rows.append({"task": task, "selection": sel, "k": k, "accuracy": acc, "lo": acc - 4, "hi": acc + 4})
    return pd.DataFrame(rows)


@pytest.fixture
def references() -> pd.DataFrame:
    methods = ["0-shot", "10-shot ICL", "SITE"]
    return pd.DataFrame([{"task": t, "method": m, "accuracy": 20.0 + 25 * i} for t in TASKS[:4] for i, m in enumerate(methods)])


@pytest.fixture
def matrix() -> pd.DataFrame:
    rng = np.random.default_rng(2)
    return pd.DataFrame(rng.uniform(0, 100, (5, 5)), index=TASKS, columns=TASKS)


@pytest.fixture
def clustered() -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(3)
    points = rng.normal(size=(7, 4))
    names = [f"task{i}" for i in range(7)]
    return pd.DataFrame(np.corrcoef(points), index=names, columns=names), linkage(points, "average")


def _visible(fig) -> list:
    return [ax for ax in fig.axes if ax.get_visible()]


def _check_saved(obj, tmp_path, name: str, width_in: float) -> None:
    """png/pdf/svg exist and are non-empty; the PNG is about ``width_in`` inches wide at DPI."""
    files = P.save_figure(obj, tmp_path / name, formats=("png", "pdf", "svg"), dpi=DPI)
    assert [f.suffix for f in files] == [".png", ".pdf", ".svg"]
    for f in files:
        assert f.exists() and f.stat().st_size > 500, f
    assert files[1].read_bytes()[:5] == b"%PDF-"
    assert b"<svg" in files[2].read_bytes()[:2000]
    h, w = mpimg.imread(files[0]).shape[:2]
    assert 0.75 * width_in * DPI <= w <= 1.2 * width_in * DPI, (w, width_in)
    assert 0.5 * DPI <= h <= 12 * DPI


# ------------------------------------------------------------------ style and sizes


def test_figure_width():
    assert P.figure_width("one") == 3.5 and P.figure_width("two") == 7.0 and P.figure_width(5) == 5.0
    for bad in ("three", 0, -1.0):
        with pytest.raises(ValueError):
            P.figure_width(bad)


def test_paper_fonts_and_rc_restored(alphas):
    before = dict(plt.rcParams)
    fig = P.alpha_heatmap(alphas["antonym"], title="antonym")
    ax = fig.axes[0]
    assert ax.title.get_fontsize() == P.PAPER_RC["axes.titlesize"]
    assert ax.xaxis.label.get_fontsize() == P.PAPER_RC["axes.labelsize"]
    assert all(6 <= t.get_fontsize() <= 9 for t in ax.get_xticklabels() + fig.axes[1].get_yticklabels())
    assert plt.rcParams["font.size"] == before["font.size"]  # the rc context did not leak


def test_figures_are_detached_from_pyplot(alphas):
    fig = P.alpha_heatmap(alphas["antonym"])
    assert plt.get_fignums() == []  # returned, not left open in pyplot
    own, ax = plt.subplots()
    assert P.alpha_heatmap(alphas["antonym"], ax=ax) is own
    assert plt.fignum_exists(own.number)  # a caller's figure stays open
    assert fig.get_axes()  # still drawable and saveable


@pytest.mark.parametrize(("width", "inches"), [("one", 3.5), ("two", 7.0), (5.0, 5.0)])
def test_widths(alphas, summary, width, inches):
    assert P.alpha_heatmap(alphas["antonym"], width=width).get_size_inches()[0] == pytest.approx(inches)
    assert P.patching_curves(summary, width=width).get_size_inches()[0] == pytest.approx(inches)


# ------------------------------------------------------------------ alpha maps


def test_alpha_heatmap(alphas, tmp_path):
    a = alphas["antonym"]
    fig = P.alpha_heatmap(a, title="antonym", mark_above=0.5)
    assert fig.get_size_inches()[0] == pytest.approx(3.5)
    assert len(fig.axes) == 2  # map + colour bar
    ax = fig.axes[0]
    im = ax.images[0]
    assert im.get_clim() == (0.0, 1.0) and im.origin == "lower"
    assert ax.get_ylim()[0] < ax.get_ylim()[1]  # layer 0 at the bottom
    np.testing.assert_allclose(im.get_array(), a.numpy())
    (marks,) = [c for c in ax.collections if isinstance(c, PatchCollection)]
    assert len(marks.get_paths()) == int((a > 0.5).sum())
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer" and ax.get_title() == "antonym"
    _check_saved(fig, tmp_path, "heat", 3.5)


def test_alpha_heatmap_numpy_and_old_call(tmp_path):
    fig = P.alpha_heatmap(np.full((3, 4), 0.2), title="x: alpha")  # the call pipeline.py makes
    assert not [c for c in fig.axes[0].collections if isinstance(c, PatchCollection)]
    files = P.save_figure(fig, tmp_path / "run" / "alpha_heatmap", formats=("png",))
    assert files == [tmp_path / "run" / "alpha_heatmap.png"] and files[0].stat().st_size > 0
    with pytest.raises(ValueError):
        P.alpha_heatmap(np.zeros(4))


def test_alpha_grid(alphas, tmp_path):
    fig = P.alpha_grid(alphas, ncols=3, title="all", mark_above=0.9)
    visible = _visible(fig)
    assert len(visible) == len(TASKS) + 1  # one map per task + one shared colour bar
    assert len(fig.axes) - len(visible) == 1  # the unused 6th cell is hidden
    maps = [ax for ax in visible if ax.images]
    assert [ax.get_title() for ax in maps] == TASKS
    assert all(ax.images[0].get_clim() == (0.0, 1.0) for ax in maps)
    assert sum(ax.get_ylabel() == "alpha" for ax in visible) == 1  # a single colour bar
    assert fig.get_size_inches()[0] == pytest.approx(7.0)
    _check_saved(fig, tmp_path, "grid", 7.0)


# ------------------------------------------------------------------ patching curves


def test_patching_curves(summary, references, tmp_path):
    fig = P.patching_curves(summary, references, ncols=3)
    visible = _visible(fig)
    assert len(visible) == 4 and len(fig.axes) == 6  # 4 tasks on a 2 x 3 grid, 2 cells hidden
    assert [ax.get_title() for ax in visible] == TASKS[:4]
    for ax in visible:
        assert ax.get_xscale() == "log"
        np.testing.assert_allclose(ax.get_xticks(), KS)
        by_label = {line.get_label(): line for line in ax.get_lines()}
        assert set(by_label) == set(SELECTIONS) | {"custom", "0-shot", "10-shot ICL", "SITE"}
        assert by_label["top"].get_color() == P.SELECTION_STYLES["top"]["color"]
        assert by_label["random"].get_linestyle() == "--"
        assert by_label["ablate_top"].get_linestyle() == ":"
        assert by_label["ablate_top"].get_color() == "#d62728"
        assert len(ax.collections) == 5  # one band per selection
    colours = {ax.get_title(): [ln.get_color() for ln in ax.get_lines() if ln.get_label() == "custom"] for ax in visible}
    assert len({c[0] for c in colours.values()}) == 1  # an unknown selection keeps its colour across panels
    assert len(fig.legends) == 1  # one shared legend
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == SELECTIONS + ["custom", "0-shot", "10-shot ICL", "SITE"]
    assert visible[0].get_ylabel() == "accuracy (%)"
    _check_saved(fig, tmp_path, "curves", 7.0)


def test_patching_curves_single_task_zero_k_and_no_band():
    df = pd.DataFrame({"task": "t", "selection": ["top", "top", "random"], "k": [0, 4, 4], "accuracy": [1.0, 50.0, 20.0]})
    fig = P.patching_curves(df, None, ncols=3, width="one")
    assert len(_visible(fig)) == len(fig.axes) == 1
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog" and not ax.collections
    with pytest.raises(ValueError, match="lacks columns"):
        P.patching_curves(df.drop(columns="k"))


# ------------------------------------------------------------------ transfer


def test_transfer_heatmap_order_and_annotations(matrix, tmp_path):
    order = TASKS[::-1]
    fig = P.transfer_heatmap(matrix, order=order, title="transfer")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == order
    assert [t.get_text() for t in ax.get_yticklabels()] == order
    assert ax.get_xlabel() == "evaluated on" and ax.get_ylabel() == "alphas from"
    assert len(ax.texts) == 25
    first = matrix.loc[order[0], order[0]]
    assert ax.texts[0].get_text() == f"{first:.0f}"  # cell (0, 0) is the reordered one
    assert ax.collections[0].get_clim() == (0.0, 100.0)
    _check_saved(fig, tmp_path, "transfer", 3.5)


def test_transfer_heatmap_normalized_and_large():
    rng = np.random.default_rng(4)
    names = [f"t{i}" for i in range(16)]
    m = pd.DataFrame(rng.uniform(0.2, 1.6, (16, 16)), index=names, columns=names)
    fig = P.transfer_heatmap(m, normalized=True)
    ax = fig.axes[0]
    assert not ax.texts  # more than 15 tasks: no annotations
    lo, hi = ax.collections[0].get_clim()
    assert lo + hi == pytest.approx(2.0) and lo < 1.0 < hi  # centred at 1
    assert fig.get_size_inches()[0] == pytest.approx(7.0)


# ------------------------------------------------------------------ clustering


def test_similarity_clustermap_uses_linkage(clustered, tmp_path):
    sim, z = clustered
    g = P.similarity_clustermap(sim, z, title="overlap", vmin=-1, vmax=1)
    leaves = leaves_list(z).tolist()
    assert g.dendrogram_row.reordered_ind == leaves
    assert g.dendrogram_col.reordered_ind == leaves
    assert [t.get_text() for t in g.ax_heatmap.get_xticklabels()] == [sim.index[i] for i in leaves]
    assert g.figure.get_size_inches()[0] == pytest.approx(3.5)
    _check_saved(g, tmp_path, "cluster", 3.5)
    with pytest.raises(ValueError, match="linkage"):
        P.similarity_clustermap(sim, z[:-1])


def test_dendrogram_plot(clustered, tmp_path):
    sim, z = clustered
    labels = list(sim.index)
    fig = P.dendrogram_plot(z, labels, title="tasks")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.get_xticklabels()]
    assert texts == [labels[i] for i in leaves_list(z)]
    assert all(t.get_rotation() == 45 for t in ax.get_xticklabels())
    _check_saved(fig, tmp_path, "dendro", 3.5)
    left = P.dendrogram_plot(z, labels, orientation="left").axes[0]
    assert sorted(t.get_text() for t in left.get_yticklabels()) == sorted(labels)
    with pytest.raises(ValueError):
        P.dendrogram_plot(z, labels[:-1])


def test_similarity_vs_transfer_plot(tmp_path):
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, 30)
    pairs = pd.DataFrame({"source": "a", "target": "b", "similarity": x, "transfer": 20 + 50 * x + rng.normal(0, 5, 30)})
    pairs.loc[0, "transfer"] = np.nan
    fig = P.similarity_vs_transfer_plot(pairs, r=0.42, ci=(0.1, 0.66))
    ax = fig.axes[0]
    assert len(ax.collections[0].get_offsets()) == 29  # the NaN row is dropped
    (line,) = ax.get_lines()
    slope = np.diff(line.get_ydata()[[0, -1]]) / np.diff(line.get_xdata()[[0, -1]])
    d = pairs.dropna()
    assert slope[0] == pytest.approx(np.polyfit(d.similarity, d.transfer, 1)[0])
    (text,) = ax.texts
    assert "r = 0.42" in text.get_text() and "[0.10, 0.66]" in text.get_text() and "n = 29" in text.get_text()
    assert ax.get_xlabel() == "head overlap (Jaccard)" and ax.get_ylabel() == "transfer accuracy (%)"
    _check_saved(fig, tmp_path, "scatter", 3.5)
    assert not P.similarity_vs_transfer_plot(pairs).axes[0].texts


# ------------------------------------------------------------------ saving


def test_save_figure_accepts_grids_and_validates(tmp_path):
    fig, _ = plt.subplots()
    files = P.save_figure(types.SimpleNamespace(fig=fig), tmp_path / "a.png", formats=("png", "svg"), dpi=DPI)
    assert files == [tmp_path / "a.png", tmp_path / "a.svg"]
    assert not plt.fignum_exists(fig.number)  # closed after saving
    with pytest.raises(ValueError, match="unknown figure format"):
        P.save_figure(plt.figure(), tmp_path / "b", formats=("png", "jpg"))
    assert not (tmp_path / "b.png").exists()  # nothing written when a format is bad
    with pytest.raises(TypeError):
        P.save_figure(object(), tmp_path / "c")
    dotted = P.save_figure(plt.figure(), tmp_path / "fig_k1.5", formats=("pdf",))
    assert dotted == [tmp_path / "fig_k1.5.pdf"]


def test_save_figure_writes_atomically(tmp_path, monkeypatch):
    fig, _ = plt.subplots()
    files = P.save_figure(fig, tmp_path / "ok", formats=("png", "pdf"), dpi=DPI)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pdf", "ok.png"]  # no temporary file left
    assert mpimg.imread(files[0]).ndim == 3 and files[1].read_bytes()[:5] == b"%PDF-"  # formats kept despite .tmp
    good = files[0].read_bytes()

    def killed(self, fname, *args, **kwargs):  # a save interrupted after some bytes
        Path(fname).write_bytes(b"\x89PNG partial")
        raise KeyboardInterrupt("killed mid-save")

    monkeypatch.setattr(Figure, "savefig", killed)
    with pytest.raises(KeyboardInterrupt):
        P.save_figure(plt.figure(), tmp_path / "new", formats=("png",))
    assert not (tmp_path / "new.png").exists()
    with pytest.raises(KeyboardInterrupt):
        P.save_figure(plt.figure(), tmp_path / "ok", formats=("png",))
    assert (tmp_path / "ok.png").read_bytes() == good  # the earlier file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.pdf", "ok.png"]


# ------------------------------------------------------------------ shared style


def test_static_and_interactive_share_selection_styles(summary):
    fig = P.patching_curves(summary)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    traces = {t.name: t for t in I.interactive_patching(summary, TASKS[0]).data if t.mode == "lines+markers"}
    assert set(style.SELECTIONS) <= set(lines) and set(style.SELECTIONS) <= set(traces)
    for sel, st in style.SELECTIONS.items():
        assert lines[sel].get_color() == traces[sel].line.color == st.color, sel
        assert lines[sel].get_linestyle() == style.MPL_LINESTYLES[st.dash], sel
        assert traces[sel].line.dash == style.PLOTLY_DASHES[st.dash], sel
    # a selection outside the table gets the first palette colour, dash-dot, in both
    assert lines["custom"].get_color() == traces["custom"].line.color == style.EXTRA_COLORS[0]
    assert lines["custom"].get_linestyle() == "-." and traces["custom"].line.dash == "dashdot"
    assert P.SELECTION_STYLES["random"]["linestyle"] == "--" and I.SELECTION_COLORS["random"] == ("#404040", "dash")


def test_style_helpers():
    styles = style.selection_styles(["x", "random", "y", "top", "x"])
    assert list(styles) == ["top", "random", "x", "y"]  # known first, in table order, then by appearance
    assert styles["y"] == style.SelectionStyle(style.EXTRA_COLORS[1], "dashdot", "diamond")
    assert style.reference_colors(["b", "a", "b"]) == {"b": style.REFERENCE_COLORS[0], "a": style.REFERENCE_COLORS[1]}
    assert [style.format_k(k) for k in (4.0, 1.5, 0)] == ["4", "1.5", "0"]
    np.testing.assert_array_equal(style.to_numpy(torch.ones(2, 3, dtype=torch.bfloat16)), np.ones((2, 3)))
    m = pd.DataFrame(np.arange(9.0).reshape(3, 3), index=list("abc"), columns=list("abc"))
    r = style.reorder_tasks(m, ["c", "zzz", "a"])
    assert list(r.index) == list(r.columns) == ["c", "a", "b"] and r.loc["c", "a"] == 6.0
    assert style.reorder_tasks(m, None) is m


def _loaded_after(statement: str) -> list[str]:
    """Whether matplotlib and plotly are loaded after ``statement``, in a fresh interpreter."""
    code = f"import sys; {statement}; print('matplotlib' in sys.modules, 'plotly' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout.split()


def test_style_and_package_import_no_plotting_library():
    assert _loaded_after("import site_interp.plots.style") == ["False", "False"]
    assert _loaded_after("import site_interp.plots") == ["False", "False"]
    # the package's re-exports load the static module on use, and still never plotly
    assert _loaded_after("from site_interp.plots import alpha_heatmap") == ["True", "False"]


# ------------------------------------------------------------------ run figures


def _runs(tmp_path, names):
    g = torch.Generator().manual_seed(0)
    return [types.SimpleNamespace(task=types.SimpleNamespace(name=n), site=types.SimpleNamespace(alpha=torch.rand(4, 6, generator=g)),
                                  directory=None if d is None else tmp_path / d) for n, d in names]


def test_save_alpha_heatmaps(tmp_path, monkeypatch):
    titles = []
    real = P.save_figure

    def spy(fig, path, formats=("png",), **kwargs):
        titles.append(fig.axes[0].get_title())
        return real(fig, path, formats, **kwargs)

    monkeypatch.setattr(P, "save_figure", spy)
    runs = _runs(tmp_path, [("a", "a"), ("skipped", None), ("b", "nested/b")])
    files = run_figures.save_alpha_heatmaps(runs, "org/tiny-model")
    assert files == [tmp_path / "a" / "alpha_heatmap.png", tmp_path / "nested" / "b" / "alpha_heatmap.png"]
    for f in files:
        assert mpimg.imread(f).ndim == 3
    assert titles == ["a: alpha (org/tiny-model)", "b: alpha (org/tiny-model)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "nested"]  # nothing for the run without a directory
    assert run_figures.save_alpha_heatmaps([], "m") == []


def test_make_figures_from_run_files(tmp_path, summary):
    g = torch.Generator().manual_seed(0)
    for task in TASKS[:2]:
        (tmp_path / task).mkdir()
        save_file({"alpha": torch.rand(4, 6, generator=g)}, str(tmp_path / task / "alphas.safetensors"))
    assert list(run_figures.load_alphas(tmp_path)) == TASKS[:2]
    (tmp_path / "study").mkdir()
    summary.to_csv(tmp_path / "study" / "patching_summary.csv", index=False)
    files = run_figures.make_figures(tmp_path, formats=("png", "svg"))
    names = {f.name for f in files}
    assert names == {f"{stem}.{ext}" for stem in ["alpha_antonym", "alpha_capitalize", "alpha_grid", "patching_curves"]
                     for ext in ("png", "svg")}
    assert all(f.parent == tmp_path / "figures" and f.stat().st_size > 0 for f in files)


def test_make_figures_and_command_refuse_a_non_run_directory(tmp_path, capsys):
    with pytest.raises(UserError, match="no \\*/alphas.safetensors"):
        run_figures.make_figures(tmp_path)
    from site_interp.figures import main

    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "alphas.safetensors" in err
    assert not (tmp_path / "figures").exists()
