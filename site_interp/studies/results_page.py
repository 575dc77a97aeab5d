"""docs/results.md as text, from :class:`~site_interp.studies.results_data.ModelEvidence`.

Every number on the page is formatted here from the evidence; sentences that state a finding
(holds / does not hold, yes / no) are chosen by the numbers' intervals, never written by hand.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from site_interp.studies.comparison_tables import display_names
from site_interp.studies.evidence import Difference, seed_range, verdict
from site_interp.studies.results_data import ModelEvidence, ReportConfig

PAPER = {
    "icl": "+13.3 points over 10-shot ICL",
    "lora": "SITE ahead of LoRA with 1.02K vs 3,407K trainable parameters",
    "binary": "80-90% of alphas end near 0 or 1",
    "patching": "57.3 (top-k) vs 6.2 (bottom-k), mean over benchmarks",
    "uniform": "not given as a number here",
}
"""The SITE paper's numbers (Llama-3.1-8B), as quoted in issue #15, for orientation only."""


def _f(x: float, sign: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:+.1f}" if sign else f"{x:.1f}"


def _p(p: float) -> str:
    """A permutation p-value: its resolution is 1 / (permutations + 1), so tiny ones read "< 0.001"."""
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def _ci(lo: float, hi: float, sign: bool = False) -> str:
    return f"[{_f(lo, sign)}, {_f(hi, sign)}]"


def _diff(e: ModelEvidence, a: str, b: str, metric: str) -> Difference | None:
    return next((d for d in e.differences if d.a == a and d.b == b and d.metric == metric), None)


def _short(model_id: str) -> str:
    return model_id.split("/")[-1]


def _pref_metric(e: ModelEvidence) -> str:
    return "exact_match" if (e.scores["metric"] == "exact_match").any() else "first_token"


# --------------------------------------------------------------------------- claims


def _claim_diff(e: ModelEvidence, a: str, b: str) -> tuple[str, str]:
    metric = _pref_metric(e)
    d = _diff(e, a, b, metric)
    if d is None:
        return "not run yet", "not measured"
    label = "EM" if metric == "exact_match" else "first token"
    ra, rb = seed_range(d.seeds_a, d.fewest_seeds_a), seed_range(d.seeds_b, d.fewest_seeds_b)
    seeds = f"{ra}×{rb} seeds" if ra != rb else f"{ra} seed{'s' * (ra != '1')}"
    return f"{_f(d.mean, True)} {_ci(d.lo, d.hi, True)} ({label}, {d.tasks} tasks, {seeds})", verdict(d.lo, d.hi)


def claims_rows(e: ModelEvidence, n_shots: int = 10) -> list[tuple[str, str, str]]:
    """(claim, ours, verdict) for one model."""
    rows = []
    rows.append((f"SITE beats {n_shots}-shot ICL", *_claim_diff(e, "site", "icl")))
    ours, v = _claim_diff(e, "site", "lora")
    p = e.summary.set_index(["method", "metric"])["params"] if len(e.summary) else pd.Series(dtype=float)
    params = {m: p.xs(m, level="method").iloc[0] for m in ("site", "lora") if len(p) and m in p.index.get_level_values(0)}
    if len(params) == 2:
        ours += f"; params {int(params['site']):,} vs {int(params['lora']):,}"
    rows.append(("SITE ahead of LoRA", ours, v))
    b = e.binary
    if b.get("tasks"):
        share_v = "holds" if b["lo"] >= 80 else "does not hold" if b["hi"] < 80 else "unresolved"
        rows.append(("alphas near-binary (< 0.1 or > 0.9)",
                     f"{_f(b['share'])}% {_ci(b['lo'], b['hi'])} ({_f(b['below'])}% below, {_f(b['above'])}% above; "
                     f"{b['tasks']} tasks)", share_v))
    else:
        rows.append(("alphas near-binary (< 0.1 or > 0.9)", "not run yet", "not measured"))
    c = e.patching_claim
    if c:
        v = verdict(c["lo"], c["hi"])
        if v == "holds" and c["top_share_of_site"] < 50:
            v = "does not hold"
        rows.append(("top-k heads recover SITE, bottom-k do not",
                     f"top {_f(c['top'])} vs bottom {_f(c['bottom'])} vs random {_f(c['random'])} (first token; SITE "
                     f"{_f(c['site'])}, top-k = {_f(c['top_share_of_site'])}% of it; k = {c['k_mean']:.1f} heads on "
                     f"average; {c['tasks']} tasks)", v))
    else:
        rows.append(("top-k heads recover SITE, bottom-k do not", "not run yet", "not measured"))
    u1, v1 = _claim_diff(e, "site", "uniform-0.5")
    u2, v2 = _claim_diff(e, "site", "uniform-1")
    both = "holds" if v1 == v2 == "holds" else v1 if v1 == v2 else "unresolved" if "holds" in (v1, v2) else v1
    rows.append(("SITE beats uniform alphas", f"vs 0.5: {u1}; vs 1: {u2}", both))
    return rows


def claims_table(evidence: Sequence[ModelEvidence], n_shots: int = 10) -> str:
    heads = ["claim", "paper (Llama-3.1-8B)"] + [_short(e.model_id) for e in evidence]
    keys = ["icl", "lora", "binary", "patching", "uniform"]
    per_model = [claims_rows(e, n_shots) for e in evidence]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for i, key in enumerate(keys):
        cells = [f"**{rows[i][2]}**: {rows[i][1]}" for rows in per_model]
        lines.append(f"| {per_model[0][i][0]} | {PAPER[key]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- FV-57 tables


def summary_table(e: ModelEvidence, n_shots: int) -> str:
    names = display_names(n_shots)
    s = e.summary
    if s.empty:
        return "_No method has run yet._"
    lines = ["| method | seeds | tasks | first token | 95% CI | exact match | 95% CI | abstractive FT / EM "
             "| extractive FT / EM | seed spread FT / EM | trainable params |",
             "|---|---:|---:|---:|---|---:|---|---|---|---|---:|"]
    for method in dict.fromkeys(s["method"]):
        g = s[s["method"] == method].set_index("metric")
        ft = g.loc["first_token"] if "first_token" in g.index else None
        em = g.loc["exact_match"] if "exact_match" in g.index else None
        row = ft if ft is not None else em

        def val(r, col):  # noqa: ANN001, ANN202
            return _f(r[col]) if r is not None else "–"

        lines.append(
            f"| {names.get(method, method)} | {seed_range(int(row['seeds']), int(row['fewest_seeds']))} | {int(row['tasks'])} | {val(ft, 'mean')} "
            f"| {_ci(ft['lo'], ft['hi']) if ft is not None else '–'} | {val(em, 'mean')} "
            f"| {_ci(em['lo'], em['hi']) if em is not None else '–'} | {val(ft, 'abstractive')} / {val(em, 'abstractive')} "
            f"| {val(ft, 'extractive')} / {val(em, 'extractive')} | {val(ft, 'seed_spread')} / {val(em, 'seed_spread')} "
            f"| {int(row['params']):,} |")
    return "\n".join(lines)


def differences_table(e: ModelEvidence, n_shots: int) -> str:
    names = display_names(n_shots)
    if not e.differences:
        return "_No two methods have run on the same tasks yet._"
    lines = ["| difference | metric | mean | 95% CI (tasks × seeds) | tasks | wins / losses | seeds | survives seed noise |",
             "|---|---|---:|---|---:|---|---|---|"]
    for d in e.differences:
        lines.append(f"| {names.get(d.a, d.a)} − {names.get(d.b, d.b)} | {'first token' if d.metric == 'first_token' else 'exact match'} "
                     f"| {_f(d.mean, True)} | {_ci(d.lo, d.hi, True)} | {d.tasks} | {d.wins} / {d.losses} "
                     f"| {seed_range(d.seeds_a, d.fewest_seeds_a)} vs {seed_range(d.seeds_b, d.fewest_seeds_b)} | {'yes' if d.survives else 'no'} |")
    return "\n".join(lines)


def gaps_table(e: ModelEvidence) -> str:
    if e.gaps.empty:
        return "_No task has both metrics yet._"
    lines = ["| task | kind | first token | exact match | gap | numeric answers % | words per answer |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in e.gaps.itertuples():
        lines.append(f"| {r.task} | {e.kinds.get(r.task, '')} | {_f(r.first_token)} | {_f(r.exact_match)} | {_f(r.gap, True)} "
                     f"| {_f(r.numeric)} | {r.words:.2f} |")
    return "\n".join(lines)


def per_task_table(e: ModelEvidence, methods: Sequence[str], n_shots: int) -> str:
    from site_interp.studies.evidence import per_task_table as table

    names = display_names(n_shots)
    metric = _pref_metric(e)
    t = table(e.scores, methods, metric)
    if t.empty:
        return "_Nothing yet._"
    present = [m for m in methods if m in set(t["method"])]
    lines = ["| task | kind | " + " | ".join(names.get(m, m) for m in present) + " |",
             "|---|---|" + "---:|" * len(present)]
    for task in e.order:
        cells = []
        for m in present:
            r = t[(t["task"] == task) & (t["method"] == m)]
            if r.empty:
                cells.append("")
                continue
            r = r.iloc[0]
            cells.append(_f(r["mean"]) + ("" if np.isnan(r["spread"]) else f" ±{r['spread'] / 2:.0f}"))
        lines.append(f"| {task} | {e.kinds.get(task, '')[:4]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- studies


def transfer_text(e: ModelEvidence) -> str:
    if e.transfer is None:
        return "_Not run yet: the matrix needs every task's seed-0 alphas; run the report without `--report-only`._"
    s = e.transfer.diagonal_summary()
    n = len(e.transfer.tasks)
    return (f"{n} × {n} entries of {len(e.transfer.records):,} scored rows (first token, "
            f"{e.transfer.seconds / 60:.1f} min of compute). Own alphas (diagonal) {_f(s['diagonal_mean'])}%, "
            f"another task's alphas (off-diagonal mean) {_f(s['off_diagonal_mean'])}%, uniform 0.5 "
            f"{_f(s['uniform_0.5_mean'])}%, 0-shot {_f(s['zero_shot_mean'])}%.")


def overlap_text(e: ModelEvidence, cfg: ReportConfig) -> str:
    if e.overlap is None or e.overlap.empty:
        return "_Needs the seed-0 alphas of at least three tasks._"
    o = e.overlap
    sig = int((o["p_value"] < 0.05).sum())
    sizes = pd.concat([o["size_a"], o["size_b"]])
    k = e.kind_separation
    text = (f"Head sets: alpha > {cfg.overlap_threshold} ({sizes.mean():.1f} heads per task on average). Of {len(o)} "
            f"task pairs, {sig} ({100 * sig / len(o):.0f}%) overlap more than random head sets of the same sizes "
            f"(permutation p < 0.05, {cfg.n_perm} draws; {0.05 * len(o):.0f} expected by chance); mean Jaccard "
            f"{o['jaccard'].mean():.3f} against a null mean of {o['null_mean'].mean():.3f}.")
    if k:
        text += (f" Pairs of the same kind: mean Jaccard {k['within']:.3f}; of different kinds {k['across']:.3f} "
                 f"(label permutation p {_p(k['p_value'])}).")
    return text


def relation_text(e: ModelEvidence) -> str:
    r = e.overlap_vs_transfer
    if not r:
        return "_Needs the transfer matrix._"
    c, raw = r["centred"], r["raw"]
    if math.isnan(c["rho"]):
        return "_Undefined: the head overlap or the transfer matrix is constant._"
    if c["p_value"] < 0.05 and c["rho"] > 0:
        answer = f"**Yes**: task pairs that share more heads transfer better (Spearman ρ = {c['rho']:.2f}, Mantel p {_p(c['p_value'])})"
    elif c["p_value"] < 0.05:
        answer = f"**No, the opposite**: more shared heads, worse transfer (ρ = {c['rho']:.2f}, Mantel p {_p(c['p_value'])})"
    else:
        answer = f"**Not detectably**: ρ = {c['rho']:.2f}, Mantel p {_p(c['p_value'])}"
    return (f"{answer}, over {c['pairs']:,} ordered pairs of {c['tasks']} tasks; transfer centred per target task "
            f"(minus the mean of other tasks' alphas on it) so that easy targets do not drive it. Uncentred accuracy: "
            f"ρ = {raw['rho']:.2f}, p {_p(raw['p_value'])}. The p-value shuffles whole tasks (pairs sharing a task "
            f"are not independent).")


def seconds_table(evidence: Sequence[ModelEvidence]) -> str:
    lines = ["| model | stage | compute (min) |", "|---|---|---:|"]
    for e in evidence:
        for stage, s in sorted(e.seconds.items(), key=lambda kv: -kv[1]):
            lines.append(f"| {_short(e.model_id)} | {stage} | {s / 60:.1f} |")
        lines.append(f"| {_short(e.model_id)} | **total** | **{sum(e.seconds.values()) / 60:.1f}** |")
    return "\n".join(lines)


def status_lines(evidence: Sequence[ModelEvidence], cfg: ReportConfig) -> list[str]:
    out = []
    for e in evidence:
        n = len(e.tasks)
        ran = e.scores.groupby(["method", "seed"])["task"].nunique() if len(e.scores) else pd.Series(dtype=int)
        parts = [f"{m} {', '.join(f's{s}: {c}' for (mm, s), c in ran.items() if mm == m)}"
                 for m in dict.fromkeys(e.scores["method"])] if len(e.scores) else []
        out.append(f"* **{_short(e.model_id)}** ({n} tasks): trained alphas per seed "
                   f"{', '.join(f's{s}: {c}' for s, c in e.trained.items())}; methods (tasks per seed): "
                   f"{'; '.join(parts) or 'none yet'}; patching {len(e.patching)}/{n}; transfer "
                   f"{'done' if e.transfer is not None else 'not yet'}.")
    return out


def settings_text(cfg: ReportConfig) -> str:
    r = cfg.run
    return (f"M = {r.embedding.n_prompts} ICL prompts of N = {r.embedding.n_shots} demonstrations per task embedding; "
            f"SITE: Adam, lr {r.site.lr}, {r.site.steps} steps of batch {r.site.batch_size}, the alphas of the best "
            f"validation loss (every {r.site.eval_every} steps); {r.eval.n_test} test queries per task (fewer where the "
            f"split is smaller); first-token accuracy and exact match of greedy generation (up to "
            f"{r.eval.max_new_tokens} new tokens); {r.eval.n_shots}-shot ICL with demonstrations from train. Seeds "
            f"{', '.join(map(str, cfg.seeds))} for {', '.join(cfg.seeded_methods)}; seed {cfg.seeds[0]} only for "
            f"{', '.join(cfg.single_seed_methods)} (0-shot is deterministic). FV: {cfg.fv.n_aie_prompts} AIE prompts "
            f"per ranking task, layer on {cfg.fv.n_valid} valid queries; TV: layer on {cfg.tv.n_valid}; LoRA rank "
            f"{cfg.lora.rank} on {'/'.join(cfg.lora.targets)}, {cfg.lora.steps} steps of {cfg.lora.batch_size}, lr "
            f"{cfg.lora.lr}. Intervals: 95% percentile bootstrap over tasks and, within each task, over seeds.")


def render(evidence: Sequence[ModelEvidence], cfg: ReportConfig, *, command: str, figures: Mapping[str, Mapping[str, str]],
           generated: str, store: str = "the artifacts on disk") -> str:
    """The page; ``store`` says where its artifacts are (the report passes ``--out``)."""
    n_shots = cfg.run.eval.n_shots
    methods = ["0-shot", "icl", "uniform-0.5", "uniform-1", "site", "tv", "fv", "lora"]
    n_tasks = max((len(e.tasks) for e in evidence), default=0)
    out = [f"# Results: SITE on {n_tasks} tasks, {len(evidence)} model{'s' * (len(evidence) != 1)}", "",
           f"Generated by `{command}` ({generated}) from {store}; no number on this page is typed by "
           "hand. The command resumes: run it again to compute whatever the status below lacks.", "",
           "**Status**", "", *status_lines(evidence, cfg), "", "## Settings", "", settings_text(cfg), "",
           "## The paper's claims", "",
           "Each cell: verdict, then our number with its 95% interval. A claim *holds* when the interval of the "
           "difference excludes zero in its favour, *does not hold* when it excludes zero against it, and is "
           "*unresolved* otherwise. The paper's numbers are for orientation: another model (Llama-3.1-8B) and scale.",
           "", claims_table(evidence, n_shots), ""]
    for e in evidence:
        short = _short(e.model_id)
        figs = figures.get(e.model_id, {})
        out += [f"## {short}", "", f"### Methods on {len(e.tasks)} tasks ({e.model_id})", "", summary_table(e, n_shots), "",
                "Seed spread: max − min over seeds of the mean over tasks (seeds that ran every task).", "",
                differences_table(e, n_shots), "",
                f"### Where first token and exact match disagree ({display_names(n_shots).get(e.gaps_method, e.gaps_method)})", "", gaps_table(e), "",
                "<details><summary>Per task (exact match where measured, else first token; ± half the seed "
                "range)</summary>", "", per_task_table(e, methods, n_shots), "", "</details>", "",
                "### Patching over all tasks", "",
                _patching_text(e), "", f"### {len(e.tasks)} × {len(e.tasks)} alpha transfer", "", transfer_text(e), ""]
        if "transfer" in figs:
            out += [f"![transfer {short}]({figs['transfer']})", ""]
        out += ["### Head overlap and the task dendrogram", "", overlap_text(e, cfg), ""]
        if "dendrogram" in figs:
            out += [f"![dendrogram {short}]({figs['dendrogram']})", ""]
        out += ["### Does head overlap predict transfer?", "", relation_text(e), ""]
        if "relation" in figs:
            out += [f"![overlap vs transfer {short}]({figs['relation']})", ""]
    out += ["## Compute", "", "Seconds recorded in the artifacts, summed over tasks and seeds (the runs took several "
            "sessions; 1 torch thread per process on a 2-core CPU unless the artifacts were made elsewhere).", "",
            seconds_table(evidence), ""]
    return "\n".join(out)


def _patching_text(e: ModelEvidence) -> str:
    c = e.patching_claim
    if not c:
        return "_Not run yet._"
    return (f"On {c['tasks']} tasks, the task embedding hard-patched (alpha = 1) at the last token into the k heads "
            f"with the highest alphas gives {_f(c['top'])}% first-token accuracy, into the k lowest {_f(c['bottom'])}%, "
            f"into k random heads {_f(c['random'])}% (5 draws); full SITE {_f(c['site'])}%, 0-shot {_f(c['zero_shot'])}%. "
            f"k = the heads with alpha > 0.5 (at least 1; {c['k_mean']:.1f} on average). Top − bottom: "
            f"{_f(c['top_minus_bottom'], True)} {_ci(c['lo'], c['hi'], True)} (interval over tasks).")


BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
"""Markers of the README block that :func:`headline` fills."""


def headline(evidence: Sequence[ModelEvidence], n_shots: int, page: str) -> str:
    """A few lines for the README: per model, the main means with intervals and SITE - ICL."""
    names = display_names(n_shots)
    lines = []
    for e in evidence:
        metric = _pref_metric(e)
        label = "exact match" if metric == "exact_match" else "first token"
        s = e.summary[e.summary["metric"] == metric].set_index("method") if len(e.summary) else pd.DataFrame()
        if s.empty:
            lines.append(f"* **{_short(e.model_id)}**: not run yet.")
            continue
        tasks = len(e.tasks)
        parts = [f"{names.get(m, m)} {_f(s.loc[m, 'mean'])} {_ci(s.loc[m, 'lo'], s.loc[m, 'hi'])}"
                 + _seeds(int(s.loc[m, "seeds"]), int(s.loc[m, "fewest_seeds"]), int(s.loc[m, "tasks"]), tasks)
                 for m in ("0-shot", "icl", "site", "lora") if m in s.index]
        d = _diff(e, "site", "icl", metric)
        diff = f"; SITE − ICL {_f(d.mean, True)} {_ci(d.lo, d.hi, True)} on {d.tasks} tasks" if d is not None else ""
        lines.append(f"* **{_short(e.model_id)}** ({label}, {tasks} tasks, 95% interval over tasks and seeds): "
                     + ", ".join(parts) + diff + ".")
    return "\n".join([BEGIN, f"Generated by `python -m site_interp.report` (details, status and the paper's "
                                 f"claims: [{page}]({page})):", "", *lines, END])


def _seeds(most: int, fewest: int, ran: int, tasks: int) -> str:
    notes = (([] if most == 1 else [f"{seed_range(most, fewest)} seeds"])
             + ([] if ran == tasks else [f"{ran} of {tasks} tasks so far"]))
    return f" ({', '.join(notes)})" if notes else ""


def replace_block(text: str, block: str) -> str | None:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by ``block``
    (which carries both markers); None when ``text`` has no such part."""
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < i:
        return None
    return text[:i] + block + text[j + len(END):]


__all__ = ["BEGIN", "END", "PAPER", "claims_rows", "claims_table", "headline", "render", "replace_block"]
