"""Does the results store reproduce a results page? Per-task cells, compared one by one.

    python benchmarks/store_vs_page.py [--page docs/results.md] [--out results/fv57]

Reads each model's "Per task" table of the page (exact match where measured, else first token)
and the same task and method in the store (seed 0's ``bench/<method>.json``); cells that are a
mean over several seeds (``±``) are left out. It prints how many cells are equal to the page's one decimal, which
differ, and which the store does not have yet. Used to check that runs rebuilt in a new
session give the numbers of a page made from artifacts that are gone. Nothing is computed.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from site_interp.artifacts import slug

METHOD_COLUMNS = ("0-shot", "icl", "uniform-0.5", "uniform-1", "site")
"""The per-task table's method columns, in order (after task and kind)."""


def page_tables(text: str) -> dict[str, dict[str, list[str]]]:
    """Model id -> task -> the method cells of its per-task table."""
    tables: dict[str, dict[str, list[str]]] = {}
    sections = re.split(r"^### Methods on \d+ tasks \(([^)]+)\)$", text, flags=re.M)
    for model_id, body in zip(sections[1::2], sections[2::2]):
        rows = {}
        block = body.split("<details><summary>Per task", 1)[1].split("</details>", 1)[0] if "<details><summary>Per task" in body else ""
        for line in block.splitlines():
            m = re.match(r"\| (\S+) \| (?:extr|abst) \|(.*)\|$", line)
            if m:
                rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
        tables[model_id] = rows
    return tables


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--page", default="docs/results.md")
    p.add_argument("--out", default="results/fv57", help="the results store")
    args = p.parse_args(argv)
    tables = page_tables(Path(args.page).read_text(encoding="utf-8"))
    for model_id, rows in tables.items():
        equal, differ, missing = 0, [], 0
        for task, cells in rows.items():
            for method, cell in zip(METHOD_COLUMNS, cells):
                if not cell or "±" in cell:
                    continue
                path = Path(args.out) / slug(model_id) / slug(task) / "bench" / f"{method}.json"
                if not path.is_file():
                    missing += 1
                    continue
                records = json.loads(path.read_text())["records"]
                metric = "exact_match" if all(r.get("exact_match") is not None for r in records) else "first_token"
                ours = 100 * float(np.mean([r[metric] for r in records]))
                theirs = float(cell.split()[0])
                if round(ours, 1) == theirs:
                    equal += 1
                else:
                    differ.append(f"{task} {method}: page {theirs:.1f}, store {ours:.1f}")
        print(f"{model_id}: {equal} cells equal, {len(differ)} differ, {missing} not in the store yet")
        for line in differ:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
