"""The self-contained HTML page of the explorer's export: CSS, markup and plain JavaScript.

:func:`render_page` fills one template with the inlined plotly.js, the grid figure's JSON and
the page data (alphas, precomputed cards, attention samples, transfer). The script draws the
grid, redraws the threshold outline when the slider moves, shows a head's card when a grid cell
is clicked (alpha across tasks for any head; what it writes, where it looks and what it does for
the precomputed heads) and compares two tasks. It loads nothing from the network.
"""

from __future__ import annotations

import html
import json
from typing import Any

CSS = """
body { font-family: system-ui, -apple-system, 'Segoe UI', sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 18px 0 6px; } h3 { font-size: 14px; margin: 12px 0 4px; }
.meta, .note { color: #666; font-size: 12px; }
.controls { display: flex; gap: 18px; align-items: center; flex-wrap: wrap; margin: 8px 0; font-size: 13px; }
#card { border: 1px solid #ccc; border-radius: 6px; padding: 10px 14px; margin-top: 10px; background: #fcfcfc; }
#card.empty { color: #777; }
.parts { display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 10px; }
table.site-dla, table.site-eff { border-collapse: collapse; font-size: 12px; }
table.site-dla td, table.site-dla th, table.site-eff td, table.site-eff th { border-bottom: 1px solid #e4e4e4; padding: 3px 8px; text-align: left; vertical-align: top; }
code { background: #f1f1f1; padding: 0 3px; border-radius: 3px; }
"""

SCRIPT = r"""
(function () {
  const D = JSON.parse(document.getElementById('site-data').textContent);
  const FIG = JSON.parse(document.getElementById('site-grid').textContent);
  const nT = D.tasks.length, nL = D.n_layers, nH = D.n_heads;
  const grid = document.getElementById('grid');
  const $ = (id) => document.getElementById(id);
  const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
  const shown = (t) => (t.trim() !== t || t === '') ? JSON.stringify(t).slice(1, -1) : t;
  const label = (l, h) => 'L' + l + 'H' + h;
  const alpha = (t, l, h) => D.alphas[t][l * nH + h];
  const layout = (title, extra) => Object.assign({ template: FIG.layout.template, height: 300,
    margin: { l: 50, r: 10, t: 36, b: 90 }, title: { text: title, x: 0.01, font: { size: 13 } } }, extra || {});
  const state = { head: null, task: D.card_task, threshold: D.threshold };

  function outline(th) {
    const xs = [], ys = [];
    for (let t = 0; t < nT; t++) for (let c = 0; c < nL * nH; c++) if (D.alphas[t][c] > th) {
      xs.push(c - .5, c + .5, c + .5, c - .5, c - .5, null); ys.push(t - .5, t - .5, t + .5, t + .5, t - .5, null);
    }
    return [xs, ys];
  }

  function setThreshold(th) {
    state.threshold = th;
    $('thr-value').textContent = th.toFixed(2);
    const [xs, ys] = outline(th);
    Plotly.restyle(grid, { x: [xs], y: [ys] }, [1]);
    const n = D.alphas.reduce((s, row) => s + row.filter((v) => v > th).length, 0);
    $('thr-count').textContent = n + ' of ' + (nT * nL * nH) + ' task-head cells above';
    if (state.head) showCard(state.head[0], state.head[1]);
    compare();
  }

  function bar(div, x, y, colors, title, yTitle, extra) {
    Plotly.newPlot(div, [{ type: 'bar', x: x, y: y, marker: { color: colors },
      hovertemplate: '%{x}: %{y:.3f}<extra></extra>' }],
      layout(title, Object.assign({ yaxis: { title: { text: yTitle } }, xaxis: { type: 'category', tickangle: -40 } }, extra || {})),
      { displaylogo: false, responsive: true });
  }

  function roleColor(r) {
    if (r.endsWith('input')) return '#6baed6';
    if (r.endsWith('answer')) return '#08519c';
    return { bos: '#bbbbbb', separator: '#dddddd', query: '#d62728' }[r] || '#999999';
  }

  function showCard(l, h) {
    state.head = [l, h];
    const key = label(l, h), card = D.cards[key];
    const c = l * nH + h;
    Plotly.restyle(grid, { x: [[c - .5, c + .5, c + .5, c - .5, c - .5]], y: [[-.5, -.5, nT - .5, nT - .5, -.5]] }, [2]);
    const box = $('card');
    box.classList.remove('empty');
    const vals = D.tasks.map((t, i) => alpha(i, l, h));
    let html = '<h2 id="card-title">Head ' + key + ' <span class="meta">layer ' + l + ', head ' + h +
      '; alpha max ' + Math.max(...vals).toFixed(3) + ', mean ' + (vals.reduce((a, b) => a + b, 0) / nT).toFixed(3) + '</span></h2>';
    if (!card) html += '<p class="note" id="card-missing">Only the alphas of this head are in this page: cards were precomputed for the top ' +
      D.top_heads.length + ' heads (' + D.top_heads.map((p) => label(p[0], p[1])).join(', ') + ').</p>';
    html += '<div class="controls">task of the prompt and effects: <select id="card-task">' +
      D.tasks.map((t) => '<option' + (t === state.task ? ' selected' : '') + '>' + esc(t) + '</option>').join('') + '</select></div>';
    html += '<div class="parts"><div><h3>Alpha across tasks</h3><div id="card-alpha"></div></div>';
    html += '<div><h3>What it writes <span class="meta">(direct logit attribution of t[l, h])</span></h3><div id="card-dla"></div></div>';
    html += '<div><h3>Where it looks <span class="meta">(attention at the last token)</span></h3><div id="card-attn"></div></div>';
    html += '<div><h3>What it does <span class="meta">(patch this head only / remove it from SITE)</span></h3><div id="card-eff"></div></div></div>';
    box.innerHTML = html;
    $('card-task').addEventListener('change', (e) => { state.task = e.target.value; showCard(l, h); });
    bar('card-alpha', D.tasks, vals, vals.map((v) => v > state.threshold ? '#e8112d' : '#08519c'),
      key + ': alpha across tasks', 'alpha', { yaxis: { title: { text: 'alpha' }, range: [0, 1.02] } });
    if (card && card.dla) {
      let t = '<p class="note">' + esc(D.dla_note) + '</p><table class="site-dla"><tr><th>task</th><th>promoted</th><th>suppressed</th></tr>';
      for (const task of D.tasks) {
        const d = card.dla[task]; if (!d) continue;
        const cell = (xs) => xs.map((p) => '<code>' + esc(shown(p[0])) + '</code>&nbsp;<small>' + (p[1] >= 0 ? '+' : '') + p[1].toFixed(2) + '</small>').join(' ');
        t += '<tr' + (task === state.task ? ' style="background:#fff4d6"' : '') + '><td>' + esc(task) + '</td><td>' + cell(d.promoted) + '</td><td>' + cell(d.suppressed) + '</td></tr>';
      }
      $('card-dla').innerHTML = t + '</table>';
    } else $('card-dla').innerHTML = '<p class="note">not computed for this head</p>';
    const sample = D.attention[state.task];
    if (card && sample && sample.heads[key]) {
      const w = sample.heads[key];
      Plotly.newPlot('card-attn', [{ type: 'bar', x: w.map((_, i) => i), y: w, marker: { color: sample.roles.map(roleColor) },
        customdata: sample.tokens.map((tok, i) => [i + ': ' + JSON.stringify(tok), sample.roles[i]]),
        hovertemplate: '%{customdata[0]}<br>%{customdata[1]}<br>attention %{y:.3f}<extra></extra>' }],
        layout(key + ' on a ' + D.n_shots + '-shot prompt of ' + state.task, { height: 320,
          xaxis: { tickvals: w.map((_, i) => i), ticktext: sample.tokens.map((t) => shown(t).slice(0, 8)), tickangle: -90, tickfont: { size: 8 } },
          yaxis: { title: { text: 'attention' }, rangemode: 'tozero' } }), { displaylogo: false, responsive: true });
    } else $('card-attn').innerHTML = '<p class="note">not computed for this head and task</p>';
    const eff = card && card.effects ? card.effects[state.task] : null;
    if (eff) {
      bar('card-eff', eff.map((r) => r.condition), eff.map((r) => r.accuracy), ['#bbbbbb', '#1b9e77', '#d95f02', '#08519c'],
        key + ' on ' + state.task + ' (' + eff[0].n + ' test queries)', 'accuracy (%)', { yaxis: { title: { text: 'accuracy (%)' }, range: [0, 105] }, xaxis: { type: 'category' } });
      const rows = eff.map((r) => '<tr><td>' + esc(r.condition) + '</td><td>' + r.accuracy.toFixed(1) + '%</td><td>' + r.answer_logprob.toFixed(2) + '</td></tr>').join('');
      $('card-eff').insertAdjacentHTML('beforeend', '<table class="site-eff"><tr><th>condition</th><th>accuracy</th><th>mean log p(answer)</th></tr>' + rows + '</table>');
    } else $('card-eff').innerHTML = '<p class="note">not precomputed for this head on ' + esc(state.task) + ' (precomputed tasks: ' +
      esc(D.effect_tasks.join(', ') || 'none') + ')</p>';
  }

  function compare() {
    const a = $('cmp-a').value, b = $('cmp-b').value;
    const ia = D.tasks.indexOf(a), ib = D.tasks.indexOf(b), th = state.threshold;
    const shared = [];
    let union = 0;
    for (let c = 0; c < nL * nH; c++) {
      const x = D.alphas[ia][c] > th, y = D.alphas[ib][c] > th;
      if (x && y) shared.push(label(Math.floor(c / nH), c % nH));
      if (x || y) union++;
    }
    let text = shared.length + ' heads above ' + th.toFixed(2) + ' in both (Jaccard ' + (union ? (shared.length / union).toFixed(2) : 'n/a') + ')';
    const T = D.transfer;
    if (T && T[a] && T[b] && T[a][b] !== undefined) text += '; transfer ' + a + '\u2192' + b + ' ' + T[a][b].toFixed(0) + '%, ' + b + '\u2192' + a + ' ' + T[b][a].toFixed(0) + '% (own alphas ' + T[b][b].toFixed(0) + '%, ' + T[a][a].toFixed(0) + '%)';
    $('cmp-text').textContent = text;
    $('cmp-shared').textContent = shared.join(' ') || '(none)';
    const mat = (i) => Array.from({ length: nL }, (_, l) => D.alphas[i].slice(l * nH, (l + 1) * nH));
    const both = Array.from({ length: nL }, (_, l) => Array.from({ length: nH }, (_, h) => (alpha(ia, l, h) > th && alpha(ib, l, h) > th) ? 1 : 0));
    const hm = (z, xa, name, extra) => Object.assign({ type: 'heatmap', z: z, xaxis: xa, yaxis: 'y', zmin: 0, zmax: 1, xgap: 1, ygap: 1, name: name,
      colorscale: 'Viridis', hovertemplate: name + '<br>layer %{y}, head %{x}<br>%{z:.3f}<extra></extra>' }, extra || {});
    Plotly.react('cmp-plot', [hm(mat(ia), 'x', a, { showscale: false }), hm(mat(ib), 'x2', b, { showscale: false }),
      hm(both, 'x3', 'both', { colorscale: [[0, '#f2f2f2'], [1, '#e8112d']], showscale: false })],
      { template: FIG.layout.template, height: Math.max(260, 90 + 16 * nL), margin: { l: 50, r: 10, t: 30, b: 40 },
        grid: { rows: 1, columns: 3, pattern: 'independent' }, yaxis: { title: { text: 'layer' }, dtick: 1 },
        xaxis: { domain: [0, .31], title: { text: a } }, xaxis2: { domain: [.345, .655], title: { text: b } }, xaxis3: { domain: [.69, 1], title: { text: 'both' } } },
      { displaylogo: false, responsive: true });
  }

  Plotly.newPlot(grid, FIG.data, FIG.layout, { displaylogo: false, responsive: true }).then(() => {
    grid.on('plotly_click', (ev) => {
      const p = ev.points.find((q) => q.curveNumber === 0);
      if (!p) return;
      const c = Math.round(p.x);
      state.task = D.tasks[Math.round(p.y)];
      showCard(Math.floor(c / nH), c % nH);
    });
    setThreshold(D.threshold);
    document.body.setAttribute('data-grid-ready', '1');
  });
  $('thr').addEventListener('input', (e) => setThreshold(parseFloat(e.target.value)));
  for (const id of ['cmp-a', 'cmp-b']) $(id).addEventListener('change', compare);
  compare();
  window.siteExplorer = { showCard: showCard, setThreshold: setThreshold, data: D };
})();
"""

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>{css}</style>
<script>{plotly_js}</script>
</head><body>
<h1>{title}</h1>
<div class="meta">{meta}</div>
<div class="controls">
  <label>threshold <input id="thr" type="range" min="0" max="1" step="0.01" value="{threshold}"> <b id="thr-value">{threshold:.2f}</b></label>
  <span id="thr-count" class="meta"></span>
  <span class="meta">Click a cell to open its head's card.</span>
</div>
<div id="grid"></div>
<div id="card" class="empty">No head selected: click a cell of the grid. Precomputed cards: {top}.</div>
<h2>Compare two tasks</h2>
<div class="controls"><select id="cmp-a">{options_a}</select> vs <select id="cmp-b">{options_b}</select> <span id="cmp-text"></span></div>
<div class="meta">shared heads: <span id="cmp-shared"></span></div>
<div id="cmp-plot"></div>
<script type="application/json" id="site-data">{data}</script>
<script type="application/json" id="site-grid">{grid}</script>
<script>{script}</script>
</body></html>
"""


def _json_for_script(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</`` sequence can end it early)."""
    text = obj if isinstance(obj, str) else json.dumps(obj, allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def render_page(*, title: str, meta: str, plotly_js: str, grid_json: str, data: dict, threshold: float) -> str:
    """The whole page as one string (see the module doc)."""
    tasks = data["tasks"]

    def options(selected: int) -> str:
        return "".join(f"<option{' selected' if i == selected else ''}>{html.escape(t)}</option>" for i, t in enumerate(tasks))

    top = ", ".join(f"L{layer}H{head}" for layer, head in data["top_heads"]) or "none"
    return TEMPLATE.format(
        title=html.escape(title), meta=meta, css=CSS, plotly_js=plotly_js, threshold=threshold, top=top,
        options_a=options(0), options_b=options(min(1, len(tasks) - 1)), data=_json_for_script(data),
        grid=_json_for_script(grid_json), script=SCRIPT,
    )


__all__ = ["render_page"]
