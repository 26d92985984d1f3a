"""Each part's own peak resident memory (pipeline/peak_memory.py)."""

from __future__ import annotations

import numpy as np

from pipeline.peak_memory import PartPeaks, peak_mb, reset_peak


def test_a_part_holding_memory_peaks_above_one_after_it_freed_it():
    peaks = PartPeaks()
    with peaks.part("big"):
        held = np.ones(200 * 2**20 // 8)  # 200 MiB, every page written
        del held
    with peaks.part("small"):
        np.zeros(1000).sum()
    assert set(peaks.facts()) == {"peak_rss_mb_big", "peak_rss_mb_small"}
    # the reset forgets the big part's peak: without it the small part would report it too
    assert peaks.mb["big"] >= peaks.mb["small"] + 150


def test_the_reset_brings_the_high_water_mark_down_to_the_resident_size():
    assert reset_peak()
    before = peak_mb()
    held = np.ones(100 * 2**20 // 8)
    after = peak_mb()
    del held
    assert after - before >= 90
    assert reset_peak() and peak_mb() < after - 50
