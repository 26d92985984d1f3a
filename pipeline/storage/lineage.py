"""How an artifact was produced: the ``lineage`` table of ``strata.duckdb``, resolved upstream.

Every materialization appends one row (pipeline/storage/warehouse.py): asset, partition, run id, code
version, data version (hash of its output files), the data versions of its inputs, output paths
with SHA-256, row counts, parameters, wall time, host. :func:`lineage_of` starts from the newest
row of an asset and follows each input's recorded data version to the row that produced exactly
that version, recursively, down to the corpus. An input whose producing row is gone is marked
``missing``; an input that has been re-materialized since (its newest version differs from the
one consumed) is marked ``stale``, which is what makes the artifact out of date.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb

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


def _has_lineage(con) -> bool:
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lineage'").fetchone()[0])


def newest_row(con, asset: str, partition: str | None = None) -> dict[str, Any] | None:
    """The newest lineage row of ``asset`` (``partition``), JSON columns decoded; None when there is none."""
    return _select(con, "asset = ? AND partition = ?", [asset, partition or ""]) if _has_lineage(con) else None


def lineage_of(con, asset: str, partition: str | None = None) -> dict[str, Any]:
    """The newest materialization of ``asset`` (``partition``) with its inputs resolved recursively.

    Returns the lineage row as a dict (JSON columns decoded) plus ``inputs``: for each upstream
    asset, the row that produced the consumed data version (same shape, recursively), or
    ``{"asset", "data_version", "missing": True}``; each resolved input carries ``stale`` (a newer
    version of that input exists). Raises :class:`StrataInputError` when ``asset`` has no row.
    """
    start = newest_row(con, asset, partition)
    if start is None:
        known = [f"{a}[{p}]" if p else a for a, p in con.execute(
            "SELECT DISTINCT asset, partition FROM lineage ORDER BY 1, 2").fetchall()] if _has_lineage(con) else []
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


class OnDisk:
    """What the data root itself holds (its lineage rows and their output files), beside what Dagster's
    history remembers (``assets/status.py``): a ``DAGSTER_HOME`` shared with another data root (the
    README's ``export DAGSTER_HOME=...``) remembers that root's materializations, which must not
    make an empty root look fresh. ``corrupt``: the files whose bytes are not those Strata recorded
    when it wrote them (:func:`pipeline.storage.integrity.failing_digests`)."""

    def __init__(self, root, corrupt: dict[str, tuple[str, str]] | None = None):
        self.root = Path(root).resolve()
        self.corrupt = corrupt or {}  # relative path -> (recorded, now) SHA-256
        self.rows: dict[tuple[str, str], dict] | None = None  # (asset, partition) -> outputs; None: no lineage at all
        db = self.root / "strata.duckdb"
        if not db.is_file():
            return
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                if not con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'lineage'").fetchone()[0]:
                    return
                found = con.execute("SELECT asset, partition, outputs FROM lineage ORDER BY created_at, rowid").fetchall()
        except duckdb.Error:  # a run holds the write lock: Dagster's view alone
            self.rows = {}
            return
        self.rows = {(a, p or ""): json.loads(o) if o else {} for a, p, o in found}

    def problem(self, asset: str, partition: str | None) -> str:
        """Why ``asset[partition]``, which Dagster calls materialized, is not in this data root ("" when it is)."""
        if self.rows is None:
            return f"not in this data root ({self.root} has no lineage; the Dagster history remembers another root's run)"
        outputs = self.rows.get((asset, partition or ""))
        if outputs is None:
            return ""  # nothing recorded to check against: Dagster's word
        gone = [p for p in outputs if Path(p).is_relative_to(self.root) and not Path(p).exists()]
        return f"{len(gone)} output file(s) not on disk, e.g. {gone[0]}" if gone else ""

    def _corrupt_of(self, output: str) -> str | None:
        """The corrupt file (relative path) a lineage output names: its path under this root, or, in a
        copy of the root that lineage recorded elsewhere, the recorded path's tail."""
        if Path(output).is_relative_to(self.root):
            rel = Path(output).relative_to(self.root).as_posix()
            return rel if rel in self.corrupt else None
        return next((rel for rel in self.corrupt if output.endswith("/" + rel)), None)

    def corrupt_outputs(self, asset: str, partition: str | None) -> str:
        """Which outputs of ``asset[partition]`` fail their recorded SHA-256 ("" when none does)."""
        if not self.corrupt or not self.rows:
            return ""
        bad = sorted({rel for p in self.rows.get((asset, partition or ""), {}) if (rel := self._corrupt_of(p))})
        if not bad:
            return ""
        want, now = self.corrupt[bad[0]]
        return (f"{len(bad)} output file(s) fail the SHA-256 recorded when Strata wrote them, e.g. {bad[0]} "
                f"(recorded {want[:16]}..., its bytes now {now[:16]}...): rematerialize it, or restore the file")
