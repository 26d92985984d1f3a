"""The comparison of benchmarks/bench_mixture_anchors.py: per-batch share deviations and the
sources' floor, on orders whose answers are known by hand."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_mixture_anchors", REPO / "benchmarks" / "bench_mixture_anchors.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks its module up
    spec.loader.exec_module(mod)
    return mod


def test_batch_deviation_and_floor(bench):
    # 4 sequences: 0 and 1 all source A (100 tokens), 2 all B (100), 3 half A half B (50 + 50)
    tokens = np.array([[100.0, 0.0], [100.0, 0.0], [0.0, 100.0], [50.0, 50.0]])
    half = np.array([0.5, 0.5])
    # alternating A, B: every batch of 2 holds half and half
    assert bench.batch_deviation(np.array([0, 2, 1, 2]), tokens, 2, half) == (0.0, 0.0)
    # sorted: batches (A, A) and (B, B) are each L1 1.0 from half and half
    assert bench.batch_deviation(np.array([0, 1, 2, 2]), tokens, 2, half) == (1.0, 1.0)
    # shares are by tokens, and the last partial batch is left out: (3, 0) is 75% A
    mean, worst = bench.batch_deviation(np.array([3, 0, 2, 2, 1]), tokens, 2, half)
    assert (mean, worst) == pytest.approx((0.75, 1.0))
    # without a target, the order's own shares: (0, 2, 0, 2) holds A and B half each, batches exact
    assert bench.batch_deviation(np.array([0, 2, 0, 2]), tokens, 2) == (0.0, 0.0)
    assert bench.batch_deviation(np.array([0, 0, 0, 2]), tokens, 2)[1] == pytest.approx(0.5)  # (A, A) vs 75/25
    with pytest.raises(ValueError):
        bench.batch_deviation(np.array([0]), tokens, 2, half)
    # 16 sequences at 0.3/0.2/0.15/0.15/0.2: 4.8/3.2/2.4/2.4/3.2 rounds to 5/3/3/2/3 at best, L1 1.6/16
    assert bench.source_floor(np.array([0.3, 0.2, 0.15, 0.15, 0.2]), 16) == pytest.approx(0.1)
    assert bench.source_floor(np.array([0.5, 0.25, 0.25]), 4) == 0.0
