"""The DuckDB side of the data contract: diagnostics tables and the lineage table.

Every write replaces the rows of one (asset, partition) key inside a transaction, so a rerun
never duplicates rows and a crash never leaves half a write. Tables are created from the first
frame written to them.
"""

from __future__ import annotations

import hashlib
import json
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import polars as pl

from pipeline.storage.atomic import file_sha256

LINEAGE_DDL = """
CREATE TABLE IF NOT EXISTS lineage (
    asset VARCHAR, partition VARCHAR, run_id VARCHAR, code_version VARCHAR,
    data_version VARCHAR, input_versions JSON, outputs JSON, row_counts JSON, parameters JSON,
    wall_s DOUBLE, host VARCHAR, created_at TIMESTAMP
)
"""


def replace_rows(con, table: str, df: pl.DataFrame, key: dict[str, Any]) -> int:
    """Replace the rows of ``table`` matching ``key`` (column -> value) by ``df``; return rows written.

    An empty ``key`` replaces the whole table. Columns of ``df`` the table lacks (written by newer
    code into an older warehouse) are added first."""
    if not table.isidentifier():
        raise ValueError(f"bad table name {table!r}")
    con.register("_strata_rows", df.to_arrow())
    try:
        con.execute("BEGIN TRANSACTION")
        con.execute(f"CREATE TABLE IF NOT EXISTS {table} AS SELECT * FROM _strata_rows LIMIT 0")
        have = {c for (c,) in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]).fetchall()}
        for name, kind, *_ in con.execute("DESCRIBE SELECT * FROM _strata_rows").fetchall():
            if name not in have:  # a column newer code writes: added (NULL in the older rows)
                con.execute(f'ALTER TABLE {table} ADD COLUMN "{name}" {kind}')
        if key:
            where = " AND ".join(f"{c} = ?" for c in key)
            con.execute(f"DELETE FROM {table} WHERE {where}", list(key.values()))
        else:  # the empty key matches every row: the whole table is replaced
            con.execute(f"DELETE FROM {table}")
        con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _strata_rows")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        con.unregister("_strata_rows")
    return df.height


def write_lineage(
    con,
    *,
    asset: str,
    partition: str | None,
    run_id: str,
    code_version: str,
    data_version: str,
    input_versions: dict[str, str],
    outputs: dict[str, str],
    row_counts: dict[str, int],
    parameters: dict[str, Any],
    wall_s: float,
) -> None:
    """Append one lineage row: how this materialization of ``asset`` was produced."""
    con.execute(LINEAGE_DDL)
    con.execute(
        "INSERT INTO lineage VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            asset, partition or "", run_id, code_version, data_version,
            json.dumps(input_versions, sort_keys=True), json.dumps(outputs, sort_keys=True),
            json.dumps(row_counts, sort_keys=True), json.dumps(parameters, sort_keys=True, default=str),
            wall_s, socket.gethostname(), datetime.now(timezone.utc).replace(tzinfo=None),
        ],
    )


def latest_data_version(con, asset: str, partition: str | None = None) -> str:
    """The data version of the newest lineage row of ``asset`` ("" when never materialized)."""
    con.execute(LINEAGE_DDL)
    row = con.execute(
        "SELECT data_version FROM lineage WHERE asset = ? AND partition = ? ORDER BY created_at DESC LIMIT 1",
        [asset, partition or ""],
    ).fetchone()
    return row[0] if row else ""


def data_versions(con, asset: str) -> dict[str, str]:
    """The newest data version of every materialized partition of ``asset``."""
    con.execute(LINEAGE_DDL)
    rows = con.execute(
        "SELECT partition, arg_max(data_version, created_at) FROM lineage WHERE asset = ? GROUP BY partition ORDER BY partition",
        [asset],
    ).fetchall()
    return dict(rows)


def data_version_of(outputs: list[Path], digests: dict[str, str] | None = None) -> str:
    """Data version: a hash over the content hashes of a materialization's output files (``digests``:
    the SHA-256 of outputs that are not local files, taken while they were written)."""
    h = hashlib.sha256()
    for p in outputs:
        h.update(((digests or {}).get(str(p)) or file_sha256(p)).encode())
    return h.hexdigest()[:16]


def input_versions(con, deps: dict[str, str | list[str] | None]) -> dict[str, str]:
    """The data versions of a materialization's inputs: ``deps`` maps each upstream asset to the
    partition read, ``None`` (unpartitioned), a key, a list of keys or ``"*"`` (every partition)."""
    inputs: dict[str, str] = {}
    for dep, part in deps.items():
        if part == "*":
            inputs.update({f"{dep}[{p}]": v for p, v in data_versions(con, dep).items()})
        elif isinstance(part, list):
            inputs.update({f"{dep}[{p}]": latest_data_version(con, dep, p) for p in part})
        else:
            inputs[dep if part is None else f"{dep}[{part}]"] = latest_data_version(con, dep, part)
    return inputs


def record_lineage(con, *, asset: str, partition: str | None, run_id: str, code_version: str, deps: dict[str, Any],
                   outputs: list[Path], digests: dict[str, str] | None, row_counts: dict[str, int], parameters: dict[str, Any],
                   started: float) -> str:
    """Append the lineage row of a materialization (:func:`write_lineage`) that began at ``started``
    (``time.perf_counter()``): its inputs' versions (:func:`input_versions`), its outputs' hashes;
    returns its data version (:func:`data_version_of`)."""
    version = data_version_of(outputs, digests)
    write_lineage(con, asset=asset, partition=partition, run_id=run_id, code_version=code_version, data_version=version,
                  input_versions=input_versions(con, deps),
                  outputs={str(p): (digests or {}).get(str(p)) or file_sha256(p) for p in outputs},
                  row_counts=row_counts, parameters=parameters, wall_s=time.perf_counter() - started)
    return version
