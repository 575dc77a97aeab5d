"""``python -m site_interp.figures RUN_DIR``: regenerate every figure of a finished run.

Reads only what a run wrote (safetensors alphas, CSV tables, JSON), recomputes nothing, and
writes the figures into ``RUN_DIR/figures`` (or ``--out``) in the requested formats.
``RUN_DIR`` is ``<out>/<model>`` of ``python -m site_interp.run`` / ``python -m site_interp.patch``.
"""

from __future__ import annotations

import argparse
from typing import Sequence

from site_interp import cli
from site_interp.plots.run_figures import make_figures
from site_interp.plots.static import FORMATS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m site_interp.figures", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="<out>/<model> directory of a finished run")
    p.add_argument("--out", default=None, help="where to write the figures (default RUN_DIR/figures)")
    p.add_argument("--formats", nargs="+", default=["png"], choices=list(FORMATS),
                   help="file formats (png pdf svg); default png")
    return p


def body(args: argparse.Namespace) -> int:
    for path in make_figures(args.run_dir, args.out, args.formats):
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_command(build_parser(), body, argv)


if __name__ == "__main__":
    raise SystemExit(main())
