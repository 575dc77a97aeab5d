"""The package's layout rules, checked on the source: no import cycle, dependencies one way,
the core free of plotting libraries, small modules."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1] / "site_interp"

LAYERS = [
    # lowest first: a module may import from its own layer or a lower one, never a higher one
    ("base", {"errors", "checks", "loading", "tasks", "prompts", "hooks", "artifacts", "stats"}),
    ("method", {"batching", "prefix_cache", "scoring", "generation", "embeddings", "trainer", "training",
                "evaluation", "pipeline", "share"}),
    ("studies", {"studies", "baselines", "plots", "explorer", "sweeps"}),
    ("commands", {"cli", "run", "patch", "bench", "figures", "sweep", "report", "explore"}),
]
PLOTTING = ("matplotlib", "seaborn", "plotly")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """site_interp modules ``path`` imports (anywhere in the file), resolved to modules."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        else:
            continue
        out |= {n for n in names if n.split(".")[0] == "site_interp" and n in known}
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(path, set(mods)) - {name} for name, path in mods.items()}


def layer_of(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    for i, (_, members) in enumerate(LAYERS):
        if top in members:
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(g.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    assert find_cycle(graph()) is None


def test_dependencies_run_one_way():
    wrong = [
        f"{mod} ({LAYERS[layer_of(mod)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
        for mod, deps in graph().items() if mod != "site_interp" for dep in deps if layer_of(dep) > layer_of(mod)
    ]
    assert not wrong


def test_only_figure_modules_import_plotting_libraries():
    offenders = []
    for name, path in modules().items():
        if name.startswith(("site_interp.plots", "site_interp.explorer")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            if any(n.split(".")[0] in PLOTTING for n in names):
                offenders.append(name)
    assert not offenders


def test_core_import_loads_no_plotting_library():
    """The package and everything but the figure modules, imported together in a fresh process
    (one process: if none of them loads a plotting library, neither does any one alone)."""
    modules = ["site_interp", "site_interp.studies", "site_interp.baselines", "site_interp.cli", "site_interp.sweeps",
               "site_interp.share"]
    code = f"import sys, {', '.join(modules)}; print([m for m in {PLOTTING!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_modules_stay_small():
    big = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 600}
    assert not big
