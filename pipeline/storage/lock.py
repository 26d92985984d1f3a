"""One ``strata`` process at a time sets up a data root's Dagster instance or runs its graph.

Dagster creates its SQLite schema the first time an instance opens a new ``DAGSTER_HOME``; two
processes doing so at once race, and the loser dies in SQLite (``table ... already exists``). Two
runs over one root would also materialize the same assets twice and prune each other's
temporary files. So :func:`root_lock` takes an exclusive ``flock`` on a file in a folder (the
run's in the data root, once it is checked as one; the instance setup's in ``DAGSTER_HOME``):
a second process says which process holds it and waits (Ctrl-C stops the wait, nothing written),
then goes on and finds the first one's artifacts fresh. The kernel drops the lock when its holder
exits, however it exits, so a killed run never leaves the root locked."""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Iterator

from pipeline.errors import StrataInputError

RUN_LOCK = ".strata-run.lock"  # held while the graph is materialized (strata run, demo, ablate, claims)
SETUP_LOCK = ".strata-setup.lock"  # in DAGSTER_HOME, held while the Dagster instance is opened (its schema created)
_HELD: set[str] = set()  # locks this process holds: taking one again (a nested call) does not wait on itself


@contextlib.contextmanager
def root_lock(root: str | os.PathLike, name: str = RUN_LOCK, what: str = "strata run", log=None) -> Iterator[None]:
    """Hold the exclusive lock ``root/name`` for the block; while another process holds it, say who
    (``log``, stderr by default) and wait. A root where the lock file cannot be created is a
    :class:`StrataInputError` naming the path."""
    path = Path(root) / name
    if str(path.resolve()) in _HELD:
        yield
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StrataInputError(f"cannot create the lock file ({exc.strerror})", path=path,
                               fix="make the data root writable, or point --data-root at a writable folder") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another strata process"
            say = log or (lambda m: print(m, file=sys.stderr, flush=True))
            say(f"strata: waiting for {holder} to finish with the data root {Path(root)} (lock {path}; Ctrl-C stops waiting)")
            t0 = time.monotonic()
            fcntl.flock(fd, fcntl.LOCK_EX)
            say(f"strata: {path.name} acquired after {time.monotonic() - t0:.0f} s; going on")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        _HELD.add(str(path.resolve()))
        try:
            yield
        finally:
            _HELD.discard(str(path.resolve()))
    finally:
        os.close(fd)  # releases the lock
