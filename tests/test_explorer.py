"""Tests for site_interp.explorer: run data, card parts, figures, widget, HTML page (headless Chromium)."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import toy_task
from site_interp import EmbeddingConfig, EvalConfig, RunConfig, SiteConfig
from site_interp.artifacts import ArtifactMismatchError, write_json, write_text
from site_interp.baselines.function_vectors import head_output_matrix
from site_interp.explorer import cards as C
from site_interp.explorer import figures as F
from site_interp.explorer.data import RunDataError, find_runs, load_run_data, resolve_task
from site_interp.explorer.export import ExportConfig, export_html, page_data
from site_interp.explorer.session import ExplorerSession, ModelMismatchError
from site_interp.hooks import injection_hooks
from site_interp.pipeline import run_tasks
from site_interp.prompts import encode, zero_shot_batch
from site_interp.scoring import last_token_logits
from site_interp.tasks import TaskError

CFG = RunConfig(embedding=EmbeddingConfig(n_prompts=4, n_shots=3),
                site=SiteConfig(steps=4, batch_size=2, eval_every=2, n_valid=8),
                eval=EvalConfig(n_test=4, n_shots=3, exact_match=False))
CARD = C.CardConfig(n_test=6, n_shots=3, top_tokens=4)
TASKS = [toy_task("toy_a"), toy_task("toy_b", n_train=30), toy_task("toy_c", n_train=35)]
ARTIFACTS = Path(os.environ.get("SITE_INTERP_TEST_ARTIFACTS", Path(tempfile.gettempdir()) / "site_interp_test_artifacts"))
"""Where the browser test copies its screenshot (CI keeps it as a test artifact)."""


@pytest.fixture(scope="module")
def run_dir(tiny_gemma, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("explorer_run")
    run_tasks(tiny_gemma, TASKS, CFG, out, progress=False)
    (model,) = [p for p in out.iterdir() if p.is_dir()]
    return model


@pytest.fixture
def data(run_dir):
    return load_run_data(run_dir)


@pytest.fixture
def session(data, tiny_gemma, tmp_path):
    return ExplorerSession(data, tiny_gemma, tasks=TASKS, config=CARD, cache_dir=tmp_path / "cache", loader=None)


# --------------------------------------------------------------------------- data


def test_run_data_is_read_from_disk_in_dendrogram_order(data, run_dir):
    from safetensors.torch import load_file
    from scipy.cluster.hierarchy import leaves_list

    assert sorted(data.tasks) == ["toy_a", "toy_b", "toy_c"]
    assert data.model_id == "site-interp/tiny-gemma3-seed0"
    assert data.clustering_source == "computed"  # no study/ folder in this run
    assert data.tasks == [data.labels[i] for i in leaves_list(data.linkage)]
    for task in data.tasks:  # rows follow the display order
        expected = load_file(str(run_dir / task / "alphas.safetensors"))["alpha"]
        torch.testing.assert_close(data.alpha(task), expected)
    assert data.embedding("toy_a").shape == (2, 4, 24)
    assert data.transfer is None
    assert set(data.accuracy("toy_a")) == {"0-shot", "3-shot ICL", "SITE"}


def test_study_clustering_and_transfer_are_used_when_present(run_dir, tmp_path):
    copy = tmp_path / "model"
    shutil.copytree(run_dir, copy)
    labels = ["toy_b", "toy_a", "toy_c"]
    sim = pd.DataFrame([[1, .2, .9], [.2, 1, .1], [.9, .1, 1]], index=labels, columns=labels)
    write_text(copy / "study" / "similarity_jaccard.csv", sim.to_csv())
    # toy_b and toy_c merge first, then toy_a: leaves in linkage order are 1 (toy_a), 0, 2 or 0, 2, 1
    write_json(copy / "study" / "clustering.json", {"metric": "jaccard", "order": ["toy_a", "toy_b", "toy_c"],
                                                    "linkage": [[0, 2, 0.1, 2], [1, 3, 0.85, 3]]})
    transfer = pd.DataFrame([[90, 10, 20], [30, 80, 40], [50, 60, 70]], index=labels, columns=labels, dtype=float)
    write_text(copy / "study" / "transfer.csv", transfer.to_csv())
    d = load_run_data(copy)
    assert d.clustering_source == "study"
    assert d.tasks == ["toy_a", "toy_b", "toy_c"]
    assert d.labels == labels
    assert F.transfer_entry(d, "toy_b", "toy_a") == (
        "transfer toy_b\u2192toy_a 10%, toy_a\u2192toy_b 30% (own alphas: 80%, 90%)")
    assert F.transfer_entry(d, "toy_a", "nope") == ""


def test_find_runs_and_errors(run_dir, tmp_path):
    assert find_runs(run_dir.parent) == {str(run_dir.parent): {run_dir.name: run_dir}}
    assert find_runs(run_dir) == {str(run_dir): {run_dir.name: run_dir}}
    with pytest.raises(RunDataError, match="no finished run"):
        find_runs(tmp_path)
    with pytest.raises(RunDataError, match="no \\*/alphas.safetensors"):
        load_run_data(tmp_path)


def test_tasks_are_found_again_and_checked(data):
    assert resolve_task(data, "toy_a", known=TASKS) is TASKS[0]
    wrong = toy_task("toy_a", n_train=20)  # same name, other data: refused by fingerprint
    with pytest.raises(TaskError, match="cannot find the data of task 'toy_a'"):
        resolve_task(data, "toy_a", known=[wrong])


# --------------------------------------------------------------------------- figures


def test_outline_path_draws_one_square_per_cell_above():
    z = np.array([[0.1, 0.7], [0.9, 0.5]])
    xs, ys = F.outline_path(z, 0.5)
    assert xs.count(None) == 2 and len(xs) == 12
    assert (xs[0], ys[0]) == (0.5, -0.5)  # the square around row 0, col 1 starts at its corner
    assert F.outline_path(z, 1.0) == ([], [])


def test_grid_figure_rows_columns_and_dendrogram(data):
    fig = F.grid_figure(data, 0.5, selected=(1, 2))
    heat, outline, sel = fig.data[:3]
    assert heat.type == "heatmap"
    z = np.asarray(heat.z)
    assert z.shape == (3, 8)
    np.testing.assert_allclose(z[1], data.alpha(data.tasks[1]).flatten().numpy(), rtol=1e-6)
    assert list(np.asarray(heat.customdata, dtype=object)[2, 6]) == [data.tasks[2], 1, 2]
    assert list(outline.x).count(None) == int((data.alphas > 0.5).sum())
    assert list(sel.x)[:2] == [5.5, 6.5]
    segments = fig.data[3:]
    assert len(segments) == 2  # n - 1 merges
    ys = {round(y, 6) for s in segments for y in s.y}
    assert {0.0, 1.0, 2.0} <= ys  # leaves sit on the grid's rows
    assert list(fig.layout.yaxis.ticktext) == data.tasks
    fig.to_json()


def test_card_figures(data, session):
    sample = session.attention("toy_b")
    fig = F.attention_figure(sample, 1, 2)
    np.testing.assert_allclose(np.asarray(fig.data[0].y), sample.head(1, 2).numpy())
    assert F.alpha_bar_figure(data, 1, 2).data[0].x == tuple(data.tasks)
    eff = session.effects("toy_b", [(1, 2)])[(1, 2)]
    assert list(F.effects_figure(eff).data[0].x) == list(C.CONDITIONS)
    shared = F.shared_heads(data, "toy_a", "toy_b", 0.5)
    both = (data.alpha("toy_a") > 0.5) & (data.alpha("toy_b") > 0.5)
    assert len(shared) == int(both.sum())
    assert "both > 0.5" in F.compare_figure(data, "toy_a", "toy_b").layout.annotations[2].text


def test_static_figures(data, session):
    from site_interp.explorer.static import card_static, grid_static
    from site_interp.explorer.widget import HeadExplorer

    assert len(grid_static(data, 0.5, (0, 1)).axes) == 3  # dendrogram, grid, colour bar
    ex = HeadExplorer(data.run_dir, session.bridge, tasks=TASKS, config=CARD, widgets=False, cache_dir=session.cache_dir)
    fig = card_static(ex.card(1, 2, "toy_b"))
    assert len(fig.axes) == 4
    assert "L1H2" in fig.texts[0].get_text()


# --------------------------------------------------------------------------- card parts


def test_dla_is_the_heads_vector_through_the_unembedding(tiny_llama, tmp_path):
    # llama: no post-attention norm, so the head's residual contribution is t[l, h] @ W_O[l, h]
    out = tmp_path / "runs"
    run_tasks(tiny_llama, TASKS[:1], CFG, out, progress=False)
    d = load_run_data(next(out.iterdir()))
    t = d.embedding("toy_a")
    table = C.direct_logit_attribution(tiny_llama, {"toy_a": t}, 1, 3, k=5)
    v = t[1, 3] @ head_output_matrix(tiny_llama, 1)[3]
    gain = tiny_llama.ln_final(v[None, None])[0, 0] * v.pow(2).mean().sqrt()
    logits = gain @ tiny_llama.W_U
    special = tiny_llama.tokenizer.all_special_ids
    logits[special] = float("nan")
    order = np.argsort(-np.nan_to_num(logits.numpy(), nan=-np.inf))
    promoted = table[table["direction"] == "promoted"]
    assert list(promoted["token_id"]) == order[:5].tolist()
    np.testing.assert_allclose(promoted["logit"], logits.numpy()[order[:5]], rtol=1e-4, atol=1e-5)
    suppressed = table[table["direction"] == "suppressed"]
    low = np.argsort(np.nan_to_num(logits.numpy(), nan=np.inf))
    assert list(suppressed["token_id"]) == low[:5].tolist()
    assert not set(table["token_id"]) & set(special)


def test_attention_sample_is_the_last_rows_of_the_pattern(tiny_gemma):
    task = TASKS[0]
    s = C.attention_sample(tiny_gemma, task, n_shots=3, seed=1)
    n = len(s.tokens)
    assert s.pattern.shape == (2, 4, n)
    torch.testing.assert_close(s.pattern.sum(-1), torch.ones(2, 4))
    # the same forward captured in full by the bridge's cache
    tokens = torch.tensor([encode(tiny_gemma.tokenizer, s.text)])
    _, cache = tiny_gemma.run_with_cache(tokens)
    torch.testing.assert_close(s.pattern[1], cache["blocks.1.attn.hook_pattern"][0, :, -1].float(), rtol=1e-4, atol=1e-5)
    assert s.roles[0] == "bos" and s.roles[-1] == "query"
    assert {r for r in s.roles if r.endswith("answer")} == {"demo 1 answer", "demo 2 answer", "demo 3 answer"}
    answer_text = "".join(tok for tok, r in zip(s.tokens, s.roles) if r == "demo 1 answer")
    assert answer_text.strip() in {e["output"] for e in task.train}


def test_head_effects_match_an_independent_forward(tiny_gemma, data, tmp_path):
    task = TASKS[1]
    t, alpha = data.embedding(task.name), data.alpha(task.name)
    scorer = C.EffectScorer(tiny_gemma, task, t, alpha, CARD)
    res = C.head_effects(scorer, [(1, 2), (0, 3)], tmp_path)
    batch = zero_shot_batch(tiny_gemma, task, "test", CARD.n_test)

    def reference(a):
        logits = last_token_logits(tiny_gemma, batch.token_ids, injection_hooks(a, t)).float()
        logp = torch.log_softmax(logits, -1)
        acc = (logits.argmax(-1) == batch.target_ids).float().mean() * 100
        return float(acc), float(logp.gather(1, batch.target_ids[:, None]).mean())

    only = torch.zeros_like(alpha)
    only[1, 2] = 1
    removed = alpha.clone()
    removed[1, 2] = 0
    df = res[(1, 2)].set_index("condition")
    for cond, a in [("0-shot", torch.zeros_like(alpha)), ("only this head", only), ("SITE without this head", removed),
                    ("SITE", alpha)]:
        acc, logp = reference(a)
        assert df.loc[cond, "accuracy"] == pytest.approx(acc)
        assert df.loc[cond, "answer_logprob"] == pytest.approx(logp, abs=1e-4)
    assert set(res) == {(1, 2), (0, 3)} and (df["n"] == 6).all()
    # cached on disk: read back without scoring; a cache made with other alphas is refused
    assert sorted(p.name for p in tmp_path.glob("effects_*.json")) == ["effects_L0_H3.json", "effects_L1_H2.json"]
    scorer.score = None  # type: ignore[assignment]  (would fail if called)
    pd.testing.assert_frame_equal(C.head_effects(scorer, [(1, 2)], tmp_path)[(1, 2)], res[(1, 2)])
    other = C.EffectScorer(tiny_gemma, task, t, alpha * 0.5, CARD)
    with pytest.raises(ArtifactMismatchError):
        C.head_effects(other, [(1, 2)], tmp_path)


def test_card_config_is_validated():
    with pytest.raises(ValueError, match="n_test"):
        C.CardConfig(n_test=0)


def test_session_refuses_another_model(data, tiny_llama):
    with pytest.raises(ModelMismatchError, match="site-interp/tiny-gemma3-seed0.*site-interp/tiny-llama-seed0"):
        ExplorerSession(data, tiny_llama)


# --------------------------------------------------------------------------- widget


def test_widget_click_opens_the_card(data, session):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from site_interp.explorer.widget import HeadExplorer

    ex = HeadExplorer(data.run_dir.parent, session.bridge, tasks=TASKS, config=CARD, cache_dir=session.cache_dir,
                      load_models=False, widgets=True)
    assert ex.widget is not None and ex._w_grid.data[0].type == "heatmap"

    class Points:  # what plotly passes to on_click for one heatmap cell
        xs, ys, point_inds = [6], [1], [[1, 6]]

    ex._on_click(ex._w_grid.data[0], Points(), None)
    assert ex.selected == (1, 2) and ex.card_task == data.tasks[1]
    assert "Head L1H2" in ex._w_title.value
    assert all(task in ex._w_dla.value for task in data.tasks)  # what it writes, every task
    assert len(ex._w_attn.data[0].y) == len(session.attention(data.tasks[1]).tokens)  # where it looks
    assert list(ex._w_eff.data[0].x) == list(C.CONDITIONS)  # what it does
    assert len(ex._w_alpha.data[0].y) == 3
    assert list(ex._w_grid.data[2].x)[:2] == [5.5, 6.5]  # the selected column
    ex._w_thr.value = 0.0
    assert list(ex._w_grid.data[1].x).count(None) == 24  # every cell outlined
    ex._w_a.value, ex._w_b.value = "toy_a", "toy_c"
    assert "shared heads" in ex._w_cmp_text.value and len(ex._w_cmp.data) == 3


def test_widget_run_dropdown_switches_runs(run_dir, session, tmp_path):
    pytest.importorskip("ipywidgets")
    pytest.importorskip("anywidget")
    from site_interp.explorer.widget import HeadExplorer

    other = tmp_path / "other_out"
    shutil.copytree(run_dir, other / run_dir.name)
    ex = HeadExplorer([run_dir.parent, other], session.bridge, tasks=TASKS, config=CARD, cache_dir=session.cache_dir,
                      load_models=False, widgets=True)
    assert list(ex._w_run.options) == [str(run_dir.parent), str(other)]
    ex.select_head(0, 1)
    ex._w_run.value = str(other)
    assert ex.data.run_dir == other / run_dir.name and ex.selected is None
    assert list(ex._w_model.options) == [run_dir.name] and ex._w_run.value == str(other)


def test_without_widgets_the_explorer_shows_static_figures(data, session, monkeypatch):
    from site_interp.explorer import widget as Wd

    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj: shown.append(obj))
    ex = Wd.explore(data.run_dir, session.bridge, tasks=TASKS, config=CARD, cache_dir=session.cache_dir, widgets=False)
    assert ex.widget is None
    ex.select_head(0, 1)
    ex._ipython_display_()
    assert "Interactive explorer unavailable" in shown[0].data and Wd.INSTALL_HINT in shown[0].data
    assert [type(x).__name__ for x in shown[1:]] == ["Figure", "Figure"]


# --------------------------------------------------------------------------- HTML export


def _embedded(page: str, element: str) -> dict:
    m = re.search(f'<script type="application/json" id="{element}">(.*?)</script>', page, re.S)
    assert m, element
    return json.loads(m.group(1))


def test_export_is_self_contained_with_cards(session, tmp_path):
    path = export_html(session, tmp_path / "explorer.html", ExportConfig(top_heads=3), progress=False)
    page = path.read_text()
    import plotly.offline

    plotly_js = plotly.offline.get_plotlyjs()
    assert page.count(plotly_js) == 1  # plotly.js inlined
    rest = page.replace(plotly_js, "")
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://", rest)  # nothing else loaded from elsewhere
    d = _embedded(page, "site-data")
    assert d["top_heads"] == [list(h) for h in session.data.top_heads(3)]
    card = d["cards"]["L%dH%d" % tuple(d["top_heads"][0])]
    assert set(card["dla"]) == set(session.data.tasks) and len(card["dla"]["toy_a"]["promoted"]) == CARD.top_tokens
    assert list(card["effects"]) == [session.data.tasks[0]] == d["effect_tasks"]
    assert set(d["attention"]) == set(session.data.tasks)
    grid = _embedded(page, "site-grid")
    assert grid["data"][0]["type"] == "heatmap"


def test_export_without_model_has_the_grid_only(data, tmp_path):
    s = ExplorerSession(data, None, loader=None)
    d = page_data(s, ExportConfig(top_heads=2), progress=False)
    assert d["cards"] and all(set(c) == {"layer", "head"} for c in d["cards"].values())
    assert d["notes"] == ["no model: cards hold the alphas only"]


def test_explore_command(run_dir, tmp_path, capsys):
    from site_interp import explore

    out = tmp_path / "page.html"
    assert explore.main([str(run_dir), "--html", str(out), "--no-model", "--quiet"]) == 0
    assert out.exists() and "no cards" in capsys.readouterr().out
    assert explore.main([str(tmp_path / "missing"), "--html", str(out)]) == 2


CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                    reason="needs Debian's chromium and chromium-driver (apt-get install -y chromium chromium-driver)")
def test_export_in_headless_chromium(session, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install 'site_interp[test]')")
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.actions.action_builder import ActionBuilder
    from selenium.webdriver.support.ui import WebDriverWait

    path = export_html(session, tmp_path / "explorer.html", ExportConfig(top_heads=4), progress=False)
    layer, head = session.data.top_heads(1)[0]
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1400,1700", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not look for drivers online
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(path.as_uri())
        WebDriverWait(driver, 60).until(lambda d: d.find_element("tag name", "body").get_attribute("data-grid-ready") == "1")
        assert driver.execute_script("return document.querySelectorAll('#grid .hm image').length") == 1  # heatmap drawn
        # a real mouse click on the top head's cell in the selected task's row
        x, y = driver.execute_script("""
            const gd = document.getElementById('grid'), fl = gd._fullLayout, r = gd.getBoundingClientRect();
            return [r.left + fl.xaxis2._offset + fl.xaxis2.l2p(arguments[0]), r.top + fl.yaxis2._offset + fl.yaxis2.l2p(0)];
        """, layer * session.data.n_heads + head)
        action = ActionBuilder(driver)
        action.pointer_action.move_to_location(int(x), int(y)).click()
        action.perform()
        WebDriverWait(driver, 20).until(lambda d: d.find_elements("id", "card-title"))
        assert driver.find_element("id", "card-title").text.startswith(f"Head L{layer}H{head}")
        assert driver.find_elements("css selector", "#card-dla table.site-dla")
        assert driver.execute_script("return document.querySelectorAll('#card-alpha .bars path').length") == 3
        assert driver.execute_script("return document.querySelectorAll('#card-attn .bars path').length") > 10
        assert driver.execute_script("return document.querySelectorAll('#card-eff .bars path').length") == 4
        driver.execute_script("window.scrollTo(0, 0)")
        shot = tmp_path / "explorer_grid_card.png"
        driver.save_screenshot(str(shot))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, ARTIFACTS / "explorer_grid_card.png")
        errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
    finally:
        driver.quit()
    assert shot.stat().st_size > 20_000
