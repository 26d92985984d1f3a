"""Calls run side by side in worker processes of their own, fed one at a time, stopping at the first failure.

Workers are spawned (not forked: Dagster, DuckDB and the BLAS/OpenMP libraries are not fork-safe)
and set up once each by ``initializer``; each call computes what it computes alone, so the results
do not depend on which calls share the machine.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Any, Callable, Iterable


def run_in_processes(fn: Callable[[Any], object], items: Iterable[Any], workers: int, initializer: Callable[..., None],
                     initargs: tuple, started: Callable[[Any], None] = lambda item: None) -> None:
    """``fn(item)`` for each of ``items`` in ``workers`` worker processes, started in the items' order
    (``started(item)`` as each starts). After a failure no further call starts; the calls under way
    finish, then the first error is raised."""
    todo = iter(items)
    error: BaseException | None = None
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=initializer, initargs=initargs)
    with pool:
        running: set[Future] = set()

        def submit() -> None:
            for item in todo:
                started(item)
                running.add(pool.submit(fn, item))
                return

        for _ in range(workers):
            submit()
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                running.remove(future)
                exc = future.exception()
                if exc is not None and error is None:
                    error = exc
                if error is None:
                    submit()
    if error is not None:
        raise error
