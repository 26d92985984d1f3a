"""The thread helpers keep order, run the producer on another thread and surface errors where
the item would have come."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline import threads as T
from pipeline.threads import ahead, behind, concurrently, prefetch


def test_prefetch_yields_the_items_in_order_from_another_thread():
    seen = []

    def items():
        for i in range(50):
            seen.append(threading.get_ident())
            yield i

    assert list(prefetch(items(), depth=3)) == list(range(50))
    assert threading.get_ident() not in seen and len(set(seen)) == 1
    assert list(prefetch(iter(()))) == []


def test_prefetch_raises_where_the_failing_item_would_be():
    def items():
        yield from range(5)
        raise ValueError("the sixth")

    got = []
    with pytest.raises(ValueError, match="the sixth"):
        for x in prefetch(items(), depth=2):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]


def test_prefetch_stops_producing_when_the_consumer_stops_early():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield i

    before = threading.active_count()
    gen = prefetch(items(), depth=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    gen.close()
    time.sleep(0.2)
    assert len(produced) <= 3 + 2 + 1
    assert threading.active_count() == before


def test_ahead_keeps_order():
    assert list(ahead(lambda x: x * x, range(20), depth=2)) == [x * x for x in range(20)]


def test_behind_runs_every_call_in_order_on_one_other_thread_and_raises_its_error():
    done, threads = [], set()

    def slow(i):
        time.sleep(0.002 * (i % 3))
        threads.add(threading.get_ident())
        done.append(i)

    with behind(slow, depth=3) as call:
        for i in range(40):
            call(i)
    assert done == list(range(40)) and len(threads) == 1 and threading.get_ident() not in threads

    def fails(i):
        if i == 4:
            raise ValueError("the fifth")

    with pytest.raises(ValueError, match="the fifth"):
        with behind(fails, depth=2) as call:
            for i in range(6):
                call(i)
    with pytest.raises(ValueError, match="the fifth"):  # raised on leaving when no later call waits for it
        with behind(fails, depth=10) as call:
            for i in range(5):
                call(i)


def test_concurrently_runs_the_calls_at_once_and_returns_their_results_in_order(monkeypatch):
    monkeypatch.setattr(T, "cores", lambda: 2)
    meet = threading.Barrier(3, timeout=10)  # passes only when all three calls wait at once
    idents = []

    def call(x):
        def run():
            idents.append(threading.get_ident())
            meet.wait()
            return x * 10
        return run

    assert concurrently(call(1), call(2), call(3)) == [10, 20, 30]
    assert threading.get_ident() in idents and len(set(idents)) == 3
    monkeypatch.setattr(T, "cores", lambda: 1)  # one core: one after the other, on this thread
    order = []
    assert concurrently(lambda: order.append("a") or 1, lambda: order.append("b") or 2) == [1, 2] and order == ["a", "b"]


def test_concurrently_waits_for_every_call_then_raises_the_first_error(monkeypatch):
    monkeypatch.setattr(T, "cores", lambda: 2)
    finished = []

    def slow():
        time.sleep(0.2)
        finished.append("slow")

    def fails(msg):
        def run():
            raise ValueError(msg)
        return run

    with pytest.raises(ValueError, match="second"):
        concurrently(slow, fails("second"), fails("third"))
    assert finished == ["slow"]
    with pytest.raises(ValueError, match="first"):
        concurrently(fails("first"), slow)
    assert finished == ["slow", "slow"]


def test_warm_kernels_loads_numba_once_on_a_thread_of_its_own():
    from pipeline import segments

    segments.warm_kernels()
    segments.warm_kernels()
    assert len(segments._WARM) == 1
    thread = segments._WARM[0]
    thread.join(timeout=120)
    assert thread.name == "numba-warm" and thread is not threading.current_thread() and not thread.is_alive()
