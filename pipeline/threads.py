"""Threads: how torch's CPU thread pool waits, a map on a thread a core for GIL-free work,
a stage computed ahead of its consumer, an iterator drawn ahead of it, and calls run behind their caller."""

from __future__ import annotations

import itertools
import os
import resource
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def set_thread_policy() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless the user set it: idle OpenMP threads sleep instead of spinning.

    Strata's CPU work is large matrix products (long parallel regions), so waking a sleeping
    thread costs little, while spinning threads burn a core each between regions and, on a shared
    machine, while a partner thread waits for a core. The losses do not depend on the policy. No
    effect once torch is imported.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def process_cpu_s() -> float:
    """CPU seconds this process has used so far, every thread (user + system)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def task_size(n: int, most: int) -> int:
    """Items a task: at most ``most``, and small enough for four tasks a core (load balance)."""
    return max(1, min(most, -(-n // (4 * cores()))))


def rayon_on() -> bool:
    """Whether the tokenizers library's own (rayon) thread pool is on (``TOKENIZERS_PARALLELISM``)."""
    return os.environ.get("TOKENIZERS_PARALLELISM", "true").strip().lower() not in ("", "off", "false", "f", "no", "n", "0")


def parallel_map(fn: Callable[[T], R], items: list[T], threads: bool = True) -> list[R]:
    """``map`` on a thread a core, in order; for work that releases the GIL (Rust, NumPy, BLAS).

    ``threads=False`` (or one core, or one item) maps in this thread.
    """
    workers = cores()
    if not threads or workers == 1 or len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(fn, items))


def ahead(fn: Callable[[T], R], items: Iterable[T], depth: int = 1, workers: int = 1) -> Iterator[R]:
    """``fn(item)`` for each item, in order, computed up to ``depth`` items ahead of the consumer on
    ``workers`` background threads: the consumer's work on one result (writing it) overlaps ``fn``
    on the next (for work that releases the GIL), and with ``workers`` > 1 the items' ``fn`` overlap
    each other. Memory: ``depth + 1`` results. An exception in ``fn`` is raised where its result
    would have been yielded."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        pending: deque = deque()
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > depth:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def prefetch(items: Iterator[T], depth: int = 1) -> Iterator[T]:
    """The items of ``items``, each produced (``next``) on a background thread up to ``depth``
    items ahead of the consumer: for a producer whose work releases the GIL (reading, decoding),
    so the consumer's work overlaps it. An exception in the producer is raised where its item
    would have been yielded."""
    end = object()
    with closing(ahead(lambda _: next(items, end), itertools.repeat(None), depth)) as produced:
        for item in produced:
            if item is end:
                return
            yield item


@contextmanager
def behind(fn: Callable[..., object], depth: int = 2) -> Iterator[Callable[..., None]]:
    """A function whose calls run ``fn`` one at a time, in call order, on a thread of their own, at
    most ``depth`` calls behind the caller: for work that releases the GIL and must stay in order
    (a writer compressing one batch while the caller computes the next). Every call has run when
    the block is left; the first exception of ``fn`` is raised at a later call or on leaving."""
    with ThreadPoolExecutor(1) as pool:
        pending: deque = deque()

        def call(*args) -> None:
            pending.append(pool.submit(fn, *args))
            while len(pending) > depth:
                pending.popleft().result()

        try:
            yield call
            while pending:
                pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()


def concurrently(*calls: Callable[[], object]) -> list:
    """The results of ``calls``, the first run on this thread and each other on a thread of its own
    at the same time: for independent work whose one-core passes (NumPy, reading) would otherwise
    leave the other cores idle; its parallel parts (numba's OpenMP layer, BLAS) may overlap safely.
    Every call has finished when this returns; the first exception (in call order) is raised."""
    if len(calls) < 2 or cores() == 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(len(calls) - 1) as pool:
        others = [pool.submit(c) for c in calls[1:]]
        try:
            first = calls[0]()
        finally:
            done = [f.exception() for f in others]  # wait for every call before anything is raised
        for exc in done:
            if exc is not None:
                raise exc
        return [first] + [f.result() for f in others]
