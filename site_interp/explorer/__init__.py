"""The head explorer: click an attention head of a SITE run and see what it does.

* :mod:`~site_interp.explorer.data` reads a finished run directory (alphas, embeddings,
  clustering, transfer) into a :class:`RunData`; no recomputation.
* :mod:`~site_interp.explorer.cards` measures a head card's parts with the model: direct logit
  attribution of ``t[l, h]``, attention at the last token of a sample prompt, accuracy with only
  this head patched or with it removed from SITE (cached on disk).
* :mod:`~site_interp.explorer.session` ties a run to its model and caches.
* :mod:`~site_interp.explorer.figures` draws the grid (tasks x heads, dendrogram, threshold
  outline) and the card parts with plotly; :mod:`~site_interp.explorer.static` draws them with
  matplotlib where widgets are unavailable.
* :mod:`~site_interp.explorer.widget` is the Jupyter widget (:func:`explore`),
  :mod:`~site_interp.explorer.export` the self-contained HTML page (:func:`export_html`).

Names are loaded on first use, so ``import site_interp.explorer`` loads no plotting library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from site_interp.explorer.cards import CardConfig, direct_logit_attribution
    from site_interp.explorer.data import RunData, find_runs, load_run_data
    from site_interp.explorer.export import ExportConfig, export_html
    from site_interp.explorer.session import ExplorerSession, ModelMismatchError
    from site_interp.explorer.widget import HeadExplorer, explore

_NAMES = {
    "CardConfig": "cards", "direct_logit_attribution": "cards",
    "RunData": "data", "find_runs": "data", "load_run_data": "data",
    "ExportConfig": "export", "export_html": "export",
    "ExplorerSession": "session", "ModelMismatchError": "session",
    "HeadExplorer": "widget", "explore": "widget",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        value = getattr(importlib.import_module(f"site_interp.explorer.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
