"""The package's imports run one way: cli → api → search → trials → measure, and never in a
cycle. Read from the source (every import, also the ones inside functions and under
TYPE_CHECKING), so a new upward import fails here before it becomes a tangle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "loadertune"

# Lower ranks are imported by higher ones, never the other way. Modules of one subpackage share
# a rank and may import each other (no cycles among them either). docs/architecture.md draws it.
RANKS = {
    "loadertune.errors": 0,
    "loadertune.units": 0,
    "loadertune.tracebacks": 0,
    "loadertune.signals": 0,  # Ctrl-C held over a fork or a write
    "loadertune.config": 1,
    "loadertune.results.store": 1,  # the recommendation file: read by the trials of `run`
    "loadertune.results.keys": 1,  # the store's keys
    "loadertune.measure": 2,
    "loadertune.hardware": 3,
    "loadertune.trials": 4,  # the runner contract, in-process trials, what both sides share
    "loadertune.trials.inside": 5,  # runs inside the user's process
    "loadertune.trials.hotswap": 5,  # so does this; the two use each other (no module cycle)
    "loadertune.trials.script": 6,  # the search's side of script trials: starts `inside.child`
    "loadertune.search": 7,
    "loadertune.search.opening": 7,  # the driver's opening (baseline, probe, resume): beside it
    "loadertune.results.analysis": 8,
    "loadertune.results.advice": 8,  # what to do next, from what the analysis found
    "loadertune.results.recommendation": 9,
    "loadertune.view": 10,  # what the user sees: summary, live view, HTML report
    "loadertune.api": 11,  # the ways in; `api.tuned` runs searches and saved settings
    "loadertune.doctor": 11,
    "loadertune.cli": 12,
    "loadertune.integrations": 12,  # each imports its framework (an optional dependency)
    "loadertune": 13,  # the package's __init__: the public face
    "loadertune.__main__": 14,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The loadertune modules ``path`` imports (``from loadertune.x import y`` counts
    ``loadertune.x.y`` when that is a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "loadertune":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if _exists(sub) else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "loadertune"}
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _rank(module: str) -> int:
    for prefix in sorted(RANKS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return RANKS[prefix]
    raise AssertionError(f"{module} has no rank: add it to RANKS in {__file__}")


GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_run_downward(module: str) -> None:
    upward = sorted(
        dep for dep in GRAPH[module] if dep != "loadertune" and _rank(dep) > _rank(module)
    )
    assert not upward, f"{module} (rank {_rank(module)}) imports higher layers: {upward}"


def test_no_import_cycle() -> None:
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for dep in GRAPH.get(module, ()):
            if dep != "loadertune":  # every module imports the package itself first
                visit(dep, [*path, module])
        done.add(module)

    for module in GRAPH:
        visit(module, [])


def test_the_graph_is_read() -> None:
    assert "loadertune.trials" in GRAPH["loadertune.search.driver"]
    assert "loadertune.search" in GRAPH["loadertune.api.tune"]


# -- size: one concept per module, functions a reader can hold ------------------------------------

MAX_MODULE_LINES = 450
MAX_FUNCTION_CODE_LINES = 60


def _code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, source_lines: list[str]) -> int:
    """Lines of ``node``'s body that hold code: its signature, docstring, blank lines and
    comments left out."""
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    count = 0
    for n in range(body[0].lineno, (node.end_lineno or node.lineno) + 1):
        text = source_lines[n - 1].strip()
        if text and not text.startswith("#"):
            count += 1
    return count


def test_modules_and_functions_stay_small() -> None:
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        name = path.relative_to(PACKAGE.parent)
        if len(lines) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {len(lines)} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node, lines)
                if n > MAX_FUNCTION_CODE_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {n} code lines")
    assert not too_long, "\n".join(too_long)
