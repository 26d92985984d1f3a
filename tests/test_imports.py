"""The layers hold: no import circles among pipeline/, assets/ and evals/, and the library never imports Dagster.

The graph is read statically (``ast``) from every ``import`` statement, those inside functions
included: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "assets", "evals")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(module: str, path: Path) -> set[str]:
    """Every module name an import statement of ``module`` names (``from a import b`` names ``a`` and ``a.b``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between the project's modules, every name each module imports)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    raw = {m: _imported(m, p) for m, p in modules.items()}
    edges = {m: {o for n in names if (o := owner(n)) and o != m} for m, names in raw.items()}
    return edges, raw


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    edges, _ = import_graph()
    assert len(edges) > 100 and edges["assets.definitions"], "the graph was not read"
    assert cycles(edges) == []


def test_the_library_imports_neither_dagster_nor_assets():
    _, raw = import_graph()
    bad = {m: sorted(n for n in names if n.split(".")[0] in ("dagster", "dagster_duckdb", "assets"))
           for m, names in raw.items() if m.split(".")[0] == "pipeline"}
    assert {m: n for m, n in bad.items() if n} == {}


def test_ray_workers_load_the_code_location_of_the_workspace():
    from assets.on_ray import CODE_LOCATION

    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert [e["python_module"]["module_name"] for e in workspace["load_from"]] == [CODE_LOCATION]


# The stage packages of pipeline/: pipeline/storage/ (the data root's layout, the warehouse) sits
# beneath them all and imports none (docs/architecture.md, "The folders").
STAGES = ("data", "represent", "packing", "ordering", "training", "mixture", "reports", "export", "distributed")


def stage_of(name: str) -> str | None:
    """The stage package a module name belongs to (``pipeline.packing.pack`` -> ``packing``), else None."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeline" and parts[1] in STAGES else None


def test_storage_imports_no_stage():
    _, raw = import_graph()
    upward = {m: sorted(n for n in names if stage_of(n)) for m, names in raw.items() if m.startswith("pipeline.storage")}
    assert {m: n for m, n in upward.items() if n} == {}


def test_the_import_test_sees_an_upward_import(tmp_path):
    """The check above reads lazy imports too: a function-level import of a stage is found."""
    (tmp_path / "m.py").write_text("def f():\n    from pipeline.packing.pack import SequenceStore\n")
    assert "pipeline.packing.pack" in _imported("pipeline.storage.m", tmp_path / "m.py")


ASSET_LINES = 30  # an asset reads its config, calls its stage function (pipeline/<stage>/stage.py), records, returns


def asset_lengths() -> dict[str, int]:
    """Lines of every function in assets/*.py decorated as an asset or an asset check (from ``def`` to its end)."""
    out = {}
    for path in sorted((REPO / "assets").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.FunctionDef):
                continue
            names = {(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list}
            names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in names}
            if any(n.endswith("asset") or n == "asset_check" for n in names):
                out[node.name] = node.end_lineno - node.lineno + 1
    return out


def test_an_asset_is_one_library_call():
    lengths = asset_lengths()
    assert {"training_runs", "orderings", "tokens"} <= lengths.keys(), "the assets were not read"
    too_long = {name: n for name, n in lengths.items() if n > ASSET_LINES}
    assert too_long == {}, f"assets over {ASSET_LINES} lines (docstring included): move their work into pipeline/<stage>/stage.py"
