"""Where the diagnostics cache the bands of uniform shuffles of a packing's sequences
(``diagnostics/bands/``, ``diagnostics/window_bands/``): orderings of the same sequences read the
band the first one computed, named by the content fingerprints of what the sequences are built from."""

from __future__ import annotations

from pathlib import Path

from pipeline.reports import stationarity as S
from pipeline.reports import windows as W
from pipeline.storage.atomic import file_sha256

BANDS_KEPT = 8  # cached bands kept in each of diagnostics/bands and diagnostics/window_bands (the newest; KBs each)
WINDOW_BAND_VERSION = 1  # raised whenever the worst-window band's values change for the same inputs


def _packing_fingerprints(layout, strategy: str) -> dict[str, str] | None:
    """Content fingerprints of what a strategy's sequences are built from (its segments, the
    documents, the clusters), or None for a schedule realizing a mixture, whose unrolled stream
    depends on its order."""
    if layout.ordering_mixture(strategy).exists():
        return None
    own = layout.ordering_segments(strategy)
    return {"segments": file_sha256(own if own.exists() else layout.segments), "documents": file_sha256(layout.documents),
            "clusters": file_sha256(layout.clusters)}


def _cache_file(layout, folder: str, key: str) -> Path:
    """``diagnostics/<folder>/<key>.npy``, the folder's bands beyond the newest :data:`BANDS_KEPT` removed."""
    where = layout.inside("diagnostics", folder)
    if where.is_dir():
        old = sorted(where.glob("*.npy"), key=lambda p: p.stat().st_mtime, reverse=True)[BANDS_KEPT:]
        for p in old:
            p.unlink(missing_ok=True)
    return where / f"{key}.npy"


def band_cache(layout, strategy: str, cfg, prefix: int) -> Path | None:
    """``diagnostics/bands/<key>.npy``: where the stationarity band of ``strategy``'s sequences is
    cached, named by the content fingerprints of its segments, the documents and the clusters and
    by the band's parameters (``stationarity.band_key``); orderings of one packing share it. None for
    a schedule realizing a mixture, whose unrolled stream depends on its order. Older bands beyond
    the newest :data:`BANDS_KEPT` are removed."""
    prints = _packing_fingerprints(layout, strategy)
    if prints is None:
        return None
    key = S.band_key(**prints, length_bins=cfg.length_bins, prefix=prefix, shuffles=cfg.stationarity_shuffles, seed=cfg.seed)
    return _cache_file(layout, "bands", key)


def window_band_cache(layout, strategy: str, cfg) -> Path | None:
    """``diagnostics/window_bands/<key>.npy``: where random's worst-window band of ``strategy``'s
    sequences (``pipeline.reports.windows.random_band``) is cached, named like :func:`band_cache`'s
    by the packing's fingerprints and by the length bins, the batch, the shuffles and the seed;
    orderings of one packing share it. None for a schedule realizing a mixture."""
    prints = _packing_fingerprints(layout, strategy)
    if prints is None:
        return None
    key = S.band_key(**prints, band="worst_windows", window_band_version=WINDOW_BAND_VERSION, length_bins=cfg.length_bins,
                     batch=cfg.batch_size, shuffles=W.SHUFFLES, seed=cfg.seed)
    return _cache_file(layout, "window_bands", key)
