"""``python -m site_interp.explore RUN_DIR --html out.html``: the head explorer as one HTML file.

Reads a finished run (``<out>/<model>``, or ``<out>`` holding one model folder), loads its model
(``--model``, default: the one the run was trained on; ``--no-model`` writes the grid and alphas
only), computes the cards of the top heads (direct logit attribution, attention on a sample
prompt of every task, patch / removal effects on one task or all; cached under each task's
``explorer/`` folder) and writes a self-contained page that opens offline in any browser.
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

from site_interp import cli
from site_interp.errors import UserError
from site_interp.explorer.cards import CardConfig
from site_interp.explorer.data import find_runs, load_run_data
from site_interp.explorer.export import ExportConfig, export_html
from site_interp.explorer.session import ExplorerSession, load_run_model
from site_interp.loading import load_model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m site_interp.explore", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="<out>/<model> directory of a finished run (or <out> with one model folder)")
    p.add_argument("--html", required=True, help="where to write the page, e.g. explorer.html")
    p.add_argument("--model", default=None, help="model to load (default: the run's own; embedded names, directories, hub ids)")
    p.add_argument("--no-model", action="store_true", help="no model: the grid and alphas only, no measured card parts")
    p.add_argument("--data-dir", default=None, help="task folder the run's tasks came from, e.g. ../shared/data/fv57")
    p.add_argument("--top-heads", type=int, default=12, help="heads with precomputed cards (12)")
    p.add_argument("--threshold", type=float, default=0.5, help="initial outline threshold (0.5)")
    p.add_argument("--effects", choices=["selected", "all", "none"], default="selected",
                   help="tasks whose patch / removal effects are precomputed (the selected task)")
    p.add_argument("--task", default=None, help="the selected task (default: the grid's first)")
    p.add_argument("--n-test", type=int, default=24, help="test queries per effect (24)")
    p.add_argument("--n-shots", type=int, default=5, help="demonstrations in the attention sample prompt (5)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    return p


def body(args: argparse.Namespace) -> int:
    runs = find_runs(args.run_dir)
    (_, models), = runs.items()
    if len(models) != 1:
        raise UserError(f"{args.run_dir} holds several models ({', '.join(models)}); pass one <out>/<model> folder")
    data = load_run_data(next(iter(models.values())))
    bridge = None
    if not args.no_model:
        t0 = time.perf_counter()
        bridge = load_model(args.model) if args.model else load_run_model(data)
        print(f"model {data.model_id} loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    session = ExplorerSession(data, bridge, data_dir=args.data_dir, loader=None,
                              config=CardConfig(n_test=args.n_test, n_shots=args.n_shots))
    config = ExportConfig(top_heads=args.top_heads, threshold=args.threshold, effects=args.effects, selected_task=args.task)
    t0 = time.perf_counter()
    path = export_html(session, args.html, config, progress=not args.quiet)
    cards = f"{min(config.top_heads, data.n_layers * data.n_heads)} head cards" if bridge is not None else "no cards (--no-model)"
    print(f"{path} ({path.stat().st_size / 1e6:.1f} MB, {len(data.tasks)} tasks, {cards}) "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
