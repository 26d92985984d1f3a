"""Calls run side by side in worker processes of their own, fed one at a time, stopping at the first failure.

Workers are spawned (not forked: Dagster, DuckDB and the BLAS/OpenMP libraries are not fork-safe)
and set up once each by ``initializer``; each call computes what it computes alone, so the results
do not depend on which calls share the machine. :func:`map_processes` runs shards that write their
own artifacts, each in a fresh process, and runs again those whose process died.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any, Callable, Iterable, Sequence

from pipeline.distributed.shards import Shard, ShardFailure, call_shard


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


def _pool_round(fn: Callable[..., Any], todo: Sequence[Shard], workers: int) -> dict[int, ShardFailure]:
    """Every shard of ``todo`` in a fresh spawned process (``workers`` at once); the bad-input
    failures by index. A worker process that dies raises ``BrokenProcessPool`` once the pool is done."""
    failures: dict[int, ShardFailure] = {}
    pool = ProcessPoolExecutor(max(1, min(workers, len(todo))), mp_context=get_context("spawn"), max_tasks_per_child=1)
    with pool:
        futures = [pool.submit(call_shard, fn, shard.arguments()) for shard in todo]
        wait(futures)
    for i, future in enumerate(futures):
        result = future.result()  # BrokenProcessPool when a worker died
        if isinstance(result, ShardFailure):
            failures[i] = result
    return failures


def map_processes(fn: Callable[..., Any], shards: Sequence[Shard], workers: int, retries: int) -> int:
    """``fn(*shard.arguments())`` for every shard not yet done (its outputs, which ``fn`` writes,
    missing), each in a worker process of its own, ``workers`` at once; return how many ran.

    A worker process that dies (killed, out of memory) loses only its own shard: the shards whose
    outputs exist are kept, and the rest run again in fresh processes, up to ``retries`` times. A
    bad-input error in a shard is raised here with its file, line and fix (the earliest shard's)."""
    todo = [s for s in shards if not s.done()]
    for attempt in range(retries + 1):
        left = [s for s in todo if not s.done()]
        if not left:
            break
        try:
            failures = _pool_round(fn, left, workers)
        except BrokenProcessPool:
            if attempt == retries:
                raise RuntimeError(f"a worker process died {retries + 1} times (shards {[s.name for s in left]}); "
                                   "see the system log (out of memory?), or raise ray.max_retries") from None
            continue
        if failures:
            raise failures[min(failures)].error()
    return len(todo)
