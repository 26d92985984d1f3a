"""The diagnostics of a stream read stretch by stretch (issue 55) equal those of the whole stream
in memory: prefix errors, every batch's deviation, the worst window of every length."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import StrataInputError
from pipeline.ordering.composition import composition, log_spaced_points, prefix_errors
from pipeline.reports.diagnostics import batch_deviations
from pipeline.reports.streamed import StreamedDiagnostics
from pipeline.reports.windows import worst_windows


def _instance(m: int, groups: int, seed: int):
    rng = np.random.default_rng(seed)
    per = rng.integers(1, 6, m)
    seq = np.repeat(np.arange(m), per)
    p = 1 / np.arange(1, groups + 1)
    comp = composition(seq, rng.choice(groups, seq.size, p=p / p.sum()), rng.integers(1, 300, seq.size), m, groups)
    return comp, rng.permutation(m)


@pytest.mark.parametrize("m,groups,batch,stretch", [(3_000, 40, 16, 160), (2_501, 200, 8, 1_000), (777, 5, 32, 64)])
def test_stretch_by_stretch_equals_the_whole_stream(m, groups, batch, stretch, tmp_path):
    comp, order = _instance(m, groups, seed=m)
    position = np.empty(m, np.int64)
    position[order] = np.arange(m)
    points = log_spaced_points(m, 60)
    points = points[points < m]
    d = StreamedDiagnostics(comp.global_share(), batch, points, spill=tmp_path)
    ptr = np.searchsorted(comp.seq, np.arange(m + 1))
    for a in range(0, m, stretch):
        ids = order[a : a + stretch]
        counts = ptr[ids + 1] - ptr[ids]
        local = np.zeros(ids.size + 1, np.int64)
        np.cumsum(counts, out=local[1:])
        rows = np.concatenate([np.arange(ptr[s], ptr[s + 1]) for s in ids])
        d.add(local, comp.group[rows], comp.tokens[rows])
    fig = d.finish()
    assert np.allclose(fig.prefix_error, prefix_errors(comp, position, points), rtol=1e-12, atol=0)
    assert np.array_equal(fig.batch_dev, batch_deviations(comp, position, batch))
    want = worst_windows(comp, position, batch)
    assert np.array_equal(fig.window_lengths, want.lengths) and np.array_equal(fig.window_worst, want.worst)
    assert np.array_equal(fig.window_start, want.start)
    assert list(tmp_path.iterdir()) == []  # the spill folder is removed


def test_a_partial_batch_must_be_the_last_stretch(tmp_path):
    d = StreamedDiagnostics(np.array([0.5, 0.5]), 4, np.array([1, 2]), spill=tmp_path)
    d.add(np.array([0, 1, 2, 3]), np.array([0, 1, 0]), np.array([5, 5, 5]))
    with pytest.raises(StrataInputError, match="partial batch"):
        d.add(np.array([0, 1]), np.array([1]), np.array([5]))
