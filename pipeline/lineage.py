"""How an artifact was produced: the ``lineage`` table of ``strata.duckdb``, resolved upstream.

Every materialization appends one row (pipeline/warehouse.py): asset, partition, run id, code
version, data version (hash of its output files), the data versions of its inputs, output paths
with SHA-256, row counts, parameters, wall time, host. :func:`lineage_of` starts from the newest
row of an asset and follows each input's recorded data version to the row that produced exactly
that version, recursively, down to the corpus. An input whose producing row is gone is marked
``missing``; an input that has been re-materialized since (its newest version differs from the
one consumed) is marked ``stale``, which is what makes the artifact out of date.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from pipeline.errors import StrataInputError

_COLUMNS = [
    "asset", "partition", "run_id", "code_version", "data_version", "input_versions", "outputs",
    "row_counts", "parameters", "wall_s", "host", "created_at",
]
_JSON = ("input_versions", "outputs", "row_counts", "parameters")


def _row(values: tuple) -> dict[str, Any]:
    row = dict(zip(_COLUMNS, values))
    for key in _JSON:
        row[key] = json.loads(row[key]) if row[key] else {}
    row["created_at"] = str(row["created_at"])
    return row


def _select(con, where: str, params: list) -> dict[str, Any] | None:
    found = con.execute(
        f"SELECT {', '.join(_COLUMNS)} FROM lineage WHERE {where} ORDER BY created_at DESC, rowid DESC LIMIT 1", params
    ).fetchone()
    return _row(found) if found else None


def lineage_of(con, asset: str, partition: str | None = None) -> dict[str, Any]:
    """The newest materialization of ``asset`` (``partition``) with its inputs resolved recursively.

    Returns the lineage row as a dict (JSON columns decoded) plus ``inputs``: for each upstream
    asset, the row that produced the consumed data version (same shape, recursively), or
    ``{"asset", "data_version", "missing": True}``; each resolved input carries ``stale`` (a newer
    version of that input exists). Raises :class:`StrataInputError` when ``asset`` has no row.
    """
    has_table = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lineage'").fetchone()[0]
    start = _select(con, "asset = ? AND partition = ?", [asset, partition or ""]) if has_table else None
    if start is None:
        known = [f"{a}[{p}]" if p else a for a, p in con.execute(
            "SELECT DISTINCT asset, partition FROM lineage ORDER BY 1, 2").fetchall()] if has_table else []
        raise StrataInputError(
            f"no lineage recorded for {asset}" + (f" partition {partition!r}" if partition else ""),
            fix=f"materialize it first, or pick one of: {', '.join(known) or '(none recorded yet)'}",
        )
    memo: dict[tuple[str, str, str], dict[str, Any]] = {}

    def resolve(row: dict[str, Any], depth: int) -> dict[str, Any]:
        row["inputs"] = {}
        for dep, version in sorted(row["input_versions"].items()):
            key = (dep, version, row["partition"])
            if key not in memo:
                memo[key] = _resolve_input(dep, version, row["partition"], depth)
            row["inputs"][dep] = memo[key]
        return row

    def _resolve_input(dep: str, version: str, partition: str, depth: int) -> dict[str, Any]:
        if dep.endswith("]") and "[" in dep:  # input recorded as "asset[partition]"
            dep, partition = dep[:-1].split("[", 1)
        if depth > 32:  # a cycle cannot come from a DAG; refuse rather than recurse forever
            return {"asset": dep, "data_version": version, "missing": True}
        # Prefer the same partition (partitioned upstreams), else any partition with that version.
        found = _select(con, "asset = ? AND data_version = ? AND partition = ?", [dep, version, partition]) or \
            _select(con, "asset = ? AND data_version = ?", [dep, version])
        if found is None or not version:
            return {"asset": dep, "data_version": version, "missing": True}
        newest = _select(con, "asset = ? AND partition = ?", [dep, found["partition"]])
        found["stale"] = bool(newest and newest["data_version"] != version)
        return resolve(found, depth + 1)

    start["stale"] = False
    return resolve(start, 0)


def upstream_summary(tree: dict[str, Any]) -> dict[str, Any]:
    """Flatten a :func:`lineage_of` tree to ``{asset[partition]: {data_version, code_version, parameters}}``."""
    out: dict[str, Any] = {}

    def walk(node: dict[str, Any]) -> None:
        label = node["asset"] + (f"[{node['partition']}]" if node.get("partition") else "")
        out[label] = {k: node.get(k) for k in ("data_version", "code_version", "parameters", "missing", "stale")}
        for child in node.get("inputs", {}).values():
            walk(child)

    walk(tree)
    return out


def render(tree: dict[str, Any]):
    """A ``rich.tree.Tree`` of :func:`lineage_of`'s result."""
    from rich.markup import escape
    from rich.tree import Tree

    def label(node: dict[str, Any]) -> str:
        name = escape(node["asset"] + (f"[{node['partition']}]" if node.get("partition") else ""))
        if node.get("missing"):
            return f"[bold]{name}[/] data {node['data_version'] or '?'} [red](no lineage row for this version)[/]"
        stale = " [yellow]stale: re-materialized since[/]" if node.get("stale") else ""
        return (f"[bold]{name}[/] data {node['data_version']} code v{escape(node['code_version'] or '?')} "
                f"[dim]{node['created_at']} run {node['run_id'][:8]} {node['wall_s']:.1f}s on {escape(node['host'])}[/]{stale}")

    def add(branch, node: dict[str, Any]) -> None:
        if node.get("missing"):
            return
        if node["parameters"]:
            branch.add("params " + escape(json.dumps(node["parameters"], sort_keys=True, default=str)))
        if node["row_counts"]:
            branch.add("rows " + escape(", ".join(f"{k}={v}" for k, v in sorted(node["row_counts"].items()))))
        outputs = branch.add(f"outputs ({len(node['outputs'])})")
        for path, sha in sorted(node["outputs"].items()):
            outputs.add(f"{escape(path)} [dim]sha256 {sha[:16]}[/]")
        for child in node["inputs"].values():
            add(branch.add(label(child)), child)

    root = Tree(label(tree))
    add(root, tree)
    return root


def cmd_lineage(args: argparse.Namespace) -> int:
    """Print how ``args.asset`` was produced, as a tree (or JSON with ``--json``)."""
    from rich.console import Console

    from pipeline.duck import duck_connection

    root = Path(args.data_root or os.environ.get("STRATA_HOME") or ".strata").expanduser()
    db = root / "strata.duckdb"
    if not db.is_file():
        raise StrataInputError("no strata.duckdb here", path=root, fix="pass --data-root DIR of a run (or set STRATA_HOME)")
    with duck_connection(db, read_only=True) as con:
        tree = lineage_of(con, args.asset, args.partition)
    if args.json:
        print(json.dumps(tree, indent=2, sort_keys=True, default=str))
    else:
        Console().print(render(tree))
    return 0


def register(subparsers) -> None:
    """Add ``strata lineage ASSET [--partition P] [--data-root DIR] [--json]``."""
    p = subparsers.add_parser("lineage", help="show how an artifact was produced (corpus version, code, params)")
    p.add_argument("asset", help="asset name, e.g. clusters, orderings, training_runs")
    p.add_argument("--partition", default=None, help="partition (strategy) of a partitioned asset")
    p.add_argument("--data-root", default=None, help="data root (default: $STRATA_HOME or ./.strata)")
    p.add_argument("--json", action="store_true", help="print the resolved lineage as JSON")
    p.set_defaults(func=cmd_lineage)
