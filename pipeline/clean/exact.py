"""Exact duplicates: documents whose normalized texts (lowercased, whitespace runs collapsed,
trimmed) are equal, found by a 64-bit hash of the normalized text."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

_HASH_SEED = 46


def normalized(texts: Sequence[str]) -> pl.Series:
    """The texts lowercased, each whitespace run one space, trimmed."""
    return pl.Series(list(texts), dtype=pl.String).str.to_lowercase().str.replace_all(r"\s+", " ").str.strip_chars()


def text_hashes(texts: Sequence[str]) -> np.ndarray:
    """A 64-bit hash of each normalized text (equal normalized texts, equal hashes)."""
    return normalized(texts).hash(seed=_HASH_SEED).to_numpy().astype(np.uint64, copy=False)


def exact_representatives(hashes: np.ndarray) -> np.ndarray:
    """For each document (index into ``hashes``), the first document with its hash."""
    hashes = np.asarray(hashes, np.uint64)
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    return first[inverse].astype(np.int64)
