"""``cluster_sorted``: the positive control, sequences grouped by dominant cluster (``pipeline/ordering/control.py``)."""

from __future__ import annotations

from pipeline.ordering.control import cluster_sorted_order
from pipeline.ordering.engine import OrderingResult, order_frame
from pipeline.ordering.strategies import StrategySpec


def run(inp):
    return OrderingResult(order_frame(cluster_sorted_order(inp.segments, inp.cluster, inp.seed)), None)


SPECS = (
    StrategySpec("cluster_sorted", "sequence", "positive control: sequences grouped by dominant cluster, clusters in a seeded order "
                 "(pipeline/ordering/control.py)", seed_free=False, run=run),
)
