"""The layers hold: no import circles among pipeline/, assets/ and evals/; pipeline/'s packages form
a DAG in the order the data flows; the library never imports Dagster, assets/ or evals/, and
imports inside its functions only the heavy dependencies pipeline/heavy.py lists.

The graph is read statically (``ast``) from every ``import`` statement, those inside functions
included: a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
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


def test_the_library_imports_neither_dagster_nor_assets_nor_evals():
    """pipeline/ is the bottom of the tree: evals/ and assets/ import it, never the other way."""
    _, raw = import_graph()
    bad = {m: sorted(n for n in names if n.split(".")[0] in ("dagster", "dagster_duckdb", "assets", "evals"))
           for m, names in raw.items() if m.split(".")[0] == "pipeline"}
    assert {m: n for m, n in bad.items() if n} == {}


def test_ray_workers_load_the_code_location_of_the_workspace():
    from assets.on_ray import CODE_LOCATION

    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert [e["python_module"]["module_name"] for e in workspace["load_from"]] == [CODE_LOCATION]


# The package graph of pipeline/, lowest first: a node is a subpackage (pipeline/ordering/) or a
# top-level module (pipeline/config.py); a module imports only nodes below its own, function-level
# imports counted (docs/architecture.md, "The package graph"). The data flows up the stages: data ->
# represent -> clean -> packing -> ordering -> training -> mixture -> reports, and the command line
# (cli/) above them all; render/ (markdown, figures) and storage/ (the data root, the warehouse) sit
# beneath every stage.
LAYERS = (
    ("errors", "threads", "offline", "devices", "heavy", "stage", "peak_memory"),
    ("registry", "segments"),
    ("names", "storage"),
    ("render", "config"),
    ("config_source", "overrides"),
    ("distributed",),
    ("data",),
    ("represent",),
    ("clean",),
    ("quality",),
    ("packing",),
    ("ordering",),
    ("training", "export"),
    ("mixture",),
    ("reports",),
    ("claims",),
    ("cli",),
)
RANK = {node: i for i, layer in enumerate(LAYERS) for node in layer}
STAGES = ("data", "represent", "clean", "quality", "packing",
          "ordering", "training", "mixture", "reports", "claims", "export", "distributed")


def node_of(name: str) -> str | None:
    """The package-graph node of a module name (``pipeline.packing.pack`` -> ``packing``), else None."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "pipeline" else None


def stage_of(name: str) -> str | None:
    """The stage package a module name belongs to (``pipeline.packing.pack`` -> ``packing``), else None."""
    node = node_of(name)
    return node if node in STAGES else None


def package_graph(raw: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Node -> the nodes its modules import, from every import statement of pipeline/ (those inside
    functions included)."""
    raw = import_graph()[1] if raw is None else raw
    graph: dict[str, set[str]] = {}
    for module, names in raw.items():
        if (me := node_of(module)) is None:
            continue
        graph.setdefault(me, set()).update(n for name in names if (n := node_of(name)) and n != me)
    return graph


def mutual_pairs(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))


def test_the_package_graph_is_a_dag_that_follows_the_layers():
    graph = package_graph()
    assert {"data", "ordering", "reports", "render", "config"} <= graph.keys(), "the graph was not read"
    assert mutual_pairs(graph) == []
    assert cycles(graph) == []
    assert sorted(graph.keys() - RANK.keys()) == [], "place the new package in LAYERS (and docs/architecture.md)"
    upward = {a: sorted(b for b in bs if RANK[b] >= RANK[a]) for a, bs in graph.items()}
    assert {a: bs for a, bs in upward.items() if bs} == {}, "a package imports one at or above its layer"


def test_the_package_graph_checker_finds_a_planted_mutual_pair(tmp_path):
    """The checks above can fail: a lazy import of reports inside an ordering module is an edge."""
    (tmp_path / "m.py").write_text("def f():\n    from pipeline.reports.stats import POOLED\n")
    raw = {"pipeline.ordering.m": _imported("pipeline.ordering.m", tmp_path / "m.py"),
           "pipeline.reports.stats": {"pipeline.ordering.features"}}
    graph = package_graph(raw)
    assert mutual_pairs(graph) == [("ordering", "reports")] and cycles(graph) == [["ordering", "reports"]]
    assert RANK["reports"] > RANK["ordering"]  # and the layer check names it


def function_imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module name) of every import inside a function or method of ``path``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                found.append((node.lineno, base))
    return sorted(set(found))


def lazy_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every ``lazy("name")`` call of ``path`` (pipeline/heavy.py's accessor)."""
    return [(n.lineno, n.args[0].value) for n in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "lazy" and n.args and isinstance(n.args[0], ast.Constant)]


def light_imports_in_functions(files: dict[str, Path]) -> dict[str, list]:
    """Per module: the function-level imports, and the ``lazy`` names, of anything not in HEAVY."""
    from pipeline.heavy import is_heavy

    out = {m: sorted(x for x in [*function_imports(p, m), *lazy_names(p)] if not is_heavy(x[1])) for m, p in files.items()}
    return {m: x for m, x in out.items() if x}


def test_function_level_imports_are_the_heavy_ones_only():
    """Inside a function, pipeline/ imports only what pipeline/heavy.py lists; everything else at
    the module's top, where the package graph shows it."""
    files = {m: p for m, p in _modules().items() if m.split(".")[0] == "pipeline"}
    assert light_imports_in_functions(files) == {}


def test_the_lazy_import_check_finds_a_planted_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from pipeline.heavy import lazy\n\nplt = lazy('matplotlib.pyplot')\nyaml = lazy('yaml')\n\n\n"
                    "def f():\n    import torch\n    from pipeline.packing import frozen\n    from . import sibling\n")
    assert light_imports_in_functions({"pipeline.ordering.m": path}) == {
        "pipeline.ordering.m": [(4, "yaml"), (9, "pipeline.packing"), (10, "pipeline.ordering")]}
    from pipeline.heavy import lazy

    with pytest.raises(ValueError, match="not listed"):
        lazy("yaml")


def test_importing_the_code_location_or_validating_a_config_imports_no_heavy_dependency():
    """``import assets.definitions`` and a config validated against every registry import none of
    pipeline/heavy.py's list (run in a fresh interpreter)."""
    code = ("import sys, assets.definitions; from pipeline.config import StrataConfig; StrataConfig(strategies=['random', 'greedy']); "
            "from pipeline.registry import EXPORT_FORMATS, FAMILIES, STRATEGIES; from evals.suites import REGISTRY; "
            "[r.entries() for r in (EXPORT_FORMATS, FAMILIES, STRATEGIES, REGISTRY)]; from pipeline.heavy import is_heavy; "
            "print(sorted(m for m in sys.modules if is_heavy(m)))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=REPO).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_storage_imports_no_stage():
    _, raw = import_graph()
    upward = {m: sorted(n for n in names if stage_of(n) or node_of(n) == "render")
              for m, names in raw.items() if m.startswith("pipeline.storage")}
    assert {m: n for m, n in upward.items() if n} == {}


def test_render_imports_no_stage():
    """render/ (markdown, figures) is beneath the stages: they import it, it imports none of them."""
    _, raw = import_graph()
    upward = {m: sorted(n for n in names if stage_of(n)) for m, names in raw.items() if m.startswith("pipeline.render")}
    assert {m: n for m, n in upward.items() if n} == {}


def test_only_reports_and_the_command_line_import_reports():
    """A stage renders through render/, never through the reports above it (only the claims, which
    measure with the diagnostics and the statistics, and pipeline/cli/, the top of the graph, read them)."""
    _, raw = import_graph()
    into = {m: sorted(n for n in names if node_of(n) == "reports")
            for m, names in raw.items() if node_of(m) not in (None, "reports", "claims", "cli")}
    assert {m: n for m, n in into.items() if n} == {}


def test_the_import_test_sees_an_upward_import(tmp_path):
    """The check above reads lazy imports too: a function-level import of a stage is found."""
    (tmp_path / "m.py").write_text("def f():\n    from pipeline.packing.pack import SequenceStore\n")
    assert "pipeline.packing.pack" in _imported("pipeline.storage.m", tmp_path / "m.py")


# where a stage function is defined: pipeline/<stage>/stage.py, evals/stage.py
STAGE_MODULE = re.compile(r"^(pipeline(\.\w+)+|evals(\.\w+)*)\.stage$")
CHECK_LINES = 30  # an asset check reads its inputs, compares, returns


def _decorated(path: Path, names: set[str]) -> list[ast.FunctionDef]:
    """The functions of ``path`` with a decorator named in ``names`` (``dg.asset``, ``asset_check``, ...)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef):
            called = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
            if {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", "") for n in called} & names:
                out.append(node)
    return out


def asset_calls(fn: ast.FunctionDef, namespace: dict) -> tuple[list[str], list[str]]:
    """(stage calls, inline work) of an asset function: each call's callee resolved in its module's
    ``namespace``. A call of a function defined in a ``pipeline.*.stage`` (or ``evals.*.stage``)
    module is a stage call; a call of the asset layer's own helpers (``assets.*``: ``Recorder``,
    ``asset_config``), of a builtin, of a method of a parameter or local value (``context``,
    ``settings``, ``rec``, ``cfg``) or building the stage's params (``XParams.from_config``) is
    bookkeeping; any other call (the library below the stage functions, numpy, polars, Dagster)
    is work done inline."""
    from pipeline.stage import StageParams

    local = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    stage, inline = [], []
    for call in (n for stmt in fn.body for n in ast.walk(stmt) if isinstance(n, ast.Call)):
        chain, node = [], call.func
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            continue  # a method of a value computed in the asset (its own call is checked)
        if node.id in local or (node.id not in namespace and hasattr(builtins, node.id)):
            continue
        target = namespace[node.id]
        for attr in chain:
            target = getattr(target, attr)
        owner = getattr(target, "__self__", None)
        if isinstance(owner, type) and issubclass(owner, StageParams):
            continue  # the stage's params model, built from the config
        module = getattr(target, "__module__", None) or getattr(target, "__name__", "")
        name = ".".join([node.id, *chain])
        if STAGE_MODULE.match(module):
            stage.append(name)
        elif not module.startswith("assets."):
            inline.append(f"{name} ({module})")
    return stage, inline


def test_an_asset_is_one_stage_call():
    """Every asset function calls exactly one stage function and does no work of its own."""
    import importlib

    seen, wrong = set(), {}
    for path in sorted((REPO / "assets").glob("*.py")):
        module = importlib.import_module(f"assets.{path.stem}")
        for fn in _decorated(path, {"asset"}):
            seen.add(fn.name)
            stage, inline = asset_calls(fn, vars(module))
            if len(stage) != 1 or inline:
                wrong[fn.name] = {"stage calls": stage, "inline": inline}
    from assets.definitions import build_definitions

    graph = build_definitions(None, None).resolve_asset_graph()
    assert seen == {k.to_user_string() for k in graph.materializable_asset_keys}, "every asset of the definitions is checked"
    assert wrong == {}, "an asset is one call of a stage function (pipeline/<stage>/stage.py): move the rest there"


def test_the_asset_check_catches_inline_work(tmp_path):
    """The check above fails an asset that does its work inline (``tokens`` as it was) or calls two
    stage functions (``exports`` as it was: the skip test, then the export)."""
    import dagster as dg
    import polars as pl

    import assets.common
    from pipeline.data.token_shards import tokenize_shards
    from pipeline.export import stage

    path = tmp_path / "inline.py"
    path.write_text(
        "@dg.asset\ndef tokens(context, settings, duckdb):\n    rec = Recorder(context, duckdb)\n"
        "    shards = pl.read_parquet(settings.layout().shards)\n    run = tokenize_shards(shards, settings.config())\n"
        "    return rec.finish_stage(run)\n\n"
        "@dg.asset\ndef exports(context, settings, duckdb):\n    cfg = settings.config()\n"
        "    if (why := stage.export_skipped(cfg, context.partition_key)) is not None:\n"
        "        return dg.MaterializeResult(metadata={'skipped': why})\n"
        "    return Recorder(context, duckdb).finish_stage(stage.export_strategy(settings.layout(), cfg, context.partition_key))\n")
    namespace = {"dg": dg, "pl": pl, "stage": stage, "tokenize_shards": tokenize_shards, "Recorder": assets.common.Recorder}
    inline, twice = _decorated(path, {"asset"})
    assert asset_calls(inline, namespace) == ([], ["pl.read_parquet (polars.io.parquet.functions)",
                                                   "tokenize_shards (pipeline.data.token_shards)"])
    stage_calls, inline_calls = asset_calls(twice, namespace)
    assert sorted(stage_calls) == ["stage.export_skipped", "stage.export_strategy"]
    assert [c.split(" ")[0] for c in inline_calls] == ["dg.MaterializeResult"]


def test_an_asset_check_stays_short():
    checks = {fn.name: fn.end_lineno - fn.lineno + 1 for path in sorted((REPO / "assets").glob("*.py"))
              for fn in _decorated(path, {"asset_check"})}
    assert {"token_conservation", "clusters_cover_documents"} <= checks.keys(), "the asset checks were not read"
    too_long = {name: n for name, n in checks.items() if n > CHECK_LINES}
    assert too_long == {}, f"asset checks over {CHECK_LINES} lines (docstring included): move their work into the library"


def test_only_the_adapter_imports_private_dagster():
    """Dagster's private API (``dagster._*``, ``dagster_shared``) is imported by assets/dagster_internals.py alone."""
    private = {m: sorted(n for n in _imported(m, p) if n.startswith(("dagster._", "dagster_shared")))
               for m, p in _modules().items() | {(f"tests.{p.stem}", p) for p in (REPO / "tests").glob("*.py")}}
    assert {m for m, names in private.items() if names} == {"assets.dagster_internals"}
