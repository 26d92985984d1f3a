"""The thread helpers keep order and surface errors where the item would have come."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.threads import ahead, read_ahead


def test_read_ahead_yields_the_items_in_order_from_another_thread():
    seen = []

    def items():
        for i in range(50):
            seen.append(threading.current_thread().name)
            yield i

    assert list(read_ahead(items(), depth=3)) == list(range(50))
    assert set(seen) == {"read_ahead"}
    assert list(read_ahead(iter(()))) == []


def test_read_ahead_raises_where_the_failing_item_would_be():
    def items():
        yield 1
        yield 2
        raise ValueError("bad batch")

    got = []
    with pytest.raises(ValueError, match="bad batch"):
        for x in read_ahead(items(), depth=1):
            got.append(x)
    assert got == [1, 2]


def test_read_ahead_stops_its_thread_when_the_consumer_stops_early():
    produced = []

    def items():
        for i in range(10_000):
            produced.append(i)
            yield i

    gen = read_ahead(items(), depth=2)
    assert [next(gen) for _ in range(3)] == [0, 1, 2]
    gen.close()
    time.sleep(0.3)
    assert len(produced) <= 3 + 2 + 1
    assert not any(t.name == "read_ahead" for t in threading.enumerate())


def test_ahead_keeps_order():
    assert list(ahead(lambda x: x * x, range(20), depth=2)) == [x * x for x in range(20)]
