"""Short-lived DuckDB connections that wait for the file lock instead of failing.

Inside Dagster, assets use ``DuckDBResource.get_connection`` (which backs off on the lock). These
helpers are for readers outside Dagster (``strata lineage``, ``report``, ``compare-runs``): DuckDB
lets one process open a database file at a time for writing, and a reader started while a run
writes gets ``duckdb.IOException: Could not set lock on file``. :func:`connect_with_retry` retries the connect with
exponential backoff plus jitter (jitter keeps two waiting processes from retrying in lock-step).
Keep the connection only for one transaction and close it (use :func:`duck_connection`).
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from pathlib import Path
from typing import Iterator

import duckdb


def _is_lock_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "resource temporarily unavailable" in text


def connect_with_retry(
    path: str | os.PathLike,
    attempts: int = 60,
    base_delay: float = 0.05,
    max_delay: float = 2.0,
    read_only: bool = False,
    config: dict | None = None,
):
    """``duckdb.connect(path)``, retried while another process holds the file lock.

    Waits ``min(max_delay, base_delay * 2**i)`` times a random factor in [0.5, 1.5) between
    attempts (``attempts`` of them). Errors other than a lock conflict, and the
    last lock conflict, are raised unchanged.
    """
    rng = random.Random()
    for attempt in range(attempts):
        try:
            return duckdb.connect(str(Path(path)), read_only=read_only, config=config or {})
        except (duckdb.IOException, duckdb.ConnectionException) as exc:
            if attempt == attempts - 1 or not _is_lock_error(exc):
                raise
            time.sleep(min(max_delay, base_delay * 2**attempt) * (0.5 + rng.random()))
    raise AssertionError("unreachable")


@contextlib.contextmanager
def duck_connection(path: str | os.PathLike, **kwargs) -> Iterator[object]:
    """A connection from :func:`connect_with_retry` that is closed however the block ends."""
    con = connect_with_retry(path, **kwargs)
    try:
        yield con
    finally:
        con.close()
